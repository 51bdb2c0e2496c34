"""Model slots a production job takes beyond its own, so its attempts run side by side.

A busy job holds one slot (its worker). With FROGFIX_ATTEMPTS > 1 it may take more, only while no
runnable production job is queued and production and the live evaluations leave them free, counted
under the same lock as an evaluation's take (app/jobs/evaluations.py), so the two never overbook.
The job's `extra_slots` counts only while it is busy (`production_load`), so a job that ends, or
whose worker dies, holds nothing more; the pipeline gives them back when its attempts are done.
"""

from __future__ import annotations

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.jobs.evaluations import serialize_slot_takes, slots_in_use
from app.jobs.records import job_of_run
from app.jobs.scheduler import production_load
from app.models import Job


def take_extra_slots(
    session: Session, job_id: int, run: int, want: int, slots: int, stale_seconds: float
) -> int:
    """Up to `want` slots beyond the job's own, as many as are free now; how many it took (0 with a queue)."""
    if want < 1:
        return 0
    serialize_slot_takes(session)
    queued, busy = production_load(session)  # this job's own slot (and any extra it still holds) included
    job = session.get(Job, job_id)
    held = int(job.extra_slots or 0) if job is not None else 0
    free = slots - (busy - held) - slots_in_use(session, stale_seconds)
    granted = 0 if queued else max(0, min(want, free))
    session.execute(update(Job).where(*job_of_run(job_id, run)).values(extra_slots=granted))
    return granted


def give_extra_slots(session: Session, job_id: int, run: int) -> None:
    session.execute(update(Job).where(*job_of_run(job_id, run)).values(extra_slots=0))
