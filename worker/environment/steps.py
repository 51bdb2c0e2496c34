"""The setup phase's three steps as scripts, and the one thing read back from a step: the pins.

Each script is one command in a setup sandbox (the runner ends every leftover process before the
next), run by bash from SETUP_FILES_DIR; uv is FrogFix's own copy at TOOLS_DIR/uv (never one the
checkout or the environment could hold). worker/environment/builder.py runs them and says why
there are three.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

from sandbox.base import (
    DEFAULT_PATH,
    ENV_DIR,
    PROJECT_GENERATED,
    PROJECT_SITE,
    PUMP_PORT,
    READY_FILE,
    RELAY_DIR,
    RELAY_SOCKET,
    SETUP_FILES_DIR,
    TOOLS_DIR,
)
from worker.environment.declared import MAX_DECLARATION_BYTES, Plan

SCRIPT = "build.sh"
SAVE_SCRIPT = "save.sh"
RESOLVED = "resolved.txt"
MAX_PINS = 5_000
UV = f"{TOOLS_DIR}/uv"
# Kept from what the project's install wrote into the checkout: files git ignores, less caches and build output.
NOT_GENERATED = (
    r"(^|/)(__pycache__|\.pytest_cache|\.mypy_cache|\.tox|\.nox|\.venv|\.eggs|build|dist|[^/]*\.egg-info)(/|$)"
    r"|\.py[co]$"
)
# The checkout's git config may be the build's by now: no fsmonitor hook or untracked cache of its runs.
SAVE = f"""set -e -o pipefail
mkdir -p {PROJECT_GENERATED}
GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null git -c core.fsmonitor=false -c core.untrackedCache=false \\
  ls-files -z --others --ignored --exclude-standard 2>/dev/null \\
  | {{ grep -zvE '{NOT_GENERATED}' || true; }} | xargs -0 -r cp -a --parents -t {PROJECT_GENERATED}/
"""
_PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}==[A-Za-z0-9][A-Za-z0-9.+!_-]{0,99}")
_EDITABLE = re.compile(r"(?:-e|--editable)\s+(\S+)")
_LOCAL_NAMED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:\[[A-Za-z0-9._,-]*\])?\s*@\s*(file:\S+)")


class ResolutionRefused(ValueError):
    """The resolve step's output is not pins FrogFix installs; the message says which line."""


@dataclass(frozen=True)
class Resolution:
    """What the resolve step found: the mirror's packages, pinned, and the checkout's own folders to install."""

    pins: tuple[str, ...]
    local: tuple[str, ...]  # folders inside the checkout, relative to it ("." for the project)


def setup_env(index_url: str | None) -> dict[str, str]:
    """A setup sandbox's environment: the mirror as the relay serves it (None: offline), the environment active."""
    env = {
        "PATH": f"{ENV_DIR}/bin:{TOOLS_DIR}:{DEFAULT_PATH}",
        "VIRTUAL_ENV": ENV_DIR,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "PIP_NO_INPUT": "1",
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
    if index_url is None:
        env.update({"UV_OFFLINE": "1", "PIP_NO_INDEX": "1"})
    else:
        env.update({"PIP_INDEX_URL": index_url, "UV_INDEX_URL": index_url})
    return env


def pump_lines() -> list[str]:
    """The loopback pump to the relay, started by the system's python3 (never the environment's); it must
    not hold the command's output open, or the command would never end. Locally the relay's socket is
    bound in; on Kubernetes the backend's tunnel already listens."""
    return [
        "set -u",
        f"if [ -S {RELAY_DIR}/{RELAY_SOCKET} ]; then",
        f"  PATH={DEFAULT_PATH} python3 -I -S {SETUP_FILES_DIR}/index_pump.py {PUMP_PORT} {RELAY_DIR}/{RELAY_SOCKET}"
        f" {READY_FILE} </dev/null >/dev/null 2>&1 &",
        "  pump=$!",
        "  trap 'kill \"$pump\" 2>/dev/null' EXIT",
        "fi",
        f"for _ in $(seq 1 400); do [ -e {READY_FILE} ] && break; sleep 0.05; done",
        "set -e -o pipefail",
    ]


def _heredoc(path: str, text: str) -> str:
    mark = "FROGFIX_END_OF_INPUT"
    if any(line.strip() == mark for line in text.splitlines()):
        raise ValueError("a declared requirement holds the input's end mark")
    return f"cat > {path} <<'{mark}'\n{text}{mark}"


def resolve_script(workspace: Path, plan: Plan) -> str:
    """Step 1: what the checkout declares, and its build requirements, resolved into pins at ENV_DIR/RESOLVED."""
    lines = [f"-r /workspace/{path}" for path in plan.requirement_files] + list(plan.requirements)
    if plan.project:
        lines.append("-e /workspace" + (f"[{','.join(plan.extras)}]" if plan.extras else ""))
        lines += build_requirements(workspace)
    script = [*pump_lines(), 'echo "frogfix: resolving the declared dependencies"']
    script.append(_heredoc("/tmp/frogfix-resolve.in", "\n".join(lines) + "\n"))
    constraints = ""
    if plan.constraints:
        script.append(_heredoc("/tmp/frogfix-constraints.txt", "\n".join(plan.constraints) + "\n"))
        constraints = "-c /tmp/frogfix-constraints.txt "
    script.append(
        f'{UV} pip compile --quiet --no-header --no-annotate --python "$(command -v python3)" {constraints}'
        f"-o {ENV_DIR}/{RESOLVED} /tmp/frogfix-resolve.in"
    )
    return "\n".join(script) + "\n"


def dependencies_script(resolution: Resolution) -> str:
    """Step 2: the pins into a fresh environment; this sandbox has no checkout."""
    script = [*pump_lines(), 'echo "frogfix: installing the declared dependencies"']
    script.append(f'{UV} venv --quiet --allow-existing --python "$(command -v python3)" {ENV_DIR}')
    if resolution.pins:
        script.append(_heredoc("/tmp/frogfix-pins.txt", "\n".join(resolution.pins) + "\n"))
        script.append(f"{UV} pip install --python {ENV_DIR}/bin/python --no-deps -r /tmp/frogfix-pins.txt")
    script.append('echo "frogfix: environment ready"')
    return "\n".join(script) + "\n"


def project_script(plan: Plan, resolution: Resolution, setup_command: str | None, env: dict[str, str]) -> str:
    """Step 3: the project's own install, offline, into PROJECT_SITE; then `setup_command`."""
    args: list[str] = []
    for path in resolution.local:
        extras = plan.extras if path == "." else ()
        args += ["-e", path + (f"[{','.join(extras)}]" if extras else "")]
    script = ["set -e -o pipefail", *(f"export {k}={shlex.quote(v)}" for k, v in env.items())]
    if args:
        script.append('echo "frogfix: installing the project itself (offline)"')
        script.append(
            f"{UV} pip install --python {ENV_DIR}/bin/python --offline --no-deps --no-build-isolation "
            f"--target {PROJECT_SITE} {' '.join(shlex.quote(a) for a in args)}"
        )
    if setup_command:
        script += ['echo "frogfix: running setup_command"', setup_command]
    script.append('echo "frogfix: project installed"')
    return "\n".join(script) + "\n"


# What a backend's `get_requires_for_build_editable` adds to `requires` (asked of the backend, it would run
# the project's code, and step 3 has no mirror to fetch it from): installed with the build requirements.
EDITABLE_EXTRAS = {"hatchling": ["editables"], "setuptools": ["wheel"]}


def build_requirements(workspace: Path) -> list[str]:
    """The project's `[build-system] requires` (read as text; else setuptools) and what its backend adds
    for an editable build: what its install needs, offline."""
    requires: list[str] = []
    backend = "setuptools"
    path = workspace / "pyproject.toml"
    with contextlib.suppress(OSError, ValueError):
        if path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_DECLARATION_BYTES:
            system = tomllib.loads(path.read_text(encoding="utf-8")).get("build-system")
            if isinstance(system, dict):
                found = system.get("requires")
                requires = [r for r in found if isinstance(r, str) and r.strip()] if isinstance(found, list) else []
                if isinstance(system.get("build-backend"), str):
                    backend = system["build-backend"].split(".", 1)[0].split(":", 1)[0].strip()
    return (requires or ["setuptools"]) + EDITABLE_EXTRAS.get(backend, [])


def parse_resolution(text: str, project: bool) -> Resolution:
    """The resolve step's pins, strictly: `name==version` of the mirror, or a folder inside the checkout.

    The resolution may have run the project's build, so anything else (a URL, an index option, a
    path outside the checkout) is refused rather than installed."""
    pins: list[str] = []
    local: list[str] = ["."] if project else []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if _PIN.fullmatch(line):
            pins.append(line)
            continue
        named = _EDITABLE.fullmatch(line) or _LOCAL_NAMED.fullmatch(line)
        folder = inside_checkout(named.group(1)) if named else None
        if folder is None:
            raise ResolutionRefused(
                f"the resolved dependencies name {line[:200]!r}, which is neither a package of the mirror "
                "(name==version) nor a folder of the checkout"
            )
        if folder not in local:
            local.append(folder)
    if len(pins) > MAX_PINS:
        raise ResolutionRefused(f"the resolved dependencies name more than {MAX_PINS} packages")
    return Resolution(tuple(pins), tuple(local))


_LOCAL_PATH = re.compile(r"[A-Za-z0-9_./-]+")


def inside_checkout(where: str) -> str | None:
    """`where` (a path or file: URL from the resolution) as a folder relative to /workspace; None for anything
    else: outside it, a VCS or other URL, a host in a file: URL, an option, characters beyond a plain path's.
    The builder checks on the host that it is a real folder of the checkout."""
    where = where.split("[", 1)[0]
    if where.startswith("file://"):
        host, _, rest = where.removeprefix("file://").partition("/")
        if host not in ("", "localhost"):
            return None
        where = "/" + rest
    elif where.startswith("file:"):
        where = where.removeprefix("file:")
    if not _LOCAL_PATH.fullmatch(where) or where.startswith("-") or ".." in where.split("/"):
        return None
    if not where.startswith("/"):
        where = "/workspace/" + where
    normal = os.path.normpath(where)
    if normal == "/workspace":
        return "."
    return normal.removeprefix("/workspace/") if normal.startswith("/workspace/") else None
