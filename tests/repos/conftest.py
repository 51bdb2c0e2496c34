"""A served upstream repository (the real git smart-HTTP double) for the repos tests."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.forge.api import basic_auth_header
from tests.doubles.git_http import GitHttpDouble, bare_repo_from, git, make_worktree

TOKEN = "glpat-CANARY-repos-0123456789abcdef"
HEADER = basic_auth_header("oauth2", TOKEN)
BINARY = bytes(range(256)) * 8 + b"\x00\x00tail"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


@dataclass
class Upstream:
    server: GitHttpDouble
    url: str
    bare: Path  # the repository the server serves
    work: Path  # a working tree whose pushes (over the file system) change it
    first: str  # the first commit on main
    second: str  # main's head when the fixture starts

    def commit(self, files: dict[str, str], message: str) -> str:
        """A new commit on main, pushed straight into the served bare repository."""
        for name, text in files.items():
            (self.work / name).parent.mkdir(parents=True, exist_ok=True)
            (self.work / name).write_text(text, encoding="utf-8")
        for args in (("add", "-A"), ("commit", "-q", "-m", message), ("push", "-q", str(self.bare), "main")):
            done = git(*args, cwd=self.work)
            assert done.returncode == 0, done.stderr
        return self.rev("main")

    def rev(self, ref: str) -> str:
        done = git("--git-dir", str(self.bare), "rev-parse", "--verify", ref)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[Upstream]:
    work = make_worktree(
        tmp_path / "src",
        {"README.md": "hello\n", "app/calc.py": "def add(a, b):\n    return a - b\n", "docs/old.txt": "old\n"},
    )
    (work / "assets").mkdir()
    (work / "assets" / "logo.bin").write_bytes(BINARY)
    first = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    git("rm", "-q", "docs/old.txt", cwd=work)
    (work / "app" / "calc.py").write_text("def add(a, b):\n    return a + b - 0\n", encoding="utf-8")
    git("add", "-A", cwd=work)
    assert git("commit", "-q", "-m", "second", cwd=work).returncode == 0
    second = git("rev-parse", "HEAD", cwd=work).stdout.strip()
    bare = bare_repo_from(work, tmp_path / "served", "acme/widgets.git")
    with GitHttpDouble(tmp_path / "served", authorization=HEADER) as server:
        yield Upstream(server, server.url_for("acme/widgets.git"), bare, work, first, second)
