"""Fixtures for the realrepos tests: the task folders in ../shared, one filled mirror per session,
and per-test folders the sandbox's unprivileged uid can reach.

Absent fixtures (a checkout without ../shared) or a missing bubblewrap or pypiserver skip these
tests with the reason; a mirror that cannot be filled (no cache, no PyPI) fails them, loudly.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.realrepos import FIXTURES, Task, load_tasks
from tests.realrepos.mirror import PackageMirror, filled_cache

# The mirror's password for the session: a canary that must surface nowhere FrogFix writes.
MIRROR_CANARY = "mirror-canary-9b4e2d7c1a"
NO_FIXTURES = f"realrepos fixtures not found at {FIXTURES} (they live in the shared folder beside the repository)"
NO_BWRAP = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap to run the realrepos tests"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if shutil.which("bwrap") is None:
        for item in items:
            if "realrepos" in item.keywords and "bwrap" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=NO_BWRAP))


@pytest.fixture(scope="session")
def realrepos_tasks() -> dict[str, Task]:
    if not (FIXTURES / "MANIFEST.json").is_file():
        pytest.skip(NO_FIXTURES)
    return {task.name: task for task in load_tasks()}


@pytest.fixture(scope="session")
def mirror(realrepos_tasks: dict[str, Task]) -> Iterator[PackageMirror]:
    """One pypiserver for the session, filled for all six tasks whichever run (one cache folder)."""
    for module in ("pypiserver", "passlib"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed: pip install -e '.[dev]' for the realrepos tests")
    packages = filled_cache(list(realrepos_tasks.values()))
    with PackageMirror(packages, MIRROR_CANARY) as server:
        yield server


@dataclass(frozen=True)
class RunDirs:
    """A test's folders: `data` and `workspaces` for FrogFix, `work` for the checkout and issue."""

    base: Path

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def workspaces(self) -> Path:
        return self.base / "workspaces"

    @property
    def work(self) -> Path:
        return self.base / "work"


@pytest.fixture
def run_dirs() -> Iterator[RunDirs]:
    """Folders under one 0711 base outside pytest's 0700 tmp, so the sandbox's uid can traverse
    them (as tests/conftest.py's local_env does); removed afterwards, environments and all."""
    base = Path(tempfile.mkdtemp(prefix="frogfix-realrepos-"))
    base.chmod(0o711)
    dirs = RunDirs(base)
    for folder in (dirs.data, dirs.workspaces, dirs.work):
        folder.mkdir(mode=0o711)
        folder.chmod(0o711)
    try:
        yield dirs
    finally:
        shutil.rmtree(base, ignore_errors=True)
