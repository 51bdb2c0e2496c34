"""Job state transitions under races: cancel while a worker claims, retry while a webhook starts a job."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import update

from app.answers import JobAnswer
from app.db import session_scope
from app.forge.webhook import WebhookEvent
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
    from worker.job.job_context import Deps, Superseded
    from worker.job.pipeline import Pipeline

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


def test_requeue_and_send_commits_then_sends_and_stamps(
    frogfix_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one requeue the dashboard, manage.py retry and replay --publish share."""
    from app.jobs import requeue

    job_id = _job()
    with session_scope() as s:
        transitions.cancel_job(s, job_id, "alice")
        before = records.get_job(s, job_id).enqueue_count
    seen: list[str] = []

    def send(sent_id: int) -> bool:
        with session_scope() as s:  # the requeue is committed before the task is sent
            seen.append(records.get_job(s, sent_id).status)
        return True

    monkeypatch.setattr(requeue, "send_run_job", send)
    assert requeue.requeue_and_send(job_id, "bob", committed=lambda: seen.append("committed")) is True
    with session_scope() as s:
        job = records.get_job(s, job_id)
        kinds = [e.kind for e in records.job_events(s, job_id)]
    assert seen == ["committed", "queued"]
    assert job.status == "queued" and job.enqueue_count == before + 1 and job.last_enqueued_at is not None
    assert kinds[-1] == "retried"


def test_requeue_with_the_broker_down_leaves_the_job_to_the_sweep(
    frogfix_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.jobs import requeue

    job_id = _job()
    with session_scope() as s:
        transitions.cancel_job(s, job_id, "alice")
    monkeypatch.setattr(requeue, "send_run_job", lambda _job_id: False)
    assert requeue.requeue_and_send(job_id, "bob") is False
    with session_scope() as s:
        job = records.get_job(s, job_id)
        due = transitions.jobs_due_for_enqueue(s, timedelta(hours=1))
    assert job.status == "queued" and job.last_enqueued_at is None and job_id in due


def test_requeue_refuses_a_job_that_is_not_finished(
    frogfix_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.jobs import requeue

    job_id = _job()
    sent: list[int] = []
    monkeypatch.setattr(requeue, "send_run_job", lambda j: sent.append(j) or True)
    with pytest.raises(transitions.InvalidTransition, match="only failed, no_fix, cancelled, rejected"):
        requeue.requeue_and_send(job_id, "bob")
    with pytest.raises(records.UnknownJob):
        requeue.requeue_and_send(999_999, "bob")
    assert sent == []


def test_a_claim_starts_the_next_run(frogfix_env: dict[str, Any]) -> None:
    """Job.run counts claims; each attempt records the run it belongs to."""
    job_id = _job()
    with session_scope() as s:
        assert records.get_job(s, job_id).run == 0
        assert transitions.claim_job(s, job_id)
        assert not transitions.claim_job(s, job_id)  # a second delivery of the task loses
    with session_scope() as s:
        assert records.run_states(s, {job_id}) == {job_id: ("running", 1)}
        assert records.get_job(s, job_id).run == 1


def test_cancel_lands_on_one_side_of_the_move_to_publishing(frogfix_env: dict[str, Any]) -> None:
    """Asked before the move, a cancel stops the push (the move refuses); asked after, it says too late
    and asks nothing the worker would never read."""
    asked, late = _job(), _job(project="a/c", delivery="d-2")
    with session_scope() as s:
        for job_id in (asked, late):
            assert transitions.claim_job(s, job_id)
            s.execute(update(Job).where(Job.id == job_id).values(status="verifying"))
    with session_scope() as s:
        assert transitions.cancel_job(s, asked, "alice") == "cancel_requested"
        assert not transitions.begin_publishing(s, asked, 1)  # the cancel came first: no publishing
        assert transitions.begin_publishing(s, late, 1)
        assert not transitions.begin_publishing(s, late, 1)  # only from verifying, once
    with session_scope() as s:
        assert transitions.cancel_job(s, late, "alice") == "too_late"
    with session_scope() as s:
        assert records.get_job(s, asked).status == "verifying"
        job = records.get_job(s, late)
        last = records.job_events(s, late)[-1]
    assert job.status == "publishing" and job.cancel_requested is False
    assert last.kind == "cancel_too_late" and "cancelled by alice" in last.message
    assert transitions.TOO_LATE in last.message
    with session_scope() as s:
        assert not transitions.begin_publishing(s, asked, 2)  # another run's move: never this one's


def test_cancel_of_a_job_requeued_meanwhile_cancels_it(frogfix_env: dict[str, Any]) -> None:
    """The row read says running, the sweep queued it again since: the cancel ends it, not an error."""
    job_id = _job()
    with session_scope() as s:
        assert transitions.claim_job(s, job_id)
    with session_scope() as s:
        job = records.get_job(s, job_id)  # read while running...
        s.execute(update(Job).where(Job.id == job_id).values(status="queued"))  # ...then re-queued
        assert transitions.request_cancel(s, job, "label removed") == "cancelled"
    with session_scope() as s:
        assert records.get_job(s, job_id).status == "cancelled"


def test_a_job_keeps_its_ending_typed_until_it_runs_again(frogfix_env: dict[str, Any]) -> None:
    """set_status keeps the ending's kind and facts beside `error` (issue 38); the API's `ending` says them; a
    retry's claim starts the next run with none, and a queued job a cancel ends is `cancelled`."""
    from app.endings import Ending, EndingKind

    job_id = _job()
    ended = Ending(EndingKind.forge_error, "GitLab read issue #1 of a/b: HTTP 403 Forbidden", forge="GitLab",
                   call="read issue #1 of a/b", http_status=403, said="Forbidden")
    with session_scope() as s:
        assert transitions.claim_job(s, job_id)
        assert transitions.set_status(s, job_id, JobStatus.failed, error=ended.detail, ending=ended)
    with session_scope() as s:
        job = records.get_job(s, job_id)
        assert job.ending == ended and Ending.from_dict(JobAnswer.of(job).as_json()["ending"]) == ended
        transitions.retry_job(s, job_id, "op")
    with session_scope() as s:
        job = records.get_job(s, job_id)
        assert (job.ending_kind, job.ending_facts, JobAnswer.of(job).as_json()["ending"]) == (None, None, None)
        transitions.cancel_job(s, job_id, "op")
    with session_scope() as s:
        assert records.get_job(s, job_id).ending == Ending(EndingKind.cancelled, records.get_job(s, job_id).error)
