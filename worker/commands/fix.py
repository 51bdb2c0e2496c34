"""`manage.py fix REPO_DIR --issue FILE` and `demo`: the command's front for one local job.

It reads the arguments, makes the job's row (forge `local`, claimed by this process: app/jobs/local.py),
runs the job core in this process (worker/job/local_pipeline.py: the checkout is the source, nothing is
published) under a heartbeat like a worker's, and prints the job as `fix` words it. It needs no server:
the embedded SQLite database is migrated on first use, as `serve` does. `manage.py cancel <id>` stops
it as it stops a worker's job; Ctrl-C, SIGTERM and SIGHUP end the job `cancelled`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from sqlalchemy.orm import Session

from app import migrate, trajectory
from app.answers import FixAnswer, TestsAnswer, UsageAnswer
from app.db import in_transaction, session_scope
from app.endings import Ending
from app.jobs import local, records, transitions
from app.outcome_words import ending, shown_url
from app.redaction import SecretRedactor, redact_value
from app.settings import Settings, get_settings
from app.statuses import RUN_STATUSES, AttemptStatus, ExitReason, FixStatus, JobStatus, fix_status
from app.usage import UsageFigures, usage_table
from worker.attempts.attempt import AttemptResult, AttemptRunner
from worker.attempts.evidence import Evidence, evidence_line
from worker.attempts.failures import environment_ending, stopped_ending
from worker.attempts.verifier import TestRun
from worker.commands.doctor.model import Listed, model_listed
from worker.environment.report import EnvironmentReport
from worker.git import gitcalls, mirrors
from worker.job.heartbeat import Heartbeat, beat_interval
from worker.job.job_context import Deps
from worker.job.local_pipeline import LocalPipeline


class FixError(Exception):
    """The job cannot even start (bad repository or issue file); the message says why."""


class ModelDown(FixError):
    """The model server did not answer its model list (doctor's `model.listed`): refused before any row,
    build or test run, in doctor's words (its why, then its remedy)."""

    def __init__(self, listed: Listed, redact: Callable[[str], str]) -> None:
        super().__init__(redact(f"the model server cannot be used: {listed.line.detail}; fix: {listed.line.fix} "
                                "(nothing was built or run; --skip-model-check skips this check)"))
        self.listed, self.redact = listed, redact

    def answer(self) -> dict[str, Any]:
        """`fix --json`'s object for it: failed, the model's ending, no job (none was made)."""
        ending_ = self.listed.ending.redacted(self.redact) if self.listed.ending else None
        return FixAnswer.model_validate({
            "status": FixStatus.failed, "exit_reason": ExitReason.llm_query_error, "job_id": None,
            "ending": ending_.to_dict() if ending_ else None, "error": str(self),
        }).as_json()


@dataclass
class FixOutcome:
    job_id: int
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
    attestation_bundle: str = ""  # the demo's bundle file, when its change was signed
    verify: str = ""  # the command that verifies and replays that bundle

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
            "attestation_bundle": self.attestation_bundle or None, "verify": self.verify or None,
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
    """One local job: its row made and claimed here, run through the job core in this process
    (worker/job/local_pipeline.py), then seen as `fix --json`'s view. Construct, then `run()`."""

    def __init__(
        self,
        repo_dir: Path,
        title: str,
        body: str,
        *,
        settings: Settings | None = None,
        progress: TextIO | None = None,
        model: Any = None,
        kind: str = "fix",
        check_model: bool = True,
    ) -> None:
        self.settings = settings or get_settings()
        self.repo_dir = repo_dir.resolve()
        self.title, self.body = title, body
        self.progress = progress
        self.redactor = SecretRedactor(self.settings.secret_values())
        self._model = model
        self.kind = kind
        self.check_model = check_model and model is None  # a replayed model needs no server
        self.job_id = 0  # the row's id, once `run` made it

    def say(self, message: str) -> None:
        if self.progress is not None:
            print(f"[frogfix {self.job_id}] {self.redactor.redact(message)}", file=self.progress, flush=True)

    def run(self) -> FixOutcome:
        """The job, a row from its start (a refused call, e.g. no such folder, makes none)."""
        self.check_checkout()
        if self.check_model:
            listed = model_listed(self.settings)
            if listed.kind is not None:
                raise ModelDown(listed, self.redactor.redact)
        self.job_id = open_local_job(self.settings, self.repo_dir, self.title, self.body, self.kind)
        deps = Deps.from_settings(self.settings)
        if self._model is not None:
            deps.model_for = lambda: self._model
            deps.model_label = getattr(self._model, "label", None) or f"{type(self._model).__name__} (no model ran)"
            self.say(f"running the agent with {deps.model_label}")
        else:
            self.say(f"running the agent with {self.settings.model_name} at {shown_url(self.settings.model_base_url)}")
        pipeline = LocalPipeline(self.job_id, deps, progress=self.say, kind=self.kind)
        with Heartbeat(self.job_id, beat_interval(self.settings.stale_job_seconds), run=1):
            try:
                pipeline.run()
            except BaseException as exc:  # Ctrl-C, SIGTERM or SIGHUP: the job ends, it must not stay `running`
                why = str(exc)[:300] if isinstance(exc, Stopped) else f"{type(exc).__name__} {str(exc)[:300]}".strip()
                end_interrupted(self.job_id, why)
                raise
        return self.view(pipeline)

    def check_checkout(self) -> None:
        """Refuse what is no checkout, before any row is made."""
        if not self.repo_dir.exists():
            raise FixError(f"{self.repo_dir} does not exist")
        if not self.repo_dir.is_dir():
            raise FixError(f"{self.repo_dir} is not a folder")
        if not (self.repo_dir / ".git").exists():
            raise FixError(f"{self.repo_dir} is not a git checkout")
        try:
            mirrors.resolve(self.repo_dir, "HEAD")
        except gitcalls.RepoError as exc:
            raise FixError(f"{self.repo_dir} has no commits yet") from exc
        if mirrors.has_uncommitted_changes(self.repo_dir):
            self.say("note: uncommitted changes in the checkout are not part of the job (it starts from HEAD)")

    def view(self, pipeline: LocalPipeline) -> FixOutcome:
        """`fix --json`'s object: the job's status and the reported attempt's evidence, in `fix`'s words."""
        with session_scope() as session:
            job = records.get_job(session, self.job_id)
            status, error, exit_reason, ended = job.status, job.error, job.exit_reason, job.ending
        runner, series = pipeline.runner, pipeline.series
        if pipeline.environment is not None and runner is not None:
            return self._environment_error(runner, pipeline.environment)
        result = pipeline.reported()
        if runner is None or result is None:
            if status != JobStatus.cancelled:
                self.say(f"failed: {error}")
            reason = ExitReason.cancelled if status == JobStatus.cancelled else exit_reason or ExitReason.tool_error
            failed = FixOutcome(self.job_id, FixStatus.failed, reason, 0, "", None, None, [], "", error=error,
                                ending=ended)
            failed.trajectory = self.trajectory(1) if reason == ExitReason.tool_error and runner is not None else ""
            return failed
        outcome = self.outcome(result, pipeline.before, fix_status(status, result.status.value))
        if status == JobStatus.cancelled:
            outcome.exit_reason, outcome.error = ExitReason.cancelled, error
        outcome.trajectory = self.trajectory(result.number)
        chosen = series.choice.chosen if series is not None else None
        outcome.attempts = [attempt_entry(r, r.number == chosen) for r in pipeline.results]
        outcome.selection = series.choice.to_dict() if series is not None else None
        # Every test run of the job (each attempt's, the agreement runs, a base run made only for the report).
        figures = [r.leaf.figures() for r in pipeline.results]
        outcome.usage = sum(figures, UsageFigures()) + UsageFigures(sandbox_seconds=runner.verifier.seconds)
        outcome.environment = runner.environment
        verdict = {"fix": {k: v for k, v in outcome.to_dict().items() if k not in ("patch", "trajectory")}}
        for r in pipeline.results:
            self.amend_trajectory(r.trajectory, verdict)
        return outcome

    def trajectory(self, number: int) -> str:
        return str(self.settings.data_dir / trajectory.attempt_path(self.job_id, 1, number))

    def outcome(self, result: AttemptResult, before: TestRun | None, status: FixStatus) -> FixOutcome:
        """The reported attempt as `fix` reports it (`status`: app/statuses.py `fix_status`)."""
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
            trajectory="",
            error=error,
            ending=None if status in (FixStatus.fixed, FixStatus.unproven) else result.ending.but(error or ""),
            flags=result.refused + [f for f in result.flags if f not in result.refused],
            final_answer=leaf.final_answer,
            evidence=verification.verdict if verification else None,
            reproduction=verification.reproduction if verification else None,
            flaky=verification.flaky if verification else False,
        )

    def _environment_error(self, runner: AttemptRunner, report: EnvironmentReport) -> FixOutcome:
        """The tests cannot run: the job ended before any model call, saying why and what the log ends with."""
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

    def amend_trajectory(self, stored: str, fields: dict[str, Any]) -> None:
        """Add `fix`'s verdict to an attempt's finished trajectory, atomically (readers see the old or the new file)."""
        if stored:
            # Redacted string by string, as the writer redacts.
            trajectory.amend(self.settings.data_dir / stored, redact_value(fields, self.redactor.redact))


def open_local_job(settings: Settings, folder: Path, title: str, body: str, kind: str) -> int:
    """The local job's row, claimed by this process, in the configured database (the embedded SQLite by
    default, migrated on first use as `serve` migrates it; a configured one only checked); older local
    records are imported into it once."""
    try:
        migrate.ensure_schema(settings.resolved_database_url(), configured=bool(settings.database_url))
    except migrate.SchemaBehind as exc:
        raise FixError(str(exc)) from exc
    with session_scope() as session:
        local.import_records(session, settings.data_dir)
    try:
        with session_scope() as session:
            return local.create(session, folder=str(folder), title=title, body=body, who=os_user(), kind=kind)
    except local.LocalJobRefused as exc:
        raise FixError(str(exc)) from exc


def os_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment
        return "local"


def end_interrupted(job_id: int, stopped: str) -> None:
    """The job of a `fix` that was stopped (Ctrl-C, a signal) ends `cancelled`, with its open attempts."""
    why = stopped_ending(stopped).detail

    def write(session: Session) -> None:
        if transitions.set_status(session, job_id, JobStatus.cancelled, error=why, expected=RUN_STATUSES,
                                  exit_reason=ExitReason.cancelled.value, ending=stopped_ending(stopped)):
            records.close_open_attempts(session, job_id, AttemptStatus.cancelled.value, why)
            records.add_event(session, job_id, JobStatus.cancelled.value, why)

    try:
        in_transaction(write)
    except Exception as exc:  # the database is away: the sweep's heartbeat rule ends it later
        print(f"frogfix fix: could not record the end of job {job_id}: {type(exc).__name__}", file=sys.stderr)


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


EXIT_CODES: dict[str, int] = {
    FixStatus.fixed: 0, FixStatus.no_fix: 1, FixStatus.failed: 2, FixStatus.environment_error: 3,
    FixStatus.unproven: 4, FixStatus.tampered: 5,
}


def run_fix_command(repo_dir: Path, issue_file: Path, as_json: bool, check_model: bool = True) -> int:
    """The CLI entry: progress on stderr; the JSON object (or a summary) on stdout."""
    try:
        title, body = read_issue_file(issue_file)
    except FixError as exc:
        print(f"frogfix fix: {exc}", file=sys.stderr)
        return 2
    return run_and_report(repo_dir, title, body, as_json, check_model=check_model)


def run_demo_command(as_json: bool) -> int:
    """A whole job on a generated repository with a replayed model (see worker/commands/demo.py), its patch
    signed (with the demo's own throwaway key when no FROGFIX_ATTESTATION_KEY is set) and its bundle written."""
    import tempfile

    from worker.commands import demo

    settings, public = get_settings(), None
    if settings.attestation_key is None:
        private, public = demo.demo_key(settings.data_dir)
        settings = settings.model_copy(update={"attestation_key": private})

    def bundle(outcome: FixOutcome) -> None:
        path = demo.write_bundle(settings.data_dir, outcome.job_id) if outcome.job_id else None
        if path is not None:
            outcome.attestation_bundle, outcome.verify = str(path), demo.verify_command(path, public)

    with tempfile.TemporaryDirectory(prefix="frogfix-demo-") as tmp:
        repo = demo.make_sample_repo(Path(tmp))
        print(f"demo: a repository with a bug in add(), at {repo}; the model is a replay", file=sys.stderr)
        return run_and_report(repo, demo.ISSUE_TITLE, demo.ISSUE_BODY, as_json, model=demo.demo_model(), kind="demo",
                              settings=settings, after=bundle)  # fmt: skip


class Stopped(BaseException):
    """SIGTERM or SIGHUP (a closed terminal) reached `fix`: the run ends, and its job says so (a BaseException,
    like Ctrl-C's, so the job core's catch-all for bugs lets it through)."""


def stop_on_signals() -> None:
    """Turn SIGTERM and SIGHUP into an exception, so the job ends rather than stays `running`."""
    import signal

    def stop(signum: int, _frame: object) -> None:
        raise Stopped(f"stopped by {signal.Signals(signum).name}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)


def run_and_report(
    repo_dir: Path, title: str, body: str, as_json: bool, model: Any = None, kind: str = "fix",
    check_model: bool = True, settings: Settings | None = None, after: Callable[[FixOutcome], None] | None = None,
) -> int:
    """`after`: what the command adds to the finished outcome before it is printed (the demo's bundle)."""
    from app.logs import configure_logging

    settings = settings or get_settings()
    configure_logging("WARNING", settings.secret_values())
    started = time.monotonic()
    stop_on_signals()
    try:
        outcome = LocalFix(
            repo_dir, title, body, settings=settings, progress=sys.stderr, model=model, kind=kind,
            check_model=check_model,
        ).run()
    except ModelDown as exc:
        print(f"frogfix fix: {exc}", file=sys.stderr)
        if as_json:
            print(json.dumps(exc.answer(), ensure_ascii=False))
        return EXIT_CODES[FixStatus.failed]
    except FixError as exc:
        print(f"frogfix fix: {exc}", file=sys.stderr)
        return 2
    if after is not None:
        after(outcome)
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
        if outcome.verify:
            print(f"verify: {outcome.verify}")
    return EXIT_CODES.get(outcome.status, 2)
