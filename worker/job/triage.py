"""Triage: each round request (a comment, review or CI result on an MR FrogFix opened) judged once.

The webhook recorded the request `pending` from what the delivery showed; this asks the forge
what a delivery cannot prove (who FrogFix is, whether the MR is still open, whether the author is
a member, whether the CI result is about the MR's head) and then accepts, ignores or drops it.
An accepted request starts the thread's next round when none is active; otherwise it waits and
is batched into the next one (app/jobs/rounds.py). Celery-free: worker/tasks.py registers it.
Everything in a request was typed by people FrogFix does not trust: it is compared, never run.
With FROGFIX_AUTO_UPDATE on, `check_for_update` also asks the forge whether the MR conflicts with
its moved target, after every triage and from the sweep, and starts an update round once per
target head (issue 25).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sqlalchemy.orm import Session

from app.db import session_scope
from app.forge.api import Forge, ForgeError, ForgeNotFound, ForgeTransient, MergeRequest
from app.forge.reviews import (
    STALE_CI,
    CiReport,
    MergeCommits,
    ReviewComment,
    about_head,
    command_text,
    mentions,
    merge_ref_mr,
)
from app.jobs import rounds
from app.jobs.records import active_job, add_event
from app.jobs.requeue import send_and_stamp
from app.jobs.transitions import CancelOutcome, request_cancel
from app.logs import get_logger
from app.models import Job, RoundRequest
from app.redaction import SecretRedactor
from app.settings import Settings
from app.statuses import RequestStatus, RoundKind
from worker.git import gitcalls, merging, mirrors
from worker.job.mr_rounds import show_rounds, thread_round_lines

log = get_logger("frogfix.triage")

OWN_COMMENT = "FrogFix's own comment"
NOT_ADDRESSED = "not addressed to FrogFix"
NOT_MEMBER = "the author lacks Developer/write access"
NOT_MEMBER_REPLY = (
    "Only members with Developer (GitLab) or write (Gitea/Forgejo) access can ask FrogFix for changes "
    "on this merge request."
)
# Line comments and change requests on FrogFix's MR are addressed to it without naming it.
ADDRESSED_KINDS = ("diff_note", "review_changes", "review_comment")


@dataclass(frozen=True)
class RequestView:
    """What triage needs of a request and its thread, read in one short transaction."""

    id: int
    thread_id: int
    forge: str
    project: str
    issue: int
    mr: int
    kind: str
    author: str | None
    data: dict[str, Any]

    @classmethod
    def of(cls, request: RoundRequest, thread: Job) -> RequestView:
        return cls(
            id=request.id,
            thread_id=thread.id,
            forge=request.forge,
            project=request.project,
            issue=thread.issue,
            mr=request.mr_number,
            kind=request.kind,
            author=request.author,
            data=dict(request.data or {}),
        )

    def comment(self) -> ReviewComment:
        return ReviewComment.from_dict(self.data)


@dataclass(frozen=True)
class Verdict:
    """Triage's decision on one request, and what to say about it on the MR."""

    status: RequestStatus
    reason: str
    reply: str | None = None
    # Say `reply` only once per thread: to each author (`author`), or for each request kind (`kind`).
    reply_once: Literal["author", "kind"] | None = None
    data: dict[str, Any] | None = None
    stop: bool = False  # `/frogfix stop`: cancel the thread's active job and drop what waits
    drop_thread: bool = False  # the issue no longer asks for a fix: drop everything that waits
    # A CI result to show on the job that pushed the commit it tested, and on the MR (mapped to that commit).
    ci: CiReport | None = None


@dataclass
class Outcome:
    """What triage did, after the commit: the reply to post and the round to send."""

    verdict: Verdict
    reply: str | None = None
    round_job: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    shown_ci: bool = False  # a CI result was noted on a job of the thread: the MR's rounds section shows it


# -- pure decisions -------------------------------------------------------------------------------


def addressed_to_bot(comment: ReviewComment, bot: str) -> bool:
    """A `/frogfix` command, a line comment or change request on its MR, or a mention of its account."""
    return command_text(comment.body) is not None or comment.kind in ADDRESSED_KINDS or mentions(comment.body, bot)


def is_own(author: str | None, bot: str) -> bool:
    """Whether the author is FrogFix's own account (forges compare usernames case-insensitively)."""
    return bool(author) and bool(bot) and str(author).casefold() == bot.casefold()


# Each round kind's cap (its setting's name) and what its requests are called in a reply.
_CAPS: dict[str, tuple[str, str]] = {
    RoundKind.review: ("max_review_rounds", "review comments"),
    RoundKind.ci: ("max_ci_rounds", "CI failures"),
    RoundKind.update: ("max_update_rounds", "updates from the target branch"),
}


def cap_reason(kind: str, used: int, settings: Settings) -> str | None:
    """Why the thread may not have another round of `kind` (None: it may); each kind's rounds count apart."""
    name = _CAPS[kind][0]
    cap = int(getattr(settings, name))
    if used < cap:
        return None
    return f"the MR reached FROGFIX_{name.upper()} ({cap})"


def cap_reply(kind: str, reason: str) -> str:
    return f"FrogFix will not start another round for {_CAPS[kind][1]} on this merge request: {reason}."


def issue_still_asks(forge: Forge, project: str, number: int, label: str) -> str | None:
    """Why the issue no longer asks for a fix (closed, or the trigger label removed); None when it does."""
    issue = forge.get_issue(project, number)
    if issue.state != "open":
        return "the issue is closed"
    if label not in issue.labels:
        return f"the label {label!r} is no longer on the issue"
    return None


# -- the decision, with the forge ------------------------------------------------------------------


def tested_commit(forge: Forge, view: RequestView, report: CiReport) -> str | None:
    """The commit of the MR's branch a CI result is about: its own commit, or for a GitLab merged-results
    pipeline of this very MR, the MR head its merge commit was made from; None when that cannot be told."""
    merged_for = merge_ref_mr(report.ref)
    if merged_for is None:
        return report.sha
    if merged_for != view.mr or not isinstance(forge, MergeCommits):
        return None
    return forge.merge_source(view.project, report.sha)


def decide(view: RequestView, forge: Forge, settings: Settings) -> Verdict:
    """Judge one request; forge reads only (the caller writes the verdict in one transaction)."""
    if view.kind == "ci":
        return decide_ci(view, forge, settings)
    if is_own(view.author, forge.bot_username()):
        return Verdict(RequestStatus.ignored, OWN_COMMENT)
    mr = forge.get_mr(view.project, view.mr)
    if mr.verdict != "open":
        return Verdict(RequestStatus.ignored, f"the MR is {mr.verdict}")
    comment = view.comment()
    if view.kind == "review" and not addressed_to_bot(comment, forge.bot_username()):
        return Verdict(RequestStatus.ignored, NOT_ADDRESSED)
    if not view.author or not forge.can_trigger(view.project, view.author):
        reply = f"@{view.author} {NOT_MEMBER_REPLY}" if view.author else NOT_MEMBER_REPLY
        return Verdict(RequestStatus.ignored, NOT_MEMBER, reply, "author")
    if view.kind == "stop":
        return Verdict(RequestStatus.taken, f"{view.author} stopped the rounds on this MR", stop=True)
    if view.kind == RoundKind.update:
        refused = capped_or_gone(view.thread_id, view.project, view.issue, forge, settings, RoundKind.update)
        return refused or Verdict(RequestStatus.accepted, f"{view.author} asked to merge {mr.target_branch} in")
    refused = capped_or_gone(view.thread_id, view.project, view.issue, forge, settings, RoundKind.review)
    return refused or Verdict(RequestStatus.accepted, f"{view.author} asked for changes")


def decide_ci(view: RequestView, forge: Forge, settings: Settings) -> Verdict:
    """A CI result: shown on the job that pushed the commit it tested whatever it says; a failure on the
    MR's head asks for a CI round (with the failing jobs' log tails), one on an older head is stale."""
    report = CiReport.from_dict(view.data)
    tested = tested_commit(forge, view, report)
    shown = replace(report, sha=tested) if tested else None
    mr = forge.get_mr(view.project, view.mr)
    if mr.verdict != "open":
        return Verdict(RequestStatus.ignored, f"the MR is {mr.verdict}", ci=shown)
    if report.status != "failed":
        return Verdict(RequestStatus.ignored, f"forge CI {report.status}: nothing to fix", ci=shown)
    if not about_head(tested, mr.head_sha):
        return Verdict(RequestStatus.ignored, STALE_CI, ci=shown)
    refused = capped_or_gone(view.thread_id, view.project, view.issue, forge, settings, RoundKind.ci)
    if refused is not None:
        return replace(refused, ci=shown)
    failures = forge.ci_failures(view.project, report, settings.ci_log_tail_lines)
    # The request now names the head it is about (a merged result's merge commit is on no branch).
    data = {**view.data, "sha": tested, "failed_jobs": [job.to_dict() for job in failures]}
    reason = f"CI failed on the MR's head ({len(failures)} failing job(s))"
    return Verdict(RequestStatus.accepted, reason, data=data, ci=shown)


def capped_or_gone(
    thread_id: int, project: str, issue: int, forge: Forge, settings: Settings, kind: RoundKind
) -> Verdict | None:
    """The refusal of a request that would start a round of `kind` in the thread (or of FrogFix's own update
    check): the MR's cap reached, or the issue no longer asking for a fix; None when neither holds."""
    with session_scope() as session:
        used = rounds.rounds_used(session, thread_id, kind)
    capped = cap_reason(kind, used, settings)
    if capped is not None:
        return Verdict(RequestStatus.ignored, capped, cap_reply(kind, capped), "kind")
    gone = issue_still_asks(forge, project, issue, settings.trigger_label)
    if gone is not None:
        return Verdict(RequestStatus.dropped, gone, drop_thread=True)
    return None


def _decide_safely(view: RequestView, forge: Forge, settings: Settings) -> Verdict | None:
    """`decide`, with the forge's refusals as verdicts; None when the forge kept failing (judge it later)."""
    try:
        return decide(view, forge, settings)
    except ForgeTransient as exc:
        log.warning("triage_deferred", request_id=view.id, error=str(exc)[:300])
        return None
    except ForgeNotFound as exc:
        return Verdict(RequestStatus.ignored, f"the forge no longer shows it: {exc}")
    except ForgeError as exc:
        return Verdict(RequestStatus.ignored, f"the forge refused: {exc}")


# -- writing the verdict ---------------------------------------------------------------------------


def apply(session: Session, view: RequestView, verdict: Verdict) -> Outcome | None:
    """Write the verdict (guarded: a request is judged once) and what follows from it; None if judged already."""
    reply_due = verdict.reply is not None and not rounds.ignored_before(
        session,
        view.thread_id,
        verdict.reason,
        author=view.author if verdict.reply_once == "author" else None,
        kind=view.kind if verdict.reply_once == "kind" else None,
        besides=view.id,
    )
    running = _active_in_thread(session, view.thread_id) if verdict.stop else None
    job_id = running.id if running is not None else None
    if not rounds.judge_request(session, view.id, verdict.status, verdict.reason, verdict.data, job_id=job_id):
        return None
    outcome = Outcome(verdict, verdict.reply if reply_due else None)
    thread = session.get(Job, view.thread_id)
    if verdict.ci is not None and thread is not None:
        outcome.shown_ci = rounds.note_ci(session, thread, verdict.ci) is not None
    if verdict.stop:
        cancel = request_cancel(session, running, verdict.reason) if running is not None else None
        dropped = rounds.drop_requests(session, view.thread_id, verdict.reason)
        said = STOP_SAID[cancel]
        outcome.reply = f"FrogFix stopped: it {said} and dropped {dropped} waiting request(s)."
        outcome.extra = {"stopped_job": job_id, "cancel": cancel, "dropped": dropped}  # cancel: what it did
    elif verdict.drop_thread:
        outcome.extra["dropped"] = rounds.drop_requests(session, view.thread_id, verdict.reason)
    elif verdict.status == RequestStatus.accepted:
        outcome.round_job = rounds.start_round_if_idle(session, view.thread_id)
    add_event(
        session,
        view.thread_id,
        f"request_{verdict.status.value}",
        f"{view.kind} request {view.id} {verdict.status.value}: {verdict.reason}",
        {"request_id": view.id, "kind": view.kind, "author": view.author, **outcome.extra},
    )
    return outcome


# What `/frogfix stop` did to the thread's active job, in its reply (None: no job was active).
STOP_SAID: dict[CancelOutcome | None, str] = {
    None: "had no round running",
    "cancelled": "cancelled the queued round",
    "cancel_requested": "cancelled the running round",
    "too_late": "was already pushing the running round, so that push goes ahead,",
}


def _active_in_thread(session: Session, thread_id: int) -> Job | None:
    """The issue's active job when it belongs to this thread (round 0 or one of its rounds)."""
    thread = session.get(Job, thread_id)
    if thread is None:
        return None
    job = active_job(session, thread.forge, thread.project, thread.issue)
    return job if job is not None and (job.id == thread.id or job.thread_id == thread.id) else None


def triage(request_id: int, forge_for: Callable[[str], Forge], settings: Settings) -> str:
    """Judge request `request_id` once; post the reply it calls for and send the round it starts, after the commit.

    Returns what happened (the request's new status, or why nothing changed). A forge that keeps
    failing leaves the request pending: the sweep sends its triage again later.
    """
    with session_scope() as session:
        request = session.get(RoundRequest, request_id)
        thread = session.get(Job, request.thread_id) if request is not None else None
        if request is None or thread is None:
            return "unknown"
        if request.status != RequestStatus.pending:
            return f"already {request.status}"
        view = RequestView.of(request, thread)
    forge = forge_for(view.forge)
    try:
        verdict = _decide_safely(view, forge, settings)
        if verdict is None:
            return "deferred"
        with session_scope() as session:
            outcome = apply(session, view, verdict)
        if outcome is None:
            return "already judged"
        log.info("triage", request_id=view.id, kind=view.kind, status=verdict.status.value, reason=verdict.reason)
        if outcome.reply is not None:
            _reply(forge, view, outcome.reply)
        if outcome.shown_ci:
            _show_ci(forge, view, settings)
        if outcome.round_job is None and not verdict.stop:  # a comment or CI result came: has the target moved?
            outcome.round_job = _check_quietly(view.thread_id, forge, settings)
    finally:
        forge.close()
    if outcome.round_job is not None:
        send_and_stamp(outcome.round_job)
    return verdict.status.value


# -- FROGFIX_AUTO_UPDATE ---------------------------------------------------------------------------


def check_for_update(thread_id: int, forge: Forge, settings: Settings) -> int | None:
    """With FROGFIX_AUTO_UPDATE on: when the forge reports the thread's MR in conflict with its target, an
    accepted update request for the target's head and the round it starts (the job id to send, after the
    commit). Once per target head (the request's dedupe key), so a round that could not merge that head
    never starts again until the target moves; nothing while the forge is still checking."""
    if not settings.auto_update:
        return None
    with session_scope() as session:
        thread = session.get(Job, thread_id)
        if thread is None or thread.thread_id is not None:
            return None
        mr_number, project, issue = rounds.thread_mr_number(thread), thread.project, thread.issue
    if mr_number is None:
        return None
    mr = forge.get_mr(project, mr_number)
    with session_scope() as session:
        rounds.note_update_check(session, thread_id, mr.verdict)
    if mr.verdict != "open":
        return None
    if mr.conflicts is False or (mr.conflicts is None and forge.kind != "gitea"):
        return None  # it merges cleanly, or GitLab is still checking (the next check sees its verdict)
    # A conflict the forge reports, or one Gitea cannot report (it says `mergeable: false` for every draft
    # pull, and while it checks), is confirmed by git in the mirror, which also names the target's head
    # now: the key of "once per target head" (GitLab's `diff_refs.start_sha` may lag behind the target).
    conflicts, target_sha = _conflicts_by_git(forge, project, mr, settings)
    if conflicts is not True or not target_sha:
        return None
    if capped_or_gone(thread_id, project, issue, forge, settings, RoundKind.update) is not None:
        return None  # the cap reached, or the issue no longer asks: FrogFix's own request says nothing
    reason = f"the MR conflicts with {mr.target_branch} at {target_sha[:12]} (FROGFIX_AUTO_UPDATE)"
    with session_scope() as session:
        thread = session.get(Job, thread_id)
        if thread is None:
            return None
        request_id = rounds.record_auto_update(session, thread, mr_number, target_sha, reason)
        if request_id is None:
            return None
        add_event(
            session, thread_id, "request_accepted", f"update request {request_id} accepted: {reason}",
            {"request_id": request_id, "kind": RoundKind.update.value, "target_sha": target_sha},
        )
        return rounds.start_round_if_idle(session, thread_id)


def _conflicts_by_git(
    forge: Forge, project: str, mr: MergeRequest, settings: Settings
) -> tuple[bool | None, str | None]:
    """Whether the MR's branch conflicts with its target, asked of git in the mirror (fetched now), and the
    target's head there. (None, None) when git cannot tell (a branch gone, the mirror failing)."""
    try:
        info = forge.project_info(project)
        cache = mirrors.RepoCache.in_data_dir(settings.data_dir)
        mirror = cache.mirror(gitcalls.mirror_key(forge.kind, project), info.clone_url, forge.git_auth_header())
        head = mirrors.resolve(mirror, f"refs/heads/{mr.source_branch}")
        target = mirrors.resolve(mirror, f"refs/heads/{mr.target_branch}")
        if merging.is_ancestor(mirror, target, head):
            return False, target
        return not merging.merge_trees(mirror, head, target).clean, target
    except gitcalls.RepoError as exc:
        log.warning("update_check_git_failed", project=project, mr=mr.number, error=str(exc)[:300])
        return None, None


def _check_quietly(thread_id: int, forge: Forge, settings: Settings) -> int | None:
    """`check_for_update` after a triage: a forge that fails is logged; the sweep asks again later."""
    try:
        return check_for_update(thread_id, forge, settings)
    except ForgeError as exc:
        log.warning("update_check_failed", thread_id=thread_id, error=str(exc)[:300])
        return None


def _show_ci(forge: Forge, view: RequestView, settings: Settings) -> None:
    """Rewrite the MR's rounds section, which shows each round's forge CI; best effort, like a reply."""
    try:
        show_rounds(
            forge,
            view.project,
            view.mr,
            thread_round_lines(view.thread_id, settings),
            SecretRedactor(settings.secret_values()).redact,
        )
    except ForgeError as exc:
        log.warning("triage_show_ci_failed", request_id=view.id, error=str(exc)[:300])


def _reply(forge: Forge, view: RequestView, text: str) -> None:
    """Post on the MR, in the request's discussion where it has one; a failure is logged, never retried here."""
    discussion = view.data.get("discussion_id") if view.kind != "ci" else None
    try:
        forge.reply(view.project, view.mr, text, discussion if isinstance(discussion, str) else None)
    except ForgeError as exc:
        log.warning("triage_reply_failed", request_id=view.id, error=str(exc)[:300])
