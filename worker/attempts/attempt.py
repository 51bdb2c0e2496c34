"""One attempt, owned here: workspace, `.frogfix.yml` and guidance, trajectory, sandbox, Leaf, patch, review, tests.

The pipeline, `manage.py fix` and replay all run an attempt through `AttemptRunner.run` and differ
only in what they hand it: an observer (database writes, progress lines, or the replay checker)
and a workspace source (the pool, a local checkout, or the recorded base). So a rule added here (a
refusal, a verification run, the line between infrastructure failures and no fix) holds for all.

The sandbox's patch is judged only through worker/attempts/stored_patch.py (what git stores when it
applies it, outside the sandbox); from then on the attempt's `patch` is git's regeneration, and
that is what is tested, stored, pushed and shown. Every git call runs in the isolated git
environment (gitcalls.git_environment), so no filter, hook or driver of the worker's own config runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from app.attempt_events import AttemptEvent, AttemptEventKind
from app.endings import Ending, EndingKind
from app.outcome_words import ending
from app.selection import Candidate, Choice, Pair, choose, cross_checks, settled
from app.settings import Settings
from app.statuses import INFRA_EXITS, AttemptOutcome, AttemptStatus, EvidenceLevel, ExitReason
from app.usage import UsageFigures
from sandbox.base import PatchTooLarge
from worker.attempts.evidence import (
    patch_test_files,
)
from worker.attempts.js_runners import one_file_hint
from worker.attempts.reach_in import reach_in
from worker.attempts.repo_config import RepoConfig, load_guidance, load_repo_config, refusal_reasons, review_flags
from worker.attempts.stored_patch import EvidenceLimits, PatchEvidence, PatchRefused, take_evidence
from worker.attempts.verifier import (
    AttemptContext,
    AttemptObserver,
    TestEvidence,
    Verification,
    Verifier,
    environment_for,
)
from worker.environment.builder import Environments
from worker.environment.readiness import could_not_start, hint
from worker.environment.report import EnvironmentReport, EnvironmentUnusable, failed
from worker.git import publishing, workspace_pool
from worker.git.merging import CONFLICT_AUTHOR as RESOLUTION_AUTHOR
from worker.git.merging import Resolution, changed_paths, full_patch
from worker.git.workspace_sources import WorkspaceSource
from worker.leaf.loop import LeafLimits, LeafResult, StepRecord, run_leaf
from worker.leaf.model import ModelClient
from worker.leaf.prompts import RepoGuidance, add_guidance, add_test_command, system_prompt
from worker.leaf.trajectory_writer import TrajectoryWriter
from worker.wiring import leaf_limits_from, open_job_sandbox, sampling_from, sandbox_limits, setup_opener

FLAKY_FLAG = "the patched tests gave different results between runs (flaky)"
REACH_IN_FLAG = "reaches into the test runner (its tests prove nothing)"
TAMPERED_FLAG = "tampered: its test results were forged"
NOT_REPRODUCED_FLAG = "not reproduced"



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

    `resolution` (an update round that conflicted, worker/git/merging.py): the start is the conflicted
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


def attempt_spec(
    settings: Settings,
    *,
    job_id: int | str,
    number: int,
    base_commit: str,
    task: str,
    trajectory: str,
    fields: dict[str, Any],
    seconds_left: float | None = None,
    start_commit: str | None = None,
    resolution: Resolution | None = None,
    labels: dict[str, str] | None = None,
    system: str | None = None,
    recorded: dict[str, Any] | None = None,
    limits: LeafLimits | None = None,
) -> AttemptSpec:
    """The one place an attempt's spec is made: the job core (forge and local jobs) and replay call it.

    The system prompt, limits, model label and sampling come from settings; a replay passes its
    recording's `system` prompt, and a plain replay `recorded` (the recording's `model_label` and
    `sampling`): its task is then sent as it was, its guidance included (`read_guidance` off)."""
    return AttemptSpec(
        job_id=job_id,
        number=number,
        base_commit=base_commit,
        start_commit=start_commit,
        resolution=resolution,
        system_prompt=system if system is not None else system_prompt(settings.prompts_dir),
        task=task,
        limits=limits or leaf_limits_from(settings, seconds_left),
        trajectory=trajectory,
        model_label=recorded["model_label"] if recorded else settings.model_name,
        sampling=dict(recorded["sampling"]) if recorded else sampling_from(settings).body_fields(),
        trajectory_fields=fields,
        labels=labels or {"frogfix/job": str(job_id), "frogfix/attempt": str(number)},
        read_guidance=recorded is None,
    )


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
    reach_in: list[str] = field(default_factory=list)  # how the patch's code reaches into the runner
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
    def ending(self) -> Ending:
        """How this attempt ended a job, typed: the model's or the sandbox's failure (the loop's), a refusal,
        forged results, or no fix; `reason` is its detail."""
        if self.infrastructure_failure:
            model = self.leaf.exit_reason == ExitReason.llm_query_error
            kind = EndingKind.model_error if model else EndingKind.sandbox_failure
            failed = Ending(kind, cause=self.leaf.error or "")
            return (self.leaf.failure or failed).but(self.reason)
        if self.outcome == AttemptOutcome.refused:
            return Ending(EndingKind.refused, self.reason, cause="; ".join(self.refused))
        if self.outcome == AttemptOutcome.tampered:
            return Ending(EndingKind.tampered, self.reason)
        if self.outcome == AttemptOutcome.cancelled:
            return Ending(EndingKind.cancelled, self.reason)
        return Ending(EndingKind.no_fix, self.reason)

    @property
    def status(self) -> AttemptStatus:
        if self.outcome == AttemptOutcome.verified:
            return AttemptStatus.verified
        if self.outcome == AttemptOutcome.unproven:
            return AttemptStatus.unproven
        if self.outcome == AttemptOutcome.tampered:
            return AttemptStatus.tampered
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
            setup_opener(settings),
            scope=scope,
            source_repository=source.repository,
            on_event=lambda event: self.observer.report(event),
            private=root / "environments",  # the job's own layers go with its folder
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
            _, environment = self._ready_at_base(
                spec.base_commit, self.root / f"environment-{spec.number}", tests=review is not None, config=config
            )
            self.source.checkout(ws, spec.start)
        else:
            if spec.start != spec.base_commit:
                self.source.checkout(ws, spec.start)
            try:
                environment = self._ready(spec.base_commit, spec.start, ws, config, tests=review is not None)
            except BaseException:
                workspace_pool.remove_workspace(ws)
                raise
        try:
            self.observer.report(AttemptEvent(
                AttemptEventKind.agent_started,
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
            ))
            leaf, patch, too_large = self._agent(spec, model, ws, config, guidance, environment)
        finally:
            workspace_pool.remove_workspace(ws)
        self.observer.report(AttemptEvent(
            AttemptEventKind.agent_finished,
            f"attempt {spec.number}: {ending(leaf.exit_reason, leaf.steps)}",
            {
                "attempt": spec.number,
                "exit_reason": leaf.exit_reason,
                "steps": leaf.steps,
                "patch_bytes": len(patch),
                "patch_lines": len(patch.splitlines()),
            },
        ))
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

    def verify_tree(
        self, config: RepoConfig, base: str, tree: str, review: ReviewPolicy, reach_in: list[str] | None = None
    ) -> Verification:
        """The evidence for a whole tree against `base` (an update round: the merged branch on the target's
        new head): before on `base`, after on `base` with every change to `tree`, and those changes' test
        files alone on `base` (the reproduction), by the rules every patch meets."""
        repository = self.source.repository()
        whole = full_patch(repository, base, tree)
        tests = patch_test_files(changed_paths(repository, base, tree))
        return self.verifier.verify(config, base, whole, review.verify_runs, base, tests, reach_in=reach_in)

    def check_merge(self, base: str, tree: str, review: ReviewPolicy) -> tuple[RepoConfig, Verification | None]:
        """A clean update round's verification, with no agent: `.frogfix.yml` read from `base` (the target's
        new head), the environment and the tests' start on it checked as before an attempt, then `verify_tree`;
        no verification when no test command was found. Raises EnvironmentUnusable as an attempt would."""
        config, _ = self._ready_at_base(base, self.root / "merge-check", tests=True)
        if not config.test_command:
            return config, None
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
            agrees = cross[(a, b)] = self._cross(source.config, start, source, tests)
            verb = "pass" if agrees else "do not pass"
            self.observer.report(AttemptEvent(
                AttemptEventKind.agreement, f"attempt {b}'s reproduction tests {verb} with attempt {a}'s patch",
                {"patch_of": a, "tests_of": b, "agrees": agrees},
            ))

    def _cross(self, config: RepoConfig, start: str, source: AttemptResult, tests: AttemptResult) -> bool:
        """Whether `tests`' reproduction tests pass over `source`'s patch: its source changes alone
        (its own test files left out), with `tests`' test files (app/selection.py agreement)."""
        assert source.changes is not None and tests.changes is not None and tests.verification is not None
        own = patch_test_files(source.changes.paths)
        theirs = patch_test_files(tests.changes.paths)
        label = f"attempt {source.number}'s patch with attempt {tests.number}'s tests (agreement)"
        steps = [(source.patch, None, own), (tests.patch, theirs, None)]
        run = self.verifier.run(config, start, steps, label)
        wanted = tests.verification.verdict.reproduction.tests
        if run.exit_code is None:
            return False
        if run.tests is not None and tests.verification.verdict.per_test:
            return all(run.tests.get(test) == "passed" for test in wanted)
        return run.exit_code == 0

    def _ready(
        self, base: str, start: str, ws: Path, config: RepoConfig, *, tests: bool
    ) -> EnvironmentReport | None:
        """Before any model call: the environment (built or cached), then, once per job, the base
        commit's tests. Raises EnvironmentUnusable when either says the tests cannot run here.
        Returns the environment for the agent's sandbox (the checkout at `ws`'s own)."""
        with self._ready_lock:
            return self._ready_once(base, start, ws, config, tests=tests)

    def _ready_once(
        self, base: str, start: str, ws: Path, config: RepoConfig, *, tests: bool
    ) -> EnvironmentReport | None:
        if self._unusable is not None:  # said once: attempts beside or after it do not build it again
            raise EnvironmentUnusable(self._unusable)
        try:
            return self._ready_first(base, start, ws, config, tests=tests)
        except EnvironmentUnusable as exc:
            self._unusable = exc.report
            raise

    def _ready_first(
        self, base: str, start: str, ws: Path, config: RepoConfig, *, tests: bool
    ) -> EnvironmentReport | None:
        if self.environment is None:
            report = environment_for(self.context, ws, config, start, trusted=start == base)
            if not report.ok:
                raise EnvironmentUnusable(report)
            if tests and config.test_command:
                before = self.verifier.before(config, base)
                why = could_not_start(config.test_command, before.exit_code, before.timed_out, before.log)
                if why is not None:
                    found = hint(before.log)
                    reason = f"the tests could not start on the base commit: {why}" + (f"; {found}" if found else "")
                    unusable = failed(self.redact(reason), before.log, built=report.built, tests_unstartable=True)
                    raise EnvironmentUnusable(unusable)
            self.environment = report
            return report
        return environment_for(self.context, ws, config, start, trusted=start == base)

    def _ready_at_base(
        self, base: str, ws: Path, *, tests: bool, config: RepoConfig | None = None
    ) -> tuple[RepoConfig, EnvironmentReport | None]:
        """`_ready` over a fresh checkout of `base` at `ws` (removed after), with `.frogfix.yml` read there
        unless given. For an update round, whose own start (the conflicted merge) may hold markers in the
        very files the environment is built from, and for a clean merge's check, which has no agent."""
        self.source.checkout(ws, base)
        try:
            config = config or load_repo_config(ws)
            return config, self._ready(base, base, ws, config, tests=tests)
        finally:
            workspace_pool.remove_workspace(ws)

    def _base_config(self, spec: AttemptSpec, ws: Path) -> tuple[RepoConfig, RepoGuidance | None]:
        """`.frogfix.yml` and the guidance from the base commit's checkout at `ws`, which the agent
        then uses when it starts from the base (else the caller checks the start out there)."""
        self.source.checkout(ws, spec.base_commit)
        try:
            config = load_repo_config(ws)
            guidance = load_guidance(ws, config) if spec.read_guidance else None
        except BaseException:
            workspace_pool.remove_workspace(ws)
            raise
        if spec.start != spec.base_commit:
            workspace_pool.remove_workspace(ws)
        return config, guidance

    def _agent(
        self,
        spec: AttemptSpec,
        model: ModelClient,
        ws: Path,
        config: RepoConfig,
        guidance: RepoGuidance | None,
        environment: EnvironmentReport | None,
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
            hint = one_file_hint(config.test_command)
            task = add_guidance(add_test_command(task, config.test_command, hint), guidance)
        env, project = (environment.path, environment.project) if environment is not None else (None, None)
        with closing(open_job_sandbox(ws, self.settings, config.image, spec.labels, env, project=project)) as box:
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
        result.reach_in = reach_in(changes, self.source.repository())
        result.flags += [f"{REACH_IN_FLAG}: {line}" for line in result.reach_in]
        # `config` was read from the base commit, so a patch rewriting .frogfix.yml cannot change the verification.
        refused = refusal_reasons(changes, config, allow_binary=review.allow_binary, allow_ci=review.allow_ci)
        if spec.resolution is not None:
            # The judged tree into the repository itself (the evidence's own objects were private), so the
            # rules, the verification's whole patch and the merge commit can read it.
            repository, scratch = self.source.repository(), self.root / f"resolution-{n}"
            publishing.commit_patch(repository, spec.start, changes.patch, "resolution", RESOLUTION_AUTHOR, scratch,
                               expect_tree=changes.tree)  # fmt: skip
            workspace_pool.remove_workspace(scratch)
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
        self.observer.report(AttemptEvent(AttemptEventKind.patch_refused, reason, data))
        return _ended(result, AttemptOutcome.refused, reason)

    def _verify(self, result: AttemptResult, spec: AttemptSpec, review: ReviewPolicy) -> AttemptResult:
        config = result.config
        number = result.number
        self.observer.report(AttemptEvent(AttemptEventKind.verifying, f"attempt {number}: verifying the patch",
                                          {"attempt": number}))
        tests = patch_test_files(result.changes.paths) if result.changes is not None else []
        if spec.resolution is not None and result.changes is not None:  # the merged branch as a whole
            verification = self.verify_tree(config, spec.base_commit, result.changes.tree, review, result.reach_in)
        else:
            verification = self.verifier.verify(
                config, spec.base_commit, result.patch, review.verify_runs, spec.start, tests, result.reach_in
            )
        result.verification = verification
        verdict = verification.verdict
        if verification.flaky:
            result.flags = [*result.flags, FLAKY_FLAG]
        kind = AttemptEventKind.verified if verdict.proves_fix else AttemptEventKind.not_verified
        summary = f"attempt {result.number}: {verification.summary(config.test_timeout)}"
        data = {"attempt": result.number, "flaky": verification.flaky, "evidence": verdict.level.value}
        self.observer.report(AttemptEvent(kind, summary, data))
        if verdict.level == EvidenceLevel.tampered:
            result.flags = [*result.flags, f"{TAMPERED_FLAG}: {verdict.reason}"]
            reason = f"attempt {result.number}'s test results were forged: {verdict.reason}"
            return _ended(result, AttemptOutcome.tampered, reason)
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

    @property
    def tampered(self) -> list[AttemptResult]:
        """The attempts whose test results were forged: never chosen; named when nothing is published."""
        return [r for r in self.results if r.outcome == AttemptOutcome.tampered]

    @property
    def reported(self) -> AttemptResult | None:
        """The attempt a job's words report: the chosen one, else the first tampered (saying how it was
        found), else the last."""
        forged = self.tampered
        return self.chosen or (forged[0] if forged else self.results[-1] if self.results else None)


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



def _ended(result: AttemptResult, outcome: AttemptOutcome, reason: str) -> AttemptResult:
    result.outcome, result.reason = outcome, reason
    return result
