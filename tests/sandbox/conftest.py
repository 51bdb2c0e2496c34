"""Fixtures for the sandbox tests: real bubblewrap sandboxes over throw-away workspaces.

When FrogFix runs as root the sandbox's processes run as an unprivileged host uid, which must
be able to reach the workspace, so workspaces live under a base folder with mode 0711 (pytest's
own tmp folders are 0700).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import SandboxLimits, SandboxSpec
from sandbox.local import LocalOptions, LocalSandbox
from tests.sandbox.support import ToolHarness, split_options

BWRAP = shutil.which("bwrap")
NO_BWRAP = "bubblewrap (bwrap) is not installed: apt-get install bubblewrap to run the sandbox tests"

# Small limits keep the containment tests fast and cheap.
TEST_LIMITS = SandboxLimits(
    wall_seconds=120.0,
    max_processes=64,
    memory_bytes=2 * 1024**3,
    file_size_bytes=8 * 1024**2,
    output_bytes=30_000,
    default_tool_timeout=20.0,
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if BWRAP is None:
        skip = pytest.mark.skip(reason=NO_BWRAP)
        for item in items:
            if "bwrap" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def plain_login_shell(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process tool tests run `bash -l` on the host: keep the host user's dotfiles out of it
    (a profile that runs `pyenv rehash`, killed by a timeout test, leaves a stale lock behind).
    Sandboxes never see this: their environment is built from nothing."""
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture(scope="session")
def ws_base() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="frogfix-sandbox-tests-"))
    base.chmod(0o711)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def workspace(ws_base: Path, request: pytest.FixtureRequest) -> Path:
    path = Path(tempfile.mkdtemp(prefix=f"{request.node.name[:40]}-", dir=ws_base))
    path.chmod(0o755)
    return path


@pytest.fixture
def outside(ws_base: Path) -> Path:
    """A host folder next to the workspace, holding a secret the sandbox must never see or change."""
    path = Path(tempfile.mkdtemp(prefix="outside-", dir=ws_base))
    (path / "host.txt").write_text("HOST-SECRET\n")
    return path


@pytest.fixture
def make_sandbox() -> Iterator[Callable[..., LocalSandbox]]:
    opened: list[LocalSandbox] = []

    def make(workspace: Path, limits: SandboxLimits = TEST_LIMITS, **options: Any) -> LocalSandbox:
        env = options.pop("env", {})
        spec = SandboxSpec(workspace=str(workspace), env=env, limits=limits)
        sandbox = LocalSandbox(spec, *split_options(LocalOptions, **options))
        opened.append(sandbox)
        return sandbox

    yield make
    for sandbox in opened:
        sandbox.close()


@pytest.fixture
def sb(workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> LocalSandbox:
    return make_sandbox(workspace)


@pytest.fixture(params=["inprocess", pytest.param("bwrap", marks=pytest.mark.bwrap)])
def tools(request: pytest.FixtureRequest, workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> ToolHarness:
    """The tool formats must be identical in-process and through a real sandbox."""
    if request.param == "inprocess":
        return ToolHarness("inprocess", workspace)
    return ToolHarness("bwrap", workspace, make_sandbox)
