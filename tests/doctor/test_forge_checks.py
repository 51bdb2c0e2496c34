"""Forge checks against the GitLab and Gitea doubles: URL, token and identity, project access, secret."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.settings import get_settings
from tests.conftest import configure, shared_fixture
from tests.doctor.conftest import by_name, free_port
from tests.doubles.gitea_api import GiteaDouble
from tests.doubles.gitlab_api import GitLabDouble
from worker.commands.doctor.forges import check_gitea, check_gitlab
from worker.commands.doctor.results import DoctorOptions


@pytest.fixture
def gitlab() -> Iterator[GitLabDouble]:
    shared_fixture("")  # the double answers in shapes from ../shared: skipped (saying so) in a bare clone
    with GitLabDouble() as double:
        double.add_project("acme/calc")
        double.add_project("other/tool")
        double.add_member("acme/calc", "frogfix-bot", 30)
        double.add_member("other/tool", "frogfix-bot", 20)
        yield double


@pytest.fixture
def gitea() -> Iterator[GiteaDouble]:
    shared_fixture("")
    with GiteaDouble() as double:
        double.add_repo("acme/calc")
        double.add_repo("acme/docs")
        double.set_permission("acme/docs", "frogfix-bot", "read")
        yield double


def _gitlab_env(env: dict[str, Any], gitlab: GitLabDouble, **extra: str) -> None:
    configure(env["monkeypatch"], gitlab_url=gitlab.base_url, gitlab_token=gitlab.token, **extra)


def test_forge_not_configured_is_skipped(frogfix_env: dict[str, Any]) -> None:
    for check, key in ((check_gitlab, "gitlab"), (check_gitea, "gitea")):
        [line] = check(get_settings(), DoctorOptions())
        assert (line.name, line.outcome) == (key, "skip")
        assert f"FROGFIX_{key.upper()}_URL is empty" in line.detail


def test_gitlab_configured_right_passes(frogfix_env: dict[str, Any], gitlab: GitLabDouble) -> None:
    _gitlab_env(frogfix_env, gitlab, allowed_projects="acme/*")
    lines = by_name(check_gitlab(get_settings(), DoctorOptions()))
    assert [r.outcome for r in lines.values()] == ["pass"] * 4, lines
    assert "@frogfix-bot" in lines["gitlab.token"].detail
    assert "acme/calc" in lines["gitlab.project"].detail and "other/tool" not in lines["gitlab.project"].detail
    listing = gitlab.calls("GET", "/api/v4/projects")[-1]
    assert listing.query["membership"] == ["true"] and listing.query["min_access_level"] == ["30"]


def test_gitlab_wrong_token_fails_and_skips_what_depends_on_it(
    frogfix_env: dict[str, Any], gitlab: GitLabDouble
) -> None:
    configure(frogfix_env["monkeypatch"], gitlab_url=gitlab.base_url, gitlab_token="glpat-wrong-token-value")
    lines = by_name(check_gitlab(get_settings(), DoctorOptions()))
    assert lines["gitlab.url"].outcome == "pass"
    assert lines["gitlab.token"].outcome == "fail"
    assert "rejected (HTTP 401)" in lines["gitlab.token"].detail
    assert "FROGFIX_GITLAB_TOKEN" in lines["gitlab.token"].fix
    assert lines["gitlab.project"].outcome == "skip"
    assert lines["gitlab.webhook_secret"].outcome == "pass"


def test_gitlab_exact_project_below_developer_fails(frogfix_env: dict[str, Any], gitlab: GitLabDouble) -> None:
    _gitlab_env(frogfix_env, gitlab, allowed_projects="acme/calc,other/tool")
    line = by_name(check_gitlab(get_settings(), DoctorOptions()))["gitlab.project"]
    assert line.outcome == "fail"
    assert "other/tool: access level 20" in line.detail and "acme/calc:" not in line.detail
    assert "Developer" in line.fix


def test_gitlab_patterns_matching_nothing_say_what_to_set(frogfix_env: dict[str, Any], gitlab: GitLabDouble) -> None:
    _gitlab_env(frogfix_env, gitlab, allowed_projects="nope/*")
    line = by_name(check_gitlab(get_settings(), DoctorOptions()))["gitlab.project"]
    assert line.outcome == "fail"
    assert "matches nope/*" in line.detail
    assert "FROGFIX_ALLOWED_PROJECTS" in line.fix and "acme/calc" in line.fix


def test_gitlab_url_nothing_listening(frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], gitlab_url=f"http://127.0.0.1:{free_port()}", gitlab_token="glpat-x")
    lines = by_name(check_gitlab(get_settings(), DoctorOptions()))
    assert lines["gitlab.url"].outcome == "fail" and "does not answer" in lines["gitlab.url"].detail
    assert "FROGFIX_GITLAB_URL" in lines["gitlab.url"].fix
    assert lines["gitlab.token"].outcome == "skip" and lines["gitlab.project"].outcome == "skip"


def test_webhook_secret_missing_fails(frogfix_env: dict[str, Any], gitlab: GitLabDouble) -> None:
    _gitlab_env(frogfix_env, gitlab, gitlab_webhook_secret="")
    line = by_name(check_gitlab(get_settings(), DoctorOptions()))["gitlab.webhook_secret"]
    assert line.outcome == "fail" and "FROGFIX_GITLAB_WEBHOOK_SECRET" in line.fix


def test_gitea_configured_right_passes(frogfix_env: dict[str, Any], gitea: GiteaDouble) -> None:
    configure(frogfix_env["monkeypatch"], gitea_url=gitea.base_url, gitea_token=gitea.token)
    lines = by_name(check_gitea(get_settings(), DoctorOptions()))
    assert [r.outcome for r in lines.values()] == ["pass"] * 4, lines
    assert "@frogfix-bot" in lines["gitea.token"].detail
    assert "acme/calc" in lines["gitea.project"].detail and "acme/docs" not in lines["gitea.project"].detail
    assert "all projects allowed" in lines["gitea.project"].detail


def test_gitea_read_only_repository_fails(frogfix_env: dict[str, Any], gitea: GiteaDouble) -> None:
    configure(frogfix_env["monkeypatch"], gitea_url=gitea.base_url, gitea_token=gitea.token,
              allowed_projects="acme/docs")
    line = by_name(check_gitea(get_settings(), DoctorOptions()))["gitea.project"]
    assert line.outcome == "fail" and "acme/docs" in line.detail and "not admin" in line.detail
    assert "admin" in line.fix


def test_gitea_write_without_admin_fails(frogfix_env: dict[str, Any], gitea: GiteaDouble) -> None:
    """Write lets the bot push, but only a repository admin may read who else may trigger: every admission would
    meet Gitea's 403, so doctor says so before the first job does."""
    gitea.set_permission("acme/docs", "frogfix-bot", "write")
    configure(frogfix_env["monkeypatch"], gitea_url=gitea.base_url, gitea_token=gitea.token,
              allowed_projects="acme/docs")
    line = by_name(check_gitea(get_settings(), DoctorOptions()))["gitea.project"]
    assert line.outcome == "fail" and "not admin" in line.detail and "admin" in line.fix


def test_gitea_wrong_token_fails(frogfix_env: dict[str, Any], gitea: GiteaDouble) -> None:
    configure(frogfix_env["monkeypatch"], gitea_url=gitea.base_url, gitea_token="not-the-token")
    lines = by_name(check_gitea(get_settings(), DoctorOptions()))
    assert lines["gitea.token"].outcome == "fail" and "FROGFIX_GITEA_TOKEN" in lines["gitea.token"].fix
    assert lines["gitea.project"].outcome == "skip"
