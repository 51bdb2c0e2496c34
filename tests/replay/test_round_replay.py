"""`manage.py replay` of a review round: the recorded attempt started from the branch head, not the base."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app import trajectory
from app.db import session_scope
from app.jobs import records
from app.models import Job
from app.settings import get_settings
from tests.pipeline.conftest import World
from tests.replay.test_replay import _events, _finished_job, _manage, _trajectory
from worker.commands.recorded import start_commit_of
from worker.commands.replay import replay_job

pytestmark = pytest.mark.bwrap
ROUND_CHANGE = "return a + b  # the round's change"


def _head(world: World, branch: str) -> str:
    bare = world.bare("gitlab")
    return subprocess.run(
        ["git", "-C", str(bare), "rev-parse", f"refs/heads/{branch}"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _round_recording(round_zero: Path, job_id: int, base: str, start: str | None) -> dict[str, Any]:
    """Round 0's recording made into a round's: it reads calc.py as the branch head has it (already fixed),
    edits the line only that head has, and ends; as the pipeline would record it, with `start_commit`."""
    data = json.loads(round_zero.read_text())
    system, task, read, read_out, edit, edit_out, *_, final = data["messages"]
    assert "return a - b" in read_out["content"] and "return a - b" in edit["content"]
    read_out = {**read_out, "content": read_out["content"].replace("return a - b", "return a + b")}
    edit = {**edit, "content": edit["content"].replace("return a + b", ROUND_CHANGE).replace(
        "return a - b", "return a + b")}
    task = {**task, "content": "A reviewer asked for a change on the MR FrogFix opened (round 1)."}
    steps = data["steps"]
    data.update(
        job_id=job_id, base_commit=base, messages=[system, task, read, read_out, edit, edit_out, final],
        steps=[steps[0], steps[1], steps[-1]], n_steps=3, exit_reason="agent", output_patch=None,
    )
    data.pop("start_commit", None)
    if start is not None:
        data["start_commit"] = start
    return data


def _round_job(root: int, start: str | None) -> int:
    """Round 1 of root's MR, finished, with one attempt whose trajectory is written by the test."""
    with session_scope() as s:
        zero = records.get_job(s, root)
        job = Job(
            forge=zero.forge, project=zero.project, issue=zero.issue, title=zero.title, status="done", run=1,
            thread_id=root, round=1, round_kind="review", mr_number=1, branch=zero.branch,
            base_commit=zero.base_commit, start_commit=start, trigger_user="dev",
        )
        s.add(job)
        s.flush()
        attempt = records.start_attempt(s, job.id, 1, 1)
        records.update_attempt(s, attempt, finished=True, status="verified", steps=3,
                               trajectory_path=trajectory.attempt_path(job.id, 1, 1), exit_reason="agent")
        return int(job.id)


def _write(job_id: int, data: dict[str, Any]) -> Path:
    path = get_settings().data_dir / trajectory.attempt_path(job_id, 1, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def test_a_round_replays_from_the_commit_it_started_from(client: Any, world: World) -> None:
    root = _finished_job(client, world)
    with session_scope() as s:
        zero = records.get_job(s, root)
        base, branch = zero.base_commit, zero.branch
    assert base and branch
    start = _head(world, branch)  # round 0's pushed fix: the head the round built on
    assert start != base

    # The trajectory names the start commit (the job's column is empty): the replay checks it out.
    job_id = _round_job(root, None)
    _write(job_id, _round_recording(_trajectory(root), job_id, base, start))
    progress: list[str] = []
    report = replay_job(job_id, progress=progress.append)
    assert report.status == "reproduced", report.message
    assert (report.start_commit, report.base_commit) == (start, base)
    assert report.tool_results_checked == 2 and report.steps_replayed == 3
    assert f"workspace at the round's start commit {start[:12]} (base {base[:12]})" in " ".join(progress)
    # The patch is against the start: the round's one line over round 0's fix, not round 0's fix again.
    assert report.patch and "-    return a + b\n+    " + ROUND_CHANGE in report.patch
    assert "return a - b" not in report.patch
    replayed = json.loads(Path(report.trajectory or "").read_text())
    assert (replayed["base_commit"], replayed["start_commit"]) == (base, start)
    note = _events(job_id)[-1]
    assert note.kind == "replayed" and note.data and note.data["start_commit"] == start

    # An older recording without the field: the job's start_commit column says where it started.
    _write(job_id, _round_recording(_trajectory(root), job_id, base, None))
    with session_scope() as s:
        records.update_job(s, job_id, start_commit=start)
    proc = _manage("replay", str(job_id), "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["status"] == "reproduced" and out["start_commit"] == start

    # Without either it is replayed at the base, where calc.py still subtracts: the Read differs.
    with session_scope() as s:
        records.update_job(s, job_id, start_commit=None)
    report = replay_job(job_id)
    assert report.status == "diverged" and report.start_commit is None
    assert report.divergence and report.divergence.tool == "Read" and report.divergence.step == 1


def test_the_start_commit_comes_from_the_file_then_the_job_and_only_as_a_commit_id() -> None:
    base, start, column = "a" * 40, "b" * 40, "c" * 40
    assert start_commit_of({"start_commit": start}, column, base) == start
    assert start_commit_of({}, column, base) == column
    assert start_commit_of({"start_commit": base}, None, base) is None  # round 0: the base itself
    assert start_commit_of({}, None, base) is None
    # What a trajectory file says becomes a git argument: anything but a full object id is passed over.
    for hostile in ("--upload-pack=touch /tmp/x", "HEAD~1", "B" * 40, "b" * 39, 42):
        assert start_commit_of({"start_commit": hostile}, column, base) == column
