"""Jobs: every SQL statement about jobs, their attempts, events and webhook deliveries.

- records.py: the job, attempt and event rows: reads, and writes that change no status.
- transitions.py: the guarded status changes (claim, set_status, cancel, retry, recover_stale_jobs)
  and the enqueue stamps.
- intake.py: webhook deliveries recorded once, and the job each one starts, cancels or notes.
- read_model.py: the dashboard's job list and overview (read-only).
- requeue.py: queue a job again and send its task after the commit (owns its transactions).

Callers import from the module that owns a name. The names below are re-exported only so that
worker/'s `from app import jobs` call sites keep working until they move to the owning modules.
"""

from app.jobs.records import (
    UnknownJob,
    add_event,
    announced_this_round,
    cancel_requested,
    close_open_attempts,
    get_job,
    job_attempts,
    job_events,
    run_states,
    start_attempt,
    touch_heartbeat,
    update_attempt,
    update_job,
)
from app.jobs.transitions import InvalidTransition, claim_job, mark_enqueued, retry_job, set_status

__all__ = [
    "InvalidTransition",
    "UnknownJob",
    "add_event",
    "announced_this_round",
    "cancel_requested",
    "claim_job",
    "close_open_attempts",
    "get_job",
    "job_attempts",
    "job_events",
    "mark_enqueued",
    "retry_job",
    "run_states",
    "set_status",
    "start_attempt",
    "touch_heartbeat",
    "update_attempt",
    "update_job",
]
