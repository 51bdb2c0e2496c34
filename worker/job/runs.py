"""Running a claimed job: which pipeline it gets, to a final status.

The `frogfix.run_job` task calls `run`, under the heartbeat it started at the claim
(worker/job/heartbeat.py). A job with `round > 0` is a round on an MR FrogFix opened
(worker/job/mr_rounds.py): an update round merges the target in, any other round answers its requests;
every other job is the issue's first run (worker/job/pipeline.py), a local job's (forge `local`, a retried
`fix` or one the sweep re-queued after its process died) from its checkout folder (worker/job/local_pipeline.py).
"""

from __future__ import annotations

import structlog

from app.db import session_scope
from app.endings import Ending, EndingKind
from app.jobs import local, records, transitions
from app.logs import get_logger
from app.statuses import JobStatus, RoundKind
from worker.job.job_context import Deps
from worker.job.local_pipeline import LocalPipeline
from worker.job.mr_rounds import RoundPipeline, UpdateRoundPipeline
from worker.job.pipeline import Pipeline

log = get_logger("frogfix.pipeline")


def pipeline_for(job_id: int, deps: Deps) -> Pipeline:
    """The job's pipeline: an update round's, a review or CI round's, a local job's, else the issue's."""
    with session_scope() as session:
        job = records.get_job(session, job_id)
        is_round, kind, is_local = (job.round or 0) > 0, job.round_kind, job.forge == local.FORGE
    if is_local:
        return LocalPipeline(job_id, deps)
    if not is_round:
        return Pipeline(job_id, deps)
    return UpdateRoundPipeline(job_id, deps) if kind == RoundKind.update else RoundPipeline(job_id, deps)


def run(job_id: int, deps: Deps | None = None, *, time_limit_errors: tuple[type[BaseException], ...] = ()) -> str:
    """Run a claimed job to a final status; never raises. The caller keeps the claim's heartbeat
    (worker/job/heartbeat.py), from the claim on."""
    with structlog.contextvars.bound_contextvars(job_id=job_id):
        try:
            deps = deps or Deps.from_settings()
            deps.time_limit_errors = deps.time_limit_errors or time_limit_errors
            pipeline = pipeline_for(job_id, deps)
        except Exception as exc:  # it could not even start: end the claimed job rather than leave it running
            log.exception("pipeline_start_failed")
            why = f"could not start: {type(exc).__name__}: {exc}"
            with session_scope() as session:
                bug = Ending(EndingKind.internal_error, why, cause=f"{type(exc).__name__}: {exc}")
                transitions.set_status(session, job_id, JobStatus.failed, error=why, ending=bug)
            return JobStatus.failed.value
        return pipeline.run()
