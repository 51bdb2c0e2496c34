"""Review rounds in SQL: an MR's thread of jobs, the requests that ask for rounds, and starting the next round.

An MR FrogFix opened is a thread: the job that opened it (round 0, `thread_id` NULL) and the rounds
that followed (`thread_id` = round 0's id). Comments and CI results on the MR become `round_requests`
(recorded `pending` by the webhook, judged once by the worker's triage); every accepted request waits
for the thread's next round, so requests that arrive while a round runs are batched into one.
One round at a time per MR comes from the unique active-issue index: a round is a job of the issue.
Callers own the transaction, and send a new round's task only after its row is committed.
"""

from __future__ import annotations

from datetime import datetime
from functools import lru_cache
from typing import Any, cast

from sqlalchemy import ColumnElement, Table, exists, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import CursorResult
from sqlalchemy.orm import Session, aliased

from app.forge.api import mr_number_from_url
from app.forge.reviews import CiReport, ReviewComment
from app.forge.webhook import ROUND_INTENTS, WebhookEvent
from app.jobs.records import active_job, add_event, prepared
from app.jobs.transitions import run_waited_answers
from app.models import Job, JobAttempt, JobEvent, RoundRequest, utcnow
from app.statuses import ACTIVE_STATUSES, FINAL_STATUSES, PROVEN_LEVELS, JobStatus, RequestStatus, RoundKind

# A comment that starts with this is one FrogFix posted (app/forge/api.py `comment_marker`).
OWN_COMMENT_MARKER = "<!-- frogfix:"
WAITING = (RequestStatus.pending.value, RequestStatus.accepted.value)
_REQUESTS = cast(Table, RoundRequest.__table__)


@lru_cache(maxsize=4)
def _insert_request_for(dialect: str) -> Any:
    """INSERT ... ON CONFLICT DO NOTHING on the dedupe key: a redelivered comment or CI result is one request."""
    ins = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (
        ins(_REQUESTS)
        .on_conflict_do_nothing(index_elements=["thread_id", "kind", "dedupe_key"])
        .returning(_REQUESTS.c.id)
    )


def _rowcount(result: Any) -> int:
    return int(cast(CursorResult[Any], result).rowcount or 0)


# -- the thread -----------------------------------------------------------------------------------


def thread_mr_number(job: Job) -> int | None:
    """The MR a thread's job opened: its `mr_number`, or for rows written before it, the number in `mr_url`."""
    return job.mr_number if job.mr_number is not None else mr_number_from_url(job.mr_url)


def find_thread(
    session: Session,
    forge: str,
    project: str,
    *,
    mr: int | None = None,
    branch: str | None = None,
    sha: str | None = None,
) -> Job | None:
    """The round-0 job of the MR's thread: by MR number, else by source branch, else by a commit a job pushed.

    Only jobs that opened an MR count (an `mr_number` or `mr_url`); the newest wins when the same
    MR was opened again by a later job for the issue (a re-added label). With `mr` given, a thread
    found by branch or commit must be that MR's (another MR from the bot's branch is not FrogFix's).
    """
    found = _find_thread(session, forge, project, mr=mr, branch=branch, sha=sha)
    if found is not None and mr is not None and thread_mr_number(found) not in (None, mr):
        return None
    return found


def _find_thread(
    session: Session, forge: str, project: str, *, mr: int | None, branch: str | None, sha: str | None
) -> Job | None:
    opened = [Job.forge == forge, Job.project == project, Job.thread_id.is_(None), Job.round == 0]
    has_mr = or_(Job.mr_number.is_not(None), Job.mr_url.is_not(None))
    if mr is not None:
        found = session.execute(
            select(Job).where(*opened, Job.mr_number == mr).order_by(Job.id.desc()).limit(1)
        ).scalar_one_or_none()
        if found is not None:
            return found
        legacy = session.execute(
            select(Job).where(*opened, Job.mr_number.is_(None), Job.mr_url.is_not(None)).order_by(Job.id.desc())
        ).scalars()
        found = next((job for job in legacy if mr_number_from_url(job.mr_url) == mr), None)
        if found is not None:
            return found
    if branch:
        found = session.execute(
            select(Job).where(*opened, Job.branch == branch, has_mr).order_by(Job.id.desc()).limit(1)
        ).scalar_one_or_none()
        if found is not None:
            return found
    if sha:
        pusher = session.execute(
            select(Job)
            .where(Job.forge == forge, Job.project == project, Job.pushed_commit == sha)
            .order_by(Job.id.desc())
            .limit(1)
        ).scalar_one_or_none()
        if pusher is not None:
            return pusher if pusher.thread_id is None else session.get(Job, pusher.thread_id)
    return None


def in_thread(thread_id: int) -> ColumnElement[bool]:
    """The jobs of the thread: round 0 and its rounds (read in `THREAD_ORDER`)."""
    return or_(Job.id == thread_id, Job.thread_id == thread_id)


THREAD_ORDER = (Job.round, Job.id)  # round 0 first, then its rounds in order (ix_jobs_thread and the key)


def thread_jobs(session: Session, thread_id: int) -> list[Job]:
    """Round 0 first, then its rounds in order (the dashboard reads the same rows: read_model.thread_jobs)."""
    return list(session.execute(select(Job).where(in_thread(thread_id)).order_by(*THREAD_ORDER)).scalars())


def _counts() -> ColumnElement[bool]:
    """A round that counts towards the caps: still on its way, or one that took a request it worked on.

    A round that ended having taken nothing (cancelled by a removed label or `/frogfix stop` before it
    began, or left with only stale CI results) did no work for anyone, so it spends no round; the stop
    request itself names the round it cancelled, so it is not work taken."""
    took = exists().where(
        RoundRequest.job_id == Job.id,
        RoundRequest.status == RequestStatus.taken.value,
        RoundRequest.kind != "stop",
    )
    return or_(Job.status.not_in(FINAL_STATUSES), took)


def rounds_used(session: Session, thread_id: int, kind: str | None = None) -> int:
    """How many rounds (of `kind`, or of any kind) the thread has had that count (`_counts`)."""
    query = select(func.count()).select_from(Job).where(Job.thread_id == thread_id, _counts())
    if kind is not None:
        query = query.where(Job.round_kind == kind)
    return int(session.execute(query).scalar_one())


def why_not_replace(session: Session, forge: str, project: str, branch: str, head: str) -> str | None:
    """Why round 0 may not replace the bot's branch, which the forge shows at `head`; None when it may.

    Round 0 replaces only what it pushed itself: `head` must be a commit a round-0 job recorded
    pushing to this branch, and that job's MR must have had no rounds (`_counts`). Anything else is
    someone's work FrogFix must never force-push over: a human's commit, a review round's, or a
    commit FrogFix has no record of."""
    pusher = session.execute(
        select(Job)
        .where(Job.forge == forge, Job.project == project, Job.branch == branch, Job.pushed_commit == head)
        .order_by(Job.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    if pusher is None:
        pusher = _announced_pusher(session, forge, project, branch, head)
    if pusher is None:
        return f"{branch} ends at {head[:12]}, a commit FrogFix did not push"
    if pusher.round or pusher.thread_id is not None:
        return f"{branch} ends at a commit of review round {pusher.round}"
    if rounds_used(session, pusher.id):
        return f"its merge request has had review rounds on {branch}"
    return None


PUSHING = "pushing"  # the event a job writes, naming the commit, just before it pushes it


def _announced_pusher(session: Session, forge: str, project: str, branch: str, head: str) -> Job | None:
    """The job that announced pushing `head` to `branch` (a `pushing` event), newest first.

    A push whose answer was lost (the worker killed, the connection cut) landed with no
    `pushed_commit` recorded; the announcement, written before the push, still names it."""
    rows = session.execute(
        select(Job, JobEvent.data)
        .join(JobEvent, JobEvent.job_id == Job.id)
        .where(Job.forge == forge, Job.project == project, Job.branch == branch, JobEvent.kind == PUSHING)
        .order_by(JobEvent.id.desc())
    )
    for job, data in rows:
        if isinstance(data, dict) and data.get("commit") == head and data.get("branch") == branch:
            return job
    return None


def note_ci(session: Session, thread: Job, report: CiReport) -> int | None:
    """Record a CI result on the thread's job that pushed `report.sha` (its latest round); that job's id, or None."""
    pusher = session.execute(
        select(Job.id)
        .where(or_(Job.id == thread.id, Job.thread_id == thread.id), Job.pushed_commit == report.sha)
        .order_by(Job.round.desc(), Job.id.desc())
        .limit(1)
    ).scalar_one_or_none()
    if pusher is None:
        return None
    session.execute(update(Job).where(Job.id == pusher).values(ci_status=report.status, updated_at=utcnow()))
    add_event(
        session,
        pusher,
        "ci_result",
        f"forge CI {report.status} on {report.sha[:12]}",
        {"system": report.system, "id": report.id, "sha": report.sha, "status": report.status, "url": report.url},
    )
    return pusher


# -- requests -------------------------------------------------------------------------------------


def dedupe_key(event: WebhookEvent) -> str | None:
    """What makes two deliveries the same request: the CI result on a commit, or the comment / review id.

    Gitea numbers reviews and comments separately, so a review's key (`r:`) never meets a comment's (`c:`).
    A CI result that is not a failure names its status too: a pipeline or status context retried on
    the same commit passes after it failed, and that is news for the MR (a failure keeps the plain key).
    """
    if event.ci is not None:
        status = "" if event.ci.status == "failed" else f":{event.ci.status}"
        return f"ci:{event.ci.system}:{event.ci.id}:{event.ci.sha}{status}"[:255]
    if event.comment is not None:
        prefix = "r" if event.comment.kind.startswith("review_") else "c"
        return f"{prefix}:{event.comment.id}"[:255]
    return None


def record_request(session: Session, thread: Job, event: WebhookEvent) -> int | None:
    """Insert a `pending` request for the thread; its id, or None when this comment or CI result is already recorded."""
    payload: ReviewComment | CiReport | None = event.ci if event.intent == "ci" else event.comment
    mr = event.mr if event.mr is not None else thread_mr_number(thread)
    if payload is None or mr is None or event.intent not in ROUND_INTENTS:
        raise ValueError(f"a {event.intent} event without its comment, CI result or MR is no round request")
    # A CI result has no asker: whoever ran the pipeline (or posted the status) asked for nothing, so a
    # CI round acts for the person who started the thread (the rounds fall back to its trigger user).
    author = None
    if event.intent != "ci":
        author = event.comment.author if event.comment is not None and event.comment.author else event.sender
    return _insert_request(
        session, thread, mr, event.intent, RequestStatus.pending, event.reason, dedupe_key(event),
        author=author, delivery_id=event.delivery_id, data=payload.to_dict(),
    )


def _insert_request(
    session: Session, thread: Job, mr: int, kind: str, status: RequestStatus, reason: str, key: str | None, *,
    author: str | None, delivery_id: str | None, data: dict[str, Any],
) -> int | None:
    """One request row for the thread, unless its dedupe key is there already (then None)."""
    now = utcnow()
    return cast(
        int | None,
        session.connection()
        .execute(
            _insert_request_for(session.get_bind().dialect.name),
            {
                "thread_id": thread.id,
                "forge": thread.forge,
                "project": thread.project,
                "mr_number": mr,
                "kind": kind,
                "status": status.value,
                "reason": reason[:2000],
                "delivery_id": delivery_id,
                "dedupe_key": key[:255] if key else key,
                "author": author[:255] if author else None,
                "data": data,
                "created_at": now,
                "updated_at": now,
            },
        )
        .scalar_one_or_none(),
    )


def requests_of(session: Session, *, thread_id: int | None = None, job_id: int | None = None) -> list[RoundRequest]:
    """A thread's requests, or those one round took; oldest first."""
    if thread_id is None and job_id is None:
        raise ValueError("name a thread or a job")
    query = select(RoundRequest).order_by(RoundRequest.id)
    if thread_id is not None:
        query = query.where(RoundRequest.thread_id == thread_id)
    if job_id is not None:
        query = query.where(RoundRequest.job_id == job_id)
    return list(session.execute(query).scalars())


def judge_request(
    session: Session,
    request_id: int,
    status: RequestStatus,
    reason: str,
    data: dict[str, Any] | None = None,
    *,
    job_id: int | None = None,
) -> bool:
    """Triage's verdict on a pending request (accepted, ignored, dropped; a stop is `taken` by the job it
    cancelled); False when it was judged already."""
    values: dict[str, Any] = {"status": status.value, "reason": reason[:2000], "updated_at": utcnow()}
    if data is not None:
        values["data"] = data
    if job_id is not None:
        values["job_id"] = job_id
    guarded = update(RoundRequest).where(
        RoundRequest.id == request_id, RoundRequest.status == RequestStatus.pending.value
    )
    return _rowcount(session.execute(guarded.values(**values))) == 1


def ignored_before(
    session: Session,
    thread_id: int,
    reason: str,
    *,
    author: str | None = None,
    kind: str | None = None,
    besides: int | None = None,
) -> bool:
    """Whether another request of the thread was already ignored for `reason` (one reply per author or kind)."""
    query = select(RoundRequest.id).where(
        RoundRequest.thread_id == thread_id,
        RoundRequest.status == RequestStatus.ignored.value,
        RoundRequest.reason == reason[:2000],
    )
    if author is not None:
        query = query.where(RoundRequest.author == author)
    if kind is not None:
        query = query.where(RoundRequest.kind == kind)
    if besides is not None:
        query = query.where(RoundRequest.id != besides)
    return session.execute(query.limit(1)).first() is not None


def _of_kind(kind: str | None) -> ColumnElement[bool]:
    """The requests a round of `kind` takes: an update round its update requests, any other round the rest."""
    if kind == RoundKind.update:
        return RoundRequest.kind == RoundKind.update.value
    return RoundRequest.kind != RoundKind.update.value


def take_requests(session: Session, job_id: int) -> list[RoundRequest]:
    """Every accepted request of the round's thread that its kind takes is taken by this round (oldest first)."""
    row = session.execute(select(Job.thread_id, Job.round_kind).where(Job.id == job_id)).first()
    if row is None or row[0] is None:
        return []
    thread_id, kind = row
    session.execute(
        update(RoundRequest)
        .where(
            RoundRequest.thread_id == thread_id,
            RoundRequest.status == RequestStatus.accepted.value,
            _of_kind(kind),
        )
        .values(status=RequestStatus.taken.value, job_id=job_id, updated_at=utcnow())
    )
    taken = select(RoundRequest).where(RoundRequest.job_id == job_id, RoundRequest.status == RequestStatus.taken.value)
    return list(session.execute(taken.order_by(RoundRequest.id)).scalars())


def return_requests(session: Session, job_id: int, reason: str) -> None:
    """The round could not use its requests (the branch moved): they wait for the next round again."""
    session.execute(
        update(RoundRequest)
        .where(RoundRequest.job_id == job_id, RoundRequest.status == RequestStatus.taken.value)
        .values(status=RequestStatus.accepted.value, job_id=None, reason=reason[:2000], updated_at=utcnow())
    )


def _drop(session: Session, reason: str, *where: ColumnElement[bool]) -> int:
    """Mark the requests `where` selects dropped, for `reason`; how many were."""
    return _rowcount(
        session.execute(
            update(RoundRequest)
            .where(*where)
            .values(status=RequestStatus.dropped.value, reason=reason[:2000], updated_at=utcnow())
        )
    )


def drop_taken(session: Session, job_id: int, request_ids: list[int], reason: str) -> None:
    """The round let go of some requests it took (stale CI results): dropped, still naming the round."""
    if request_ids:
        _drop(
            session,
            reason,
            RoundRequest.job_id == job_id,
            RoundRequest.id.in_(request_ids),
            RoundRequest.status == RequestStatus.taken.value,
        )


def stopped_by_request(session: Session, job_id: int) -> bool:
    """Whether a `/frogfix stop` cancelled this round (triage replied for it then)."""
    query = select(RoundRequest.id).where(
        RoundRequest.job_id == job_id, RoundRequest.kind == "stop", RoundRequest.status == RequestStatus.taken.value
    )
    return session.execute(query.limit(1)).first() is not None


def drop_issue_requests(session: Session, forge: str, project: str, issue: int, reason: str) -> int:
    """Let go of what waits in every thread of the issue (its label removed, or it was closed)."""
    threads = select(Job.id).where(
        Job.forge == forge, Job.project == project, Job.issue == issue, Job.thread_id.is_(None), Job.round == 0
    )
    return _drop(session, reason, RoundRequest.thread_id.in_(threads), RoundRequest.status.in_(WAITING))


def drop_requests(session: Session, thread_id: int, reason: str) -> int:
    """Let go of every request of the thread not yet taken (`/frogfix stop`, a removed label, a closed MR)."""
    return _drop(session, reason, RoundRequest.thread_id == thread_id, RoundRequest.status.in_(WAITING))


def stale_pending(session: Session, older_than: datetime, limit: int = 500) -> list[int]:
    """Pending requests whose triage was not heard of since `older_than` (a lost message, a broker outage)."""
    query = (
        select(RoundRequest.id)
        .where(RoundRequest.status == RequestStatus.pending.value, RoundRequest.updated_at < older_than)
        .order_by(RoundRequest.id)
        .limit(limit)
    )
    return [row[0] for row in session.execute(query)]


def touch_requests(session: Session, request_ids: list[int]) -> None:
    """Their triage was sent again now: the sweep leaves them alone for another requeue delay."""
    if request_ids:
        session.execute(update(RoundRequest).where(RoundRequest.id.in_(request_ids)).values(updated_at=utcnow()))


# -- starting rounds ------------------------------------------------------------------------------


def start_round_if_idle(session: Session, thread_id: int) -> int | None:
    """Insert the thread's next round (queued) when requests are accepted and no job of the issue is active.

    An update request waits apart: an update round takes only those, any other round only the rest.

    Its id, for the caller to send after the commit; None when nothing waits, or a job of the
    issue is active (the unique active-issue index decides a race: the requests just wait).
    """
    thread = session.get(Job, thread_id)
    if thread is None or thread.thread_id is not None:
        return None
    waiting = list(
        session.execute(
            select(RoundRequest.kind, RoundRequest.author)
            .where(RoundRequest.thread_id == thread_id, RoundRequest.status == RequestStatus.accepted.value)
            .order_by(RoundRequest.id)
        )
    )
    if not waiting or active_job(session, thread.forge, thread.project, thread.issue) is not None:
        return None
    kind = _next_kind([k for k, _ in waiting])
    waiting = [row for row in waiting if (row[0] == RoundKind.update) == (kind == RoundKind.update)]
    author = next((a for _, a in reversed(waiting) if a), None) or thread.trigger_user
    number = _next_round(session, thread_id)
    job_id = _insert_round(session, thread, number, kind, author)
    if job_id is None:
        return None
    add_event(
        session,
        job_id,
        "created",
        f"round {number} ({kind.value}) on MR {thread_mr_number(thread)}: {len(waiting)} request(s) waiting",
        {"thread_id": thread_id, "round": number, "round_kind": kind.value, "trigger_user": author},
    )
    return job_id


def _next_kind(kinds: list[str]) -> RoundKind:
    """The kind of round the waiting requests ask for first: an update (the branch brought up to date,
    so the rounds after it work on today's target), then a review, then CI."""
    if RoundKind.update in kinds:
        return RoundKind.update
    return RoundKind.review if RoundKind.review in kinds else RoundKind.ci


def _next_round(session: Session, thread_id: int) -> int:
    latest = session.execute(select(func.max(Job.round)).where(Job.thread_id == thread_id)).scalar()
    return int(latest or 0) + 1


def _insert_round(session: Session, thread: Job, number: int, kind: RoundKind, author: str | None) -> int | None:
    """The round's row, unstamped (the caller's send stamps it); None when a job of the issue is active."""
    now = utcnow()
    return cast(
        int | None,
        session.connection()
        .execute(
            prepared(session).insert_job,
            {
                "forge": thread.forge,
                "project": thread.project,
                "project_id": thread.project_id,
                "issue": thread.issue,
                "issue_url": thread.issue_url,
                "clone_url": thread.clone_url,
                "title": thread.title,
                "body": thread.body,
                "trigger_user": author,
                "status": JobStatus.queued.value,
                "run": 0,
                "cancel_requested": False,
                "enqueue_count": 0,
                "thread_id": thread.id,
                "round": number,
                "round_kind": kind.value,
                "mr_number": thread_mr_number(thread),
                "branch": thread.branch,
                "created_at": now,
                "updated_at": now,
            },
        )
        .scalar_one_or_none(),
    )


def follow_up(session: Session) -> list[int]:
    """Start the next round of every thread whose accepted requests wait with no active job, and queue again
    every job whose run ended while a member's `/frogfix` answer waited for it (issue 36,
    app/jobs/transitions.py `run_waited_answers`); the ids of the jobs to send."""
    threads = session.execute(
        select(RoundRequest.thread_id)
        .where(RoundRequest.status == RequestStatus.accepted.value)
        .group_by(RoundRequest.thread_id)
        .order_by(RoundRequest.thread_id)
    ).scalars()
    started = []
    for thread_id in list(threads):
        job_id = start_round_if_idle(session, thread_id)
        if job_id is not None:
            started.append(job_id)
    return started + run_waited_answers(session)


# -- update rounds (issue 25) -----------------------------------------------------------------------

AUTO_UPDATE_PREFIX = "auto:"  # an update request FrogFix made itself: its dedupe key names the target's head


def record_auto_update(session: Session, thread: Job, mr: int, target_sha: str, reason: str) -> int | None:
    """An accepted update request FrogFix itself makes for the thread, once per target-branch head: its id,
    or None when this head was asked about already (the dedupe key is the head; a round that could not
    merge it never makes FrogFix ask again until the target moves)."""
    return _insert_request(
        session, thread, mr, RoundKind.update.value, RequestStatus.accepted, reason,
        f"{AUTO_UPDATE_PREFIX}{target_sha}", author=None, delivery_id=None,
        data={"auto": True, "target_sha": target_sha, "reason": reason[:2000]},
    )  # fmt: skip


def note_update_check(session: Session, thread_id: int, mr_state: str) -> None:
    """What an update check saw of the thread's MR, and when (the sweep asks again after a while)."""
    session.execute(
        update(Job).where(Job.id == thread_id).values(mr_state=mr_state[:16], update_checked_at=utcnow())
    )


def note_update_sent(session: Session, thread_ids: list[int]) -> None:
    """Their update check was sent now: the sweep leaves them alone for another check interval."""
    if thread_ids:
        session.execute(update(Job).where(Job.id.in_(thread_ids)).values(update_checked_at=utcnow()))


def threads_to_check(session: Session, older_than: datetime, limit: int = 100) -> list[int]:
    """Threads whose MR may still be open (not seen closed or merged) and that no update check looked at
    since `older_than`, with no job of the issue active; least recently checked first."""
    opened = [Job.thread_id.is_(None), Job.round == 0, Job.status == JobStatus.done.value]
    has_mr = or_(Job.mr_number.is_not(None), Job.mr_url.is_not(None))
    unchecked = or_(Job.update_checked_at.is_(None), Job.update_checked_at < older_than)
    other = aliased(Job)
    busy = exists().where(
        other.forge == Job.forge, other.project == Job.project, other.issue == Job.issue,
        other.status.in_(ACTIVE_STATUSES),
    )  # fmt: skip
    query = (
        select(Job.id)
        .where(*opened, has_mr, unchecked, or_(Job.mr_state.is_(None), Job.mr_state == "open"), ~busy)
        .order_by(Job.update_checked_at.is_not(None), Job.update_checked_at, Job.id)
        .limit(limit)
    )
    return [row[0] for row in session.execute(query)]


def thread_proof(session: Session, thread_id: int, besides: int) -> str | None:
    """How the thread's fix was proven, when one of its published commits was (`reproduced` or
    `failed_before`, the strongest first): an update round must prove it again on the new target.
    Only jobs that pushed count (a refused or unpublished round proved nothing), and never `besides`
    (the round asking). None when no published attempt proved it."""
    query = (
        select(JobAttempt.tests)
        .join(Job, Job.id == JobAttempt.job_id)
        .where(
            or_(Job.id == thread_id, Job.thread_id == thread_id),
            Job.id != besides,
            Job.status == JobStatus.done.value,
            Job.pushed_commit.is_not(None),
            JobAttempt.chosen.is_(True),
        )
    )
    found = set()
    for tests in session.execute(query).scalars():
        evidence = tests.get("evidence") if isinstance(tests, dict) else None  # TestEvidence.to_dict()
        level = evidence.get("level") if isinstance(evidence, dict) else None
        if level in PROVEN_LEVELS:
            found.add(level)
    return next((level for level in PROVEN_LEVELS if level in found), None)
