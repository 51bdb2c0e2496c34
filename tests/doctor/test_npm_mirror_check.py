"""Doctor's `npm mirror` line against a real npm registry (Verdaccio, tests/npm_registry.py)."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from app.settings import get_settings
from tests.conftest import configure
from tests.doctor.conftest import free_port
from tests.npm_registry import Verdaccio
from worker.commands.doctor import render_text, run_doctor
from worker.commands.doctor.checks import default_groups
from worker.commands.doctor.npm_mirror import NAME, check_npm_mirror
from worker.commands.doctor.results import CheckResult, DoctorOptions

CANARY = "canary-npm-7Qx2vP"


def _line(frogfix_env: dict[str, Any], url: str) -> tuple[CheckResult, str]:
    """The check's line, and doctor's whole text output for it (through the runner, as `manage.py doctor`)."""
    configure(frogfix_env["monkeypatch"], npm_registry_url=url)
    settings = get_settings()
    [line] = check_npm_mirror(settings, DoctorOptions())
    groups = [g for g in default_groups(settings) if g.name == NAME]
    return line, render_text(run_doctor(settings, DoctorOptions(), groups))


def test_the_right_password_passes(frogfix_env: dict[str, Any], npm_registry: Verdaccio) -> None:
    line, text = _line(frogfix_env, npm_registry.url)
    assert line.outcome == "pass", line
    assert f"{npm_registry.user}:***@127.0.0.1:{npm_registry.port}" in line.detail
    assert npm_registry.password not in text and npm_registry.password not in repr(line)
    probes = [r for r in npm_registry.requests() if r.path == "/yarn"]
    assert probes and probes[-1].status == 200 and probes[-1].user == npm_registry.user


def test_a_wrong_password_is_named_401_and_never_shown(frogfix_env: dict[str, Any], npm_registry: Verdaccio) -> None:
    url = f"http://{npm_registry.user}:{quote(CANARY)}@127.0.0.1:{npm_registry.port}/"
    line, text = _line(frogfix_env, url)
    assert line.outcome == "fail", line
    assert "refused FrogFix's credentials (HTTP 401)" in line.detail
    assert "FROGFIX_NPM_REGISTRY_URL" in line.fix
    assert CANARY not in text and CANARY not in repr(line)
    assert f"FAIL {NAME}: " in text


def test_no_credentials_where_the_registry_wants_them(frogfix_env: dict[str, Any], npm_registry: Verdaccio) -> None:
    line, _ = _line(frogfix_env, npm_registry.plain_url)
    assert line.outcome == "fail" and "refused a request without credentials (HTTP 401)" in line.detail


def test_an_unreachable_port_fails_with_a_remedy(frogfix_env: dict[str, Any]) -> None:
    port = free_port()
    line, text = _line(frogfix_env, f"http://frog:{CANARY}@127.0.0.1:{port}/")
    assert line.outcome == "fail", line
    assert line.detail.startswith(f"nothing answers at http://frog:***@127.0.0.1:{port}/: Connect")
    assert "start the registry" in line.fix
    assert CANARY not in text


def test_unset_says_what_is_not_built(frogfix_env: dict[str, Any]) -> None:
    line, text = _line(frogfix_env, "")
    assert line.outcome == "skip"
    assert "FROGFIX_NPM_REGISTRY_URL is not set" in line.detail and "no environment" in line.detail
    assert f"SKIP {NAME}: " in text


def test_not_a_url_fails_without_echoing_it(frogfix_env: dict[str, Any]) -> None:
    line, text = _line(frogfix_env, f"npm.example:{CANARY}")
    assert line.outcome == "fail" and "not an http:// or https:// URL" in line.detail
    assert CANARY not in text


def test_a_path_where_no_registry_answers_fails(frogfix_env: dict[str, Any], npm_registry: Verdaccio) -> None:
    """A wrong path on the registry's host (neither -/ping nor a package found there)."""
    line, _ = _line(frogfix_env, f"{npm_registry.url}not/the/registry/")
    assert line.outcome == "fail", line
    assert "does not answer like an npm registry (-/ping: HTTP 404, yarn: HTTP 404)" in line.detail
    assert "`npm --registry`" in line.fix


def test_a_registry_without_the_probe_package_warns(frogfix_env: dict[str, Any], npm_registry: Verdaccio,
                                                    monkeypatch: Any) -> None:
    monkeypatch.setattr("worker.commands.doctor.npm_mirror.PROBE_PACKAGE", "@company/never-published-xyz")
    line, _ = _line(frogfix_env, npm_registry.url)
    assert line.outcome == "warn", line
    assert "does not serve `@company/never-published-xyz`" in line.detail
