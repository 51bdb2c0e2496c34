"""The job, attempt and event records: reads, and the writes that change no status.

Callers own the transaction (one commit per request or task step); these functions only read
and write inside the session they are given. Status changes are in app/jobs/transitions.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Final, cast

from sqlalchemy import Table, bindparam, delete, func, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from app.models import ACTIVE_PREDICATE, AnswerRefusal, Job, JobAttempt, JobEvent, WebhookDelivery, utcnow
from app.statuses import ACTIVE_STATUSES, AttemptStatus, JobStatus
from app.usage import USAGE_COLUMNS, UsageFigures


class UnknownJob(LookupError):
    """No job has that id."""


_JOBS = cast(Table, Job.__table__)
_DELIVERIES = cast(Table, WebhookDelivery.__table__)
_EVENTS = cast(Table, JobEvent.__table__)
_REFUSALS = cast(Table, AnswerRefusal.__table__)


@dataclass(frozen=True)
class PreparedStatements:
    """The statements every webhook delivery runs, built once per SQL dialect."""

    insert_delivery: Any
    insert_job: Any
    insert_event: Any
    set_outcome: Any


@lru_cache(maxsize=4)
def _prepared_for(dialect: str) -> PreparedStatements:
    """Built once per dialect and executed with parameters, so each delivery skips SQL construction."""
    ins = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return PreparedStatements(
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


def prepared(session: Session) -> PreparedStatements:
    """The prepared statements for the session's database."""
    return _prepared_for(session.get_bind().dialect.name)


def job_of_run(job_id: int, run: int | None) -> list[Any]:
    """The job's row, and with `run` only while that run owns it (a later claim moved `Job.run` on)."""
    return [Job.id == job_id] if run is None else [Job.id == job_id, Job.run == run]


# -- jobs ---------------------------------------------------------------------------------------


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise UnknownJob(f"no job with id {job_id}")
    return job


def active_job(session: Session, forge: str, project: str, issue: int) -> Job | None:
    """The issue's one active job, if any (the partial unique index allows at most one)."""
    return session.execute(
        select(Job).where(
            Job.forge == forge, Job.project == project, Job.issue == issue, Job.status.in_(ACTIVE_STATUSES)
        )
    ).scalar_one_or_none()


def latest_issue_job(session: Session, forge: str, project: str, issue: int) -> Job | None:
    """The issue's newest round-0 job (the one its label started; review rounds are left out), if any."""
    return session.execute(
        select(Job)
        .where(Job.forge == forge, Job.project == project, Job.issue == issue, Job.round == 0)
        .order_by(Job.id.desc())
        .limit(1)
    ).scalar_one_or_none()


def answered_with(session: Session, job_id: int, comment_id: str) -> bool:
    """Whether comment `comment_id` already answered the job: it queued it, joined its queued run or waits
    for its run to end (an `answered`, `answer_joined` or `answer_waiting` event names it)."""
    found = session.execute(
        select(JobEvent.data).where(JobEvent.job_id == job_id, JobEvent.kind.in_(ANSWER_EVENTS))
    ).scalars()
    return any(isinstance(data, dict) and data.get("comment_id") == comment_id for data in found)


def answer_comment(session: Session, job_id: int) -> str | None:
    """The `/frogfix` comment the job's current (or next) run answers: the newest (by the forge's comment id,
    which grows with each comment, not by delivery order: webhooks may arrive out of order) of those that
    queued the job or joined its queued run since it was last created or retried by an operator (then None:
    no bound, as before issue 36). The run's task takes the comments up to it and none after
    (worker/job/question.py `answers_since`)."""
    events = session.execute(
        select(JobEvent.kind, JobEvent.data)
        .where(JobEvent.job_id == job_id, JobEvent.kind.in_(("created", "retried", ANSWERED, ANSWER_JOINED)))
        .order_by(JobEvent.id.desc())
    ).all()
    found: list[str] = []
    for kind, data in events:
        if kind not in (ANSWERED, ANSWER_JOINED):
            break
        if isinstance(data, dict) and data.get("comment_id"):
            found.append(str(data["comment_id"]))
    return max(found, key=comment_order) if found else None


def comment_order(comment_id: str) -> tuple[int, int, str]:
    """Sort key of a forge comment id: numeric ids (both forges) by value, anything else after, as text."""
    return (0, int(comment_id), "") if comment_id.isdigit() else (1, 0, comment_id)


@lru_cache(maxsize=4)
def _insert_refusal_for(dialect: str) -> Any:
    ins = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (
        ins(_REFUSALS)
        .on_conflict_do_nothing(index_elements=["forge", "project", "issue", "author"])
        .returning(_REFUSALS.c.id)
    )


def note_refusal(session: Session, forge: str, project: str, issue: int, author: str, comment_id: str) -> bool:
    """Remember that `author` is told on the issue that their `/frogfix` starts nothing: True the first time
    (tell them), False when they were told before (say nothing). One row per person and issue, the unique
    key decides between two deliveries at once; usernames are casefolded, as the forges compare them."""
    inserted = session.connection().execute(
        _insert_refusal_for(session.get_bind().dialect.name),
        {
            "forge": forge,
            "project": project,
            "issue": issue,
            "author": author.casefold()[:255],
            "comment_id": comment_id[:64],
            "created_at": utcnow(),
        },
    ).scalar_one_or_none()
    return inserted is not None


def forget_refusal(session: Session, forge: str, project: str, issue: int, author: str) -> None:
    """Forget that `author` was told (the reply could not be posted): their next refused `/frogfix` tells them."""
    session.execute(
        delete(AnswerRefusal).where(
            AnswerRefusal.forge == forge, AnswerRefusal.project == project, AnswerRefusal.issue == issue,
            AnswerRefusal.author == author.casefold()[:255],
        )
    )


def update_job(session: Session, job_id: int, *, run: int | None = None, **values: Any) -> None:
    """Set plain fields (title, base commit, steps...) without touching the status (with `run`: if it owns the job)."""
    session.execute(update(Job).where(*job_of_run(job_id, run)).values(updated_at=utcnow(), **values))


def cancel_requested(session: Session, job_id: int) -> bool:
    return bool(session.execute(select(Job.cancel_requested).where(Job.id == job_id)).scalar())


def run_states(session: Session, job_ids: set[int]) -> dict[int, tuple[str, int]]:
    """Status and current run number of each job that exists among `job_ids`."""
    rows = session.execute(select(Job.id, Job.status, Job.run).where(Job.id.in_(job_ids))).all()
    return {job_id: (status, run) for job_id, status, run in rows}


def touch_heartbeat(session: Session, job_id: int, run: int | None = None) -> None:
    """A replaced run's heartbeat must not keep its successor's job looking alive."""
    session.execute(update(Job).where(*job_of_run(job_id, run)).values(heartbeat_at=utcnow()))


@dataclass(frozen=True)
class JobFilter:
    status: str | None = None
    forge: str | None = None
    project: str | None = None


def filter_conditions(flt: JobFilter) -> list[Any]:
    """The WHERE conditions of a filter, shared by the API's list and the dashboard's."""
    conditions: list[Any] = []
    if flt.status:
        conditions.append(Job.status == flt.status)
    if flt.forge:
        conditions.append(Job.forge == flt.forge)
    if flt.project:
        conditions.append(Job.project == flt.project)
    return conditions


def list_jobs(session: Session, flt: JobFilter, limit: int = 50, offset: int = 0) -> tuple[list[Job], int]:
    """Newest first, with the total matching count."""
    conditions = filter_conditions(flt)
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
    return max(0.0, ((now or utcnow()) - oldest).total_seconds())


# -- events -------------------------------------------------------------------------------------


def add_event(session: Session, job_id: int, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
    session.connection().execute(
        prepared(session).insert_event,
        {"job_id": job_id, "at": utcnow(), "kind": kind, "message": message[:10_000], "data": data},
    )


def job_events(session: Session, job_id: int) -> list[JobEvent]:
    return list(session.execute(select(JobEvent).where(JobEvent.job_id == job_id).order_by(JobEvent.id)).scalars())


def events_after(session: Session, job_id: int, after_id: int = 0, limit: int = 200) -> list[JobEvent]:
    """Timeline events newer than `after_id`, for the job page's live updates."""
    query = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after_id).order_by(JobEvent.id).limit(limit)
    return list(session.execute(query).scalars())


# A `/frogfix` answer on the issue queued the job again (issue 24: FrogFix asked instead of publishing).
ANSWERED: Final = "answered"
# A member's `/frogfix` answer that came while the job's run was queued or active (issue 36): it joined the
# queued run, or waits for the run to end (`answer_let_go` when that run's end leaves nothing to answer).
ANSWER_JOINED: Final = "answer_joined"
ANSWER_WAITING: Final = "answer_waiting"
ANSWER_LET_GO: Final = "answer_let_go"
ANSWER_EVENTS: Final = (ANSWERED, ANSWER_JOINED, ANSWER_WAITING)
# The timeline events that put a job in the queue: its creation, an operator's retry, the sweep's requeue,
# an answer to FrogFix's question.
QUEUED_EVENTS: Final = ("created", "retried", "requeued", ANSWERED)


def queued_since(session: Session, job_id: int) -> datetime | None:
    """When the job last entered the queue (its newest queueing event; its creation without one)."""
    at = session.execute(
        select(func.max(JobEvent.at)).where(JobEvent.job_id == job_id, JobEvent.kind.in_(QUEUED_EVENTS))
    ).scalar()
    if at is None:
        at = session.execute(select(Job.created_at).where(Job.id == job_id)).scalar()
    return at


def announced_this_round(session: Session, job_id: int) -> bool:
    """Whether the issue was already told this job started, since it was created, last retried or answered.

    A run that replaces one whose worker died continues the same announced work: it says nothing new.
    """
    round_started = (
        select(func.max(JobEvent.id))
        .where(JobEvent.job_id == job_id, JobEvent.kind.in_(("created", "retried", ANSWERED)))
        .scalar_subquery()
    )
    found = session.execute(
        select(JobEvent.id)
        .where(JobEvent.job_id == job_id, JobEvent.kind == "announced", JobEvent.id > func.coalesce(round_started, 0))
        .limit(1)
    ).first()
    return found is not None


# -- attempts -----------------------------------------------------------------------------------


def start_attempt(session: Session, job_id: int, run: int, number: int) -> int:
    attempt = JobAttempt(
        job_id=job_id, run=run, number=number, status=AttemptStatus.running.value, steps=0, started_at=utcnow()
    )
    session.add(attempt)
    session.flush()
    return attempt.id


def update_attempt(session: Session, attempt_id: int, *, finished: bool = False, **values: Any) -> None:
    if finished:
        values["finished_at"] = utcnow()
    session.execute(update(JobAttempt).where(JobAttempt.id == attempt_id).values(**values))


def record_usage(session: Session, job_id: int, attempt_id: int, usage: UsageFigures) -> None:
    """An attempt's figures so far, then its job's as the sum over all its attempts (every run).

    Written after every step and at the attempt's end, as totals rather than increments, so a
    repeated write changes nothing and a worker that dies loses at most one step's figures.
    """
    values = usage.columns()  # `steps` has its own writers: the step callback and the attempt's end
    session.execute(update(JobAttempt).where(JobAttempt.id == attempt_id).values(**values))
    sums = {
        name: select(func.coalesce(func.sum(getattr(JobAttempt, name)), 0))
        .where(JobAttempt.job_id == job_id)
        .scalar_subquery()
        for name in USAGE_COLUMNS
    }
    session.execute(update(Job).where(Job.id == job_id).values(**sums))


def close_open_attempts(session: Session, job_id: int, status: str, why: str, run: int | None = None) -> None:
    """Attempts a job left `running` (its run ended early, or its worker died) end with the job (or that run)."""
    where = [JobAttempt.job_id == job_id, JobAttempt.status == AttemptStatus.running.value]
    if run is not None:
        where.append(JobAttempt.run == run)
    session.execute(update(JobAttempt).where(*where).values(status=status, error=why[:10_000], finished_at=utcnow()))


def job_attempts(session: Session, job_id: int) -> list[JobAttempt]:
    query = select(JobAttempt).where(JobAttempt.job_id == job_id).order_by(JobAttempt.run, JobAttempt.number)
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
