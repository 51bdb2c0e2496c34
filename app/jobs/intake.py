"""Recording webhook deliveries: each delivery once, and the job (or cancel, or note) it asks for.

The webhook endpoint calls `record_delivery` inside its transaction and sends the task after
the commit when the result says so (DESIGN: enqueue only after the job row is committed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from sqlalchemy.orm import Session

from app.forge.reviews import CI_FINAL
from app.forge.webhook import ROUND_INTENTS, WebhookEvent
from app.jobs import answer_gate, records, rounds
from app.jobs.records import active_job, add_event, prepared
from app.jobs.transitions import (
    ANSWERABLE_STATUSES,
    TOO_LATE,
    KeptAnswer,
    keep_answer,
    request_cancel,
    requeue_answered,
)
from app.models import Job, utcnow
from app.statuses import ACTIVE_STATUSES, JobStatus


@dataclass(frozen=True)
class IntakeResult:
    """What the webhook endpoint answers, and whether a task must be sent after the commit."""

    outcome: str
    reason: str
    job_id: int | None = None
    enqueue: bool = False
    request_id: int | None = None  # a round request whose triage is sent after the commit
    tell_refused: tuple[str, str, int, str] | None = None  # (forge, project, issue, author): reply after the commit
    merge: dict[str, Any] | None = None  # a merged or closed FrogFix MR: the merge statement to sign after the commit


# `record_delivery`'s `member` when the caller did not ask the forge before the transaction (then it asks here).
ASK_HERE: Final = "ask here"
Membership = bool | None | Literal["ask here"]


def answer_member(session: Session, event: WebhookEvent) -> Membership:
    """For a `/frogfix` comment: whether its author may trigger FrogFix, asked of the forge BEFORE the delivery's
    transaction opens (the caller's own short read, then no database lock is held while the forge answers).
    The forge is asked only when the issue's newest job asked a question and may take an answer (every
    stranger's `/frogfix` elsewhere costs no API call); else ASK_HERE, which `_answer` never needs then."""
    comment = event.comment
    if event.intent != "answer" or event.project is None or event.issue is None or comment is None:
        return ASK_HERE
    job = records.latest_issue_job(session, event.forge, event.project, event.issue)
    who = comment.author or event.sender
    if job is None or job.asked_at is None or job.status not in (*ANSWERABLE_STATUSES, *ACTIVE_STATUSES) or not who:
        return ASK_HERE
    session.rollback()  # end the read's transaction before the forge is asked
    return answer_gate.may_answer(event.forge, event.project, who)


def record_delivery(session: Session, event: WebhookEvent, member: Membership = ASK_HERE) -> IntakeResult:
    """Insert the delivery (unique per forge + delivery id) and act on it; only a new row acts.

    `member`: for a `/frogfix` answer, what `answer_member` found before this transaction (ASK_HERE: ask now).

    A job created here is stamped as enqueued in the same transaction (the caller sends the task
    right after the commit, and calls `enqueue_failed` if that send fails), which saves a commit
    per delivery; if the process dies in between, the sweep sends it after the requeue delay.
    """
    st = prepared(session)
    conn = session.connection()
    inserted = conn.execute(
        st.insert_delivery,
        {
            "forge": event.forge,
            "delivery_id": event.delivery_id,
            "event": event.event,
            "action": event.action,
            "project": event.project,
            "issue": event.issue,
            "outcome": "received",
            "reason": event.reason[:2000],
            "received_at": utcnow(),
        },
    ).scalar_one_or_none()
    if inserted is None:
        return IntakeResult("duplicate", "this delivery was already received")

    result = _act(session, event, member)
    conn.execute(
        st.set_outcome,
        {"delivery_row": inserted, "outcome": result.outcome, "reason": result.reason[:2000], "job_id": result.job_id},
    )
    return result


def record_malformed(session: Session, forge: str, delivery_id: str, event: str, reason: str) -> None:
    """Keep an authenticated but unusable delivery, so nothing sent to us is silently lost."""
    session.connection().execute(
        prepared(session).insert_delivery,
        {
            "forge": forge,
            "delivery_id": delivery_id[:255],
            "event": event[:64] or "(none)",
            "outcome": "malformed",
            "reason": reason[:2000],
            "received_at": utcnow(),
        },
    )


def _act(session: Session, event: WebhookEvent, member: Membership = ASK_HERE) -> IntakeResult:
    if event.intent == "merge" and event.project is not None:
        return _merged(session, event)
    if event.intent in ROUND_INTENTS and event.project is not None:
        return _round_request(session, event)
    if event.intent == "ignore" or event.project is None or event.issue is None:
        return IntakeResult("ignored", event.reason)
    if event.intent == "answer":
        return _answer(session, event, member)
    if event.intent == "start":
        return _start(session, event)
    job = active_job(session, event.forge, event.project, event.issue)
    if event.intent == "cancel":
        # The issue no longer asks for a fix: what waits for a review round goes too, or the round
        # after the cancelled one would start for nothing (and spend a round of the MR's cap).
        dropped = rounds.drop_issue_requests(session, event.forge, event.project, event.issue, event.reason)
        if job is not None:
            if request_cancel(session, job, f"{event.reason} (delivery {event.delivery_id})") == "too_late":
                return IntakeResult("cancel_too_late", f"{event.reason}; {TOO_LATE}", job.id)
            return IntakeResult("cancelled_job", event.reason, job.id)
        if dropped:
            return IntakeResult("dropped_requests", f"{event.reason}; dropped {dropped} waiting round request(s)")
    if job is None:
        return IntakeResult("ignored", f"{event.reason}; no active job")
    add_event(session, job.id, "label_hint", f"{event.reason}; the pipeline re-reads the labels", None)
    return IntakeResult("noted", event.reason, job.id)


def _start(session: Session, event: WebhookEvent) -> IntakeResult:
    assert event.project is not None and event.issue is not None
    now = utcnow()
    st = prepared(session)
    conn = session.connection()
    job_id = conn.execute(
        st.insert_job,
        {
            "forge": event.forge,
            "project": event.project,
            "project_id": event.project_id,
            "issue": event.issue,
            "issue_url": event.issue_url,
            "clone_url": event.clone_url,
            "title": event.title,
            "body": event.body,
            "trigger_user": event.sender,
            "status": JobStatus.queued.value,
            "run": 0,
            "delivery_id": event.delivery_id,
            "cancel_requested": False,
            "enqueue_count": 1,
            "last_enqueued_at": now,
            "created_at": now,
            "updated_at": now,
        },
    ).scalar_one_or_none()
    if job_id is None:
        existing = active_job(session, event.forge, event.project, event.issue)
        return IntakeResult(
            "already_active", "a job for this issue is already active", existing.id if existing else None
        )
    conn.execute(
        st.insert_event,
        {
            "job_id": job_id,
            "at": now,
            "kind": "created",
            "message": event.reason,
            "data": {"delivery_id": event.delivery_id, "trigger_user": event.sender},
        },
    )
    return IntakeResult("job_created", event.reason, job_id, enqueue=True)


def _answer(session: Session, event: WebhookEvent, member: Membership = ASK_HERE) -> IntakeResult:
    """A `/frogfix` comment on an issue: the issue's newest round-0 job runs again, with the comments since
    FrogFix's question up to this one in its task, only if it asked one (`asked_at`) and a member wrote it.

    What the database shows is judged first (a job that asked and waits, or runs; a comment not seen
    before); then the forge is asked whether the author may trigger FrogFix (app/jobs/answer_gate.py),
    as for the label. A non-member's `/frogfix` queues nothing and changes nothing, and the person is told
    so once per issue (`answer_refusals`). A member's answer queues the waiting job, or, while a run is
    queued or active, joins the queued run or waits and runs when the run ends (`keep_answer`): it is
    never dropped. When the forge cannot tell, the answer counts as before issue 36 and the worker's
    admission decides (it asks for every answered run). A comment answers at most once.
    """
    assert event.project is not None and event.issue is not None
    comment = event.comment
    if comment is None:
        return IntakeResult("ignored", f"{event.reason}; no comment in the delivery")
    if comment.body.lstrip().startswith(rounds.OWN_COMMENT_MARKER):
        return IntakeResult("ignored", "FrogFix's own comment")
    job = records.latest_issue_job(session, event.forge, event.project, event.issue)
    if job is None:
        return IntakeResult("ignored", "/frogfix on an issue FrogFix has no job for; add the label to start one")
    if job.asked_at is None and job.status in ACTIVE_STATUSES:
        return IntakeResult("already_active", f"job {job.id} for this issue is already {job.status}", job.id)
    if job.asked_at is None or job.status not in (*ANSWERABLE_STATUSES, *ACTIVE_STATUSES):
        why = "it asked no question" if job.asked_at is None else f"it ended {job.status}"
        return IntakeResult("ignored", f"job {job.id} is not waiting for an answer: {why}", job.id)
    if records.answered_with(session, job.id, comment.id):
        return IntakeResult("duplicate", "this comment already answered FrogFix's question", job.id)
    who = comment.author or event.sender
    if not who:  # whose rights would be checked? An answer from no one is no one's to run
        return IntakeResult("ignored", "the /frogfix comment names no author", job.id)
    if member == ASK_HERE:
        member = answer_gate.may_answer(event.forge, event.project, who)
    assert member != ASK_HERE
    if member is False:
        return _refused(session, job, who, comment.id, event)
    answer = {"comment_id": comment.id, "author": who, "member": member, "delivery_id": event.delivery_id,
              "url": comment.url}  # fmt: skip
    for _ in range(3):  # the job may move between the read and a guarded write: judge it again
        if job.status in ACTIVE_STATUSES:
            kept = keep_answer(session, job.id, answer, member=member)
            if kept is not None:
                return _kept(session, job, answer, kept)
        elif job.status in ANSWERABLE_STATUSES:
            if requeue_answered(session, job, who):
                unknown = "" if member else " (the forge did not say whether they may trigger FrogFix: the worker asks)"
                add_event(
                    session,
                    job.id,
                    records.ANSWERED,
                    f"{who} answered FrogFix's question with /frogfix (delivery {event.delivery_id}); queued again"
                    + unknown,
                    answer,
                )
                return IntakeResult("job_requeued", f"{event.reason}; job {job.id} queued again", job.id, enqueue=True)
        else:
            break
        session.refresh(job)
    return IntakeResult("already_active", "the job or the issue changed meanwhile; nothing queued", job.id)


def _refused(session: Session, job: Job, who: str, comment_id: str, event: WebhookEvent) -> IntakeResult:
    """A non-member's `/frogfix`: nothing queued, nothing changed; told once per person and issue on the issue.

    The memory is written here (the unique key decides between two deliveries at once); the reply is posted
    by the caller after the commit (`tell_refused`: no database lock is held while the forge answers), and
    the memory is forgotten when it could not be posted, so a later `/frogfix` tells them."""
    assert event.project is not None and event.issue is not None
    why = f"{who} may not trigger FrogFix here: their /frogfix queues nothing"
    if not records.note_refusal(session, event.forge, event.project, event.issue, who, comment_id):
        return IntakeResult("answer_refused", f"{why}; told before, so nothing is said again", job.id)
    said = "told once on the issue"
    add_event(session, job.id, "answer_refused", f"{why}; {said}", {"comment_id": comment_id, "author": who})
    tell = (event.forge, event.project, event.issue, who)
    return IntakeResult("answer_refused", f"{why}; {said}", job.id, tell_refused=tell)


UNTOLD = "the reply could not be posted (the next refused /frogfix tries again)"


def tell_refused(session_scope: Any, result: IntakeResult) -> IntakeResult:
    """After the delivery's commit: the one reply to a refused `/frogfix`. When it could not be posted, its
    memory is forgotten (in a short transaction `session_scope` opens) and the result says so."""
    assert result.tell_refused is not None
    forge, project, issue, who = result.tell_refused
    if answer_gate.tell_refused(forge, project, issue):
        return result
    reason = f"{result.reason.rsplit('; ', 1)[0]}; {UNTOLD}"
    with session_scope() as session:
        records.forget_refusal(session, forge, project, issue, who)
        if result.job_id is not None:
            add_event(session, result.job_id, "answer_refusal_untold", reason, {"author": who})
    return replace(result, reason=reason)


def _kept(session: Session, job: Job, answer: dict[str, Any], kept: KeptAnswer) -> IntakeResult:
    """What became of an answer that came while the job's run was queued or active (`keep_answer`)."""
    who, delivery = answer["author"], answer["delivery_id"]
    if kept == "joined":
        message = f"{who} answered with /frogfix (delivery {delivery}) before the queued run started: it joins it"
        add_event(session, job.id, records.ANSWER_JOINED, message, answer)
        return IntakeResult("answer_joined", f"job {job.id} is queued: {who}'s answer joins its run", job.id)
    if kept == "waiting":
        message = f"{who} answered with /frogfix (delivery {delivery}) while the job is {job.status}: it runs next"
        add_event(session, job.id, records.ANSWER_WAITING, message, answer)
        return IntakeResult("answer_waiting", f"job {job.id} is {job.status}: {who}'s answer runs when it ends", job.id)
    return IntakeResult(
        "answer_not_kept",
        f"job {job.id} is {job.status} and a member's answer already waits; the forge could not tell whether"
        f" {who} may trigger FrogFix",
        job.id,
    )


def _round_request(session: Session, event: WebhookEvent) -> IntakeResult:
    """A comment, review or CI result on an MR: a pending request for the worker's triage, or a note.

    Only what the delivery itself shows is judged here (whose MR, our own comment, a closed MR);
    who wrote it and whether it addresses FrogFix need the forge's API, which the triage asks.
    """
    assert event.project is not None
    sha = event.ci.sha if event.ci is not None else None
    thread = rounds.find_thread(session, event.forge, event.project, mr=event.mr, branch=event.source_branch, sha=sha)
    if thread is None:
        return IntakeResult("ignored", "not an MR FrogFix opened")
    if event.comment is not None and event.comment.body.lstrip().startswith(rounds.OWN_COMMENT_MARKER):
        return IntakeResult("ignored", "FrogFix's own comment", thread.id)
    if event.mr_state in ("closed", "merged"):
        return IntakeResult("ignored", f"the MR is {event.mr_state}", thread.id)
    if event.mr is None and rounds.thread_mr_number(thread) is None:
        return IntakeResult("ignored", "the MR's number is unknown", thread.id)
    if event.intent == "ci":
        return _ci_result(session, thread, event)
    if event.comment is None:
        return IntakeResult("ignored", f"{event.reason}; no comment in the delivery", thread.id)
    return _new_request(session, thread, event)


def _merged(session: Session, event: WebhookEvent) -> IntakeResult:
    """A person merged or closed an MR: FrogFix's own MRs get a signed merge statement from the worker."""
    assert event.project is not None and event.merge is not None
    thread = rounds.find_thread(session, event.forge, event.project, mr=event.mr, branch=event.source_branch)
    if thread is None:
        return IntakeResult("ignored", "not an MR FrogFix opened")
    facts = {**event.merge.to_dict(), "forge": event.forge, "project": event.project, "mr": event.mr}
    return IntakeResult("merge_noted", event.reason, thread.id, merge=facts)


def _ci_result(session: Session, thread: Job, event: WebhookEvent) -> IntakeResult:
    """Every final CI result is a request for the worker's triage, which shows it on the job that pushed
    the commit it tested and on the MR (a merged-results pipeline's commit needs the forge's API to map
    it to the MR's head); only a failure can start a round."""
    report = event.ci
    if report is None or report.status not in CI_FINAL:
        return IntakeResult("ignored", f"{event.reason}; no final CI result", thread.id)
    result = _new_request(session, thread, event)
    if report.status != "failed" and result.outcome == "round_request":
        return IntakeResult("noted", f"forge CI {report.status}", thread.id, request_id=result.request_id)
    return result


def _new_request(session: Session, thread: Job, event: WebhookEvent) -> IntakeResult:
    request_id = rounds.record_request(session, thread, event)
    if request_id is None:
        return IntakeResult("duplicate", "this comment or CI result was already recorded", thread.id)
    return IntakeResult("round_request", event.reason, thread.id, request_id=request_id)
