"""A job's stages, as plain functions with no Celery inside: admit, prepare, attempts, verify, publish.

worker/job/runs.py runs a claimed job through the pipeline its kind needs (this one for an issue's job,
worker/job/mr_rounds.py's for a round). Each stage is recorded on the job's timeline. Forge, model and
repository access come in through `Deps` (worker/job/job_context.py), so tests hand in doubles that
speak the real protocols.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app import attempt_events, trajectory
from app.attempt_events import AttemptEvent
from app.db import in_transaction, session_scope
from app.endings import Ending, EndingKind, ending_for_status
from app.forge.api import (
    Forge,
    ForgeError,
    ForgeTransient,
    Issue,
    ProjectInfo,
    skip_ci_push_options,
    upsert_draft_mr,
)
from app.jobs import job_slots, records, rounds, transitions
from app.logs import get_logger
from app.models import utcnow
from app.statuses import RUN_STATUSES, AttemptStatus, JobStatus
from app.usage import UsageFigures
from sandbox.base import SandboxError
from worker.attempts.attempt import (
    AttemptOutcome,
    AttemptResult,
    AttemptRunner,
    AttemptSeries,
    ReviewPolicy,
    attempt_spec,
)
from worker.attempts.failures import ending_of, environment_ending
from worker.attempts.repo_config import RepoConfigError
from worker.environment.report import EnvironmentReport
from worker.git import gitcalls, mirrors, publishing, workspace_pool
from worker.git.gitcalls import RepoError, RepoTransient
from worker.git.merging import Resolution
from worker.git.workspace_sources import PoolSource, WorkspaceSource
from worker.job import attesting
from worker.job.job_context import (
    BOT_AUTHOR,
    BRANCH_MOVED,
    CancelCheck,
    Deps,
    JobEnded,
    Prepared,
    Superseded,
    cancelled_on_request,
    job_url,
    project_allowed,
    remove_finished_workspaces,
)
from worker.job.question import answers_since, question_comment
from worker.job.series_run import SeriesRun
from worker.leaf.issue_text import sanitize_issue_text
from worker.leaf.loop import StepRecord, step_usage
from worker.leaf.prompts import (
    render_task,
)
from worker.texts.mr_text import (
    Provenance,
    comment_finished,
    comment_started,
    commit_message,
    keep_rounds_section,
    mr_description,
    mr_title,
    tampered_comment,
)
from worker.wiring import sampling_from

log = get_logger("frogfix.pipeline")
class JobObserver:
    """An attempt seen by the pipeline: steps on the attempt row, stages on the job's timeline."""

    def __init__(self, pipeline: Pipeline, stop: threading.Event | None = None) -> None:
        self.pipeline = pipeline
        self.stop = stop or threading.Event()  # set when an attempt beside this one ended the job
        self.attempt_id = 0  # set by `one_attempt` before each attempt
        self.usage = UsageFigures()  # the running attempt's figures, step by step
        # An extra attempt's: True stops it before its next model turn (a production job is waiting).
        self.preempt: Callable[[], bool] | None = None

    def start(self, attempt_id: int) -> None:
        self.attempt_id, self.usage = attempt_id, UsageFigures()

    def on_step(self, record: StepRecord) -> None:
        p = self.pipeline
        self.usage += step_usage(record)
        with session_scope() as session:
            records.update_attempt(session, self.attempt_id, steps=record.step + 1)
            records.update_job(session, p.job_id, run=p.run_number, steps=record.step + 1)
            records.record_usage(session, p.job_id, self.attempt_id, self.usage)

    def cancelled(self) -> bool:
        if self.pipeline.cancelled() or self.stop.is_set():
            return True
        return self.preempted

    @property
    def preempted(self) -> bool:
        """An extra attempt's: a production job is waiting, so it stops (read at most every PREEMPT_POLL_S)."""
        return self.preempt is not None and self.preempt()

    def report(self, event: AttemptEvent) -> None:
        """The attempt's event, through the one recorder (app/attempt_events.py), as `fix` records it."""
        if not attempt_events.record(event, self.pipeline).row:  # progress only (a test run): the log has it
            log.info(event.kind.value, message=event.message[:500])


class Pipeline:
    """One run of one job."""

    def __init__(self, job_id: int, deps: Deps) -> None:
        self.end_log = ""  # set when a JobEnded carries a log tail for the issue comment
        self.job_id = job_id
        self.deps = deps
        self.s = deps.settings
        self.redact = deps.redactor.redact
        with session_scope() as session:
            job = records.get_job(session, job_id)
            self.forge_kind, self.project, self.issue = job.forge, job.project, job.issue
            self.run_number = job.run
            self.trigger_user = job.trigger_user
            self.title, self.body = job.title or "", job.body or ""
            self.issue_url = job.issue_url
            # A review round (issue 14): the MR's thread, which round this is, and the MR's branch.
            self.thread_id, self.round, self.round_kind = job.thread_id, job.round or 0, job.round_kind
            self.mr_number, self.branch = job.mr_number, job.branch
            # Abstain and ask (issue 24): when FrogFix asked the reporter a question (a `/frogfix` answer
            # re-queued the job), admission reads the comments since, which the task then carries.
            self.asked_at = job.asked_at
        self.answers: list[Any] = []  # the IssueComments (app/forge/reviews.py) since the question
        self.forge: Forge | None = None
        self.cancelled = CancelCheck(job_id)
        self.root = self.s.resolved_workspace_dir() / f"job-{job_id}-run-{self.run_number}"
        self.url = job_url(self.s, job_id)
        self.deadline = time.monotonic() + self.s.job_timeout_seconds
        self.selection: dict[str, Any] = {}  # how the published attempt was chosen (app/selection.py)
        self.resolution: Resolution | None = None  # an update round's conflicted merge, for its attempts
        self.runner: AttemptRunner | None = None  # the attempts' runner and their series, once they ran
        self.series: AttemptSeries | None = None
        self.attestation = ""  # the published change's signed statement (its envelope digest); "" unsigned

    # -- timeline helpers --------------------------------------------------------------------

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        in_transaction(lambda session: records.add_event(session, self.job_id, kind, self.redact(message), data))
        log.info(kind, message=message[:500])

    def status(self, status: JobStatus, **values: Any) -> None:
        """Move the job on; if it is no longer ours (re-queued after a stale heartbeat), stop here."""
        values.setdefault("expected", RUN_STATUSES)  # never "queued": that means another run owns it now
        moved = in_transaction(
            lambda session: transitions.set_status(session, self.job_id, status, run=self.run_number, **values)
        )
        if not moved:
            raise Superseded(f"the job is no longer {' or '.join(values['expected'])} in run {self.run_number}")

    def update(self, **values: Any) -> None:
        """Plain fields of the job, written only while this run owns it."""
        in_transaction(lambda session: records.update_job(session, self.job_id, run=self.run_number, **values))

    def check_cancel(self) -> None:
        if self.cancelled():
            raise cancelled_on_request()

    def cancel_asked(self) -> bool:
        """The job's cancel flag read now (`cancelled` may be up to two seconds old)."""
        return bool(in_transaction(lambda session: records.cancel_requested(session, self.job_id)))

    def begin_publishing(self) -> None:
        """verifying -> publishing, unless a cancel was asked: `check_cancel` reads a flag up to two
        seconds old, this reads it in the same UPDATE, so a cancel asked before it always stops the push."""
        if in_transaction(lambda session: transitions.begin_publishing(session, self.job_id, self.run_number)):
            return
        if self.cancel_asked():
            raise cancelled_on_request()
        raise Superseded(f"the job is no longer verifying in run {self.run_number}")

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
            workspace_pool.remove_workspace(leftover)
        try:
            remove_finished_workspaces(self.root.parent)
        except SQLAlchemyError as exc:  # housekeeping only: the next run tries again
            log.warning("workspace_cleanup_failed", error=str(exc)[:300])
        try:
            self.forge = self.open_forge()
            self.admit()
            self.work()
            return JobStatus.done.value
        except Superseded as exc:
            log.warning("superseded", reason=str(exc))
            return "superseded"
        except JobEnded as end:
            self.end_log = end.log
            return self.end(end.status, end.reason, end.comment, end.notify, asks=end.asks, ending=end.ending)
        except (ForgeTransient, RepoTransient) as exc:
            why = f"the forge or git server kept failing: {exc}"
            return self.end(
                JobStatus.failed, why,
                "FrogFix could not reach the forge or the git server reliably; an operator can retry.",
                ending=ending_of(exc, why),
            )
        except (ForgeError, RepoError, RepoConfigError) as exc:
            return self.end(JobStatus.failed, str(exc), f"FrogFix stopped: {exc}", ending=ending_of(exc, str(exc)))
        except SandboxError as exc:
            why = f"sandbox failure: {exc}"
            return self.end(JobStatus.failed, why, "FrogFix stopped: the sandbox failed.", ending=ending_of(exc, why))
        except self.deps.time_limit_errors:
            why = f"the job ran past its time limit ({self.s.job_timeout_seconds:.0f} s)"
            return self.end(JobStatus.failed, why, "FrogFix stopped: the job took longer than its time limit.",
                            ending=Ending(EndingKind.job_timeout, why))
        except Exception as exc:
            log.exception("pipeline_bug")
            why = f"internal error: {type(exc).__name__}: {exc}"
            return self.end(JobStatus.failed, why, "FrogFix stopped on an internal error; an operator has the details.",
                            ending=ending_of(exc, why))
        finally:
            workspace_pool.remove_workspace(self.root)
            if self.forge is not None:
                self.forge.close()

    def open_forge(self) -> Forge | None:
        """The job's forge client (the job core's source of the issue and publisher of its MR)."""
        return self.deps.forge_for(self.forge_kind)

    def workspaces(self, prepared: Prepared) -> WorkspaceSource:
        """Where the attempts' fresh workspaces come from: the warm pool over the mirror."""
        return PoolSource(self.deps.pool, prepared.mirror)

    def observer(self, stop: threading.Event | None = None) -> JobObserver:
        return JobObserver(self, stop)

    def work(self) -> None:
        """What the job does once admitted: prepare the repository, run the attempts, publish the chosen one."""
        prepared = self.prepare()
        self.publish(prepared, self.attempts(prepared))

    def end(
        self, status: JobStatus, reason: str, comment: str | None, notify: str | None = None, *, asks: bool = False,
        ending: Ending | None = None,
    ) -> str:
        """The job's final status, its ending, its event and this run's open attempts, in one transaction, if
        still ours.

        `asks`: `comment` is a question to the reporter, posted as it is; the job records when it asked,
        so a `/frogfix` reply can queue it again with the comments written since. `ending`: how it ended,
        typed (without one, what the status alone says)."""
        reason = self.redact(reason)
        ended = (ending or ending_for_status(status)).redacted(self.redact).but(reason)

        def write(session: Session) -> bool:
            asked = {"asked_at": utcnow()} if asks else {}
            moved = transitions.set_status(
                session,
                self.job_id,
                status,
                error=None if status == JobStatus.no_fix else reason,
                expected=RUN_STATUSES,
                run=self.run_number,
                ending=ended,
                **asked,
            )
            if moved:
                attempts = AttemptStatus.cancelled if status == JobStatus.cancelled else AttemptStatus.failed
                records.close_open_attempts(session, self.job_id, attempts, reason, run=self.run_number)
                records.add_event(session, self.job_id, status.value, reason)
            return moved

        if not in_transaction(write):  # another run owns the job now; it will tell the issue how it ended
            log.warning("superseded", reason=f"could not end the job {status.value}: {reason}"[:500])
            return "superseded"
        log.info(status.value, message=reason[:500])
        if asks and comment is not None:
            if self.comment(comment):
                self.event("asked", "asked the reporter a question on the issue; a `/frogfix` reply queues it again")
        else:
            self.tell_end(status, reason, comment, notify)
        return status.value

    def tell_end(self, status: JobStatus, reason: str, comment: str | None, notify: str | None) -> None:
        """How a job that published nothing says so: a comment on the issue (a round replies on the MR)."""
        if comment is not None or status == JobStatus.no_fix:
            text = comment or reason
            outcome = status.value.replace("_", " ")
            self.comment(
                comment_finished(outcome, text, self.job_id, self.url, self.redact, notify=notify, log=self.end_log)
            )

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
        self.refuse_confidential(issue, "did not start")
        if issue.state != "open":
            raise JobEnded(JobStatus.cancelled, "the issue is closed", None)
        if label not in issue.labels:
            raise JobEnded(JobStatus.cancelled, f"the label {label!r} is no longer on the issue", None)
        # A run an answer re-queued (FrogFix asked; intake made the `/frogfix` commenter the trigger user):
        # the commenter triggers it and needs the rights; the label must still be there, as checked above.
        answered = self.asked_at is not None and bool(self.trigger_user)
        adder = self.trigger_user if answered else self.forge.label_adder(self.project, self.issue, label)
        adder = adder or self.trigger_user
        if not adder:
            raise JobEnded(
                JobStatus.rejected,
                "cannot tell who added the label",
                f"FrogFix could not tell who added `{label}`, so it did not start.",
            )
        allowed = self.forge.can_trigger(self.project, adder)
        if answered and not allowed:
            raise JobEnded(  # no mention: anyone can comment `/frogfix`; a member's answer still re-queues it
                JobStatus.rejected,
                f"{adder} may not trigger FrogFix here: their /frogfix answer starts nothing",
                "FrogFix did not try again: only members with at least Developer (write) access to this project"
                " can ask it to with `/frogfix`.",
            )
        if not allowed:
            raise JobEnded(
                JobStatus.rejected,
                f"{adder} may not trigger FrogFix here",
                f"{adder} added `{label}` but needs at least Developer (write) access to this "
                "project for FrogFix to act on it.",
                notify=adder,
            )
        self.title, self.body = issue.title, issue.body or ""
        self.issue_url = issue.web_url or self.issue_url
        self.trigger_user = adder  # who the job acts for from here on (its attestation names them)
        self.update(title=issue.title, body=issue.body, trigger_user=adder, issue_url=self.issue_url)
        self.event("admitted", f"{adder} may trigger; issue re-read from the API")
        if self.asked_at is not None:  # the comments since the question, up to the /frogfix that queued the run
            until = in_transaction(lambda session: records.answer_comment(session, self.job_id))
            self.answers = answers_since(self.forge, self.project, self.issue, self.asked_at, until=until,
                                         reporter=issue.author, allow_internal=self.s.gitlab_allow_confidential)
            authors = sorted({c.author or "?" for c in self.answers})
            self.event(
                "answers_read",
                f"{len(self.answers)} comment(s) since FrogFix's question go into the task"
                + (f" (by {', '.join(authors)})" if authors else ""),
                {"comments": [c.id for c in self.answers]},
            )
        announced = in_transaction(lambda session: records.announced_this_round(session, self.job_id))
        if not announced and self.comment(comment_started(self.job_id, self.url)):
            self.event("announced", "told the issue that FrogFix is working on it")

    def refuse_confidential(self, issue: Issue, outcome: str) -> None:
        """End the job `rejected` when the issue is confidential now and FROGFIX_GITLAB_ALLOW_CONFIDENTIAL is off.

        The webhook drops confidential issues, but an issue can be made confidential after it, so
        admission and publishing ask again. `rejected`, like any trigger FrogFix may not act on (an
        operator can retry once allowed). Nothing of the issue is said: the reason and the comment
        (which only those who may see the issue can read) are fixed words, and the job's copy of the
        title and body, taken when the issue was public, is dropped from the dashboard and the API.
        """
        if not issue.confidential or self.s.gitlab_allow_confidential:
            return
        self.title = self.body = ""
        self.update(title=None, body=None)
        raise JobEnded(
            JobStatus.rejected,
            f"the issue is confidential and FROGFIX_GITLAB_ALLOW_CONFIDENTIAL is off: FrogFix {outcome}",
            f"FrogFix does not work on confidential issues, so it {outcome}.",
        )

    def fetch_mirror(self) -> tuple[ProjectInfo, Path]:
        """The project as the forge has it, and its mirror brought up to date (every branch)."""
        assert self.forge is not None
        info = self.forge.project_info(self.project)
        key = gitcalls.mirror_key(self.forge_kind, self.project)
        auth = self.forge.git_auth_header()
        return info, gitcalls.retry_transient("git fetch", lambda: self.deps.repos.mirror(key, info.clone_url, auth))

    def prepare(self) -> Prepared:
        info, mirror = self.fetch_mirror()
        base = mirrors.resolve(mirror, info.default_branch)
        branch = self.branch = gitcalls.branch_for_issue(self.issue)
        head = self.remote_head(mirror, branch)
        self.refuse_to_replace(branch, head)
        self.update(base_commit=base, branch=branch)
        self.event(
            "prepared",
            f"mirror updated; base {info.default_branch} at {base[:12]}"
            + (f"; replaces {branch} at {head[:12]}" if head else ""),
            {"base_commit": base, "default_branch": info.default_branch, "replaces": head},
        )
        self.root.mkdir(parents=True, exist_ok=True)
        return Prepared(mirror, base, info.default_branch, info.clone_url, replaces=head or "")

    def refuse_to_replace(self, branch: str, head: str | None) -> None:
        """End the job `rejected` when the bot's branch holds work round 0 must not force-push over.

        A re-added label or a retry of round 0 starts from the base and replaces the branch, which is
        only right while the branch is round 0's own commit on an MR without rounds: a review round's
        commits, and anyone's pushes, are kept (the MR's reviewers asked for them)."""
        if head is None:
            return
        why = in_transaction(
            lambda session: rounds.why_not_replace(session, self.forge_kind, self.project, branch, head)
        )
        if why is not None:
            raise JobEnded(
                JobStatus.rejected,
                f"FrogFix did not start over: {why}",
                f"FrogFix did not start over, because {why}, and it never replaces those commits. Ask for "
                "changes on the merge request with a `/frogfix` comment, or delete the branch to start afresh.",
            )

    def remote_head(self, mirror: Path, branch: str) -> str | None:
        """`branch`'s head as the forge had it when the mirror was last fetched; None when it has none."""
        try:
            return mirrors.resolve(mirror, branch)
        except gitcalls.RepoError:
            return None

    def branch_head(self, branch: str) -> str | None:
        """The branch's head on the forge now (the mirror fetched again); None when it is gone."""
        _, mirror = self.fetch_mirror()
        return self.remote_head(mirror, branch)

    def push(self, prepared: Prepared, sha: str, *, expect_old: str, fast_forward: bool, skip_ci: bool) -> bool:
        """Push `sha` to the bot's branch, leased on `expect_old` ("" = the branch must not exist), so it
        never overwrites a commit someone pushed meanwhile. The job names the commit before the push
        (a `pushing` event, so a retry after a lost answer knows it as FrogFix's own) and records it as
        its `pushed_commit` once it landed. False when the branch moved (a retry after a lost answer
        that meets its own push is no move)."""
        assert self.forge is not None and self.branch is not None
        auth, branch = self.forge.git_auth_header(), self.branch
        options = skip_ci_push_options(self.forge_kind) if skip_ci else ()
        # Named before the push: if its answer is lost, a retry still knows the commit as its own.
        self.event(rounds.PUSHING, f"pushing {sha[:12]} to {branch}", {"commit": sha, "branch": branch})
        try:
            gitcalls.retry_transient(
                "git push",
                lambda: publishing.push_branch(
                    prepared.mirror,
                    prepared.clone_url,
                    auth,
                    branch,
                    sha,
                    expect_old=expect_old,
                    push_options=options,
                    fast_forward=fast_forward,
                ),
            )
        except gitcalls.RepoBranchMoved:
            if self.branch_head(branch) != sha:
                return False
        self.update(pushed_commit=sha)
        return True

    def attempts(self, prepared: Prepared) -> AttemptResult:
        """FROGFIX_ATTEMPTS attempts, then more up to FROGFIX_MAX_ATTEMPTS while no production job waits
        (worker/job/series_run.py); the selection rule (app/selection.py) picks the one to publish."""
        runner = self.runner = AttemptRunner(
            self.s, self.redact, self.workspaces(prepared), self.root, self.observer(),
            scope=f"{self.forge_kind}:{self.project}",
        )
        runner.agree = self.resolution is None
        run = SeriesRun(self, runner, prepared, self.task())
        series = self.series = run.run(self.s.attempts, self.s.attempt_ceiling)
        if series.extra_stop:
            self.event("extra_attempts_stopped", f"no more attempts: {series.extra_stop}")
        self.check_cancel()
        return self.choose(series, run)

    def choose(self, series: AttemptSeries, run: SeriesRun) -> AttemptResult:
        """The series' pick, or how the job ends without one. An unproven pick is published marked "not
        reproduced"; with none to publish, or an unproven pick under FROGFIX_REQUIRE_REPRODUCTION, the job
        publishes nothing and asks the reporter."""
        choice, chosen = series.choice, series.chosen
        self.selection = choice.to_dict()
        self.update(selection=self.selection)
        if chosen is None and run.failed:  # nothing to publish, and the infrastructure is why
            first = run.failed[0]
            if isinstance(first, BaseException):
                raise first
            raise JobEnded(JobStatus.failed, first.reason, f"FrogFix stopped: {first.reason}", ending=first.ending)
        forged = series.tampered
        if chosen is None and forged:  # no question: the issue is told which attempt forged what, and how
            found = [(r.number, r.verification.verdict.reason if r.verification else r.reason) for r in forged]
            raise JobEnded(JobStatus.no_fix, forged[0].reason, tampered_comment(found), ending=forged[0].ending)
        if chosen is None:
            last = series.results[-1].reason if series.results else "no attempt ran"
            raise self.abstain(series.results, last)
        if chosen.outcome == AttemptOutcome.unproven and self.s.require_reproduction:
            raise self.abstain(series.results, chosen.reason, require=True)
        self.event("chosen", choice.why, {"attempt": chosen.number, "attempts": choice.attempts})
        in_transaction(lambda session: records.update_attempt(session, run.ids[chosen.number], chosen=True))
        self.status(JobStatus.verifying, expected=("running", "verifying"))  # publishing starts from verifying
        return chosen

    def take_slots(self, want: int) -> int:
        """Model slots beyond the job's own for its attempts to run side by side: only free ones, and
        none while a production job is queued (app/jobs/job_slots.py). How many it took."""
        if want < 1 or self.s.model_slots < 2:
            return 0
        s = self.s
        taken = in_transaction(lambda session: job_slots.take_extra_slots(
            session, self.job_id, self.run_number, want, s.model_slots, s.stale_job_seconds))  # fmt: skip
        if taken:
            self.event("side_by_side", f"{taken + 1} attempts run side by side ({taken} more model slot(s))")
        return taken

    def abstain(self, results: list[AttemptResult], reason: str, *, require: bool = False) -> JobEnded:
        """No MR: the job ends `no_fix` with one comment saying what it tried and asking the reporter one
        question (worker/job/question.py); a `/frogfix` reply from a member queues the job again."""
        config = results[0].config if results else None
        why = f"FROGFIX_REQUIRE_REPRODUCTION: {reason}" if require else reason
        if self.round:  # a review round replies on its MR (answers are taken on issues only)
            return JobEnded(JobStatus.no_fix, why, unproven_comment(reason) if require else why)
        try:
            question = question_comment(
                self.deps.model_for(), title=self.title, body=self.body, attempts=results,
                test_command=config.test_command if config else None, redact=self.redact,
                job_id=self.job_id, job_url=self.url,
            )
        except Exception as exc:  # a bug in writing the question: the job still ends, saying why plainly
            log.exception("question_failed", error=str(exc)[:300])
            return JobEnded(JobStatus.no_fix, why, unproven_comment(reason) if require else None)
        if self.cancel_asked():  # asked while the question was being written: a cancel, and no question
            return cancelled_on_request()
        return JobEnded(JobStatus.no_fix, why, question, asks=True)

    def environment_error(self, report: EnvironmentReport) -> JobEnded:
        """The tests cannot run: the job fails before any model call, and the issue is told what to fix."""
        self.event("environment_error", report.line(), report.to_dict())
        comment = (
            f"FrogFix did not start: {report.reason}.\n\n"
            "FrogFix builds the test environment from what the repository declares (pyproject.toml, requirements"
            " files, setup.py/setup.cfg, tox.ini, uv.lock, poetry.lock) using the company's package mirror, then"
            " runs the tests on the base commit before the agent starts. Make the tests runnable from a fresh"
            " checkout, or say what to install in `.frogfix.yml` (`environment:` extras, groups, requirements,"
            " packages; `test_command`), then add the label again."
        )
        why = f"environment error: {report.reason}"
        return JobEnded(JobStatus.failed, why, comment, log=report.log_tail, ending=environment_ending(report, why))

    def task(self) -> str:
        """The agent's first user message: the issue as untrusted data (a round's adds its requests)."""
        return render_task(
            self.title,
            sanitize_issue_text(self.body),
            prompts_dir=self.s.prompts_dir,
            project=self.project,
            issue_number=self.issue,
            comments=self.answers,  # none unless FrogFix asked a question: then the task is as it always was
        )

    def one_attempt(
        self, runner: AttemptRunner, observer: JobObserver, prepared: Prepared, number: int, task: str
    ) -> AttemptResult:
        """One attempt through the shared runner, recorded as an attempt row of this run."""
        observer.start(
            in_transaction(lambda session: records.start_attempt(session, self.job_id, self.run_number, number))
        )
        fields = self.trajectory_fields(number)
        if self.round:
            fields.update(round=self.round, round_kind=self.round_kind, mr=self.mr_number)
        if self.resolution is not None:  # what replay needs to make the conflicted start again
            merge = self.resolution.merge
            fields["update"] = {
                "head": merge.head, "target": merge.target, "target_branch": self.resolution.target_branch,
                "conflicted": list(merge.conflicted),
            }  # fmt: skip
        spec = attempt_spec(
            self.s, job_id=self.job_id, number=number, base_commit=prepared.base, start_commit=prepared.start,
            task=task, seconds_left=self.deadline - time.monotonic(), resolution=self.resolution, fields=fields,
            trajectory=trajectory.attempt_path(self.job_id, self.run_number, number),
        )
        if self.deps.model_label is not None:  # provenance names what answered, never a model that did not run
            spec = replace(spec, model_label=self.deps.model_label, sampling={})
        result = runner.run(spec, self.deps.model_for(), ReviewPolicy.from_settings(self.s), observer)
        cancelled = result.outcome == AttemptOutcome.cancelled and self.cancel_asked()
        if result.outcome == AttemptOutcome.cancelled and not cancelled:  # stopped, not cancelled
            result.reason = ("stopped: a production job is waiting for the model" if observer.preempted
                             else "stopped: an attempt beside it ended the job")
        self._record_attempt(observer.attempt_id, result)  # before any status change that may find us superseded
        if cancelled:
            raise cancelled_on_request()
        if result.outcome == AttemptOutcome.cancelled:
            return result
        self.status(JobStatus.running, expected=("running", "verifying"))  # the next attempt, or the choice
        return result

    def trajectory_fields(self, number: int) -> dict[str, Any]:
        """What an attempt's trajectory says of its job, beside what the runner writes."""
        return {"attempt": number, "run": self.run_number, "forge": self.forge_kind, "project": self.project,
                "issue": self.issue}

    def _record_attempt(self, attempt_id: int, result: AttemptResult) -> None:
        leaf = result.leaf
        error = self.redact(leaf.error) if leaf.error else None
        fields: dict[str, Any] = {
            "exit_reason": leaf.exit_reason,
            "steps": leaf.steps,
            "trajectory_path": result.trajectory,
            "patch": result.patch,
            "summary": self.redact(leaf.final_answer)[:20_000],
            "error": result.reason if result.outcome in (AttemptOutcome.refused, AttemptOutcome.cancelled) else error,
            "flags": result.flags,
        }
        if result.evidence is not None:
            fields["tests"] = result.evidence.to_dict()

        def write(session: Session) -> None:
            records.update_attempt(session, attempt_id, finished=True, status=result.status, **fields)
            records.record_usage(session, self.job_id, attempt_id, result.usage)

        in_transaction(write)

    def publish(self, prepared: Prepared, result: AttemptResult) -> None:
        """Push the verified patch to the bot's branch and open (or update) the one draft MR."""
        assert self.forge is not None
        self.check_cancel()
        # Webhooks can be stale or missed (Gitea does not say which label changed): ask once more.
        issue = self.forge.get_issue(self.project, self.issue)
        self.refuse_confidential(issue, "published nothing")
        if issue.state != "open" or self.s.trigger_label not in issue.labels:
            raise JobEnded(JobStatus.cancelled, "the issue was closed or the label removed while the job ran", None)
        signer = attesting.signer_or_end(self)  # no key under FROGFIX_REQUIRE_ATTESTATION: nothing is pushed
        self.begin_publishing()
        branch = self.branch or gitcalls.branch_for_issue(self.issue)
        title = self.redact(self.title)  # before it is disarmed: a zero-width space could hide a secret
        skip_ci = not self.s.allow_forge_ci
        message = self.redact(attesting.with_trailer(commit_message(self.issue, title, self.job_id, skip_ci=skip_ci),
                                                     self.s))  # fmt: skip
        mirror, base = prepared.mirror, prepared.base
        assert result.changes is not None, "only a judged attempt is published"
        sha = publishing.commit_patch(
            mirror, base, result.patch, message, BOT_AUTHOR, self.root / "publish", expect_tree=result.changes.tree
        )
        envelope = attesting.sign_change(self, signer, base, sha, result)
        if not self.push(prepared, sha, expect_old=prepared.replaces, fast_forward=False, skip_ci=skip_ci):
            raise JobEnded(
                JobStatus.failed,
                BRANCH_MOVED,
                "Someone pushed to the branch while FrogFix worked, so it pushed nothing and kept their commits.",
                ending=Ending(EndingKind.branch_moved),
            )
        self.event("pushed", f"pushed {sha[:12]} to {branch}", {"commit": sha, "branch": branch})
        self.attestation = attesting.keep(self, envelope, result)
        description = self.description(prepared, result)
        if prepared.replaces:  # an MR on the branch it replaced keeps its rounds section
            existing = self.forge.find_open_mr(self.project, branch)
            if existing is not None:
                description = keep_rounds_section(existing.description, description, self.redact)
        mr, created = upsert_draft_mr(
            self.forge,
            self.project,
            branch,
            prepared.default_branch,
            self.redact(mr_title(self.issue, title, proven=result.outcome == AttemptOutcome.verified)),
            description,
        )
        self.finish(
            mr.web_url,
            f"{'opened' if created else 'updated'} draft {mr.web_url}",
            result.flags,
            {"created": created, "attestation": self.attestation},
            mr_number=mr.number,
        )
        self.comment(
            comment_finished("draft merge request ready", "", self.job_id, self.url, self.redact, mr_url=mr.web_url)
        )

    def description(self, prepared: Prepared, result: AttemptResult) -> str:
        provenance = Provenance(
            model=self.s.model_name,
            sampling=sampling_from(self.s).body_fields(),
            base_commit=prepared.base,
            sandbox=f"{self.s.sandbox} ({result.config.image or 'default image'})",
            attempt=result.number,
            attempts=int(self.selection.get("attempts") or self.s.attempts),
            attestation=self.attestation,
        )
        assert result.evidence is not None, "only a verified attempt is published"
        return mr_description(
            issue_ref=f"#{self.issue}",
            issue_url=self.issue_url,
            summary=result.leaf.final_answer,
            diffstat=result.changes.diffstat() if result.changes else [],
            tests=result.evidence,
            flags=result.flags,
            job_url=self.url,
            provenance=provenance,
            redact=self.redact,
            selection=self.selection,
        )

    def finish(self, mr_url: str | None, message: str, flags: list[str], data: dict[str, Any], **recorded: Any) -> None:
        """The job is done with its MR, in one transaction with its event, if this run still owns it.

        `recorded`: what the job keeps of the publish (the MR's number; `push` recorded the commit).
        """

        def finish(session: Session) -> bool:
            done = transitions.set_status(
                session,
                self.job_id,
                JobStatus.done,
                expected=("publishing",),
                run=self.run_number,
                mr_url=mr_url,
                flags=flags,
                **recorded,
            )
            if done:
                records.add_event(session, self.job_id, "done", message, {"mr_url": mr_url, **data})
            return done

        if not in_transaction(finish):  # the MR is there; the run that owns the job now finds and updates it
            raise Superseded(f"the job left 'publishing' in run {self.run_number} while this run published")


def unproven_comment(reason: str) -> str:
    """The issue's comment when FROGFIX_REQUIRE_REPRODUCTION keeps an unproven patch unpublished (and no
    question could be written)."""
    return (
        f"FrogFix found a patch that passes the tests, but nothing shows it fixes this issue: {reason}. "
        "FROGFIX_REQUIRE_REPRODUCTION is on, so it published nothing. It ran the tests on the base commit, "
        "then with the patch, and the patch's own test changes alone on the base source; a fix counts as shown "
        "when a test fails without it and passes with it. Describe how to reproduce the bug (ideally a failing "
        "test), then add the label again."
    )
