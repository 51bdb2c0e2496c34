"""A replay refused before it starts changes no job's history (issue 26).

Only what happened to a job is written on its timeline: `manage.py replay 1 --attempt 7` for a job
without an attempt 7, an unknown flag, `--publish` without `--live`, a trajectory that is not the
job's: each is refused with one clear line and a non-zero exit, and the job's events stay as they
were. The dashboard's own request (`replay_requested` on the timeline) still gets its outcome.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app import trajectory
from app.db import session_scope
from app.jobs import records
from app.models import Job
from worker.commands.replay import ReplayError, replay_job
from worker.tasks import replay_job_task

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def _manage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), *args], env=dict(os.environ), capture_output=True, text=True, timeout=120
    )


def _events(job_id: int) -> list[tuple[str, str]]:
    with session_scope() as s:
        return [(e.kind, e.message) for e in records.job_events(s, job_id)]


def _job_with_one_attempt(data_dir: Path) -> int:
    """A finished job whose one attempt (run 1, attempt 1) left a trajectory."""
    with session_scope() as s:
        job = Job(forge="gitlab", project="acme/calc", issue=3, status="done", title="bug", trigger_user="dev")
        s.add(job)
        s.flush()
        job_id = job.id
        records.add_event(s, job_id, "created", "label added on issue 3")
        attempt_id = records.start_attempt(s, job_id, 1, 1)
        stored = trajectory.attempt_path(job_id, 1, 1)
        records.update_attempt(s, attempt_id, finished=True, status="verified", trajectory_path=stored)
        records.add_event(s, job_id, "done", "finished: done")
    path = data_dir / stored
    path.parent.mkdir(parents=True, exist_ok=True)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    path.write_text(json.dumps({"trajectory_format": trajectory.TRAJECTORY_FORMAT, "job_id": job_id,
                                "base_commit": "7445f7eee3b9", "messages": messages}))
    return job_id


def test_a_refused_replay_leaves_the_timeline_as_it_was(frogfix_env: dict[str, Any]) -> None:
    job_id = _job_with_one_attempt(frogfix_env["data_dir"])
    before = _events(job_id)

    refused = {
        ("--attempt", "7"): f"frogfix replay: job {job_id} has no attempt 7 with a trajectory (attempts: 1.1)",
        ("--attempt", "2.1"): f"frogfix replay: job {job_id} has no attempt 2.1 with a trajectory (attempts: 1.1)",
        ("--attempt", "seven"): "frogfix replay: --attempt takes N or RUN.N, not 'seven'",
        ("--publish",): "frogfix replay: --publish needs --live",
        ("--trajectory", "trajectories/replays/nothing.json"): "frogfix replay: no trajectory",
    }
    for args, said in refused.items():
        proc = _manage("replay", str(job_id), *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert proc.stderr.startswith(said) and len(proc.stderr.strip().splitlines()) == 1, (args, proc.stderr)
        assert proc.stdout == "" and "Traceback" not in proc.stderr
        assert _events(job_id) == before, args

    proc = _manage("replay", str(job_id), "--attemp", "7")  # a mistyped flag: typer refuses it before anything
    assert proc.returncode == 2 and "No such option: --attemp" in proc.stderr
    assert _events(job_id) == before


def test_nothing_to_replay_is_noted_only_for_the_dashboards_request(frogfix_env: dict[str, Any]) -> None:
    with session_scope() as s:  # cancelled before it ran: no attempt, no recording
        job = Job(forge="gitlab", project="acme/calc", issue=9, status="cancelled")
        s.add(job)
        s.flush()
        job_id = job.id

    proc = _manage("replay", str(job_id))
    assert proc.returncode == 2 and "has nothing to replay: it has no attempts" in proc.stderr
    with pytest.raises(ReplayError, match="nothing to replay"):
        replay_job(job_id)
    assert _events(job_id) == []

    # The dashboard notes `replay_requested` first; the refusal is that request's outcome.
    assert replay_job_task(job_id, "alice") == "error"
    assert [kind for kind, _ in _events(job_id)] == ["replay_failed"]
    proc = _manage("replay", str(job_id), "--json", "--who", "bob", "--requested")  # start_replay's command
    assert proc.returncode == 2
    assert [kind for kind, _ in _events(job_id)] == ["replay_failed", "replay_failed"]


def test_a_job_that_failed_before_its_first_step_has_nothing_to_replay(frogfix_env: dict[str, Any]) -> None:
    """Its attempt left a trajectory (the model was down at the first call), but no model reply: a replay would
    compare nothing, so it is refused with the reason and a non-zero exit, never REPRODUCED."""
    job_id = _job_with_one_attempt(frogfix_env["data_dir"])  # system and user messages, no reply
    with session_scope() as s:
        records.get_job(s, job_id).status = "failed"
    before = _events(job_id)
    proc = _manage("replay", str(job_id))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and "REPRODUCED" not in proc.stderr
    [line] = proc.stderr.splitlines()
    assert line == (f"frogfix replay: job {job_id} has nothing to replay: run 1, attempt 1 ended before the "
                    "model's first reply; `replay --live` runs its task again with the live model"), line
    assert _events(job_id) == before  # refused before anything ran
    proc = _manage("replay", str(job_id), "--json")
    assert proc.returncode == 2 and proc.stdout == ""
