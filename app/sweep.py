"""The requeue sweep: send again every job left queued too long (never sent, or its message lost),
let go of jobs held for their project's budget once it allows them (app/jobs/scheduler.py), start the
rounds that accepted review requests wait for, send again the triage of requests left pending, and,
with FROGFIX_AUTO_UPDATE on, ask the worker to check the open MRs for a moved target branch (issue 25)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta

from app.db import session_scope
from app.jobs.requeue import send_and_stamp
from app.jobs.rounds import follow_up, note_update_sent, stale_pending, threads_to_check, touch_requests
from app.jobs.scheduler import release_held
from app.jobs.transitions import jobs_due_for_enqueue, recover_stale_jobs
from app.logs import get_logger
from app.models import utcnow
from app.queue import send_triage, send_update_check
from app.settings import get_settings

log = get_logger("frogfix.sweep")


def sweep_once(older_than_s: float | None = None, limit: int = 500) -> tuple[int, int]:
    """Returns (jobs found due, jobs sent). Stops at the first failed send: the broker is down."""
    s = get_settings()
    age = timedelta(seconds=s.requeue_after_seconds if older_than_s is None else older_than_s)
    with session_scope() as session:
        recovered = recover_stale_jobs(session, timedelta(seconds=s.stale_job_seconds), s.max_job_runs)
    for job_id, outcome in recovered:
        log.warning("stale_job", job_id=job_id, outcome=outcome)
    with session_scope() as session:  # a new UTC day, a raised limit, a slot a dead worker's job held
        released = release_held(session, s, utcnow())
    if released:
        log.info("released_held_jobs", jobs=released[:50], count=len(released))
    with session_scope() as session:  # rounds a missed follow-up (a worker that died mid-run) left waiting
        started = follow_up(session)
    if started:
        log.info("started_rounds", jobs=started[:50], count=len(started))
    resend_triage(age, limit)
    if s.auto_update:
        send_update_checks(timedelta(seconds=s.auto_update_check_seconds))
    with session_scope() as session:
        due = jobs_due_for_enqueue(session, age, limit)
    sent = 0
    for job_id in due:
        if not send_and_stamp(job_id):
            break
        sent += 1
    if due:
        log.info("sweep", due=len(due), sent=sent)
    return len(due), sent


def _send_each(ids: list[int], send: Callable[[int], bool]) -> list[int]:
    """`send` each id in turn, stopping at the first that fails (the broker is down); those sent."""
    sent: list[int] = []
    for item in ids:
        if not send(item):
            break
        sent.append(item)
    return sent


def resend_triage(age: timedelta, limit: int = 500) -> int:
    """Send again the triage of requests pending longer than `age`; how many were sent (stops at a down broker)."""
    with session_scope() as session:
        stale = stale_pending(session, utcnow() - age, limit)
    sent = _send_each(stale, send_triage)
    if sent:
        with session_scope() as session:
            touch_requests(session, sent)
        log.info("resent_triage", requests=sent[:50], count=len(sent))
    return len(sent)


def send_update_checks(every: timedelta, limit: int = 100) -> int:
    """Send the update check of each open MR not checked for `every`; how many were sent (stops at a down
    broker). Each is marked checked when sent, so the next sweep does not send it again meanwhile."""
    with session_scope() as session:
        due = threads_to_check(session, utcnow() - every, limit)
    sent = _send_each(due, send_update_check)
    if sent:
        with session_scope() as session:
            note_update_sent(session, sent)
        log.info("sent_update_checks", threads=sent[:50], count=len(sent))
    return len(sent)


class SweepThread(threading.Thread):
    """Runs the sweep every `interval` seconds until stopped; a failing sweep never kills it."""

    def __init__(self, interval: float) -> None:
        super().__init__(name="frogfix-sweep", daemon=True)
        self.interval = interval
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                sweep_once()
            except Exception as exc:
                log.warning("sweep_failed", error=f"{type(exc).__name__}: {exc}"[:500])

    def stop(self) -> None:
        self.stopped.set()
