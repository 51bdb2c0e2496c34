"""The Celery app and the task names. The web layer sends tasks by name; worker/tasks.py registers them.

Embedded default: kombu's filesystem transport under the data folder, so no broker server is
needed. Production: Redis via FROGFIX_BROKER_URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery import Celery

from app.logs import get_logger
from app.settings import Settings, get_settings

RUN_JOB = "frogfix.run_job"
REPLAY_JOB = "frogfix.replay_job"
SWEEP = "frogfix.sweep_queued"
TRIAGE = "frogfix.triage_request"
ATTEST_MERGE = "frogfix.attest_merge"  # a person merged or closed a FrogFix MR: sign the merge statement
CHECK_UPDATE = "frogfix.check_update"  # FROGFIX_AUTO_UPDATE: does a thread's MR conflict with its moved target?
HARD_TIME_LIMIT_MARGIN_S = 600

celery_app = Celery("frogfix")
log = get_logger("frogfix.queue")


def broker_folder(settings: Settings) -> Path:
    return settings.data_dir / "broker"


def configure_celery(settings: Settings | None = None) -> Celery:
    """(Re)configure the shared Celery app from settings; safe to call more than once."""
    s = settings or get_settings()
    hard_limit = s.job_timeout_seconds + HARD_TIME_LIMIT_MARGIN_S
    options: dict[str, Any] = {}
    if s.embedded_broker:
        folder = broker_folder(s)
        for sub in ("queue", "processed", "control"):
            (folder / sub).mkdir(parents=True, exist_ok=True)
        options = {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
        }
    elif s.resolved_broker_url().startswith(("redis://", "rediss://")):
        # A message not acked within this window is redelivered; it must outlast the hard limit.
        options = {
            "visibility_timeout": hard_limit + 600,
            "socket_connect_timeout": 5,
            "socket_timeout": 10,
            # A publisher gives up fast when Redis is down (the sweep sends the job later) instead of
            # holding a webhook answer for seconds; the worker's own reconnects follow broker_connection_*.
            "max_retries": 1,
            "interval_start": 0,
            "interval_step": 0.2,
            "interval_max": 0.5,
        }
    celery_app.conf.update(
        broker_url=s.resolved_broker_url(),
        broker_transport_options=options,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=5,
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_soft_time_limit=s.job_timeout_seconds + 120,
        task_time_limit=hard_limit,
        task_default_queue="frogfix",
        task_serializer="json",
        accept_content=["json"],
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
    )
    _drop_cached_connections()
    return celery_app


def _drop_cached_connections() -> None:
    """Celery pools broker connections with the options they were made with; forget them on reconfigure."""
    # Not closed: kombu shares pools process-wide by connection parameters, and may hand them out again.
    celery_app._pool = None
    amqp = celery_app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


def send_run_job(job_id: int) -> bool:
    """Send `frogfix.run_job(job_id)`; False (and a log line) when the broker is unreachable.

    Called only after the job row is committed. A job whose send failed stays queued and the
    sweep sends it again, so a broker outage loses nothing.
    """
    try:
        celery_app.send_task(RUN_JOB, args=[job_id], retry=False)
    except Exception as exc:  # kombu raises many kinds of connection errors
        log.warning("enqueue_failed", job_id=job_id, error=f"{type(exc).__name__}: {exc}"[:500])
        return False
    return True


def send_replay_job(job_id: int, who: str) -> bool:
    """Ask a worker (where sandboxes run) to replay the job's recording; False when the broker is down."""
    try:
        celery_app.send_task(REPLAY_JOB, args=[job_id, who], retry=False)
    except Exception as exc:
        log.warning("enqueue_failed", job_id=job_id, task=REPLAY_JOB, error=f"{type(exc).__name__}: {exc}"[:500])
        return False
    return True


def send_attest_merge(thread_id: int, merge: dict[str, Any]) -> bool:
    """Ask a worker (which holds the key and the mirrors) to sign the merge statement of the thread's MR."""
    try:
        celery_app.send_task(ATTEST_MERGE, args=[thread_id, merge], retry=False)
    except Exception as exc:
        log.warning("enqueue_failed", job_id=thread_id, task=ATTEST_MERGE, error=f"{type(exc).__name__}: {exc}"[:500])
        return False
    return True


def send_triage(request_id: int) -> bool:
    """Send `frogfix.triage_request(request_id)` after the request row is committed; False when the broker
    is down (the request stays pending and the sweep sends its triage again)."""
    try:
        celery_app.send_task(TRIAGE, args=[request_id], retry=False)
    except Exception as exc:
        log.warning("enqueue_failed", request_id=request_id, task=TRIAGE, error=f"{type(exc).__name__}: {exc}"[:500])
        return False
    return True


def send_update_check(thread_id: int) -> bool:
    """Send `frogfix.check_update(thread_id)`; False when the broker is down (the sweep tries again later)."""
    try:
        celery_app.send_task(CHECK_UPDATE, args=[thread_id], retry=False)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"[:500]
        log.warning("enqueue_failed", thread_id=thread_id, task=CHECK_UPDATE, error=error)
        return False
    return True


configure_celery()
