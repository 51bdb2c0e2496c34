"""The git smart-HTTP double: clone and push need the Authorization header the forge client gives."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.forge.api import basic_auth_header, git_auth_env
from tests.doubles.git_http import GitHttpDouble, bare_repo_from, git, git_env, make_worktree

TOKEN = "glpat-CANARY-git-0123456789"
HEADER = basic_auth_header("oauth2", TOKEN)

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[GitHttpDouble, str]]:
    source = make_worktree(tmp_path / "src", {"README.md": "hello\n", "app.py": "print('hi')\n"})
    bare_repo_from(source, tmp_path / "repos", "acme/widgets.git")
    with GitHttpDouble(tmp_path / "repos", authorization=HEADER) as server:
        yield server, server.url_for("acme/widgets.git")


def test_clone_and_push_with_the_header_in_the_environment(served: tuple[GitHttpDouble, str], tmp_path: Path) -> None:
    server, url = served
    env = git_env(git_auth_env(HEADER, url=server.base_url + "/"))
    done = git("clone", "-q", url, str(tmp_path / "work"), env=env)
    assert done.returncode == 0, done.stderr
    work = tmp_path / "work"
    assert (work / "README.md").read_text() == "hello\n"

    git("checkout", "-q", "-b", "frogfix/issue-1", cwd=work)
    (work / "app.py").write_text("print('fixed')\n")
    git("commit", "-q", "-am", "Fix", cwd=work)
    done = git("push", "-q", "origin", "frogfix/issue-1", cwd=work, env=env)
    assert done.returncode == 0, done.stderr

    assert [p.repo for p in server.pushes] == ["acme/widgets.git"]
    ((old, new, ref),) = server.pushes[0].updates
    assert ref == "refs/heads/frogfix/issue-1" and set(old) == {"0"}
    assert new == git("rev-parse", "HEAD", cwd=work).stdout.strip()
    shown = git("--git-dir", str(tmp_path / "repos/acme/widgets.git"), "rev-parse", "refs/heads/frogfix/issue-1")
    assert shown.stdout.strip() == new
    # the token is in no config file of the clone and was never in a URL
    assert TOKEN not in (work / ".git" / "config").read_text()
    assert all(r.authorization == HEADER for r in server.requests)


def test_clone_and_push_with_dash_c_extra_header(served: tuple[GitHttpDouble, str], tmp_path: Path) -> None:
    server, url = served
    extra = ("-c", f"http.extraHeader=Authorization: {HEADER}")
    assert git(*extra, "clone", "-q", url, str(tmp_path / "work")).returncode == 0
    work = tmp_path / "work"
    git("checkout", "-q", "-b", "frogfix/issue-2", cwd=work)
    (work / "new.txt").write_text("x\n")
    git("add", "new.txt", cwd=work)
    git("commit", "-q", "-m", "Add", cwd=work)
    done = git(*extra, "push", "-q", "origin", "frogfix/issue-2", cwd=work)
    assert done.returncode == 0, done.stderr
    assert server.pushes[-1].updates[0][2] == "refs/heads/frogfix/issue-2"


def test_without_the_header_clone_and_push_are_refused(served: tuple[GitHttpDouble, str], tmp_path: Path) -> None:
    server, url = served
    done = git("clone", "-q", url, str(tmp_path / "anon"))
    assert done.returncode != 0
    assert server.requests and all(r.status == 401 for r in server.requests)

    work = tmp_path / "work"
    assert git("clone", "-q", url, str(work), env=git_env(git_auth_env(HEADER))).returncode == 0
    git("checkout", "-q", "-b", "frogfix/issue-3", cwd=work)
    done = git("push", "-q", "origin", "frogfix/issue-3", cwd=work)  # no header this time
    assert done.returncode != 0
    wrong = git_env(git_auth_env(basic_auth_header("oauth2", "not-the-token")))
    assert git("push", "-q", "origin", "frogfix/issue-3", cwd=work, env=wrong).returncode != 0
    assert server.pushes == []


def test_header_scoped_to_another_url_is_not_sent(served: tuple[GitHttpDouble, str], tmp_path: Path) -> None:
    server, url = served
    env = git_env(git_auth_env(HEADER, url="http://forge.example.invalid/"))
    assert git("clone", "-q", url, str(tmp_path / "work"), env=env).returncode != 0
    assert all(r.authorization is None for r in server.requests)


def test_large_push_uses_chunked_transfer(served: tuple[GitHttpDouble, str], tmp_path: Path) -> None:
    server, url = served
    env = git_env(git_auth_env(HEADER))
    work = tmp_path / "work"
    assert git("clone", "-q", url, str(work), env=env).returncode == 0
    git("checkout", "-q", "-b", "frogfix/issue-4", cwd=work)
    (work / "blob.bin").write_bytes(os.urandom(3 * 1024 * 1024))  # above http.postBuffer: chunked request
    git("add", "blob.bin", cwd=work)
    git("commit", "-q", "-m", "Big", cwd=work)
    done = git("push", "-q", "origin", "frogfix/issue-4", cwd=work, env=env)
    assert done.returncode == 0, done.stderr
    pushes = [r for r in server.requests if r.method == "POST" and r.path.endswith("git-receive-pack")]
    assert any(r.headers.get("transfer-encoding") == "chunked" for r in pushes)
    assert server.pushes[-1].updates[0][2] == "refs/heads/frogfix/issue-4"
