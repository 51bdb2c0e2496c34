"""A job's stages, as plain functions with no Celery inside: admit, prepare, attempts, verify, publish.

`run(job_id)` is called by the `frogfix.run_job` task after it claimed the job. Each stage is
recorded on the job's timeline. Forge, model and repository access come in through `Deps`, so
tests hand in doubles that speak the real protocols.
"""

from __future__ import annotations

import fnmatch
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app import jobs
from app.db import in_transaction, session_scope
from app.forge.client import Forge, ForgeError, ForgeTransient, upsert_draft_mr
from app.forge.retry import RetryPolicy
from app.logs import SecretRedactor, get_logger
from app.models import FINAL_STATUSES, JobStatus
from app.settings import Settings, get_settings
from sandbox.base import SandboxError
from worker import repos
from worker.attempt import PatchTooLarge, TestRun, apply_patch, model_from, run_agent, run_tests, sampling_from
from worker.issue_text import sanitize_issue_text
from worker.leaf.loop import StepRecord
from worker.leaf.model import ModelClient
from worker.leaf.trajectory import TrajectoryWriter
from worker.repo_config import RepoConfig, RepoConfigError, load_repo_config, refusal_reasons, review_flags
from worker.report import Provenance, TestEvidence, comment_finished, comment_started, mr_description
from worker.repos import RepoCache, RepoError, RepoTransient, WorkspacePool

log = get_logger("frogfix.pipeline")
BOT_AUTHOR = ("FrogFix", "frogfix@localhost")
INFRA_EXITS = ("llm_query_error", "tool_error")
RUN_STATUSES = ("running", "verifying", "publishing")  # a claimed job's statuses while this run owns it


class Superseded(Exception):
    """The job was re-queued or finished elsewhere while this run went on: touch nothing more."""


class JobEnded(Exception):
    """A stage decided the job's final status (rejected, cancelled, failed, no_fix)."""

    def __init__(self, status: JobStatus, reason: str, comment: str | None = None, notify: str | None = None) -> None:
        super().__init__(reason)
        self.status, self.reason, self.comment, self.notify = status, reason, comment, notify


def make_forge(kind: str, settings: Settings, redact: Callable[[str], str]) -> Forge:
    options: dict[str, Any] = {
        "redact": redact,
        "timeout": settings.forge_timeout_seconds,
        "retry": RetryPolicy(budget_s=settings.forge_retry_budget_seconds),
    }
    if kind == "gitlab":
        from app.forge.gitlab_api import GitLabForge

        return GitLabForge(settings.gitlab_url, settings.gitlab_token.get_secret_value(), **options)
    if kind == "gitea":
        from app.forge.gitea_api import GiteaForge

        return GiteaForge(settings.gitea_url, settings.gitea_token.get_secret_value(), **options)
    raise ForgeError(f"unknown forge {kind!r}")


@dataclass
class Deps:
    """What the pipeline reaches outside itself; the defaults come from settings."""

    settings: Settings
    forge_for: Callable[[str], Forge]
    model_for: Callable[[], ModelClient]
    repos: RepoCache
    pool: WorkspacePool
    redactor: SecretRedactor = field(default_factory=SecretRedactor)
    # What the runner raises when the job's time is up (Celery's soft limit); the pipeline stays Celery-free.
    time_limit_errors: tuple[type[BaseException], ...] = ()

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Deps:
        s = settings or get_settings()
        redactor = SecretRedactor(s.secret_values())
        return cls(
            settings=s,
            forge_for=lambda kind: make_forge(kind, s, redactor.redact),
            model_for=lambda: model_from(s),
            repos=RepoCache(s.data_dir / "mirrors"),
            pool=_pool_for(s.resolved_workspace_dir()),
            redactor=redactor,
        )


_pools: dict[Path, WorkspacePool] = {}


def _pool_for(workspaces: Path) -> WorkspacePool:
    """One warm-workspace pool per folder and process, so its background refills are shared."""
    if workspaces not in _pools:
        _pools[workspaces] = WorkspacePool(workspaces)
    return _pools[workspaces]


def job_url(settings: Settings, job_id: int) -> str | None:
    return f"{settings.public_url.rstrip('/')}/jobs/{job_id}" if settings.public_url else None


def project_allowed(settings: Settings, project: str) -> bool:
    patterns = [p.strip() for p in settings.allowed_projects.split(",") if p.strip()]
    return not patterns or any(fnmatch.fnmatchcase(project, p) for p in patterns)


WORKSPACE_NAME = re.compile(r"job-(\d+)-run-(\d+)")


def remove_finished_workspaces(root: Path) -> list[str]:
    """Remove workspaces of runs that are over: a job the sweep failed after its worker died leaves one.

    A folder is removed when its job is final or a later run owns the job; folders of jobs this
    database does not know are left alone (another FrogFix may share the folder).
    """
    found = {p: (int(m[1]), int(m[2])) for p in root.glob("job-*-run-*") if (m := WORKSPACE_NAME.fullmatch(p.name))}
    if not found:
        return []
    with session_scope() as session:
        states = jobs.run_states(session, {job_id for job_id, _ in found.values()})
    removed = []
    for path, (job_id, run) in found.items():
        state = states.get(job_id)
        if state is not None and (state[0] in FINAL_STATUSES or run < state[1]):
            repos.remove_workspace(path)
            removed.append(path.name)
    if removed:
        log.info("removed_finished_workspaces", folders=removed)
    return removed


class Heartbeat:
    """Stamps the job every few seconds, so a job whose worker died is found and recovered."""

    def __init__(self, job_id: int, interval: float, run: int | None = None) -> None:
        self.job_id, self.interval, self.run = job_id, interval, run
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{job_id}", daemon=True)

    def _beat(self) -> None:
        while True:
            try:
                with session_scope() as session:
                    jobs.touch_heartbeat(session, self.job_id, self.run)
            except Exception as exc:  # a database hiccup must not end the job
                log.warning("heartbeat_failed", job_id=self.job_id, error=str(exc)[:300])
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)


class CancelCheck:
    """Reads the job's cancel flag, at most once every `every` seconds (it is asked between tool calls)."""

    def __init__(self, job_id: int, every: float = 2.0) -> None:
        self.job_id, self.every = job_id, every
        self._last = 0.0
        self._value = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self._value and now - self._last >= self.every:
            self._last = now
            try:
                with session_scope() as session:
                    self._value = jobs.cancel_requested(session, self.job_id)
            except SQLAlchemyError as exc:  # the database away for a moment: ask again at the next check
                log.warning("cancel_check_failed", job_id=self.job_id, error=str(exc)[:300])
        return self._value


class Pipeline:
    """One run of one job."""

    def __init__(self, job_id: int, deps: Deps) -> None:
        self.job_id = job_id
        self.deps = deps
        self.s = deps.settings
        self.redact = deps.redactor.redact
        with session_scope() as session:
            job = jobs.get_job(session, job_id)
            self.forge_kind, self.project, self.issue = job.forge, job.project, job.issue
            self.run_number = job.run
            self.trigger_user = job.trigger_user
            self.title, self.body = job.title or "", job.body or ""
            self.issue_url = job.issue_url
        self.forge: Forge | None = None
        self.cancelled = CancelCheck(job_id)
        self.root = self.s.resolved_workspace_dir() / f"job-{job_id}-run-{self.run_number}"
        self.url = job_url(self.s, job_id)
        self.deadline = time.monotonic() + self.s.job_timeout_seconds

    # -- timeline helpers --------------------------------------------------------------------

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        in_transaction(lambda session: jobs.add_event(session, self.job_id, kind, self.redact(message), data))
        log.info(kind, message=message[:500])

    def status(self, status: JobStatus, **values: Any) -> None:
        """Move the job on; if it is no longer ours (re-queued after a stale heartbeat), stop here."""
        values.setdefault("expected", RUN_STATUSES)  # never "queued": that means another run owns it now
        moved = in_transaction(
            lambda session: jobs.set_status(session, self.job_id, status, run=self.run_number, **values)
        )
        if not moved:
            raise Superseded(f"the job is no longer {' or '.join(values['expected'])} in run {self.run_number}")

    def update(self, **values: Any) -> None:
        """Plain fields of the job, written only while this run owns it."""
        in_transaction(lambda session: jobs.update_job(session, self.job_id, run=self.run_number, **values))

    def check_cancel(self) -> None:
        if self.cancelled():
            raise JobEnded(JobStatus.cancelled, "cancelled on request", "The job was cancelled.")

    def comment(self, body: str) -> bool:
        """Best effort: a comment that cannot be posted is noted on the timeline, never fatal."""
        if self.forge is None:
            return False
        try:
            self.forge.comment(self.project, self.issue, self.redact(body))
        except ForgeError as exc:
            self.event("comment_failed", f"could not comment on the issue: {exc}")
            return False
        return True

    # -- the stages ---------------------------------------------------------------------------

    def run(self) -> str:
        for leftover in self.root.parent.glob(f"job-{self.job_id}-run-*"):  # from a run whose worker died
            repos.remove_workspace(leftover)
        try:
            remove_finished_workspaces(self.root.parent)
        except SQLAlchemyError as exc:  # housekeeping only: the next run tries again
            log.warning("workspace_cleanup_failed", error=str(exc)[:300])
        try:
            self.forge = self.deps.forge_for(self.forge_kind)
            self.admit()
            mirror, base, info_branch, clone_url = self.prepare()
            result = self.attempts(mirror, base)
            if result is None:
                raise JobEnded(JobStatus.no_fix, "no attempt produced a patch that passes the tests")
            self.publish(mirror, base, info_branch, clone_url, *result)
            return JobStatus.done.value
        except Superseded as exc:
            log.warning("superseded", reason=str(exc))
            return "superseded"
        except JobEnded as end:
            return self.end(end.status, end.reason, end.comment, end.notify)
        except (ForgeTransient, RepoTransient) as exc:
            return self.end(
                JobStatus.failed,
                f"the forge or git server kept failing: {exc}",
                "FrogFix could not reach the forge or the git server reliably; an operator can retry.",
            )
        except (ForgeError, RepoError, RepoConfigError) as exc:
            return self.end(JobStatus.failed, str(exc), f"FrogFix stopped: {exc}")
        except SandboxError as exc:
            return self.end(JobStatus.failed, f"sandbox failure: {exc}", "FrogFix stopped: the sandbox failed.")
        except self.deps.time_limit_errors:
            return self.end(
                JobStatus.failed,
                f"the job ran past its time limit ({self.s.job_timeout_seconds:.0f} s)",
                "FrogFix stopped: the job took longer than its time limit.",
            )
        except Exception as exc:
            log.exception("pipeline_bug")
            return self.end(
                JobStatus.failed,
                f"internal error: {type(exc).__name__}: {exc}",
                "FrogFix stopped on an internal error; an operator has the details.",
            )
        finally:
            repos.remove_workspace(self.root)
            if self.forge is not None:
                self.forge.close()

    def end(self, status: JobStatus, reason: str, comment: str | None, notify: str | None = None) -> str:
        """The job's final status, its event and this run's open attempts, in one transaction, if still ours."""
        reason = self.redact(reason)

        def write(session: Session) -> bool:
            moved = jobs.set_status(
                session,
                self.job_id,
                status,
                error=None if status == JobStatus.no_fix else reason,
                expected=RUN_STATUSES,
                run=self.run_number,
            )
            if moved:
                attempts = "cancelled" if status == JobStatus.cancelled else "failed"
                jobs.close_open_attempts(session, self.job_id, attempts, reason, run=self.run_number)
                jobs.add_event(session, self.job_id, status.value, reason)
            return moved

        if not in_transaction(write):  # another run owns the job now; it will tell the issue how it ended
            log.warning("superseded", reason=f"could not end the job {status.value}: {reason}"[:500])
            return "superseded"
        log.info(status.value, message=reason[:500])
        if comment is not None or status == JobStatus.no_fix:
            text = comment or reason
            outcome = status.value.replace("_", " ")
            self.comment(comment_finished(outcome, text, self.job_id, self.url, self.redact, notify=notify))
        return status.value

    def admit(self) -> None:
        assert self.forge is not None
        label = self.s.trigger_label
        if not project_allowed(self.s, self.project):
            raise JobEnded(
                JobStatus.rejected,
                f"project {self.project} is not in FROGFIX_ALLOWED_PROJECTS",
                "FrogFix is not enabled for this project.",
            )
        issue = self.forge.get_issue(self.project, self.issue)
        if issue.state != "open":
            raise JobEnded(JobStatus.cancelled, "the issue is closed", None)
        if label not in issue.labels:
            raise JobEnded(JobStatus.cancelled, f"the label {label!r} is no longer on the issue", None)
        adder = self.forge.label_adder(self.project, self.issue, label) or self.trigger_user
        if not adder:
            raise JobEnded(
                JobStatus.rejected,
                "cannot tell who added the label",
                f"FrogFix could not tell who added `{label}`, so it did not start.",
            )
        if not self.forge.can_trigger(self.project, adder):
            raise JobEnded(
                JobStatus.rejected,
                f"{adder} may not trigger FrogFix here",
                f"{adder} added `{label}` but needs at least Developer (write) access to this "
                "project for FrogFix to act on it.",
                notify=adder,
            )
        self.title, self.body = issue.title, issue.body or ""
        self.issue_url = issue.web_url or self.issue_url
        self.update(title=issue.title, body=issue.body, trigger_user=adder, issue_url=self.issue_url)
        self.event("admitted", f"{adder} may trigger; issue re-read from the API")
        announced = in_transaction(lambda session: jobs.announced_this_round(session, self.job_id))
        if not announced and self.comment(comment_started(self.job_id, self.url)):
            self.event("announced", "told the issue that FrogFix is working on it")

    def prepare(self) -> tuple[Path, str, str, str]:
        assert self.forge is not None
        info = self.forge.project_info(self.project)
        key = repos.mirror_key(self.forge_kind, self.project)
        auth = self.forge.git_auth_header()
        mirror = repos.retry_transient("git fetch", lambda: self.deps.repos.mirror(key, info.clone_url, auth))
        base = repos.resolve(mirror, info.default_branch)
        branch = f"frogfix/issue-{self.issue}"
        self.update(base_commit=base, branch=branch)
        self.event(
            "prepared",
            f"mirror updated; base {info.default_branch} at {base[:12]}",
            {"base_commit": base, "default_branch": info.default_branch},
        )
        self.root.mkdir(parents=True, exist_ok=True)
        return mirror, base, info.default_branch, info.clone_url

    def attempts(self, mirror: Path, base: str) -> tuple[str, str, TestEvidence, list[str], int, RepoConfig] | None:
        """Run up to FROGFIX_ATTEMPTS independent attempts; the first verified one wins."""
        before: TestRun | None = None
        last_reason = "no attempt ran"
        for number in range(1, self.s.attempts + 1):
            self.check_cancel()
            outcome = self.one_attempt(mirror, base, number, before)
            before = outcome.before or before
            if outcome.verified is not None:
                return outcome.verified
            last_reason = outcome.reason
            if outcome.fatal:
                raise JobEnded(JobStatus.failed, outcome.reason, f"FrogFix stopped: {outcome.reason}")
        raise JobEnded(JobStatus.no_fix, last_reason, last_reason)

    def one_attempt(self, mirror: Path, base: str, number: int, before: TestRun | None) -> AttemptOutcome:
        attempt_id = in_transaction(lambda session: jobs.start_attempt(session, self.job_id, self.run_number, number))
        ws = self.root / f"attempt-{number}"
        self.deps.pool.prepare(mirror, base, ws)
        config = load_repo_config(ws)
        trajectory = self.s.data_dir / "trajectories" / f"job-{self.job_id}-run-{self.run_number}-{number}.json"
        writer = TrajectoryWriter(
            trajectory,
            job_id=self.job_id,
            model=self.s.model_name,
            sampling=sampling_from(self.s).body_fields(),
            base_commit=base,
            redact=self.redact,
            fields={
                "attempt": number,
                "run": self.run_number,
                "forge": self.forge_kind,
                "project": self.project,
                "issue": self.issue,
            },
        )

        def on_step(record: StepRecord) -> None:
            with session_scope() as session:
                jobs.update_attempt(session, attempt_id, steps=record.step + 1)
                jobs.update_job(session, self.job_id, run=self.run_number, steps=record.step + 1)

        self.event(
            "agent_started",
            f"attempt {number}: running the agent ({self.s.model_name})",
            {"attempt": number, "trajectory": str(trajectory), "test_command": config.test_command},
        )
        too_large: PatchTooLarge | None = None
        try:
            result, patch = run_agent(
                ws,
                base,
                settings=self.s,
                model=self.deps.model_for(),
                title=self.title,
                body=sanitize_issue_text(self.body),
                project=self.project,
                issue_number=self.issue,
                writer=writer,
                on_step=on_step,
                cancel=self.cancelled,
                image=config.image,
                labels={"frogfix/job": str(self.job_id), "frogfix/attempt": str(number)},
                max_seconds=self.deadline - time.monotonic(),
            )
        except PatchTooLarge as exc:  # the sandbox is fine; this attempt's changes are refused, none stored
            too_large, result, patch = exc, exc.result, ""
        repos.remove_workspace(ws)
        fields: dict[str, Any] = {
            "exit_reason": result.exit_reason,
            "steps": result.steps,
            "trajectory_path": str(trajectory),
            "patch": patch,
            "summary": self.redact(result.final_answer)[:20_000],
            "error": self.redact(result.error) if result.error else None,
        }
        self.update(exit_reason=result.exit_reason, steps=result.steps)

        def refuse(reasons: list[str]) -> AttemptOutcome:
            """Never pushed: the attempt ends rejected with the reason on it and on the job's timeline."""
            reason = self.redact(f"attempt {number}'s patch was refused: {'; '.join(reasons)}")
            self._finish_attempt(attempt_id, "rejected", {**fields, "error": reason})
            self.event("patch_refused", reason, {"attempt": number, "reasons": [self.redact(r) for r in reasons]})
            return AttemptOutcome(None, reason, before)

        self.event(
            "agent_finished",
            f"attempt {number}: {result.exit_reason} after {result.steps} steps",
            {"attempt": number, "exit_reason": result.exit_reason, "patch_bytes": len(patch)},
        )
        if result.exit_reason == "cancelled":
            self._finish_attempt(attempt_id, "cancelled", fields)
            raise JobEnded(JobStatus.cancelled, "cancelled on request", "The job was cancelled.")
        if too_large is not None:
            return refuse([str(too_large)])
        if not patch:
            status = "failed" if result.exit_reason in INFRA_EXITS else "no_fix"
            self._finish_attempt(attempt_id, status, fields)
            reason = (
                f"the model could not be used: {result.error}"
                if result.exit_reason == "llm_query_error"
                else f"attempt {number} ended ({result.exit_reason}) without changing any file"
            )
            return AttemptOutcome(None, reason, before, fatal=result.exit_reason in INFRA_EXITS)
        if not config.test_command:
            self._finish_attempt(attempt_id, "no_fix", fields)
            return AttemptOutcome(
                None, "no test command was found to verify the patch; add test_command to .frogfix.yml", before
            )

        flags = review_flags(patch, config)
        # `config` was read from the base commit, so a patch rewriting .frogfix.yml cannot change the verification.
        refused = refusal_reasons(patch, config, allow_binary=self.s.allow_binary_patches)
        if self.s.refuse_protected_changes:
            refused += [flag for flag in flags if flag not in refused]
        if refused:
            fields["flags"] = flags
            return refuse(refused)
        self.status(JobStatus.verifying)
        if before is None:
            before = self._tests(mirror, base, config, None, "before")
        after = [self._tests(mirror, base, config, patch, f"after, run {i + 1}") for i in range(self.s.verify_runs)]
        codes = {run.exit_code for run in after}
        flaky = len(codes) > 1
        evidence = TestEvidence(config.test_command, before.to_dict(), [run.to_dict() for run in after], flaky)
        if flaky:
            flags = [*flags, "the patched tests gave different results between runs (flaky)"]
        fields.update(tests=evidence.to_dict(), flags=flags)
        verified = codes == {0}
        self._finish_attempt(attempt_id, "verified" if verified else "no_fix", fields)
        timeout = f"timed out after {config.test_timeout:g} s"
        self.event(
            "verified" if verified else "not_verified",
            f"attempt {number}: tests before {timeout if before.timed_out else f'exit {before.exit_code}'}, after "
            + ("exit " + ", ".join(str(r.exit_code) for r in after) if not after[0].timed_out else timeout),
            {"attempt": number, "flaky": flaky},
        )
        if not verified:
            self.status(JobStatus.running, expected=("verifying",))
            if flaky:
                why = "flaky"
            elif after[0].timed_out:
                why = timeout
            else:
                why = f"exit {after[0].exit_code}" if after[0].exit_code is not None else after[0].log[:300]
            return AttemptOutcome(None, f"attempt {number}'s patch did not pass the tests ({why})", before)
        return AttemptOutcome((patch, result.final_answer, evidence, flags, number, config), "verified", before)

    def _finish_attempt(self, attempt_id: int, status: str, fields: dict[str, Any]) -> None:
        in_transaction(lambda session: jobs.update_attempt(session, attempt_id, finished=True, status=status, **fields))

    def _tests(self, mirror: Path, base: str, config: RepoConfig, patch: str | None, label: str) -> TestRun:
        ws = self.root / f"tests-{label.replace(' ', '-').replace(',', '')}"
        self.deps.pool.prepare(mirror, base, ws)
        if patch:
            problem = apply_patch(ws, patch, self.root)
            if problem:
                shutil.rmtree(ws, ignore_errors=True)
                return TestRun(None, problem)
        return run_tests(ws, config, self.s, self.redact, image=config.image)

    def publish(
        self,
        mirror: Path,
        base: str,
        target_branch: str,
        clone_url: str,
        patch: str,
        summary: str,
        evidence: TestEvidence,
        flags: list[str],
        number: int,
        config: RepoConfig,
    ) -> None:
        assert self.forge is not None
        self.check_cancel()
        # Webhooks can be stale or missed (Gitea does not say which label changed): ask once more.
        issue = self.forge.get_issue(self.project, self.issue)
        if issue.state != "open" or self.s.trigger_label not in issue.labels:
            raise JobEnded(JobStatus.cancelled, "the issue was closed or the label removed while the job ran", None)
        self.status(JobStatus.publishing, expected=("verifying",))
        branch = f"frogfix/issue-{self.issue}"
        message = self.redact(f"Fix #{self.issue}: {self.title}"[:200] + f"\n\nDrafted by FrogFix (job {self.job_id}).")
        sha = repos.commit_patch(mirror, base, patch, message, BOT_AUTHOR, self.root / "publish")
        auth = self.forge.git_auth_header()
        repos.retry_transient("git push", lambda: repos.push_branch(mirror, clone_url, auth, branch, sha))
        self.event("pushed", f"pushed {sha[:12]} to {branch}", {"commit": sha, "branch": branch})
        provenance = Provenance(
            model=self.s.model_name,
            sampling=sampling_from(self.s).body_fields(),
            base_commit=base,
            sandbox=f"{self.s.sandbox} ({config.image or 'default image'})",
            attempt=number,
            attempts=self.s.attempts,
        )
        description = mr_description(
            issue_ref=f"#{self.issue}",
            issue_url=self.issue_url,
            summary=summary,
            patch=patch,
            tests=evidence,
            flags=flags,
            job_url=self.url,
            provenance=provenance,
            redact=self.redact,
        )
        mr, created = upsert_draft_mr(
            self.forge,
            self.project,
            branch,
            target_branch,
            self.redact(f"Fix #{self.issue}: {self.title}"),
            description,
        )

        def finish(session: Session) -> bool:
            done = jobs.set_status(
                session,
                self.job_id,
                JobStatus.done,
                expected=("publishing",),
                run=self.run_number,
                mr_url=mr.web_url,
                flags=flags,
            )
            if done:
                jobs.add_event(
                    session,
                    self.job_id,
                    "done",
                    f"{'opened' if created else 'updated'} draft {mr.web_url}",
                    {"mr_url": mr.web_url, "created": created},
                )
            return done

        if not in_transaction(finish):  # the MR is there; the run that owns the job now finds and updates it
            raise Superseded(f"the job left 'publishing' in run {self.run_number} while this run published")
        self.comment(
            comment_finished(
                "draft merge request ready", f"Please review {mr.web_url}.", self.job_id, self.url, self.redact
            )
        )


@dataclass
class AttemptOutcome:
    verified: tuple[str, str, TestEvidence, list[str], int, RepoConfig] | None
    reason: str
    before: TestRun | None
    fatal: bool = False


def run(job_id: int, deps: Deps | None = None, *, time_limit_errors: tuple[type[BaseException], ...] = ()) -> str:
    """Run a claimed job to a final status; never raises."""
    with structlog.contextvars.bound_contextvars(job_id=job_id):
        try:
            deps = deps or Deps.from_settings()
            deps.time_limit_errors = deps.time_limit_errors or time_limit_errors
            pipeline = Pipeline(job_id, deps)
        except Exception as exc:  # it could not even start: end the claimed job rather than leave it running
            log.exception("pipeline_start_failed")
            why = f"could not start: {type(exc).__name__}: {exc}"
            with session_scope() as session:
                jobs.set_status(session, job_id, JobStatus.failed, error=why)
            return JobStatus.failed.value
        with Heartbeat(job_id, max(1.0, min(15.0, deps.settings.stale_job_seconds / 4)), pipeline.run_number):
            return pipeline.run()
