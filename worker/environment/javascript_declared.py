"""What a JavaScript or TypeScript checkout declares for its install, read as text only (never run).

- the package manager: `packageManager` in package.json, else the lockfile (npm with package-lock.json
  or npm-shrinkwrap.json, pnpm with pnpm-lock.yaml, Yarn classic or Berry with yarn.lock, told apart by
  the lockfile's own header), each with the version it names or one FrogFix pins for that lockfile;
- the files the install reads (package.json files of the root and its workspaces, the lockfile, the
  package managers' rc files, patch folders), which are all a setup sandbox gets of the checkout;
- dependencies the mirror cannot serve (a `git+`/GitHub source, a tarball on another host, a local
  file outside the checkout), named so the environment ends saying which;
- the Node version the repository asks for (`engines.node`, `.nvmrc`, `.node-version`).

Why text only: the install's cached layer must hold only what the mirror served, so nothing of the
repository runs before it (docs/ENVIRONMENTS.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOCKFILES = {
    "package-lock.json": "npm",
    "npm-shrinkwrap.json": "npm",
    "pnpm-lock.yaml": "pnpm",
    "yarn.lock": "yarn",
}
# The package manager each kind installs with when package.json names none (from the mirror, never the internet).
DEFAULT_VERSIONS = {"pnpm": "10.28.0", "yarn": "1.22.22", "yarn-berry": "4.5.3"}
# The npm package that carries each package manager (Yarn Berry's standalone build is @yarnpkg/cli-dist).
PACKAGES = {"pnpm": "pnpm", "yarn": "yarn", "yarn-berry": "@yarnpkg/cli-dist"}
# Hosts of the public registry that lockfiles write into every entry: their paths are the mirror's too.
PUBLIC_REGISTRIES = ("registry.npmjs.org", "registry.yarnpkg.com", "registry.npmjs.com")
# What a package manager reads besides package.json and the lockfile. Nothing executable: a pnpmfile or a
# Yarn plugin is the repository's code and is never given to the install.
RC_FILES = (".npmrc", ".yarnrc", ".yarnrc.yml", "pnpm-workspace.yaml")
PATCH_FOLDERS = ("patches", ".yarn/patches")
MAX_FILE = 64 * 1024**2  # a lockfile of a large monorepo is tens of MB
MAX_WORKSPACES = 2_000
NODE_FILES = (".nvmrc", ".node-version")
_VERSION = re.compile(r"\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?")


class JavaScriptDeclarationError(Exception):
    """The checkout's package files cannot be read or name something the mirror cannot serve."""


@dataclass(frozen=True)
class PackageManager:
    """The package manager the install uses: kind (npm, pnpm, yarn, yarn-berry) and version."""

    kind: str
    version: str  # "" for npm: the one that comes with the sandbox's Node

    @property
    def package(self) -> str:
        return PACKAGES.get(self.kind, "")

    def shown(self) -> str:
        name = "yarn" if self.kind == "yarn-berry" else self.kind
        return f"{name} {self.version}" if self.version else f"{name} (the sandbox's)"


@dataclass(frozen=True)
class JavaScriptPlan:
    """What to install for one checkout, and what the environment line reports."""

    manager: PackageManager
    lockfile: str
    files: tuple[str, ...]  # the checkout's files the install reads (relative, regular files)
    workspaces: tuple[str, ...]  # the workspace packages' folders (relative), the root excluded
    node_wanted: str = ""  # what the repository asks for, as it wrote it
    node_source: str = ""  # where it asked (engines.node, .nvmrc, .node-version)
    detected: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "manager": [self.manager.kind, self.manager.version],
            "lockfile": self.lockfile,
            "files": list(self.files),
            "workspaces": list(self.workspaces),
        }


def is_javascript(workspace: Path) -> bool:
    """Whether the checkout is a JavaScript or TypeScript project FrogFix builds an environment for."""
    return _regular(workspace / "package.json")


def plan_for(workspace: Path, mirror_host: str = "") -> JavaScriptPlan:
    """The install's plan; JavaScriptDeclarationError names what cannot be read or served (`mirror_host`: the
    mirror's own host, which a lockfile may name beside the public registry's)."""
    package = read_json(workspace, "package.json")
    lockfile = next((name for name in LOCKFILES if _regular(workspace / name)), "")
    if not lockfile:
        raise JavaScriptDeclarationError(
            "package.json has no lockfile beside it (package-lock.json, pnpm-lock.yaml or yarn.lock): FrogFix installs "
            "only the versions a lockfile pins"
        )
    manager = package_manager(package, lockfile, read_text(workspace, lockfile))
    workspaces = workspace_folders(workspace, package)
    files = ["package.json", lockfile]
    files += [f"{folder}/package.json" for folder in workspaces]
    files += [name for name in RC_FILES if _regular(workspace / name)]
    files += [path for folder in PATCH_FOLDERS for path in _files_under(workspace, folder)]
    declared = [package, *(read_json(workspace, f"{w}/package.json") for w in workspaces)]
    foreign = foreign_sources(workspace, lockfile, declared, mirror_host)
    if foreign:
        raise JavaScriptDeclarationError(
            f"{foreign[0]}: the package mirror cannot serve it (FrogFix installs from the npm registry mirror only)"
        )
    wanted, source = node_wanted(workspace, package)
    detected = [f"{manager.shown()} from {'packageManager' if package.get('packageManager') else lockfile}"]
    if workspaces:
        detected.append(f"{len(workspaces)} workspace package(s)")
    return JavaScriptPlan(manager, lockfile, tuple(files), tuple(workspaces), wanted, source, tuple(detected))


def package_manager(package: dict[str, Any], lockfile: str, lock_text: str) -> PackageManager:
    """From `packageManager` (`pnpm@10.28.0+sha512…`) when it agrees with the lockfile, else from the lockfile."""
    from_lock = LOCKFILES[lockfile]
    if from_lock == "yarn" and "__metadata:" in lock_text[:4096]:
        from_lock = "yarn-berry"
    declared = package.get("packageManager")
    if isinstance(declared, str) and "@" in declared:
        name, _, rest = declared.partition("@")
        version = rest.split("+", 1)[0]
        if not _VERSION.fullmatch(version):
            raise JavaScriptDeclarationError(f"package.json's packageManager {declared!r} names no exact version")
        kind = "yarn-berry" if name == "yarn" and not version.startswith("1.") else name
        if kind not in ("npm", "pnpm", "yarn", "yarn-berry"):
            raise JavaScriptDeclarationError(f"package.json's packageManager names {name!r}, which FrogFix cannot run")
        if kind == from_lock or (kind == "npm" and from_lock == "npm"):
            return PackageManager(kind, "" if kind == "npm" else version)
    if from_lock == "npm":
        return PackageManager("npm", "")
    return PackageManager(from_lock, DEFAULT_VERSIONS[from_lock])


def workspace_folders(workspace: Path, package: dict[str, Any]) -> list[str]:
    """The workspace packages' folders: package.json `workspaces` (a list or `{packages: [...]}`) or
    pnpm-workspace.yaml's `packages`, globs of one `*` per segment or `**` expanded over real folders."""
    patterns: list[str] = []
    declared = package.get("workspaces")
    if isinstance(declared, dict):
        declared = declared.get("packages")
    if isinstance(declared, list):
        patterns += [p for p in declared if isinstance(p, str)]
    if _regular(workspace / "pnpm-workspace.yaml"):
        patterns += _pnpm_workspace_packages(read_text(workspace, "pnpm-workspace.yaml"))
    found: list[str] = []
    excluded = {p[1:].strip("/") for p in patterns if p.startswith("!")}
    for pattern in (p.strip().strip("/").removeprefix("./") for p in patterns if not p.startswith("!")):
        for folder in _glob_folders(workspace, pattern):
            wanted = folder not in found and folder not in excluded and folder != "."
            if wanted and _regular(workspace / folder / "package.json"):
                found.append(folder)
                if len(found) > MAX_WORKSPACES:
                    raise JavaScriptDeclarationError(f"more than {MAX_WORKSPACES} workspace packages")
    return sorted(found)


def _pnpm_workspace_packages(text: str) -> list[str]:
    """pnpm-workspace.yaml's `packages:` list, read line by line (its list is plain YAML scalars)."""
    patterns, inside = [], False
    for line in text.splitlines():
        if re.match(r"^packages\s*:", line):
            inside = True
            continue
        if inside:
            item = re.match(r"^\s+-\s*['\"]?([^'\"#]+?)['\"]?\s*(?:#.*)?$", line)
            if item:
                patterns.append(item.group(1))
            elif line.strip() and not line.startswith((" ", "\t", "#")):
                break
    return patterns


def _glob_folders(workspace: Path, pattern: str) -> Iterator[str]:
    if not pattern or ".." in pattern.split("/"):
        return
    root = workspace.resolve()
    for candidate in sorted(workspace.glob(pattern)):
        if candidate.is_symlink() or not candidate.is_dir():
            continue
        try:
            relative = candidate.resolve().relative_to(root)
        except ValueError:
            continue
        if "node_modules" not in relative.parts:
            yield relative.as_posix()


_GIT_SPEC = re.compile(r"^(?:git\+|git://|github:|gitlab:|bitbucket:|gist:|[\w.-]+/[\w.-]+(?:#.*)?$)")
_URL = re.compile(r"https?://[^\s\"',}]+")
# The lockfile lines that say where a package is downloaded from: npm's `resolved`, Yarn classic's
# `resolved`, pnpm's `tarball:`/`repo:`, Yarn Berry's `resolution:` (an npm: resolution names no URL).
_SOURCE_LINE = re.compile(r"\b(?:resolved|tarball|repo|resolution)\b")


def foreign_sources(workspace: Path, lockfile: str, packages: list[dict[str, Any]], mirror_host: str = "") -> list[str]:
    """Dependencies the npm mirror cannot serve, each as `name (source)`: what package.json files declare
    (`git+…`, `user/repo`, an http URL) and what the lockfile resolved to on a host other than the registry."""
    found: list[str] = []
    for package in packages:
        for table in ("dependencies", "devDependencies", "optionalDependencies"):
            deps = package.get(table)
            for name, spec in (deps.items() if isinstance(deps, dict) else []):
                if isinstance(spec, str) and (_GIT_SPEC.match(spec) or spec.startswith(("http://", "https://"))):
                    found.append(f"{name} ({spec[:200]})")
    text = read_text(workspace, lockfile)
    for line in text.splitlines():
        if not _SOURCE_LINE.search(line):
            continue  # funding and repository URLs name no download
        if re.search(r"(?:git\+ssh|git\+https?|git)://|codeload\.github\.com|github:", line):
            found.append(f"a git dependency in {lockfile}: {line.strip()[:200]}")
            continue
        for url in _URL.findall(line):
            host = url.split("/", 3)[2].split("@")[-1].split(":")[0].lower()
            if host not in PUBLIC_REGISTRIES and host != mirror_host.lower():
                found.append(f"a dependency at {url[:200]} ({lockfile})")
    return found


def node_wanted(workspace: Path, package: dict[str, Any]) -> tuple[str, str]:
    """The Node version the repository asks for, and where: `.nvmrc`, `.node-version`, else `engines.node`."""
    for name in NODE_FILES:
        if _regular(workspace / name):
            wanted = read_text(workspace, name).strip().splitlines()
            if wanted and wanted[0].strip():
                return wanted[0].strip()[:100], name
    engines = package.get("engines")
    if isinstance(engines, dict) and isinstance(engines.get("node"), str):
        return engines["node"][:100], "engines.node"
    return "", ""


def node_satisfies(version: str, wanted: str) -> bool | None:
    """Whether Node `version` (v20.20.2) meets `wanted` (a semver range, `20`, `v18.1`, `lts/*`); None when
    the range is not one this reader understands (the environment line then says nothing of it)."""
    have = _triple(version)
    if have is None:
        return None
    wanted = wanted.strip()
    if wanted.startswith("lts/") or wanted in ("node", "stable", "latest", "*", ""):
        return None
    alternatives = [part.strip() for part in wanted.split("||")]
    verdicts = [_meets_all(have, alternative) for alternative in alternatives]
    if any(v is True for v in verdicts):
        return True
    return None if any(v is None for v in verdicts) else False


def _meets_all(have: tuple[int, int, int], comparators: str) -> bool | None:
    hyphen = re.fullmatch(r"(\S+)\s+-\s+(\S+)", comparators)
    parts = [f">={hyphen.group(1)}", f"<={hyphen.group(2)}"] if hyphen else comparators.split()
    for part in parts:
        match = re.fullmatch(r"(\^|~|>=|<=|>|<|=)?\s*v?(\d+|[xX*])(?:\.(\d+|[xX*]))?(?:\.(\d+|[xX*]))?(?:-\S*)?", part)
        if match is None:
            return None
        op, numbers = match.group(1) or "", [match.group(i) for i in (2, 3, 4)]
        if not _compare(have, op, numbers):
            return False
    return True


def _compare(have: tuple[int, int, int], op: str, numbers: list[str | None]) -> bool:
    given = [int(n) for n in numbers if n is not None and n.isdigit()]
    low = tuple(given + [0] * (3 - len(given)))
    if op in ("", "=") and len(given) < 3:  # `20`, `20.1`, `20.x`: that whole line
        return have[: len(given)] == tuple(given)
    if op == "^":
        first = next((i for i, n in enumerate(low) if n != 0), 2)
        return have >= low and have[: first + 1] == low[: first + 1]
    if op == "~":
        keep = 2 if len(given) >= 2 else 1
        return have >= low and have[:keep] == low[:keep]
    if op in ("<=", ">") and 0 < len(given) < 3:  # `<=20` is below 21.0.0, `>20` from 21.0.0 on
        high = tuple(given[:-1] + [given[-1] + 1] + [0] * (3 - len(given)))
        return have < high if op == "<=" else have >= high
    table = {">=": have >= low, ">": have > low, "<=": have <= low, "<": have < low, "=": have == low, "": have == low}
    return table[op]


def _triple(version: str) -> tuple[int, int, int] | None:
    match = re.match(r"v?(\d+)\.(\d+)\.(\d+)", version.strip())
    return (int(match.group(1)), int(match.group(2)), int(match.group(3))) if match else None


def read_json(workspace: Path, relative: str) -> dict[str, Any]:
    try:
        data = json.loads(read_text(workspace, relative))
    except ValueError as exc:
        raise JavaScriptDeclarationError(f"{relative} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise JavaScriptDeclarationError(f"{relative} is not a JSON object")
    return data


def read_text(workspace: Path, relative: str) -> str:
    path = workspace / relative
    if not _regular(path):
        raise JavaScriptDeclarationError(f"{relative} is not a regular file of the checkout")
    if path.stat().st_size > MAX_FILE:
        raise JavaScriptDeclarationError(f"{relative} is over {MAX_FILE // 1024**2} MB")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise JavaScriptDeclarationError(f"{relative} cannot be read: {exc}") from None


def _files_under(workspace: Path, folder: str) -> list[str]:
    base = workspace / folder
    if base.is_symlink() or not base.is_dir():
        return []
    return sorted(
        path.relative_to(workspace).as_posix()
        for path in base.rglob("*")
        if _regular(path) and not any((workspace / p).is_symlink() for p in path.relative_to(workspace).parents)
    )


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


# The first word of a test command that runs JavaScript (or a package manager that does).
JS_COMMANDS = frozenset({
    "jest", "vitest", "mocha", "node", "npm", "npx", "pnpm", "yarn", "tsx", "ts-node", "ava", "tap", "c8", "nyc",
    "playwright", "karma", "jasmine", "uvu", "bun",
})


def wants_environment(workspace: Path, test_command: str | None, *, python: bool) -> bool:
    """Whether the checkout's tests need a JavaScript environment: it has package.json with something to install,
    and either no Python declarations or a test command that runs JavaScript."""
    if not is_javascript(workspace):
        return False
    if python and not runs_javascript(test_command):
        return False
    try:
        package = read_json(workspace, "package.json")
    except JavaScriptDeclarationError:
        return True  # the builder says what is wrong with it
    tables = ("dependencies", "devDependencies", "optionalDependencies", "workspaces")
    return any(package.get(table) for table in tables)


def runs_javascript(command: str | None) -> bool:
    words = (command or "").replace("&&", " ").replace(";", " ").split()
    while words and "=" in words[0]:
        words = words[1:]
    return bool(words) and (words[0].rsplit("/", 1)[-1] in JS_COMMANDS or "node_modules/.bin/" in words[0])
