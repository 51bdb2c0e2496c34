"""Job state transitions under races: cancel while a worker claims, retry while a webhook starts a job."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import update

from app.db import session_scope
from app.forge.base import WebhookEvent
from app.jobs import intake, records, transitions
from app.models import Job
from app.statuses import JobStatus


def _job(project: str = "a/b", issue: int = 1, delivery: str = "d-1") -> int:
    with session_scope() as s:
        result = intake.record_delivery(
            s, WebhookEvent("gitlab", delivery, "Issue Hook", "start", "t", project=project, issue=issue)
        )
    assert result.job_id is not None
    return result.job_id


def test_cancel_of_a_job_claimed_meanwhile_asks_the_worker_to_stop(frogfix_env: dict[str, Any]) -> None:
    job_id = _job()
    with session_scope() as s:
        job = records.get_job(s, job_id)  # read while still queued...
        s.execute(update(Job).where(Job.id == job_id).values(status="running"))  # ...then a worker claims it
        transitions.request_cancel(s, job, "label removed")
    with session_scope() as s:
        job = records.get_job(s, job_id)
        kinds = [e.kind for e in records.job_events(s, job_id)]
    assert job.status == "running" and job.cancel_requested is True
    assert kinds[-1] == "cancel_requested"


def test_operator_cancel_reports_what_happened(frogfix_env: dict[str, Any]) -> None:
    job_id = _job()
    with session_scope() as s:
        assert transitions.cancel_job(s, job_id, "alice") == "cancelled"
    with session_scope() as s, pytest.raises(transitions.InvalidTransition):
        transitions.cancel_job(s, job_id, "alice")


def test_retry_racing_a_new_job_is_a_clear_refusal(
    frogfix_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    job_id = _job()
    with session_scope() as s:
        transitions.cancel_job(s, job_id, "alice")
    _job(delivery="d-2")  # a webhook starts a new job for the same issue
    monkeypatch.setattr(transitions, "active_job", lambda *a, **k: None)  # as if it landed right after our check
    with session_scope() as s, pytest.raises(transitions.InvalidTransition, match="already active"):
        transitions.retry_job(s, job_id, "alice")
    with session_scope() as s:
        assert records.get_job(s, job_id).status == "cancelled"


def test_a_run_whose_job_was_requeued_touches_nothing_more(frogfix_env: dict[str, Any]) -> None:
    from worker.pipeline import Deps, Pipeline, Superseded

    job_id = _job()
    with session_scope() as s:
        assert transitions.claim_job(s, job_id)
    pipeline = Pipeline(job_id, Deps.from_settings())
    with session_scope() as s:  # the sweep re-queued it: its heartbeat looked dead
        s.execute(update(Job).where(Job.id == job_id).values(status="queued"))
    with pytest.raises(Superseded):
        pipeline.status(JobStatus.verifying)
    assert pipeline.end(JobStatus.failed, "boom", None) == "superseded"
    with session_scope() as s:
        assert records.get_job(s, job_id).status == "queued"
