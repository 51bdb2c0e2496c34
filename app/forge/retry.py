"""One bounded retry policy for every forge call.

python-gitlab's own retries (and its unbounded-by-time 429 handling) are switched off, and httpx
has none, so both clients go through `RetryPolicy.call`: retry ForgeTransient with exponential
backoff, honour Retry-After, and stop when either the attempt budget or the time budget is
spent. Then the last ForgeTransient is raised, so the job can be re-queued later instead of a
worker sleeping for minutes. `sleep`, `clock` and `jitter` are injectable so tests are instant.
"""

from __future__ import annotations

import email.utils
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from app.forge.api import ForgeTransient

T = TypeVar("T")
log = logging.getLogger(__name__)

MAX_RETRY_AFTER_S = 3600.0  # a Retry-After beyond an hour is treated as an hour


def parse_retry_after(value: str | None, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date (RFC 9110)."""
    if value is None:
        return None
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - now()
    if seconds != seconds:  # NaN
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_S)


@dataclass
class RetryPolicy:
    """Attempts and seconds a forge call may take before its transient failure is final."""

    attempts: int = 5
    budget_s: float = 90.0
    base_delay_s: float = 0.5
    max_delay_s: float = 20.0
    sleep: Callable[[float], None] = field(default=time.sleep, repr=False)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    jitter: Callable[[], float] = field(default=random.random, repr=False)

    def delay(self, failures: int, retry_after: float | None) -> float:
        """Backoff after the n-th failure: exponential with jitter, never below the forge's Retry-After."""
        backoff: float = min(self.max_delay_s, self.base_delay_s * 2.0 ** (failures - 1))
        backoff *= 0.5 + 0.5 * self.jitter()
        return max(backoff, retry_after) if retry_after is not None else backoff

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """Run `fn`, retrying ForgeTransient within the budget; other errors pass straight through."""
        started = self.clock()
        failures = 0
        while True:
            try:
                return fn()
            except ForgeTransient as exc:
                failures += 1
                wait = self.delay(failures, exc.retry_after)
                elapsed = self.clock() - started
                if failures >= self.attempts or elapsed + wait > self.budget_s:
                    gave_up = f"gave up after {failures} attempt{'s' if failures != 1 else ''} in {elapsed:.1f}s"
                    raise ForgeTransient(
                        f"{exc.message} ({gave_up})",
                        status=exc.status,
                        retry_after=exc.retry_after if exc.retry_after is not None else wait,
                        **{**exc.facts(), "gave_up": gave_up},
                    ) from exc
                log.info("forge call %s failed (%s); retry %d in %.2fs", what, exc.message, failures, wait)
                self.sleep(wait)
