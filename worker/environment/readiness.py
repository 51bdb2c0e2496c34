"""Whether a test run could start at all: the line between "the tests cannot run here" and "they fail".

Only the first is an environment error, which ends a job before any model call. A runner's
ordinary failure (pytest's exit 1, `make`'s exit 2 for a failing test) is the bug, not the
environment. The exit code is read as the runner documents it:
- any command: 126 (found, not executable) and 127 (not found) mean it never ran, and so does
  Python's own "No module named X" for a runner the command starts with `-m X` (Python exits 1,
  which would otherwise read as failing tests);
- pytest (docs: "Exit codes"): 2 interrupted, which includes errors while collecting (an import
  error in a test module), 3 internal error, 4 usage error (an unknown option, a `minversion`
  the installed pytest does not meet, a conftest that cannot be imported), 5 no tests collected.
"""

from __future__ import annotations

import re

PYTEST = re.compile(r"(^|[\s/;&|(])(py\.test|pytest)(\s|$)|-m\s+pytest\b")
PYTEST_EXITS = {
    2: "pytest was interrupted: errors while collecting the tests (often an import error)",
    3: "pytest hit an internal error",
    4: "pytest refused its command line or configuration (a usage error)",
    5: "pytest collected no tests",
}
ANY_EXITS = {126: "the test command is not executable (exit 126)", 127: "the test command was not found (exit 127)"}


def runs_pytest(command: str) -> bool:
    return PYTEST.search(command) is not None


MODULE_RUNNER = re.compile(r"(?:^|\s)-m\s*([A-Za-z_][\w.]*)")


def could_not_start(command: str, exit_code: int | None, timed_out: bool, log: str = "") -> str | None:
    """Why the tests could not start, or None when they ran (passing or failing)."""
    if timed_out or exit_code is None:
        return None  # a run that timed out did start; a sandbox failure is the sandbox's, reported as such
    if exit_code in ANY_EXITS:
        return ANY_EXITS[exit_code]
    missing = missing_runner(command, log) if exit_code != 0 else None
    if missing is not None:
        return missing
    if runs_pytest(command) and exit_code in PYTEST_EXITS:
        return f"{PYTEST_EXITS[exit_code]} (exit {exit_code})"
    return None


def missing_runner(command: str, log: str) -> str | None:
    """The runner a `-m X` command starts, when Python itself said it cannot find it (never a test's
    own ImportError, which Python reports as a traceback ending "ModuleNotFoundError: No module named 'x'")."""
    for module in MODULE_RUNNER.findall(command):
        pattern = rf"(?m)^\S*python[\d.]*: No module named {re.escape(module)}(?:$|[.;\s])"
        if re.search(pattern, log):
            top = module.split(".")[0]
            return (f"the test runner {module} is not installed in the environment (Python: No module named "
                    f"{module}); declare {top} with the test dependencies, or in .frogfix.yml environment: packages")
    return None


def hint(log: str) -> str:
    """One line naming the most telling error in a test log (a missing module, a version the runner
    wants), so the reason says what to fix; empty when nothing stands out."""
    for pattern in (
        r"ModuleNotFoundError: No module named '[^']+'",
        r"ImportError: [^\n]{0,200}",
        r"'minversion' requires pytest-[^\n]{0,80}",
        r"error: unrecognized arguments: [^\n]{0,200}",
        r"no tests ran in [^\n]{0,40}",
        r"[^\n]{0,200}: command not found",
        r"[^\n]{0,120}No such file or directory",
    ):
        match = re.search(pattern, log)
        if match:
            return match.group(0).strip()
    return ""
