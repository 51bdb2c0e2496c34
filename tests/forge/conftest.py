"""Doubles for the forge API tests: both forges' HTTP doubles, a fake clock for retries."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from app.retrying import RetryPolicy
from tests.conftest import shared_fixture
from tests.doubles.gitea_api import GiteaDouble
from tests.doubles.gitlab_api import GitLabDouble

TRIGGER = "frognano-fix"


@dataclass
class FakeClock:
    """Stands in for time.sleep/time.monotonic: sleeping is instant and only recorded."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


@pytest.fixture
def fixtures_root() -> Path:
    """The real forge fixtures the doubles take their shapes from (skips when ../shared is absent)."""
    root = shared_fixture("MANIFEST.json").parent
    return root


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def retry(fake_clock: FakeClock) -> RetryPolicy:
    return RetryPolicy(
        attempts=4, budget_s=120.0, base_delay_s=0.5, sleep=fake_clock.sleep, clock=fake_clock.clock, jitter=lambda: 1.0
    )


@pytest.fixture
def gitlab_double(fixtures_root: Path) -> Iterator[GitLabDouble]:
    double = GitLabDouble(token="glpat-CANARY-0123456789abcdef", fixtures=fixtures_root)
    double.add_project("acme/widgets", default_branch="main")
    double.add_member("acme/widgets", "dev", 30)
    double.add_member("acme/widgets", "rep", 20)
    double.add_member("acme/widgets", "maint", 40)
    double.add_user("stranger")
    double.add_issue("acme/widgets", title="Crash on empty input", labels=("bug",), author="rep")
    double.add_label("acme/widgets", 1, TRIGGER, by="dev")
    try:
        yield double
    finally:
        double.close()


@pytest.fixture
def gitea_double(fixtures_root: Path) -> Iterator[GiteaDouble]:
    double = GiteaDouble(token="gitea-CANARY-0123456789abcdef", fixtures=fixtures_root)
    double.add_repo("acme/widgets", default_branch="main")
    double.set_permission("acme/widgets", "dev", "write")
    double.set_permission("acme/widgets", "rep", "read")
    double.set_permission("acme/widgets", "boss", "admin")
    double.add_user("stranger")
    double.add_issue("acme/widgets", title="Crash on empty input", labels=("bug",), author="rep")
    double.add_label("acme/widgets", 1, TRIGGER, by="dev")
    try:
        yield double
    finally:
        double.close()
