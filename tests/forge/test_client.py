"""The forge-independent parts: text bounds and scrubbing, retry policy, upsert, git env."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.forge.api import (
    ForgeConflict,
    ForgeError,
    ForgeNotFound,
    ForgeTransient,
    MergeRequest,
    OutboundText,
    bound_text,
    error_for_status,
    forge_call,
    git_auth_env,
    secret_forms,
    strip_draft_prefix,
    upsert_draft_mr,
)
from app.redaction import REDACTED
from app.retrying import RetryPolicy, parse_retry_after
from tests.forge.conftest import FakeClock


def test_bound_text_keeps_short_text_and_notes_the_cut() -> None:
    assert bound_text("short", 10) == "short"
    cut = bound_text("a" * 1000, 200)
    assert 150 < len(cut) <= 200 and "trimmed by FrogFix" in cut and cut.startswith("a")
    kept = len(cut) - len(cut.lstrip("a"))
    assert f"{1000 - kept:,} characters not shown" in cut  # the note counts exactly what was dropped


def test_strip_draft_prefix() -> None:
    for title in ("Draft: Fix", "WIP: Fix", "[WIP] Fix", "[Draft] Fix", "(draft) Fix", "draft: WIP: Fix", "Fix"):
        assert strip_draft_prefix(title) == "Fix"


def test_outbound_text_scrubs_token_and_basic_forms_then_redacts() -> None:
    text = OutboundText(secret_forms("tok-123456"), redact=lambda s: s.replace("pw", "**"), limit=100)
    basic = secret_forms("tok-123456")[1]
    assert text.body(f"tok-123456 {basic} pw") == f"{REDACTED} {REDACTED} **"
    assert text.title("Draft: ", "WIP:  multi\nline   tok-123456") == f"Draft: multi line {REDACTED}"
    assert len(text.error("x" * 1000)) <= 300


def test_error_for_status_classes() -> None:
    assert isinstance(error_for_status(404, "m"), ForgeNotFound)
    assert isinstance(error_for_status(409, "m"), ForgeConflict)
    transient = error_for_status(429, "m", retry_after=3)
    assert isinstance(transient, ForgeTransient) and transient.retry_after == 3
    assert isinstance(error_for_status(502, "m"), ForgeTransient)
    assert type(error_for_status(422, "m")) is ForgeError


def test_parse_retry_after() -> None:
    assert parse_retry_after("12") == 12
    assert parse_retry_after(None) is None and parse_retry_after("soon") is None
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:10 GMT", now=lambda: 0.0) == 10
    assert parse_retry_after("999999") == 3600


def test_retry_policy_passes_permanent_errors_through(fake_clock: FakeClock) -> None:
    policy = RetryPolicy(sleep=fake_clock.sleep, clock=fake_clock.clock)
    calls = []

    def boom() -> None:
        calls.append(1)
        raise ForgeNotFound("nope")

    with pytest.raises(ForgeNotFound):
        forge_call(policy, "x", boom)
    assert calls == [1] and fake_clock.sleeps == []


def test_retry_policy_backoff_is_bounded(fake_clock: FakeClock) -> None:
    policy = RetryPolicy(attempts=8, budget_s=1000, base_delay_s=1, max_delay_s=5, sleep=fake_clock.sleep,
                         clock=fake_clock.clock, jitter=lambda: 1.0)  # fmt: skip

    def flaky() -> None:
        raise ForgeTransient("busy", status=503)

    with pytest.raises(ForgeTransient, match="gave up after 8 attempts"):
        forge_call(policy, "x", flaky)
    assert fake_clock.sleeps == [1, 2, 4, 5, 5, 5, 5]


class FakeForge:
    """Just enough of a Forge to drive upsert_draft_mr through its branches."""

    kind = "gitlab"

    def __init__(self, existing: MergeRequest | None, conflict: bool = False) -> None:
        self.existing, self.conflict, self.log = existing, conflict, []  # type: ignore[var-annotated]

    def find_open_mr(self, project: str, source_branch: str) -> MergeRequest | None:
        self.log.append("find")
        return self.existing if ("create" in self.log or not self.conflict) else None

    def create_draft_mr(self, project: str, source: str, target: str, title: str, description: str) -> MergeRequest:
        self.log.append("create")
        if self.conflict:
            raise ForgeConflict("exists", status=409)
        return MR

    def update_mr(self, project: str, mr: MergeRequest, title: str, description: str) -> MergeRequest:
        self.log.append("update")
        return replace(mr, description=description)


MR = MergeRequest(1, 1, "u", True, "frogfix/issue-1", "main", "Draft: x", "d", "opened")


def test_upsert_creates_updates_and_survives_a_race() -> None:
    forge = FakeForge(None)
    assert upsert_draft_mr(forge, "p", "b", "main", "t", "d") == (MR, True)  # type: ignore[arg-type]
    forge = FakeForge(MR)
    assert upsert_draft_mr(forge, "p", "b", "main", "t", "new")[1] is False  # type: ignore[arg-type]
    assert forge.log == ["find", "update"]
    forge = FakeForge(MR, conflict=True)
    mr, created = upsert_draft_mr(forge, "p", "b", "main", "t", "new")  # type: ignore[arg-type]
    assert not created and mr.description == "new" and forge.log == ["find", "create", "find", "update"]


def test_git_auth_env_appends_and_scopes() -> None:
    env = git_auth_env("Basic abc", url="https://forge.example/", base_env={"GIT_CONFIG_COUNT": "1"})
    assert env["GIT_CONFIG_COUNT"] == "2"
    assert env["GIT_CONFIG_KEY_1"] == "http.https://forge.example/.extraHeader"
    assert env["GIT_CONFIG_VALUE_1"] == "Authorization: Basic abc"
    assert env["GIT_TERMINAL_PROMPT"] == "0"
    assert git_auth_env("Basic abc")["GIT_CONFIG_KEY_0"] == "http.extraHeader"
