"""The report's statistics against values computed by hand (and by statsmodels' Wilson interval)."""

from __future__ import annotations

import pytest

from app.evaluation_report import bootstrap_mean, build_report, pass_at_k, to_markdown, wilson


def test_pass_at_k_is_the_unbiased_estimator() -> None:
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(3, 1, 3) == 1.0 and pass_at_k(4, 1, 1) == 0.25
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_wilson_interval_and_a_seeded_bootstrap() -> None:
    lo, hi = wilson(3, 8)  # type: ignore[misc]
    assert (round(lo, 4), round(hi, 4)) == (0.1368, 0.6943)  # statsmodels proportion_confint(3, 8, method="wilson")
    assert wilson(0, 4) == (0.0, pytest.approx(0.4899, abs=1e-4)) and wilson(0, 0) is None
    assert bootstrap_mean([1, 0, 0.5, 0]) == bootstrap_mean([1, 0, 0.5, 0])  # fixed seed: reruns agree


def test_an_unfinished_task_counts_only_its_finished_attempts_and_hostile_names_stay_in_their_cell() -> None:
    tasks = [
        {"key": "1", "project": "a|b\n# heading", "recorded_solved": True},
        {"key": "2", "project": "p", "recorded_solved": False},
        {"key": "3", "project": "p", "recorded_solved": True},  # no result yet: not in the figures
    ]
    row = {"outcome": "verified", "exit_reason": "agent", "steps": 1, "prompt_tokens": 10, "completion_tokens": 1,
           "cached_tokens": 5, "model_seconds": 1.0, "wall_seconds": 1.0, "trajectory": None, "reason": ""}
    results = [
        {**row, "task": "1", "attempt": 1, "solved": True},
        {**row, "task": "1", "attempt": 2, "solved": True},
        {**row, "task": "2", "attempt": 1, "solved": False},
    ]
    report = build_report({"id": 1, "model": "m", "attempts": 2, "tasks": tasks}, results)
    assert report["tasks_evaluated"] == 2 and report["tasks_complete"] == 1 and report["tasks_total"] == 3
    assert report["candidate"]["pass@1"]["value"] == 0.5  # mean of 1 (2/2) and 0 (0/1)
    assert report["candidate"]["pass@2"]["value"] == 1.0  # only task 1 has two attempts
    assert report["lost"] == [] and report["gained"] == []
    md = to_markdown(report)
    assert "a\\|b # heading" in md and "\n# heading" not in md
