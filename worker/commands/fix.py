"""`manage.py fix REPO_DIR --issue FILE`: one job on a local checkout, without a forge.

Copy the committed checkout into a fresh workspace, run the Leaf loop in a sandbox, take the
patch, then run the test command in fresh sandboxes on the base commit and with the patch.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from app import local_jobs, trajectory
from app.answers import FixAnswer, TestsAnswer, UsageAnswer
from app.endings import Ending
from app.outcome_words import ending, shown_url
from app.redaction import SecretRedactor, redact_value
from app.settings import Settings, get_settings
from app.statuses import ExitReason, FixStatus
from app.usage import UsageFigures, usage_table
from sandbox.base import SandboxError
from worker.attempts import attempt_events
from worker.attempts.attempt import AttemptOutcome, AttemptResult, AttemptRunner, AttemptSpec, ReviewPolicy, run_series
from worker.attempts.attempt_events import ENVIRONMENT_EVENTS, TEST_PROGRESS_EVENTS, AttemptEvent, AttemptEventKind
from worker.attempts.evidence import Evidence, evidence_line
from worker.attempts.failures import ending_of, environment_ending, stopped_ending
from worker.attempts.repo_config import RepoConfigError
from worker.attempts.verifier import TestRun
from worker.environment.builder import EnvironmentReport, EnvironmentUnusable
from worker.git import gitcalls, mirrors
from worker.git.workspace_sources import CheckoutSource
from worker.leaf.issue_text import sanitize_issue_text
from worker.leaf.loop import StepRecord
from worker.leaf.model import ModelClient
from worker.leaf.prompts import render_task, system_prompt
from worker.wiring import leaf_limits_from, model_from, sampling_from


class FixError(Exception):
    """The job cannot even start (bad repository or issue file); the message says why."""


@dataclass
class FixOutcome:
    job_id: str
    status: str  # FixStatus: fixed, no_fix, failed
    exit_reason: str
    steps: int
    patch: str
    test_command: str | None
    before: TestRun | None
    after: list[TestRun]
    trajectory: str
    error: str | None = None
    flags: list[str] = field(default_factory=list)
    final_answer: str = ""
    usage: UsageFigures = field(default_factory=UsageFigures)
    environment: EnvironmentReport | None = None
    evidence: Evidence | None = None  # the verdict (worker/attempts/evidence.py), when the patch was tested
    reproduction: TestRun | None = None  # the patch's tests alone on the base source
    flaky: bool = False  # as the attempt judged it (worker/attempts/attempt.py Verification.flaky)
    # Every attempt (FROGFIX_ATTEMPTS), each with its evidence and whether it is the one chosen
    # (app/selection.py); the fields above are the chosen attempt's (the last one's when none is).
    attempts: list[dict[str, Any]] = field(default_factory=list)
    selection: dict[str, Any] | None = None
    ending: Ending | None = None  # how a run that did not fix ended, typed (app/endings.py); `error` is its text

    def to_dict(self) -> dict[str, Any]:
        """`fix --json`'s object (app/answers.py `FixAnswer`): `tests` in the one shape, `after` every patched run."""
        tests = TestsAnswer(
            command=self.test_command,
            before=self.before.answer() if self.before else None,
            after=[run.answer() for run in self.after],
            flaky=self.flaky,
            reproduction=self.reproduction.answer() if self.reproduction else None,
        )
        return FixAnswer.model_validate({
            "status": self.status, "exit_reason": self.exit_reason, "steps": self.steps, "patch": self.patch,
            "tests": tests, "evidence": self.evidence.to_dict() if self.evidence else None,
            "trajectory": self.trajectory, "job_id": self.job_id, "error": self.error, "flags": self.flags,
            "ending": self.ending.to_dict() if self.ending else None,
            "summary": self.final_answer, "usage": UsageAnswer.of(self.usage),
            "environment": self.environment.to_dict() if self.environment else None,
            "attempts": self.attempts, "selection": self.selection,
        }).as_json()


def read_issue_file(path: Path) -> tuple[str, str]:
    """First non-empty line is the title (a leading `#` is dropped), the rest is the body."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise FixError(f"cannot read the issue file {path}: {exc}") from exc
    lines = text.strip().splitlines()
    if not lines:
        raise FixError(f"the issue file {path} is empty; its first line is the title")
    return lines[0].lstrip("# ").strip(), "\n".join(lines[1:]).strip()


class LocalFix:
    """One local job. Construct, then `run()`; progress lines go to `progress`."""

    def __init__(
        self,
        repo_dir: Path,
        title: str,
        body: str,
        *,
        settings: Settings | None = None,
        progress: TextIO | None = None,
        model: Any = None,
        job_id: str | None = None,
        kind: str = "fix",
    ) -> None:
        self.settings = settings or get_settings()
        self.repo_dir = repo_dir.resolve()
        self.title, self.body = title, body
        self.progress = progress
        self.job_id = job_id or trajectory.new_local_id()
        self.root = self.settings.resolved_workspace_dir() / self.job_id
        self.trajectory_path = self.settings.data_dir / trajectory.local_path(self.job_id)
        self.redactor = SecretRedactor(self.settings.secret_values())
        self._model = model
        self.kind = kind
        # The job's record (app/local_jobs.py): what `jobs`, `show` and the dashboard read.
        self.record = local_jobs.LocalJobRecord(
            self.settings.data_dir, self.job_id, lambda value: redact_value(value, self.redactor.redact)
        )
        self.recorded_attempts: list[dict[str, Any]] = []
        self.attempt = 1  # the attempt whose steps are reported (fix runs its attempts one at a time)

    def say(self, message: str) -> None:
        if self.progress is not None:
            print(f"[frogfix {self.job_id}] {self.redactor.redact(message)}", file=self.progress, flush=True)

    def model(self) -> ModelClient:
        if self._model is None:
            self._model = model_from(self.settings)
        return self._model

    def run(self) -> FixOutcome:
        """The job, recorded from its start (a refused call, e.g. no such folder, records nothing)."""
        base = self.base_commit()
        self.root.mkdir(parents=True, exist_ok=True)
        model = self.settings.model_name if self._model is None else f"{type(self._model).__name__} (no model server)"
        self.record.start(
            kind=self.kind, title=self.title, body=self.body, repository=str(self.repo_dir), base_commit=base,
            model=model, model_url=shown_url(self.settings.model_base_url) if self._model is None else None,
        )
        try:
            try:
                outcome = self._run(base)
            except gitcalls.RepoError as exc:  # e.g. an unusual checkout that cannot be copied
                outcome = self._failed(ExitReason.git_error, str(exc)[:500], ending_of(exc, str(exc)[:500]))
        except BaseException as exc:  # interrupted (Ctrl-C) or a bug: the record must not stay `running`
            why = str(exc)[:300] if isinstance(exc, Stopped) else f"{type(exc).__name__} {str(exc)[:300]}".strip()
            ended = stopped_ending(why)
            stopped = {"status": FixStatus.failed.value, "exit_reason": ExitReason.cancelled.value,
                       "error": ended.detail, "ending": ended.to_dict()}
            self.record.finish(stopped, self.recorded_attempts)
            raise
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
        self.record.finish(outcome.to_dict(), self.recorded_attempts)
        return outcome

    def base_commit(self) -> str:
        """The checkout's HEAD commit, read with the isolated git environment (no filter or hook runs)."""
        if not self.repo_dir.exists():
            raise FixError(f"{self.repo_dir} does not exist")
        if not self.repo_dir.is_dir():
            raise FixError(f"{self.repo_dir} is not a folder")
        if not (self.repo_dir / ".git").exists():
            raise FixError(f"{self.repo_dir} is not a git checkout")
        try:
            base = mirrors.resolve(self.repo_dir, "HEAD")
        except gitcalls.RepoError as exc:
            raise FixError(f"{self.repo_dir} has no commits yet") from exc
        if mirrors.has_uncommitted_changes(self.repo_dir):
            self.say("note: uncommitted changes in the checkout are not part of the job (it starts from HEAD)")
        return base

    def _run(self, base: str) -> FixOutcome:
        runner = AttemptRunner(
            self.settings, self.redactor.redact, CheckoutSource(self.repo_dir), self.root, self,
            scope=f"local:{self.repo_dir}",
        )
        if self._model is None:
            self.say(f"running the agent with {self.settings.model_name} at {self.settings.model_base_url}")
        else:
            self.say(f"running the agent with {type(self._model).__name__} (no model server)")
        review = ReviewPolicy.from_settings(self.settings)

        def run_one(number: int, extra: bool) -> AttemptResult:
            if self.settings.attempts > 1:
                self.say(f"attempt {number} of {self.settings.attempts}")
            self.attempt = number
            self.record.attempt_started(number, trajectory.local_path(self.job_id, number))
            result = runner.run(self.spec(base, number), self.model(), review)
            for reason in result.refused:
                self.say(f"refused: {reason}")
            return result

        try:  # `fix` has no production queue to yield to: FROGFIX_ATTEMPTS attempts, no extra ones
            series = run_series(runner, run_one, attempts=self.settings.attempts, ceiling=0, start=base)
        except RepoConfigError as exc:
            return self._failed(ExitReason.config_error, str(exc), ending_of(exc, str(exc)))
        except SandboxError as exc:
            why = f"sandbox failure: {exc}"
            return self._failed(ExitReason.tool_error, why, ending_of(exc, why), trajectory=True)
        except EnvironmentUnusable as exc:
            return self._environment_error(runner, exc.report)
        # None chosen: a tampered attempt is the one reported (the job ends `tampered`, saying how it was found).
        forged = series.tampered
        result = series.chosen or (forged[0] if forged else series.results[-1])
        if len(series.results) > 1:
            self.say(f"chosen: {series.choice.why}")
        before = runner.verifier.before(result.config, base) if result.config.test_command else None
        outcome = self.outcome(result, before)
        outcome.trajectory = str(self.settings.data_dir / trajectory.local_path(self.job_id, result.number))
        outcome.attempts = [attempt_entry(r, r.number == series.choice.chosen) for r in series.results]
        outcome.selection = series.choice.to_dict()
        self.recorded_attempts = [record_entry(r, r.number == series.choice.chosen) for r in series.results]
        # Every test run of the job (each attempt's, the agreement runs, a base run made only for the report).
        figures = [r.leaf.figures() for r in series.results]
        outcome.usage = sum(figures, UsageFigures()) + UsageFigures(sandbox_seconds=runner.verifier.seconds)
        outcome.environment = runner.environment
        verdict = {"fix": {k: v for k, v in outcome.to_dict().items() if k not in ("patch", "trajectory")}}
        for r in series.results:
            self.amend_trajectory(r.number, verdict)
        return outcome

    def spec(self, base: str, number: int = 1) -> AttemptSpec:
        s = self.settings
        task = render_task(
            self.title, sanitize_issue_text(self.body), prompts_dir=s.prompts_dir, project=self.repo_dir.name,
            issue_number="",
        )
        return AttemptSpec(
            job_id=self.job_id,
            number=number,
            base_commit=base,
            system_prompt=system_prompt(s.prompts_dir),
            task=task,
            limits=leaf_limits_from(s),
            trajectory=trajectory.local_path(self.job_id, number),
            model_label=s.model_name,
            sampling=sampling_from(s).body_fields(),
            # `kind`: a demo's recording says so, so a replay makes its temporary sample again (recorded.py).
            trajectory_fields={
                "issue": {"title": self.title}, "repository": str(self.repo_dir), "attempt": number, "kind": self.kind,
            },
        )

    def outcome(self, result: AttemptResult, before: TestRun | None) -> FixOutcome:
        """The attempt's verdict as `fix` reports it: `fixed` only when the evidence proves it
        (reproduced or failed_before, worker/attempts/evidence.py); `unproven` when the tests pass but prove nothing."""
        if result.outcome == AttemptOutcome.verified:
            status = FixStatus.fixed
        elif result.outcome == AttemptOutcome.unproven:
            status = FixStatus.unproven
        elif result.outcome == AttemptOutcome.tampered:
            status = FixStatus.tampered
        else:
            status = FixStatus.failed if result.infrastructure_failure else FixStatus.no_fix
        leaf, verification = result.leaf, result.verification
        error = "; ".join(result.refused) or (result.reason if status == FixStatus.tampered else leaf.error)
        return FixOutcome(
            job_id=self.job_id,
            status=status,
            exit_reason=leaf.exit_reason,
            steps=leaf.steps,
            patch=result.patch,
            test_command=result.config.test_command,
            before=before,
            after=verification.after if verification else [],
            trajectory=str(self.trajectory_path),
            error=error,
            ending=None if status in (FixStatus.fixed, FixStatus.unproven) else result.ending.but(error or ""),
            flags=result.refused + [f for f in result.flags if f not in result.refused],
            final_answer=leaf.final_answer,
            evidence=verification.verdict if verification else None,
            reproduction=verification.reproduction if verification else None,
            flaky=verification.flaky if verification else False,
        )

    def _environment_error(self, runner: AttemptRunner, report: EnvironmentReport) -> FixOutcome:
        """The tests cannot run: the job ends before any model call, saying why and what the log ends with."""
        self.say(report.line())
        if report.log_tail:
            self.say("the log ends:\n" + report.log_tail)
        before = runner.verifier.base_run
        return FixOutcome(
            job_id=self.job_id,
            status=FixStatus.environment_error,
            exit_reason=ExitReason.environment_error,
            steps=0,
            patch="",
            test_command=None if before is None else runner.verifier.command,
            before=before,
            after=[],
            trajectory="",
            error=report.reason,
            ending=environment_ending(report, report.reason),
            usage=UsageFigures(sandbox_seconds=runner.verifier.seconds),
            environment=report,
        )

    def amend_trajectory(self, number: int, fields: dict[str, Any]) -> None:
        """Add `fix`'s verdict to an attempt's finished trajectory, atomically (readers see the old or the new file)."""
        path = self.settings.data_dir / trajectory.local_path(self.job_id, number)
        # Redacted string by string, as the writer redacts.
        trajectory.amend(path, redact_value(fields, self.redactor.redact))

    # -- the observer: progress lines ------------------------------------------------------------

    def on_step(self, record: StepRecord) -> None:
        names = ", ".join(c.name for c in record.calls) or "final answer"
        self.say(f"step {record.step + 1}: {names} (context {record.context_tokens} tokens)")
        self.record.progress(self.attempt, record.step + 1)

    def cancelled(self) -> bool:
        return False

    def report(self, event: AttemptEvent) -> None:
        """The attempt's event on the local record through the one recorder (as the pipeline records it), and
        its progress line."""
        attempt_events.record(event, self.record)
        data = event.data
        if event.kind in ENVIRONMENT_EVENTS:
            self.say(event.message)
            cached = event.kind != AttemptEventKind.environment or data.get("cached")
            for line in [] if cached else data.get("detected", []):
                self.say(f"  from {line}")
        elif event.kind == AttemptEventKind.agent_started:
            self.say(f"workspace ready at base commit {data['base_commit'][:12]}")
            source = data.get("test_command_source")
            self.say(f"test command: {data.get('test_command') or '(none found)'} ({source})")
            if data.get("guidance"):
                self.say(f"repository guidance for the agent: {', '.join(data['guidance'])}")
        elif event.kind == AttemptEventKind.agent_finished:
            steps, lines = data["steps"], data["patch_lines"]
            self.say(f"{ending(data['exit_reason'], steps)}; patch {lines} lines")
        elif event.kind in TEST_PROGRESS_EVENTS:
            self.say(event.message)

    def _failed(self, reason: str, error: str, ending: Ending, *, trajectory: bool = False) -> FixOutcome:
        self.say(f"failed: {error}")
        return FixOutcome(
            job_id=self.job_id,
            status=FixStatus.failed,
            exit_reason=reason,
            steps=0,
            patch="",
            test_command=None,
            before=None,
            after=[],
            trajectory=str(self.trajectory_path) if trajectory else "",
            error=error,
            ending=ending,
        )


def attempt_entry(result: AttemptResult, chosen: bool) -> dict[str, Any]:
    """One attempt in `fix --json`'s `attempts`: its outcome, its evidence, whether it is the one chosen."""
    verification = result.verification
    return {
        "number": result.number,
        "chosen": chosen,
        "outcome": result.outcome.value,
        "reason": result.reason,
        "exit_reason": result.leaf.exit_reason,
        "steps": result.leaf.steps,
        "evidence": verification.verdict.to_dict() if verification else None,
        "changed_lines": result.candidate.changed_lines,
        "flags": result.flags,
        "usage": result.usage.to_dict(),
    }


def record_entry(result: AttemptResult, chosen: bool) -> dict[str, Any]:
    """One attempt in the local job's record (app/local_jobs.py): `fix --json`'s entry, plus what the job
    page shows of it (the names a forge job's attempt row has)."""
    evidence = result.evidence
    return {
        **attempt_entry(result, chosen),
        "status": result.status.value,
        "trajectory_path": result.trajectory,
        "patch": result.patch,
        "summary": result.leaf.final_answer,
        "tests": evidence.to_dict() if evidence is not None else None,
        "error": "; ".join(result.refused) or result.leaf.error,
    }


EXIT_CODES: dict[str, int] = {
    FixStatus.fixed: 0, FixStatus.no_fix: 1, FixStatus.failed: 2, FixStatus.environment_error: 3,
    FixStatus.unproven: 4, FixStatus.tampered: 5,
}


def run_fix_command(repo_dir: Path, issue_file: Path, as_json: bool) -> int:
    """The CLI entry: progress on stderr; the JSON object (or a summary) on stdout."""
    try:
        title, body = read_issue_file(issue_file)
    except FixError as exc:
        print(f"frogfix fix: {exc}", file=sys.stderr)
        return 2
    return run_and_report(repo_dir, title, body, as_json)


def run_demo_command(as_json: bool) -> int:
    """A whole job on a generated repository with a replayed model (see worker/commands/demo.py)."""
    import tempfile

    from worker.commands.demo import ISSUE_BODY, ISSUE_TITLE, demo_model, make_sample_repo

    with tempfile.TemporaryDirectory(prefix="frogfix-demo-") as tmp:
        repo = make_sample_repo(Path(tmp))
        print(f"demo: a repository with a bug in add(), at {repo}; the model is a replay", file=sys.stderr)
        return run_and_report(repo, ISSUE_TITLE, ISSUE_BODY, as_json, model=demo_model(), kind="demo")


class Stopped(Exception):
    """SIGTERM or SIGHUP (a closed terminal) reached `fix`: the run ends, and its record says so."""


def stop_on_signals() -> None:
    """Turn SIGTERM and SIGHUP into an exception, so the job's record ends rather than stays `running`."""
    import signal

    def stop(signum: int, _frame: object) -> None:
        raise Stopped(f"stopped by {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def run_and_report(
    repo_dir: Path, title: str, body: str, as_json: bool, model: Any = None, kind: str = "fix"
) -> int:
    from app.logs import configure_logging

    settings = get_settings()
    configure_logging("WARNING", settings.secret_values())
    started = time.monotonic()
    stop_on_signals()
    try:
        outcome = LocalFix(
            repo_dir, title, body, settings=settings, progress=sys.stderr, model=model, kind=kind
        ).run()
    except FixError as exc:
        print(f"frogfix fix: {exc}", file=sys.stderr)
        return 2
    if as_json:
        print(json.dumps(outcome.to_dict(), ensure_ascii=False))
    else:  # plain words (app/outcome_words.py), as `show` and the job page word them
        from app.outcome_words import tests_line, why
        from app.statuses import status_label

        print(
            f"status: {status_label(outcome.status)} ({ending(outcome.exit_reason, outcome.steps)}, "
            f"{time.monotonic() - started:.1f}s)"
        )
        because = why(outcome.status, outcome.exit_reason, outcome.ending, model_url=settings.model_base_url)
        if because:
            print(f"why: {because}")
        if outcome.environment is not None and (outcome.environment.ok or not because):  # else `why` said it
            print(outcome.environment.line())
        if outcome.test_command:
            print(f"tests: {outcome.test_command}: {tests_line(outcome.to_dict()['tests'])}")
        if outcome.evidence is not None:
            print(evidence_line(outcome.evidence))
        for flag in outcome.flags:
            print(f"flag: {flag}")
        print(usage_table([("usage", outcome.usage)]))
        print(f"trajectory: {outcome.trajectory or 'none (the job ended before the agent ran)'}")
        if outcome.patch:
            print(outcome.patch, end="" if outcome.patch.endswith("\n") else "\n")
    return EXIT_CODES.get(outcome.status, 2)
