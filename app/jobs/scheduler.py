"""The fair queue and the per-project budgets: which queued job a free worker runs next.

A `frogfix.run_job` message is a ticket for one free worker slot, not an order for its own job:
the worker runs the fairest queued job (`claim_next`). Fairest: among the projects within their
budget, the one with the fewest jobs running; on a tie, the one whose last claim is oldest
(round-robin); within that project, the ticket's own job while it is still queued, else the
oldest. So a flood from one project takes slot after slot only while no other project waits,
and within a project jobs keep the broker's order. A project is its forge and path: a Gitea
project cannot spend the budget of the GitLab project with the same path.

A project over its budget (FROGFIX_PROJECT_MAX_RUNNING, FROGFIX_PROJECT_TOKENS_PER_DAY,
FROGFIX_PROJECT_LIMITS) keeps its jobs queued with `hold_reason` saying why, and its tickets are
spent on other projects' jobs. `release_held` lets held jobs go when the budget allows: the worker
calls it when a job of the project ends, and the sweep at every pass (a new UTC day, a raised
limit, a job the sweep ended for a dead worker). A released job loses its enqueue stamp, so the
ordinary send (or the sweep, when the broker is down) gives it a ticket of its own.

Claims and releases are serialized across processes (`_serialize`), so two workers never both
take the one free slot of a project, and a hold is never written after the release that should
have freed it. Callers own the transaction; the lock ends with it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final, cast

from sqlalchemy import Table, false, func, select, update
from sqlalchemy.orm import Session

from app.jobs.records import add_event
from app.jobs.transitions import claim_job
from app.models import Job, JobAttempt, utcnow
from app.settings import Settings
from app.statuses import RUN_STATUSES, JobStatus

Project = tuple[str, str]  # (forge, path): the unit of fairness and of budgets

# PostgreSQL advisory lock key for claims and releases ("FROG"); transaction-scoped.
CLAIM_LOCK_KEY: Final = 0x46524F47
_NEVER: Final = datetime.min.replace(tzinfo=UTC)
_QUEUED: Final = JobStatus.queued.value
_JOBS: Final = cast(Table, Job.__table__)


@dataclass(frozen=True)
class Claimed:
    """The job a ticket ran, and its project (the worker releases that project's held jobs after it)."""

    job_id: int
    forge: str
    project: str


@dataclass(frozen=True)
class Budget:
    """A project's budget now: why it may not start a job (None: it may), and how many more may start."""

    reason: str | None
    free: int | None  # None: no limit on jobs at once
    running: int  # the project's jobs running now (the fair order reads it too)


def _serialize(session: Session) -> None:
    """One claim or release at a time: PostgreSQL by an advisory lock, SQLite by taking its write lock now.

    On SQLite a write statement (even one that matches nothing) opens the write transaction, so
    every read after it sees the latest commits and no other writer commits until ours ends.
    """
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(CLAIM_LOCK_KEY)))
    else:
        session.connection().execute(update(_JOBS).where(false()).values(status=_JOBS.c.status))


def _running(session: Session, paths: set[str]) -> dict[Project, int]:
    rows = session.execute(
        select(Job.forge, Job.project, func.count())
        .where(Job.status.in_(RUN_STATUSES), Job.project.in_(paths))
        .group_by(Job.forge, Job.project)
    )
    return {(forge, path): int(n) for forge, path, n in rows}


def tokens_today(session: Session, projects: list[Project], now: datetime) -> dict[Project, int]:
    """Prompt + completion tokens of each project's attempts that started this UTC day (as recorded so far)."""
    midnight = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    rows = session.execute(
        select(Job.forge, Job.project, func.sum(JobAttempt.prompt_tokens + JobAttempt.completion_tokens))
        .join(Job, Job.id == JobAttempt.job_id)
        .where(JobAttempt.started_at >= midnight, Job.project.in_({path for _, path in projects}))
        .group_by(Job.forge, Job.project)
    )
    return {(forge, path): int(n or 0) for forge, path, n in rows}


def budgets(session: Session, settings: Settings, projects: list[Project], now: datetime) -> dict[Project, Budget]:
    """Each project's budget at `now`: jobs running against its max_running, tokens today against its tokens_per_day."""
    running = _running(session, {path for _, path in projects})
    limits = {p: settings.limits_for(p[1]) for p in projects}
    metered = [p for p in projects if limits[p].tokens_per_day]
    used = tokens_today(session, metered, now) if metered else {}
    result = {}
    for p in projects:
        max_running, per_day = limits[p].max_running or 0, limits[p].tokens_per_day or 0
        n, spent = running.get(p, 0), used.get(p, 0)
        reason = None
        if max_running and n >= max_running:
            reason = (
                f"waiting for a slot: {n} of the project's {max_running} concurrent jobs are running "
                "(FROGFIX_PROJECT_MAX_RUNNING, FROGFIX_PROJECT_LIMITS); it starts when one of them ends"
            )
        elif per_day and spent >= per_day:
            reason = (
                f"waiting for tokens: the project used {spent:,} of its {per_day:,} tokens today (UTC) "
                "(FROGFIX_PROJECT_TOKENS_PER_DAY, FROGFIX_PROJECT_LIMITS); it starts after 00:00 UTC "
                "or when the limit is raised"
            )
        result[p] = Budget(reason, max(0, max_running - n) if max_running else None, n)
    return result


def _waiting(session: Session) -> dict[Project, int]:
    """Each project with queued jobs, and its oldest queued job."""
    rows = session.execute(
        select(Job.forge, Job.project, func.min(Job.id)).where(Job.status == _QUEUED).group_by(Job.forge, Job.project)
    )
    return {(forge, path): int(oldest) for forge, path, oldest in rows}


def _last_claims(session: Session, projects: list[Project]) -> dict[Project, datetime]:
    rows = session.execute(
        select(Job.forge, Job.project, func.max(Job.started_at))
        .where(Job.project.in_({path for _, path in projects}), Job.started_at.is_not(None))
        .group_by(Job.forge, Job.project)
    )
    found = {}
    for forge, path, last in rows:
        if (at := last) is not None:
            found[(forge, path)] = at
    return found


def _record_holds(session: Session, held: dict[Project, str]) -> None:
    """Write each held project's reason on its queued jobs; a job newly held gets a timeline event."""
    for (forge, path), reason in held.items():
        mine = [Job.forge == forge, Job.project == path, Job.status == _QUEUED]
        new = session.execute(
            update(Job).where(*mine, Job.hold_reason.is_(None)).values(hold_reason=reason).returning(Job.id)
        ).scalars()
        for job_id in list(new):
            add_event(session, job_id, "held", reason)
        session.execute(update(Job).where(*mine, Job.hold_reason != reason).values(hold_reason=reason))


def _fairest(
    session: Session, open_: dict[Project, int], state: dict[Project, Budget], preferred: int | None
) -> Claimed:
    """The fewest running, then the least recently served project; its ticket's job, else its oldest."""
    last = _last_claims(session, list(open_))

    def rank(p: Project) -> tuple[int, datetime]:
        return state[p].running, last.get(p, _NEVER)

    best = min(open_, key=lambda p: (*rank(p), open_[p]))
    if preferred is not None:
        mine = session.execute(select(Job.forge, Job.project).where(Job.id == preferred, Job.status == _QUEUED)).first()
        if mine is not None and (p := (mine[0], mine[1])) in open_ and rank(p) == rank(best):
            return Claimed(preferred, *p)
    return Claimed(open_[best], *best)


def claim_next(session: Session, settings: Settings, now: datetime, preferred: int | None = None) -> Claimed | None:
    """Claim (queued -> running, a new run) the fairest queued job whose project's budget allows it; None if none.

    Projects over budget get their reason written on their queued jobs. `preferred` is the
    ticket's job: it runs when its project is among the fairest.
    """
    _serialize(session)
    waiting = _waiting(session)
    if not waiting:
        return None
    state = budgets(session, settings, list(waiting), now)
    _record_holds(session, {p: b.reason for p, b in state.items() if b.reason is not None})
    open_ = {p: oldest for p, oldest in waiting.items() if state[p].reason is None}
    if not open_:
        return None
    choice = _fairest(session, open_, state, preferred)
    return choice if claim_job(session, choice.job_id) else None


def production_load(session: Session) -> tuple[int, int]:
    """(runnable queued, busy) production jobs: what a shared model slot must leave room for.

    A job held by its project's budget (`hold_reason`) cannot start whatever else runs, so it is
    not waiting for a slot; busy jobs (running, verifying, publishing) each hold one, and the extra
    slots their side-by-side attempts took (app/jobs/job_slots.py).
    """
    runnable = (Job.status == _QUEUED, Job.hold_reason.is_(None))
    queued = session.scalar(select(func.count()).select_from(Job).where(*runnable)) or 0
    held = func.coalesce(func.sum(1 + Job.extra_slots), 0)
    busy = session.scalar(select(held).select_from(Job).where(Job.status.in_(RUN_STATUSES))) or 0
    return int(queued), int(busy)


def release_held(session: Session, settings: Settings, now: datetime, only: Project | None = None) -> list[int]:
    """Held jobs whose project's budget allows them now (oldest first, up to its free slots): clear the hold.

    Their enqueue stamp is cleared too, so the caller sends them now and the sweep sends any that
    the broker refused. Returns their ids.
    """
    _serialize(session)
    query = select(Job.id, Job.forge, Job.project).where(Job.status == _QUEUED, Job.hold_reason.is_not(None))
    if only is not None:
        query = query.where(Job.forge == only[0], Job.project == only[1])
    held: dict[Project, list[int]] = defaultdict(list)
    for job_id, forge, path in session.execute(query.order_by(Job.id)):
        held[(forge, path)].append(job_id)
    if not held:
        return []
    released: list[int] = []
    for p, b in budgets(session, settings, list(held), now).items():
        if b.reason is None:
            released += held[p] if b.free is None else held[p][: b.free]
    if released:
        session.execute(
            update(Job)
            .where(Job.id.in_(released), Job.status == _QUEUED)
            .values(hold_reason=None, last_enqueued_at=None, updated_at=utcnow())
        )
        for job_id in released:
            add_event(session, job_id, "released", "the project's budget allows it now; it waits for a free worker")
    return released
