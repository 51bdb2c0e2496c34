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
class SandboxOptions:
    """How a backend runs every sandbox it opens: what both backends have, the same for each job.

    Built once from settings (worker/wiring.py `sandbox_options`); what only one backend has is its own
    options type (`local.LocalOptions`, `kubernetes_manifests.KubernetesOptions`), and what differs per
    sandbox is its `SandboxSpec`. Sizes are bytes and CPUs a number, whichever backend reads them
    (settings write them as quantities, sandbox/quantity.py): locally the tmpfs sizes and the cgroup's
    CPU bound, in a pod its emptyDirs' size limits and its CPU request and limit.
    `start_timeout_s` covers the start up to the runner's first answer (locally the checkout's copy
    in, in a pod its scheduling and image pull too: FROGFIX_SANDBOX_START_TIMEOUT_SECONDS, 300 s by
    default, is what jobs get). `runner_script` replaces sandbox/runner.py (tests' fake runners).
    """

    cpus: float = 2.0
    workspace_size_bytes: int = 2 * 1024**3  # the defaults of FROGFIX_SANDBOX_WORKSPACE_SIZE and _TMP_SIZE
    tmp_size_bytes: int = 512 * 1024**2
    start_timeout_s: float = 30.0
    tool_timeout_s: float = 300.0
    reply_grace_s: float = 30.0
    max_patch_bytes: int = 64 * 1024**2
    runner_script: str | None = None


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
# The setup phase only: its files (build script, pump, plan) and the relay's socket folder.
SETUP_FILES_DIR = "/frogfix/setup"
RELAY_DIR = "/frogfix/relay"
# A job's own layer over the environment: the project's install (its editable install's files in PROJECT_SITE,
# which the environment's FrogFix-written .pth adds as a site folder, and its console scripts in PROJECT_BIN, last
# on PATH), made per job, offline, from the job's checkout; never cached (worker/environment/builder.py).
PROJECT_DIR = "/frogfix/project"
PROJECT_SITE = f"{PROJECT_DIR}/site"
PROJECT_BIN = f"{PROJECT_SITE}/bin"
# Files that install wrote into the checkout that git ignores (setuptools-scm's `_version.py`): the worker lays
# them into each later checkout where no tracked file is (worker/environment/generated.py).
PROJECT_GENERATED = f"{PROJECT_DIR}/workspace"
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

    `target` (ENV_DIR, or PROJECT_DIR over a built environment) starts empty and writable,
    `env_size_bytes` large (in RAM, so a build cannot fill the host's disk); `files` (read-only at
    SETUP_FILES_DIR) holds the build script and the plan; `relay` (read-only at RELAY_DIR), where
    given, holds the index relay's unix socket, the sandbox's only way out (None: no way out at
    all); `tools` are read-only files at TOOLS_DIR/<name>. Nothing of the host is writable:
    `collect_environment()` streams `target` into the host folder `out` once every process of the
    build is gone, and the host stops at `env_size_bytes` (sandbox/environment_stream.py).
    """

    env_size_bytes: int
    files: str
    relay: str | None
    out: str
    tools: tuple[tuple[str, str], ...] = ()
    target: str = ENV_DIR


@dataclass
class SandboxSpec:
    """What a backend needs to start: the prepared workspace and the environment the job allows.

    `environment` is a built test environment on the host, read-only at ENV_DIR; `project` the job's
    own layer over it, read-only at PROJECT_DIR; `setup` makes the sandbox a setup-phase one (see
    SetupMounts), which may have a built environment too (the project's own install); `checkout_binds`
    lays parts of the environment over the workspace, read-only.
    """

    workspace: str
    env: dict[str, str] = field(default_factory=dict)
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    image: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    environment: str | None = None
    setup: SetupMounts | None = None
    project: str | None = None
    # Folders of the built environment bound read-only over the checkout: (host folder, path relative to the
    # workspace), e.g. a JavaScript install's node_modules, which Node finds only beside the code.
    checkout_binds: tuple[tuple[str, str], ...] = ()
    # Folders inside those binds that get a small writable tmpfs of their own (runners' caches), relative paths.
    checkout_scratch: tuple[str, ...] = ()


class SetupSandbox(Protocol):
    """A setup-phase sandbox, besides running commands: hands the built environment to the host."""

    def run_command(self, command: str, timeout: float, log_limit: int | None = None) -> CommandResult: ...

    def collect_environment(self) -> None:
        """Make SetupMounts.out hold `target`'s files, at most `env_size_bytes` (after the save script
        ran); SandboxError (EnvironmentRefused) if not."""
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
