"""Waiting until something is true: the one poll loop, for the sandbox and the worker alike.

Here rather than beside app/retrying.py (the retry policy) because this package imports nothing
of app/ and its backends poll (a pod starting, pods gone, a cgroup emptied); the worker's git lock
imports it from here. Standard library only. A retry asks again after a failure under a budget of
attempts; a poll asks a cheap question until the answer is yes or the time is up, the pause
doubling so a quick answer is seen quickly and a slow one is not asked about in a busy loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def poll_until(
    done: Callable[[], bool],
    *,
    within_s: float,
    first_pause_s: float,
    max_pause_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> bool:
    """Ask `done` until it says True (then True), pausing `first_pause_s`, then twice as long each
    time up to `max_pause_s`; False once `within_s` has passed. A pause never runs past the bound,
    and `done` is asked once more at the bound before False. Errors `done` raises pass through."""
    deadline = clock() + within_s
    pause = first_pause_s
    while not done():
        remaining = deadline - clock()
        if remaining <= 0:
            return False
        sleep(min(pause, remaining))
        pause = min(pause * 2, max_pause_s)
    return True
