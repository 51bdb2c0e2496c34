"""Evidence that proves a fix: each test's outcome on the base and with the patch, the reproduction, one verdict.

Why it is built this way:
- Per-test outcomes come from pytest's own JUnit XML report, written to a file in the sandbox
  and read back by a separate command of FrogFix's (REPORT_READER), never from the test log,
  whose text a patch's code can print at will. Runners FrogFix cannot read keep exit codes.
- The reproduction is the strongest evidence a fix can carry: the tests the patch adds or
  changes, run on the base source (the patch's test changes alone), fail there and pass with
  the whole patch. The bug is shown, then shown fixed.
- One verdict (`EvidenceLevel`), decided here and nowhere else: `fix`, the pipeline, the MR,
  the job page, `show`, the API and `eval` all read `Evidence.level`.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.statuses import EvidenceLevel
from worker.repo_config import CONFIG_FILE, TEST_FILES, matches

REPORT_PATH = "/tmp/.frogfix-test-report.xml"
HOOK_DIR = "/tmp/.frogfix-python"
# The verification runs' environment. pytest reads PYTEST_ADDOPTS wherever the test command starts it
# (make, tox with pass_env, scripts); xunit1 keeps each test's file, so node ids are exact
# (`tests/test_x.py::TestC::test_y[1]`). PYTHONSAFEPATH keeps Python from putting the working tree
# first on sys.path at start, so `python -m pytest` cannot import a `pytest.py` or `pytest/` the
# patch adds; HOOK_DIR's sitecustomize (RUNNER_GUARD) imports the runner, then puts the tree back
# where Python would have, so the tests import the repository's code as they always did, and drops
# PYTHONSAFEPATH for the runner's children (werkzeug's tests start scripts with their own PYTHONPATH:
# with PYTHONSAFEPATH inherited, a script could not import its sibling modules).
REPORT_ENV = {
    "PYTEST_ADDOPTS": f"--junitxml={REPORT_PATH} -o junit_family=xunit1",
    "PYTHONSAFEPATH": "1",
    "PYTHONPATH": HOOK_DIR,
}
# pytest announces the report it writes; that line is FrogFix's doing, not the project's, so logs drop it.
REPORT_NOTICE = re.compile(r"^-* ?generated xml file: " + re.escape(REPORT_PATH) + r" ?-*\r?\n?", re.M)
RUNNERS = ("pytest", "py.test")
RUNNER_GUARD = f"""import os, sys
def _frogfix_guard():
    argv = list(getattr(sys, "orig_argv", []))[1:]
    module, script, i = None, None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "-m" and i + 1 < len(argv):
            module = argv[i + 1]
            break
        if arg.startswith("-m") and len(arg) > 2:
            module = arg[2:]
            break
        if arg in ("-c", "-"):
            break
        if arg in ("-W", "-X", "-Q"):
            i += 2
            continue
        if not arg.startswith("-"):
            script = arg
            break
        i += 1
    if module in {RUNNERS!r} or (script is not None and os.path.basename(script) in {RUNNERS!r}):
        import pytest  # the installed runner, before the working tree is on the path
        # The runner is in: the tests' own subprocesses (a script run with its own PYTHONPATH, which
        # drops this hook) get Python's usual path again. Before the runner, children keep it safe.
        os.environ.pop("PYTHONSAFEPATH", None)
    if module is not None:
        first = os.getcwd()
    elif script is not None:
        first = os.path.dirname(os.path.realpath(script))
    else:
        first = ""
    if first not in sys.path:
        sys.path.insert(0, first)
_frogfix_guard()
del _frogfix_guard
"""


def without_report_notice(log: str) -> str:
    """A verification log as the project's runner would print it without FrogFix's report option."""
    return REPORT_NOTICE.sub("", log)


def verification_command(command: str) -> str:
    """The test command behind the runner guard: HOOK_DIR's sitecustomize is written first (a fresh
    sandbox's /tmp), so it exists before any Python of the test command starts."""
    write = f"mkdir -p {HOOK_DIR} && printf '%s' {shlex.quote(RUNNER_GUARD)} > {HOOK_DIR}/sitecustomize.py"
    return f"{write} && {{ {command}\n}}"
MAX_TESTS = 200_000
READER_LOG_LIMIT = 32 * 1024**2
# A test case's outcome, worst last: a case reported twice (a pass, then a teardown error) keeps the worst.
OUTCOME_RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
# Runs in the sandbox after the test command (python3 -I -S: no site, no working tree on sys.path):
# one JSON line per test case, [outcome, node id]; exit 3 when there is no report.
REPORT_READER = r"""
import json, os, sys
from xml.etree import ElementTree
path = sys.argv[1]
if not os.path.isfile(path):
    sys.exit(3)
rank = OUTCOME_RANK
for _, case in ElementTree.iterparse(path):
    if case.tag != "testcase":
        continue
    outcome = "passed"
    for child in case:
        kind = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(child.tag)
        if kind and rank[kind] > rank[outcome]:
            outcome = kind
    name, klass, file = case.get("name", ""), case.get("classname", ""), case.get("file", "")
    if file:
        module = file[:-3].replace("/", ".") if file.endswith(".py") else ""
        inner = klass[len(module) + 1:] if module and klass.startswith(module + ".") else ""
        node = file + "::" + (inner.replace(".", "::") + "::" if inner else "") + name
    else:
        node = (klass + "::" if klass else "") + name
    print(json.dumps([outcome, node]))
    case.clear()
""".replace("OUTCOME_RANK", repr(OUTCOME_RANK))
# The patch's test changes, which the reproduction applies alone to the base source: the review rules'
# test files (worker/repo_config.py), conftest.py files among them, less FrogFix's own configuration.
TEST_PATHS = (*(p for p in TEST_FILES if p != CONFIG_FILE), "**/test/**", "**/conftest.py")
PASSED = frozenset({"passed"})
FAILED = frozenset({"failed", "error"})


def read_report(log: str) -> dict[str, str] | None:
    """The reader's output as {node id: outcome}; None when it is not a whole report."""
    outcomes: dict[str, str] = {}
    rank = OUTCOME_RANK
    for line in log.splitlines():
        if not line.strip():
            continue
        try:
            outcome, node = json.loads(line)
        except (ValueError, TypeError):
            return None  # not our reader's line: a cut log, or something else wrote here
        if not (isinstance(node, str) and isinstance(outcome, str) and outcome in rank) or len(outcomes) >= MAX_TESTS:
            return None
        if node not in outcomes or rank[outcome] > rank[outcomes[node]]:
            outcomes[node] = outcome
    return outcomes or None


@dataclass(frozen=True)
class RunOutcome:
    """One test run as the verdict sees it: its exit code, whether it could start, its per-test outcomes."""

    exit_code: int | None
    started: bool  # False: the runner could not start (pytest 2-5, 126/127) or no run happened
    tests: Mapping[str, str] | None = None  # None: no per-test report (another runner, or none written)


@dataclass
class Reproduction:
    """The patch's own test changes, run on the base source."""

    tests: list[str] = field(default_factory=list)  # fail there, pass with the whole patch
    failed_on_base: bool = False
    ran: bool = False
    files: list[str] = field(default_factory=list)  # the test files the patch adds or changes

    def to_dict(self) -> dict[str, Any]:
        return {"tests": self.tests, "failed_on_base": self.failed_on_base, "ran": self.ran, "files": self.files}


@dataclass
class Evidence:
    """The verdict and what it rests on (`fix --json`'s `evidence`)."""

    level: EvidenceLevel
    fail_to_pass: list[str] = field(default_factory=list)
    pass_to_fail: list[str] = field(default_factory=list)  # failed with the patch, did not fail on the base
    still_failing: list[str] = field(default_factory=list)
    flaky: list[str] = field(default_factory=list)
    reproduction: Reproduction = field(default_factory=Reproduction)
    per_test: bool = False  # False: judged by exit codes (the runner's report could not be read)
    reason: str = ""
    passing: bool = False  # the patched runs agree and no test fails in them

    @property
    def proves_fix(self) -> bool:
        """Whether `status` may be `fixed`."""
        return self.level in (EvidenceLevel.reproduced, EvidenceLevel.failed_before)

    @property
    def publishable_unproven(self) -> bool:
        """An unproven patch worth a draft marked "not reproduced": every test passes with it. One that
        leaves tests failing and fixes none of them is no fix, whatever those tests are."""
        return self.level == EvidenceLevel.unproven and self.passing

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level.value,
            "fail_to_pass": self.fail_to_pass,
            "pass_to_fail": self.pass_to_fail,
            "still_failing": self.still_failing,
            "flaky": self.flaky,
            "reproduction": self.reproduction.to_dict(),
            "per_test": self.per_test,
            "reason": self.reason,
            "passing": self.passing,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Evidence:
        repro = data.get("reproduction") or {}
        return cls(
            EvidenceLevel(data["level"]),
            list(data.get("fail_to_pass") or []),
            list(data.get("pass_to_fail") or []),
            list(data.get("still_failing") or []),
            list(data.get("flaky") or []),
            Reproduction(list(repro.get("tests") or []), bool(repro.get("failed_on_base")), bool(repro.get("ran")),
                         list(repro.get("files") or [])),
            bool(data.get("per_test")),
            str(data.get("reason") or ""),
            bool(data.get("passing")),
        )


def judge(
    before: RunOutcome,
    after: Sequence[RunOutcome],
    reproduction: RunOutcome | None,
    test_files: Sequence[str],
    base_again: Sequence[RunOutcome] = (),
) -> Evidence:
    """The one verdict: unrunnable, else regressed, else reproduced, else failed_before, else unproven.

    `base_again`: more runs on the base (made to confirm a suspected regression); a test whose
    outcome differs between the base runs is flaky, as one that differs between the patched runs."""
    repro = Reproduction(files=list(test_files), ran=reproduction is not None)
    if not before.started or not after or not all(run.started for run in after):
        return Evidence(EvidenceLevel.unrunnable, reproduction=repro, reason="the tests could not run with the patch")
    if before.tests is not None and all(run.tests is not None for run in after):
        again = [run.tests for run in base_again if run.started and run.tests is not None]
        runs = [run.tests for run in after if run.tests is not None]
        return _per_test(before.tests, runs, reproduction, repro, again)
    return _by_exit_codes(before, after, reproduction, repro)


def _per_test(
    base: Mapping[str, str],
    runs: Sequence[Mapping[str, str]],
    reproduction: RunOutcome | None,
    repro: Reproduction,
    base_again: Sequence[Mapping[str, str]] = (),
) -> Evidence:
    """Each test against its state before the fix: the base run's, or for the tests the patch adds or
    changes, the reproduction's (the base source with those tests)."""
    ids = sorted(set().union(*runs))
    bases = [base, *base_again]
    flaky = [
        t for t in ids
        if len({_kind(run.get(t)) for run in runs}) > 1 or len({_kind(run.get(t)) for run in bases if t in run}) > 1
    ]  # fmt: skip
    steady = {t: _kind(runs[0].get(t)) for t in ids if t not in flaky}
    shown = reproduction.tests if reproduction is not None and reproduction.started else None
    before = dict(base)
    if shown is not None:
        before.update({t: outcome for t, outcome in shown.items() if _in_files(t, repro.files)})
    fail_to_pass = [t for t, kind in steady.items() if kind == "passed" and before.get(t) in FAILED]
    pass_to_fail = [t for t, kind in steady.items() if kind == "failed" and before.get(t) not in FAILED]
    still_failing = [t for t, kind in steady.items() if kind == "failed" and before.get(t) in FAILED]
    if shown is not None:
        repro.tests = [t for t in fail_to_pass if _in_files(t, repro.files) and shown.get(t) in FAILED]
        repro.failed_on_base = bool(repro.tests)
    # Without a reproduction, every fail_to_pass test failed on the base itself: failed_before.
    evidence = Evidence(EvidenceLevel.unproven, fail_to_pass, pass_to_fail, still_failing, flaky, repro, True)
    evidence.passing = not flaky and all(kind != "failed" for kind in steady.values())
    return _level(evidence)


def _by_exit_codes(
    before: RunOutcome, after: Sequence[RunOutcome], reproduction: RunOutcome | None, repro: Reproduction
) -> Evidence:
    """Runners FrogFix cannot read per test: the exit codes, with the patch's test files standing for its tests."""
    codes = {run.exit_code for run in after}
    if len(codes) > 1:
        why = "the patched runs' exit codes differ (flaky): nothing is proven"
        return Evidence(EvidenceLevel.unproven, reproduction=repro, reason=why)
    if codes != {0}:
        if before.exit_code == 0:
            why = f"the tests pass on the base and fail with the patch (exit {after[0].exit_code})"
            return Evidence(EvidenceLevel.regressed, reproduction=repro, reason=why)
        why = f"the tests fail on the base and with the patch (exit {before.exit_code}, then {after[0].exit_code})"
        return Evidence(EvidenceLevel.unproven, reproduction=repro, reason=why)
    if reproduction is not None and reproduction.started and reproduction.exit_code not in (0, None):
        repro.tests, repro.failed_on_base = list(repro.files), True
        why = "the patch's test files fail on the base source and pass with the fix (exit codes)"
        return Evidence(EvidenceLevel.reproduced, reproduction=repro, reason=why, passing=True)
    if before.exit_code != 0:
        why = f"the tests failed on the base (exit {before.exit_code}) and pass with the patch"
        return Evidence(EvidenceLevel.failed_before, reproduction=repro, reason=why, passing=True)
    why = "the tests pass before and after the patch, and no test of the patch reproduces the bug"
    return Evidence(EvidenceLevel.unproven, reproduction=repro, reason=why, passing=True)


def _level(evidence: Evidence) -> Evidence:
    if evidence.pass_to_fail:
        evidence.level = EvidenceLevel.regressed
        evidence.reason = f"{len(evidence.pass_to_fail)} test(s) fail with the patch that did not fail before it"
    elif evidence.reproduction.tests:
        evidence.level = EvidenceLevel.reproduced
        evidence.reason = "the patch's tests fail on the base source and pass with the fix"
    elif evidence.fail_to_pass:
        evidence.level = EvidenceLevel.failed_before
        evidence.reason = "tests that failed on the base pass with the patch"
    elif evidence.passing:
        evidence.level = EvidenceLevel.unproven
        evidence.reason = "nothing failed before the patch, and no test of the patch reproduces the bug"
    else:
        evidence.level = EvidenceLevel.unproven
        evidence.reason = "the patch fixes no failing test and reproduces nothing, and tests still fail with it"
    return evidence


def _kind(outcome: str | None) -> str:
    """passed, failed (error too) or absent/skipped, for comparing runs."""
    if outcome in FAILED:
        return "failed"
    return "passed" if outcome in PASSED else "other"


def _in_files(node: str, files: Sequence[str]) -> bool:
    path = node.split("::", 1)[0]
    return path in files


def patch_test_files(paths: Sequence[str]) -> list[str]:
    """The paths of a patch that are tests (or their data and fixtures)."""
    return [path for path in paths if matches(path, TEST_PATHS)]


def evidence_line(evidence: Evidence, limit: int = 3) -> str:
    """One line for `fix`, `show` and the timeline: the level, why, and the first tests it rests on."""
    named = evidence.reproduction.tests or evidence.pass_to_fail or evidence.fail_to_pass
    shown = ", ".join(named[:limit]) + (f" (+{len(named) - limit})" if len(named) > limit else "")
    extra = f"; still failing before and after: {len(evidence.still_failing)}" if evidence.still_failing else ""
    return f"evidence: {evidence.level} ({evidence.reason}{': ' + shown if shown else ''}){extra}"
