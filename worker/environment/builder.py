"""The setup phase: a repository's test environment from the mirror, in two layers, mounted read-only.

Why it is built this way (docs/ENVIRONMENTS.md and docs/SECURITY.md say it for operators):
- **The environment (ENV_DIR) holds only what the mirror served**, and it is what later jobs reuse.
  It is made in three steps, each its own sandbox with no credentials, its own empty network
  namespace and, where it needs the mirror, one way out, the index relay's unix socket (relay.py):
  1. *resolve*: uv resolves what the checkout declares (which may run the project's own build for its
     metadata) and writes the pins; only `name==version` lines and paths inside the checkout are
     accepted from it, so whatever else that build does dies with the sandbox;
  2. *dependencies*: the pins are installed, `--no-deps`, into a fresh virtual environment made from
     the sandbox's own interpreter, in a sandbox with no checkout at all: no code of the project runs
     there. This environment is cached, by the pins (and the interpreter, mirror, project);
  3. *project*: the project's own install (editable: setup.py and what it imports, the build backend
     and `backend-path`, build hooks, local path dependencies) and `setup_command` run offline, in
     each job, with the environment read-only, into the job's own layer (PROJECT_DIR: the editable
     install's files, and the files it generated in the checkout, which are laid into later
     checkouts only where no tracked file is, never as conftest.py, *.pth, sitecustomize.py or
     usercustomize.py: worker/environment/generated.py). The layer dies with the job.
- A checkout that is not an unpatched base (a patch or a round changed its declarations or build
  code, so its key differs) gets layers of its own, used by that checkout's runs and never cached.
- Nothing a build writes reaches the host's disk but what `collect_environment` reads out of the
  sandbox afterwards, with the host stopping at FROGFIX_ENVIRONMENT_SIZE.
- Cached by what determines it: the declared plan, the dependency files' and build code's bytes, the
  interpreter, the mirror (without credentials), `setup_command`, the last release tag, and the
  project (`scope`). Two builds of one environment wait for each other (a file lock).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.attempt_events import AttemptEvent, AttemptEventKind
from app.settings import Settings
from sandbox import index_pump
from sandbox.base import (
    ENV_DIR,
    PROJECT_DIR,
    PROJECT_SITE,
    PUMP_PORT,
    RELAY_SOCKET,
    SETUP_FILES_DIR,
    SandboxError,
    SetupMounts,
    SetupSandbox,
)
from sandbox.quantity import parse_quantity
from worker.environment import generated, javascript, javascript_declared
from worker.environment.build_code import build_code_paths, read_from_folder, resolution_inputs
from worker.environment.declared import DeclarationError, Overrides, Plan, is_python, plan_for
from worker.environment.relay import IndexRelay, MirrorURL, RelayedInstall
from worker.environment.report import EnvironmentReport, StepFailed, failed
from worker.environment.steps import (
    RESOLVED,
    SAVE,
    SAVE_SCRIPT,
    SCRIPT,
    Resolution,
    ResolutionRefused,
    dependencies_script,
    parse_resolution,
    project_script,
    resolve_script,
    setup_env,
)
from worker.git import mirrors, workspace_pool

BUILDER_VERSION = "3"  # part of every key: environments cached before the mirror-only layer (v2) are rebuilt
RESOLVE_SIZE = 16 * 1024**2  # the resolve step keeps only its pins
PROJECT_PTH = "_frogfix_project.pth"  # written by FrogFix into the environment: PROJECT_SITE as a site folder
PROJECT_PTH_LINE = (
    f"import os, site; os.path.isdir({PROJECT_SITE!r}) and site.addsitedir({PROJECT_SITE!r})\n"
)


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
    # The files the project's own install runs and its resolution reads (worker/environment/build_code.py).
    build_code: tuple[str, ...] = ()
    interpreter: str = ""  # `interpreter_identity`: what both keys name the environment's Python by


# (workspace, mounts, environment variables, image, built environment) -> a started setup sandbox
SandboxOpener = Callable[[Path, SetupMounts, dict[str, str], str | None, Path | None], SetupSandbox]


class Environments:
    """One job's environments: one per distinct declaration, each made once (or found in the cache).

    `open_setup` opens a setup-phase sandbox (worker/wiring.py), so both backends serve. `private` is
    the job's own folder for what is never cached (project layers, environments of patched
    declarations); it goes with the job (the caller removes it), else with `close()`.
    """

    def __init__(
        self,
        settings: Settings,
        redact: Callable[[str], str],
        open_setup: SandboxOpener,
        *,
        scope: str,
        source_repository: Callable[[], Path] | None = None,
        on_event: Callable[[AttemptEvent], None] | None = None,
        private: Path | None = None,
    ) -> None:
        self.settings = settings
        self.redact = redact
        self.open_setup = open_setup
        self.scope = scope
        self.source_repository = source_repository
        self.on_event = on_event or (lambda event: None)
        self._mirror = _mirror(settings)
        self.npm_mirror = _npm_mirror(settings)
        self._known: dict[str, EnvironmentReport] = {}
        self._private = private
        self._own_private = private is None
        self._announced = False
        # Attempts side by side share one object: one builds a declaration's layers while the other waits.
        self.lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._mirror is not None

    def close(self) -> None:
        """Remove the job's own layers when this object made their folder (else the job's folder goes)."""
        if self._own_private and self._private is not None:
            workspace_pool.remove_workspace(self._private)
            self._private = None

    def for_checkout(
        self, workspace: Path, test_command: str | None, setup_command: str | None, overrides: Overrides | None,
        commit: str | None = None,
        image: str | None = None,
        trusted: bool = True,
    ) -> EnvironmentReport:
        """The environment for the checkout at `workspace` (ok or not; nothing raises for the repository's faults).

        `trusted`: the checkout is an unpatched base, so what is built from it may be cached."""
        if javascript_declared.wants_environment(workspace, test_command, python=is_python(workspace)):
            return javascript.for_checkout(self, workspace, image, trusted)
        if self._mirror is None:
            why = "FROGFIX_PIP_INDEX_URL is not set: the sandbox image's Python runs the tests"
            return EnvironmentReport(True, reason=why)
        if not is_python(workspace):
            return EnvironmentReport(True, reason="not a Python or JavaScript repository: nothing to build")
        try:
            plan = plan_for(workspace, test_command, overrides)
            read = read_from_folder(workspace)
            build_code = build_code_paths(read, plan.requirement_files)
            build_code += resolution_inputs(read, plan.requirement_files)
        except (DeclarationError, OSError) as exc:
            return failed(self.redact(f"the repository's dependency files cannot be read: {exc}"), built=False)
        tag, version = self._version(commit)
        interpreter = interpreter_identity(self.settings, image)
        request = SetupRequest(workspace, plan, setup_command, self.scope, version, tag, image, build_code, interpreter)
        key = declaration_key(request, self._mirror, self.settings)
        with self.lock:
            if key in self._known:
                return self._known[key]
            started = time.monotonic()
            try:
                report = self._prepared(request, key, trusted)
            except StepFailed as exc:
                report = exc.report
            report.seconds = time.monotonic() - started
            report.detected = list(plan.detected)
            return self.settle_report(key, report)

    def known(self, key: str) -> EnvironmentReport | None:
        """The report of a declaration this job already built (hold `lock`)."""
        return self._known.get(key)

    def settle_report(self, key: str, report: EnvironmentReport) -> EnvironmentReport:
        """Remember a good report for the job's later checkouts and say it on the timeline (hold `lock`)."""
        if report.ok:
            self._known[key] = report
            self.on_event(AttemptEvent(AttemptEventKind.environment, report.line(), report.to_dict()))
        return report

    def locked(self, entry: Path) -> contextlib.AbstractContextManager[None]:
        """The file lock two builds of one environment wait on."""
        return _locked(entry.parent / f"{entry.name}.lock")

    def finish_entry(self, staging: Path, out: Path, key: str, scope: str, extra: dict[str, Any]) -> None:
        """The built tree settled as `staging/env`, its meta beside it; the step's leftovers removed."""
        _settle(out)
        meta = {"builder": BUILDER_VERSION, "key": key, "built_at": time.time(), "scope": scope, **extra}
        (staging / "meta.json").write_text(json.dumps(meta, indent=1), encoding="utf-8")
        out.rename(staging / "env")
        for leftover in ("files", "relay"):
            shutil.rmtree(staging / leftover, ignore_errors=True)

    def prune_cache(self, root: Path, key: str) -> None:
        prune(root, self.settings.environment_cache_entries, key, self.settings.job_timeout_seconds)

    def npm_relay_url(self) -> str:
        """The npm registry as a setup sandbox reaches it (the relay's loopback address, the mirror's path)."""
        assert self.npm_mirror is not None
        return f"http://127.0.0.1:{PUMP_PORT}{self.npm_mirror.path}"

    def _version(self, commit: str | None) -> tuple[str | None, str | None]:
        if commit is None or self.source_repository is None:
            return None, None
        described = mirrors.describe(self.source_repository(), commit)
        return (None, None) if described is None else (described[0], release_version(*described))

    def _prepared(self, request: SetupRequest, key: str, trusted: bool) -> EnvironmentReport:
        root = self.settings.resolved_environment_dir()
        root.mkdir(parents=True, exist_ok=True)
        self._announced = False
        resolution, resolved_cached = self._resolution(request, key, trusted, root)
        env_key = dependencies_key(request, resolution, self._mirror_url, self.settings)
        env, cached = self._dependencies(request, resolution, env_key, trusted, root)
        report = EnvironmentReport(True, built=True, cached=cached and resolved_cached, key=env_key, path=env)
        if resolution.local or request.setup_command:
            began = time.monotonic()
            report.project = self._project(request, resolution, key, env)
            report.project_seconds = time.monotonic() - began
        return report

    def building(self) -> None:
        """Say once per environment that it is being built (its first step that is not cached)."""
        if not self._announced:
            self._announced = True
            building = "building the test environment from the package mirror"
            self.on_event(AttemptEvent(AttemptEventKind.environment_building, building))

    @property
    def _mirror_url(self) -> MirrorURL:
        assert self._mirror is not None
        return self._mirror

    def private_folder(self) -> Path:
        """The job's own folder for what is never cached (made on first use, reachable by the sandbox)."""
        if self._private is None:
            base = self.settings.resolved_environment_dir() / ".jobs"
            base.mkdir(parents=True, exist_ok=True)
            base.chmod(0o755)
            self._private = base / secrets.token_hex(8)
        self._private.mkdir(parents=True, exist_ok=True)
        self._private.chmod(0o755)
        return self._private

    # -- step 1: resolve ----------------------------------------------------------------------

    def _resolution(self, request: SetupRequest, key: str, trusted: bool, root: Path) -> tuple[Resolution, bool]:
        """The pins for this declaration: the cached ones of an unpatched base, else resolved now."""
        saved = root / "resolved" / f"{key}.json"
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            data = json.loads(saved.read_text(encoding="utf-8"))
            if data.get("builder") == BUILDER_VERSION:
                return Resolution(tuple(data["pins"]), tuple(data["local"])), True
        self.building()
        try:
            script = resolve_script(request.workspace, request.plan)
        except ValueError as exc:
            raise StepFailed(failed(str(exc), built=False)) from None
        with self.staging("resolve") as staging:
            out = self.run_setup(
                "installing the declared dependencies", request.workspace, staging, script,
                relay=True, size=RESOLVE_SIZE, image=request.image,
            )
            resolution = _read_resolution(out / RESOLVED, request.plan.project)
        for folder in resolution.local:  # a real folder of the checkout, reached through no link
            here = request.workspace
            for part in [] if folder == "." else folder.split("/"):
                here = here / part
                if here.is_symlink() or not here.is_dir():
                    raise StepFailed(failed(f"the resolved dependencies name {folder!r}, not a folder of the checkout"))
        if trusted:
            saved.parent.mkdir(exist_ok=True)
            partial = saved.with_name(f".{saved.name}.{secrets.token_hex(4)}")
            data = {"builder": BUILDER_VERSION, "pins": resolution.pins, "local": resolution.local}
            partial.write_text(json.dumps(data), encoding="utf-8")
            partial.rename(saved)
            _prune_resolved(saved.parent, 4 * self.settings.environment_cache_entries)
        return resolution, False

    # -- step 2: the mirror's packages ----------------------------------------------------------

    def _dependencies(
        self, request: SetupRequest, resolution: Resolution, key: str, trusted: bool, root: Path
    ) -> tuple[Path, bool]:
        """The environment of the pins: from the cache, else installed; cached only from a trusted checkout."""
        entry = root / key if trusted or (root / key / "env").is_dir() else self.private_folder() / f"env-{key[:16]}"
        with self.locked(entry):
            if (entry / "env").is_dir():
                if entry.parent == root:
                    os.utime(entry)  # the cache's least recently used order
                return entry / "env", True
            self.building()
            empty = self.private_folder() / f"empty-{secrets.token_hex(4)}"
            empty.mkdir(mode=0o755)
            empty.chmod(0o755)
            try:
                with self.staging("dependencies", entry.parent) as staging:
                    out = self.run_setup(
                        "installing the declared dependencies", empty, staging, dependencies_script(resolution),
                        relay=True, size=parse_quantity(self.settings.environment_size), image=request.image,
                    )
                    _add_project_site(out)
                    self.finish_entry(staging, out, key, request.scope, {"pins": list(resolution.pins)})
                    staging.rename(entry)  # the whole entry appears at once
            finally:
                workspace_pool.remove_workspace(empty)
        if entry.parent == root:
            self.prune_cache(root, key)
        return entry / "env", False

    # -- step 3: the project's own install --------------------------------------------------------

    def _project(self, request: SetupRequest, resolution: Resolution, key: str, env: Path) -> Path:
        """The project installed (editable, offline) over `env`, and `setup_command` run, in the job's own layer."""
        layer = self.private_folder() / f"project-{key[:16]}"
        if layer.is_dir():
            return layer
        installing = "installing the project itself (offline, in this job only)"
        self.on_event(AttemptEvent(AttemptEventKind.environment_project, installing))
        with self.staging("project", self.private_folder()) as staging:
            script = project_script(request.plan, resolution, request.setup_command, _scm_version(request))
            out = self.run_setup(
                "the project's own install", request.workspace, staging, script,
                relay=False, size=parse_quantity(self.settings.environment_size), image=request.image,
                environment=env, target=PROJECT_DIR, save=True,
            )
            refused = generated.refused_in(generated.in_layer(out))
            if refused:
                raise StepFailed(failed(
                    f"the project's install generated {refused} in the checkout: FrogFix never lays a conftest.py, "
                    "*.pth, sitecustomize.py or usercustomize.py into a checkout (it would run in every test run)"
                ))
            _settle(out)
            out.rename(layer)
        return layer

    # -- one setup sandbox --------------------------------------------------------------------------

    @contextlib.contextmanager
    def staging(self, step: str, parent: Path | None = None) -> Iterator[Path]:
        folder = (parent or self.private_folder()) / f".{step}-{secrets.token_hex(6)}"
        folder.mkdir(mode=0o755)
        folder.chmod(0o755)
        try:
            yield folder
        finally:
            if folder.exists():
                workspace_pool.remove_workspace(folder)

    def run_setup(
        self, what: str, workspace: Path, staging: Path, script: str, *, relay: bool, size: int,
        image: str | None, environment: Path | None = None, target: str = ENV_DIR, save: bool = False,
        install: RelayedInstall | None = None,
    ) -> Path:
        """`script` in a setup sandbox over `workspace`; returns the host folder holding its `target`.

        `install`: another ecosystem's step (its mirror, variables and reading of a failure); else the PyPI
        index's. Raises StepFailed with the reason (the log redacted) when the step fails."""
        s = self.settings
        files, relay_dir, out = staging / "files", staging / "relay", staging / "out"
        for folder in (files, relay_dir, out):
            folder.mkdir(mode=0o755)
            folder.chmod(0o755)
        _write_files(files, script)
        mounts = SetupMounts(
            env_size_bytes=size, files=str(files), relay=str(relay_dir) if relay else None, out=str(out),
            tools=_tools(), target=target,
        )
        with contextlib.ExitStack() as stack:
            index = None
            if relay:
                mirror = install.mirror if install is not None else self._mirror_url
                index = stack.enter_context(IndexRelay(mirror, relay_dir / RELAY_SOCKET, npm=install is not None))
                index.inside_origin = f"http://127.0.0.1:{PUMP_PORT}"
            env = setup_env(index.inside_index_url() if index and install is None else None)
            env.update(install.variables if install is not None else {})
            try:
                with closing(self.open_setup(workspace, mounts, env, image, environment)) as box:
                    built = box.run_command(f"bash {SETUP_FILES_DIR}/{SCRIPT}", timeout=s.environment_timeout_seconds)
                    log = self.redact(built.log)
                    if built.timed_out:
                        raise StepFailed(failed(f"{what} ran past FROGFIX_ENVIRONMENT_TIMEOUT_SECONDS "
                                                f"({s.environment_timeout_seconds:g} s)", log))
                    if built.exit_code != 0:
                        reason = (install.reason(what, log, built.exit_code) if install is not None
                                  else f"{what} failed (exit {built.exit_code}){_first_error(log)}")
                        if index is not None and index.requests == 0:
                            reason += " (the package mirror was never reached)"
                        elif index is not None and index.errors:
                            reason += f" ({index.errors[0]})"
                        raise StepFailed(failed(reason, log))
                    if save:
                        copied = box.run_command(f"bash {SETUP_FILES_DIR}/{SAVE_SCRIPT}", timeout=600)
                        if copied.exit_code != 0:
                            raise StepFailed(failed(f"the files {what} generated could not be saved "
                                                    f"(exit {copied.exit_code})", self.redact(copied.log)))
                    box.collect_environment()
            except SandboxError as exc:
                raise StepFailed(failed(self.redact(f"{what} failed: the setup sandbox: {exc}"))) from None
        return out



def _mirror(settings: Settings) -> MirrorURL | None:
    url = settings.pip_index_url.get_secret_value()
    return MirrorURL(url) if url else None


def _npm_mirror(settings: Settings) -> MirrorURL | None:
    url = settings.npm_registry_url.get_secret_value()
    return MirrorURL(url, setting="FROGFIX_NPM_REGISTRY_URL") if url else None


def declaration_key(request: SetupRequest, mirror: MirrorURL, settings: Settings) -> str:
    """What the checkout declares and runs to install itself, hashed (see the module docstring)."""
    digest = hashlib.sha256()
    plan = {k: v for k, v in request.plan.to_dict().items() if k != "detected"}
    parts = {
        "builder": BUILDER_VERSION,
        "scope": request.scope,
        "mirror": mirror.without_credentials(),
        "interpreter": request.interpreter,
        "plan": plan,
        "setup_command": request.setup_command,
        "tag": request.tag,
        "size": settings.environment_size,
    }
    digest.update(json.dumps(parts, sort_keys=True).encode())
    for path in sorted(set(request.plan.inputs) | set(request.build_code)):
        digest.update(path.encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update(hashlib.sha256((request.workspace / path).read_bytes()).digest())
    return digest.hexdigest()


def dependencies_key(request: SetupRequest, resolution: Resolution, mirror: MirrorURL, settings: Settings) -> str:
    """The environment of the mirror's packages: what the pins, the interpreter and the mirror make."""
    parts = {
        "builder": BUILDER_VERSION,
        "scope": request.scope,
        "mirror": mirror.without_credentials(),
        "interpreter": request.interpreter,
        "pins": sorted(resolution.pins),
        "size": settings.environment_size,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


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


def _scm_version(request: SetupRequest) -> dict[str, str]:
    """The version from the last release tag, for setuptools-scm and hatch-vcs (a checkout has no tags)."""
    if request.version and request.plan.dist_name:
        name = re.sub(r"[-_.]+", "_", request.plan.dist_name).upper()
        return {f"SETUPTOOLS_SCM_PRETEND_VERSION_FOR_{name}": request.version}
    return {}


def _read_resolution(path: Path, project: bool) -> Resolution:
    """The pins the resolve step left (a regular file of bounded size), parsed strictly."""
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > RESOLVE_SIZE:
            raise OSError("not a regular file within its size")
        return parse_resolution(path.read_text(encoding="utf-8"), project)
    except (OSError, UnicodeDecodeError) as exc:
        raise StepFailed(failed(f"resolving the declared dependencies left no readable pins ({exc})")) from None
    except ResolutionRefused as exc:
        raise StepFailed(failed(str(exc))) from None


def _write_files(files: Path, script: str) -> None:
    (files / SCRIPT).write_text(script, encoding="utf-8")
    (files / SAVE_SCRIPT).write_text(SAVE, encoding="utf-8")
    shutil.copyfile(index_pump.__file__, files / "index_pump.py")
    for item in files.iterdir():
        item.chmod(0o644)


def _add_project_site(env: Path) -> None:
    """FrogFix's own .pth in the environment: the job's project layer (PROJECT_SITE) is a site folder too."""
    for site in env.glob("lib/python3*/site-packages"):
        if site.is_dir() and not site.is_symlink():
            target = site / PROJECT_PTH
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            target.write_text(PROJECT_PTH_LINE, encoding="utf-8")


def _tools() -> tuple[tuple[str, str], ...]:
    """uv for the setup sandbox (FrogFix's own dependency): every step runs it."""
    import sysconfig

    for candidate in (Path(sysconfig.get_path("scripts")) / "uv", shutil.which("uv")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return (("uv", _reachable_copy(Path(candidate))),)
    raise StepFailed(failed("uv (one of FrogFix's own dependencies) is not installed on the worker", built=False))


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


def _prune_resolved(folder: Path, keep: int) -> None:
    """The saved pins beyond the `keep` newest (each a small file; an environment's own key is its pins)."""
    saved = sorted(folder.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in saved[keep:]:
        with contextlib.suppress(OSError):
            path.unlink()


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
