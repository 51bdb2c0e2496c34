"""The one way FrogFix tries a call again: forge, model, git and database calls alike.

A call that may fail for a while (a 429 or a 5xx, a dropped connection, a database restart) is
run under a `RetryPolicy`: a budget of attempts and of seconds, exponential backoff with jitter
between tries, never less than the server asked for (Retry-After, as seconds or as an HTTP-date),
and only the errors the caller's predicate calls transient are tried again. When the budget is
spent the last error is raised (or what the caller makes of it, `GaveUp`), so a job can be
re-queued later instead of a worker sleeping for minutes. tenacity runs the loop; the sleep,
the monotonic clock, the wall clock and the jitter are the policy's, so tests are instant and exact.

The library's own retries stay off everywhere (python-gitlab's, the openai SDK's): one budget
per call, in one place. Polling until something is true is `sandbox/polling.py` (the sandbox
imports nothing of app/).
"""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import tenacity

from app.logs import get_logger

T = TypeVar("T")
log = get_logger("frogfix.retry")

MAX_RETRY_AFTER_S = 3600.0  # a Retry-After beyond an hour is read as an hour


def parse_retry_after(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP-date (RFC 9110), read
    with email.utils against the wall clock `now`; a date in the past is 0, at most an hour."""
    if value is None or not value.strip():
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        seconds = when.timestamp() - now()
    if seconds != seconds:  # NaN
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


@dataclass(frozen=True)
class GaveUp:
    """How a retried call ended without success: its last error, the attempts made, the seconds
    spent, the wait the next try would have needed, and whether time (not attempts) ran out."""

    error: BaseException
    attempts: int
    elapsed_s: float
    wait_s: float
    out_of_time: bool


@dataclass(frozen=True)
class RetryPolicy:
    """Attempts and seconds a call may take before its transient failure is final.

    The n-th failure waits `base_delay_s * 2**(n-1)`, at most `max_delay_s`, times a jitter in
    [0.5, 1); never less than the server's Retry-After (an error's `retry_after` attribute, in
    seconds) up to `retry_after_cap_s`. A wait that would end past `budget_s` (None: no bound in
    seconds) is not waited: the call gives up instead.
    """

    attempts: int = 5
    budget_s: float | None = 90.0
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    retry_after_cap_s: float = MAX_RETRY_AFTER_S
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    now: Callable[[], float] = field(default=time.time, repr=False)  # the wall clock HTTP-dates are read on
    jitter: Callable[[], float] = field(default=random.random, repr=False)

    def retry_after(self, header: str | None) -> float | None:
        """A Retry-After header's seconds, read on this policy's wall clock."""
        return parse_retry_after(header, self.now)

    def call(
        self,
        what: str,
        fn: Callable[[], T],
        *,
        transient: Callable[[BaseException], bool],
        gave_up: Callable[[GaveUp], BaseException] | None = None,
    ) -> T:
        """`fn()`, tried again after each error `transient` accepts while the budget lasts.

        Other errors pass straight through. When the budget is spent, the last error is raised,
        or `gave_up(ending)` when given (chained to that error). Each retry is logged.
        """
        started = self.clock()
        backoff = tenacity.wait_exponential(multiplier=self.base_delay_s, max=self.max_delay_s)

        def wait(state: tenacity.RetryCallState) -> float:
            pause: float = backoff(state) * (0.5 + 0.5 * self.jitter())
            asked = getattr(_error_of(state), "retry_after", None)
            if isinstance(asked, int | float):
                pause = max(pause, min(float(asked), self.retry_after_cap_s))
            return pause

        def spent(state: tenacity.RetryCallState) -> bool:
            if state.attempt_number >= self.attempts:
                return True
            return self.budget_s is not None and self.clock() - started + state.upcoming_sleep >= self.budget_s

        def end(state: tenacity.RetryCallState) -> T:
            error = _error_of(state)
            if gave_up is None:
                raise error
            ending = GaveUp(error, state.attempt_number, self.clock() - started, state.upcoming_sleep,
                            out_of_time=state.attempt_number < self.attempts)  # fmt: skip
            raise gave_up(ending) from error

        def note(state: tenacity.RetryCallState) -> None:
            log.warning("retrying", what=what, attempt=state.attempt_number,
                        error=str(_error_of(state))[:300], wait_s=round(state.upcoming_sleep, 3))  # fmt: skip

        retrying = tenacity.Retrying(
            sleep=self.sleep,
            stop=spent,
            wait=wait,
            retry=tenacity.retry_if_exception(transient),
            before_sleep=note,
            retry_error_callback=end,
        )
        return retrying(fn)


def _error_of(state: tenacity.RetryCallState) -> BaseException:
    """The error the attempt just made ended with (only asked after a failed one)."""
    error = state.outcome.exception() if state.outcome is not None else None
    assert error is not None, "asked for the error of an attempt that did not fail"
    return error

