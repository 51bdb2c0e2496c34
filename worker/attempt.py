"""One attempt, owned here: workspace, `.frogfix.yml` and guidance, trajectory, sandbox, Leaf, patch, review, tests.

The pipeline, `manage.py fix` and replay all run an attempt through `AttemptRunner.run` and differ
only in what they hand it: an observer (database writes, progress lines, or the replay checker)
and a workspace source (the pool, a local checkout, or the recorded base). So a rule added here (a
refusal, a verification run, the line between infrastructure failures and no fix) holds for all.

The sandbox's patch is judged only through worker/patch_evidence.py (what git stores when it
applies it, outside the sandbox); from then on the attempt's `patch` is git's regeneration, and
that is what is tested, stored, pushed and shown. Every git call runs in the isolated git
environment (repos.git_environment), so no filter, hook or driver of the worker's own config runs.
"""

from __future__ import annotations

import enum
import functools
import itertools
import re
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from app.outcome_words import ending, run_words
from app.selection import Candidate, Choice, Pair, choose, cross_checks, settled
from app.settings import Settings
from app.statuses import INFRA_EXITS, AttemptStatus, ExitReason
from app.usage import UsageFigures
from sandbox.base import PatchTooLarge, SandboxError
from worker import repos
from worker.environment.builder import EnvironmentReport, Environments, EnvironmentUnusable, failed
from worker.environment.readiness import could_not_start, hint
from worker.evidence import (
    READER_LOG_LIMIT,
    REPORT_ENV,
    REPORT_PATH,
    REPORT_READER,
    Evidence,
    RunOutcome,
    judge,
    patch_test_files,
    read_report,
    verification_command,
    without_report_notice,
)
from worker.leaf.loop import LeafLimits, LeafResult, StepRecord, run_leaf
from worker.leaf.model import ModelClient
from worker.leaf.prompts import RepoGuidance, add_guidance, add_test_command
from worker.leaf.trajectory import TrajectoryWriter
from worker.merging import CONFLICT_AUTHOR as RESOLUTION_AUTHOR
from worker.merging import Resolution, changed_paths, full_patch
from worker.patch_evidence import EvidenceLimits, PatchEvidence, PatchRefused, take_evidence
from worker.repo_config import RepoConfig, load_guidance, load_repo_config, refusal_reasons, review_flags
from worker.report import TestEvidence
from worker.wiring import open_job_sandbox, open_setup_sandbox, sandbox_limits
from worker.workspaces import WorkspaceSource

LOG_LIMIT = 60_000
PatchStep = tuple[str, list[str] | None, list[str] | None]  # a patch, the paths it is limited to, the paths left out
READER_TIMEOUT_S = 120.0
FLAKY_FLAG = "the patched tests gave different results between runs (flaky)"
NOT_REPRODUCED_FLAG = "not reproduced"


@dataclass
class TestRun:
    exit_code: int | None
    log: str
    timed_out: bool = False
    seconds: float = 0.0
    tests: dict[str, str] | None = None  # node id -> outcome, from the runner's own report (worker/evidence.py)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "exit_code": self.exit_code,
            "log": self.log,
            "timed_out": self.timed_out,
            "seconds": round(self.seconds, 3),
        }
        if self.tests is not None:
            counts: dict[str, int] = {}
            for outcome in self.tests.values():
                counts[outcome] = counts.get(outcome, 0) + 1
            data["counts"] = counts
        return data

    def outcome(self, command: str) -> RunOutcome:
        started = self.exit_code is not None and could_not_start(command, self.exit_code, self.timed_out) is None
        return RunOutcome(self.exit_code, started, self.tests)


class AttemptOutcome(enum.StrEnum):
    """How an attempt ended; `AttemptResult.status` maps it to the attempt row's status."""

    verified = "verified"  # the evidence proves the fix (worker/evidence.py: reproduced or failed_before)
    unproven = "unproven"  # the tests pass, but nothing failed before and nothing reproduces the bug
    not_verified = "not_verified"  # tests failed, timed out or were flaky
    refused = "refused"  # a review rule (or the patch size) refused the patch: never tested, never pushed
    no_patch = "no_patch"
    no_test_command = "no_test_command"
    cancelled = "cancelled"
    unreviewed = "unreviewed"  # a plain replay: the agent's run and patch only


@dataclass(frozen=True)
class AttemptSpec:
    """What one attempt runs: the prompt, the limits, and where its trajectory goes.

    With `read_guidance` (the default) the runner appends the repository's guidance, read from the
    base commit's checkout before the agent runs, to `task`; without it (a plain replay, whose
    recorded task already holds what the agent got) `task` is sent as it is.

    `start_commit` (a review round: the head of the bot's branch) is what the agent works on and
    what the patch is taken against; `base_commit` stays the commit the tests run on before the
    patch, and the one `.frogfix.yml` and the guidance are read from, so a commit FrogFix pushed
    cannot change its own verification. Without it the attempt starts from the base.

    `resolution` (an update round that conflicted, worker/merging.py): the start is the conflicted
    merge, `base_commit` the target's new head; the resolution must meet its rules, and the tests
    judge the whole change the merged branch makes on the target, not the resolution alone.
    """

    job_id: int | str
    number: int
    base_commit: str
    system_prompt: str
    task: str
    limits: LeafLimits
    trajectory: str  # relative to the data folder, as a job records it
    model_label: str
    sampling: dict[str, Any]
    trajectory_fields: dict[str, Any] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    read_guidance: bool = True
    start_commit: str | None = None
    resolution: Resolution | None = None

    @property
    def start(self) -> str:
        """The commit the agent's checkout and the patch start from."""
        return self.start_commit or self.base_commit


@dataclass(frozen=True)
class ReviewPolicy:
    """The rules a patch meets before it is trusted: refusals, then `verify_runs` patched test runs."""

    allow_binary: bool
    refuse_flagged: bool
    verify_runs: int
    allow_ci: bool = False  # CI configuration changes are refused unless FROGFIX_ALLOW_CI_CHANGES
    evidence: EvidenceLimits = field(default_factory=EvidenceLimits)  # what git may make of the patch

    @classmethod
    def from_settings(cls, settings: Settings) -> ReviewPolicy:
        sandbox = sandbox_limits(settings)  # the job's sandbox: git may store no file it could not write
        return cls(
            settings.allow_binary_patches,
            settings.refuse_protected_changes,
            settings.verify_runs,
            allow_ci=settings.allow_ci_changes,
            evidence=EvidenceLimits.for_job(settings.max_patch_bytes, sandbox),
        )


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

    @functools.cached_property
    def verdict(self) -> Evidence:
        """The one verdict (worker/evidence.py), judged once: a Verification is not changed once made."""
        repro = self.reproduction.outcome(self.command) if self.reproduction is not None else None
        after = [run.outcome(self.command) for run in self.after]
        again = [run.outcome(self.command) for run in self.base_again]
        return judge(self.before.outcome(self.command), after, repro, self.test_files, again)

    @property
    def flaky(self) -> bool:
        return len({run.exit_code for run in self.after}) > 1 or bool(self.verdict.flaky)

    def evidence(self) -> TestEvidence:
        reproduction = self.reproduction.to_dict() if self.reproduction is not None else None
        return TestEvidence(
            self.command, self.before.to_dict(), [run.to_dict() for run in self.after], self.flaky,
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
        before = limit if self.before.timed_out else run_words(self.before.to_dict())
        after = [limit if r.timed_out else run_words(r.to_dict()) for r in self.after]
        runs = after[0] if len(set(after)) == 1 else ", ".join(after)
        shown = f"{runs} ({len(after)} runs)" if len(after) > 1 else runs
        return f"tests before: {before}; after: {shown}; evidence: {self.verdict.level}"


@dataclass
class AttemptResult:
    """Everything an attempt produced, typed: callers record or print it, none recomputes it."""

    number: int
    outcome: AttemptOutcome
    reason: str
    leaf: LeafResult
    patch: str  # git's regeneration once judged (see `changes`); the sandbox's text before that
    config: RepoConfig
    trajectory: str  # relative to the data folder
    flags: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    verification: Verification | None = None
    guidance: RepoGuidance | None = None  # what the agent was given, as read from the base commit
    sandbox_patch: str = ""  # the sandbox's own text, as the trajectory records it: never judged, never pushed
    changes: PatchEvidence | None = None  # what git stored for it; the review rules and the MR read this
    test_seconds: float = 0.0  # wall time of the test runs this attempt made (the shared base run counts once)

    @property
    def usage(self) -> UsageFigures:
        """The agent's figures, with the sandbox time of this attempt's test runs added."""
        return self.leaf.figures() + UsageFigures(sandbox_seconds=self.test_seconds)

    @property
    def infrastructure_failure(self) -> bool:
        """The model or the sandbox failed, not the model's judgement: the job fails rather than finds no fix."""
        return self.outcome == AttemptOutcome.no_patch and self.leaf.exit_reason in INFRA_EXITS

    @property
    def status(self) -> AttemptStatus:
        if self.outcome == AttemptOutcome.verified:
            return AttemptStatus.verified
        if self.outcome == AttemptOutcome.unproven:
            return AttemptStatus.unproven
        if self.outcome == AttemptOutcome.refused:
            return AttemptStatus.rejected
        if self.outcome == AttemptOutcome.cancelled:
            return AttemptStatus.cancelled
        return AttemptStatus.failed if self.infrastructure_failure else AttemptStatus.no_fix

    @property
    def evidence(self) -> TestEvidence | None:
        return self.verification.evidence() if self.verification else None

    @property
    def candidate(self) -> Candidate:
        """This attempt as the selection rule (app/selection.py) sees it."""
        publishable = self.outcome in (AttemptOutcome.verified, AttemptOutcome.unproven)
        if self.verification is None:
            return Candidate(self.number, None, False)
        verdict = self.verification.verdict
        lines = sum(added + removed for _path, added, removed in self.changes.diffstat()) if self.changes else 0
        return Candidate(
            self.number, verdict.level, publishable, frozenset(verdict.fail_to_pass), frozenset(verdict.pass_to_fail),
            frozenset(verdict.reproduction.tests), lines,
        )


class AttemptObserver(Protocol):
    """What the caller sees of an attempt as it runs; each caller's observer is its only difference."""

    def on_step(self, record: StepRecord) -> None: ...

    def cancelled(self) -> bool:
        """Asked before every model call and tool call; True stops the loop (`cancelled`)."""
        ...

    def stage(self, kind: str, message: str, data: dict[str, Any]) -> None:
        """`agent_started`, `agent_finished`, `patch_refused`, `testing`, `tested`, `verifying`, `verified`,
        `not_verified`: the pipeline writes them on the job's timeline, `fix` prints them."""
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
    done = repos.run_git(
        ["-C", str(workspace), "apply", "--binary", "--whitespace=nowarn", *include, "-"],
        env=repos.git_environment(),
        what="git apply",
        timeout=repos.LOCAL_TIMEOUT,
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
) -> TestRun:
    """The repository's test command in a fresh sandbox over `workspace` (which is then removed).

    With a built `environment`, `setup_command` already ran in its setup phase; without one it runs
    before the tests, in the same sandbox."""
    command = config.test_command or ""
    if config.setup_command and environment is None:
        command = f"{config.setup_command} && {command}"
    tests = None
    try:
        with closing(open_job_sandbox(workspace, settings, image, environment=environment, env=REPORT_ENV)) as box:
            res = box.run_command(verification_command(command), timeout=config.test_timeout)
            if not res.timed_out:  # the runner's own report, read by a command of ours, not from the log
                reader = f"python3 -I -S -c {shlex.quote(REPORT_READER)} {REPORT_PATH}"
                read = box.run_command(reader, timeout=READER_TIMEOUT_S, log_limit=READER_LOG_LIMIT)
                tests = read_report(read.log) if read.exit_code == 0 and not read.timed_out else None
    except SandboxError as exc:
        return TestRun(None, f"sandbox failure while running the tests: {exc}")
    finally:
        repos.remove_workspace(workspace)
    log = bounded_log(redact(without_report_notice(res.log)))
    return TestRun(res.exit_code, log, res.timed_out, res.duration_s, tests)


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
                self._before = self._run(config, base, None, "before the patch")
                self.command = config.test_command
            return self._before

    def verify(
        self, config: RepoConfig, base: str, patch: str, runs: int, start: str | None = None,
        test_files: list[str] | None = None,
    ) -> Verification:
        """Before on `base`; after on `start` (the base unless a round built on a later head) with the
        patch; with `test_files` (the patch's test changes), those alone on `start` (the reproduction)."""
        before = self.before(config, base)
        label = "after the patch" if runs == 1 else "after the patch, run {}"
        after = [self._run(config, start or base, patch, label.format(i + 1)) for i in range(runs)]
        reproduction = None
        if test_files:
            label = "with the patch's tests alone (the reproduction)"
            reproduction = self._run(config, start or base, patch, label, only=test_files)
        command, files = config.test_command or "", list(test_files or [])
        verification = Verification(command, before, after, reproduction, files)
        if not (verification.verdict.pass_to_fail and verification.verdict.per_test):
            return verification
        # A test that breaks only in a loaded moment is no regression: one more run on each side,
        # and a test whose outcome differs across them is reported flaky instead.
        again = self._run(config, base, None, "before the patch, confirming")
        confirming = self._run(config, start or base, patch, "after the patch, confirming")
        return Verification(command, before, [*after, confirming], reproduction, files, [again])

    def _spent(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds
        self._mine.seconds = self.thread_seconds + seconds

    @property
    def thread_seconds(self) -> float:
        """The test runs' seconds made by the calling thread (an attempt's own, with attempts side by side)."""
        return float(getattr(self._mine, "seconds", 0.0))

    def cross(self, config: RepoConfig, start: str, source: AttemptResult, tests: AttemptResult) -> bool:
        """Whether `tests`' reproduction tests pass over `source`'s patch: its source changes alone
        (its own test files left out), with `tests`' test files (app/selection.py agreement)."""
        assert source.changes is not None and tests.changes is not None and tests.verification is not None
        own = patch_test_files(source.changes.paths)
        theirs = patch_test_files(tests.changes.paths)
        label = f"attempt {source.number}'s patch with attempt {tests.number}'s tests (agreement)"
        steps = [(source.patch, None, own), (tests.patch, theirs, None)]
        run = self._run(config, start, steps, label)
        wanted = tests.verification.verdict.reproduction.tests
        if run.exit_code is None:
            return False
        if run.tests is not None and tests.verification.verdict.per_test:
            return all(run.tests.get(test) == "passed" for test in wanted)
        return run.exit_code == 0

    def _run(
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
                repos.remove_workspace(ws)
                return TestRun(None, problem)
        started = time.monotonic()
        try:
            env = environment_for(c, ws, config, base)
        except BaseException:
            repos.remove_workspace(ws)
            raise
        if not env.ok:
            repos.remove_workspace(ws)
            self._spent(time.monotonic() - started)
            if not patch:
                raise EnvironmentUnusable(env)
            return TestRun(None, f"the environment for the patched dependency files could not be built: {env.reason}")
        c.observer.stage("testing", f"running the tests {label}: {config.test_command}", {})
        try:
            run = run_tests(ws, config, c.settings, c.redact, image=config.image, environment=env.path)
        finally:
            self._spent(time.monotonic() - started)
        c.observer.stage("tested", f"tests {label}: {run_words(run.to_dict())}", {"label": label})
        return run


class AttemptRunner:
    """Runs a job's attempts one after another over one workspace source; the base's test run is shared."""

    def __init__(
        self,
        settings: Settings,
        redact: Callable[[str], str],
        source: WorkspaceSource,
        root: Path,
        observer: AttemptObserver,
        *,
        scope: str = "local",
    ) -> None:
        """`scope` names the project, so environments are cached per project (see worker/environment/builder.py)."""
        self.settings, self.redact, self.source, self.root = settings, redact, source, root
        self._observer = observer
        self._local = threading.local()  # each thread's attempt may have its own observer (`run`)
        self._ready_lock = threading.Lock()  # the environment and the base run are made once, by one thread
        self._unusable: EnvironmentReport | None = None  # why the tests cannot run here, once found
        environments = Environments(
            settings,
            redact,
            lambda ws, mounts, env, image: open_setup_sandbox(ws, settings, mounts, env, image),
            scope=scope,
            source_repository=source.repository,
            on_stage=observer.stage,
        )
        self.context = AttemptContext(settings, redact, source, root, observer, environments)
        self.verifier = Verifier(self.context)
        self.environment: EnvironmentReport | None = None  # the base commit's, once the first attempt checked it
        # Agreement runs cross one attempt's patch with another's tests on the start; an update round's
        # attempts start from a conflicted merge, where that means nothing, so it turns them off.
        self.agree = True

    @property
    def observer(self) -> AttemptObserver:
        """The running attempt's observer: the one `run` was given in this thread, else the runner's."""
        return getattr(self._local, "observer", None) or self._observer

    def run(
        self, spec: AttemptSpec, model: ModelClient, review: ReviewPolicy | None,
        observer: AttemptObserver | None = None,
    ) -> AttemptResult:
        """One attempt to its outcome. `review=None` (a plain replay) stops after the agent's patch.

        `observer`: this attempt's own (attempts running side by side each have one); the runner's
        otherwise. Raises RepoConfigError for an unusable `.frogfix.yml` and SandboxError when the
        sandbox itself fails (infrastructure); everything the model did comes back as the result.
        """
        self._local.observer = observer
        try:
            return self._run(spec, model, review)
        finally:
            self._local.observer = None

    def _run(self, spec: AttemptSpec, model: ModelClient, review: ReviewPolicy | None) -> AttemptResult:
        ws = self.root / f"attempt-{spec.number}"
        config, guidance = self._base_config(spec, ws)
        if spec.resolution is not None:  # its dependency files may hold conflict markers: build from the target
            environment = self._ready_from_base(spec, config, tests=review is not None)
        if spec.start != spec.base_commit:
            self.source.checkout(ws, spec.start)
        if spec.resolution is None:
            try:
                environment = self._ready(spec.base_commit, spec.start, ws, config, tests=review is not None)
            except BaseException:
                repos.remove_workspace(ws)
                raise
        try:
            self.observer.stage(
                "agent_started",
                f"attempt {spec.number}: running the agent ({spec.model_label})",
                {
                    "attempt": spec.number,
                    "trajectory": spec.trajectory,
                    "base_commit": spec.base_commit,
                    **({"start_commit": spec.start} if spec.start != spec.base_commit else {}),
                    "test_command": config.test_command,
                    "test_command_source": config.test_command_source,
                    "guidance": [self.redact(f.source) for f in guidance.files] if guidance else [],
                },
            )
            leaf, patch, too_large = self._agent(spec, model, ws, config, guidance, environment)
        finally:
            repos.remove_workspace(ws)
        self.observer.stage(
            "agent_finished",
            f"attempt {spec.number}: {ending(leaf.exit_reason, leaf.steps)}",
            {
                "attempt": spec.number,
                "exit_reason": leaf.exit_reason,
                "steps": leaf.steps,
                "patch_bytes": len(patch),
                "patch_lines": len(patch.splitlines()),
            },
        )
        result = AttemptResult(
            spec.number, AttemptOutcome.unreviewed, "", leaf, patch, config, spec.trajectory, guidance=guidance,
            sandbox_patch=patch,
        )
        if review is None:
            return result
        tested_before = self.verifier.thread_seconds
        try:
            return self._judge(result, spec, review, too_large)
        finally:
            result.test_seconds = self.verifier.thread_seconds - tested_before

    def verify_tree(self, config: RepoConfig, base: str, tree: str, review: ReviewPolicy) -> Verification:
        """The evidence for a whole tree against `base` (an update round: the merged branch on the target's
        new head): before on `base`, after on `base` with every change to `tree`, and those changes' test
        files alone on `base` (the reproduction), by the rules every patch meets."""
        repository = self.source.repository()
        whole = full_patch(repository, base, tree)
        tests = patch_test_files(changed_paths(repository, base, tree))
        return self.verifier.verify(config, base, whole, review.verify_runs, base, tests)

    def check_merge(self, base: str, tree: str, review: ReviewPolicy) -> tuple[RepoConfig, Verification]:
        """A clean update round's verification, with no agent: `.frogfix.yml` read from `base` (the target's
        new head), the environment and the tests' start on it checked as before an attempt, then `verify_tree`.
        Raises EnvironmentUnusable as an attempt would."""
        ws = self.root / "merge-check"
        self.source.checkout(ws, base)
        try:
            config = load_repo_config(ws)
            self._ready(base, base, ws, config, tests=True)
        finally:
            repos.remove_workspace(ws)
        return config, self.verify_tree(config, base, tree, review)

    def agreement(self, results: Sequence[AttemptResult], cross: dict[Pair, bool], start: str) -> None:
        """Make the agreement runs the choice can turn on (app/selection.py `cross_checks`), each once."""
        if not self.agree:
            return
        by_number = {r.number: r for r in results}
        for a, b in cross_checks([r.candidate for r in results]):
            if (a, b) in cross or self.observer.cancelled():
                continue
            source, tests = by_number[a], by_number[b]
            agrees = cross[(a, b)] = self.verifier.cross(source.config, start, source, tests)
            verb = "pass" if agrees else "do not pass"
            self.observer.stage(
                "agreement", f"attempt {b}'s reproduction tests {verb} with attempt {a}'s patch",
                {"patch_of": a, "tests_of": b, "agrees": agrees},
            )

    def _ready(self, base: str, start: str, ws: Path, config: RepoConfig, *, tests: bool) -> Path | None:
        """Before any model call: the environment (built or cached), then, once per job, the base
        commit's tests. Raises EnvironmentUnusable when either says the tests cannot run here.
        Returns the environment folder for the agent's sandbox (the checkout at `ws`'s own)."""
        with self._ready_lock:
            return self._ready_once(base, start, ws, config, tests=tests)

    def _ready_once(self, base: str, start: str, ws: Path, config: RepoConfig, *, tests: bool) -> Path | None:
        if self._unusable is not None:  # said once: attempts beside or after it do not build it again
            raise EnvironmentUnusable(self._unusable)
        try:
            return self._ready_first(base, start, ws, config, tests=tests)
        except EnvironmentUnusable as exc:
            self._unusable = exc.report
            raise

    def _ready_first(self, base: str, start: str, ws: Path, config: RepoConfig, *, tests: bool) -> Path | None:
        if self.environment is None:
            report = environment_for(self.context, ws, config, start)
            if not report.ok:
                raise EnvironmentUnusable(report)
            if tests and config.test_command:
                before = self.verifier.before(config, base)
                why = could_not_start(config.test_command, before.exit_code, before.timed_out)
                if why is not None:
                    found = hint(before.log)
                    reason = f"the tests could not start on the base commit: {why}" + (f"; {found}" if found else "")
                    raise EnvironmentUnusable(failed(self.redact(reason), before.log, built=report.built))
            self.environment = report
            return report.path
        return environment_for(self.context, ws, config, start).path

    def _ready_from_base(self, spec: AttemptSpec, config: RepoConfig, *, tests: bool) -> Path | None:
        """`_ready` over a checkout of the base commit: the environment an update round's agent gets, whose
        own checkout (the conflicted merge) may hold markers in the very files the environment is built from."""
        ws = self.root / f"environment-{spec.number}"
        self.source.checkout(ws, spec.base_commit)
        try:
            return self._ready(spec.base_commit, spec.base_commit, ws, config, tests=tests)
        finally:
            repos.remove_workspace(ws)

    def _base_config(self, spec: AttemptSpec, ws: Path) -> tuple[RepoConfig, RepoGuidance | None]:
        """`.frogfix.yml` and the guidance from the base commit's checkout at `ws`, which the agent
        then uses when it starts from the base (else the caller checks the start out there)."""
        self.source.checkout(ws, spec.base_commit)
        try:
            config = load_repo_config(ws)
            guidance = load_guidance(ws, config) if spec.read_guidance else None
        except BaseException:
            repos.remove_workspace(ws)
            raise
        if spec.start != spec.base_commit:
            repos.remove_workspace(ws)
        return config, guidance

    def _agent(
        self,
        spec: AttemptSpec,
        model: ModelClient,
        ws: Path,
        config: RepoConfig,
        guidance: RepoGuidance | None,
        environment: Path | None,
    ) -> tuple[LeafResult, str, PatchTooLarge | None]:
        """Leaf in a fresh sandbox over `ws`, then the patch against the base; an oversized patch is kept out.

        The guidance goes into the task and, whole, into the trajectory, where the job page shows it.
        """
        fields = {**spec.trajectory_fields, "limits": asdict(spec.limits)}  # what `eval` re-runs the task under
        if spec.start != spec.base_commit:  # a round: replay checks this out, not the base
            fields["start_commit"] = spec.start
        if guidance is not None:
            fields["repository_guidance"] = guidance.to_dict()
        writer = TrajectoryWriter(
            self.settings.data_dir / spec.trajectory,
            job_id=spec.job_id,
            model=spec.model_label,
            sampling=spec.sampling,
            base_commit=spec.base_commit,
            redact=self.redact,
            fields=fields,
        )

        def on_step(record: StepRecord) -> None:
            writer.on_step(record)
            self.observer.on_step(record)

        task = spec.task
        if spec.read_guidance:  # a plain replay sends the recorded task as it is
            task = add_guidance(add_test_command(task, config.test_command), guidance)
        with closing(open_job_sandbox(ws, self.settings, config.image, spec.labels, environment)) as box:
            leaf = run_leaf(
                model, box, task, system_prompt=spec.system_prompt, limits=spec.limits,
                on_step=on_step, cancel=self.observer.cancelled,
            )
            try:
                patch = box.patch(spec.start)
            except PatchTooLarge as exc:  # the sandbox is fine; this attempt's changes are refused, none stored
                writer.finish(leaf, patch="")
                return leaf, "", exc
        writer.finish(leaf, patch=patch)
        return leaf, patch, None

    def _judge(
        self, result: AttemptResult, spec: AttemptSpec, review: ReviewPolicy, too_large: PatchTooLarge | None
    ) -> AttemptResult:
        """The review rules, then the tests; the first that says no decides the outcome.

        The patch is judged against the commit the agent started from (`spec.start`).
        """
        n, leaf, patch, config = result.number, result.leaf, result.patch, result.config
        if leaf.exit_reason == ExitReason.cancelled:
            return _ended(result, AttemptOutcome.cancelled, "cancelled on request")
        if too_large is not None:
            return self._refuse(result, [f"the patch is larger than {too_large.limit} bytes (FROGFIX_MAX_PATCH_BYTES)"])
        if not patch:
            reason = (
                f"the model could not be used: {leaf.error}"
                if leaf.exit_reason == ExitReason.llm_query_error
                else f"attempt {n} ended ({leaf.exit_reason}) without changing any file"
            )
            return _ended(result, AttemptOutcome.no_patch, reason)
        try:
            changes = take_evidence(
                self.source.repository(), spec.start, patch, self.root / f"evidence-{n}", limits=review.evidence
            )
        except PatchRefused as exc:  # nothing git regenerated, so nothing stored: the trajectory keeps the text
            result.patch = ""
            return self._refuse(result, [str(exc)])
        result.changes, result.patch = changes, changes.patch  # from here on, git's patch only
        if not changes.files:
            return _ended(result, AttemptOutcome.no_patch, f"attempt {n}'s patch changes nothing once applied")
        result.flags = review_flags(changes, config)
        # `config` was read from the base commit, so a patch rewriting .frogfix.yml cannot change the verification.
        refused = refusal_reasons(changes, config, allow_binary=review.allow_binary, allow_ci=review.allow_ci)
        if spec.resolution is not None:
            # The judged tree into the repository itself (the evidence's own objects were private), so the
            # rules, the verification's whole patch and the merge commit can read it.
            repository, scratch = self.source.repository(), self.root / f"resolution-{n}"
            repos.commit_patch(repository, spec.start, changes.patch, "resolution", RESOLUTION_AUTHOR, scratch,
                               expect_tree=changes.tree)  # fmt: skip
            repos.remove_workspace(scratch)
            refused += spec.resolution.refusals(repository, changes.tree)
        if review.refuse_flagged:
            refused += [flag for flag in result.flags if flag not in refused]
        if not config.test_command:  # nothing can verify it; the refusals are still reported
            result.refused = refused
            reason = "no test command was found to verify the patch; add test_command to .frogfix.yml"
            return _ended(result, AttemptOutcome.no_test_command, reason)
        if refused:
            return self._refuse(result, refused)
        return self._verify(result, spec, review)

    def _refuse(self, result: AttemptResult, reasons: list[str]) -> AttemptResult:
        """Never tested, never pushed: the reasons go to the observer and on the result."""
        result.refused = reasons
        reason = self.redact(f"attempt {result.number}'s patch was refused: {'; '.join(reasons)}")
        data = {"attempt": result.number, "reasons": [self.redact(r) for r in reasons]}
        self.observer.stage("patch_refused", reason, data)
        return _ended(result, AttemptOutcome.refused, reason)

    def _verify(self, result: AttemptResult, spec: AttemptSpec, review: ReviewPolicy) -> AttemptResult:
        config = result.config
        self.observer.stage("verifying", f"attempt {result.number}: verifying the patch", {"attempt": result.number})
        tests = patch_test_files(result.changes.paths) if result.changes is not None else []
        if spec.resolution is not None and result.changes is not None:  # the merged branch as a whole
            verification = self.verify_tree(config, spec.base_commit, result.changes.tree, review)
        else:
            verification = self.verifier.verify(
                config, spec.base_commit, result.patch, review.verify_runs, spec.start, tests
            )
        result.verification = verification
        verdict = verification.verdict
        if verification.flaky:
            result.flags = [*result.flags, FLAKY_FLAG]
        kind = "verified" if verdict.proves_fix else "not_verified"
        summary = f"attempt {result.number}: {verification.summary(config.test_timeout)}"
        data = {"attempt": result.number, "flaky": verification.flaky, "evidence": verdict.level.value}
        self.observer.stage(kind, summary, data)
        if verdict.proves_fix:
            return _ended(result, AttemptOutcome.verified, f"verified ({verdict.level}: {verdict.reason})")
        if verdict.publishable_unproven:
            result.flags = [*result.flags, f"{NOT_REPRODUCED_FLAG}: {verdict.reason}"]
            reason = f"attempt {result.number}'s patch is unproven: {verdict.reason}"
            return _ended(result, AttemptOutcome.unproven, reason)
        why = verification.why_not(config.test_timeout)
        reason = f"attempt {result.number}'s patch did not pass the tests ({why})"
        return _ended(result, AttemptOutcome.not_verified, reason)


@dataclass
class AttemptSeries:
    """A job's attempts and the choice among them (app/selection.py), as `run_series` left them."""

    results: list[AttemptResult]
    cross: dict[Pair, bool]
    choice: Choice
    extra_stop: str = ""  # why no (more) extra attempts ran, when the ceiling allowed some

    @property
    def chosen(self) -> AttemptResult | None:
        return next((r for r in self.results if r.number == self.choice.chosen), None)


def run_series(
    runner: AttemptRunner,
    run_one: Callable[[int, bool], AttemptResult | None],
    *,
    attempts: int,
    ceiling: int,
    start: str,
    why_stop: Callable[[], str | None] = lambda: None,
    parallel: int = 1,
    side_by_side_done: Callable[[], None] = lambda: None,
    abort: Callable[[], None] = lambda: None,
) -> AttemptSeries:
    """The one sequence every caller runs: `attempts` attempts (`parallel` of them side by side), then
    extra ones, one at a time, up to `ceiling` while `why_stop()` says nothing (a production job
    waiting, the job's time running out) and the choice is not settled, each followed by the agreement
    runs the choice can turn on; then the choice among what ran.

    `run_one(number, extra)` runs one attempt; None means the series stops there (an extra attempt
    stopped for production, an attempt the infrastructure failed: the caller knows why), and the
    choice is made among the attempts before it. Whatever it raises ends the series: `abort()` tells
    the attempts beside it to stop at their next call, attempts not yet started never start, and
    the exception goes on once they stopped. `side_by_side_done()` runs when the side-by-side attempts
    are over (the caller gives back the model slots they took)."""
    results: list[AttemptResult] = []
    cross: dict[Pair, bool] = {}
    extra_stop = ""
    first = 1
    if parallel > 1 and attempts > 1:
        pool = ThreadPoolExecutor(max_workers=min(parallel, attempts), thread_name_prefix="attempt")
        try:
            futures = [pool.submit(run_one, number, False) for number in range(1, attempts + 1)]
            done = [future.result() for future in futures]  # the first failure, in attempt order, is raised
        except BaseException:  # a failure, a cancel, or the job's time limit arriving in this thread
            abort()
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            pool.shutdown(wait=True)
            side_by_side_done()
        results = [r for r in done if r is not None]
        stopped = len(results) < attempts  # an attempt was stopped: the choice is made among the others now
        if not stopped:
            runner.agreement(results, cross, start)
        first = max(attempts, ceiling) + 1 if stopped else attempts + 1
    else:
        side_by_side_done()
    for number in range(first, max(attempts, ceiling) + 1):
        extra = number > attempts
        if extra:
            if settled([r.candidate for r in results], cross):
                extra_stop = "an attempt reproduced the bug and another agrees with it"
                break
            reason = why_stop()
            if reason:
                extra_stop = reason
                break
        result = run_one(number, extra)
        if result is None:
            extra_stop = f"attempt {number} stopped"
            break
        results.append(result)
        runner.agreement(results, cross, start)
    return AttemptSeries(results, cross, choose([r.candidate for r in results], cross), extra_stop)


def environment_for(context: AttemptContext, ws: Path, config: RepoConfig, commit: str) -> EnvironmentReport:
    """The environment for the checkout at `ws` (one build per distinct declaration; see worker/environment)."""
    return context.environments.for_checkout(
        ws, config.test_command, config.setup_command, config.environment, commit=commit, image=config.image
    )


def _ended(result: AttemptResult, outcome: AttemptOutcome, reason: str) -> AttemptResult:
    result.outcome, result.reason = outcome, reason
    return result
