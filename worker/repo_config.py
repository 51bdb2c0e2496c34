"""What a target repository says about itself: `.frogfix.yml`, or a detected test command.

`.frogfix.yml` (all keys optional):

    test_command: python -m pytest -q      # how to run the tests (no network in the sandbox)
    setup_command: make generated-files    # with FROGFIX_PIP_INDEX_URL: once, in the setup phase, after the
                                           # environment is installed (reaches the mirror only); without a
                                           # mirror: before each test run, without network
    environment:                           # what to install where detection guesses wrong (each key replaces
      extras: [tests]                      # what was detected for it; see worker/environment/declared.py)
      groups: [test]
      requirements: [requirements/test.txt]
      packages: ["pytest<9"]
      project: true
    image: registry.example/python:3.12     # sandbox image (Kubernetes backend)
    protected_paths: ["migrations/**"]      # paths the bot may not change
    test_timeout: 900                       # seconds
    instructions: |                         # guidance for the agent, beside the AGENTS.md files
      Run the tests with `make check`.

Repository guidance: the AGENTS.md files (the root one and those in subfolders; the nearest one
governs the paths below it) and `instructions`, read from the base commit before the agent runs,
so nothing a patch writes there guides the run that wrote it; a patch that changes an AGENTS.md is
flagged for the reviewer instead.
"""

from __future__ import annotations

import difflib
import fnmatch
import json
import os
import posixpath
import re
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from app.patches import shown_path
from worker.ci_config import ANY_YAML_FILE
from worker.environment.declared import Overrides, is_dependency_file
from worker.leaf.prompts import GuidanceFile, RepoGuidance
from worker.patch_evidence import ChangedFile, PatchEvidence
from worker.repos import git_environment

CONFIG_FILE = ".frogfix.yml"
DEFAULT_TEST_TIMEOUT = 900.0
AGENTS_FILE = "AGENTS.md"
# Caps on the guidance given to the agent (characters): a file is cut, files past the total are named only.
MAX_INSTRUCTIONS_CHARS = 4_000
MAX_AGENTS_FILE_CHARS = 8_000
MAX_AGENTS_TOTAL_CHARS = 24_000
MAX_AGENTS_FILES = 32
_KNOWN_KEYS = {
    "test_command", "setup_command", "image", "protected_paths", "test_timeout", "instructions", "environment",
}
DEPENDENCY_NOTE = "a dependency file: the tests ran in an environment built from the patched one"
_ENVIRONMENT_KEYS = {"extras", "groups", "requirements", "packages", "project"}
_EXTRA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# Paths whose change is always flagged for the reviewer: tests and the test runners' configuration.
# CI configuration has its own home (worker/ci_config.py) and is refused unless FROGFIX_ALLOW_CI_CHANGES.
ALWAYS_FLAGGED = (
    "tests/**",
    "test/**",
    "**/tests/**",
    "**/test_*.py",
    "**/*_test.py",
    "**/conftest.py",
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
    instructions: str | None = None
    environment: Overrides | None = None  # `environment:`: what to install where detection guesses wrong


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
        _refuse_unknown(data, _KNOWN_KEYS, "")
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
        instructions=_instructions(data),
        environment=_environment(data.get("environment")),
    )


def _refuse_unknown(data: dict[str, Any], known: set[str], where: str) -> None:
    """An unknown key is an error that names the key it most likely meant."""
    for key in sorted(map(str, data)):
        if key in known:
            continue
        close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
        hint = f"; did you mean {where}{close[0]}?" if close else f"; known keys: {', '.join(sorted(known))}"
        raise RepoConfigError(f"{CONFIG_FILE}: unknown key {where}{key}{hint}")


def _names_list(data: dict[str, Any], key: str, pattern: re.Pattern[str] | None) -> tuple[str, ...] | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
        raise RepoConfigError(f"{CONFIG_FILE}: environment.{key} must be a list of strings")
    if pattern is not None:
        bad = [v for v in value if not pattern.fullmatch(v)]
        if bad:
            raise RepoConfigError(f"{CONFIG_FILE}: environment.{key} has a name that is not one: {bad[0][:80]!r}")
    return tuple(v.strip() for v in value)


def _environment(value: Any) -> Overrides | None:
    """`environment:` (see worker/environment/declared.py `Overrides`)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        keys = ", ".join(sorted(_ENVIRONMENT_KEYS))
        raise RepoConfigError(f"{CONFIG_FILE}: environment must be a mapping ({keys})")
    _refuse_unknown(value, _ENVIRONMENT_KEYS, "environment.")
    requirements = _names_list(value, "requirements", None)
    for path in requirements or ():
        if path.startswith(("/", "-")) or ".." in path.split("/"):
            raise RepoConfigError(
                f"{CONFIG_FILE}: environment.requirements names a path outside the repository: {path[:80]!r}"
            )
    packages = _names_list(value, "packages", None) or ()
    if any(p.startswith("-") or "\n" in p for p in packages):
        raise RepoConfigError(f"{CONFIG_FILE}: environment.packages takes requirement strings, not installer options")
    project = value.get("project")
    if project is not None and not isinstance(project, bool):
        raise RepoConfigError(f"{CONFIG_FILE}: environment.project must be true or false")
    return Overrides(
        extras=_names_list(value, "extras", _EXTRA_NAME),
        groups=_names_list(value, "groups", _EXTRA_NAME),
        requirements=requirements,
        packages=packages,
        project=project,
    )


def _instructions(data: dict[str, Any]) -> str | None:
    text = _text(data, "instructions")
    if text is not None and len(text) > MAX_INSTRUCTIONS_CHARS:
        raise RepoConfigError(
            f"{CONFIG_FILE}: instructions must be at most {MAX_INSTRUCTIONS_CHARS} characters (it has {len(text)});"
            f" longer guidance belongs in {AGENTS_FILE}"
        )
    return text


def load_guidance(workspace: Path, config: RepoConfig) -> RepoGuidance:
    """The repository's guidance for the agent: its AGENTS.md files, root first, then `instructions`.

    Call it on the attempt's fresh checkout of the base commit, before the agent runs. Only files
    git tracks there and does not ignore count (so never one in .git); symlinks and anything that
    resolves outside the checkout are skipped. Each file is cut at MAX_AGENTS_FILE_CHARS, and files
    past MAX_AGENTS_TOTAL_CHARS (or MAX_AGENTS_FILES) are named, not shown: the prompt says so.
    """
    paths, skipped = _agents_files(workspace)
    files: list[GuidanceFile] = []
    omitted: list[str] = []
    left = MAX_AGENTS_TOTAL_CHARS
    for path in paths:
        if len(files) >= MAX_AGENTS_FILES or left < _MIN_SHOWN_CHARS:
            omitted.append(path)
            continue
        read = _read_agents_file(workspace.resolve(), path, min(MAX_AGENTS_FILE_CHARS, left))
        if isinstance(read, str):
            skipped.append(f"{path}: {read}")
            continue
        files.append(read)
        left -= len(read.text)
    if config.instructions:
        size = len(config.instructions.encode("utf-8"))
        files.append(GuidanceFile(f"{CONFIG_FILE} instructions", "", config.instructions, size))
    return RepoGuidance(tuple(files), tuple(omitted), tuple(skipped))


_MIN_SHOWN_CHARS = 200  # below this much room left, a file is named rather than shown as a sliver


def _git(workspace: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(workspace), *args],
        input=stdin,
        capture_output=True,
        env=git_environment(),
        timeout=120,
        check=False,
    )


def _check_git(done: subprocess.CompletedProcess[bytes], fine: set[int]) -> None:
    if done.returncode not in fine:
        why = done.stderr.decode("utf-8", "replace").strip()[:300]
        raise RepoConfigError(f"the repository's {AGENTS_FILE} files could not be listed: {why}")


def _agents_files(workspace: Path) -> tuple[list[str], list[str]]:
    """Tracked AGENTS.md files git does not ignore, each folder before its subfolders; the rest as "path: why"."""
    listed = _git(workspace, "ls-files", "--stage", "-z", "--", f":(glob)**/{AGENTS_FILE}")
    _check_git(listed, {0})
    candidates: list[str] = []
    skipped: list[str] = []
    for entry in listed.stdout.split(b"\0"):
        meta, _, raw = entry.partition(b"\t")
        try:
            path = raw.decode("utf-8")
        except UnicodeDecodeError:
            skipped.append(f"{raw.decode('utf-8', 'replace')}: the name is not UTF-8")
            continue
        if posixpath.basename(path) != AGENTS_FILE or ".git" in path.lower().split("/"):
            continue
        why = "a symlink" if meta.startswith(b"120000") else _escapes_checkout(workspace.resolve(), path)
        if why:
            skipped.append(f"{path}: {why}")
        elif meta.startswith((b"100644", b"100755")):
            candidates.append(path)
    ignored = _git(workspace, "check-ignore", "--no-index", "-z", "--stdin", stdin="\0".join(candidates).encode())
    _check_git(ignored, {0, 1})  # 1: none is ignored
    dropped = set(ignored.stdout.decode("utf-8").split("\0"))
    skipped += [f"{path}: in a folder git ignores" for path in candidates if path in dropped]
    kept = [path for path in candidates if path not in dropped]
    return sorted(kept, key=lambda path: path.split("/")[:-1]), skipped


def _escapes_checkout(root: Path, path: str) -> str | None:
    """Why the file at `path` must not be read: it is a symlink, or a linked folder takes it outside `root`."""
    file = root / path
    if file.is_symlink():
        return "a symlink"
    return None if file.resolve().is_relative_to(root) else "outside the checkout"


def _read_agents_file(root: Path, path: str, cap: int) -> GuidanceFile | str:
    """The file's first `cap` characters, or why it is skipped (unreadable, empty)."""
    try:
        fd = os.open(root / path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            raw = handle.read(cap * 4)  # enough bytes for `cap` characters of UTF-8
    except OSError as exc:
        return f"unreadable ({exc.strerror})"
    text = raw.decode("utf-8", "replace").replace("\r\n", "\n").strip()
    if not text:
        return "empty"
    folder = posixpath.dirname(path)
    cut = size > len(raw) or len(text) > cap
    return GuidanceFile(path, f"{folder}/" if folder else "", text[:cap].rstrip(), size, cut)


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


def matches(path: str, patterns: tuple[str, ...] | list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p.removeprefix("**/")) for p in patterns)


def review_flags(changes: PatchEvidence, config: RepoConfig) -> list[str]:
    """What a reviewer must look at twice: changed tests, CI configuration, protected paths, agent instructions.

    Read from what git stored (`changes`), never from the patch text. An AGENTS.md the patch writes
    guided nobody in this run (guidance is read from the base commit), but it would guide every
    later run once merged, so a person decides.
    """
    flags = []
    for path in changes.paths:
        shown = shown_path(path)
        if matches(path, config.protected_paths):
            flags.append(f"changes protected path {shown}")
        elif posixpath.basename(path) == AGENTS_FILE:
            flags.append(f"changes agent instructions {shown}")
        elif _ci_note(changes, path) is not None:
            flags.append(f"changes CI configuration {shown}")
        elif matches(path, ALWAYS_FLAGGED):
            note = f" ({DEPENDENCY_NOTE})" if is_dependency_file(path) else ""
            flags.append(f"changes test file or test-runner configuration {shown}{note}")
        elif is_dependency_file(path):
            flags.append(f"changes dependency file {shown} ({DEPENDENCY_NOTE})")
    return flags


def _ci_note(changes: PatchEvidence, path: str) -> str | None:
    """None when `path` is no CI configuration; "" when it is; else why it counts (a CI file is unreadable)."""
    if matches(path, changes.ci.patterns):
        return ""
    if changes.ci.unread and matches(path, ANY_YAML_FILE):
        return f"; {changes.ci.unread}, so every YAML file the patch changes counts as CI configuration"
    return None


def _escapes(link: str, target: str) -> bool:
    """Whether a symlink at `link` (repository-relative) with `target` resolves outside the checkout or into .git."""
    if not target or target.startswith("/"):
        return True
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
    first = resolved.split("/", 1)[0]
    return first == ".." or first.lower() == ".git"


def refusal_reasons(
    changes: PatchEvidence, config: RepoConfig, *, allow_binary: bool = False, allow_ci: bool = False
) -> list[str]:
    """Why a patch must not be pushed at all (not merely flagged): each reason names the file.

    Read from what git stored. Protected paths are the repository's own rule; `.frogfix.yml` is
    FrogFix's guard rail, which only people change (it is always read from the base commit
    anyway); CI configuration would run with the project's CI variables before anyone reviews it
    (unless `allow_ci`); a symlink out of the checkout would point a reviewer's or CI's checkout
    at their own machine; a submodule pulls in code the diff does not show; binary files cannot
    be reviewed in a diff.
    """
    reasons: list[str] = []
    for path in changes.paths:
        ci_note = None if allow_ci else _ci_note(changes, path)
        if matches(path, config.protected_paths):
            reasons.append(f"changes protected path {shown_path(path)}")
        elif path == CONFIG_FILE:
            reasons.append(f"changes FrogFix's own configuration {CONFIG_FILE} (only people may change it)")
        elif ci_note is not None:
            reasons.append(f"changes CI configuration {shown_path(path)} (FROGFIX_ALLOW_CI_CHANGES is off{ci_note})")
    for file in changes.files:
        reason = _content_reason(file, allow_binary)
        if reason:
            reasons.append(reason)
    return reasons


def _content_reason(file: ChangedFile, allow_binary: bool) -> str | None:
    if file.status == "deleted":
        return None  # removing a file is reviewable, whatever it was
    shown = shown_path(file.path)
    if file.symlink and _escapes(file.path, file.link_target or ""):
        return f"adds symlink {shown} pointing outside the repository ({(file.link_target or '')[:200]!r})"
    if file.submodule:
        return f"adds submodule {shown} (its code is not in the diff)"
    if file.binary and not allow_binary:
        return f"{'adds' if file.status == 'added' else 'changes'} binary file {shown}"
    return None
