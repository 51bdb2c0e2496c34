"""Thin Celery tasks registered on app/queue.py's app; the work itself lives in plain functions."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

import structlog
from celery.signals import worker_ready

from app.db import session_scope
from app.jobs import records, rounds, scheduler
from app.jobs.requeue import send_and_stamp
from app.logs import get_logger
from app.models import utcnow
from app.queue import ATTEST_MERGE, CHECK_UPDATE, REPLAY_JOB, RUN_JOB, SWEEP, TRIAGE, celery_app
from app.settings import get_settings
from app.sweep import sweep_once
from sandbox.cgroups import CgroupSupport
from worker.job.heartbeat import Heartbeat, beat_interval

log = get_logger("frogfix.worker")
# Celery's own per-task lines carry no job id; ours do (bound below), so keep Celery's quieter.
for _name in ("celery.worker.strategy", "celery.app.trace"):
    logging.getLogger(_name).setLevel(logging.WARNING)


def run_job(job_id: int, *, clock: Callable[[], datetime] = utcnow) -> str:
    """Spend the ticket `job_id` on the fairest queued job its project's budget allows, and run it.

    That is the ticket's own job unless another project is owed the slot (app/jobs/scheduler.py).
    A redelivered ticket, or one whose job another ticket ran, runs the next fair job or nothing;
    every claim is guarded, so no job runs twice in one run number.
    """
    settings = get_settings()
    with structlog.contextvars.bound_contextvars(job_id=job_id):
        with session_scope() as session:
            claimed = scheduler.claim_next(session, settings, clock(), preferred=job_id)
            if claimed is not None:
                ticket = None if claimed.job_id == job_id else {"ticket": job_id}
                records.add_event(session, claimed.job_id, "claimed", "a worker claimed the job", ticket)
                run = records.get_job(session, claimed.job_id).run
        if claimed is None:
            log.info("job_not_claimed", reason="nothing queued that its project's budget lets start")
            return "not_claimed"
    with structlog.contextvars.bound_contextvars(job_id=claimed.job_id):
        log.info("job_claimed", ticket=job_id)
        try:
            # Beating from the claim on: importing the pipeline can take seconds on a loaded worker.
            with Heartbeat(claimed.job_id, beat_interval(settings.stale_job_seconds), run):
                from celery.exceptions import SoftTimeLimitExceeded

                from worker.job import runs

                return runs.run(claimed.job_id, time_limit_errors=(SoftTimeLimitExceeded,))
        finally:
            release_after_run(claimed, clock)
            follow_up_after_run()


def release_after_run(claimed: scheduler.Claimed, clock: Callable[[], datetime] = utcnow) -> list[int]:
    """A job ended: its project's held jobs that may start now get their tickets (the sweep does it otherwise)."""
    try:
        with session_scope() as session:
            released = scheduler.release_held(session, get_settings(), clock(), (claimed.forge, claimed.project))
    except Exception as exc:  # the database away: the sweep releases them later
        log.warning("release_failed", error=f"{type(exc).__name__}: {exc}"[:500])
        return []
    for held in released:
        if not send_and_stamp(held):
            break  # the broker is down: the sweep sends the rest (their stamps are cleared)
    return released


def follow_up_after_run() -> list[int]:
    """A job ended: threads whose accepted review requests waited for it get their next round (else the sweep)."""
    try:
        with session_scope() as session:
            started = rounds.follow_up(session)
    except Exception as exc:  # the database away: the sweep starts them later
        log.warning("follow_up_failed", error=f"{type(exc).__name__}: {exc}"[:500])
        return []
    for job_id in started:
        if not send_and_stamp(job_id):
            break  # the broker is down: the sweep sends the rest (they are unstamped)
    return started


@celery_app.task(name=RUN_JOB, acks_late=True, reject_on_worker_lost=True)
def run_job_task(job_id: int) -> str:
    return run_job(int(job_id))


@celery_app.task(name=TRIAGE, acks_late=True)
def triage_request_task(request_id: int) -> str:
    """Judge one round request (worker/job/triage.py); a failure leaves it pending for the sweep to send again."""
    from app.redaction import SecretRedactor
    from worker.job.triage import triage
    from worker.wiring import make_forge

    settings = get_settings()
    redactor = SecretRedactor(settings.secret_values())
    with structlog.contextvars.bound_contextvars(request_id=request_id):
        try:
            return triage(int(request_id), lambda kind: make_forge(kind, settings, redactor.redact), settings)
        except Exception as exc:
            log.warning("triage_failed", error=f"{type(exc).__name__}: {exc}"[:500])
            return "error"


@celery_app.task(name=REPLAY_JOB)
def replay_job_task(job_id: int, who: str = "dashboard") -> str:
    """A plain replay (recorded replies, no model, never publishes); the outcome lands on the timeline."""
    from worker.commands.replay import replay_job

    with structlog.contextvars.bound_contextvars(job_id=job_id):
        try:
            return str(replay_job(int(job_id), who=who, requested=True).status)  # the dashboard noted the request
        except Exception as exc:  # replay_job records its own failures; this keeps the worker quiet and alive
            log.warning("replay_failed", error=f"{type(exc).__name__}: {exc}"[:500])
            return "error"


REAP_INTERVAL_S = 300.0


def reap_sandboxes(older_than_s: float | None = None) -> list[str]:
    """Delete sandbox pods and policies left past their deadline (Kubernetes backend only)."""
    from app.settings import get_settings
    from sandbox.kubernetes_cluster import make_api_client, reap

    s = get_settings()
    api = make_api_client(s.kubeconfig or None, s.kube_context or None)
    return reap(s.sandbox_namespace, older_than_s, api)


def _reap_forever(stop: threading.Event) -> None:
    while not stop.wait(REAP_INTERVAL_S):
        try:
            removed = reap_sandboxes()
            if removed:
                log.warning("reaped_sandboxes", removed=removed)
        except Exception as exc:  # the cluster API being away for a while is not fatal
            log.warning("reap_failed", error=f"{type(exc).__name__}: {exc}"[:500])


@worker_ready.connect
def _start_reaper(**_: object) -> None:
    """With the Kubernetes backend, every worker also removes leftover sandboxes now and then.

    With the local one, it says once what cgroups this host gives its sandboxes (a warning when
    some are missing) and removes sandbox cgroups that a killed worker left behind.
    """
    from app.settings import get_settings

    if get_settings().sandbox == "kubernetes":
        threading.Thread(target=_reap_forever, args=(threading.Event(),), name="frogfix-reaper", daemon=True).start()
    else:
        from sandbox import cgroups

        support = cgroups.host_support()
        warn_about_cgroups(support)
        reaped = cgroups.reap_stale(support)
        if reaped:
            log.warning("reaped_sandbox_cgroups", removed=reaped)


def warn_about_cgroups(support: CgroupSupport) -> bool:
    """One warning at worker start when local sandboxes will lack a cgroup wall; True if it warned."""
    from sandbox.cgroups import DELEGATION_FIX

    if not support.missing:
        log.info("sandbox_cgroups", detail=support.describe())
        return False
    log.warning("sandbox_cgroups_missing", detail=support.describe(), fix=DELEGATION_FIX)
    return True


@celery_app.task(name=ATTEST_MERGE, acks_late=True)
def attest_merge_task(thread_id: int, merge: dict[str, Any]) -> str:
    """A person merged or closed a FrogFix MR: sign the merge statement (worker/job/merge_attesting.py)."""
    from app.redaction import SecretRedactor
    from worker.job.merge_attesting import attest_thread_merge
    from worker.wiring import make_forge

    settings = get_settings()
    forge = make_forge(str(merge["forge"]), settings, SecretRedactor(settings.secret_values()).redact)
    with structlog.contextvars.bound_contextvars(job_id=thread_id):
        try:
            return attest_thread_merge(settings, int(thread_id), merge, forge)
        except Exception as exc:
            log.warning("merge_attestation_failed", error=f"{type(exc).__name__}: {exc}"[:500])
            return "error"
        finally:
            forge.close()


@celery_app.task(name=CHECK_UPDATE, acks_late=True)
def check_update_task(thread_id: int) -> str:
    """FROGFIX_AUTO_UPDATE: start an update round when the thread's MR conflicts with its moved target
    (worker/job/triage.py `check_for_update`); a forge that fails is logged, and the sweep asks again later."""
    from app.db import session_scope
    from app.forge.api import ForgeError
    from app.jobs.requeue import send_and_stamp
    from app.models import Job
    from app.redaction import SecretRedactor
    from worker.job.triage import check_for_update
    from worker.wiring import make_forge

    settings = get_settings()
    with session_scope() as session:
        thread = session.get(Job, int(thread_id))
        kind = thread.forge if thread is not None else None
    if kind is None:
        return "unknown"
    forge = make_forge(kind, settings, SecretRedactor(settings.secret_values()).redact)
    with structlog.contextvars.bound_contextvars(thread_id=thread_id):
        try:
            started = check_for_update(int(thread_id), forge, settings)
        except ForgeError as exc:
            log.warning("update_check_failed", error=str(exc)[:300])
            return "deferred"
        finally:
            forge.close()
    if started is None:
        return "nothing"
    send_and_stamp(started)
    return f"round {started}"


@celery_app.task(name=SWEEP)
def sweep_task() -> int:
    return sweep_once()[1]
