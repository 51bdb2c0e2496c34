"""What an attempt reports as it runs, typed, and the one rule for what each report does to a job.

The attempt (worker/attempts/attempt.py), its test runs (worker/attempts/verifier.py) and the environment builder
(worker/environment/builder.py) report `AttemptEvent`s to their observer; the pipeline, `fix` and
replay read the kind, never a string they turn back into a status. `effect` is the one recorder's
rule: which job status an event moves the job to, which job fields it sets and whether it is a row on
the job's timeline, so the pipeline and `fix` record the same event the same way.

Standard library and app/statuses.py only: it sits below the attempt, the builder and their observers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from app.statuses import JobStatus


class AttemptEventKind(StrEnum):
    """Every event an attempt reports, in the order an attempt reports them; the stored event row's `kind`."""

    environment = "environment"  # the test environment is ready (built or cached): its report
    environment_building = "environment_building"  # building it from the package mirror starts
    environment_project = "environment_project"  # the project's own install into it starts
    agent_started = "agent_started"
    agent_finished = "agent_finished"
    patch_refused = "patch_refused"  # a review rule refused the patch: never tested
    verifying = "verifying"  # the patch's test runs start
    testing = "testing"  # one test run starts
    tested = "tested"  # one test run ended
    verified = "verified"  # the evidence proves the fix
    not_verified = "not_verified"  # it does not
    agreement = "agreement"  # one attempt's reproduction tests run over another's patch


# Where the environment is being made ready: `fix` prints these as they come.
ENVIRONMENT_EVENTS = frozenset(
    {AttemptEventKind.environment, AttemptEventKind.environment_building, AttemptEventKind.environment_project}
)
# One test run each: the verdict (`verified` / `not_verified`) is the timeline's row, these are progress only.
TEST_RUN_EVENTS = frozenset({AttemptEventKind.testing, AttemptEventKind.tested})
# What `fix` and replay print of an attempt's tests as they run.
TEST_PROGRESS_EVENTS = TEST_RUN_EVENTS | {AttemptEventKind.verified, AttemptEventKind.not_verified}


@dataclass(frozen=True)
class AttemptEvent:
    """One report: its kind, the line people read (already redacted where it quotes the repository) and its data."""

    kind: AttemptEventKind
    message: str
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def attempt(self) -> int | None:
        number = self.data.get("attempt")
        return number if isinstance(number, int) else None


@dataclass(frozen=True)
class EventEffect:
    """What one event does to the job that ran the attempt: the recorder applies it (see `effect`)."""

    status: JobStatus | None = None  # the job moves to this status
    fields: dict[str, Any] = field(default_factory=dict)  # the job's plain fields it sets
    row: bool = True  # the event is a row on the job's timeline


def effect(event: AttemptEvent) -> EventEffect:
    """The one rule from an attempt's event to the job: `verifying` moves the job to verifying (no row: the
    status is the news), a test run is progress only, `agent_finished` records how the agent ended."""
    if event.kind == AttemptEventKind.verifying:
        return EventEffect(status=JobStatus.verifying, row=False)
    if event.kind in TEST_RUN_EVENTS:
        return EventEffect(row=False)
    if event.kind == AttemptEventKind.agent_finished:
        return EventEffect(fields={"exit_reason": event.data["exit_reason"], "steps": event.data["steps"]})
    return EventEffect()


class JobTimeline(Protocol):
    """A job as the recorder writes it: the pipeline's database job, `fix`'s local record."""

    def status(self, status: JobStatus) -> Any: ...

    def update(self, **fields: Any) -> None: ...

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None: ...


def record(event: AttemptEvent, job: JobTimeline) -> EventEffect:
    """The one recorder: apply `effect(event)` to `job` (its status, its fields, its timeline row)."""
    done = effect(event)
    if done.status is not None:
        job.status(done.status)
    if done.fields:
        job.update(**done.fields)
    if done.row:
        job.event(event.kind.value, event.message, event.data)
    return done
