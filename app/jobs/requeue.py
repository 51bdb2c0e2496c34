"""Queue a job again and send its task: the one sequence the dashboard, manage.py and replay share.

DESIGN: enqueue only after the job row is committed. So this module, unlike the rest of
app/jobs/, owns its transactions: it commits the requeue, sends the task, and stamps the send
in a second transaction. A send that fails leaves the job queued and unstamped; the sweep
(app/sweep.py) sends it once the broker is back.
"""

from __future__ import annotations

from collections.abc import Callable

from app.db import session_scope
from app.jobs.transitions import mark_enqueued, retry_job
from app.queue import send_run_job


def send_and_stamp(job_id: int) -> bool:
    """Send a committed queued job's task and record the send; False (nothing recorded) when the broker is down."""
    if not send_run_job(job_id):
        return False
    with session_scope() as session:
        mark_enqueued(session, job_id)
    return True


def requeue_and_send(job_id: int, who: str, *, committed: Callable[[], None] | None = None) -> bool:
    """Queue a finished job again as a new run, commit, then send its task.

    True when the task was sent; False when the broker is unreachable (the job stays queued and
    the sweep sends it later). Raises UnknownJob or InvalidTransition before anything changes.
    `committed` runs between the commit and the send (the CLI says what it is waiting for).
    """
    with session_scope() as session:
        retry_job(session, job_id, who)
    if committed is not None:
        committed()
    return send_and_stamp(job_id)
