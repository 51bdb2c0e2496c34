"""The Sandbox seam: everything the agent loop and the pipeline may ask of an isolated workspace.

Both backends (local bubblewrap, Kubernetes pod) drive the same stdlib-only runner
(`sandbox/runner.py`) over one long-lived stdin/stdout stream, one JSON object a line each way,
through one client (`sandbox/runner_client.py`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from sandbox.quantity import DEFAULT_MEMORY_BYTES


class SandboxError(RuntimeError):
    """Infrastructure failure of the sandbox itself (not a tool's own error): the run must stop."""


class SandboxUnavailable(SandboxError):
    """The backend cannot start here (for example bubblewrap is not installed)."""


class PatchTooLarge(SandboxError):
    """The changes make a patch over the byte limit the caller set (the runner's `patch_too_large`).

    A refusal of the patch, not a failure of the sandbox: it stays usable. `limit` is in bytes.
    """

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class SandboxLimits:
    """Resource bounds applied to everything that runs inside one sandbox."""

    wall_seconds: float = 10_800.0
    max_processes: int = 256
    memory_bytes: int = DEFAULT_MEMORY_BYTES  # per process (RLIMIT_AS); locally also the whole sandbox's total
    file_size_bytes: int = 512 * 1024**2
    output_bytes: int = 30_000
    default_tool_timeout: float = 120.0


@dataclass(frozen=True)
class CommandResult:
    """The outcome of a command run by the pipeline (not by the model), for example the tests."""

    command: str
    exit_code: int
    log: str
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass
class SandboxSpec:
    """What a backend needs to start: the prepared workspace and the environment the job allows."""

    workspace: str
    env: dict[str, str] = field(default_factory=dict)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    image: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


class Sandbox(Protocol):
    """One started sandbox. Close it in a `finally` (or use it as a context manager)."""

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one Leaf tool call; the result is the exact Leaf text (tool errors included)."""
        ...

    def run_command(self, command: str, timeout: float) -> CommandResult:
        """Run a shell command in the workspace (used for tests and setup, not by the model)."""
        ...

    def patch(self, base_commit: str) -> str:
        """`git add -A` then `git diff --cached --binary <base_commit>`, taken inside the sandbox.

        Raises PatchTooLarge when the diff is over the backend's `max_patch_bytes`."""
        ...

    def close(self) -> None:
        """Stop every process of the sandbox; idempotent."""
        ...
