"""app/attempt_events.py: typed attempt events and the one recorder the pipeline and `fix` share."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

from app.attempt_events import AttemptEvent, AttemptEventKind, effect, record
from app.statuses import JobStatus

ROOT = Path(__file__).resolve().parent.parent


class Job:
    """A job as the recorder sees it, remembering what it was told."""

    def __init__(self) -> None:
        self.statuses: list[str] = []
        self.fields: dict[str, Any] = {}
        self.rows: list[str] = []

    def status(self, status: JobStatus) -> None:
        self.statuses.append(status.value)

    def update(self, **fields: Any) -> None:
        self.fields.update(fields)

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        self.rows.append(kind)


def an_attempt() -> list[AttemptEvent]:
    """What one attempt reports, in order."""
    return [
        AttemptEvent(AttemptEventKind.environment_building, "building"),
        AttemptEvent(AttemptEventKind.agent_started, "attempt 1: running the agent",
                     {"attempt": 1, "base_commit": "0" * 40, "test_command": "pytest"}),
        AttemptEvent(AttemptEventKind.agent_finished, "attempt 1: done", {"attempt": 1, "exit_reason": "agent",
                                                                          "steps": 3, "patch_lines": 4}),
        AttemptEvent(AttemptEventKind.verifying, "attempt 1: verifying the patch", {"attempt": 1}),
        AttemptEvent(AttemptEventKind.testing, "running the tests before"),
        AttemptEvent(AttemptEventKind.tested, "tests before: failed"),
        AttemptEvent(AttemptEventKind.verified, "attempt 1: tests ...", {"attempt": 1}),
    ]


def test_the_recorder_moves_the_job_sets_its_fields_and_writes_its_rows() -> None:
    job = Job()
    for event in an_attempt():
        record(event, job)
    assert job.statuses == ["verifying"]
    assert job.fields == {"exit_reason": "agent", "steps": 3}
    assert job.rows == ["environment_building", "agent_started", "agent_finished", "verified"]
    assert effect(an_attempt()[4]).row is False and effect(an_attempt()[3]).status == JobStatus.verifying


def test_every_observer_reads_events_not_stage_strings() -> None:
    """No `stage("...")` call and no `stage(` method left in worker/: events are typed."""
    for path in sorted((ROOT / "worker").rglob("*.py")):
        text = path.read_text("utf-8")
        assert not re.search(r"\bstage\(\s*[\"']", text), path
        tree = ast.parse(text)
        methods = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert "stage" not in methods and "on_stage" not in text, path


def test_the_pipeline_and_fix_observers_use_the_one_recorder() -> None:
    """The pipeline's JobObserver and a local job's (`fix`: worker/job/local_pipeline.py) record an attempt's
    events through `record`: the same status change and rows as the recorder gives a job; `fix` also prints
    the test runs as they happen."""
    from app.attempt_events import TEST_RUN_EVENTS
    from worker.job.local_pipeline import LocalObserver
    from worker.job.pipeline import JobObserver

    pipeline, local, expected = Job(), Job(), Job()
    said: list[str] = []
    local.say = said.append  # type: ignore[attr-defined]
    observer = JobObserver(pipeline)  # type: ignore[arg-type]  # a job as the recorder sees it
    local_observer = LocalObserver(local)  # type: ignore[arg-type]
    for event in an_attempt():
        record(event, expected)
        observer.report(event)
        local_observer.report(event)
    for seen in (pipeline, local):
        assert (seen.statuses, seen.fields, seen.rows) == (expected.statuses, expected.fields, expected.rows)
    assert said == [event.message for event in an_attempt() if event.kind in TEST_RUN_EVENTS] and said
