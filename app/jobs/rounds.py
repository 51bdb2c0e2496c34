"""SQL for review rounds: an MR's thread of jobs and the requests its rounds take. Callers own the transaction.

MINIMAL VERSION from the pipeline helper (worker/pipeline.py needs these four): the rounds
helper's app/jobs/rounds.py (find_thread, record_request, start_round_if_idle, follow_up, ...)
replaces this file; the signatures here are the design's.
"""

from __future__ import annotations

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.models import Job, RoundRequest, utcnow
from app.statuses import RequestStatus


def take_requests(session: Session, job_id: int) -> list[RoundRequest]:
    """Every accepted request of the job's thread, now `taken` by this round (oldest first)."""
    thread_id = session.execute(select(Job.thread_id).where(Job.id == job_id)).scalar_one_or_none()
    if thread_id is None:
        return []
    taken = list(
        session.execute(
            select(RoundRequest)
            .where(RoundRequest.thread_id == thread_id, RoundRequest.status == RequestStatus.accepted.value)
            .order_by(RoundRequest.created_at, RoundRequest.id)
            .with_for_update()
        ).scalars()
    )
    for request in taken:
        request.status, request.job_id, request.updated_at = RequestStatus.taken.value, job_id, utcnow()
    session.flush()
    return taken


def return_requests(session: Session, job_id: int, reason: str) -> None:
    """The round's taken requests go back to `accepted` (the branch moved): the next round takes them."""
    session.execute(
        update(RoundRequest)
        .where(RoundRequest.job_id == job_id, RoundRequest.status == RequestStatus.taken.value)
        .values(status=RequestStatus.accepted.value, job_id=None, reason=reason[:2000], updated_at=utcnow())
    )


def drop_requests(session: Session, thread_id: int, reason: str) -> int:
    """Every pending or accepted request of the thread let go (`dropped`, with the reason); how many."""
    done = session.execute(
        update(RoundRequest)
        .where(
            RoundRequest.thread_id == thread_id,
            RoundRequest.status.in_((RequestStatus.pending.value, RequestStatus.accepted.value)),
        )
        .values(status=RequestStatus.dropped.value, reason=reason[:2000], updated_at=utcnow())
    )
    return int(getattr(done, "rowcount", 0) or 0)


def thread_jobs(session: Session, thread_id: int) -> list[Job]:
    """The thread's jobs: round 0 (the job that opened the MR) first, then its rounds in order."""
    return list(
        session.execute(
            select(Job).where((Job.id == thread_id) | (Job.thread_id == thread_id)).order_by(Job.round, Job.id)
        ).scalars()
    )


def requests_of(session: Session, *, thread_id: int | None = None, job_id: int | None = None) -> list[RoundRequest]:
    """The requests of a thread, or those one round took, oldest first."""
    query = select(RoundRequest).order_by(RoundRequest.created_at, RoundRequest.id)
    if thread_id is not None:
        query = query.where(RoundRequest.thread_id == thread_id)
    if job_id is not None:
        query = query.where(RoundRequest.job_id == job_id)
    return list(session.execute(query).scalars())
