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
    results: str | None = None  # the results channel's lines, when asked for (None: not asked, or it overflowed)


# A sandbox's PATH when the job sets none (the image's or the host's usual folders).
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"
# Where a job's built test environment (a virtual environment) is, in every sandbox of the job.
ENV_DIR = "/frogfix/env"
# The setup phase only: its files (build script, pump, plan), the relay's socket folder, the copy-out folder.
SETUP_FILES_DIR = "/frogfix/setup"
RELAY_DIR = "/frogfix/relay"
OUT_DIR = "/frogfix/out"
# Files the setup phase's build wrote into the checkout that git ignores (hatch-vcs's and setuptools-scm's
# `_version.py`): kept in the environment, copied into every later sandbox's workspace at its start.
GENERATED_DIR = f"{ENV_DIR}/.frogfix-workspace"
TOOLS_DIR = "/frogfix/bin"
# The mirror inside a setup sandbox is http://127.0.0.1:PUMP_PORT/<index path> (sandbox/index_pump.py
# listens there and writes READY_FILE); locally the pump reaches RELAY_DIR/RELAY_SOCKET, on Kubernetes
# it tunnels over an exec stream to that socket on the worker (sandbox/kubernetes_tunnel.py).
PUMP_PORT = 3141
READY_FILE = "/tmp/.frogfix-index-ready"
RELAY_SOCKET = "index.sock"


@dataclass(frozen=True)
class SetupMounts:
    """What a setup-phase sandbox has besides the workspace (worker/environment/builder.py).

    ENV_DIR starts empty and writable, `env_size_bytes` large (in RAM, so a build cannot fill the
    host's disk); `files` (read-only at SETUP_FILES_DIR) holds the build script and the plan;
    `relay` (read-only at RELAY_DIR) holds the index relay's unix socket, the sandbox's only way
    out; `out` (writable at OUT_DIR) receives the finished environment, copied by a command that
    runs after every process of the build is gone; `tools` are read-only files at TOOLS_DIR/<name>.
    A backend without host binds (Kubernetes) copies `files` and `tools` in, tunnels to the relay's
    socket, and streams ENV_DIR out into `out` in `collect_environment()`.
    """

    env_size_bytes: int
    files: str
    relay: str
    out: str
    tools: tuple[tuple[str, str], ...] = ()


@dataclass
class SandboxSpec:
    """What a backend needs to start: the prepared workspace and the environment the job allows.

    `environment` is a built test environment on the host, read-only at ENV_DIR; `setup` makes the
    sandbox a setup-phase one instead (see SetupMounts).
    """

    workspace: str
    env: dict[str, str] = field(default_factory=dict)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    image: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    environment: str | None = None
    setup: SetupMounts | None = None


class SetupSandbox(Protocol):
    """A setup-phase sandbox, besides running commands: hands the built environment to the host."""

    def run_command(self, command: str, timeout: float, log_limit: int | None = None) -> CommandResult: ...

    def collect_environment(self) -> None:
        """Make SetupMounts.out hold ENV_DIR's files (after the save script ran); SandboxError if not."""
        ...

    def close(self) -> None: ...


class Sandbox(Protocol):
    """One started sandbox. Close it in a `finally` (or use it as a context manager)."""

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one Leaf tool call; the result is the exact Leaf text (tool errors included)."""
        ...

    def run_command(
        self, command: str, timeout: float, log_limit: int | None = None, results_limit: int = 0
    ) -> CommandResult:
        """Run a shell command in the workspace (used for tests and setup, not by the model); its log
        keeps head and tail up to `log_limit` bytes (default: the limits' output_bytes). With
        `results_limit`, the command gets the results channel (sandbox/runner.py) and `results` what
        it carried while the command ran."""
        ...

    def patch(self, base_commit: str) -> str:
        """`git add -A` then `git diff --cached --binary <base_commit>`, taken inside the sandbox.

        Raises PatchTooLarge when the diff is over the backend's `max_patch_bytes`."""
        ...

    def close(self) -> None:
        """Stop every process of the sandbox; idempotent."""
        ...
