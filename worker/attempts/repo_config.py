"""What a target repository says about itself: `.frogfix.yml`, or a detected test command.

`.frogfix.yml` is read by worker/attempts/frogfix_yml.py (its keys, types, rules and defaults).

Repository guidance: the AGENTS.md files (the root one and those in subfolders; the nearest one
governs the paths below it) and `instructions`, read from the base commit before the agent runs,
so nothing a patch writes there guides the run that wrote it; a patch that changes an AGENTS.md is
flagged for the reviewer instead.
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import os
import posixpath
import re
import shlex
import subprocess
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.patches import shown_path
from worker.attempts.ci_config import ANY_YAML_FILE
from worker.attempts.frogfix_yml import (
    AGENTS_FILE,
    CONFIG_FILE,
    DEFAULT_TEST_TIMEOUT,
    RepoConfigError,
    read_frogfix_yml,
)
from worker.attempts.js_runners import detect_js
from worker.attempts.stored_patch import ChangedFile, PatchEvidence
from worker.environment.declared import Overrides, is_dependency_file
from worker.git.gitcalls import git_environment
from worker.leaf.prompts import GuidanceFile, RepoGuidance

# Caps on the guidance given to the agent (characters): a file is cut, files past the total are named only.
MAX_AGENTS_FILE_CHARS = 8_000
MAX_AGENTS_TOTAL_CHARS = 24_000
MAX_AGENTS_FILES = 32
DEPENDENCY_NOTE = "a dependency file: the tests ran in an environment built from the patched one"
# Build code (worker/environment/build_code.py: setup.py and the modules it imports, an in-tree backend, build
# hooks) is flagged like a dependency file: the environment the tests ran in was built by running it.
BUILD_CODE_NOTE = "the project's install runs it: the tests ran in an environment built from the patched one"
# Paths whose change is always flagged for the reviewer as tests (and FrogFix's own configuration).
# CI configuration has its own home (worker/attempts/ci_config.py) and is refused unless FROGFIX_ALLOW_CI_CHANGES.
TEST_FILES = (
    "tests/**",
    "test/**",
    "**/tests/**",
    "**/test_*.py",
    "**/*_test.py",
    CONFIG_FILE,
    # JavaScript and TypeScript runners' configuration and setup (worker/attempts/js_runners.py)
    "package.json",
    "**/jest.config.*",
    "**/vitest.config.*",
    "**/vitest.workspace.*",
    "**/vite.config.*",
    "**/.mocharc*",
    "**/jest.setup.*",
    "**/vitest.setup.*",
    "**/setupTests.*",
    "**/babel.config.*",
    "**/.babelrc*",
    "**/tsconfig*.json",
    "**/__tests__/**",
    "**/*.test.*",
    "**/*.spec.*",
)
# The files that decide what the tests run: a patch that swaps the runner could print "3 passed"
# without running a test. The one list: review_flags and README's "What a job does" both use it
# (tests/review/test_runner_files.py holds README to it). Besides these, any file the test command
# names (`./run_tests.sh`, `python runtests.py`, `-m tools.check`) counts. `**/` means any folder.
RUNNER_FILES = (
    # task runners a test command starts
    "**/Makefile",
    "**/makefile",
    "**/GNUmakefile",
    "**/justfile",
    "**/Justfile",
    "**/.justfile",
    "**/Taskfile.yml",
    "**/Taskfile.yaml",
    "**/package.json",
    "**/noxfile.py",
    # where pytest and coverage read options (addopts, deselection, plugins): any folder can be the rootdir
    "**/pytest.ini",
    "**/.pytest.ini",
    "**/tox.ini",
    "**/setup.cfg",
    "**/pyproject.toml",
    "**/setup.py",
    "**/conftest.py",
    "**/.coveragerc",
    # modules the checkout's root (first on sys.path) would import instead of the runner's own
    "pytest.py",
    "pytest/**",
    "_pytest.py",
    "_pytest/**",
    "py.py",
    "py/**",
    "pluggy.py",
    "pluggy/**",
    "iniconfig.py",
    "iniconfig/**",
    "unittest.py",
    "unittest/**",
    # what Python's site runs at every start, from wherever it is on the path
    "**/sitecustomize.py",
    "**/usercustomize.py",
    "**/*.pth",
)


@dataclass(frozen=True)
class RepoConfig:
    """What a job takes from the repository: `.frogfix.yml` as `FrogfixFile` read it, or a detected test command."""

    test_command: str | None = None
    setup_command: str | None = None
    image: str | None = None
    protected_paths: tuple[str, ...] = field(default_factory=tuple)
    test_timeout: float = DEFAULT_TEST_TIMEOUT
    test_command_source: str = "none"  # ".frogfix.yml", "detected: <why>" or "none"
    instructions: str | None = None
    environment: Overrides | None = None  # `environment:`: what to install where detection guesses wrong


def load_repo_config(workspace: Path) -> RepoConfig:
    """Read `.frogfix.yml` if present, and fill in a detected test command if it names none."""
    read = read_frogfix_yml(workspace / CONFIG_FILE)
    command = read.test_command
    source = CONFIG_FILE if command else "none"
    if command is None:
        detected = detect_test_command(workspace)
        if detected:
            command, why = detected
            source = f"detected: {why}"
    return RepoConfig(
        test_command=command,
        setup_command=read.setup_command,
        image=read.image,
        protected_paths=tuple(read.protected_paths or ()),
        test_timeout=read.test_timeout,
        test_command_source=source,
        instructions=read.instructions,
        environment=None if read.environment is None else read.environment.overrides(),
    )


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
    js = detect_js(workspace)
    if js is not None:
        return js
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
    """What a reviewer must look at twice: changed tests, the test runner, CI configuration, protected
    paths, agent instructions, dependency files and build code (`changes.build_code`: what the
    project's install runs). With FROGFIX_REFUSE_PROTECTED_CHANGES each one refuses the patch.

    Read from what git stored (`changes`), never from the patch text. An AGENTS.md the patch writes
    guided nobody in this run (guidance is read from the base commit), but it would guide every
    later run once merged, so a person decides.
    """
    flags = []
    named = command_paths(config.test_command)
    build_code = frozenset(changes.build_code)
    for path in changes.paths:
        shown = shown_path(path)
        dependency = is_dependency_file(path)
        note = f" ({DEPENDENCY_NOTE})" if dependency else f" ({BUILD_CODE_NOTE})" if path in build_code else ""
        if matches(path, config.protected_paths):
            flags.append(f"changes protected path {shown}")
        elif posixpath.basename(path) == AGENTS_FILE:
            flags.append(f"changes agent instructions {shown}")
        elif _ci_note(changes, path) is not None:
            flags.append(f"changes CI configuration {shown}")
        elif path in named:
            flags.append(f"changes the test runner {shown} (the test command runs it){note}")
        elif matches(path, RUNNER_FILES):
            flags.append(f"changes the test runner or its configuration {shown}{note}")
        elif matches(path, TEST_FILES):
            flags.append(f"changes test file or test-runner configuration {shown}{note}")
        elif dependency:
            flags.append(f"changes dependency file {shown}{note}")
        elif note:
            flags.append(f"changes build code {shown}{note}")
    return flags


_COMMAND_DEPTH = 3  # `sh -c "..."` inside `bash -c '...'`: quoted commands are read this deep


def command_paths(command: str | None) -> frozenset[str]:
    """The repository files a test command names, so a patch cannot rewrite what the command runs.

    Every word that could be a relative path counts (`./run_tests.sh`, `python runtests.py`, the
    value of `--rcfile=ci/cov.rc`), and for `-m pkg.mod` the module's files and its packages'
    `__init__.py` (Python imports those first). Over-reading is harmless: only changed paths that
    equal one of these are flagged.
    """
    found: set[str] = set()
    words = _words(command or "", _COMMAND_DEPTH)
    for word, after in itertools.pairwise([*words, ""]):
        for value in (word, word.partition("=")[2]):
            path = posixpath.normpath(value) if value and not value.startswith(("/", "-", "~", "$")) else ""
            if path not in ("", ".", "..") and not path.startswith("../"):
                found.add(path)
        module = after if word == "-m" else word[2:] if word.startswith("-m") else ""
        if re.fullmatch(r"[A-Za-z_][\w.]*", module):
            parts = module.split(".")
            found.update("/".join([*parts[:n], "__init__.py"]) for n in range(1, len(parts) + 1))
            found.update({"/".join(parts) + ".py", "/".join(parts) + "/__main__.py"})
    return frozenset(found)


def _words(command: str, depth: int) -> list[str]:
    """The command's words as a shell splits them, and those of each quoted word holding a command."""
    try:
        words = shlex.split(command)
    except ValueError:  # an unclosed quote: the shell would refuse it; read the plain words anyway
        words = command.split()
    if depth > 1:
        words += [inner for word in words if any(c.isspace() for c in word) for inner in _words(word, depth - 1)]
    return words


def _ci_note(changes: PatchEvidence, path: str) -> str | None:
    """None when `path` is no CI configuration; "" when it is; else why it counts (a CI file is unreadable)."""
    if matches(path, changes.ci.patterns):
        return ""
    if changes.ci.unread and matches(path, ANY_YAML_FILE):
        return f"; {changes.ci.unread}, so every YAML file the patch changes counts as CI configuration"
    return None


MAX_LINK_HOPS = 40  # Linux's own bound on the symlinks one path lookup follows (ELOOP past it)
_TOO_DEEP = f"follows more than {MAX_LINK_HOPS} symlinks"


@dataclass(frozen=True)
class _Landing:
    """Where a lookup ends: `parts` inside the checkout, or None with how it left (`why`, `via` the link)."""

    parts: tuple[str, ...] | None
    hops: int
    why: str = ""
    via: str | None = None  # the symlink, named in the looked-up target itself, through which it left
    cut: bool = False  # out only because the lookup nested deeper than MAX_LINK_HOPS links: not memoised


class LinkResolver:
    """Looks paths of one tree up as the kernel would on its checkout: through every symlink in it.

    Why: each target, read alone, can stay inside while a chain of them leads out (`L -> ../..`
    deep in a folder, then `passwd -> <that folder>/L/../../etc/passwd`). POSIX semantics, one
    component at a time: `..` after a link applies to where the link led; a component no link
    stands at counts as a folder (as it would once created), so `..` after it only drops it.
    Leaving the checkout, an absolute target, any `.git` component (git tracks none, so only
    git's own data is there) and more than MAX_LINK_HOPS links in one lookup are all "out".
    `fold` looks names up case-insensitively, as a checkout on macOS or Windows would.
    Each link is resolved once (memoised), so a lookup costs its own target's length, and no
    lookup nests deeper than MAX_LINK_HOPS links (a chain of thousands cannot exhaust the stack).
    """

    def __init__(self, links: Mapping[str, str], *, fold: bool = False) -> None:
        self._fold = fold
        self._links: dict[str, str | None] = {}  # None: two links whose names differ only in case
        for path, target in links.items():
            key = self._key(path)
            self._links[key] = None if key in self._links and self._links[key] != target else target
        self._done: dict[str, _Landing] = {}
        self._busy: set[str] = set()

    def _key(self, path: str) -> str:
        return path.lower() if self._fold else path

    def link(self, path: str) -> _Landing:
        """Where the symlink at `path` (a key of the map) leads."""
        key = self._key(path)
        if key in self._done:
            return self._done[key]
        if key in self._busy:  # a loop: the kernel says ELOOP
            return _Landing(None, MAX_LINK_HOPS + 1, _TOO_DEEP)
        if len(self._busy) >= MAX_LINK_HOPS:  # the lookup that led here follows more links than that
            return _Landing(None, MAX_LINK_HOPS + 1, _TOO_DEEP, cut=True)
        target = self._links[key]
        self._busy.add(key)
        if target is None:
            landing = _Landing(None, 1, "two symlinks' names differ only in case")
        else:
            landing = self.lookup(tuple(path.split("/")[:-1]), target, hops=1)
        self._busy.discard(key)
        if not landing.cut:  # alone, this link may need fewer: look it up afresh when asked
            self._done[key] = landing
        return landing

    def lookup(self, folder: tuple[str, ...], target: str, *, hops: int = 0) -> _Landing:
        """Where `target`, read in `folder` (a folder of the tree, no link in it), leads."""
        if not target or target.startswith("/"):
            return _Landing(None, hops, "it is absolute" if target else "it is empty")
        current = list(folder)
        last: str | None = None  # the last link this lookup followed
        for name in target.split("/"):
            if name in ("", "."):
                continue
            if name == "..":
                if not current:
                    return _Landing(None, hops, "it leaves the checkout", last)
                current.pop()
                continue
            if name.lower() == ".git":
                return _Landing(None, hops, "it enters .git", last)
            current.append(name)
            path = "/".join(current)
            if self._key(path) not in self._links:
                continue
            inner = self.link(path)
            hops += inner.hops
            if inner.parts is None:
                return _Landing(None, hops, inner.why, path, inner.cut)
            if hops > MAX_LINK_HOPS:
                return _Landing(None, hops, _TOO_DEEP, path)
            current, last = list(inner.parts), path
        return _Landing(tuple(current), hops)


def _link_maps(changes: PatchEvidence) -> tuple[dict[str, str], dict[str, str]]:
    """The patched and the base tree's symlinks (path -> target), the changed files laid over the former."""
    patched, base = dict(changes.links), dict(changes.base_links)
    for file in changes.files:
        if file.symlink and file.status != "deleted":
            patched[file.path] = file.link_target or ""
        else:
            patched.pop(file.path, None)
    return patched, base


def _out(landing: _Landing, fold: bool) -> str:
    """How a link's lookup leads out, for its reason; nothing where its own target plainly does."""
    where = " on a case-insensitive file system" if fold else ""
    if landing.via is not None:
        return f"; {landing.why}{where} through symlink {shown_path(landing.via)}"
    return f"; {landing.why}{where}" if fold else ""  # folding alone led it out: two names met


def _link_reasons(changes: PatchEvidence) -> tuple[dict[str, str], list[str]]:
    """Reasons for the changed symlinks that lead out (by path), and for kept ones the patch turns out.

    Judged through every symlink of the patched tree, case-sensitively and case-insensitively. A
    link the patch keeps is named only when it stayed inside on the base tree and leads out now:
    a link that was already out is the repository's own, not the patch's. Case-insensitively, a
    loop is no way out (`Docs -> docs` loops there, and the kernel stops at it); only leaving is.
    """
    patched, base = _link_maps(changes)
    changed = {f.path for f in changes.files}
    new = [f for f in changes.files if f.symlink and f.status != "deleted"]
    kept = sorted(path for path in patched if path not in changed) if changed & (set(patched) | set(base)) else []
    by_path: dict[str, str] = {}
    turned: dict[str, str] = {}
    for fold in (False, True):
        now, before = LinkResolver(patched, fold=fold), LinkResolver(base, fold=fold)

        def out(landing: _Landing, fold: bool = fold) -> bool:
            return landing.parts is None and not (fold and landing.why == _TOO_DEEP)

        for file in new:
            landing = now.link(file.path)
            if out(landing) and file.path not in by_path:
                target = (file.link_target or "")[:200]
                by_path[file.path] = (
                    f"adds symlink {shown_path(file.path)} pointing outside the repository"
                    f" ({target!r}{_out(landing, fold)})"
                )
        for path in kept:
            landing = now.link(path)
            if out(landing) and path not in turned and not out(before.link(path)):
                turned[path] = (
                    f"turns symlink {shown_path(path)}, which the patch keeps, outside the repository"
                    f" ({patched[path][:200]!r}{_out(landing, fold)})"
                )
    return by_path, [turned[path] for path in kept if path in turned]


def refusal_reasons(
    changes: PatchEvidence, config: RepoConfig, *, allow_binary: bool = False, allow_ci: bool = False
) -> list[str]:
    """Why a patch must not be pushed at all (not merely flagged): each reason names the file.

    Read from what git stored. Protected paths are the repository's own rule; `.frogfix.yml` is
    FrogFix's guard rail, which only people change (it is always read from the base commit
    anyway); CI configuration would run with the project's CI variables before anyone reviews it
    (unless `allow_ci`); a symlink out of the checkout (through the tree's other links too) would
    point a reviewer's or CI's checkout at their own machine; a submodule pulls in code the diff
    does not show; binary files cannot be reviewed in a diff.
    """
    reasons: list[str] = []
    link_reasons, turned_links = _link_reasons(changes)
    for path in changes.paths:
        ci_note = None if allow_ci else _ci_note(changes, path)
        if matches(path, config.protected_paths):
            reasons.append(f"changes protected path {shown_path(path)}")
        elif path == CONFIG_FILE:
            reasons.append(f"changes FrogFix's own configuration {CONFIG_FILE} (only people may change it)")
        elif ci_note is not None:
            reasons.append(f"changes CI configuration {shown_path(path)} (FROGFIX_ALLOW_CI_CHANGES is off{ci_note})")
    for file in changes.files:
        reason = link_reasons.get(file.path) or _content_reason(file, allow_binary)
        if reason:
            reasons.append(reason)
    return reasons + turned_links


def _content_reason(file: ChangedFile, allow_binary: bool) -> str | None:
    if file.status == "deleted":
        return None  # removing a file is reviewable, whatever it was
    shown = shown_path(file.path)
    if file.submodule:
        return f"adds submodule {shown} (its code is not in the diff)"
    if file.binary and not allow_binary:
        return f"{'adds' if file.status == 'added' else 'changes'} binary file {shown}"
    return None
