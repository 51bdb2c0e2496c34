"""Where an attempt's fresh workspaces come from: the warm pool over a forge mirror, or a local checkout.

An attempt asks for a checkout of one commit in a folder it names, and never cares which; the
pipeline hands it the pool, `manage.py fix` the user's checkout, replay whichever still holds the
recorded base commit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import git

from worker import repos


class WorkspaceSource(Protocol):
    def checkout(self, dest: Path, commit: str) -> None:
        """A fresh repository at `dest` whose HEAD is exactly `commit`, with no remote; raises on failure."""
        ...


class PoolSource:
    """Workspaces from a forge mirror, taken from the warm pool when one is ready."""

    def __init__(self, pool: repos.WorkspacePool, mirror: Path) -> None:
        self.pool, self.mirror = pool, mirror

    def checkout(self, dest: Path, commit: str) -> None:
        self.pool.prepare(self.mirror, commit, dest)


class MirrorSource:
    """Workspaces made straight from a mirror (no pool): replay's copy of a forge job's repository."""

    def __init__(self, mirror: Path) -> None:
        self.mirror = mirror

    def checkout(self, dest: Path, commit: str) -> None:
        repos.make_workspace(self.mirror, dest, commit)


class CheckoutSource:
    """Workspaces cloned from a local checkout's committed history: `manage.py fix` and its replays."""

    def __init__(self, repo_dir: Path) -> None:
        self.repo_dir = repo_dir

    def checkout(self, dest: Path, commit: str) -> None:
        clone_workspace(self.repo_dir, dest, commit)


def clone_workspace(repo_dir: Path, dest: Path, base_commit: str) -> None:
    """A private copy at the base commit, with no remote: nothing in it points anywhere else."""
    git.Repo.clone_from(str(repo_dir), str(dest), no_hardlinks=True, no_checkout=True)
    repo = git.Repo(dest)
    repo.git.checkout("--detach", "--quiet", base_commit)
    repo.delete_remote(repo.remote("origin"))
    with repo.config_writer() as cfg:
        cfg.set_value("user", "name", "FrogFix")
        cfg.set_value("user", "email", "frogfix@localhost")
