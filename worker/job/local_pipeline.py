"""The job core for a local job (forge `local`): `manage.py fix`, `demo`, and a retried local job.

`LocalPipeline` is worker/job/pipeline.py's `Pipeline` with another source and publisher, not a copy
of its stages: the issue is the row's title and body (from the issue file), the workspaces come
from the checkout folder (the job's project), and publishing keeps the chosen patch on the job's
attempt rows and pushes nothing. Admission, the attempts, the choice, the cancel flag and the
job's end are the pipeline's own. `fix` runs it in its own process (worker/commands/fix.py); a worker
runs it for a local job an operator retried (worker/job/runs.py), from the same folder: if the
folder is gone, the job fails saying so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from app.answers import TestsAnswer
from app.attempt_events import TEST_RUN_EVENTS, AttemptEvent
from app.db import in_transaction
from app.jobs import records
from app.outcome_words import ending
from app.statuses import ExitReason, JobStatus
from sandbox.base import SandboxError
from worker.attempts.attempt import AttemptResult, AttemptRunner
from worker.attempts.repo_config import RepoConfigError
from worker.attempts.verifier import TestRun
from worker.environment.report import EnvironmentReport
from worker.git import mirrors
from worker.git.gitcalls import RepoError
from worker.git.workspace_sources import CheckoutSource, WorkspaceSource
from worker.job import attesting
from worker.job.job_context import Deps, JobEnded, Prepared
from worker.job.pipeline import JobObserver, Pipeline
from worker.leaf.issue_text import sanitize_issue_text
from worker.leaf.loop import StepRecord
from worker.leaf.prompts import render_task

Progress = Callable[[str], None]


class LocalObserver(JobObserver):
    """The job observer, which also tells the person running `fix` each step and test run."""

    pipeline: LocalPipeline

    def on_step(self, record: StepRecord) -> None:
        super().on_step(record)
        names = ", ".join(c.name for c in record.calls) or "final answer"
        self.pipeline.say(f"step {record.step + 1}: {names} (context {record.context_tokens} tokens)")

    def report(self, event: AttemptEvent) -> None:
        super().report(event)  # every other kind reaches the timeline, and `told`, by `event`
        if event.kind in TEST_RUN_EVENTS:
            self.pipeline.say(event.message)


class LocalPipeline(Pipeline):
    """One run of a local job: the checkout is the source, nothing is published."""

    def __init__(self, job_id: int, deps: Deps, *, progress: Progress | None = None, kind: str = "fix") -> None:
        super().__init__(job_id, deps)
        self.folder = Path(self.project)
        self.progress = progress
        self.kind = kind
        self.environment: EnvironmentReport | None = None  # why the tests could not run, when they could not
        self.before: TestRun | None = None  # the base commit's tests, as the reported attempt's config runs them
        self.results: list[AttemptResult] = []  # every attempt that ran, those the series leaves out included
        self.attempt_ids: dict[int, int] = {}  # each attempt's row, by its number

    def say(self, message: str) -> None:
        if self.progress is not None:
            self.progress(self.redact(message))

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().event(kind, message, data)
        self.told(kind, message, data or {})

    def told(self, kind: str, message: str, data: dict[str, Any]) -> None:
        """The timeline's events as progress lines (what `fix` always printed)."""
        if kind in ("environment", "environment_building", "environment_project"):
            self.say(message)
            for line in data.get("detected", []) if kind == "environment" and not data.get("cached") else []:
                self.say(f"  from {line}")
        elif kind == "agent_started":
            self.say(f"workspace ready at base commit {data['base_commit'][:12]}")
            source = data.get("test_command_source")
            self.say(f"test command: {data.get('test_command') or '(none found)'} ({source})")
            if data.get("guidance"):
                self.say(f"repository guidance for the agent: {', '.join(data['guidance'])}")
        elif kind == "agent_finished":
            self.say(f"{ending(data['exit_reason'], data['steps'])}; patch {data['patch_lines']} lines")
        elif kind in ("not_verified", "verified", "unproven"):
            self.say(message)
        elif kind == "chosen" and int(data.get("attempts") or 1) > 1:
            self.say(f"chosen: {message}")

    # -- the source: the checkout -----------------------------------------------------------------

    def open_forge(self) -> None:
        return None

    def admit(self) -> None:
        """A local job needs no one's permission: only its folder, still a git checkout."""
        if not (self.folder / ".git").exists():
            raise JobEnded(JobStatus.failed, f"the folder {self.folder} is gone or no longer a git checkout")
        self.event("admitted", f"local job on {self.folder}")

    def prepare(self) -> Prepared:
        try:
            base = mirrors.resolve(self.folder, "HEAD")
        except RepoError as exc:
            self.update(exit_reason=ExitReason.git_error.value)
            raise JobEnded(JobStatus.failed, f"{self.folder} has no commit to start from: {exc}"[:500]) from exc
        self.update(base_commit=base)
        self.event("prepared", f"checkout {self.folder} at {base[:12]}", {"base_commit": base})
        self.root.mkdir(parents=True, exist_ok=True)
        return Prepared(self.folder, base, "", "")

    def workspaces(self, prepared: Prepared) -> WorkspaceSource:
        return CheckoutSource(self.folder)

    def observer(self, stop: threading.Event | None = None) -> JobObserver:
        return LocalObserver(self, stop)

    def task(self) -> str:
        return render_task(
            self.title, sanitize_issue_text(self.body), prompts_dir=self.s.prompts_dir, project=self.folder.name,
            issue_number="",
        )

    def trajectory_fields(self, number: int) -> dict[str, Any]:
        # `kind`: a demo's recording says so, so a replay makes its temporary sample again (recorded.py).
        return {**super().trajectory_fields(number), "title": self.title, "repository": str(self.folder),
                "kind": self.kind}

    # -- the attempts, and ends the pipeline words for a forge ------------------------------------

    def work(self) -> None:
        """The pipeline's work; what stopped it is also kept as the job's exit reason (`fix` words it)."""
        try:
            super().work()
        except RepoConfigError:
            self.update(exit_reason=ExitReason.config_error.value)
            raise
        except SandboxError:
            self.update(exit_reason=ExitReason.tool_error.value)
            raise
        except RepoError:
            self.update(exit_reason=ExitReason.git_error.value)
            raise

    def attempts(self, prepared: Prepared) -> AttemptResult:
        """The pipeline's attempts; then, while the workspace is still there, the base commit's tests as the
        reported attempt ran them (`fix` prints them beside the patched runs)."""
        try:
            return super().attempts(prepared)
        finally:
            self.before = self.base_tests(prepared)
            self.keep_base_tests()

    def keep_base_tests(self) -> None:
        """An attempt with no patch to test keeps the base commit's run (as `fix` always reported it), so its
        job still shows, and eval still finds, tests that failed before."""
        reported = self.reported()
        if self.before is None or reported is None:
            return
        tests = TestsAnswer(command=reported.config.test_command, before=self.before.answer()).as_json()
        bare = [self.attempt_ids[r.number] for r in self.results if r.evidence is None and r.number in self.attempt_ids]

        def keep(session: Session) -> None:
            for attempt_id in bare:
                records.update_attempt(session, attempt_id, tests=tests)

        in_transaction(keep)

    def reported(self) -> AttemptResult | None:
        """The attempt `fix` reports: the series' (worker/attempts/attempt.py `AttemptSeries.reported`), else the last
        that ran (one the infrastructure failed is no part of the series)."""
        if self.series is not None and self.series.results:
            return self.series.reported
        return self.results[-1] if self.results else None

    def base_tests(self, prepared: Prepared) -> TestRun | None:
        result, runner = self.reported(), self.runner
        if result is None or runner is None or not result.config.test_command or self.cancelled():
            return None
        try:
            return runner.verifier.before(result.config, prepared.base)
        except Exception as exc:  # the report goes without it: the job's verdict is already made
            self.say(f"the base commit's tests could not run for the report: {type(exc).__name__}: {exc}")
            return None

    def one_attempt(
        self, runner: AttemptRunner, observer: JobObserver, prepared: Prepared, number: int, task: str
    ) -> AttemptResult:
        if self.s.attempts > 1:
            self.say(f"attempt {number} of {self.s.attempts}")
        result = super().one_attempt(runner, observer, prepared, number, task)
        self.results.append(result)
        self.attempt_ids[number] = observer.attempt_id
        for reason in result.refused:
            self.say(f"refused: {reason}")
        return result

    def abstain(self, results: list[AttemptResult], reason: str, *, require: bool = False) -> JobEnded:
        """No patch to keep: the job ends `no_fix` saying why; there is no reporter to ask."""
        return JobEnded(JobStatus.no_fix, f"FROGFIX_REQUIRE_REPRODUCTION: {reason}" if require else reason)

    def environment_error(self, report: EnvironmentReport) -> JobEnded:
        self.environment = report
        self.say(report.line())
        if report.log_tail:
            self.say("the log ends:\n" + report.log_tail)
        self.update(exit_reason=ExitReason.environment_error.value)
        return super().environment_error(report)

    # -- the publisher: nothing leaves the machine ------------------------------------------------

    def publish(self, prepared: Prepared, result: AttemptResult) -> None:
        """The chosen patch stays on its attempt row (`show`, the job page, `fix --json`); nothing is pushed.
        With a key configured it is signed as a forge job's change is (worker/job/attesting.py), the base
        commit standing for the commit no local job makes."""
        self.check_cancel()
        signer = attesting.local_signer(self) if result.patch else None
        self.begin_publishing()
        envelope = attesting.sign_change(self, signer, prepared.base, None, result)
        self.attestation = attesting.keep(self, envelope, result)
        self.finish(None, f"kept the patch of attempt {result.number}; a local job publishes nothing",
                    result.flags, {"attempt": result.number, "attestation": self.attestation})
