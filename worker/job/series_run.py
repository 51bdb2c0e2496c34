"""One job's attempts as `run_series` (worker/attempts/attempt.py) runs them, for the job core.

What the pipeline's attempts share while they run: the stop flag (one attempt ended the job, so
those beside it stop at their next call), what the infrastructure failed, each attempt's wall time
(whether another fits in the job's time) and each attempt's row. The pipeline decides what the
series' result means for the job (`Pipeline.choose`); this module only runs it.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

from app.db import in_transaction
from app.jobs import job_slots, records
from app.statuses import AttemptOutcome, AttemptStatus
from sandbox.base import SandboxError
from worker.attempts.attempt import AttemptResult, AttemptRunner, AttemptSeries, run_series
from worker.environment.report import EnvironmentReport, EnvironmentUnusable
from worker.job.job_context import PREEMPT_POLL_S, JobEnded, PolledFlag, Prepared, production_waits


class SeriesHost(Protocol):
    """What of the job core a series uses (worker/job/pipeline.py `Pipeline`)."""

    job_id: int
    run_number: int
    deadline: float

    def check_cancel(self) -> None: ...
    def observer(self, stop: threading.Event | None = None) -> Any: ...  # the pipeline's JobObserver
    def one_attempt(
        self, runner: AttemptRunner, observer: Any, prepared: Prepared, number: int, task: str
    ) -> AttemptResult: ...
    def environment_error(self, report: EnvironmentReport) -> JobEnded: ...
    def redact(self, text: str) -> str: ...
    def event(self, kind: str, message: str, data: dict[str, object] | None = None) -> None: ...
    def take_slots(self, want: int) -> int: ...


class SeriesRun:
    """The attempts of one run of a job: FROGFIX_ATTEMPTS, then extra ones while no production job waits."""

    def __init__(self, host: SeriesHost, runner: AttemptRunner, prepared: Prepared, task: str) -> None:
        self.host, self.runner, self.prepared, self.task = host, runner, prepared, task
        self.stop = threading.Event()  # one attempt ended the job: the ones beside it stop at their next call
        self.failed: list[BaseException | AttemptResult] = []  # what the infrastructure failed, in order
        self.spent: list[float] = []  # each attempt's wall time, to know whether another fits in the job's time
        self.ids: dict[int, int] = {}  # each attempt's row, by its number
        self.side_by_side = 0  # model slots taken beyond the job's own

    def run(self, attempts: int, ceiling: int) -> AttemptSeries:
        self.side_by_side = self.host.take_slots(attempts - 1)
        return run_series(
            self.runner, self.run_one, attempts=attempts, ceiling=ceiling,
            start=self.prepared.start or self.prepared.base, why_stop=self.why_stop, parallel=1 + self.side_by_side,
            side_by_side_done=self.give_back, abort=self.stop.set,
        )

    def run_one(self, number: int, extra: bool) -> AttemptResult | None:
        host = self.host
        if self.stop.is_set():  # an attempt beside this one ended the series before this one started
            return None
        host.check_cancel()
        observer = host.observer(self.stop)
        observer.preempt = PolledFlag(production_waits, "preempt_check", PREEMPT_POLL_S) if extra else None
        began = time.monotonic()
        try:
            result = host.one_attempt(self.runner, observer, self.prepared, number, self.task)
        except EnvironmentUnusable as exc:
            self.stop.set()
            raise host.environment_error(exc.report) from exc
        except SandboxError as exc:  # this attempt's sandbox failed: the others' results still count
            self.stop.set()
            self.failed.append(exc)
            why = host.redact(f"sandbox failure: {exc}")
            in_transaction(lambda session: records.update_attempt(
                session, observer.attempt_id, finished=True, status=AttemptStatus.failed.value, error=why))
            return None
        except BaseException:
            self.stop.set()
            raise
        self.spent.append(time.monotonic() - began)
        self.ids[number] = observer.attempt_id
        if result.outcome == AttemptOutcome.cancelled:  # stopped for production, or beside a failure
            if observer.preempted:
                host.event("attempt_preempted", f"attempt {number} (extra) stopped: a production job is waiting")
            return None
        if result.infrastructure_failure:  # the model could not be used: no more attempts now
            self.stop.set()
            self.failed.append(result)
            return None
        return result

    def why_stop(self) -> str | None:
        """Why no extra attempt may start now: production comes first, and the job's time is bounded."""
        if in_transaction(production_waits):
            return "a production job is waiting for the model"
        if self.spent and self.host.deadline - time.monotonic() < 2 * max(self.spent):
            return "the job's time left would not fit another attempt"
        return None

    def give_back(self) -> None:
        if self.side_by_side:
            host = self.host
            in_transaction(lambda session: job_slots.give_extra_slots(session, host.job_id, host.run_number))
