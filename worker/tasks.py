"""Thin Celery tasks registered on app/queue.py's app; the work itself lives in plain functions."""

from __future__ import annotations

import logging

import structlog

from app import jobs
from app.db import session_scope
from app.logs import get_logger
from app.queue import RUN_JOB, SWEEP, celery_app
from app.sweep import sweep_once

log = get_logger("frogfix.worker")
# Celery's own per-task lines carry no job id; ours do (bound below), so keep Celery's quieter.
for _name in ("celery.worker.strategy", "celery.app.trace"):
    logging.getLogger(_name).setLevel(logging.WARNING)
def run_job(job_id: int) -> str:
    """Claim the job (guarded, so a redelivered task does nothing) and hand it to the pipeline."""
    with structlog.contextvars.bound_contextvars(job_id=job_id):
        with session_scope() as session:
            if not jobs.claim_job(session, job_id):
                log.info("job_not_claimed", reason="not queued (already claimed, cancelled or unknown)")
                return "not_claimed"
            jobs.add_event(session, job_id, "claimed", "a worker claimed the job")
        log.info("job_claimed")
        from celery.exceptions import SoftTimeLimitExceeded

        from worker import pipeline

        return pipeline.run(job_id, time_limit_errors=(SoftTimeLimitExceeded,))


@celery_app.task(name=RUN_JOB, acks_late=True, reject_on_worker_lost=True)
def run_job_task(job_id: int) -> str:
    return run_job(int(job_id))


@celery_app.task(name=SWEEP)
def sweep_task() -> int:
    return sweep_once()[1]
