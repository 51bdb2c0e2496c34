"""Helpers shared by the sandbox tests (fixtures live in conftest.py)."""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

import pytest

from sandbox.base import SandboxOptions
from sandbox.local import MOUNT_POINT, LocalSandbox
from sandbox.runner import Tools

Own = TypeVar("Own")
SHARED_OPTIONS = frozenset(field.name for field in fields(SandboxOptions))


def split_options(own: Callable[..., Own], **options: Any) -> tuple[SandboxOptions, Own]:
    """A test's keyword options as a backend takes them: those both backends share (`SandboxOptions`),
    the rest the backend's own (`own`, e.g. LocalOptions)."""
    shared = {key: value for key, value in options.items() if key in SHARED_OPTIONS}
    return SandboxOptions(**shared), own(**{key: value for key, value in options.items() if key not in shared})


def git(cwd: Path, *args: str) -> str:
    """Run git on the host (only while no sandbox holds the workspace)."""
    done = subprocess.run(
        ["git", "-c", "user.name=FrogFix Test", "-c", "user.email=test@frogfix.invalid", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


def init_repo(path: Path, files: dict[str, str | bytes]) -> str:
    """A git repository with one commit holding `files`; returns the commit id."""
    git(path, "init", "-q")
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_text(content)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "base")
    return git(path, "rev-parse", "HEAD")


def inside_tree(sandbox: LocalSandbox, path: str = ".") -> dict[str, bytes]:
    """Every file under `path` as the sandbox sees it (its workspace is its own copy, not the host's)."""
    script = (
        "import base64, json, os, sys\n"
        "out = {}\n"
        "for folder, dirs, files in os.walk(sys.argv[1]):\n"
        "    dirs[:] = [d for d in dirs if d != '.git']\n"
        "    for name in files:\n"
        "        p = os.path.join(folder, name)\n"
        "        if os.path.isfile(p) and not os.path.islink(p):\n"
        "            out[os.path.relpath(p, sys.argv[1])] = base64.b64encode(open(p, 'rb').read()).decode()\n"
        "print(json.dumps(out))\n"
    )
    result = sandbox.run_command(f"python3 -c {shlex.quote(script)} {shlex.quote(path)}", 60)
    assert result.exit_code == 0, result.log
    return {name: base64.b64decode(data) for name, data in json.loads(result.log).items()}


def inside_bytes(sandbox: LocalSandbox, path: str) -> bytes:
    """One file's bytes as the sandbox sees it."""
    result = sandbox.run_command(f"base64 -w0 {shlex.quote(path)}", 60)
    assert result.exit_code == 0, result.log
    return base64.b64decode(result.log)


def sandbox_host_pids(sandbox: LocalSandbox) -> set[int]:
    """bwrap and every process below it, as host pids (read from the host, so no fork inside)."""
    assert sandbox._res.proc is not None
    found: set[int] = set()
    frontier = [sandbox._res.proc.pid]
    while frontier:
        pid = frontier.pop()
        found.add(pid)
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                frontier += [int(child) for child in (task / "children").read_text().split()]
            except OSError:  # the task ended meanwhile
                continue
    return found


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def bash(sandbox: LocalSandbox, command: str, **extra: Any) -> str:
    return sandbox.call_tool("Bash", {"command": command, **extra})


def leaf_bash(rc: int, out: str, err: str) -> str:
    return f"Exit code: {rc}\nSTDOUT:\n{out}\nSTDERR:\n{err}"


def skip_unless_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("only meaningful when FrogFix runs as root")


class ToolHarness:
    """The five tools over one workspace, either in-process (`Tools`) or through a real sandbox.

    Tests put their files under `root` first; the sandbox is opened on the first call, so the
    files are there (and owned right) when it starts.
    """

    def __init__(self, kind: str, root: Path, opener: Callable[[Path], LocalSandbox] | None = None) -> None:
        self.kind = kind
        self.root = root
        self._opener = opener
        self._sandbox: LocalSandbox | None = None
        self._tools = Tools(str(root)) if kind == "inprocess" else None

    @property
    def inside_root(self) -> str:
        """The workspace root as the tools see it."""
        return str(self.root) if self.kind == "inprocess" else MOUNT_POINT

    def abs(self, relative: str) -> str:
        return os.path.join(self.inside_root, relative)

    def put(self, name: str, content: str | bytes) -> Path:
        assert self._sandbox is None, "put files before the first call"
        target = self.root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            target.write_bytes(content)
        else:
            target.write_bytes(content.encode())
        return target

    def read_bytes(self, name: str) -> bytes:
        """A workspace file as the tools left it (inside the sandbox: the host's copy never changes)."""
        if self._sandbox is None:
            return (self.root / name).read_bytes()
        return inside_bytes(self._sandbox, name)

    def read_text(self, name: str) -> str:
        return self.read_bytes(name).decode()

    def call(self, name: str, **arguments: Any) -> str:
        if self._tools is not None:
            return self._tools.call(name, arguments)
        if self._sandbox is None:
            assert self._opener is not None
            self._sandbox = self._opener(self.root)
        return self._sandbox.call_tool(name, arguments)
