"""`manage.py replay`: a real scripted job, run end to end through the pipeline, replayed in a fresh sandbox."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app import trajectory
from app.db import session_scope
from app.jobs import records, transitions
from app.models import Job
from app.settings import get_settings
from tests.doubles.openai_server import Status
from tests.pipeline.conftest import PROJECT, TRIGGER, World, fixing_script
from worker.commands.replay import ReplayError, normalise, replay_job, start_replay
from worker.tasks import run_job

pytestmark = pytest.mark.bwrap
MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def _finished_job(client: Any, world: World, expected: str = "done") -> int:
    issue = world.gitlab.add_issue(PROJECT, title="add() returns the difference", author="rep")
    world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
    body, headers = world.gitlab_webhook(issue["iid"])
    r = client.post("/webhooks/gitlab", content=body, headers=headers)
    assert r.status_code == 202, r.text
    job_id = int(r.json()["job_id"])
    assert run_job(job_id) == expected
    return job_id


def _trajectory(job_id: int) -> Path:
    with session_scope() as s:
        [attempt] = records.job_attempts(s, job_id)
        assert attempt.trajectory_path
        return trajectory.resolve(get_settings().data_dir, attempt.trajectory_path)


def _edit_tool_output(path: Path, index: int, change: Any) -> None:
    """Rewrite the `index`-th recorded tool result (0-based over tool messages) with `change(old)`."""
    data = json.loads(path.read_text())
    tools = [m for m in data["messages"] if m["role"] == "tool"]
    tools[index]["content"] = change(tools[index]["content"])
    path.write_text(json.dumps(data))


def _manage(*args: str) -> subprocess.CompletedProcess[str]:
    """manage.py in a child process, with the FROGFIX_* environment the fixtures set."""
    return subprocess.run(
        [sys.executable, str(MANAGE), *args], env=dict(os.environ), capture_output=True, text=True, timeout=120
    )


def _events(job_id: int) -> list[Any]:
    with session_scope() as s:
        return records.job_events(s, job_id)


def test_a_finished_job_replays_to_the_identical_patch(client: Any, world: World) -> None:
    job_id = _finished_job(client, world)
    recorded = _trajectory(job_id)
    before = recorded.read_text()
    model_calls, notes, mrs = world.model.count, len(world.gitlab.notes), world.gitlab.open_mrs(PROJECT)

    progress: list[str] = []
    report = replay_job(job_id, progress=progress.append)

    assert report.status == "reproduced" and report.exit_code == 0, report.message
    assert report.divergence is None and report.patch_identical is True
    assert report.steps_replayed == report.steps_recorded == 4 and report.tool_results_checked == 3
    assert report.exit_reason == report.recorded_exit_reason == "agent" and report.exit_matches
    assert "+    return a + b" in (report.patch or "")
    assert (report.run, report.number) == (1, 1)
    assert "step 3/4: Bash: ok" in progress
    # No model was asked, nothing was published, the job and its recording are as they were.
    assert world.model.count == model_calls
    assert len(world.gitlab.notes) == notes and world.gitlab.open_mrs(PROJECT) == mrs
    assert recorded.read_text() == before
    with session_scope() as s:
        assert records.get_job(s, job_id).status == "done"
    # The replay kept its own trajectory and noted itself on the timeline.
    assert report.trajectory and Path(report.trajectory).is_file() and report.trajectory != str(recorded)
    last = _events(job_id)[-1]
    assert last.kind == "replayed" and last.data and last.data["status"] == "reproduced"

    # Without the mirror on disk (another worker ran the job), the replay fetches it from the forge.
    shutil.rmtree(world.env["data_dir"] / "mirrors")
    proc = _manage("replay", str(job_id), "--json")
    assert proc.returncode == 0, proc.stderr
    assert "updating the mirror of acme/calc from gitlab" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "reproduced" and out["patch_identical"] is True and out["divergence"] is None
    assert "step 1/4: Read: ok" in proc.stderr  # progress on stderr while it runs

    # The dashboard's entry: returns at once, the outcome lands on the timeline.
    start_replay(job_id, "alice")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _events(job_id)[-1].kind != "replayed":
        time.sleep(0.2)
    kinds = [e.kind for e in _events(job_id)]
    assert kinds[-2:] == ["replay_requested", "replayed"] and "by alice" in _events(job_id)[-1].message


def test_an_altered_recording_reports_the_divergence_at_that_step(client: Any, world: World) -> None:
    job_id = _finished_job(client, world)
    recorded = _trajectory(job_id)

    # Timings vary between runs: the normaliser makes them equal, so this is still a reproduction.
    _edit_tool_output(recorded, 2, lambda old: re.sub(r"passed in [0-9.]+s", "passed in 41.27s", old))
    assert replay_job(job_id).status == "reproduced"

    # A tool result that really differs: the recorded Edit (step 2) said two replacements.
    _edit_tool_output(recorded, 1, lambda old: old.replace("(1 replacement)", "(2 replacements)"))
    progress: list[str] = []
    report = replay_job(job_id, progress=progress.append)

    assert report.status == "diverged" and report.exit_code == 1
    d = report.divergence
    assert d is not None
    assert (d.step, d.step_index, d.tool, d.call_id) == (2, 1, "Edit", "call_text_1_0")
    assert "(2 replacements)" in d.expected and "(1 replacement)" in d.actual and d.line == 1
    # It stopped there: the Bash step after it never ran.
    assert report.steps_replayed == 2 and report.tool_results_checked == 1
    assert progress[-2:] == ["step 2/4: Edit: DIFFERS", report.message]
    assert "step 2 (Edit, call call_text_1_0)" in report.message

    proc = _manage("replay", str(job_id))
    assert proc.returncode == 1, proc.stderr
    assert "DIVERGED" in proc.stdout and "step 2, Edit call call_text_1_0" in proc.stdout
    assert "(2 replacements)" in proc.stdout and "Traceback" not in proc.stderr
    assert max(len(line) for line in proc.stdout.splitlines() if "/" not in line) <= 80


def test_a_job_failed_at_its_first_call_has_nothing_to_replay_and_live_publish_runs_it(
    client: Any, world: World
) -> None:
    world.model._script[:] = [Status(400, {"error": "bad request"})]  # refused at once: the job fails
    job_id = _finished_job(client, world, expected="failed")
    # It failed before the model's first reply: a replay would compare nothing (issue 40: never REPRODUCED).
    with pytest.raises(ReplayError, match=r"nothing to replay: run 1, attempt 1 ended before the model's first reply "
                                          r"\(llm_query_error\)"):
        replay_job(job_id)

    # --live --publish: a new run of the job through the normal pipeline, which opens the MR.
    queued = replay_job(job_id, live=True, publish=True, who="tester")
    assert queued.status == "queued" and queued.exit_code == 0
    with session_scope() as s:
        assert records.get_job(s, job_id).status == "queued"
    world.model._script[:] = fixing_script()
    assert run_job(job_id) == "done"
    [mr] = world.gitlab.open_mrs(PROJECT)
    assert "python3 -m pytest -q" in mr["description"]
    with pytest.raises(transitions.InvalidTransition):  # a done job is not queued again
        replay_job(job_id, live=True, publish=True)


def test_unknown_and_unreplayable_jobs_are_clear_errors(frogfix_env: dict[str, Any]) -> None:
    with pytest.raises(records.UnknownJob):
        replay_job(4242)
    with pytest.raises(records.UnknownJob):
        replay_job("local-20990101-000000-abcdef")
    with pytest.raises(ReplayError, match="needs --live"):
        replay_job(4242, publish=True)
    with session_scope() as s:  # a job cancelled before it ran has no recording
        job = Job(forge="gitlab", project=PROJECT, issue=9, status="cancelled")
        s.add(job)
        s.flush()
        cancelled = job.id
    with pytest.raises(ReplayError, match="nothing to replay"):
        replay_job(cancelled)
    assert _events(cancelled) == []  # refused before it started: the job's history is unchanged
    with pytest.raises(ReplayError, match="nothing to replay"):
        replay_job(cancelled, requested=True)  # the dashboard's request is on the timeline: so is its outcome
    assert [e.kind for e in _events(cancelled)] == ["replay_failed"]

    for job, expected in (("4242", "no job with id 4242"), ("../etc/passwd", "no job with id '../etc/passwd'")):
        proc = _manage("replay", job)
        assert proc.returncode == 2
        assert proc.stderr.strip() == f"frogfix replay: {expected}" and proc.stdout == ""


def test_normaliser_rules() -> None:
    assert normalise("2 passed in 0.12s") == normalise("2 passed in 61.02s (0:01:01)") == "2 passed in <T>s"
    assert normalise("Ran 3 tests in 0.001s") == "Ran 3 tests in <T>s"
    assert normalise("/tmp/pytest-of-x/pytest-7/a.py") == normalise("/tmp/tmpa1b2/pytest-7/a.py")
    assert normalise("worker pid 4242 started, PID: 17") == "worker pid <pid> started, pid <pid>"
    assert normalise("<object at 0x7f3a2c1b9e80>") == "<object at 0x<addr>>"
    # Nothing else moves: exit codes, counts and short hex values stay as they are.
    for kept in ("Exit code: 1", "1 failed, 1 passed", "index 8124ccd..97eb2fc", "0xff", "within 5s"):
        assert normalise(kept) == kept


def test_replay_task_for_the_dashboard_reproduces_and_records_it(client: Any, world: World) -> None:
    from worker.tasks import replay_job_task

    job_id = _finished_job(client, world)
    assert replay_job_task(job_id, "alice") == "reproduced"
    with session_scope() as s:
        events = [(e.kind, e.message) for e in records.job_events(s, job_id)]
    assert events[-1][0] == "replayed"
    assert replay_job_task(999_999, "alice") == "error"
