"""The heartbeat of a claimed job: a thread that stamps the job's row every few seconds, so the
sweep can tell a job whose worker died (no stamp for FROGFIX_STALE_JOB_SECONDS) from a live one.

Light on imports on purpose: worker/tasks.py starts it the moment a job is claimed, before the
pipeline's modules (the model and forge clients) are imported, which can take seconds on a loaded
worker; a claim without a heartbeat that long would look like a dead worker's.
"""

from __future__ import annotations

import threading

from app.db import session_scope
from app.jobs import records
from app.logs import get_logger

log = get_logger("frogfix.pipeline")


def beat_interval(stale_job_seconds: float) -> float:
    """How often to stamp: four times within the stale limit, between 1 and 15 seconds."""
    return max(1.0, min(15.0, stale_job_seconds / 4))


class Heartbeat:
    """Stamps the job every few seconds, so a job whose worker died is found and recovered."""

    def __init__(self, job_id: int, interval: float, run: int | None = None) -> None:
        self.job_id, self.interval, self.run = job_id, interval, run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{job_id}", daemon=True)

    def _beat(self) -> None:
        while True:
            try:
                with session_scope() as session:
                    records.touch_heartbeat(session, self.job_id, self.run)
            except Exception as exc:  # a database hiccup must not end the job
                log.warning("heartbeat_failed", job_id=self.job_id, error=str(exc)[:300])
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
