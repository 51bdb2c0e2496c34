"""Intake of MR comments and CI results (app/jobs/intake.py), the triage it sends, and the sweep's share.

Events are built as the webhook parsers report them; the endpoint's own parsing is tested with them.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select, update

from app.db import session_scope
from app.forge.webhook import WebhookEvent
from app.jobs import intake, records, rounds
from app.models import Job, RoundRequest, WebhookDelivery, utcnow
from app.statuses import RequestStatus
from app.sweep import resend_triage, sweep_once
from app.web import webhooks
from tests.rounds import BRANCH, HEAD, ci_event, comment_event, database, make_thread

__all__ = ["database"]  # the fixture, imported by name


def _deliver(event: WebhookEvent) -> intake.IntakeResult:
    with session_scope() as s:
        return intake.record_delivery(s, event)


def _delivery(delivery_id: str) -> WebhookDelivery:
    with session_scope() as s:
        row = s.execute(select(WebhookDelivery).where(WebhookDelivery.delivery_id == delivery_id)).scalar_one()
        s.expunge(row)
        return row


def _requests() -> list[RoundRequest]:
    with session_scope() as s:
        found = list(s.execute(select(RoundRequest).order_by(RoundRequest.id)).scalars())
        s.expunge_all()
        return found


def broker_messages(data_dir: Path) -> Counter[tuple[str, int]]:
    """(task, first argument) of each message waiting in the embedded (filesystem) broker."""
    sent: Counter[tuple[str, int]] = Counter()
    for path in (data_dir / "broker" / "queue").iterdir():
        message = json.loads(path.read_bytes())
        args = json.loads(base64.b64decode(message["body"]))[0]
        sent[(message["headers"]["task"], int(args[0]))] += 1
    return sent


def test_a_comment_on_frogfix_mr_is_a_pending_request(database: str) -> None:
    thread = make_thread()
    result = _deliver(comment_event("d-1", "301"))
    assert (result.outcome, result.job_id, result.enqueue) == ("round_request", thread, False)
    (request,) = _requests()
    assert result.request_id == request.id
    assert (request.thread_id, request.kind, request.status, request.author) == (thread, "review", "pending", "bob")
    assert (request.delivery_id, request.dedupe_key, request.mr_number) == ("d-1", "c:301", 7)
    assert request.data["discussion_id"] == "disc-1"
    row = _delivery("d-1")
    assert (row.outcome, row.job_id) == ("round_request", thread)


def test_stop_is_a_request_of_its_own_kind(database: str) -> None:
    make_thread()
    result = _deliver(comment_event("d-1", "301", "/frogfix stop", intent="stop"))
    assert result.outcome == "round_request"
    assert [r.kind for r in _requests()] == ["stop"]


def test_what_the_delivery_shows_is_not_a_request(database: str) -> None:
    thread = make_thread()
    cases = {
        "d-other-mr": (comment_event("d-other-mr", "1", mr=99), "not an MR FrogFix opened"),
        "d-own": (comment_event("d-own", "2", "<!-- frogfix:0123abcd -->\nFrogFix stopped"), "FrogFix's own comment"),
        "d-closed": (comment_event("d-closed", "3", mr_state="closed"), "the MR is closed"),
        "d-merged": (comment_event("d-merged", "4", mr_state="merged"), "the MR is merged"),
    }
    for delivery, (event, reason) in cases.items():
        result = _deliver(event)
        assert (result.outcome, result.reason, result.request_id) == ("ignored", reason, None), delivery
        assert _delivery(delivery).outcome == "ignored"
    assert _requests() == []
    assert _deliver(comment_event("d-other-mr", "1", mr=7)).outcome == "duplicate"  # the delivery id, once
    assert thread


def test_a_comment_delivered_twice_is_one_request(database: str) -> None:
    make_thread()
    assert _deliver(comment_event("d-1", "301")).outcome == "round_request"
    again = _deliver(comment_event("d-2", "301"))
    assert (again.outcome, again.request_id) == ("duplicate", None)
    assert _delivery("d-2").outcome == "duplicate"
    assert len(_requests()) == 1


def test_a_failed_pipeline_on_the_bots_branch_is_a_request_for_triage(database: str) -> None:
    thread = make_thread()
    result = _deliver(ci_event("p-1", mr=None))  # a branch pipeline: found by its ref
    assert result.outcome == "round_request"
    (request,) = _requests()
    # a CI result has no asker: its round acts for whoever started the thread
    assert (request.kind, request.author, request.dedupe_key) == ("ci", None, f"ci:gitlab_pipeline:501:{HEAD}")
    assert request.data["failed_jobs"][0]["name"] == "unit" and request.data["sha"] == HEAD
    with session_scope() as s:  # triage shows it on the job, once it knows which commit it tested
        assert records.get_job(s, thread).ci_status is None
    assert _deliver(ci_event("p-2", mr=7)).outcome == "duplicate"  # the MR pipeline hook of the same pipeline


def test_a_passing_pipeline_is_a_request_too_so_triage_shows_it_on_the_mr(database: str) -> None:
    thread = make_thread()
    result = _deliver(ci_event("p-1", "success", sha="f" * 40, branch=None, mr=7))
    assert (result.outcome, result.reason, result.job_id) == ("noted", "forge CI success", thread)
    assert result.request_id is not None
    # The same pipeline retried on the same commit: it failed first, then passed; both are news.
    failed = _deliver(ci_event("p-2", "failed", sha="f" * 40, branch=None, mr=7))
    assert failed.outcome == "round_request" and failed.request_id not in (None, result.request_id)
    assert _deliver(ci_event("p-3", "success", sha="f" * 40, branch=None, mr=7)).outcome == "duplicate"
    keys = [r.dedupe_key for r in _requests()]
    assert keys == [f"ci:gitlab_pipeline:501:{'f' * 40}:success", f"ci:gitlab_pipeline:501:{'f' * 40}"]


LABEL_REMOVED = "label 'frognano-fix' was removed"


def _issue_cancel(delivery_id: str, reason: str = LABEL_REMOVED) -> WebhookEvent:
    """An issue hook that no longer asks for a fix (label removed, issue closed) for the threads' issue 1."""
    return WebhookEvent("gitlab", delivery_id, "Issue Hook", "cancel", reason, project="grp/app", issue=1)


def _round_for_a_comment(thread: int) -> tuple[int, int]:
    """Round 1 of `thread`, queued for one accepted comment (delivery d-1): (the request, the round's job)."""
    waiting = _deliver(comment_event("d-1", "301")).request_id
    assert waiting is not None
    with session_scope() as s:
        rounds.judge_request(s, waiting, RequestStatus.accepted, "bob asked")
        round_job = rounds.start_round_if_idle(s, thread)
    assert round_job is not None
    return waiting, round_job


def test_a_removed_label_while_the_round_pushes_says_too_late(database: str) -> None:
    """The round already publishing goes ahead; the delivery's outcome says so rather than "cancelled"."""
    _, round_job = _round_for_a_comment(make_thread())
    with session_scope() as s:
        s.execute(update(Job).where(Job.id == round_job).values(status="publishing"))
    result = _deliver(_issue_cancel("d-2"))
    assert (result.outcome, result.job_id) == ("cancel_too_late", round_job)
    assert "the push goes ahead" in result.reason and _delivery("d-2").outcome == "cancel_too_late"
    with session_scope() as s:
        job = records.get_job(s, round_job)
        assert (job.status, job.cancel_requested) == ("publishing", False)


def test_a_removed_label_cancels_the_round_and_drops_what_waits(database: str) -> None:
    thread = make_thread()
    waiting, round_job = _round_for_a_comment(thread)
    pending = _deliver(comment_event("d-2", "302")).request_id
    other = make_thread(mr=8, issue=2, branch="frogfix/issue-2")  # another issue's thread keeps its requests
    kept = _deliver(comment_event("d-3", "303", mr=8)).request_id
    result = _deliver(_issue_cancel("d-4"))
    assert (result.outcome, result.job_id) == ("cancelled_job", round_job)
    statuses = {r.id: (r.status, r.reason) for r in _requests()}
    assert statuses[waiting] == statuses[pending] == ("dropped", LABEL_REMOVED)  # type: ignore[index]
    assert statuses[kept][0] == "pending"  # type: ignore[index]
    with session_scope() as s:
        assert records.get_job(s, round_job).status == "cancelled"
        assert rounds.follow_up(s) == []  # no round after it: nothing waits
        assert rounds.rounds_used(s, thread) == 0  # it took nothing, so it spends no round
        assert rounds.thread_mr_number(records.get_job(s, other)) == 8


def test_a_removed_label_with_no_job_running_still_drops_what_waits(database: str) -> None:
    make_thread()
    pending = _deliver(comment_event("d-1", "301")).request_id
    result = _deliver(_issue_cancel("d-2", "the issue is closed"))
    assert result.outcome == "dropped_requests" and "dropped 1 waiting" in result.reason
    assert [(r.id, r.status) for r in _requests()] == [(pending, "dropped")]
    again = _deliver(_issue_cancel("d-3", "the issue is closed"))
    assert again.outcome == "ignored"  # nothing left to drop, no job to cancel


def test_ci_on_a_branch_frogfix_did_not_push_is_ignored(database: str) -> None:
    make_thread()
    result = _deliver(ci_event("p-1", sha="9" * 40, branch="main"))
    assert (result.outcome, result.reason) == ("ignored", "not an MR FrogFix opened")


def test_the_endpoint_sends_triage_after_the_commit(database: str, frogfix_env: dict[str, Any]) -> None:
    make_thread()
    answer = webhooks.intake("gitlab", lambda: comment_event("d-1", "301"))
    body = json.loads(answer.body)
    assert answer.status_code == 202 and body["outcome"] == "round_request"
    assert broker_messages(frogfix_env["data_dir"]) == Counter({("frogfix.triage_request", body["request_id"]): 1})
    again = webhooks.intake("gitlab", lambda: comment_event("d-2", "301"))
    assert again.status_code == 200 and "request_id" not in json.loads(again.body)
    assert sum(broker_messages(frogfix_env["data_dir"]).values()) == 1


def test_the_sweep_sends_again_the_triage_of_requests_left_pending(database: str, frogfix_env: dict[str, Any]) -> None:
    thread = make_thread()
    first = _deliver(comment_event("d-1", "301")).request_id
    second = _deliver(comment_event("d-2", "302")).request_id
    with session_scope() as s:
        s.execute(update(RoundRequest).where(RoundRequest.id == first).values(updated_at=utcnow() - timedelta(hours=1)))
        rounds.judge_request(s, second, RequestStatus.accepted, "bob asked")  # type: ignore[arg-type]
    assert resend_triage(timedelta(minutes=5)) == 1
    assert resend_triage(timedelta(minutes=5)) == 0  # touched: not again before the requeue delay
    sent = broker_messages(frogfix_env["data_dir"])
    assert sent == Counter({("frogfix.triage_request", first): 1})  # type: ignore[dict-item]
    # The accepted one waited for no active job: the sweep starts its round and sends it.
    sweep_once(older_than_s=300)
    with session_scope() as s:
        (round_job,) = s.execute(select(Job).where(Job.thread_id == thread)).scalars()
        assert round_job.status == "queued" and round_job.last_enqueued_at is not None
    assert broker_messages(frogfix_env["data_dir"])[("frogfix.run_job", round_job.id)] == 1


def test_the_worker_starts_waiting_rounds_after_a_run(database: str, frogfix_env: dict[str, Any]) -> None:
    from worker.tasks import follow_up_after_run

    thread = make_thread()
    request_id = _deliver(comment_event("d-1", "301")).request_id
    with session_scope() as s:
        rounds.judge_request(s, request_id, RequestStatus.accepted, "bob asked")  # type: ignore[arg-type]
    (started,) = follow_up_after_run()
    assert follow_up_after_run() == []
    with session_scope() as s:
        job = records.get_job(s, started)
        assert (job.thread_id, job.branch, job.enqueue_count) == (thread, BRANCH, 1)
    assert broker_messages(frogfix_env["data_dir"]) == Counter({("frogfix.run_job", started): 1})


def test_a_branch_pipeline_on_a_thread_whose_mr_number_is_unknown_is_ignored(database: str) -> None:
    thread = make_thread(legacy_url=True)
    with session_scope() as s:
        s.execute(update(Job).where(Job.id == thread).values(mr_url="https://forge.test/odd-place"))
    result = _deliver(ci_event("p-1", mr=None))
    assert (result.outcome, result.reason, result.job_id) == ("ignored", "the MR's number is unknown", thread)
    assert _requests() == []
