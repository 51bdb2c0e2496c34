"""The setup phase: a repository's test environment built from the mirror, cached, then mounted read-only.

Why it is built this way:
- The environment is a virtual environment at ENV_DIR (`/frogfix/env`) in every sandbox of a job,
  built with uv (fast, resolves and installs offline-capably, one static binary) where the
  sandbox has it, else with the interpreter's venv and pip. The project is installed editable, so
  it points at /workspace: the agent's edits and the patch are what the tests import. Built from
  the sandbox's own interpreter with no system site-packages, none of the host's packages is seen.
- The setup sandbox runs the repository's build code (setup.py, build backends, setup_command),
  so it is a sandbox like any other: no credentials, its own empty network namespace, and one
  way out, the index relay's unix socket (relay.py), which reaches the mirror's origin only.
- The environment is built in RAM (a size-bounded tmpfs) and copied to the host by a command
  that runs after every process of the build is gone, so a build cannot fill the host's disk or
  write there afterwards.
- Cached by what determines it: the declared plan, the dependency files' bytes, the interpreter,
  the mirror (without credentials), `setup_command`, the project's last release tag, and the
  project (`scope`): another project's identical files never share its environment, since a
  build runs that project's own code. Two builds of one key wait for each other (a file lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.settings import Settings
from sandbox import index_pump
from sandbox.base import (
    DEFAULT_PATH,
    ENV_DIR,
    GENERATED_DIR,
    OUT_DIR,
    PUMP_PORT,
    READY_FILE,
    RELAY_DIR,
    RELAY_SOCKET,
    SETUP_FILES_DIR,
    TOOLS_DIR,
    SandboxError,
    SetupMounts,
    SetupSandbox,
)
from sandbox.quantity import parse_quantity
from worker import mirrors, workspace_pool
from worker.environment.declared import DeclarationError, Overrides, Plan, is_python, plan_for
from worker.environment.relay import IndexRelay, MirrorURL

BUILDER_VERSION = "2"  # part of every cache key: a change in how environments are built starts afresh
LOG_TAIL_CHARS = 4_000
SCRIPT = "build.sh"
SAVE_SCRIPT = "save.sh"
# Kept from what the build wrote into the checkout: files git ignores, less caches and build output.
NOT_GENERATED = (
    r"(^|/)(__pycache__|\.pytest_cache|\.mypy_cache|\.tox|\.nox|\.venv|\.eggs|build|dist|[^/]*\.egg-info)(/|$)"
    r"|\.py[co]$"
)
SAVE = f"""set -e -o pipefail
mkdir -p {GENERATED_DIR}
git ls-files -z --others --ignored --exclude-standard 2>/dev/null \\
  | {{ grep -zvE '{NOT_GENERATED}' || true; }} | xargs -0 -r cp -a --parents -t {GENERATED_DIR}/
if [ -d {OUT_DIR} ]; then cp -a {ENV_DIR}/. {OUT_DIR}/; fi  # bound locally; on Kubernetes streamed out
"""


class EnvironmentUnusable(Exception):
    """The job's tests cannot run: the environment could not be built, or the tests could not start."""

    def __init__(self, report: EnvironmentReport) -> None:
        super().__init__(report.reason)
        self.report = report


@dataclass
class EnvironmentReport:
    """What `fix --json` calls `environment`, the job page and `show` print, and the issue comment says."""

    ok: bool
    built: bool = False  # False: no environment applies (no mirror set, or not a Python repository)
    cached: bool = False
    seconds: float = 0.0
    reason: str = ""
    log_tail: str = ""
    detected: list[str] = field(default_factory=list)
    key: str = ""
    path: Path | None = None  # the host folder; never reported

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"ok": self.ok, "built": self.built, "cached": self.cached}
        data["seconds"] = round(self.seconds, 3)
        if self.detected:
            data["detected"] = self.detected
        if self.key:
            data["key"] = self.key[:16]
        if not self.ok or self.reason:
            data["reason"] = self.reason
        if not self.ok:
            data["log_tail"] = self.log_tail
        return data

    def line(self) -> str:
        """One line for `fix`'s stdout, `show` and the timeline."""
        if not self.ok:
            return f"environment error: {self.reason}"
        if not self.built:
            return f"environment: none built ({self.reason})"
        return f"environment: {'cached' if self.cached else 'built'} in {self.seconds:.1f}s"


def failed(reason: str, log: str = "", *, built: bool = True) -> EnvironmentReport:
    return EnvironmentReport(False, built=built, reason=reason, log_tail=_tail(log))


def _tail(text: str) -> str:
    return text if len(text) <= LOG_TAIL_CHARS else "[...]\n" + text[-LOG_TAIL_CHARS:]


@dataclass(frozen=True)
class SetupRequest:
    """One checkout to build for: its plan, `setup_command`, and what scopes the cache."""

    workspace: Path
    plan: Plan
    setup_command: str | None
    scope: str
    version: str | None  # the project's version from its last release tag, for setuptools-scm and hatch-vcs
    tag: str | None
    image: str | None = None  # the job's sandbox image (`.frogfix.yml` image:), where the backend uses one


# (workspace, mounts, environment variables, image) -> a started setup sandbox
SandboxOpener = Callable[[Path, SetupMounts, dict[str, str], str | None], SetupSandbox]


class Environments:
    """One job's environments: one per distinct declaration, each built once (or found in the cache).

    `open_setup` opens a setup-phase sandbox (worker/wiring.py), so both backends serve.
    """

    def __init__(
        self,
        settings: Settings,
        redact: Callable[[str], str],
        open_setup: SandboxOpener,
        *,
        scope: str,
        source_repository: Callable[[], Path] | None = None,
        on_stage: Callable[[str, str, dict[str, Any]], None] | None = None,
    ) -> None:
        self.settings = settings
        self.redact = redact
        self.open_setup = open_setup
        self.scope = scope
        self.source_repository = source_repository
        self.on_stage = on_stage or (lambda kind, message, data: None)
        self._mirror = _mirror(settings)
        self._known: dict[str, EnvironmentReport] = {}

    @property
    def enabled(self) -> bool:
        return self._mirror is not None

    def for_checkout(
        self, workspace: Path, test_command: str | None, setup_command: str | None, overrides: Overrides | None,
        commit: str | None = None,
        image: str | None = None,
    ) -> EnvironmentReport:
        """The environment for the checkout at `workspace` (ok or not; nothing raises for the repository's faults)."""
        if self._mirror is None:
            why = "FROGFIX_PIP_INDEX_URL is not set: the sandbox image's Python runs the tests"
            return EnvironmentReport(True, reason=why)
        if not is_python(workspace):
            return EnvironmentReport(True, reason="not a Python repository: nothing to build")
        try:
            plan = plan_for(workspace, test_command, overrides)
        except (DeclarationError, OSError) as exc:
            return failed(self.redact(f"the repository's dependency files cannot be read: {exc}"), built=False)
        tag, version = self._version(commit)
        request = SetupRequest(workspace, plan, setup_command, self.scope, version, tag, image)
        key = cache_key(request, self._mirror, self.settings)
        if key in self._known:
            return self._known[key]
        report = self._cached_or_built(request, key)
        report.detected = list(plan.detected)
        if report.ok:
            self._known[key] = report
            self.on_stage("environment", report.line(), report.to_dict())
        return report

    def _version(self, commit: str | None) -> tuple[str | None, str | None]:
        if commit is None or self.source_repository is None:
            return None, None
        described = mirrors.describe(self.source_repository(), commit)
        return (None, None) if described is None else (described[0], release_version(*described))

    def _cached_or_built(self, request: SetupRequest, key: str) -> EnvironmentReport:
        root = self.settings.resolved_environment_dir()
        entry = root / key
        started = time.monotonic()
        with _locked(root / f"{key}.lock"):
            if (entry / "env").is_dir():
                os.utime(entry)  # the cache's least recently used order
                return EnvironmentReport(True, built=True, cached=True, seconds=time.monotonic() - started,
                                         key=key, path=entry / "env")
            self.on_stage("environment_building", "building the test environment from the package mirror", {})
            report = self._build(request, key, root)
            report.seconds = time.monotonic() - started
        if report.ok:
            prune(root, self.settings.environment_cache_entries, key, self.settings.job_timeout_seconds)
        return report

    def _build(self, request: SetupRequest, key: str, root: Path) -> EnvironmentReport:
        assert self._mirror is not None
        staging = root / f".build-{key[:16]}-{secrets.token_hex(4)}"
        files, relay_dir, out = staging / "files", staging / "relay", staging / "out"
        try:
            for folder in (staging, files, relay_dir, out):
                folder.mkdir(mode=0o755)
                folder.chmod(0o755)
            _write_files(files, request)
            with IndexRelay(self._mirror, relay_dir / RELAY_SOCKET) as relay:
                relay.inside_origin = f"http://127.0.0.1:{PUMP_PORT}"
                report = self._run_setup(request, files, relay_dir, out, relay)
                if relay.requests == 0 and not report.ok:
                    report.reason += " (the package mirror was never reached)"
                elif relay.errors and not report.ok:
                    report.reason += f" ({relay.errors[0]})"
            if not report.ok:
                return report
            _settle(out)
            meta = {"key": key, "plan": request.plan.to_dict(), "built_at": time.time(), "scope": request.scope}
            (staging / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
            out.rename(staging / "env")
            shutil.rmtree(files)
            shutil.rmtree(relay_dir, ignore_errors=True)
            staging.rename(root / key)  # the whole entry appears at once
            return EnvironmentReport(True, built=True, key=key, path=root / key / "env")
        finally:
            if staging.exists():
                workspace_pool.remove_workspace(staging)

    def _run_setup(
        self, request: SetupRequest, files: Path, relay_dir: Path, out: Path, relay: IndexRelay
    ) -> EnvironmentReport:
        s = self.settings
        mounts = SetupMounts(
            env_size_bytes=parse_quantity(s.environment_size),
            files=str(files),
            relay=str(relay_dir),
            out=str(out),
            tools=_tools(),
        )
        env = setup_env(relay.inside_index_url(), request)
        try:
            with closing(self.open_setup(request.workspace, mounts, env, request.image)) as box:
                built = box.run_command(f"bash {SETUP_FILES_DIR}/{SCRIPT}", timeout=s.environment_timeout_seconds)
                log = self.redact(built.log)
                if built.timed_out:
                    return failed(f"the setup phase ran past FROGFIX_ENVIRONMENT_TIMEOUT_SECONDS "
                                  f"({s.environment_timeout_seconds:g} s)", log)
                if built.exit_code != 0:
                    return failed(f"installing the declared dependencies failed (exit {built.exit_code})"
                                  f"{_first_error(log)}", log)
                copied = box.run_command(f"bash {SETUP_FILES_DIR}/{SAVE_SCRIPT}", timeout=600)
                if copied.exit_code != 0:
                    return failed(f"the built environment could not be saved (exit {copied.exit_code})",
                                  self.redact(copied.log))
                box.collect_environment()
        except SandboxError as exc:
            return failed(self.redact(f"the setup sandbox failed: {exc}"))
        return EnvironmentReport(True, built=True)


def _mirror(settings: Settings) -> MirrorURL | None:
    url = settings.pip_index_url.get_secret_value()
    return MirrorURL(url) if url else None


def cache_key(request: SetupRequest, mirror: MirrorURL, settings: Settings) -> str:
    """What determines an environment, hashed (see the module docstring)."""
    digest = hashlib.sha256()
    plan = {k: v for k, v in request.plan.to_dict().items() if k != "detected"}
    parts = {
        "builder": BUILDER_VERSION,
        "scope": request.scope,
        "mirror": mirror.without_credentials(),
        "interpreter": interpreter_identity(settings, request.image),
        "plan": plan,
        "setup_command": request.setup_command,
        "tag": request.tag,
        "size": settings.environment_size,
    }
    digest.update(json.dumps(parts, sort_keys=True).encode())
    for path in sorted(request.plan.inputs):
        digest.update(path.encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update(hashlib.sha256((request.workspace / path).read_bytes()).digest())
    return digest.hexdigest()


def interpreter_identity(settings: Settings, image: str | None = None) -> str:
    """The interpreter the environment is built from: the sandbox image (Kubernetes) or the host's python3."""
    if settings.sandbox == "kubernetes":
        return f"image:{image or settings.sandbox_image}"
    found = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
    if found is None:
        return "python3:none"
    real = os.path.realpath(found)
    st = os.stat(real)
    return f"{real}:{st.st_size}:{int(st.st_mtime)}"


def release_version(tag: str, distance: int) -> str | None:
    """The version setuptools-scm would guess from the last release tag: `1.2.3` on it, `1.2.4.devN` past it."""
    match = re.fullmatch(r"[vV]?(\d+(?:\.\d+)*)", tag)
    if match is None:
        return None
    parts = [int(p) for p in match.group(1).split(".")]
    if distance == 0:
        return ".".join(map(str, parts))
    parts[-1] += 1
    return f"{'.'.join(map(str, parts))}.dev{distance}"


def setup_env(index_url: str, request: SetupRequest) -> dict[str, str]:
    """The setup sandbox's environment: the mirror as the relay serves it, the environment active."""
    env = {
        "PATH": f"{ENV_DIR}/bin:{TOOLS_DIR}:{DEFAULT_PATH}",
        "VIRTUAL_ENV": ENV_DIR,
        "PIP_INDEX_URL": index_url,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
        "UV_INDEX_URL": index_url,
        "UV_NO_CONFIG": "1",
        "UV_CACHE_DIR": "/tmp/uv-cache",
        "UV_LINK_MODE": "copy",
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_NO_PROGRESS": "1",
        "UV_HTTP_TIMEOUT": "120",
        # A pod's workspace volume is root's (fsGroup'd), so git would call it dubious: build backends that
        # read versions from git (setuptools-scm, hatch-vcs) and the save script need it trusted.
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "safe.directory",
        "GIT_CONFIG_VALUE_0": "*",
    }
    if request.version and request.plan.dist_name:
        name = re.sub(r"[-_.]+", "_", request.plan.dist_name).upper()
        env[f"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_{name}"] = request.version
    return env


def build_script(request: SetupRequest) -> str:
    """The setup phase as one script (one command: the runner ends every leftover before the next)."""
    plan = request.plan
    args = ["-r", f"{SETUP_FILES_DIR}/requirements.txt"] if plan.requirements else []
    args += ["-c", f"{SETUP_FILES_DIR}/constraints.txt"] if plan.constraints else []
    args += plan.install_args()
    quoted = " ".join(shlex.quote(a) for a in args)
    lines = [
        "set -u",
        # The pump must not hold the command's output open, or the command would never end.
        # Locally the relay's socket is bound in; on Kubernetes the backend's tunnel already listens.
        f"if [ -S {RELAY_DIR}/{RELAY_SOCKET} ]; then",
        f"  python3 -I -S {SETUP_FILES_DIR}/index_pump.py {PUMP_PORT} {RELAY_DIR}/{RELAY_SOCKET} {READY_FILE}"
        " </dev/null >/dev/null 2>&1 &",
        "  pump=$!",
        "  trap 'kill \"$pump\" 2>/dev/null' EXIT",
        "fi",
        f"for _ in $(seq 1 400); do [ -e {READY_FILE} ] && break; sleep 0.05; done",
        "set -e -o pipefail",
        'echo "frogfix: building the test environment"',
        "if command -v uv >/dev/null; then",
        f"  uv venv --quiet --allow-existing --python \"$(command -v python3)\" {ENV_DIR}",
        f"  {'uv pip install --python ' + ENV_DIR + '/bin/python ' + quoted if quoted else 'true'}",
        "else",
        f"  python3 -m venv {ENV_DIR}",
        f"  {ENV_DIR + '/bin/python -m pip install ' + quoted if quoted else 'true'}",
        "fi",
    ]
    if request.setup_command:
        lines += ['echo "frogfix: running setup_command"', request.setup_command]
    lines += ['echo "frogfix: environment ready"']
    return "\n".join(lines) + "\n"


def _write_files(files: Path, request: SetupRequest) -> None:
    plan = request.plan
    (files / SCRIPT).write_text(build_script(request), encoding="utf-8")
    (files / SAVE_SCRIPT).write_text(SAVE, encoding="utf-8")
    (files / "requirements.txt").write_text("\n".join(plan.requirements) + "\n", encoding="utf-8")
    (files / "constraints.txt").write_text("\n".join(plan.constraints) + "\n", encoding="utf-8")
    shutil.copyfile(index_pump.__file__, files / "index_pump.py")
    for item in files.iterdir():
        item.chmod(0o644)


def _tools() -> tuple[tuple[str, str], ...]:
    """uv for the setup sandbox, where the worker has it (FrogFix's own dependency); else pip builds."""
    import sysconfig

    for candidate in (Path(sysconfig.get_path("scripts")) / "uv", shutil.which("uv")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return (("uv", _reachable_copy(Path(candidate))),)
    return ()


def _reachable_copy(binary: Path) -> str:
    """A copy of `binary` under /tmp that the sandbox's unprivileged uid can reach (once per version)."""
    st = binary.stat()
    folder = Path("/tmp") / f"frogfix-{os.getuid()}" / "tools"
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o711)
    target = folder / f"{binary.name}-{st.st_size}-{int(st.st_mtime)}"
    if not target.exists():
        partial = folder / f".{target.name}.{secrets.token_hex(4)}"
        shutil.copyfile(binary, partial)
        partial.chmod(0o755)
        partial.rename(target)
    return str(target)


def _settle(folder: Path) -> None:
    """The built tree as later sandboxes read it: every file readable, nothing writable but by us, no setid."""
    for path, _, names in os.walk(folder):
        os.chmod(path, 0o755)
        for name in names:
            full = os.path.join(path, name)
            mode = os.lstat(full).st_mode
            if stat.S_ISREG(mode):
                os.chmod(full, 0o755 if mode & stat.S_IXUSR else 0o644)
            elif not stat.S_ISLNK(mode):
                os.unlink(full)  # FIFOs, sockets: nothing an environment needs


def _first_error(log: str) -> str:
    """The installer's own first error line, if it printed one, for the one-line reason.

    uv follows "No solution found when resolving dependencies" with its cause on the next line ("cause:
    Because x was not found in the package registry…", or "╰─▶ Because…" when it draws boxes), which
    names the package: the cause is kept too."""
    lines = [line.strip() for line in log.splitlines()]
    for i, text in enumerate(lines):
        if text.startswith(("error:", "ERROR:", "\u00d7", "Because ")) or "No solution found" in text:
            following = next((line for line in lines[i + 1:] if line), "")
            cause = following.lstrip("\u2570\u2500\u25b6 ")
            if cause.startswith(("cause:", "Caused by:")) or cause != following:
                cause = cause.removeprefix("cause:").removeprefix("Caused by:").strip()
                return f": {text.rstrip(':')}: {cause}"[:302]
            return f": {text}"[:302]
    return ""


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def prune(root: Path, keep_entries: int, keep: str, min_idle_s: float) -> list[str]:
    """Remove the least recently used environments beyond `keep_entries`: never `keep`, none being built,
    and none used within `min_idle_s` (a job's sandboxes may still have it mounted)."""
    now = time.time()
    entries = sorted(
        (p for p in root.iterdir() if p.is_dir() and re.fullmatch(r"[0-9a-f]{64}", p.name) and p.name != keep),
        key=lambda p: p.stat().st_mtime,
    )
    entries = [p for p in entries if now - p.stat().st_mtime > min_idle_s] + [
        p for p in entries if now - p.stat().st_mtime <= min_idle_s
    ]
    removed = []
    for entry in entries[: max(0, len(entries) + 1 - keep_entries)]:
        if now - entry.stat().st_mtime <= min_idle_s:
            break
        fd = os.open(root / f"{entry.name}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            workspace_pool.remove_workspace(entry)
            removed.append(entry.name)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
    return removed
