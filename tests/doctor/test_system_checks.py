"""Database, broker and disk checks, and the runner's deadlines and scrubbing."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings, get_settings
from tests.conftest import configure
from tests.doctor.conftest import by_name, free_port
from worker.commands.doctor import exit_code, render_text, run_doctor
from worker.commands.doctor.checks import Group
from worker.commands.doctor.results import CheckResult, DoctorOptions, failed, passed, skipped, warned
from worker.commands.doctor.system import (
    check_broker,
    check_database,
    check_disk,
    check_evidence_bound,
    check_metrics_token,
    shown_url,
)


def test_database_at_head_passes(frogfix_env: dict[str, Any]) -> None:
    [line] = check_database(get_settings(), DoctorOptions())
    assert line.outcome == "pass", line
    assert "head" in line.detail


def test_database_not_migrated_fails_with_migrate(frogfix_env: dict[str, Any]) -> None:
    from app.migrate import downgrade

    url = get_settings().resolved_database_url()
    downgrade(url, "base")
    [line] = check_database(get_settings(), DoctorOptions())
    assert line.outcome == "fail"
    assert "empty (no schema)" in line.detail
    assert line.fix == "run ./manage.py migrate"


def test_database_file_missing_is_not_created(frogfix_env: dict[str, Any], tmp_path: Any) -> None:
    configure(frogfix_env["monkeypatch"], data_dir=str(tmp_path / "elsewhere"))
    [line] = check_database(get_settings(), DoctorOptions())
    assert line.outcome == "fail" and "no database file" in line.detail
    assert not (tmp_path / "elsewhere" / "frogfix.db").exists()


def test_database_server_down_is_a_failed_line(frogfix_env: dict[str, Any]) -> None:
    port = free_port()
    configure(frogfix_env["monkeypatch"], database_url=f"postgresql+psycopg://frog:s3cret-pass@127.0.0.1:{port}/frogfix")
    [line] = check_database(get_settings(), DoctorOptions())
    assert line.outcome == "fail"
    assert "FROGFIX_DATABASE_URL" in line.fix
    assert "s3cret-pass" not in line.detail and f":{port}" in line.detail


def test_embedded_broker_passes(frogfix_env: dict[str, Any]) -> None:
    [line] = check_broker(get_settings(), DoctorOptions())
    assert line.outcome == "pass" and "embedded" in line.detail


def test_broker_down_fails_with_its_fix(frogfix_env: dict[str, Any]) -> None:
    port = free_port()
    configure(frogfix_env["monkeypatch"], broker_url=f"redis://:hunter2-secret@127.0.0.1:{port}/0")
    started = time.monotonic()
    [line] = check_broker(get_settings(), DoctorOptions())
    assert time.monotonic() - started < 15
    assert line.outcome == "fail"
    assert "FROGFIX_BROKER_URL" in line.fix
    assert "hunter2-secret" not in line.detail


@pytest.mark.redis
def test_redis_broker_passes(frogfix_env: dict[str, Any], redis: Any) -> None:
    configure(frogfix_env["monkeypatch"], broker_url=redis.url)
    [line] = check_broker(get_settings(), DoctorOptions())
    assert line.outcome == "pass", line


def test_disk_threshold(frogfix_env: dict[str, Any], tmp_path: Any) -> None:
    configure(frogfix_env["monkeypatch"], workspace_dir=str(tmp_path / "ws"))
    lines = by_name(check_disk(get_settings(), DoctorOptions(min_free_bytes=1)))
    assert lines["disk.data"].outcome == "pass" and lines["disk.workspace"].outcome == "pass"
    lines = by_name(check_disk(get_settings(), DoctorOptions(min_free_bytes=10**18)))
    assert lines["disk.data"].outcome == "fail" and "FROGFIX_DATA_DIR" in lines["disk.data"].fix
    assert lines["disk.workspace"].outcome == "fail" and "FROGFIX_WORKSPACE_DIR" in lines["disk.workspace"].fix


def test_shown_url_hides_only_the_password() -> None:
    assert shown_url("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert shown_url("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    assert shown_url("redis://h:6379") == "redis://h:6379"


def _hangs(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    time.sleep(30)
    return [passed("slow", "never seen")]


def _crashes(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    raise RuntimeError("boom")


def _echoes_secret(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    token = settings.gitlab_token.get_secret_value()
    return [failed("echo", f"server said: bad token {token}", f"replace {token}"), skipped("other", "x")]


def test_runner_bounds_hangs_and_crashes_and_scrubs(frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], gitlab_token="glpat-super-secret-token")
    groups = [
        Group("slow", 0.5, _hangs, "look at the slow thing"),
        Group("crash", 5, _crashes, "look at the crash"),
        Group("echo", 5, _echoes_secret, "n/a"),
    ]
    started = time.monotonic()
    results = run_doctor(get_settings(), groups=groups)
    assert time.monotonic() - started < 15  # the slow group's 0.5 s bound, not its 30 s hang
    lines = by_name(results)
    assert lines["slow"].outcome == "fail" and "no answer within 0.5 s" in lines["slow"].detail
    assert lines["slow"].fix == "look at the slow thing"
    assert lines["crash"].outcome == "fail" and "RuntimeError: boom" in lines["crash"].detail
    assert "glpat-super-secret-token" not in render_text(results)
    assert lines["echo"].detail == "server said: bad token [REDACTED]"
    assert exit_code(results) == 1
    assert exit_code([lines["other"]]) == 0


def _echoes_urls(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    return [failed("urls", f"nothing answers at {settings.model_base_url} nor {settings.broker_url}", "start them")]


def test_a_password_written_into_a_url_setting_is_never_shown(frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], model_base_url="http://frog:url-pass-1@127.0.0.1:9/v1",
              broker_url="redis://:url-pass-2@127.0.0.1:9/0")
    results = run_doctor(get_settings(), groups=[Group("urls", 5, _echoes_urls, "n/a")])
    text = render_text(results)
    assert "url-pass-1" not in text and "url-pass-2" not in text
    assert "http://frog:***@127.0.0.1:9/v1" in text and "redis://:***@127.0.0.1:9/0" in text


def test_an_empty_metrics_token_is_a_warning_that_says_what_metrics_exposes(frogfix_env: dict[str, Any]) -> None:
    """Final review, S1: on Docker Compose the api's published port serves /metrics to anyone without a token."""
    [line] = check_metrics_token(get_settings(), DoctorOptions())
    assert (line.name, line.outcome, line.severity) == ("metrics.token", "warn", "warning")
    assert "FROGFIX_METRICS_TOKEN is empty" in line.detail and "names every project" in line.detail
    assert "FROGFIX_METRICS_TOKEN" in line.fix and "openssl rand -hex 32" in line.fix and "Prometheus" in line.fix
    text = render_text(run_doctor(get_settings(), groups=[Group("metrics", 5, check_metrics_token, "n/a")]))
    assert text.splitlines()[0].startswith("WARN metrics.token: FROGFIX_METRICS_TOKEN is empty")
    assert "; fix: set FROGFIX_METRICS_TOKEN" in text
    assert text.splitlines()[-1] == "0 passed, 0 failed, 1 warned, 0 skipped"
    assert exit_code([line]) == 0  # a warning, not a failure: doctor still gates deployments on real failures
    configure(frogfix_env["monkeypatch"], metrics_token="scrape-token-value-123")
    results = run_doctor(get_settings(), groups=[Group("metrics", 5, check_metrics_token, "n/a")])
    assert [(r.name, r.outcome) for r in results] == [("metrics.token", "pass")]
    assert "scrape-token-value-123" not in render_text(results)


def test_a_missing_prlimit_is_a_warning_that_the_evidence_runs_unbounded(
    frogfix_env: dict[str, Any], tmp_path: Path
) -> None:
    """Review nit: without prlimit, the worker's git reading a hostile patch has no memory bound."""
    [line] = check_evidence_bound(get_settings(), DoctorOptions())
    assert (line.name, line.outcome) == ("evidence.prlimit", "pass"), line
    assert f"--as={1024**3}" in line.detail  # the evidence's own bound (min of the sandbox's memory and 1 GiB)
    only_git = tmp_path / "bin"
    only_git.mkdir()
    os.symlink(str(shutil.which("git")), only_git / "git")
    frogfix_env["monkeypatch"].setenv("PATH", str(only_git))
    [line] = check_evidence_bound(get_settings(), DoctorOptions())
    assert (line.name, line.outcome, line.severity) == ("evidence.prlimit", "warn", "warning")
    assert "prlimit is not on PATH" in line.detail and "without its memory bound" in line.detail
    assert "util-linux" in line.fix
    assert exit_code([line]) == 0


def test_text_report_one_line_each_with_fix() -> None:
    results = [
        passed("a", "fine"),
        failed("b", "broken", "do this"),
        failed("c", "meh", "do that", severity="warning"),
        skipped("d", "not configured"),
    ]
    lines = render_text(results).splitlines()
    assert lines == [
        "PASS a: fine",
        "FAIL b: broken; fix: do this",
        "FAIL c (warning): meh; fix: do that",
        "SKIP d: not configured",
        "1 passed, 2 failed, 1 skipped",
    ]
    assert render_text([warned("e", "open", "close it")]).splitlines() == [
        "WARN e: open; fix: close it",
        "0 passed, 0 failed, 1 warned, 0 skipped",
    ]


def test_git_is_new_enough_for_update_rounds(frogfix_env: dict[str, Any], tmp_path: Path) -> None:
    from worker.commands.doctor.system import check_git

    [line] = check_git(get_settings(), DoctorOptions())
    assert (line.name, line.outcome) == ("git.version", "pass"), line  # this machine's git is 2.39
    old = tmp_path / "bin"
    old.mkdir()
    (old / "git").write_text("#!/bin/sh\necho 'git version 2.30.2'\n")
    (old / "git").chmod(0o755)
    frogfix_env["monkeypatch"].setenv("PATH", f"{old}{os.pathsep}{os.environ['PATH']}")
    [line] = check_git(get_settings(), DoctorOptions())
    assert (line.name, line.outcome, line.severity) == ("git.version", "warn", "warning")
    assert "older than 2.38" in line.detail and "update rounds" in line.detail
