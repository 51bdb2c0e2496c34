"""Every SQL statement about jobs and deliveries, and the job state transitions.

Callers own the transaction (one commit per request or task step); these functions only
read and write inside the session they are given.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import Table, and_, bindparam, func, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.forge.base import WebhookEvent
from app.models import (
    ACTIVE_PREDICATE,
    ACTIVE_STATUSES,
    FINAL_STATUSES,
    Job,
    JobAttempt,
    JobEvent,
    JobStatus,
    WebhookDelivery,
    utcnow,
)


class UnknownJob(LookupError):
    """No job has that id."""


class InvalidTransition(ValueError):
    """The job is not in a state that allows the change asked for."""


@dataclass(frozen=True)
class IntakeResult:
    """What the webhook endpoint answers, and whether a task must be sent after the commit."""

    outcome: str
    reason: str
    job_id: int | None = None
    enqueue: bool = False


_JOBS = cast(Table, Job.__table__)
_DELIVERIES = cast(Table, WebhookDelivery.__table__)
_EVENTS = cast(Table, JobEvent.__table__)


@dataclass(frozen=True)
class _IntakeStatements:
    insert_delivery: Any
    insert_job: Any
    insert_event: Any
    set_outcome: Any


@lru_cache(maxsize=4)
def _intake_statements(dialect: str) -> _IntakeStatements:
    """Built once per dialect and executed with parameters, so each delivery skips SQL construction."""
    ins = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return _IntakeStatements(
        insert_delivery=ins(_DELIVERIES)
        .on_conflict_do_nothing(index_elements=["forge", "delivery_id"])
        .returning(_DELIVERIES.c.id),
        insert_job=ins(_JOBS)
        .on_conflict_do_nothing(index_elements=["forge", "project", "issue"], index_where=text(ACTIVE_PREDICATE))
        .returning(_JOBS.c.id),
        insert_event=_EVENTS.insert(),
        set_outcome=_DELIVERIES.update()
        .where(_DELIVERIES.c.id == bindparam("delivery_row"))
        .values(outcome=bindparam("outcome"), reason=bindparam("reason"), job_id=bindparam("job_id")),
    )


def _statements(session: Session) -> _IntakeStatements:
    return _intake_statements(session.get_bind().dialect.name)


def record_delivery(session: Session, event: WebhookEvent) -> IntakeResult:
    """Insert the delivery (unique per forge + delivery id) and act on it; only a new row acts.

    A job created here is stamped as enqueued in the same transaction (the caller sends the task
    right after the commit, and calls `enqueue_failed` if that send fails), which saves a commit
    per delivery; if the process dies in between, the sweep sends it after the requeue delay.
    """
    st = _statements(session)
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

    result = _act(session, event)
    conn.execute(
        st.set_outcome,
        {"delivery_row": inserted, "outcome": result.outcome, "reason": result.reason[:2000], "job_id": result.job_id},
    )
    return result


def record_malformed(session: Session, forge: str, delivery_id: str, event: str, reason: str) -> None:
    """Keep an authenticated but unusable delivery, so nothing sent to us is silently lost."""
    session.connection().execute(
        _statements(session).insert_delivery,
        {
            "forge": forge,
            "delivery_id": delivery_id[:255],
            "event": event[:64] or "(none)",
            "outcome": "malformed",
            "reason": reason[:2000],
            "received_at": utcnow(),
        },
    )


def active_job(session: Session, forge: str, project: str, issue: int) -> Job | None:
    return session.execute(
        select(Job).where(
            Job.forge == forge, Job.project == project, Job.issue == issue, Job.status.in_(ACTIVE_STATUSES)
        )
    ).scalar_one_or_none()


def _act(session: Session, event: WebhookEvent) -> IntakeResult:
    if event.intent == "ignore" or event.project is None or event.issue is None:
        return IntakeResult("ignored", event.reason)
    if event.intent == "start":
        return _start(session, event)
    job = active_job(session, event.forge, event.project, event.issue)
    if job is None:
        return IntakeResult("ignored", f"{event.reason}; no active job")
    if event.intent == "cancel":
        request_cancel(session, job, f"{event.reason} (delivery {event.delivery_id})")
        return IntakeResult("cancelled_job", event.reason, job.id)
    add_event(session, job.id, "label_hint", f"{event.reason}; the pipeline re-reads the labels", None)
    return IntakeResult("noted", event.reason, job.id)


def _start(session: Session, event: WebhookEvent) -> IntakeResult:
    assert event.project is not None and event.issue is not None
    now = utcnow()
    st = _statements(session)
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
            "attempt": 0,
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


def enqueue_failed(session: Session, job_id: int) -> None:
    """Undo the optimistic enqueue stamp, so the next sweep sends the job at once."""
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued.value)
        .values(last_enqueued_at=None, enqueue_count=Job.enqueue_count - 1)
    )


def add_event(session: Session, job_id: int, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
    session.connection().execute(
        _statements(session).insert_event,
        {"job_id": job_id, "at": utcnow(), "kind": kind, "message": message[:10_000], "data": data},
    )


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise UnknownJob(f"no job with id {job_id}")
    return job


def job_events(session: Session, job_id: int) -> list[JobEvent]:
    return list(session.execute(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)).scalars())


def announced_this_round(session: Session, job_id: int) -> bool:
    """Whether the issue was already told this job started, since it was created or last retried.

    A run that replaces one whose worker died continues the same announced work: it says nothing new.
    """
    round_started = (
        select(func.max(JobEvent.id))
        .where(JobEvent.job_id == job_id, JobEvent.kind.in_(("created", "retried")))
        .scalar_subquery()
    )
    found = session.execute(
        select(JobEvent.id)
        .where(JobEvent.job_id == job_id, JobEvent.kind == "announced", JobEvent.id > func.coalesce(round_started, 0))
        .limit(1)
    ).first()
    return found is not None


def request_cancel(session: Session, job: Job, why: str) -> None:
    """A queued job is cancelled at once; a running one is asked to stop at its next check.

    The queued case is guarded: if a worker claimed the job meanwhile, it is asked to stop instead.
    """
    was = job.status
    if was == JobStatus.queued.value:
        done = cast(
            CursorResult[Any],
            session.execute(
                update(Job)
                .where(Job.id == job.id, Job.status == JobStatus.queued.value)
                .values(status=JobStatus.cancelled.value, finished_at=utcnow(), updated_at=utcnow(), error=why[:2000])
            ),
        )
        if done.rowcount:
            add_event(session, job.id, "cancelled", why)
            return
        was = JobStatus.running.value  # claimed between our read and our update
    if was in ACTIVE_STATUSES:
        session.execute(
            update(Job)
            .where(Job.id == job.id, Job.status.in_(ACTIVE_STATUSES))
            .values(cancel_requested=True, updated_at=utcnow())
        )
        add_event(session, job.id, "cancel_requested", why)
    else:
        raise InvalidTransition(f"job {job.id} is already {job.status}")


def claim_job(session: Session, job_id: int) -> bool:
    """queued -> running, guarded: of two deliveries of the same task, only one wins."""
    now = utcnow()
    result = cast(
        CursorResult[Any],
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == JobStatus.queued.value)
            .values(status=JobStatus.running.value, attempt=Job.attempt + 1, started_at=now, updated_at=now)
        ),
    )
    return bool(result.rowcount)


def _job_of_run(job_id: int, run: int | None) -> list[Any]:
    """The job's row, and with `run` only while that run owns it (a later claim moved `attempt` on)."""
    return [Job.id == job_id] if run is None else [Job.id == job_id, Job.attempt == run]


def set_status(
    session: Session,
    job_id: int,
    status: JobStatus,
    *,
    error: str | None = None,
    expected: tuple[str, ...] = ACTIVE_STATUSES,
    run: int | None = None,
    **values: Any,
) -> bool:
    """Move an active job to `status` (guarded by `expected`); final states stamp finished_at.

    With `run`, only while that run still owns the job: a run the sweep replaced (its worker
    was paused, not dead) must not end or move the job its successor is working on.
    """
    now = utcnow()
    changes: dict[str, Any] = {"status": status.value, "updated_at": now, **values}
    if error is not None:
        changes["error"] = error[:10_000]
    if status.value in FINAL_STATUSES:
        changes["finished_at"] = now
    where = [*_job_of_run(job_id, run), Job.status.in_(expected)]
    result = cast(CursorResult[Any], session.execute(update(Job).where(*where).values(**changes)))
    return bool(result.rowcount)


def jobs_due_for_enqueue(session: Session, older_than: timedelta, limit: int = 500) -> list[int]:
    """Queued jobs never sent, or sent long ago without being claimed (a lost message)."""
    cutoff = utcnow() - older_than
    rows = session.execute(
        select(Job.id)
        .where(Job.status == JobStatus.queued.value, or_(Job.last_enqueued_at.is_(None), Job.last_enqueued_at < cutoff))
        .order_by(Job.id)
        .limit(limit)
    )
    return [r[0] for r in rows]


def mark_enqueued(session: Session, job_id: int) -> None:
    session.execute(
        update(Job).where(Job.id == job_id).values(last_enqueued_at=utcnow(), enqueue_count=Job.enqueue_count + 1)
    )


@dataclass(frozen=True)
class JobFilter:
    status: str | None = None
    forge: str | None = None
    project: str | None = None


def list_jobs(session: Session, flt: JobFilter, limit: int = 50, offset: int = 0) -> tuple[list[Job], int]:
    """Newest first, with the total matching count."""
    conditions = _filter_conditions(flt)
    query = select(Job).where(*conditions).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit).offset(offset)
    count = select(func.count()).select_from(Job).where(*conditions)
    return list(session.execute(query).scalars()), int(session.execute(count).scalar_one())


def count_jobs_by_status(session: Session) -> dict[str, int]:
    return {s: int(n) for s, n in session.execute(select(Job.status, func.count()).group_by(Job.status))}


def count_deliveries(session: Session) -> dict[tuple[str, str], int]:
    rows = session.execute(
        select(WebhookDelivery.forge, WebhookDelivery.outcome, func.count()).group_by(
            WebhookDelivery.forge, WebhookDelivery.outcome
        )
    )
    return {(f, o): int(n) for f, o, n in rows}


def oldest_queued_age(session: Session, now: datetime | None = None) -> float:
    oldest = session.execute(select(func.min(Job.created_at)).where(Job.status == JobStatus.queued.value)).scalar()
    if oldest is None:
        return 0.0
    if oldest.tzinfo is None:
        from datetime import UTC

        oldest = oldest.replace(tzinfo=UTC)
    return max(0.0, ((now or utcnow()) - oldest).total_seconds())


def update_job(session: Session, job_id: int, *, run: int | None = None, **values: Any) -> None:
    """Set plain fields (title, base commit, steps...) without touching the status (with `run`: if it owns the job)."""
    session.execute(update(Job).where(*_job_of_run(job_id, run)).values(updated_at=utcnow(), **values))


def cancel_requested(session: Session, job_id: int) -> bool:
    return bool(session.execute(select(Job.cancel_requested).where(Job.id == job_id)).scalar())


def run_states(session: Session, job_ids: set[int]) -> dict[int, tuple[str, int]]:
    """Status and current run number of each job that exists among `job_ids`."""
    rows = session.execute(select(Job.id, Job.status, Job.attempt).where(Job.id.in_(job_ids))).all()
    return {job_id: (status, attempt) for job_id, status, attempt in rows}


def touch_heartbeat(session: Session, job_id: int, run: int | None = None) -> None:
    """A replaced run's heartbeat must not keep its successor's job looking alive."""
    session.execute(update(Job).where(*_job_of_run(job_id, run)).values(heartbeat_at=utcnow()))


def start_attempt(session: Session, job_id: int, run: int, number: int) -> int:
    attempt = JobAttempt(job_id=job_id, run=run, number=number, status="running", steps=0, started_at=utcnow())
    session.add(attempt)
    session.flush()
    return attempt.id


def update_attempt(session: Session, attempt_id: int, *, finished: bool = False, **values: Any) -> None:
    if finished:
        values["finished_at"] = utcnow()
    session.execute(update(JobAttempt).where(JobAttempt.id == attempt_id).values(**values))


def close_open_attempts(session: Session, job_id: int, status: str, why: str, run: int | None = None) -> None:
    """Attempts a job left `running` (its run ended early, or its worker died) end with the job (or that run)."""
    where = [JobAttempt.job_id == job_id, JobAttempt.status == "running"]
    if run is not None:
        where.append(JobAttempt.run == run)
    session.execute(update(JobAttempt).where(*where).values(status=status, error=why[:10_000], finished_at=utcnow()))


def job_attempts(session: Session, job_id: int) -> list[JobAttempt]:
    query = select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.run, JobAttempt.number)
    return list(session.execute(query).scalars())


def recover_stale_jobs(session: Session, stale_after: timedelta, max_runs: int) -> list[tuple[int, str]]:
    """Active jobs whose worker stopped beating: queue them again, or fail them after `max_runs` claims."""
    cutoff = utcnow() - stale_after
    stale = session.execute(
        select(Job.id, Job.attempt).where(
            Job.status.in_(("running", "verifying", "publishing")),
            or_(Job.heartbeat_at < cutoff, and_(Job.heartbeat_at.is_(None), Job.started_at < cutoff)),
        )
    ).all()
    outcomes = []
    for job_id, runs in stale:
        close_open_attempts(session, job_id, "failed", "the worker running this attempt stopped answering")
        if runs >= max_runs:
            why = f"the worker running this job stopped {runs} times; giving up"
            set_status(session, job_id, JobStatus.failed, error=why, expected=("running", "verifying", "publishing"))
            add_event(session, job_id, "failed", why)
            outcomes.append((job_id, "failed"))
        else:
            session.execute(
                update(Job)
                .where(Job.id == job_id, Job.status.in_(("running", "verifying", "publishing")))
                .values(status=JobStatus.queued.value, last_enqueued_at=None, heartbeat_at=None, updated_at=utcnow())
            )
            add_event(session, job_id, "requeued", "the worker stopped answering; the job is queued again")
            outcomes.append((job_id, "requeued"))
    return outcomes


def cancel_job(session: Session, job_id: int, who: str) -> str:
    """An operator's cancel: queued jobs end now, running ones stop at their next check."""
    job = get_job(session, job_id)
    was_queued = job.status == JobStatus.queued.value  # read before the update refreshes the object
    request_cancel(session, job, f"cancelled by {who}")
    return "cancelled" if was_queued else "cancel_requested"


RETRYABLE: tuple[str, ...] = ("failed", "no_fix", "cancelled", "rejected")


def retry_job(session: Session, job_id: int, who: str) -> None:
    """Queue a finished job again (a new run of the same job); refused while the issue has another active job."""
    job = get_job(session, job_id)
    if job.status not in RETRYABLE:
        raise InvalidTransition(f"job {job_id} is {job.status}; only {', '.join(RETRYABLE)} jobs can be retried")
    other = active_job(session, job.forge, job.project, job.issue)
    if other is not None:
        raise InvalidTransition(f"job {other.id} is already active for this issue")
    try:
        with session.begin_nested():
            _requeue(session, job_id)
    except IntegrityError as exc:  # a webhook created a job for this issue meanwhile
        raise InvalidTransition("a job is already active for this issue") from exc
    add_event(session, job_id, "retried", f"queued again by {who}")


def _requeue(session: Session, job_id: int) -> None:
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(RETRYABLE))
        .values(
            status=JobStatus.queued.value,
            cancel_requested=False,
            error=None,
            finished_at=None,
            last_enqueued_at=None,
            heartbeat_at=None,
            updated_at=utcnow(),
        )
    )


# -- dashboard reads ----------------------------------------------------------------------------
# Read-only queries for app/web/dashboard.py. The job list selects only the columns it shows (never the
# issue body) and pages by keyset on (created_at, id), so a deep page costs what the first one does.

SUCCESS_STATUSES: tuple[str, ...] = ("done",)
OUTCOME_STATUSES: tuple[str, ...] = ("done", "no_fix", "failed")  # jobs that ran to a verdict
LIST_COUNT_CAP = 10_000
SEARCH_MAX_CHARS = 100


@dataclass(frozen=True)
class JobRow:
    """One line of the dashboard's job list."""

    id: int
    forge: str
    project: str
    issue: int
    issue_url: str | None
    title: str | None
    status: str
    trigger_user: str | None
    mr_url: str | None
    steps: int
    runs: int
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int = 0


@dataclass(frozen=True)
class JobPage:
    """A page of the job list and the cursors of its neighbours (None where there is none).

    With a search, `total` is None (counting matches would mean reading every job) and, when the
    search window ran out before the page filled, `searched_to` is how far back it looked: the
    `older` cursor then continues the search from there.
    """

    rows: list[JobRow]
    older: tuple[datetime, int] | None
    newer: tuple[datetime, int] | None
    total: int | None
    total_capped: bool  # True: there are at least `total` matches, maybe more
    searched_to: datetime | None = None


_ROW_COLUMNS = (
    Job.id,
    Job.forge,
    Job.project,
    Job.issue,
    Job.issue_url,
    Job.title,
    Job.status,
    Job.trigger_user,
    Job.mr_url,
    Job.steps,
    Job.attempt,
    Job.cancel_requested,
    Job.created_at,
    Job.started_at,
    Job.finished_at,
)
# A search is a substring match that no index serves; each page reads at most this many jobs
# (newest first from the cursor), so a page costs the same at 100,000 jobs as at 10,000.
SEARCH_WINDOW = 10_000


def _like_pattern(text_: str) -> str:
    escaped = text_.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _filter_conditions(flt: JobFilter) -> list[Any]:
    conditions: list[Any] = []
    if flt.status:
        conditions.append(Job.status == flt.status)
    if flt.forge:
        conditions.append(Job.forge == flt.forge)
    if flt.project:
        conditions.append(Job.project == flt.project)
    return conditions


def _search_condition(columns: Any, search: str) -> Any:
    """Project or title contains the text (case-insensitive); `#12` or `12` also finds issue or job 12."""
    pattern = _like_pattern(search)
    matches: list[Any] = [
        columns.project.ilike(pattern, escape="\\"),
        columns.title.ilike(pattern, escape="\\"),
    ]
    number = search.lstrip("#!")
    if number.isdigit() and len(number) < 10:
        matches += [columns.issue == int(number), columns.id == int(number)]
    if search.startswith("@") or search.isidentifier():
        matches.append(columns.trigger_user == search.lstrip("@"))
    return or_(*matches)


def dashboard_jobs(
    session: Session,
    flt: JobFilter,
    search: str | None = None,
    *,
    older_than: tuple[datetime, int] | None = None,
    newer_than: tuple[datetime, int] | None = None,
    limit: int = 50,
    count_cap: int = LIST_COUNT_CAP,
) -> JobPage:
    """Newest first, `limit` rows after a keyset cursor; the count stops at `count_cap`.

    `older_than` pages towards older jobs, `newer_than` back towards newer ones. Both walk
    ix_jobs_created (or ix_jobs_status_created with a status filter) and stop after limit + 1 rows;
    a search looks through at most SEARCH_WINDOW jobs per page.
    """
    q = (search or "").strip()[:SEARCH_MAX_CHARS]
    conditions = _filter_conditions(flt)
    descending = newer_than is None
    if newer_than is not None:
        at, job_id = newer_than
        conditions += [Job.created_at >= at, or_(Job.created_at > at, Job.id > job_id)]
    elif older_than is not None:
        at, job_id = older_than
        conditions += [Job.created_at <= at, or_(Job.created_at < at, Job.id < job_id)]
    order = (Job.created_at.desc(), Job.id.desc()) if descending else (Job.created_at.asc(), Job.id.asc())
    if q:
        window = select(*_ROW_COLUMNS).where(*conditions).order_by(*order).limit(SEARCH_WINDOW).subquery()
        c = window.c
        outer = (c.created_at.desc(), c.id.desc()) if descending else (c.created_at.asc(), c.id.asc())
        query = select(window).where(_search_condition(c, q)).order_by(*outer)
    else:
        query = select(*_ROW_COLUMNS).where(*conditions).order_by(*order)
    fetched = list(session.execute(query.limit(limit + 1)).all())
    more = len(fetched) > limit
    fetched = fetched[:limit]
    window_end: tuple[datetime, int] | None = None
    if q and not more:  # did the window stop the search early? then it goes on from the window's end
        end = session.execute(
            select(Job.created_at, Job.id).where(*conditions).order_by(*order).offset(SEARCH_WINDOW - 1).limit(1)
        ).first()
        window_end = (end[0], end[1]) if end is not None else None
    if not descending:
        fetched.reverse()
    counts = attempt_counts(session, [r.id for r in fetched])
    rows = [
        JobRow(
            id=r.id,
            forge=r.forge,
            project=r.project,
            issue=r.issue,
            issue_url=r.issue_url,
            title=r.title,
            status=r.status,
            trigger_user=r.trigger_user,
            mr_url=r.mr_url,
            steps=r.steps or 0,
            runs=r.attempt or 0,
            cancel_requested=bool(r.cancel_requested),
            created_at=r.created_at,
            started_at=r.started_at,
            finished_at=r.finished_at,
            attempts=counts.get(r.id, 0),
        )
        for r in fetched
    ]
    first = (rows[0].created_at, rows[0].id) if rows else None
    last = (rows[-1].created_at, rows[-1].id) if rows else None
    older: tuple[datetime, int] | None
    newer: tuple[datetime, int] | None
    if descending:
        older = last if more else window_end
        newer = (first or older_than) if older_than is not None else None
    else:
        newer = first if more else window_end
        older = last or newer_than
    if q:
        return JobPage(rows, older, newer, None, False, window_end[0] if window_end and descending else None)
    capped = select(Job.id).where(*_filter_conditions(flt)).limit(count_cap + 1).subquery()
    total = int(session.execute(select(func.count()).select_from(capped)).scalar_one())
    return JobPage(rows, older, newer, min(total, count_cap), total > count_cap)


def attempt_counts(session: Session, job_ids: list[int]) -> dict[int, int]:
    """Attempts per job for a page of jobs (uq_attempts_job_run_number leads with job_id)."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(JobAttempt.job_id, func.count()).where(JobAttempt.job_id.in_(job_ids)).group_by(JobAttempt.job_id)
    )
    return {int(j): int(n) for j, n in rows}


def events_after(session: Session, job_id: int, after_id: int = 0, limit: int = 200) -> list[JobEvent]:
    """Timeline events newer than `after_id`, for the job page's live updates."""
    query = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after_id).order_by(JobEvent.id).limit(limit)
    return list(session.execute(query).scalars())


def latest_attempt(session: Session, job_id: int) -> JobAttempt | None:
    query = (
        select(JobAttempt)
        .where(JobAttempt.job_id == job_id)
        .order_by(JobAttempt.run.desc(), JobAttempt.number.desc())
        .limit(1)
    )
    return session.execute(query).scalar_one_or_none()


def get_attempt(session: Session, job_id: int, attempt_id: int) -> JobAttempt:
    attempt = session.get(JobAttempt, attempt_id)
    if attempt is None or attempt.job_id != job_id:
        raise UnknownJob(f"job {job_id} has no attempt {attempt_id}")
    return attempt


@dataclass(frozen=True)
class Overview:
    """The dashboard's headline numbers; the windowed ones cover jobs created since `since`."""

    by_status: dict[str, int]
    queue_depth: int
    model_slots_in_use: int  # jobs in status running (each holds one model slot)
    running_sandboxes: int  # attempts in status running, of jobs still active
    since: datetime
    finished: int  # done + no_fix + failed in the window
    succeeded: int
    median_seconds: float | None
    p95_seconds: float | None
    per_day: list[tuple[str, dict[str, int]]]  # (YYYY-MM-DD, status -> jobs created that day)

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.finished if self.finished else None


def dashboard_overview(session: Session, now: datetime | None = None, days: int = 14) -> Overview:
    """Counts by status, queue and slot use, success rate and durations, and jobs per day."""
    now = now or utcnow()
    since = (now - timedelta(days=days - 1)).replace(hour=0, minute=0, second=0, microsecond=0)
    by_status = count_jobs_by_status(session)
    sandboxes = int(
        session.execute(
            select(func.count())
            .select_from(JobAttempt)
            .join(Job, Job.id == JobAttempt.job_id)
            .where(JobAttempt.status == "running", Job.status.in_(ACTIVE_STATUSES))
        ).scalar_one()
    )
    window = and_(Job.created_at >= since, Job.status.in_(OUTCOME_STATUSES))
    outcome_counts = {
        s: int(n) for s, n in session.execute(select(Job.status, func.count()).where(window).group_by(Job.status))
    }
    ran = and_(window, Job.started_at.is_not(None), Job.finished_at.is_not(None))
    median, p95 = _duration_percentiles(session, ran)
    if session.get_bind().dialect.name == "postgresql":
        day: Any = func.to_char(func.timezone("UTC", Job.created_at), "YYYY-MM-DD")
    else:
        day = func.date(Job.created_at)
    per_day: dict[str, dict[str, int]] = {}
    for d in range(days):
        per_day[(since + timedelta(days=d)).strftime("%Y-%m-%d")] = {}
    rows = session.execute(
        select(day.label("day"), Job.status, func.count()).where(Job.created_at >= since).group_by("day", Job.status)
    )
    for d, status, n in rows:
        per_day.setdefault(str(d), {})[status] = int(n)
    return Overview(
        by_status=by_status,
        queue_depth=by_status.get(JobStatus.queued.value, 0),
        model_slots_in_use=by_status.get(JobStatus.running.value, 0),
        running_sandboxes=sandboxes,
        since=since,
        finished=sum(outcome_counts.values()),
        succeeded=sum(outcome_counts.get(s, 0) for s in SUCCESS_STATUSES),
        median_seconds=median,
        p95_seconds=p95,
        per_day=sorted(per_day.items()),
    )


def _duration_percentiles(session: Session, where: Any) -> tuple[float | None, float | None]:
    """Median and p95 of finished_at - started_at: in the database on PostgreSQL, in Python on SQLite."""
    if session.get_bind().dialect.name == "postgresql":
        epoch: Any = func.extract("epoch", Job.finished_at - Job.started_at)
        row = session.execute(
            select(
                func.percentile_cont(0.5).within_group(epoch),
                func.percentile_cont(0.95).within_group(epoch),
            ).where(where)
        ).one()
        return (None if row[0] is None else float(row[0]), None if row[1] is None else float(row[1]))
    seconds = (func.julianday(Job.finished_at) - func.julianday(Job.started_at)) * 86400.0
    values = sorted(float(v) for (v,) in session.execute(select(seconds).where(where)) if v is not None)
    if not values:
        return None, None
    return _percentile(values, 0.5), _percentile(values, 0.95)


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, as PostgreSQL's percentile_cont does."""
    position = (len(values) - 1) * q
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)
