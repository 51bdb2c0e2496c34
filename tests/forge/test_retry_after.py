"""Both forge clients, through their real HTTP code against the doubles on 127.0.0.1, wait what a
429 or 503's Retry-After asks: as seconds or as an HTTP-date, a date in the past waits the backoff
only, an absurd ask is capped. The sleep and the wall clock are the policy's: each wait is exact."""

from __future__ import annotations

import email.utils
from dataclasses import replace

import pytest

from app.forge.api import Forge, ForgeTransient
from app.forge.gitea_api import GiteaForge
from app.forge.gitlab_api import GitLabForge
from app.retrying import MAX_RETRY_AFTER_S, RetryPolicy
from tests.doubles.gitea_api import GiteaDouble
from tests.doubles.gitlab_api import GitLabDouble
from tests.forge.conftest import FakeClock

P = "acme/widgets"
DATE = "Wed, 21 Oct 2015 07:28:00 GMT"
DATE_TS = email.utils.parsedate_to_datetime(DATE).timestamp()
BACKOFF = 0.5  # the first wait of the `retry` fixture (base 0.5 s, jitter fixed at 1)


Double = GitLabDouble | GiteaDouble


@pytest.fixture(params=["gitlab", "gitea"])
def forge_double(request: pytest.FixtureRequest) -> Double:
    double: Double = request.getfixturevalue(f"{request.param}_double")
    return double


def forge_on(double: Double, retry: RetryPolicy) -> Forge:
    if isinstance(double, GitLabDouble):
        return GitLabForge(double.base_url, double.token, retry=retry, timeout=5.0)
    return GiteaForge(double.base_url, double.token, retry=retry, timeout=5.0)


@pytest.mark.parametrize(
    ("status", "header", "now", "waited"),
    [
        (429, DATE, DATE_TS - 7, 7.0),  # an HTTP-date 7 s ahead of the policy's wall clock
        (503, DATE, DATE_TS - 42, 42.0),
        (503, DATE, DATE_TS + 100, BACKOFF),  # a date in the past: the backoff only
        (429, "7", DATE_TS, 7.0),  # seconds
        (503, "0", DATE_TS, BACKOFF),
    ],
)
def test_retry_after_is_waited(
    forge_double: Double, retry: RetryPolicy, fake_clock: FakeClock,
    status: int, header: str, now: float, waited: float,
) -> None:
    forge_double.fail_next(1, status, retry_after=header)
    forge = forge_on(forge_double, replace(retry, now=lambda: now))
    assert forge.project_info(P).default_branch == "main"
    assert fake_clock.sleeps == [waited]
    assert len(forge_double.calls("GET")) >= 2  # the refused request, then its retry


def test_an_absurd_retry_after_is_capped(
    forge_double: Double, retry: RetryPolicy, fake_clock: FakeClock
) -> None:
    forge_double.fail_next(1, 429, retry_after="999999999")
    forge = forge_on(forge_double, replace(retry, budget_s=None))
    assert forge.project_info(P).default_branch == "main"
    assert fake_clock.sleeps == [MAX_RETRY_AFTER_S]


def test_a_retry_after_past_the_budget_gives_up_at_once(
    forge_double: Double, retry: RetryPolicy, fake_clock: FakeClock
) -> None:
    forge_double.fail_next(1, 503, retry_after=DATE)
    forge = forge_on(forge_double, replace(retry, budget_s=60.0, now=lambda: DATE_TS - 600))
    with pytest.raises(ForgeTransient, match=r"gave up after 1 attempt in") as caught:
        forge.project_info(P)
    assert caught.value.retry_after == 600.0  # the caller can re-queue the job for later
    assert fake_clock.sleeps == []

