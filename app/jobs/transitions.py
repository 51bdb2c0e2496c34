"""The job's state changes, each one a guarded UPDATE: claim, move, cancel, retry, recover, enqueue stamps.

Every change names the statuses it may start from in its WHERE clause, so two processes racing
for the same job (two deliveries of a task, a cancel and a claim, the sweep and a paused worker)
never both win. Callers own the transaction.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Final, Literal, cast

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.endings import Ending, EndingKind
from app.jobs import records
from app.jobs.records import (
    active_job,
    add_event,
    close_open_attempts,
    comment_order,
    get_job,
    job_of_run,
    queued_since,
)
from app.models import Job, utcnow
from app.statuses import (
    ACTIVE_STATUSES,
    CANCELLABLE_RUN_STATUSES,
    FINAL_STATUSES,
    RETRYABLE_STATUSES,
    RUN_STATUSES,
    AttemptStatus,
    JobStatus,
)


class InvalidTransition(ValueError):
    """The job is not in a state that allows the change asked for."""


def _changed(session: Session, statement: Any) -> bool:
    """Run a guarded UPDATE; True when it matched a row (the guard held)."""
    return bool(cast(CursorResult[Any], session.execute(statement)).rowcount)


CancelOutcome = Literal["cancelled", "cancel_requested", "too_late"]
TOO_LATE = "the job was already publishing its merge request; the push goes ahead"


def request_cancel(session: Session, job: Job, why: str) -> CancelOutcome:
    """A queued job is cancelled at once; a running one is asked to stop at its next check; one already
    publishing is not stopped (`too_late`: its move to publishing saw no cancel, so the push goes ahead).

    Each case is guarded: if a worker claimed the job meanwhile, it is asked to stop instead; if it
    reached publishing meanwhile, the answer is `too_late`, never a cancel that will not happen.
    """
    now = utcnow()  # each step re-reads the row in its WHERE: `job` may be stale (claimed, re-queued)
    cancelled = update(Job).where(Job.id == job.id, Job.status == JobStatus.queued.value)
    if _changed(
        session,
        cancelled.values(
            status=JobStatus.cancelled.value, finished_at=now, updated_at=now, error=why[:2000], hold_reason=None,
            ending_kind=EndingKind.cancelled.value, ending_facts=None,
        ),
    ):
        add_event(session, job.id, "cancelled", why)
        return "cancelled"
    asked = update(Job).where(Job.id == job.id, Job.status.in_(CANCELLABLE_RUN_STATUSES))
    if _changed(session, asked.values(cancel_requested=True, updated_at=now)):
        add_event(session, job.id, "cancel_requested", why)
        return "cancel_requested"
    now_status = session.scalar(select(Job.status).where(Job.id == job.id))
    if now_status == JobStatus.publishing.value:
        add_event(session, job.id, "cancel_too_late", f"{why}: {TOO_LATE}")
        return "too_late"
    raise InvalidTransition(f"job {job.id} is already {now_status}")


def begin_publishing(session: Session, job_id: int, run: int) -> bool:
    """verifying -> publishing for `run`, only if no cancel was asked: the point after which a cancel
    is too late (`request_cancel` stops asking once the job is publishing)."""
    where = [*job_of_run(job_id, run), Job.status == JobStatus.verifying.value, Job.cancel_requested.is_(False)]
    return _changed(session, update(Job).where(*where).values(status=JobStatus.publishing.value, updated_at=utcnow()))


def claim_job(session: Session, job_id: int) -> bool:
    """queued -> running, guarded: of two deliveries of the same task, only one wins. Starts a new run.

    Stamps the run's queue wait (from when the job last entered the queue to this claim) as the
    latest run's, and adds it to the job's total over all its runs (retries, review rounds, holds).
    What the row says of a run (its steps, exit reason, error) starts again: a retry's page must not
    show the last run's ending while this one works.
    Workers claim through app/jobs/scheduler.py (`claim_next`), which picks the job and calls this.
    """
    now = utcnow()
    since = queued_since(session, job_id)
    wait = None if since is None else max(0.0, (now - since).total_seconds())
    return _changed(
        session,
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued.value)
        .values(status=JobStatus.running.value, run=Job.run + 1, started_at=now, updated_at=now,
                queue_wait_seconds=wait, hold_reason=None, extra_slots=0, steps=0, exit_reason=None, error=None,
                ending_kind=None, ending_facts=None,
                queue_wait_total_seconds=func.coalesce(Job.queue_wait_total_seconds, 0.0) + (wait or 0.0)),
    )


def set_status(
    session: Session,
    job_id: int,
    status: JobStatus,
    *,
    error: str | None = None,
    expected: tuple[str, ...] = ACTIVE_STATUSES,
    run: int | None = None,
    ending: Ending | None = None,
    **values: Any,
) -> bool:
    """Move an active job to `status` (guarded by `expected`); final states stamp finished_at.

    `ending`: how a job that ends ended (app/endings.py): its kind and typed facts are kept beside `error`.

    With `run`, only while that run still owns the job: a run the sweep replaced (its worker
    was paused, not dead) must not end or move the job its successor is working on.
    """
    now = utcnow()
    changes: dict[str, Any] = {"status": status.value, "updated_at": now, **values}
    if error is not None:
        changes["error"] = error[:10_000]
    if ending is not None:
        changes.update(ending_kind=ending.kind.value, ending_facts=ending.facts() or None)
    if status.value in FINAL_STATUSES:
        changes["finished_at"] = now
    where = [*job_of_run(job_id, run), Job.status.in_(expected)]
    return _changed(session, update(Job).where(*where).values(**changes))


def recover_stale_jobs(session: Session, stale_after: timedelta, max_runs: int) -> list[tuple[int, str]]:
    """Active jobs whose worker stopped beating: queue them again, or fail them after `max_runs` claims."""
    cutoff = utcnow() - stale_after
    stale = session.execute(
        select(Job.id, Job.run).where(
            Job.status.in_(RUN_STATUSES),
            or_(Job.heartbeat_at < cutoff, and_(Job.heartbeat_at.is_(None), Job.started_at < cutoff)),
        )
    ).all()
    outcomes = []
    for job_id, runs in stale:
        why_attempt = "the worker running this attempt stopped answering"
        close_open_attempts(session, job_id, AttemptStatus.failed.value, why_attempt)
        if runs >= max_runs:
            why = f"the worker running this job stopped {runs} times; giving up"
            set_status(session, job_id, JobStatus.failed, error=why, expected=RUN_STATUSES,
                       ending=Ending(EndingKind.worker_lost, why))
            add_event(session, job_id, "failed", why)
            outcomes.append((job_id, "failed"))
        else:
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status.in_(RUN_STATUSES))
                .values(status=JobStatus.queued.value, last_enqueued_at=None, heartbeat_at=None, updated_at=utcnow())
            )
            add_event(session, job_id, "requeued", "the worker stopped answering; the job is queued again")
            outcomes.append((job_id, "requeued"))
    return outcomes


def cancel_job(session: Session, job_id: int, who: str) -> CancelOutcome:
    """An operator's cancel: queued jobs end now, running ones stop at their next check, publishing
    ones finish (`too_late`)."""
    return request_cancel(session, get_job(session, job_id), f"cancelled by {who}")


def retry_job(session: Session, job_id: int, who: str) -> None:
    """Queue a finished job again (a new run of the same job); refused while the issue has another active job.

    Only the row changes here: callers send the task after the commit (see app/jobs/requeue.py).
    """
    job = get_job(session, job_id)
    if job.status not in RETRYABLE_STATUSES:
        allowed = ", ".join(RETRYABLE_STATUSES)
        raise InvalidTransition(f"job {job_id} is {job.status}; only {allowed} jobs can be retried")
    other = active_job(session, job.forge, job.project, job.issue)
    if other is not None:
        raise InvalidTransition(f"job {other.id} is already active for this issue")
    try:
        with session.begin_nested():
            _requeue(session, job_id)
    except IntegrityError as exc:  # a webhook created a job for this issue meanwhile
        raise InvalidTransition("a job is already active for this issue") from exc
    add_event(session, job_id, "retried", f"queued again by {who}")


# What a finished job may be, for a `/frogfix` answer on its issue to queue it again (issue 24): it ended
# `no_fix` having asked the reporter a question (`asked_at`), or a later run of it was `rejected` (a
# non-member's `/frogfix` that intake could not check, say), which must not leave the question unanswerable.
ANSWERABLE_STATUSES: Final[tuple[str, ...]] = (JobStatus.no_fix.value, JobStatus.rejected.value)
# What a run may end as for a member's answer that waited for it (issue 36) to run next: the answerable
# statuses, and `failed` (the member asked for a run while one was going; that it failed answers nothing).
# A run that ended `done` published a merge request, one that ended `cancelled` lost its label or was
# stopped: the answer that waited is let go then, with an event that says why.
WAITED_ANSWER_RUNS_AFTER: Final[tuple[str, ...]] = (*ANSWERABLE_STATUSES, JobStatus.failed.value)

# What a finished job's row is when it is queued again for an answer: a new run, nothing of the last one's end.
_ANSWER_RUN: Final[dict[str, Any]] = {
    "status": JobStatus.queued.value,
    "cancel_requested": False,
    "error": None,
    "ending_kind": None,
    "ending_facts": None,
    "steps": 0,
    "exit_reason": None,
    "finished_at": None,
    "heartbeat_at": None,
    "hold_reason": None,
    "answer_waiting": None,
}


def requeue_answered(session: Session, job: Job, who: str) -> bool:
    """Queue a job that asked the reporter a question again (a new run), stamped as sent, with `who`
    (whoever answered with `/frogfix`) as its trigger user; the caller sends the task after the commit.

    Guarded: only while it is still in the status it was read in, answerable, with `asked_at` set. False
    when that no longer held, or the issue got another active job meanwhile (the unique index)."""
    now = utcnow()
    guarded = update(Job).where(
        Job.id == job.id,
        Job.status == job.status,
        Job.status.in_(ANSWERABLE_STATUSES),
        Job.asked_at.is_not(None),
    )
    values = {
        **_ANSWER_RUN,
        "trigger_user": who,
        "last_enqueued_at": now,
        "enqueue_count": Job.enqueue_count + 1,
        "updated_at": now,
    }
    try:
        with session.begin_nested():
            return _changed(session, guarded.values(**values))
    except IntegrityError:  # a webhook created a job for this issue meanwhile
        return False


KeptAnswer = Literal["joined", "waiting", "not_kept"]


def keep_answer(session: Session, job_id: int, answer: dict[str, Any], *, member: bool | None) -> KeptAnswer | None:
    """A `/frogfix` answer that arrived while the job's run is queued or active (issue 36): never dropped.

    A member's answer joins a queued run that has not started (`joined`): the member becomes its trigger
    user, and the run's task takes the comments up to this `/frogfix` (the caller's `answer_joined` event
    names it). Otherwise the answer waits on the job (`waiting`, in `answer_waiting`, the newest kept) and
    runs when this run ends (`run_waited_answers`). `member` None: the forge could not say whether its author
    may trigger FrogFix (the worker's admission asks again); such an answer never joins a run nor replaces a
    member's waiting answer (`not_kept`). None when the job is no longer queued or active."""
    now = utcnow()
    if member:
        queued = update(Job).where(Job.id == job_id, Job.status == JobStatus.queued.value)
        if _changed(session, queued.values(trigger_user=answer["author"], answer_waiting=None, updated_at=now)):
            return "joined"
    row = session.execute(select(Job.status, Job.answer_waiting).where(Job.id == job_id)).first()
    if row is None or row[0] not in ACTIVE_STATUSES:
        return None
    waiting = row[1] if isinstance(row[1], dict) else None
    if not member and waiting is not None and waiting.get("member"):
        return "not_kept"
    if waiting is not None and bool(waiting.get("member")) >= bool(member) and _newer(waiting, answer):
        return "waiting"  # a later /frogfix already waits (delivered first): its window holds this one too
    active = update(Job).where(Job.id == job_id, Job.status.in_(ACTIVE_STATUSES))
    return "waiting" if _changed(session, active.values(answer_waiting=answer, updated_at=now)) else None


def _newer(kept: dict[str, Any], answer: dict[str, Any]) -> bool:
    """Whether the kept answer's comment came after `answer`'s (by the forge's comment id, not delivery order)."""
    return comment_order(str(kept.get("comment_id") or "")) > comment_order(str(answer.get("comment_id") or ""))


def run_waited_answers(session: Session) -> list[int]:
    """Each job whose run ended while a member's answer waited (`keep_answer`) runs next with it: queued
    again, its trigger user the answer's author (the worker's admission checks their rights, as for every
    answered run) and its task the comments up to that `/frogfix`, unstamped (the caller sends it after the
    commit, else the sweep does). A run that ended `done` or `cancelled`, or an issue that has another
    active job now, lets the answer go, with an event that says why. The ids of the jobs queued again."""
    rows = session.execute(
        select(Job.id, Job.status, Job.run, Job.asked_at, Job.answer_waiting).where(
            Job.answer_waiting.is_not(None), Job.status.in_(FINAL_STATUSES)
        )
    ).all()
    queued: list[int] = []
    for job_id, status, run, asked_at, answer in rows:
        answer = answer if isinstance(answer, dict) else {}
        who = str(answer.get("author") or "")
        guarded = update(Job).where(Job.id == job_id, Job.status == status, Job.answer_waiting.is_not(None))
        data = {**answer, "waited_for_run": run}
        why = f"run {run} ended {status}"
        if status in WAITED_ANSWER_RUNS_AFTER and asked_at is not None and who:
            try:
                with session.begin_nested():
                    moved = _changed(
                        session,
                        guarded.values(**_ANSWER_RUN, trigger_user=who, last_enqueued_at=None, updated_at=utcnow()),
                    )
            except IntegrityError:  # a job of the issue became active meanwhile (its label added again)
                moved, why = False, "the issue has another active job"
            if moved:
                message = f"{who}'s /frogfix answer waited for run {run} ({status}); queued again to run it"
                add_event(session, job_id, records.ANSWERED, message, data)
                queued.append(job_id)
                continue
        if _changed(session, guarded.values(answer_waiting=None, updated_at=utcnow())):
            add_event(session, job_id, records.ANSWER_LET_GO, f"{who}'s waiting /frogfix answer let go: {why}", data)
    return queued


def _requeue(session: Session, job_id: int) -> None:
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(RETRYABLE_STATUSES))
        .values(
            status=JobStatus.queued.value,
            cancel_requested=False,
            error=None,
            ending_kind=None,
            ending_facts=None,
            steps=0,
            exit_reason=None,
            finished_at=None,
            last_enqueued_at=None,
            heartbeat_at=None,
            updated_at=utcnow(),
        )
    )


# -- enqueue stamps: when a queued job's task was last sent ---------------------------------------


def jobs_due_for_enqueue(session: Session, older_than: timedelta, limit: int = 500) -> list[int]:
    """Queued jobs never sent, or sent long ago without being claimed (a lost message).

    Jobs held for their project's budget are not due: sending them again would only spend a
    ticket; the scheduler's `release_held` makes them due when the budget allows.
    """
    cutoff = utcnow() - older_than
    rows = session.execute(
        select(Job.id)
        .where(
            Job.status == JobStatus.queued.value,
            Job.hold_reason.is_(None),
            or_(Job.last_enqueued_at.is_(None), Job.last_enqueued_at < cutoff),
        )
        .order_by(Job.id)
        .limit(limit)
    )
    return [r[0] for r in rows]


def mark_enqueued(session: Session, job_id: int) -> None:
    """The task was sent: the sweep leaves the job alone until the requeue delay passes."""
    session.execute(
        update(Job).where(Job.id == job_id).values(last_enqueued_at=utcnow(), enqueue_count=Job.enqueue_count + 1)
    )


def enqueue_failed(session: Session, job_id: int) -> None:
    """Undo the optimistic enqueue stamp, so the next sweep sends the job at once."""
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued.value)
        .values(last_enqueued_at=None, enqueue_count=Job.enqueue_count - 1)
    )
