"""Where an attempt's fresh workspaces come from: the warm pool over a forge mirror, or a local checkout.

An attempt asks for a checkout of one commit in a folder it names, and never cares which; the
pipeline hands it the pool, `manage.py fix` the user's checkout, replay whichever still holds the
recorded base commit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from worker.git import workspace_pool


class WorkspaceSource(Protocol):
    def checkout(self, dest: Path, commit: str) -> None:
        """A fresh repository at `dest` whose HEAD is exactly `commit`, with no remote; raises on failure."""
        ...

    def repository(self) -> Path:
        """The repository that holds the base commit's objects (a mirror or a local checkout).

        The attempt applies the sandbox's patch against it, privately (worker/attempts/stored_patch.py).
        """
        ...


class PoolSource:
    """Workspaces from a forge mirror, taken from the warm pool when one is ready."""

    def __init__(self, pool: workspace_pool.WorkspacePool, mirror: Path) -> None:
        self.pool, self.mirror = pool, mirror

    def checkout(self, dest: Path, commit: str) -> None:
        self.pool.prepare(self.mirror, commit, dest)

    def repository(self) -> Path:
        return self.mirror


class MirrorSource:
    """Workspaces made straight from a mirror (no pool): replay's copy of a forge job's repository."""

    def __init__(self, mirror: Path) -> None:
        self.mirror = mirror

    def checkout(self, dest: Path, commit: str) -> None:
        workspace_pool.make_workspace(self.mirror, dest, commit)

    def repository(self) -> Path:
        return self.mirror


class CheckoutSource:
    """Workspaces from a local checkout's committed history: `manage.py fix` and its replays.

    Made like a mirror's (workspace_pool.make_workspace: the isolated git environment, one commit's
    objects copied), so none of the user's or the machine's git filters, hooks or drivers runs.
    """

    def __init__(self, repo_dir: Path) -> None:
        self.repo_dir = repo_dir

    def checkout(self, dest: Path, commit: str) -> None:
        workspace_pool.make_workspace(self.repo_dir, dest, commit)

    def repository(self) -> Path:
        return self.repo_dir
