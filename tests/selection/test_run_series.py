"""`run_series` (worker/attempts/attempt.py), the one sequence of a job's attempts, with attempts as plain functions."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from worker.attempts.attempt import run_series


class NoAgreement:
    """The runner as `run_series` uses it: only the agreement runs, none needed here."""

    def __init__(self) -> None:
        self.calls = 0

    def agreement(self, results: Any, cross: Any, start: str) -> None:
        self.calls += 1


def test_a_failure_beside_side_by_side_attempts_stops_them_and_the_slots_go_back() -> None:
    """Found in review: a failure (or the job's time limit) in one side-by-side attempt left the others
    running to their end, started the ones not yet started, and kept the model slots meanwhile."""
    stop = threading.Event()
    worked: list[int] = []
    given: list[bool] = []

    def run_one(number: int, extra: bool) -> Any:
        if stop.is_set():
            return None  # the caller's attempts look at the stop before any work
        worked.append(number)
        if number == 1:
            assert wait_for(lambda: 2 in worked)
            stop.set()
            raise RuntimeError("the sandbox failed")
        assert stop.wait(60), "attempt 2 was never told to stop"
        return None

    with pytest.raises(RuntimeError, match="sandbox failed"):
        run_series(NoAgreement(), run_one, attempts=3, ceiling=0, start="base", parallel=2,  # type: ignore[arg-type]
                   abort=stop.set, side_by_side_done=lambda: given.append(True))
    assert sorted(worked) == [1, 2] and given == [True]


def test_an_attempt_the_infrastructure_stopped_ends_the_series_with_what_ran() -> None:
    ran: list[int] = []

    def run_one(number: int, extra: bool) -> Any:
        ran.append(number)
        return None  # the model could not be used: the caller records why and stops the series

    series = run_series(NoAgreement(), run_one, attempts=1, ceiling=4, start="base")  # type: ignore[arg-type]
    assert ran == [1] and series.results == [] and series.choice.chosen is None


def test_no_extra_attempt_starts_when_the_caller_says_why_not() -> None:
    ran: list[int] = []

    def run_one(number: int, extra: bool) -> Any:
        ran.append(number)
        return None if extra else _Unpublishable(number)

    series = run_series(NoAgreement(), run_one, attempts=2, ceiling=5, start="base",  # type: ignore[arg-type]
                        why_stop=lambda: "the job's time left would not fit another attempt")
    assert ran == [1, 2] and series.extra_stop == "the job's time left would not fit another attempt"


class _Unpublishable:
    """An attempt the rule never publishes (no verification)."""

    def __init__(self, number: int) -> None:
        from app.selection import Candidate

        self.number = number
        self.candidate = Candidate(number, None, False)


def wait_for(check: Any, timeout: float = 60.0) -> bool:
    done = threading.Event()
    deadline = threading.Timer(timeout, done.set)
    deadline.start()
    try:
        while not done.is_set():
            if check():
                return True
            done.wait(0.01)
        return bool(check())
    finally:
        deadline.cancel()
