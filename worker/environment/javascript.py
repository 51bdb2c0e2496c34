"""A JavaScript or TypeScript repository's test environment: its lockfile installed from the company's npm mirror.

Why it is built this way (docs/ENVIRONMENTS.md says it for operators):
- **One setup sandbox, the mirror its only way out.** It gets none of the checkout but the files the
  install reads (package.json files, the lockfile, the package managers' rc files with every registry,
  credential, proxy and path setting taken out, patch folders): no code of the repository is in it. Its
  only way out is the relay (relay.py) in npm mode: the registry URL's own paths, credentials added on
  the host. The lockfile's public-registry URLs are rewritten to the relay's address first, so Yarn
  classic (which downloads a lockfile's `resolved` URL as written) and npm fetch from the mirror too;
  the lockfile's integrity hashes still decide what is accepted.
- **Frozen, scripts off.** The package manager itself comes from the mirror (`packageManager`'s version,
  or FrogFix's pin for the lockfile) and installs exactly what the lockfile pins, with every lifecycle
  script off: the cached layer holds only what the mirror served.
- **Cached** by what determines it: the install files' bytes, the package manager, the sandbox's Node,
  the mirror and the project. A patch that changes them gets an environment of its own, never cached.
- **Mounted read-only where Node looks.** The environment holds each `node_modules` folder the install
  made (the root's and each workspace package's); every later sandbox of the job gets them bound over
  the checkout at their own places (layout.py), with `node_modules/.bin` and the package manager on PATH.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.settings import Settings
from sandbox.quantity import parse_quantity
from worker.environment.javascript_declared import (
    JavaScriptDeclarationError,
    JavaScriptPlan,
    node_satisfies,
    plan_for,
)
from worker.environment.javascript_install import (
    clean_npmrc,
    clean_pnpm_workspace,
    clean_yarnrc_yml,
    failure_reason,
    install_env,
    install_script,
    rewrite_registry_urls,
    strip_scripts,
)
from worker.environment.layout import CHECKOUT_FOLDER, PM_BIN, WASM_WITHOUT_TRAP_HANDLER, Layout, write_layout
from worker.environment.relay import MirrorURL, RelayedInstall
from worker.environment.report import EnvironmentReport, StepFailed, failed
from worker.git import workspace_pool

BUILDER_VERSION = "js-2"  # js-2: the dependencies' own install scripts run in the cached step
class SetupHost(Protocol):
    """What the JavaScript install needs of the job's environments object (builder.Environments)."""

    settings: Settings
    scope: str
    npm_mirror: MirrorURL | None
    lock: threading.Lock

    def redact(self, text: str) -> str: ...
    def known(self, key: str) -> EnvironmentReport | None: ...
    def settle_report(self, key: str, report: EnvironmentReport) -> EnvironmentReport: ...
    def private_folder(self) -> Path: ...
    def locked(self, entry: Path) -> contextlib.AbstractContextManager[None]: ...
    def building(self) -> None: ...
    def staging(self, step: str, parent: Path | None = None) -> contextlib.AbstractContextManager[Path]: ...
    def run_setup(self, what: str, workspace: Path, staging: Path, script: str, *, relay: bool, size: int,
                  image: str | None, install: RelayedInstall | None = None) -> Path: ...
    def finish_entry(self, staging: Path, out: Path, key: str, scope: str, extra: dict[str, Any]) -> None: ...
    def prune_cache(self, root: Path, key: str) -> None: ...
    def npm_relay_url(self) -> str: ...


@dataclass(frozen=True)
class JavaScriptRequest:
    workspace: Path
    plan: JavaScriptPlan
    scope: str
    node: str  # the sandbox's Node (`node --version`), part of the key
    image: str | None


def for_checkout(
    environments: SetupHost, workspace: Path, image: str | None, trusted: bool
) -> EnvironmentReport:
    """The environment of a JavaScript checkout (ok or not: the repository's faults never raise)."""
    mirror = environments.npm_mirror
    if mirror is None:
        return failed(
            "FROGFIX_NPM_REGISTRY_URL is not set: a JavaScript or TypeScript repository's dependencies come only from "
            "the company's npm registry mirror (set it; doctor's `npm mirror` line checks it)",
            built=False,
        )
    try:
        plan = plan_for(workspace, mirror.host)
    except (JavaScriptDeclarationError, OSError) as exc:
        return failed(environments.redact(f"the repository's package files: {exc}"), built=False)
    request = JavaScriptRequest(workspace, plan, environments.scope, sandbox_node(environments.settings.sandbox), image)
    key = install_key(request, mirror, environments.settings.environment_size)
    with environments.lock:
        known = environments.known(key)
        if known is not None:
            return known
        started = time.monotonic()
        try:
            env, cached = _installed(environments, request, key, trusted, mirror)
            report = EnvironmentReport(True, built=True, cached=cached, key=key, path=env)
            report.note = node_line(request.node, plan)
        except StepFailed as exc:
            report = exc.report
        report.seconds = time.monotonic() - started
        report.detected = list(plan.detected)
        return environments.settle_report(key, report)


def _installed(
    environments: SetupHost, request: JavaScriptRequest, key: str, trusted: bool, mirror: MirrorURL
) -> tuple[Path, bool]:
    """The installed tree: from the cache, else installed now (cached only from an unpatched checkout)."""
    root = environments.settings.resolved_environment_dir()
    root.mkdir(parents=True, exist_ok=True)
    cached = trusted or (root / key / "env").is_dir()
    entry = root / key if cached else environments.private_folder() / f"env-{key[:16]}"
    with environments.locked(entry):
        if (entry / "env").is_dir():
            if entry.parent == root:
                os.utime(entry)
            return entry / "env", True
        environments.building()
        relayed = RelayedInstall(mirror, install_env(environments.npm_relay_url(), node_options(request.node)),
                                 failure_reason)
        files = environments.private_folder() / f"install-{key[:12]}"
        try:
            _lay_install_files(request, files, environments.npm_relay_url(), mirror)
            with environments.staging("dependencies", entry.parent) as staging:
                out = environments.run_setup(
                    "installing the lockfile's packages", files, staging, install_script(request.plan),
                    relay=True, size=parse_quantity(environments.settings.environment_size), image=request.image,
                    install=relayed,
                )
                links = tuple(rel for rel in (".", *request.plan.workspaces) if _real_folder(out, rel))
                if "." not in links:
                    raise StepFailed(failed("the install made no node_modules folder", ""))
                environments.finish_entry(staging, out, key, request.scope, {"manager": request.plan.manager.shown()})
                write_layout(staging, Layout("javascript", links, (PM_BIN,), node_options(request.node)))
                staging.rename(entry)
        finally:
            if files.exists():
                workspace_pool.remove_workspace(files)
    if entry.parent == root:
        environments.prune_cache(root, key)
    return entry / "env", False


def _real_folder(out: Path, rel: str) -> bool:
    here = out / CHECKOUT_FOLDER
    for part in [] if rel == "." else rel.split("/"):
        here = here / part
        if here.is_symlink() or not here.is_dir():
            return False
    folder = here / "node_modules"
    return folder.is_dir() and not folder.is_symlink()


def _lay_install_files(request: JavaScriptRequest, files: Path, registry: str, mirror: MirrorURL) -> None:
    """The install's view of the checkout: its install files only, rc files cleaned, lockfile URLs on the relay."""
    files.mkdir(mode=0o755, parents=True)
    for relative in request.plan.files:
        target = files / relative
        target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        data = (request.workspace / relative).read_bytes()
        name = Path(relative).name
        if relative == request.plan.lockfile:
            data = rewrite_registry_urls(
                data.decode("utf-8"), registry, mirror.spellings, registry.removesuffix(mirror.path)
            ).encode()
        elif name == "package.json":
            data = strip_scripts(data.decode("utf-8", "replace")).encode()
        elif name == ".npmrc":
            data = clean_npmrc(data.decode("utf-8", "replace")).encode()
        elif name == ".yarnrc.yml":
            data = clean_yarnrc_yml(data.decode("utf-8", "replace")).encode()
        elif name == ".yarnrc":
            data = b""  # Yarn classic's rc holds registries and yarn-path only: nothing the install needs
        elif name == "pnpm-workspace.yaml":
            data = clean_pnpm_workspace(data.decode("utf-8", "replace")).encode()
        target.write_bytes(data)
        target.chmod(0o644)
    for folder, _, _ in os.walk(files):
        os.chmod(folder, 0o755)


def install_key(request: JavaScriptRequest, mirror: MirrorURL, size: str) -> str:
    """What determines the installed tree, hashed: the install files' bytes, the plan, Node, the mirror, the project."""
    digest = hashlib.sha256()
    parts = {
        "builder": BUILDER_VERSION,
        "scope": request.scope,
        "mirror": mirror.without_credentials(),
        "node": request.node,
        "plan": request.plan.to_dict(),
        "size": size,
    }
    digest.update(json.dumps(parts, sort_keys=True).encode())
    for path in request.plan.files:
        digest.update(path.encode() + b"\0")
        digest.update(hashlib.sha256((request.workspace / path).read_bytes()).digest())
    return digest.hexdigest()


@functools.lru_cache(maxsize=4)
def sandbox_node(backend: str) -> str:
    """The sandbox's Node version: the host's `node` for the local sandbox (it binds the host's /usr)."""
    if backend == "kubernetes":
        return "image"
    found = shutil.which("node", path="/usr/local/bin:/usr/bin:/bin")
    if found is None:
        return ""
    try:
        done = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip()


def node_line(node: str, plan: JavaScriptPlan) -> str:
    """What the environment line says of Node: the sandbox's version, and a mismatch with what the repository asks."""
    if not node or node == "image":
        return "" if node == "image" else "no Node.js in the sandbox"
    if not plan.node_wanted:
        return f"Node {node}"
    fits = node_satisfies(node, plan.node_wanted)
    if fits is False:
        asked = f"{plan.node_wanted} ({plan.node_source})"
        return f"Node {node}; the repository asks for {asked}: the tests run with {node}"
    return f"Node {node}"


def node_options(node: str) -> str:
    """NODE_OPTIONS for the job's sandboxes: WebAssembly without the trap handler's address-space reservation,
    where the sandbox's Node has the flag (20.15+, 22.2+; an image's Node is taken to be a current LTS)."""
    if node == "image":
        return WASM_WITHOUT_TRAP_HANDLER
    match = re.match(r"v(\d+)\.(\d+)", node)
    if match is None:
        return ""
    major, minor = int(match.group(1)), int(match.group(2))
    has = (major == 20 and minor >= 15) or (major == 22 and minor >= 2) or major >= 23
    return WASM_WITHOUT_TRAP_HANDLER if has else ""
