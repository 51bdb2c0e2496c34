"""app/retrying.py's RetryPolicy and sandbox/polling.py's poll_until, with their clocks injected:
each wait is asserted exactly, and nothing here sleeps."""

from __future__ import annotations

import email.utils
from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy.exc import OperationalError
from structlog.testing import capture_logs

from app.retrying import MAX_RETRY_AFTER_S, GaveUp, RetryPolicy, parse_retry_after
from sandbox.polling import poll_until
from tests.forge.conftest import FakeClock

DATE = "Wed, 21 Oct 2015 07:28:00 GMT"
DATE_TS = email.utils.parsedate_to_datetime(DATE).timestamp()


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


class Busy(Exception):
    """A transient failure, with the server's ask when it made one."""

    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__("busy")
        self.retry_after = retry_after


class Broken(Exception):
    """A failure no retry mends."""


def policy(clock: FakeClock, **kw: Any) -> RetryPolicy:
    options: dict[str, Any] = {"attempts": 5, "budget_s": None, "base_delay_s": 1.0, "max_delay_s": 4.0}
    options.update(kw)
    return RetryPolicy(sleep=clock.sleep, clock=clock.clock, jitter=lambda: 1.0, **options)


def failing(*outcomes: BaseException | str) -> Any:
    """A call that raises or returns each outcome in turn, counting its calls."""
    left = list(outcomes)

    def call() -> str:
        call.count += 1  # type: ignore[attr-defined]
        out = left.pop(0)
        if isinstance(out, BaseException):
            raise out
        return out

    call.count = 0  # type: ignore[attr-defined]
    return call


def is_busy(exc: BaseException) -> bool:
    return isinstance(exc, Busy)


def test_retry_after_is_read_as_seconds_or_as_an_http_date() -> None:
    assert parse_retry_after("12") == 12.0
    assert parse_retry_after(" 1.5 ") == 1.5
    assert parse_retry_after(DATE, now=lambda: DATE_TS - 7) == 7.0
    assert parse_retry_after(DATE, now=lambda: DATE_TS + 100) == 0.0  # a date in the past asks for nothing
    assert parse_retry_after("-3") == 0.0
    assert parse_retry_after("999999") == MAX_RETRY_AFTER_S  # an absurd ask is capped
    assert parse_retry_after(DATE, now=lambda: DATE_TS - 10**7) == MAX_RETRY_AFTER_S
    for nonsense in (None, "", "soon", "nan", "Wed, 99 Foo 2015"):
        assert parse_retry_after(nonsense) is None


def test_the_policy_reads_dates_on_its_own_wall_clock() -> None:
    assert RetryPolicy(now=lambda: DATE_TS - 30).retry_after(DATE) == 30.0


def test_backoff_doubles_to_its_cap_and_the_call_then_succeeds(fake_clock: FakeClock) -> None:
    call = failing(Busy(), Busy(), Busy(), Busy(), "ok")
    assert policy(fake_clock).call("x", call, transient=is_busy) == "ok"
    assert fake_clock.sleeps == [1.0, 2.0, 4.0, 4.0] and call.count == 5


def test_jitter_shortens_a_wait_to_no_less_than_half(fake_clock: FakeClock) -> None:
    retry = replace(policy(fake_clock), jitter=lambda: 0.0)
    retry.call("x", failing(Busy(), Busy(), "ok"), transient=is_busy)
    assert fake_clock.sleeps == [0.5, 1.0]


def test_only_what_the_predicate_calls_transient_is_tried_again(fake_clock: FakeClock) -> None:
    call = failing(Broken("no"), "never")
    with pytest.raises(Broken):
        policy(fake_clock).call("x", call, transient=is_busy)
    assert call.count == 1 and fake_clock.sleeps == []


def test_the_server_s_ask_is_waited_at_least_and_capped(fake_clock: FakeClock) -> None:
    policy(fake_clock).call("x", failing(Busy(retry_after=30.0), Busy(retry_after=0.0), "ok"), transient=is_busy)
    assert fake_clock.sleeps == [30.0, 2.0]  # an ask below the backoff waits the backoff
    fake_clock.sleeps.clear()
    capped = policy(fake_clock, retry_after_cap_s=10.0)
    capped.call("x", failing(Busy(retry_after=MAX_RETRY_AFTER_S), "ok"), transient=is_busy)
    assert fake_clock.sleeps == [10.0]


def test_spent_attempts_raise_the_last_error_itself(fake_clock: FakeClock) -> None:
    last = Busy()
    call = failing(Busy(), Busy(), last)
    with pytest.raises(Busy) as caught:
        policy(fake_clock, attempts=3).call("x", call, transient=is_busy)
    assert caught.value is last and call.count == 3 and fake_clock.sleeps == [1.0, 2.0]


def test_a_wait_past_the_time_budget_is_not_waited(fake_clock: FakeClock) -> None:
    endings: list[GaveUp] = []

    def gave_up(ending: GaveUp) -> Exception:
        endings.append(ending)
        return RuntimeError("given up")

    last = Busy(retry_after=600.0)
    with pytest.raises(RuntimeError, match="given up") as caught:
        policy(fake_clock, budget_s=30.0).call("x", failing(Busy(), last), transient=is_busy, gave_up=gave_up)
    assert caught.value.__cause__ is last
    assert fake_clock.sleeps == [1.0]
    assert endings == [GaveUp(last, attempts=2, elapsed_s=1.0, wait_s=600.0, out_of_time=True)]


def test_each_retry_is_logged(fake_clock: FakeClock) -> None:
    with capture_logs() as logs:
        policy(fake_clock).call("read issue #1", failing(Busy(), "ok"), transient=is_busy)
    assert [(e["event"], e["what"], e["attempt"], e["wait_s"]) for e in logs] == [
        ("retrying", "read issue #1", 1, 1.0)
    ]


def test_the_database_retry_tries_a_lost_connection_again(frogfix_env: dict[str, Any], fake_clock: FakeClock) -> None:
    from sqlalchemy import text

    from app.db import DATABASE_RETRY, in_transaction

    lost = OperationalError("select 1", {}, Exception("server closed the connection unexpectedly"))
    tries: list[int] = []

    def work(session: Any) -> int:
        tries.append(1)
        if len(tries) == 1:
            raise lost
        return int(session.execute(text("select 41 + 1")).scalar())

    retry = replace(DATABASE_RETRY, sleep=fake_clock.sleep, clock=fake_clock.clock, jitter=lambda: 1.0)
    assert in_transaction(work, retry=retry) == 42
    assert len(tries) == 2 and fake_clock.sleeps == [1.0]


def test_a_poll_that_comes_true_stops_asking(fake_clock: FakeClock) -> None:
    answers = iter([False, False, False, True])
    assert poll_until(lambda: next(answers), within_s=10.0, first_pause_s=0.1, max_pause_s=0.3,
                      sleep=fake_clock.sleep, clock=fake_clock.clock)  # fmt: skip
    assert fake_clock.sleeps == pytest.approx([0.1, 0.2, 0.3])


def test_a_poll_that_never_comes_true_ends_at_its_bound(fake_clock: FakeClock) -> None:
    asked: list[float] = []

    def never() -> bool:
        asked.append(fake_clock.now)
        return False

    started = fake_clock.now
    assert not poll_until(never, within_s=1.0, first_pause_s=0.1, max_pause_s=0.4,
                          sleep=fake_clock.sleep, clock=fake_clock.clock)  # fmt: skip
    assert fake_clock.sleeps == pytest.approx([0.1, 0.2, 0.4, 0.3])  # the last pause ends at the bound
    assert len(asked) == 5 and asked[-1] == pytest.approx(started + 1.0)  # asked once more at the bound


def test_a_poll_s_error_passes_through(fake_clock: FakeClock) -> None:
    def broken() -> bool:
        raise Broken("the pod failed")

    with pytest.raises(Broken):
        poll_until(broken, within_s=1.0, first_pause_s=0.1, max_pause_s=0.4, sleep=fake_clock.sleep)
    assert fake_clock.sleeps == []
