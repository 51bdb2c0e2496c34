"""What a target repository says about itself: `.frogfix.yml`, or a detected test command.

`.frogfix.yml` (all keys optional):

    test_command: python -m pytest -q      # how to run the tests (no network in the sandbox)
    setup_command: python -m compileall -q .  # run before the tests, also without network
    image: registry.example/python:3.12     # sandbox image (Kubernetes backend)
    protected_paths: ["migrations/**"]      # paths the bot may not change
    test_timeout: 900                       # seconds
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from app.patches import file_diffs

CONFIG_FILE = ".frogfix.yml"
DEFAULT_TEST_TIMEOUT = 900.0
# Paths whose change is always flagged for the reviewer: tests and CI configuration.
ALWAYS_FLAGGED = (
    "tests/**",
    "test/**",
    "**/tests/**",
    "**/test_*.py",
    "**/*_test.py",
    "**/conftest.py",
    ".gitlab-ci.yml",
    ".github/**",
    ".gitea/**",
    ".forgejo/**",
    ".woodpecker*",
    ".drone.yml",
    "Jenkinsfile",
    CONFIG_FILE,
    # where test runners read options that can deselect or skip tests
    "pytest.ini",
    "**/pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "noxfile.py",
)


class RepoConfigError(ValueError):
    """`.frogfix.yml` exists but cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class RepoConfig:
    test_command: str | None = None
    setup_command: str | None = None
    image: str | None = None
    protected_paths: tuple[str, ...] = field(default_factory=tuple)
    test_timeout: float = DEFAULT_TEST_TIMEOUT
    test_command_source: str = "none"  # ".frogfix.yml", "detected: <why>" or "none"


def _text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise RepoConfigError(f"{CONFIG_FILE}: {key} must be a non-empty string")
    return value.strip()


def load_repo_config(workspace: Path) -> RepoConfig:
    """Read `.frogfix.yml` if present, and fill in a detected test command if it names none."""
    path = workspace / CONFIG_FILE
    data: dict[str, Any] = {}
    if path.is_file() and not path.is_symlink():
        if path.stat().st_size > 64 * 1024:
            raise RepoConfigError(f"{CONFIG_FILE} is larger than 64 KiB")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise RepoConfigError(f"{CONFIG_FILE} is not valid YAML: {exc}") from exc
        if loaded is not None and not isinstance(loaded, dict):
            raise RepoConfigError(f"{CONFIG_FILE} must be a mapping of keys to values")
        data = loaded or {}
        unknown = set(data) - {"test_command", "setup_command", "image", "protected_paths", "test_timeout"}
        if unknown:
            raise RepoConfigError(f"{CONFIG_FILE}: unknown keys {sorted(unknown)}")
    protected = data.get("protected_paths") or []
    if not isinstance(protected, list) or not all(isinstance(p, str) and p for p in protected):
        raise RepoConfigError(f"{CONFIG_FILE}: protected_paths must be a list of path patterns")
    timeout = data.get("test_timeout", DEFAULT_TEST_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 1 <= timeout <= 10_800:
        raise RepoConfigError(f"{CONFIG_FILE}: test_timeout must be a number of seconds between 1 and 10800")
    command = _text(data, "test_command")
    source = CONFIG_FILE if command else "none"
    if command is None:
        detected = detect_test_command(workspace)
        if detected:
            command, why = detected
            source = f"detected: {why}"
    return RepoConfig(
        test_command=command,
        setup_command=_text(data, "setup_command"),
        image=_text(data, "image"),
        protected_paths=tuple(protected),
        test_timeout=float(timeout),
        test_command_source=source,
    )


def detect_test_command(workspace: Path) -> tuple[str, str] | None:
    """The usual test command for the repository's kind, with the reason it was chosen."""
    pyproject = workspace / "pyproject.toml"
    if pyproject.is_file():
        try:
            tool = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {})
        except (tomllib.TOMLDecodeError, UnicodeDecodeError):
            tool = {}
        if "pytest" in tool:
            return "python3 -m pytest -q", "pyproject.toml has [tool.pytest]"
    for name in ("pytest.ini", "conftest.py", "tox.ini", "setup.cfg"):
        if (workspace / name).is_file() and (name != "setup.cfg" or "[tool:pytest]" in _read(workspace / name)):
            return "python3 -m pytest -q", f"{name} found"
    if any(workspace.glob("test*/**/test_*.py")) or any(workspace.glob("test_*.py")):
        return "python3 -m pytest -q", "test_*.py files found"
    package = workspace / "package.json"
    if package.is_file():
        try:
            scripts = json.loads(package.read_text(encoding="utf-8")).get("scripts", {})
        except (ValueError, UnicodeDecodeError, AttributeError):
            scripts = {}
        if isinstance(scripts, dict) and "test" in scripts:
            return "npm test", "package.json has a test script"
    if (workspace / "go.mod").is_file():
        return "go test ./...", "go.mod found"
    if (workspace / "Cargo.toml").is_file():
        return "cargo test", "Cargo.toml found"
    makefile = workspace / "Makefile"
    if makefile.is_file() and any(line.startswith("test:") for line in _read(makefile).splitlines()):
        return "make test", "Makefile has a test target"
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def changed_paths(patch: str) -> list[str]:
    """The paths a `git diff` touches (both sides of renames), in order of appearance; quoted names unquoted."""
    paths: list[str] = []
    for diff in file_diffs(patch):
        for path in (diff.old_path, diff.path):
            if path and path not in paths:
                paths.append(path)
    return paths


def matches(path: str, patterns: tuple[str, ...] | list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removeprefix("**/")) for p in patterns)


def review_flags(patch: str, config: RepoConfig) -> list[str]:
    """What a reviewer must look at twice: changed tests, CI configuration, protected paths."""
    flags = []
    for path in changed_paths(patch):
        if matches(path, config.protected_paths):
            flags.append(f"changes protected path {path}")
        elif matches(path, ALWAYS_FLAGGED):
            flags.append(f"changes test or CI file {path}")
    return flags


def _escapes(link: str, target: str) -> bool:
    """Whether a symlink at `link` (repository-relative) with `target` resolves outside the checkout or into .git."""
    if not target or target.startswith("/"):
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
    first = resolved.split("/", 1)[0]
    return first == ".." or first.lower() == ".git"


def refusal_reasons(patch: str, config: RepoConfig, *, allow_binary: bool = False) -> list[str]:
    """Why a patch must not be pushed at all (not merely flagged): each reason names the file.

    Protected paths are the repository's own rule; `.frogfix.yml` is FrogFix's guard rail, which
    only people change (it is always read from the base commit anyway); a symlink out of the
    checkout would point a reviewer's or CI's checkout at their own machine; binary files cannot be
    reviewed in a diff.
    """
    reasons: list[str] = []
    for path in changed_paths(patch):
        if matches(path, config.protected_paths):
            reasons.append(f"changes protected path {path}")
        elif path == CONFIG_FILE:
            reasons.append(f"changes FrogFix's own configuration {CONFIG_FILE} (only people may change it)")
    for diff in file_diffs(patch):
        if diff.symlink:
            target = "\n".join(diff.added)
            if _escapes(diff.path, target):
                reasons.append(f"adds symlink {diff.path} pointing outside the repository ({target[:200]!r})")
        elif diff.binary and not allow_binary and not diff.has("deleted file mode"):
            verb = "adds" if diff.has("new file mode") else "changes"
            reasons.append(f"{verb} binary file {diff.path}")
    return reasons
