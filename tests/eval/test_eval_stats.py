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


def _result(task: str, attempt: int, solved: bool, **extra: object) -> dict[str, object]:
    return {"task": task, "attempt": attempt, "solved": solved, "outcome": "verified" if solved else "no_patch",
            "exit_reason": "agent", "steps": 3, "prompt_tokens": 10, "completion_tokens": 1, "cached_tokens": 0,
            "model_seconds": 0.5, "wall_seconds": 1.0, "trajectory": None, "reason": "", **extra}


def test_the_markdown_reads_as_sentences_one_blank_line_between_blocks() -> None:
    recorded = {"source": "recorded", "max_steps": 40, "max_context_tokens": 1000, "max_completion_tokens": 100}
    one = build_report(
        {"id": 3, "model": "m", "attempts": 1, "status": "finished",
         "tasks": [{"key": "7", "project": "p", "recorded_solved": True, "human": "open"}]},
        [_result("7", 1, True, limits=recorded)],
    )
    md = to_markdown(one)
    assert "\n\n\n" not in md  # nothing unrunnable: no empty block left behind
    assert "1 of 1 task evaluated (1 with its attempt); 1 of 1 attempt solved." in md
    assert "Not comparable (0): none\n\nCompared like with like. The recorded run made 1 attempt per task (n = 1)" in md
    assert "1 MR still open; 0 tasks with no known verdict." in md
    assert "Limits: 1 task ran under the recorded job's Leaf limits" in md and ", 0 under today's settings" in md
    assert "| 7 | p | solved in 1 | ✓agent/3 |" in md
    assert "attempts per task" not in md and "1 attempts" not in md and "1 tasks" not in md
    assert one["limits"] == {"recorded": 1, "settings": 0} and one["tasks"][0]["limits"] == recorded

    tasks = [{"key": k, "project": "p", "recorded_solved": False, "recorded_attempts": n}
             for k, n in (("1", 1), ("2", 3))]
    many = build_report(
        {"id": 4, "model": "m", "attempts": 2, "tasks": [*tasks, {"key": "9", "project": "p"}]},
        [_result("1", 1, False, limits={"source": "settings"}), _result("1", 2, True),
         _result("2", 1, False), _result("2", 2, False),
         {**_result("9", 1, False), "outcome": "unrunnable", "reason": "the repository is gone"}],
    )
    md = to_markdown(many)
    assert "\n\n\n" not in md
    assert "2 of 3 tasks evaluated (2 with all 2 attempts); 1 of 4 attempts solved." in md
    assert "The recorded run made 1 to 3 attempts per task (n = the recorded run's attempts on that task)" in md
    assert "\n\nUnrunnable (excluded from every rate): 9: the repository is gone  \n\nHuman verdicts:" in md
    assert "Not comparable (1): 1" in md  # solved only at attempt 2, the recorded run made 1
    assert "Limits: 0 tasks ran under the recorded job's Leaf limits (steps, context and completion tokens), 1 " in md
