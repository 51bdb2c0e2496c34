"""Running the tests for an attempt: once on the base commit, then patched, in fresh sandboxes.

`Verifier` owns the test runs of one job (the base run is made once and shared by its attempts,
side by side or not), `Verification` what they showed and the one verdict of worker/attempts/evidence.py
over them. attempt.py's runner judges a patch with these; nothing here knows about the agent.
"""

from __future__ import annotations

import functools
import itertools
import re
import threading
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.answers import TestRunAnswer
from app.attempt_events import AttemptEvent, AttemptEventKind
from app.outcome_words import run_words
from app.settings import Settings
from sandbox.base import SandboxError
from worker.attempts.evidence import REPORT_ENV, Evidence, RunOutcome, judge, verification_command
from worker.attempts.repo_config import RepoConfig
from worker.attempts.run_checks import RESULTS_LIMIT, check_run, new_sentinels
from worker.environment.builder import Environments
from worker.environment.readiness import could_not_start
from worker.environment.report import EnvironmentReport, EnvironmentUnusable
from worker.git import gitcalls, workspace_pool
from worker.git.workspace_sources import WorkspaceSource
from worker.leaf.loop import StepRecord
from worker.wiring import open_job_sandbox

LOG_LIMIT = 60_000
PatchStep = tuple[str, list[str] | None, list[str] | None]  # a patch, the paths it is limited to, the paths left out
@dataclass
class TestEvidence:
    command: str
    before: dict[str, Any] | None
    after: list[dict[str, Any]] = field(default_factory=list)
    flaky: bool = False
    verdict: dict[str, Any] | None = None  # worker/attempts/evidence.py's Evidence.to_dict(): level, fail_to_pass, ...
    reproduction: dict[str, Any] | None = None  # the run of the patch's tests alone on the base source

    def to_dict(self) -> dict[str, Any]:
        """An attempt's stored `tests`: the one `tests` shape (app/answers.py `TestsAnswer`) and, beside the
        runs, the verdict (`evidence`), which the answers lift out of it (`AttemptAnswer`)."""
        data = {"command": self.command, "before": self.before, "after": self.after, "flaky": self.flaky,
                "reproduction": self.reproduction}
        if self.verdict is not None:
            data["evidence"] = self.verdict
        return data


@dataclass
class TestRun:
    exit_code: int | None
    log: str
    timed_out: bool = False
    seconds: float = 0.0
    tests: dict[str, str] | None = None  # node id -> outcome, as sent on the results channel (run_checks.py)
    tampered: str = ""  # how the run's own reports were found to disagree; "" when they agree
    unavailable: list[str] = field(default_factory=list)  # the forgery checks that could not be made

    def answer(self) -> TestRunAnswer:
        """The run as every answer shows it (app/answers.py): per-test results as counts per outcome."""
        counts: dict[str, int] | None = None
        if self.tests is not None:
            counts = {}
            for outcome in self.tests.values():
                counts[outcome] = counts.get(outcome, 0) + 1
        return TestRunAnswer(
            exit_code=self.exit_code, log=self.log, timed_out=self.timed_out, seconds=self.seconds, counts=counts,
            tampered=self.tampered, checks=list(self.unavailable),
        )

    def outcome(self, command: str) -> RunOutcome:
        why = could_not_start(command, self.exit_code, self.timed_out, self.log)
        started = self.exit_code is not None and why is None
        return RunOutcome(self.exit_code, started, self.tests, self.tampered, tuple(self.unavailable))

@dataclass
class Verification:
    """The tests on the base commit once, then `runs` times with the patch (differing results are
    flaky), and the patch's own test changes on the base source (the reproduction) when it has any."""

    command: str
    before: TestRun
    after: list[TestRun]
    reproduction: TestRun | None = None
    test_files: list[str] = field(default_factory=list)
    base_again: list[TestRun] = field(default_factory=list)  # the base once more, to confirm a regression
    reach_in: list[str] = field(default_factory=list)  # how the patch reaches into the runner (reach_in.py)

    @functools.cached_property
    def verdict(self) -> Evidence:
        """The one verdict (worker/attempts/evidence.py), judged once: a Verification is not changed once made."""
        repro = self.reproduction.outcome(self.command) if self.reproduction is not None else None
        after = [run.outcome(self.command) for run in self.after]
        again = [run.outcome(self.command) for run in self.base_again]
        return judge(self.before.outcome(self.command), after, repro, self.test_files, again, self.reach_in)

    @property
    def flaky(self) -> bool:
        return len({run.exit_code for run in self.after}) > 1 or bool(self.verdict.flaky)

    def evidence(self) -> TestEvidence:
        reproduction = self.reproduction.answer().as_json() if self.reproduction is not None else None
        return TestEvidence(
            self.command, self.before.answer().as_json(), [run.answer().as_json() for run in self.after], self.flaky,
            verdict=self.verdict.to_dict(), reproduction=reproduction,
        )

    def why_not(self, timeout: float) -> str:
        first = self.after[0]
        if first.timed_out:
            return f"timed out after {timeout:g} s"
        if first.exit_code is None:
            return first.log[:300]
        return self.verdict.reason

    def summary(self, timeout: float) -> str:
        """The timeline's line, in the words `fix` and `show` use (app/outcome_words.py)."""
        limit = f"timed out after {timeout:g} s"
        before = limit if self.before.timed_out else run_words(self.before.answer().as_json())
        after = [limit if r.timed_out else run_words(r.answer().as_json()) for r in self.after]
        runs = after[0] if len(set(after)) == 1 else ", ".join(after)
        shown = f"{runs} ({len(after)} runs)" if len(after) > 1 else runs
        return f"tests before: {before}; after: {shown}; evidence: {self.verdict.level}"

class AttemptObserver(Protocol):
    """What the caller sees of an attempt as it runs; each caller's observer is its only difference."""

    def on_step(self, record: StepRecord) -> None: ...

    def cancelled(self) -> bool:
        """Asked before every model call and tool call; True stops the loop (`cancelled`)."""
        ...

    def report(self, event: AttemptEvent) -> None:
        """What the attempt did (app/attempt_events.py): the pipeline and `fix` record it with the one
        recorder (`attempt_events.record`), `fix` and replay print it."""
        ...


def bounded_log(text: str, limit: int = LOG_LIMIT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - limit} chars cut ...]\n{text[-half:]}"


def apply_patch(
    workspace: Path, patch: str, only: list[str] | None = None, without: list[str] | None = None
) -> str | None:
    """Apply a patch to a checkout with the isolated git environment; returns git's complaint when it does not apply.

    `only`: apply just these paths' changes (the reproduction applies the patch's test files alone);
    `without`: apply all but these (a cross-check applies one patch's source changes alone)."""
    include = [f"--include={_glob_literal(path)}" for path in only or []]
    include += [f"--exclude={_glob_literal(path)}" for path in without or []]
    done = gitcalls.run_git(
        ["-C", str(workspace), "apply", "--binary", "--whitespace=nowarn", *include, "-"],
        env=gitcalls.git_environment(),
        what="git apply",
        timeout=gitcalls.LOCAL_TIMEOUT,
        stdin=patch.encode("utf-8", "surrogateescape"),  # the sandbox keeps odd bytes as surrogates
        check=False,
    )
    if done.returncode == 0:
        return None
    return f"the patch does not apply to the base commit: {done.stderr.decode('utf-8', 'replace').strip()[:1000]}"


def run_tests(
    workspace: Path,
    config: RepoConfig,
    settings: Settings,
    redact: Callable[[str], str],
    image: str | None = None,
    environment: Path | None = None,
    project: Path | None = None,
) -> TestRun:
    """The repository's test command in a fresh sandbox over `workspace` (which is then removed).

    With a built `environment`, `setup_command` already ran in its setup phase; without one it runs
    before the tests, in the same sandbox."""
    command = config.test_command or ""
    if config.setup_command and environment is None:
        command = f"{config.setup_command} && {command}"
    sentinels = new_sentinels()
    try:
        with closing(open_job_sandbox(
            workspace, settings, image, environment=environment, env=REPORT_ENV, project=project
        )) as box:
            res = box.run_command(
                verification_command(command, sentinels), timeout=config.test_timeout, results_limit=RESULTS_LIMIT
            )
    except SandboxError as exc:
        return TestRun(None, f"sandbox failure while running the tests: {exc}")
    finally:
        workspace_pool.remove_workspace(workspace)
    # Per-test results as they left the test process, checked against what it printed and returned.
    check = check_run(res.results, res.log, res.exit_code, res.timed_out, config.test_command or "", sentinels)
    log = bounded_log(redact(res.log))
    return TestRun(res.exit_code, log, res.timed_out, res.duration_s, check.tests, redact(check.tampered),
                   [redact(note) for note in check.unavailable])


def _glob_literal(path: str) -> str:
    """`path` as a pattern git's --include matches literally."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", path)


@dataclass(frozen=True)
class AttemptContext:
    """What every attempt of one job shares: settings, the redactor, the workspace source and folder, the observer."""

    settings: Settings
    redact: Callable[[str], str]
    source: WorkspaceSource
    root: Path
    observer: AttemptObserver
    environments: Environments


class Verifier:
    """Runs the test command in fresh sandboxes: once on the base commit (kept for later attempts), then patched."""

    def __init__(self, context: AttemptContext) -> None:
        self.context = context
        self._before: TestRun | None = None
        self.command: str | None = None  # the test command of the base run, once it ran
        self.seconds = 0.0  # wall time of every test run so far, sandbox start and checkout included
        self._lock = threading.RLock()  # attempts side by side share the base run and the seconds
        self._runs = itertools.count(1)  # each run's own workspace name
        self._mine = threading.local()

    @property
    def base_run(self) -> TestRun | None:
        """The base commit's run, if it was made (before the first attempt's agent, in every job)."""
        return self._before

    def before(self, config: RepoConfig, base: str) -> TestRun:
        with self._lock:
            if self._before is None:
                self._before = self.run(config, base, None, "before the patch")
                self.command = config.test_command
            return self._before

    def verify(
        self, config: RepoConfig, base: str, patch: str, runs: int, start: str | None = None,
        test_files: list[str] | None = None, reach_in: list[str] | None = None,
    ) -> Verification:
        """Before on `base`; after on `start` (the base unless a round built on a later head) with the
        patch; with `test_files` (the patch's test changes), those alone on `start` (the reproduction).
        `reach_in`: how the patch's code reaches into the runner (worker/attempts/reach_in.py): it caps the verdict."""
        before = self.before(config, base)
        label = "after the patch" if runs == 1 else "after the patch, run {}"
        after = [self.run(config, start or base, patch, label.format(i + 1)) for i in range(runs)]
        reproduction = None
        if test_files:
            label = "with the patch's tests alone (the reproduction)"
            reproduction = self.run(config, start or base, patch, label, only=test_files)
        command, files = config.test_command or "", list(test_files or [])
        reach = list(reach_in or [])
        verification = Verification(command, before, after, reproduction, files, reach_in=reach)
        if not (verification.verdict.pass_to_fail and verification.verdict.per_test):
            return verification
        # A test that breaks only in a loaded moment is no regression: one more run on each side,
        # and a test whose outcome differs across them is reported flaky instead.
        again = self.run(config, base, None, "before the patch, confirming")
        confirming = self.run(config, start or base, patch, "after the patch, confirming")
        return Verification(command, before, [*after, confirming], reproduction, files, [again], reach)

    def _spent(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds
        self._mine.seconds = self.thread_seconds + seconds

    @property
    def thread_seconds(self) -> float:
        """The test runs' seconds made by the calling thread (an attempt's own, with attempts side by side)."""
        return float(getattr(self._mine, "seconds", 0.0))

    def run(
        self, config: RepoConfig, base: str, patch: str | list[PatchStep] | None, label: str,
        only: list[str] | None = None,
    ) -> TestRun:
        """One test run over a fresh checkout; the base run raises EnvironmentUnusable when its tests
        cannot run, a patched run whose dependency files cannot be built fails as a run.

        `patch`: one patch (`only` its paths, when given), or several steps applied in order."""
        c = self.context
        ws = c.root / (f"tests-{next(self._runs)}-" + re.sub(r"[^a-z0-9]+", "-", label)[:60])
        c.source.checkout(ws, base)
        steps: list[PatchStep] = patch if isinstance(patch, list) else [(patch, only, None)] if patch else []
        for text, include, exclude in steps:
            problem = apply_patch(ws, text, include, exclude)
            if problem:
                workspace_pool.remove_workspace(ws)
                return TestRun(None, problem)
        started = time.monotonic()
        try:
            env = environment_for(c, ws, config, base, trusted=not steps)
        except BaseException:
            workspace_pool.remove_workspace(ws)
            raise
        if not env.ok:
            workspace_pool.remove_workspace(ws)
            self._spent(time.monotonic() - started)
            if not patch:
                raise EnvironmentUnusable(env)
            return TestRun(None, f"the environment for the patched dependency files could not be built: {env.reason}")
        c.observer.report(AttemptEvent(AttemptEventKind.testing, f"running the tests {label}: {config.test_command}"))
        try:
            run = run_tests(
                ws, config, c.settings, c.redact, image=config.image, environment=env.path, project=env.project
            )
        finally:
            self._spent(time.monotonic() - started)
        words = run_words(run.answer().as_json())
        c.observer.report(AttemptEvent(AttemptEventKind.tested, f"tests {label}: {words}", {"label": label}))
        return run

def environment_for(
    context: AttemptContext, ws: Path, config: RepoConfig, commit: str, *, trusted: bool
) -> EnvironmentReport:
    """The environment for the checkout at `ws` (one build per distinct declaration; see worker/environment).
    `trusted`: an unpatched checkout of the base, whose environment may be cached for later jobs."""
    return context.environments.for_checkout(
        ws, config.test_command, config.setup_command, config.environment, commit=commit, image=config.image,
        trusted=trusted,
    )

