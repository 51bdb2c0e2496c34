"""Files the project's own install generated in the checkout, laid into each later checkout of the job.

Why they are handled on the host, each time: a setuptools-scm or hatch-vcs project's tests import
the `_version.py` its build writes, and git ignores it, so a fresh checkout lacks it. But those
files were written by build code, so:
- a file is laid only where the checkout has nothing (no tracked file, no file a patch added),
  every folder on the way is a real folder of the checkout, and the checkout's own ignore rules
  (its tracked .gitignore files, asked of the worker's git, never the build's `.git/info/exclude`
  or config) ignore it, so `git add -A` never takes it into a patch; checked for each checkout
  it is laid in (a later commit may track or un-ignore the path);
- a conftest.py, *.pth, sitecustomize.py or usercustomize.py is never laid: each would run in
  every test run (the builder refuses an install that generates one: `refused_in`); nor is a
  test module or a test runner's configuration (`NEVER_LAID`);
- only regular files; links are skipped.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from sandbox.base import PROJECT_DIR, PROJECT_GENERATED
from worker.git import gitcalls

REFUSED_NAMES = frozenset({"conftest.py", "sitecustomize.py", "usercustomize.py"})
# Laid by no build FrogFix knows, and each would change what a test run runs: skipped, never refused.
NEVER_LAID = re.compile(r"(^|/)(pytest\.ini|\.pytest\.ini|tox\.ini|setup\.cfg|pyproject\.toml|noxfile\.py"
                        r"|test_[^/]*\.py|[^/]*_test\.py|\.gitignore|\.gitattributes)$")
MAX_FILES = 10_000


def in_layer(layer: Path) -> Path:
    """Where a project layer (the host folder of PROJECT_DIR) keeps the files its install generated."""
    return layer / PROJECT_GENERATED.removeprefix(PROJECT_DIR + "/")


def is_refused(path: str) -> bool:
    """Whether a generated file of this name would run by itself in a test run."""
    name = os.path.basename(path)
    return name in REFUSED_NAMES or name.endswith(".pth")


def _files(folder: Path) -> list[str]:
    """Regular files under `folder`, relative, links never followed."""
    found: list[str] = []
    for path, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(path, d))]
        for name in names:
            full = os.path.join(path, name)
            if stat.S_ISREG(os.lstat(full).st_mode):
                found.append(os.path.relpath(full, folder))
    return sorted(found)


def refused_in(folder: Path) -> str | None:
    """The first generated file FrogFix refuses to lay (see the module docstring), else None."""
    if not folder.is_dir():
        return None
    return next((path for path in _files(folder) if is_refused(path)), None)


def lay(workspace: Path, folder: Path) -> list[str]:
    """Copy the generated files under `folder` into the checkout at `workspace` where nothing is; returns those laid."""
    if not folder.is_dir():
        return []
    files = _files(folder)[:MAX_FILES]
    if not files:
        return []
    files = [rel for rel in files if not is_refused(rel) and not NEVER_LAID.search(rel)]
    ignored = _ignored(workspace, files)
    laid = []
    for rel in files:
        if rel not in ignored or not _room_for(workspace, rel):
            continue
        target = workspace / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        source = os.open(folder / rel, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except OSError:
            os.close(source)
            continue
        try:
            while chunk := os.read(source, 1 << 20):
                os.write(fd, chunk)
        finally:
            os.close(fd)
            os.close(source)
        laid.append(rel)
    return laid


def _ignored(workspace: Path, files: list[str]) -> set[str]:
    """Which of `files` the checkout's own rules ignore and git does not track (the worker's isolated
    git: no global or system config, so only the checkout's .gitignore files and FrogFix's own
    .git/info/exclude count)."""
    if not files:
        return set()
    done = gitcalls.run_git(
        ["-C", str(workspace), "-c", "core.excludesFile=/dev/null", "check-ignore", "-z", "--stdin"],
        env=gitcalls.git_environment(), what="git check-ignore", timeout=gitcalls.LOCAL_TIMEOUT,
        stdin="\0".join(files).encode("utf-8", "surrogateescape") + b"\0", check=False,
    )
    return {p for p in done.stdout.decode("utf-8", "surrogateescape").split("\0") if p}


def _room_for(workspace: Path, rel: str) -> bool:
    """Nothing at `rel`, and each existing folder on the way a real folder inside the checkout."""
    parts = rel.split("/")
    if any(p in ("", ".", "..", ".git") for p in parts):
        return False
    here = workspace
    for part in parts[:-1]:
        here = here / part
        try:
            mode = os.lstat(here).st_mode
        except FileNotFoundError:
            return True  # made fresh from here on
        if not stat.S_ISDIR(mode):
            return False
    return not os.path.lexists(workspace / rel)
