"""Evidence that proves a fix: each test's outcome on the base and with the patch, the reproduction, one verdict.

Why it is built this way:
- Per-test outcomes come from FrogFix's pytest plugin (or its JavaScript runners' preload,
  worker/attempts/js_runners.py), sent out of the test process on the results channel as each test ends
  (worker/attempts/run_checks.py), never from the test log or a report file, which the code under test
  can write at will. Runners FrogFix cannot read keep exit codes.
- The code under review runs inside the test process, so it can still lie to the plugin. A run
  whose own reports disagree (the sentinels, the summary line, the exit code) is `tampered`, ranked
  above every other level; a patch whose code reaches into the runner (worker/attempts/reach_in.py) proves
  nothing, whatever its tests say. Evidence makes the known forgeries visible; a person still reads
  the diff (docs/EVIDENCE.md lists what is not caught).
- The reproduction is the strongest evidence a fix can carry: the tests the patch adds or
  changes, run on the base source (the patch's test changes alone), fail there and pass with
  the whole patch. The bug is shown, then shown fixed.
- One verdict (`EvidenceLevel`), decided here and nowhere else: `fix`, the pipeline, the MR,
  the job page, `show`, the API and `eval` all read `Evidence.level`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.answers import EvidenceAnswer
from app.statuses import PROVEN_LEVELS, EvidenceLevel
from worker.attempts.js_runners import HOOK_DIR as JS_HOOK_DIR
from worker.attempts.js_runners import NODE_ENV, reporter_files
from worker.attempts.repo_config import CONFIG_FILE, TEST_FILES, matches
from worker.attempts.run_checks import PLUGIN_MODULE, plugin_source

HOOK_DIR = "/tmp/.frogfix-python"
# The verification runs' environment. pytest reads PYTEST_ADDOPTS wherever the test command starts it
# (make, tox with pass_env, scripts): `-p` loads FrogFix's plugin (worker/attempts/evidence_plugin.py), which
# sends each result out on the results channel as it happens (worker/attempts/run_checks.py reads it).
# PYTHONSAFEPATH keeps Python from putting the working tree first on sys.path at start, so
# `python -m pytest` cannot import a `pytest.py` or `pytest/` the patch adds; HOOK_DIR's sitecustomize
# (RUNNER_GUARD) imports the runner and the plugin, then puts the tree back where Python would have, so
# the tests import the repository's code as they always did, and drops PYTHONSAFEPATH for the runner's
# children (werkzeug's tests start scripts with their own PYTHONPATH: with PYTHONSAFEPATH inherited, a
# script could not import its sibling modules).
# NODE_OPTIONS loads FrogFix's preload for JavaScript runners wherever node starts (worker/attempts/js_runners.py);
# it acts only in a runner's own main process.
REPORT_ENV = {
    "PYTEST_ADDOPTS": f"-p {PLUGIN_MODULE}",
    "PYTHONSAFEPATH": "1",
    "PYTHONPATH": HOOK_DIR,
    **NODE_ENV,
}
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
        import PLUGIN_MODULE  # FrogFix's plugin, which takes the results channel before any project code runs
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
""".replace("PLUGIN_MODULE", PLUGIN_MODULE)


def verification_command(command: str, sentinels: Mapping[str, str]) -> str:
    """The test command behind the runner guard and FrogFix's plugin: both are written first (a fresh
    sandbox's /tmp), so they exist before any Python of the test command starts; `mkdir` from the
    system's own folders (`command -p`), never from the environment first on the job's PATH. The
    JavaScript preload and reporters go into their own folder, the same sentinels in the preload."""
    files = {f"{HOOK_DIR}/sitecustomize.py": RUNNER_GUARD, f"{HOOK_DIR}/{PLUGIN_MODULE}.py": plugin_source(sentinels)}
    files.update({f"{JS_HOOK_DIR}/{name}": text for name, text in reporter_files(sentinels).items()})
    writes = " && ".join(f"printf '%s' {shlex.quote(text)} > {path}" for path, text in files.items())
    return f"command -p mkdir -p {HOOK_DIR} {JS_HOOK_DIR} && {writes} && {{ {command}\n}}"


# The patch's test changes, which the reproduction applies alone to the base source: the review rules'
# test files (worker/attempts/repo_config.py), conftest.py files among them, less FrogFix's own configuration.
TEST_PATHS = (*(p for p in TEST_FILES if p != CONFIG_FILE), "**/test/**", "**/conftest.py")
PASSED = frozenset({"passed"})
FAILED = frozenset({"failed", "error"})


@dataclass(frozen=True)
class RunOutcome:
    """One test run as the verdict sees it: its exit code, whether it could start, its per-test outcomes."""

    exit_code: int | None
    started: bool  # False: the runner could not start (pytest 2-5, 126/127) or no run happened
    tests: Mapping[str, str] | None = None  # None: no per-test results (another runner, or none sent)
    tampered: str = ""  # how its own reports were found to disagree (worker/attempts/run_checks.py); "" if they agree
    unavailable: tuple[str, ...] = ()  # the checks that could not be made on it, and why


@dataclass
class Reproduction:
    """The patch's own test changes, run on the base source."""

    tests: list[str] = field(default_factory=list)  # fail there, pass with the whole patch
    failed_on_base: bool = False
    ran: bool = False
    files: list[str] = field(default_factory=list)  # the test files the patch adds or changes


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
    checks: list[str] = field(default_factory=list)  # forgery checks that could not be made, and why

    @property
    def proves_fix(self) -> bool:
        """Whether `status` may be `fixed`."""
        return self.level in PROVEN_LEVELS

    @property
    def publishable_unproven(self) -> bool:
        """An unproven patch worth a draft marked "not reproduced": every test passes with it. One that
        leaves tests failing and fixes none of them is no fix, whatever those tests are."""
        return self.level == EvidenceLevel.unproven and self.passing

    def to_dict(self) -> dict[str, Any]:
        """`fix --json`'s `evidence`, an attempt's stored verdict: the evidence answer (app/answers.py)."""
        return EvidenceAnswer.model_validate(self).as_json()

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
            [str(note) for note in data.get("checks") or []],
        )


def judge(
    before: RunOutcome,
    after: Sequence[RunOutcome],
    reproduction: RunOutcome | None,
    test_files: Sequence[str],
    base_again: Sequence[RunOutcome] = (),
    reach_in: Sequence[str] = (),
) -> Evidence:
    """The one verdict: tampered, else unrunnable, else regressed, else reproduced, else failed_before,
    else unproven; with `reach_in` (the patch's code reaches into the runner), at most unproven.

    `base_again`: more runs on the base (made to confirm a suspected regression); a test whose
    outcome differs between the base runs is flaky, as one that differs between the patched runs."""
    repro = Reproduction(files=list(test_files), ran=reproduction is not None)
    checks = list(dict.fromkeys(n for run in (before, *after, *([reproduction] if reproduction else []))
                                for n in run.unavailable))  # fmt: skip
    forged = _forged(before, after, reproduction)
    if forged:
        return Evidence(EvidenceLevel.tampered, reproduction=repro, reason=forged, checks=checks)
    if before.tampered:  # the project's own runs fail a check: it cannot tell a patch's forgery here
        checks.append(f"forgery checks: the base commit's own run fails them ({before.tampered})")
    evidence = _verdict(before, after, reproduction, repro, base_again)
    evidence.checks = checks
    if reach_in and evidence.proves_fix:
        evidence.level = EvidenceLevel.unproven
        evidence.reason = f"the patch's code reaches into the test runner ({reach_in[0]}), so its tests prove nothing"
    return evidence


def _forged(before: RunOutcome, after: Sequence[RunOutcome], reproduction: RunOutcome | None) -> str:
    """How a run with the patch was found forged; "" when none was, or the base's own run already disagrees."""
    if before.tampered:
        return ""
    runs = [(run, "after the patch") for run in after]
    runs += [(reproduction, "of the patch's tests on the base source")] if reproduction is not None else []
    for run, label in runs:
        if run.tampered:
            return f"{run.tampered} (in the run {label})"
        if run.started and run.exit_code == 0 and run.tests is None and before.tests is not None:
            return f"the run {label} exited 0 and sent no results on the results channel, though the base's run did"
    return ""


def _verdict(
    before: RunOutcome,
    after: Sequence[RunOutcome],
    reproduction: RunOutcome | None,
    repro: Reproduction,
    base_again: Sequence[RunOutcome],
) -> Evidence:
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
