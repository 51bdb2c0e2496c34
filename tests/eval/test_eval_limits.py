"""Each task re-runs under its recorded job's Leaf limits; a trajectory from before they were saved gets today's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from app import trajectory
from app.settings import get_settings
from tests.eval.conftest import Candidate, recorded_job
from worker.commands.evaluate import EvalOptions, evaluate, load_report, task_limits

pytestmark = pytest.mark.bwrap


def _recording(data_dir: Path, key: str) -> Path:
    return trajectory.existing(data_dir, trajectory.attempt_path(int(key), 1, 1))


def _rewrite(path: Path, change: Any) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_the_recorded_limits_are_used_and_old_trajectories_fall_back_to_settings(
    local_env: dict[str, Any], tmp_path: Path
) -> None:
    settings = get_settings()
    tight, old = recorded_job(tmp_path / "tight", solved=True), recorded_job(tmp_path / "old", solved=True)
    data_dir = local_env["data_dir"]
    saved = json.loads(_recording(data_dir, tight).read_text())["limits"]  # every attempt records its limits now
    assert saved["max_steps"] == settings.leaf_max_steps
    assert saved["max_context_tokens"] == settings.leaf_max_context_tokens
    assert saved["max_completion_tokens"] == settings.leaf_max_completion_tokens

    # The recorded job of `tight` ran with 2 steps: the candidate gets 2 too, though today's setting is 150
    # and the demo's replies need 4. `old` predates recorded limits: it runs under today's settings.
    _rewrite(_recording(data_dir, tight), lambda d: d["limits"].update(max_steps=2))
    _rewrite(_recording(data_dir, old), lambda d: d.pop("limits"))
    evaluation_id, status, errors = evaluate(EvalOptions("cand", "", attempts=1),
                                             models=Candidate({(tight, 1), (old, 1)}))
    assert (status, errors) == ("finished", [])
    report = load_report(evaluation_id)
    rows = {r["task"]: r for r in report["tasks"]}
    (cut,) = rows[tight]["attempts"]
    assert cut["steps"] == 2 and cut["exit_reason"] == "max_turns"  # cut short where the recorded job would be
    assert rows[tight]["limits"] == {
        "source": "recorded", "max_steps": 2, "max_context_tokens": saved["max_context_tokens"],
        "max_completion_tokens": saved["max_completion_tokens"], "max_seconds": settings.job_timeout_seconds,
    }
    assert rows[old]["attempts"][0]["solved"] and rows[old]["limits"]["source"] == "settings"
    assert rows[old]["limits"]["max_steps"] == settings.leaf_max_steps
    assert report["limits"] == {"recorded": 1, "settings": 1}
    # The eval attempt's own trajectory records the limits it ran under, so replaying it is like for like.
    eval_doc = trajectory.read(trajectory.resolve(data_dir, cut["trajectory"]))
    assert eval_doc["limits"]["max_steps"] == 2


def test_partial_or_nonsense_recorded_limits_are_not_half_applied(frogfix_env: dict[str, Any]) -> None:
    settings = get_settings().model_copy(update={"leaf_max_steps": 150})
    chosen, limits = task_limits({"limits": {"max_steps": 5, "max_context_tokens": "lots"}}, settings)
    assert limits["source"] == "settings" and chosen.leaf_max_steps == 150
    chosen, limits = task_limits({"limits": {"max_steps": 0, "max_context_tokens": 9, "max_completion_tokens": 9}},
                                 settings)
    assert limits["source"] == "settings" and chosen.leaf_max_steps == 150
    chosen, limits = task_limits({"limits": {"max_steps": 7, "max_context_tokens": 900, "max_completion_tokens": 90,
                                             "max_seconds": 1.0}}, settings)
    assert limits == {"source": "recorded", "max_steps": 7, "max_context_tokens": 900, "max_completion_tokens": 90,
                      "max_seconds": settings.job_timeout_seconds}
    assert (chosen.leaf_max_steps, chosen.leaf_max_context_tokens, chosen.leaf_max_completion_tokens) == (7, 900, 90)
