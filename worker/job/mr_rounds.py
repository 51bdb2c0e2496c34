"""An MR's rounds after the draft: review and CI rounds, update rounds, and the MR's rounds section.

A round (a job with `round > 0`) works on the MR FrogFix opened, on top of its branch's head, and
pushes one fast-forward commit, never a force push. `RoundPipeline` answers reviewers' comments and
failed CI; `UpdateRoundPipeline` (issue 25) merges the MR's moved target branch in, with the agent
resolving conflicts when git cannot, and verifies the merged branch against the target's new head.
Both are `Pipeline`s (worker/job/pipeline.py): the stages, the attempts and the push are the same.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session

from app.db import in_transaction, session_scope
from app.endings import Ending, EndingKind
from app.forge.api import Forge, ForgeError, MergeRequest
from app.forge.reviews import STALE_CI, CiReport, ReviewComment, ThreadNote, about_head
from app.jobs import rounds
from app.redaction import redact_value
from app.settings import Settings
from app.statuses import EvidenceLevel, JobStatus, RequestStatus
from worker.attempts.attempt import AttemptResult, AttemptRunner, ReviewPolicy
from worker.attempts.verifier import Verification
from worker.environment.report import EnvironmentUnusable
from worker.git import gitcalls, merging, mirrors, publishing
from worker.git.workspace_sources import PoolSource
from worker.job import attesting
from worker.job.job_context import BOT_AUTHOR, BRANCH_MOVED, Deps, JobEnded, Prepared, job_url, project_allowed
from worker.job.pipeline import JobObserver, Pipeline
from worker.leaf.prompts import MAX_COMMENT_CHARS, MAX_DIFF_CHARS, render_round_task, render_update_task
from worker.texts.mr_text import (
    RoundLine,
    commit_message,
    merge_commit_message,
    round_outcome,
    round_reply_ended,
    round_reply_pushed,
    rounds_section,
    update_reply_pushed,
)

MAX_THREAD_NOTES = 200  # the newest notes of a long review thread


def thread_round_lines(
    thread_id: int, settings: Settings, *, pushed: tuple[int, str] | None = None, flags: list[str] | None = None
) -> list[RoundLine]:
    """The thread's rounds as the MR's rounds section lists them, round 0 first, each with its forge CI
    and the review flags its job kept.

    `pushed` (job id, commit): the round publishing now, shown as pushed with `flags` (its job row is not
    finished yet, so it holds neither)."""
    with session_scope() as session:
        jobs = [
            (j.id, j.round or 0, j.round_kind, j.trigger_user, j.pushed_commit, j.status, j.ci_status, j.flags)
            for j in rounds.thread_jobs(session, thread_id)
        ]
    lines = []
    for job_id, number, kind, who, commit, status, ci, kept in jobs:
        if pushed is not None and job_id == pushed[0]:
            commit, status, kept = pushed[1], JobStatus.done.value, flags
        kind = kind or ("issue" if number == 0 else "review")
        shown = tuple(f for f in kept or [] if isinstance(f, str))
        lines.append(RoundLine(number, kind, who, commit, round_outcome(status), job_url(settings, job_id), ci, shown))
    return lines


def show_rounds(
    forge: Forge, project: str, mr_number: int, lines: list[RoundLine], redact: Callable[[str], str]
) -> MergeRequest:
    """Rewrite the MR's one rounds section from `lines` (its title, the rest of its text and its draft
    state as they are); an MR a human merged or closed is left alone."""
    mr = forge.get_mr(project, mr_number)
    if mr.verdict != "open":
        return mr
    return forge.update_mr(project, mr, mr.title, rounds_section(mr.description, lines, redact))


class RoundPipeline(Pipeline):
    """A review round (a job with `round > 0`): new commits on the MR FrogFix opened, on top of its head.

    It takes the thread's accepted requests (reviewers' comments, failed CI), starts from the
    branch's head, verifies as round 0 does (before on the base, after on the head with the patch),
    pushes one fast-forward commit, rewrites the MR's rounds section and replies to each request.
    """

    def __init__(self, job_id: int, deps: Deps) -> None:
        super().__init__(job_id, deps)
        self.taken: list[dict[str, Any]] = []  # the requests this round took (RoundRequest.to_dict())
        self.target_branch = ""  # the MR's target branch, as the forge says at admission
        self.thread: list[ThreadNote] = []
        self.diff = ""

    def drop_waiting(self, reason: str) -> None:
        if self.thread_id is not None:
            thread_id = self.thread_id
            in_transaction(lambda session: rounds.drop_requests(session, thread_id, reason))

    def admit(self) -> None:
        assert self.forge is not None
        if not project_allowed(self.s, self.project):
            raise JobEnded(JobStatus.rejected, f"project {self.project} is not in FROGFIX_ALLOWED_PROJECTS", None)
        if self.mr_number is None or self.thread_id is None:
            raise JobEnded(JobStatus.failed, "the round names no MR or thread", None)
        issue = self.forge.get_issue(self.project, self.issue)
        self.refuse_confidential(issue, "did not start")
        if issue.state != "open" or self.s.trigger_label not in issue.labels:
            reason = f"the issue is closed or the label {self.s.trigger_label!r} was removed"
            self.drop_waiting(reason)
            raise JobEnded(JobStatus.cancelled, reason, None)
        mr = self.forge.get_mr(self.project, self.mr_number)
        if mr.verdict != "open":
            self.drop_waiting(f"the MR is {mr.verdict}")
            raise JobEnded(JobStatus.cancelled, f"the MR is {mr.verdict}", None)
        self.target_branch = mr.target_branch
        self.taken = self.drop_stale_ci(in_transaction(self.take_requests), mr.head_sha)
        if not self.taken:  # ends quietly: no request of this round is left to answer
            raise JobEnded(JobStatus.cancelled, "nothing to do: no accepted request waits for this round", None)
        # The newest request with an author asked last (a CI result may have none: triage checked its commit).
        asker = next((r["author"] for r in reversed(self.taken) if r.get("author")), None) or self.trigger_user
        if asker and not self.forge.can_trigger(self.project, asker):
            raise JobEnded(
                JobStatus.rejected,
                f"{asker} may not ask FrogFix for changes here",
                "Only members with Developer (write) access can ask FrogFix for changes.",
            )
        self.thread = self.forge.review_thread(self.project, self.mr_number)[-MAX_THREAD_NOTES:]
        self.title, self.body = issue.title, issue.body or ""
        self.issue_url = issue.web_url or self.issue_url
        self.trigger_user = asker
        self.update(
            title=issue.title,
            body=issue.body,
            trigger_user=asker,
            issue_url=self.issue_url,
            round_input=self.round_input(),
        )
        self.event(
            "admitted",
            f"round {self.round}: took {len(self.taken)} request(s); {asker or 'CI'} asked last",
            {"requests": [r.get("id") for r in self.taken]},
        )

    def drop_stale_ci(self, taken: list[dict[str, Any]], head: str | None) -> list[dict[str, Any]]:
        """`taken` without the CI results on a commit that is no longer the MR's head, which are dropped.

        A pipeline may fail on a head while a round works on it; once the round pushed, that failure
        is about code the MR no longer has (and its logs would mislead the next round)."""
        ci = [r for r in taken if r.get("kind") == "ci"]
        stale = [int(r["id"]) for r in ci if not about_head((r.get("data") or {}).get("sha"), head)]
        if not stale:
            return taken
        in_transaction(lambda session: rounds.drop_taken(session, self.job_id, stale, STALE_CI))
        self.event("stale_ci", f"dropped {len(stale)} CI result(s) on an older head", {"requests": stale})
        return [r for r in taken if r.get("id") not in stale]

    def take_requests(self, session: Session) -> list[dict[str, Any]]:
        """The thread's accepted requests, now this round's, with those an earlier run of it took (a rerun)."""
        rounds.take_requests(session, self.job_id)
        mine = rounds.requests_of(session, job_id=self.job_id)
        return [r.to_dict() for r in mine if r.status == RequestStatus.taken.value]

    def round_input(self) -> dict[str, Any]:
        """What the round was given, as the job keeps it (redacted; the thread's notes bounded)."""
        notes = [{**n.to_dict(), "body": n.body[:MAX_COMMENT_CHARS]} for n in self.thread]
        given = {"requests": self.taken, "thread": notes, "diff": self.diff}
        return redact_value(given, self.redact)

    def prepare(self) -> Prepared:
        """Start from the branch's head in the mirror (a human's pushes included); base = where it left main."""
        info, mirror = self.fetch_mirror()
        branch = self.branch or gitcalls.branch_for_issue(self.issue)
        start = mirrors.resolve(mirror, branch)
        base = mirrors.merge_base(mirror, start, mirrors.resolve(mirror, info.default_branch))
        self.branch, self.diff = branch, mirrors.diff_text(mirror, base, start, limit=MAX_DIFF_CHARS)
        self.update(start_commit=start, base_commit=base, branch=branch, round_input=self.round_input())
        self.event(
            "prepared",
            f"mirror updated; round {self.round} builds on {branch} at {start[:12]}, base {base[:12]}",
            {"start_commit": start, "base_commit": base, "default_branch": info.default_branch},
        )
        self.root.mkdir(parents=True, exist_ok=True)
        return Prepared(mirror, base, info.default_branch, info.clone_url, start=start)

    def requests(self) -> list[ReviewComment | CiReport]:
        """The taken requests as the forge vocabulary has them (what the task quotes)."""
        asked: list[ReviewComment | CiReport] = []
        for request in self.taken:
            data = request.get("data") or {}
            if request.get("kind") == "ci":
                asked.append(CiReport.from_dict(data))
            elif request.get("kind") == "review":
                asked.append(ReviewComment.from_dict({"author": request.get("author"), **data}))
        return asked

    def task(self) -> str:
        return self.redact(
            render_round_task(
                self.title,
                self.body,
                requests=self.requests(),
                thread=self.thread,
                diff=self.diff,
                prompts_dir=self.s.prompts_dir,
                project=self.project,
                issue_number=self.issue,
                mr_number=self.mr_number or "",
                round_number=self.round,
            )
        )

    def publish(self, prepared: Prepared, result: AttemptResult) -> None:
        """One commit on the head the round started from, pushed as a fast-forward; then the MR and the replies."""
        assert self.forge is not None and prepared.start is not None and self.mr_number is not None
        self.still_asked()
        signer = attesting.signer_or_end(self)
        self.begin_publishing()
        skip_ci = not self.s.allow_forge_ci
        message = self.redact(attesting.with_trailer(
            commit_message(self.issue, self.redact(self.title), self.job_id, skip_ci=skip_ci, round_number=self.round),
            self.s,
        ))  # fmt: skip
        assert result.changes is not None, "only a judged attempt is published"
        sha = publishing.commit_patch(
            prepared.mirror,
            prepared.start,
            result.patch,
            message,
            BOT_AUTHOR,
            self.root / "publish",
            expect_tree=result.changes.tree,
        )
        envelope = attesting.sign_change(self, signer, prepared.start, sha, result)
        self.push_round(prepared, sha, skip_ci)
        self.event("pushed", f"pushed {sha[:12]} on {prepared.start[:12]} to {self.branch}", {"commit": sha})
        self.attestation = attesting.keep(self, envelope, result)
        assert self.thread_id is not None
        lines = thread_round_lines(self.thread_id, self.s, pushed=(self.job_id, sha), flags=result.flags)
        mr = show_rounds(self.forge, self.project, self.mr_number, lines, self.redact)
        self.finish(
            mr.web_url,
            f"round {self.round} pushed {sha[:12]} to {mr.web_url}",
            result.flags,
            {"commit": sha, "round": self.round, "attestation": self.attestation},
        )
        self.reply_all(
            round_reply_pushed(
                round_number=self.round,
                commit=sha,
                diffstat=result.changes.diffstat(),
                summary=result.leaf.final_answer,
                job_id=self.job_id,
                job_url=self.url,
                redact=self.redact,
                flags=result.flags,
                attestation=self.attestation,
            )
        )

    def still_asked(self) -> None:
        """Before publishing: no cancel asked, and the issue still open, public enough and labelled."""
        assert self.forge is not None
        self.check_cancel()
        issue = self.forge.get_issue(self.project, self.issue)
        self.refuse_confidential(issue, "published nothing")
        if issue.state != "open" or self.s.trigger_label not in issue.labels:
            self.drop_waiting("the issue was closed or the label removed")
            raise JobEnded(JobStatus.cancelled, "the issue was closed or the label removed while the round ran", None)

    def push_round(self, prepared: Prepared, sha: str, skip_ci: bool, head: str | None = None) -> None:
        """A fast-forward from the head the round started on (`head`, else the attempts' start); a branch that
        moved meanwhile ends the round and gives its requests back."""
        head = head or prepared.start
        assert head is not None
        if not self.push(prepared, sha, expect_old=head, fast_forward=True, skip_ci=skip_ci):
            in_transaction(lambda session: rounds.return_requests(session, self.job_id, BRANCH_MOVED))
            raise JobEnded(
                JobStatus.failed,
                BRANCH_MOVED,
                "Someone pushed to the branch while this round ran, so FrogFix pushed nothing; "
                "the next round takes these requests again on the new head.",
                ending=Ending(EndingKind.branch_moved),
            )

    def reply_all(self, text: str) -> None:
        """One reply per discussion the taken requests came from (comments without one: one reply on the MR).

        Best effort: a reply that cannot be posted is noted on the timeline, never fatal.
        """
        if self.forge is None or self.mr_number is None:
            return
        discussions: list[str | None] = []
        for request in self.taken:
            data = request.get("data") or {}
            key = data.get("discussion_id") if request.get("kind") == "review" else None
            key = key if isinstance(key, str) and key else None
            if key not in discussions:
                discussions.append(key)
        for discussion in discussions:
            try:
                self.forge.reply(self.project, self.mr_number, self.redact(text), discussion)
            except ForgeError as exc:
                self.event("reply_failed", f"could not reply on the MR: {exc}")

    def tell_end(self, status: JobStatus, reason: str, comment: str | None, notify: str | None) -> None:
        """A round that pushed nothing says why in the MR's threads it was asked in, not on the issue.

        A round `/frogfix stop` cancelled says nothing: the stop's own reply told the thread."""
        if not self.taken:
            return
        if status == JobStatus.cancelled and in_transaction(
            lambda session: rounds.stopped_by_request(session, self.job_id)
        ):
            return
        outcome = round_outcome(status.value)
        self.reply_all(
            round_reply_ended(
                round_number=self.round,
                outcome=outcome,
                detail=comment or reason,
                job_id=self.job_id,
                job_url=self.url,
                redact=self.redact,
                kind=self.round_kind or "review",
            )
        )



class UpdateRoundPipeline(RoundPipeline):
    """An update round (`round_kind` update): the MR's target branch merged into its branch as one merge commit.

    The merge's first parent is the branch's head (a human's commits on it kept), its second the
    target's head. When git merges cleanly no model runs; when it conflicts, the agent resolves the
    conflicted checkout, and a resolution that leaves a marker or drops the fix's own change is
    refused (worker/git/merging.py). Either way the merged branch is verified against the target's new
    head by the rules every patch meets, and a fix whose evidence proved it must prove it again
    there: if the bug is gone on the new target, FrogFix says so and pushes nothing.
    """

    def __init__(self, job_id: int, deps: Deps) -> None:
        super().__init__(job_id, deps)
        self.merge: merging.Merge | None = None
        self.commits = ""  # the target's new commits touching the conflicted files, for the task

    def round_input(self) -> dict[str, Any]:
        given = super().round_input()
        if self.merge is not None:
            given["merge"] = {
                "head": self.merge.head, "target": self.merge.target, "target_branch": self.target_branch,
                "conflicted": list(self.merge.conflicted), "fork": self.resolution.fork if self.resolution else None,
            }  # fmt: skip
        return given

    def prepare(self) -> Prepared:
        """The branch's head and the target's head from the mirror, and git's merge of the two."""
        info, mirror = self.fetch_mirror()
        branch = self.branch or gitcalls.branch_for_issue(self.issue)
        target_branch = self.target_branch = self.target_branch or info.default_branch
        head, target = mirrors.resolve(mirror, branch), mirrors.resolve(mirror, f"refs/heads/{target_branch}")
        self.branch = branch
        self.update(start_commit=head, base_commit=target, branch=branch)
        if merging.is_ancestor(mirror, target, head):
            why = f"{branch} already contains {target_branch} at {target[:12]}: there is nothing to merge."
            raise JobEnded(JobStatus.no_fix, why, why)
        fork = mirrors.merge_base(mirror, head, target)
        merge = self.merge = merging.merge_trees(mirror, head, target)
        if merge.tree == merging.tree_of(mirror, target):
            why = (
                f"The fix no longer applies: {target_branch} at {target[:12]} already holds every change of this"
                " merge request. Close the merge request if the issue is fixed."
            )
            raise JobEnded(JobStatus.no_fix, why, why)
        self.resolution = merging.Resolution(merge, fork, target_branch)
        self.diff = mirrors.diff_text(mirror, fork, head, limit=MAX_DIFF_CHARS)
        data = {"start_commit": head, "base_commit": target, "target_branch": target_branch,
                "conflicted": list(merge.conflicted)}  # fmt: skip
        if merge.clean:
            start = head
            said = f"{target_branch} at {target[:12]} merges cleanly into {branch} at {head[:12]}"
        else:
            start = merging.conflicted_commit(mirror, merge)
            self.commits = merging.target_log(mirror, fork, target, list(merge.conflicted))
            shown = ", ".join(merge.conflicted[:10]) + (" ..." if len(merge.conflicted) > 10 else "")
            said = f"merging {target_branch} at {target[:12]} into {branch} at {head[:12]} conflicts in {shown}"
        self.update(round_input=self.round_input())
        self.event("prepared", f"mirror updated; {said}", data)
        self.root.mkdir(parents=True, exist_ok=True)
        return Prepared(mirror, target, target_branch, info.clone_url, start=start)

    def task(self) -> str:
        assert self.merge is not None
        return self.redact(
            render_update_task(
                self.title,
                self.body,
                conflicted=self.merge.conflicted,
                diff=self.diff,
                commits=self.commits,
                target_branch=self.target_branch,
                head=self.merge.head,
                target=self.merge.target,
                prompts_dir=self.s.prompts_dir,
                project=self.project,
                issue_number=self.issue,
                mr_number=self.mr_number or "",
                round_number=self.round,
            )
        )

    def work(self) -> None:
        """A clean merge is verified as it is; a conflicted one goes to the agent's attempts first."""
        prepared = self.prepare()
        assert self.merge is not None and self.resolution is not None
        if self.merge.clean:
            self.status(JobStatus.verifying, expected=("running", "verifying"))  # no agent: straight to the tests
            verification, timeout = self.check_clean(prepared)
            self.publish_merge(prepared, self.merge.tree, verification, timeout)
            return
        result = self.attempts(prepared)
        assert result.changes is not None and result.verification is not None
        self.publish_merge(
            prepared, result.changes.tree, result.verification, result.config.test_timeout,
            summary=result.leaf.final_answer, flags=result.flags,
        )

    def check_clean(self, prepared: Prepared) -> tuple[Verification, float]:
        """The merged branch's tests against the target's new head, with no agent."""
        assert self.merge is not None
        self.check_cancel()
        runner = AttemptRunner(
            self.s, self.redact, PoolSource(self.deps.pool, prepared.mirror), self.root, JobObserver(self),
            scope=f"{self.forge_kind}:{self.project}",
        )
        try:
            review = ReviewPolicy.from_settings(self.s)
            config, verification = runner.check_merge(prepared.base, self.merge.tree, review)
        except EnvironmentUnusable as exc:
            raise self.environment_error(exc.report) from exc
        if verification is None:
            raise JobEnded(JobStatus.no_fix, "no test command was found to verify the merge; add test_command to"
                           " .frogfix.yml", None)
        summary = verification.summary(config.test_timeout)
        self.event("verified" if verification.verdict.proves_fix else "not_verified", f"the merge: {summary}",
                   {"evidence": verification.verdict.level.value, "tests": verification.evidence().to_dict()})
        return verification, config.test_timeout

    def publish_merge(
        self, prepared: Prepared, tree: str, verification: Verification, timeout: float, *, summary: str = "",
        flags: list[str] | None = None,
    ) -> None:
        """The merge commit of `tree`, pushed as a fast-forward from the branch's head; then the MR and a reply."""
        assert self.forge is not None and self.merge is not None and self.resolution is not None
        assert self.mr_number is not None and self.thread_id is not None
        thread_id = self.thread_id
        job_id = self.job_id
        prior = in_transaction(lambda session: rounds.thread_proof(session, thread_id, job_id))
        why = still_holds(prior, verification, self.target_branch, self.merge.target)
        if why is not None:
            raise JobEnded(JobStatus.no_fix, why, why)
        self.still_asked()
        self.begin_publishing()
        skip_ci = not self.s.allow_forge_ci
        message = merge_commit_message(
            self.issue, self.target_branch, self.merge.target, self.job_id, skip_ci=skip_ci,
            round_number=self.round, conflicted=len(self.merge.conflicted),
        )
        sha = merging.merge_commit(prepared.mirror, self.merge, tree, self.redact(message), BOT_AUTHOR)
        self.push_round(prepared, sha, skip_ci, head=self.merge.head)
        self.event("pushed", f"pushed the merge {sha[:12]} on {self.merge.head[:12]} to {self.branch}",
                   {"commit": sha, "parents": [self.merge.head, self.merge.target]})
        lines = thread_round_lines(thread_id, self.s, pushed=(self.job_id, sha), flags=flags or [])
        mr = show_rounds(self.forge, self.project, self.mr_number, lines, self.redact)
        resolutions = self.resolution.summaries(prepared.mirror, tree)
        self.finish(
            mr.web_url,
            f"update round {self.round} pushed the merge {sha[:12]} of {self.target_branch} to {mr.web_url}",
            flags or [],
            {
                "commit": sha,
                "round": self.round,
                "merged": self.merge.target,
                "resolved": [{"path": p, "how": how} for p, how in resolutions],
                "tests": verification.evidence().to_dict(),
            },
        )
        self.reply_all(
            update_reply_pushed(
                round_number=self.round,
                commit=sha,
                target_branch=self.target_branch,
                target=self.merge.target,
                resolutions=resolutions,
                tests=verification.summary(timeout),
                summary=summary,
                job_id=self.job_id,
                job_url=self.url,
                redact=self.redact,
                flags=flags or [],
            )
        )


def still_holds(prior: str | None, verification: Verification, target_branch: str, target: str) -> str | None:
    """Why the merged branch may not be pushed (None: it may): its tests must pass on the target's new
    head with no test that passed there failing, and a fix the thread proved (`prior`: `reproduced` or
    `failed_before`) must be proven again there; otherwise the bug is gone on the new target."""
    verdict = verification.verdict
    where = f"{target_branch} at {target[:12]}"
    if verdict.level in (EvidenceLevel.regressed, EvidenceLevel.unrunnable) or not verdict.passing:
        return f"After merging {where}, the tests do not pass: {verdict.reason}."
    if prior is not None and not verdict.proves_fix:
        return (
            f"The fix no longer applies: it was proven ({prior}) before, but on {where} nothing shows the bug"
            f" any more ({verdict.reason}); the bug looks fixed there already."
        )
    return None
