"""Whether a patch's code reaches into the test runner: read from what git stored, never run.

Why: the code under review runs inside the test process, so a patch's ordinary module can rewrite
pytest's reports on import (wrap `TestReport`, register an exit handler that forces the exit code,
hook imports). The sentinels (worker/attempts/run_checks.py) catch a forgery that lies about everything;
one that lies only about the patch's own test is found here, by what the patch's lines do. A
patch that reaches in is flagged in bold on the MR and its level is at most `unproven`
(worker/attempts/evidence.py), unless the base already does the same kind of thing in the same kind of file:
a project that is itself a pytest plugin imports pytest, and its conftest implements hooks.

Read only the lines the patch adds, in git's own regeneration of it (worker/attempts/stored_patch.py);
a category is checked against the base tree with `git grep` only when the patch hits it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from worker.attempts.repo_config import TEST_FILES, matches
from worker.attempts.stored_patch import PatchEvidence
from worker.git.gitcalls import LOCAL_TIMEOUT, git_environment, run_git

# Where a patch's tests live (conftest.py too: it runs inside the test process like the tests).
_TEST_PATHS = (*TEST_FILES, "**/test/**", "**/conftest.py", "conftest.py")
_METADATA = ("**/pyproject.toml", "**/setup.cfg", "**/setup.py", "pyproject.toml", "setup.cfg", "setup.py")


@dataclass(frozen=True)
class Reach:
    """One kind of reaching in: what it is called on the MR, its pattern (Python and PCRE alike), where it counts."""

    what: str
    pattern: str
    in_tests: bool  # also in test files (tests may use most of these honestly; not these)
    files: tuple[str, ...] = ("*.py",)


REACHES = (
    Reach("imports the test runner's internals", r"\b_pytest\b|\bpluggy\b", True),
    Reach("imports pytest outside the tests", r"^\s*(?:import\s+pytest\b|from\s+pytest\b)", False),
    Reach("implements a pytest hook", r"\bdef\s+pytest_[a-z_]+\s*\(|\bhookimpl\b|\bpytest_plugins\s*=", True),
    Reach("registers a pytest plugin entry point", r"\bpytest11\b", True, _METADATA),
    Reach("rewrites sys.modules", r"\bsys\s*\.\s*modules\b", False),
    Reach("rewrites builtins", r"\bbuiltins\b|__builtins__", False),
    Reach("registers an exit handler", r"\batexit\b", True),
    Reach("ends the process directly", r"\b_exit\s*\(", True),
    Reach("adds an import hook", r"\bsys\s*\.\s*(?:meta_path|path_hooks|path_importer_cache)\b"
          r"|\b__import__\s*\(|\bimport_module\s*\(|\bimportlib\s*\.\s*(?:util|abc|machinery)\b", False),
    Reach("sets a trace, profile or audit hook", r"\b(?:settrace|setprofile|addaudithook)\b|\bsys\s*\.\s*monitoring\b",
          True),
    Reach("reads or sets the test runner's environment", r"PYTEST_|FROGFIX|frogfix_results", True),
    Reach("runs code built at run time", r"(?<![.\w])(?:exec|eval|compile)\s*\(", False),
    Reach("reads the interpreter's frames or objects",
          r"\bsys\s*\.\s*_getframe\b|\bgc\s*\.\s*get_(?:objects|referrers)\b|\bctypes\b"
          r"|\binspect\s*\.\s*(?:stack|currentframe)\b", False),
)  # fmt: skip
_COMPILED = [(reach, re.compile(reach.pattern)) for reach in REACHES]


def added_lines(patch: str) -> dict[str, list[str]]:
    """The lines git's regenerated patch adds, by the path they land on (binary files have none)."""
    lines: dict[str, list[str]] = {}
    path: str | None = None
    for line in patch.splitlines():
        if line.startswith("diff --git "):
            path = None
        elif line.startswith("+++ "):
            target = line[4:]
            path = target[2:] if target.startswith("b/") else None
        elif path is not None and line.startswith("+"):
            lines.setdefault(path, []).append(line[1:])
    return lines


def reach_in(changes: PatchEvidence, repository: Path) -> list[str]:
    """How the patch's code reaches into the test runner, one line each ("" kinds the base already has)."""
    found: list[str] = []
    excused: dict[tuple[str, bool], bool] = {}  # (kind, in tests) -> the base already does it: one git grep each
    for path, lines in added_lines(changes.patch).items():
        test = matches(path, _TEST_PATHS)
        for reach, pattern in _COMPILED:
            if (test and not reach.in_tests) or not matches(path, reach.files):
                continue
            hit = next((line.strip() for line in lines if pattern.search(line)), None)
            if hit is None:
                continue
            if (reach.what, test) not in excused:
                excused[reach.what, test] = _base_does(repository, changes.base, reach, test)
            if excused[reach.what, test]:
                continue
            shown = hit if len(hit) <= 80 else hit[:77] + "..."
            found.append(f"{path} {reach.what}: `{shown}`")
    return found


def _base_does(repository: Path, base: str, reach: Reach, test: bool) -> bool:
    """Whether the base tree's own files of the same kind (tests or not) already match `reach`."""
    done = run_git(
        ["-C", str(repository), "grep", "-I", "-l", "-z", "-P", "-e", reach.pattern, base, "--", *reach.files],
        env=git_environment(), what="git grep", timeout=LOCAL_TIMEOUT, check=False,
    )
    if done.returncode not in (0, 1):
        return False  # git could not search: nothing is excused
    prefix = f"{base}:"
    for entry in done.stdout.decode("utf-8", "surrogateescape").split("\0"):
        path = entry.removeprefix(prefix)
        if path and matches(path, _TEST_PATHS) == test:
            return True
    return False
