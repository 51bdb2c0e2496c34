"""Replaying local jobs (`manage.py fix` and `demo`): their trajectory names the checkout they ran on."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from worker.commands.demo import ISSUE_BODY, ISSUE_TITLE, demo_model, make_sample_repo
from worker.commands.fix import LocalFix
from worker.commands.replay import ReplayError, replay_job
from worker.leaf.model import ModelReply, ReplayModel
from worker.leaf.prompts import strip_guidance

pytestmark = pytest.mark.bwrap




def _fix(repo: Path, kind: str = "fix") -> tuple[str, Path]:
    outcome = LocalFix(repo, ISSUE_TITLE, ISSUE_BODY, model=demo_model(), kind=kind).run()
    assert outcome.status == "fixed", outcome.error
    return outcome.job_id, Path(outcome.trajectory)


def test_a_fix_job_replays_and_a_cut_recording_stops_where_it_ends(local_env: dict[str, Any], tmp_path: Path) -> None:
    repo = make_sample_repo(tmp_path / "src")
    job_id, trajectory = _fix(repo)

    report = replay_job(job_id)
    assert report.status == "reproduced" and report.patch_identical, report.message
    assert report.steps_replayed == 4 and report.tool_results_checked == 3

    # A run cancelled after its first tool call: the recording stops there, and so does the replay.
    data = json.loads(trajectory.read_text())
    first_tool = next(i for i, m in enumerate(data["messages"]) if m["role"] == "tool")
    data["messages"] = data["messages"][: first_tool + 1]
    data.update(exit_reason="cancelled", output_patch="", n_steps=1, steps=data["steps"][:1])
    trajectory.write_text(json.dumps(data))
    report = replay_job(job_id)
    assert report.status == "reproduced", report.message
    assert report.reached_recording_end and report.exit_matches and report.steps_replayed == 1
    assert report.patch == "" and report.patch_identical

    with pytest.raises(ReplayError, match="has no attempt 2"):  # `fix` ran one attempt (FROGFIX_ATTEMPTS=1)
        replay_job(job_id, attempt=2)


def test_a_demo_job_replays_on_the_sample_made_again(local_env: dict[str, Any], tmp_path: Path) -> None:
    repo = make_sample_repo(tmp_path / "frogfix-demo-x1")  # where `manage.py demo` makes it, then deletes it
    job_id, trajectory = _fix(repo, kind="demo")
    assert json.loads(trajectory.read_text())["kind"] == "demo"  # the recording says it is a demo's
    shutil.rmtree(repo.parent)

    report = replay_job(job_id)
    assert report.status == "reproduced" and report.patch_identical, report.message
    assert report.notes and "made again" in report.notes[0]

    # --live: the task again with a (here: scripted) live model, as an unpublished attempt with tests.
    live = replay_job(job_id, live=True, model=demo_model())
    assert live.status == "live" and live.exit_code == 0 and live.patch_identical
    assert live.tests_after and live.tests_after["after"][0]["exit_code"] == 0  # the one tests shape
    assert set(live.tests_after) == {"command", "before", "after", "flaky", "reproduction", "evidence"}
    assert live.trajectory and Path(live.trajectory).is_file()


def test_a_fix_job_in_a_folder_named_like_the_demos_is_no_demo(local_env: dict[str, Any], tmp_path: Path) -> None:
    """Only the recording says what made it: a `fix` run on a sample in a folder named like the demo's
    temporary one is not made again from the sample when its checkout is gone."""
    repo = make_sample_repo(tmp_path / "frogfix-demo-x2")
    job_id, _ = _fix(repo)
    shutil.rmtree(repo.parent)
    with pytest.raises(ReplayError, match="is gone"):
        replay_job(job_id)


def test_a_fix_job_whose_checkout_is_gone_says_so(local_env: dict[str, Any], tmp_path: Path) -> None:
    repo = make_sample_repo(tmp_path / "src")
    job_id, _ = _fix(repo)
    moved = tmp_path / "moved"
    shutil.move(str(tmp_path / "src"), moved)
    with pytest.raises(ReplayError, match="is gone"):
        replay_job(job_id)
    assert replay_job(job_id, repo_dir=moved / "calc").status == "reproduced"


def _assistant(content: str | None, calls: list[dict[str, Any]]) -> ModelReply:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return ModelReply(message=message, finish_reason="tool_calls" if calls else "stop")


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_live_replay_refuses_what_the_pipeline_refuses(local_env: dict[str, Any], tmp_path: Path) -> None:
    """`replay --live` runs the same review rules as the pipeline: a patch that rewrites `.frogfix.yml` (here to
    make the tests a no-op) is refused, its tests never run, and the CLI's exit code says it is no fix."""
    repo = make_sample_repo(tmp_path / "src")
    job_id, _ = _fix(repo)
    hostile = ReplayModel(
        [
            _assistant(None, [_call("h1", "Edit", {
                "file_path": "calc.py", "old_string": "return a - b", "new_string": "return a + b",
            })]),
            _assistant(None, [_call("h2", "Write", {
                "file_path": ".frogfix.yml", "content": "test_command: 'true'\n",
            })]),
            _assistant("Fixed, and made the tests faster.", []),
        ]
    )
    live = replay_job(job_id, live=True, model=hostile)
    assert live.status == "live" and live.exit_code == 1, live.message
    assert live.refused and "changes FrogFix's own configuration .frogfix.yml" in live.refused[0]
    assert "refused" in live.message and live.verified is False
    assert live.tests_after is None  # a refused patch is never tested
    assert live.patch and "+test_command: 'true'" in live.patch  # reported for the reviewer, never published


class _TaskRecorder:
    """A model that answers like `inner` and keeps the task (first user message) of every request."""

    def __init__(self, inner: ReplayModel) -> None:
        self.inner = inner
        self.tasks: list[str] = []

    def complete(self, messages: Any, tools: Any, **kwargs: Any) -> ModelReply:
        self.tasks.append(messages[1]["content"])
        return self.inner.complete(messages, tools, **kwargs)


def test_plain_replay_sends_the_recorded_guidance_and_live_reads_the_base_commit(
    local_env: dict[str, Any], tmp_path: Path
) -> None:
    repo = make_sample_repo(tmp_path / "src")
    (repo / "AGENTS.md").write_text("Run the tests with `python3 -m pytest -q`.\n")
    for args in (["add", "AGENTS.md"], ["-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "-m", "agents"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)
    job_id, trajectory = _fix(repo)
    recorded = json.loads(trajectory.read_text())
    task = recorded["messages"][1]["content"]
    assert "=== AGENTS.md, for the whole repository ===\nRun the tests with `python3 -m pytest -q`." in task

    # A plain replay sends exactly the recorded task (guidance included): every message matches the recording.
    report = replay_job(job_id)
    assert report.status == "reproduced" and report.patch_identical, report.message

    # A live run takes the recorded guidance off and reads it again from the base commit.
    recorded["messages"][1]["content"] = task.replace("Run the tests with", "OLD: never run")
    trajectory.write_text(json.dumps(recorded))
    model = _TaskRecorder(demo_model())
    live = replay_job(job_id, live=True, model=model)
    assert live.status == "live" and live.exit_code == 0, live.message
    assert model.tasks and set(model.tasks) == {task}

    # A recording from before guidance existed gets it too.
    recorded["messages"][1]["content"] = strip_guidance(task)
    trajectory.write_text(json.dumps(recorded))
    model = _TaskRecorder(demo_model())
    assert replay_job(job_id, live=True, model=model).status == "live"
    assert set(model.tasks) == {task}
