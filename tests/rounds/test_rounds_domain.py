"""The rounds domain (app/jobs/rounds.py) and triage's database side (worker/job/triage.py) on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from app.db import session_scope
from app.forge.reviews import ReviewComment
from app.jobs import records, rounds
from app.models import Job, RoundRequest, utcnow
from app.settings import get_settings
from app.statuses import JobStatus, RequestStatus
from tests.rounds import BRANCH, HEAD, ci_event, comment_event, database, make_thread
from worker.job import triage

__all__ = ["database"]  # the fixture, imported by name


def _record(thread_id: int, event: Any) -> int | None:
    with session_scope() as s:
        return rounds.record_request(s, records.get_job(s, thread_id), event)


def _accept(thread_id: int, delivery: str, comment_id: str, author: str = "bob") -> int:
    request_id = _record(thread_id, comment_event(delivery, comment_id, author=author))
    assert request_id is not None
    with session_scope() as s:
        assert rounds.judge_request(s, request_id, RequestStatus.accepted, f"{author} asked for changes")
    return request_id


def _finish(job_id: int, status: JobStatus = JobStatus.done) -> None:
    with session_scope() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status=status.value))


def _statuses(thread_id: int) -> dict[int, str]:
    with session_scope() as s:
        return {r.id: r.status for r in rounds.requests_of(s, thread_id=thread_id)}


# -- finding the thread --------------------------------------------------------------------------


def test_the_thread_is_found_by_mr_then_branch_then_pushed_commit(database: str) -> None:
    thread = make_thread(mr=7)
    other = make_thread(mr=8, issue=2, branch="frogfix/issue-2", pushed="b" * 40)
    with session_scope() as s:
        assert rounds.find_thread(s, "gitlab", "grp/app", mr=7).id == thread  # type: ignore[union-attr]
        assert rounds.find_thread(s, "gitlab", "grp/app", branch="frogfix/issue-2").id == other  # type: ignore[union-attr]
        assert rounds.find_thread(s, "gitlab", "grp/app", mr=8, branch="frogfix/issue-2").id == other  # type: ignore[union-attr]
        # Another MR opened from the bot's branch is not FrogFix's MR.
        assert rounds.find_thread(s, "gitlab", "grp/app", mr=99, branch="frogfix/issue-2") is None
        assert rounds.find_thread(s, "gitlab", "grp/app", mr=99, sha="b" * 40) is None
        assert rounds.find_thread(s, "gitlab", "grp/app", sha="b" * 40).id == other  # type: ignore[union-attr]
        assert rounds.find_thread(s, "gitlab", "grp/app", mr=99, branch="nope", sha="c" * 40) is None
        assert rounds.find_thread(s, "gitea", "grp/app", mr=7) is None
        assert rounds.find_thread(s, "gitlab", "grp/other", mr=7) is None


def test_a_commit_a_round_pushed_finds_the_round_zero_job(database: str) -> None:
    thread = _started_round(make_thread())
    with session_scope() as s:
        s.execute(update(Job).where(Job.thread_id == thread).values(pushed_commit="d" * 40, status="done"))
        assert rounds.find_thread(s, "gitlab", "grp/app", sha="d" * 40).id == thread  # type: ignore[union-attr]


def test_a_job_from_before_migration_0008_is_found_by_its_mr_url(database: str) -> None:
    thread = make_thread(mr=12, legacy_url=True)
    with session_scope() as s:
        found = rounds.find_thread(s, "gitlab", "grp/app", mr=12)
        assert found is not None and found.id == thread
        assert rounds.thread_mr_number(found) == 12
        assert rounds.find_thread(s, "gitlab", "grp/app", mr=13) is None


def test_a_job_that_opened_no_mr_is_no_thread(database: str) -> None:
    make_thread(mr=7)
    with session_scope() as s:
        s.execute(update(Job).values(mr_url=None, mr_number=None))
        assert rounds.find_thread(s, "gitlab", "grp/app", mr=7, branch=BRANCH) is None


# -- recording requests --------------------------------------------------------------------------


def test_the_same_comment_is_one_request(database: str) -> None:
    thread = make_thread()
    first = _record(thread, comment_event("d-1", "301"))
    assert first is not None
    assert _record(thread, comment_event("d-2", "301")) is None  # redelivered under another delivery id
    assert _record(thread, comment_event("d-3", "302")) not in (None, first)
    # A Gitea review and a comment may share a number: they are different requests.
    assert _record(thread, comment_event("d-4", "301", kind="review_changes")) is not None
    with session_scope() as s:
        kept = rounds.requests_of(s, thread_id=thread)
    assert [r.dedupe_key for r in kept] == ["c:301", "c:302", "r:301"]
    assert kept[0].status == "pending" and kept[0].author == "bob" and kept[0].mr_number == 7
    assert kept[0].data["body"] == "/frogfix also round negative amounts"


def test_the_same_ci_result_is_one_request_per_commit(database: str) -> None:
    thread = make_thread()
    assert _record(thread, ci_event("p-1")) is not None
    assert _record(thread, ci_event("p-2")) is None
    assert _record(thread, ci_event("p-3", sha="e" * 40)) is not None  # the same pipeline id on another commit
    assert _record(thread, ci_event("p-4", pipeline="502")) is not None
    with session_scope() as s:
        keys = [r.dedupe_key for r in rounds.requests_of(s, thread_id=thread)]
    assert keys == [
        f"ci:gitlab_pipeline:501:{HEAD}",
        f"ci:gitlab_pipeline:501:{'e' * 40}",
        f"ci:gitlab_pipeline:502:{HEAD}",
    ]


# -- starting rounds and batching ----------------------------------------------------------------


def _started_round(thread: int) -> int:
    _accept(thread, "d-r0", "100")
    with session_scope() as s:
        job_id = rounds.start_round_if_idle(s, thread)
    assert job_id is not None
    return thread


def test_an_accepted_request_starts_the_next_round_as_a_copy_of_round_zero(database: str) -> None:
    thread = make_thread()
    _accept(thread, "d-1", "301", author="carol")
    with session_scope() as s:
        job_id = rounds.start_round_if_idle(s, thread)
        assert job_id is not None
        job, first = records.get_job(s, job_id), records.get_job(s, thread)
        kinds = [e.kind for e in records.job_events(s, job_id)]
        assert job.status == "queued" and job.thread_id == thread and job.round == 1 and job.round_kind == "review"
        assert (job.issue, job.title, job.body, job.branch, job.mr_number) == (1, first.title, first.body, BRANCH, 7)
        assert job.trigger_user == "carol" and job.last_enqueued_at is None  # the caller's send stamps it
        assert kinds == ["created"]
        assert rounds.start_round_if_idle(s, thread) is None  # one round at a time


def test_requests_made_during_a_round_become_one_next_round(database: str) -> None:
    thread = make_thread()
    _accept(thread, "d-1", "301")
    with session_scope() as s:
        first_round = rounds.start_round_if_idle(s, thread)
    assert first_round is not None
    with session_scope() as s:
        assert [r.id for r in rounds.take_requests(s, first_round)] == [1]
        s.execute(update(Job).where(Job.id == first_round).values(status="running"))
    second = _accept(thread, "d-2", "302", author="bob")
    third = _accept(thread, "d-3", "303", author="dave")
    with session_scope() as s:
        assert rounds.follow_up(s) == []  # the round still runs: they wait
    _finish(first_round)
    with session_scope() as s:
        started = rounds.follow_up(s)
    assert len(started) == 1
    with session_scope() as s:
        assert rounds.follow_up(s) == []  # the next round is active now
        taken = rounds.take_requests(s, started[0])
        job = records.get_job(s, started[0])
        assert [r.id for r in taken] == [second, third]
        assert job.round == 2 and job.trigger_user == "dave"
        assert [r.id for r in rounds.requests_of(s, job_id=started[0])] == [second, third]


def test_review_wins_the_rounds_kind_when_review_and_ci_wait(database: str) -> None:
    thread = make_thread()
    ci_request = _record(thread, ci_event("p-1"))
    assert ci_request is not None
    with session_scope() as s:
        rounds.judge_request(s, ci_request, RequestStatus.accepted, "CI failed")
    with session_scope() as s:
        only_ci = rounds.start_round_if_idle(s, thread)
        assert only_ci is not None and records.get_job(s, only_ci).round_kind == "ci"
    _finish(only_ci, JobStatus.cancelled)  # taken by nobody: the request still waits
    _accept(thread, "d-1", "301")
    with session_scope() as s:
        both = rounds.start_round_if_idle(s, thread)
        assert both is not None
        job = records.get_job(s, both)
        assert job.round_kind == "review" and job.trigger_user == "bob"


def test_no_round_starts_while_round_zero_or_another_job_of_the_issue_is_active(database: str) -> None:
    thread = make_thread(status="running")
    _accept(thread, "d-1", "301")
    with session_scope() as s:
        assert rounds.start_round_if_idle(s, thread) is None
        assert rounds.follow_up(s) == []
    _finish(thread)
    with session_scope() as s:
        assert len(rounds.follow_up(s)) == 1


def _round(thread: int, number: int, kind: str, status: str = "done", pushed: str | None = None) -> int:
    with session_scope() as s:
        job = Job(
            forge="gitlab",
            project="grp/app",
            issue=1,
            status=status,
            thread_id=thread,
            round=number,
            round_kind=kind,
            branch=BRANCH,
            pushed_commit=pushed,
        )
        s.add(job)
        s.flush()
        return job.id


def _took(job_id: int, thread: int, delivery: str, comment_id: str, *, stop: bool = False) -> None:
    """A request the round took (a stop names the round it cancelled the same way)."""
    body, intent = ("/frogfix stop", "stop") if stop else ("/frogfix more", "review")
    event = comment_event(delivery, comment_id, body, intent=intent)  # type: ignore[arg-type]
    request_id = _record(thread, event)
    assert request_id is not None
    with session_scope() as s:
        assert rounds.judge_request(s, request_id, RequestStatus.taken, "taken", job_id=job_id)


def test_rounds_used_counts_each_kind_apart_and_only_rounds_that_worked(database: str) -> None:
    thread = make_thread()
    for number, kind in enumerate(["review", "ci", "review"], start=1):
        _took(_round(thread, number, kind), thread, f"d-{number}", str(300 + number))
    _round(thread, 4, "review", status="cancelled")  # the label went before it took anything
    _took(_round(thread, 5, "review", status="cancelled"), thread, "d-5", "305", stop=True)  # stopped, took nothing
    queued = _round(thread, 6, "review", status="queued")  # on its way: it will take what waits
    with session_scope() as s:
        assert rounds.rounds_used(s, thread, "review") == 3
        assert rounds.rounds_used(s, thread, "ci") == 1
        assert rounds.rounds_used(s, thread) == 4
        assert [j.round for j in rounds.thread_jobs(s, thread)] == [0, 1, 2, 3, 4, 5, 6]
        assert rounds.thread_jobs(s, thread)[0].id == thread
        s.execute(update(Job).where(Job.id == queued).values(status="cancelled"))
        assert rounds.rounds_used(s, thread, "review") == 2
    settings = get_settings().model_copy(update={"max_review_rounds": 2, "max_ci_rounds": 2})
    assert triage.cap_reason("review", 2, settings) == "the MR reached FROGFIX_MAX_REVIEW_ROUNDS (2)"
    assert triage.cap_reason("ci", 1, settings) is None  # review rounds do not count toward the CI cap
    assert triage.cap_reason("ci", 2, settings) == "the MR reached FROGFIX_MAX_CI_ROUNDS (2)"


def test_round_zero_replaces_only_its_own_commit_on_an_mr_without_rounds(database: str) -> None:
    thread = make_thread(pushed=HEAD)
    with session_scope() as s:
        assert rounds.why_not_replace(s, "gitlab", "grp/app", BRANCH, HEAD) is None
        theirs = rounds.why_not_replace(s, "gitlab", "grp/app", BRANCH, "e" * 40)
        assert theirs == f"{BRANCH} ends at eeeeeeeeeeee, a commit FrogFix did not push"
        assert rounds.why_not_replace(s, "gitea", "grp/app", BRANCH, HEAD) is not None  # another forge's record
    _round(thread, 1, "review", status="cancelled")  # a round that did nothing changes nothing
    with session_scope() as s:
        assert rounds.why_not_replace(s, "gitlab", "grp/app", BRANCH, HEAD) is None
    worked = _round(thread, 2, "review", status="no_fix")
    _took(worked, thread, "d-1", "301")
    with session_scope() as s:  # the MR had a round: its reviewers' thread is about this branch now
        assert rounds.why_not_replace(s, "gitlab", "grp/app", BRANCH, HEAD) == (
            f"its merge request has had review rounds on {BRANCH}"
        )
    _round(thread, 3, "review", pushed="d" * 40)
    with session_scope() as s:
        assert rounds.why_not_replace(s, "gitlab", "grp/app", BRANCH, "d" * 40) == (
            f"{BRANCH} ends at a commit of review round 3"
        )


def test_a_round_drops_the_stale_ci_it_took_and_a_stop_is_known(database: str) -> None:
    thread = make_thread()
    job_id = _round(thread, 1, "ci", status="running")
    ci = _record(thread, ci_event("p-1"))
    assert ci is not None
    with session_scope() as s:
        assert rounds.judge_request(s, ci, RequestStatus.accepted, "CI failed")
        assert [r.id for r in rounds.take_requests(s, job_id)] == [ci]
        rounds.drop_taken(s, job_id, [ci], "stale: the branch moved on")
        dropped = s.get(RoundRequest, ci)
        assert dropped is not None and (dropped.status, dropped.job_id) == ("dropped", job_id)
        assert rounds.rounds_used(s, thread, "ci") == 1  # still running
        s.execute(update(Job).where(Job.id == job_id).values(status="cancelled"))
        assert rounds.rounds_used(s, thread, "ci") == 0  # it ended having worked on nothing
        assert not rounds.stopped_by_request(s, job_id)
    _took(job_id, thread, "d-1", "301", stop=True)
    with session_scope() as s:
        assert rounds.stopped_by_request(s, job_id)


def test_a_round_whose_branch_moved_gives_its_requests_back(database: str) -> None:
    thread = make_thread()
    first = _accept(thread, "d-1", "301")
    with session_scope() as s:
        job_id = rounds.start_round_if_idle(s, thread)
        assert job_id is not None
        rounds.take_requests(s, job_id)
    _accept(thread, "d-2", "302")  # waits: taken by nobody yet
    with session_scope() as s:
        rounds.return_requests(s, job_id, "the branch moved while the round ran")
        returned = s.get(RoundRequest, first)
        assert returned is not None
        assert (returned.status, returned.job_id, returned.reason) == (
            "accepted",
            None,
            "the branch moved while the round ran",
        )
        s.execute(update(Job).where(Job.id == job_id).values(status="failed"))
    with session_scope() as s:
        (next_round,) = rounds.follow_up(s)
        assert [r.id for r in rounds.take_requests(s, next_round)] == [first, first + 1]


def test_stale_pending_requests_are_found_until_touched(database: str) -> None:
    thread = make_thread()
    request_id = _record(thread, comment_event("d-1", "301"))
    with session_scope() as s:
        assert rounds.stale_pending(s, utcnow() - timedelta(seconds=60)) == []
        assert rounds.stale_pending(s, utcnow() + timedelta(seconds=1)) == [request_id]
        rounds.touch_requests(s, [request_id])  # type: ignore[list-item]
    with session_scope() as s:
        assert rounds.stale_pending(s, utcnow() - timedelta(seconds=60)) == []


# -- triage's verdicts in the database -----------------------------------------------------------


def _view(request_id: int) -> triage.RequestView:
    with session_scope() as s:
        request = s.get(RoundRequest, request_id)
        assert request is not None
        return triage.RequestView.of(request, records.get_job(s, request.thread_id))


def _apply(request_id: int, verdict: triage.Verdict) -> triage.Outcome | None:
    view = _view(request_id)
    with session_scope() as s:
        return triage.apply(s, view, verdict)


def _round_that_took_a_request(thread: int, status: str) -> int:
    """Round 1 of `thread`, started for one accepted comment it took, now `status`."""
    _accept(thread, "d-1", "301")
    with session_scope() as s:
        running = rounds.start_round_if_idle(s, thread)
        assert running is not None
        rounds.take_requests(s, running)
        s.execute(update(Job).where(Job.id == running).values(status=status))
    return running


def test_stop_cancels_the_running_round_and_drops_what_waits(database: str) -> None:
    thread = make_thread()
    running = _round_that_took_a_request(thread, "running")
    waiting = _accept(thread, "d-2", "302")
    pending = _record(thread, comment_event("d-3", "303"))
    stop = _record(thread, comment_event("d-4", "304", "/frogfix stop", intent="stop"))
    assert pending is not None and stop is not None
    outcome = _apply(stop, triage.Verdict(RequestStatus.taken, "bob stopped the rounds on this MR", stop=True))
    assert outcome is not None and outcome.round_job is None
    assert outcome.reply == "FrogFix stopped: it cancelled the running round and dropped 2 waiting request(s)."
    statuses = _statuses(thread)
    assert [statuses[i] for i in (1, waiting, pending, stop)] == ["taken", "dropped", "dropped", "taken"]
    with session_scope() as s:
        job = records.get_job(s, running)
        assert job.cancel_requested is True and job.status == "running"
        assert s.get(RoundRequest, stop).job_id == running  # type: ignore[union-attr]
        assert rounds.follow_up(s) == []
        said = records.job_events(s, thread)[-1]
        assert (said.kind, said.data) == ("request_taken", {"request_id": stop, "kind": "stop", "author": "bob",
                                                           "stopped_job": running, "cancel": "cancel_requested",
                                                           "dropped": 2})  # fmt: skip
    assert _apply(stop, triage.Verdict(RequestStatus.taken, "again", stop=True)) is None  # judged once


def test_stop_while_the_round_pushes_says_the_push_goes_ahead(database: str) -> None:
    """A round already publishing is not stopped (its move to publishing saw no cancel): the reply says
    so rather than claim a cancel, and what waits is still dropped."""
    thread = make_thread()
    running = _round_that_took_a_request(thread, "publishing")
    _accept(thread, "d-2", "302")
    stop = _record(thread, comment_event("d-3", "303", "/frogfix stop", intent="stop"))
    assert stop is not None
    outcome = _apply(stop, triage.Verdict(RequestStatus.taken, "bob stopped the rounds on this MR", stop=True))
    assert outcome is not None and outcome.reply == (
        "FrogFix stopped: it was already pushing the running round, so that push goes ahead, "
        "and dropped 1 waiting request(s)."
    )
    with session_scope() as s:
        job = records.get_job(s, running)
        assert job.cancel_requested is False and job.status == "publishing"
        assert records.job_events(s, running)[-1].kind == "cancel_too_late"
        assert rounds.follow_up(s) == []
        said = records.job_events(s, thread)[-1].data or {}
        assert (said["stopped_job"], said["cancel"], said["dropped"]) == (running, "too_late", 1)  # not "cancelled"


def test_an_accepted_request_starts_a_round_only_when_idle(database: str) -> None:
    thread = make_thread()
    first = _record(thread, comment_event("d-1", "301"))
    second = _record(thread, comment_event("d-2", "302"))
    assert first is not None and second is not None
    outcome = _apply(first, triage.Verdict(RequestStatus.accepted, "bob asked for changes"))
    assert outcome is not None and outcome.round_job is not None and outcome.reply is None
    later = _apply(second, triage.Verdict(RequestStatus.accepted, "bob asked for changes"))
    assert later is not None and later.round_job is None  # batched into the round after
    with session_scope() as s:
        kinds = [e.kind for e in records.job_events(s, thread)]
    assert kinds.count("request_accepted") == 2


def test_a_non_member_gets_one_reply_per_thread(database: str) -> None:
    thread = make_thread()
    verdict = triage.Verdict(RequestStatus.ignored, triage.NOT_MEMBER, "only members", "author")
    replies = []
    for number, author in enumerate(["mallory", "mallory", "trent"]):
        request_id = _record(thread, comment_event(f"d-{number}", str(400 + number), author=author))
        assert request_id is not None
        outcome = _apply(request_id, verdict)
        assert outcome is not None
        replies.append(outcome.reply)
    assert replies == ["only members", None, "only members"]


def test_the_cap_is_said_once_per_kind(database: str) -> None:
    thread = make_thread()
    reason = "the MR reached FROGFIX_MAX_CI_ROUNDS (2)"
    said = []
    for number, event in enumerate([ci_event("p-1"), ci_event("p-2", pipeline="502"), comment_event("d-1", "301")]):
        request_id = _record(thread, event)
        assert request_id is not None
        outcome = _apply(request_id, triage.Verdict(RequestStatus.ignored, reason, f"said {number}", "kind"))
        said.append(outcome.reply if outcome else "judged")
    assert said == ["said 0", None, "said 2"]


def test_an_issue_that_no_longer_asks_drops_every_waiting_request(database: str) -> None:
    thread = make_thread()
    waiting = _accept(thread, "d-1", "301")
    _finish(thread)
    request_id = _record(thread, comment_event("d-2", "302"))
    assert request_id is not None
    outcome = _apply(request_id, triage.Verdict(RequestStatus.dropped, "the issue is closed", drop_thread=True))
    assert outcome is not None and outcome.round_job is None
    assert _statuses(thread) == {waiting: "dropped", request_id: "dropped"}
    with session_scope() as s:
        assert s.execute(select(Job).where(Job.thread_id == thread)).first() is None


# -- triage's pure decisions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "body", "addressed"),
    [
        ("note", "/frogfix also round negative amounts", True),
        ("note", "  /FrogFix", True),
        ("note", "hey @frogfix-bot please look at line 3", True),
        ("note", "hey @FrogFix-Bot.", True),
        ("note", "looks fine to me", False),
        ("note", "ask @frogfix-botty instead", False),
        ("note", "email frogfix-bot@example.com", False),
        ("note", "/frogfixes are nice", False),
        ("diff_note", "this should be >= 0", True),
        ("review_changes", "", True),
        ("review_comment", "nit", True),
        ("review_approved", "LGTM", False),
    ],
)
def test_what_is_addressed_to_frogfix(kind: Any, body: str, addressed: bool) -> None:
    comment = ReviewComment(id="1", kind=kind, author="bob", body=body)
    assert triage.addressed_to_bot(comment, "frogfix-bot") is addressed


def test_frogfix_knows_its_own_account() -> None:
    assert triage.is_own("FrogFix-Bot", "frogfix-bot")
    assert not triage.is_own("frogfix-bot2", "frogfix-bot")
    assert not triage.is_own(None, "frogfix-bot")
    assert not triage.is_own("frogfix-bot", "")


def test_triage_judges_each_request_once_and_is_a_registered_task(database: str) -> None:
    from app.queue import TRIAGE, celery_app
    from worker import tasks

    def no_forge(kind: str) -> Any:
        raise AssertionError(f"triage asked the {kind} forge about a request it must not judge")

    thread = make_thread()
    judged = _accept(thread, "d-1", "301")
    assert triage.triage(judged, no_forge, get_settings()) == "already accepted"
    assert triage.triage(judged + 100, no_forge, get_settings()) == "unknown"
    assert tasks.triage_request_task.name == TRIAGE and TRIAGE in celery_app.tasks


class _Merges:
    """A forge that answers merge commits' parents (GitLab's merged results pipelines)."""

    def __init__(self, sources: dict[str, str]) -> None:
        self.sources, self.asked = sources, []

    def merge_source(self, project: str, sha: str) -> str | None:
        self.asked.append(sha)
        return self.sources.get(sha)


def test_the_commit_a_ci_result_tested_is_its_own_or_a_merged_results_head(database: str) -> None:
    from app.forge.reviews import CiReport

    thread = make_thread(mr=7)
    request_id = _record(thread, ci_event("p-1"))
    assert request_id is not None
    view = _view(request_id)
    merge, head = "m" * 40, "a" * 40
    forge = _Merges({merge: head})

    def report(ref: str | None, sha: str = merge) -> CiReport:
        return CiReport(system="gitlab_pipeline", id="1", sha=sha, status="failed", ref=ref)

    assert triage.tested_commit(forge, view, report(BRANCH, HEAD)) == HEAD  # type: ignore[arg-type]
    assert triage.tested_commit(forge, view, report("refs/merge-requests/7/head", HEAD)) == HEAD  # type: ignore[arg-type]
    assert forge.asked == []  # a commit on the branch needs no question
    assert triage.tested_commit(forge, view, report("refs/merge-requests/7/merge")) == head  # type: ignore[arg-type]
    # Another MR's merged result, or a forge that cannot say, tells nothing about this MR's head.
    assert triage.tested_commit(forge, view, report("refs/merge-requests/8/merge")) is None  # type: ignore[arg-type]
    assert triage.tested_commit(object(), view, report("refs/merge-requests/7/merge")) is None  # type: ignore[arg-type]
    assert forge.asked == [merge]


# -- update rounds (issue 25) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "intent"),
    [
        ("/frogfix rebase", "update"),
        ("/FrogFix Update please", "update"),
        ("  /frogfix rebase.", "update"),
        ("/frogfix stop", "stop"),
        ("/frogfix update from main", "update"),
        ("/frogfix rebase onto the new main", "update"),
        ("/frogfix update the docstring to mention None", "review"),  # a review request that starts with it
        ("/frogfix rebased it myself, thanks", "review"),  # a word that only starts like the command
        ("please /frogfix rebase", "review"),  # not at the start: a review comment, if addressed at all
        ("/frogfix-rebase", "review"),
        ("rebase", "review"),
    ],
)
def test_what_a_comment_asks_for(body: str, intent: str) -> None:
    from app.forge.reviews import comment_intent

    assert comment_intent(body) == intent


def _update_request(thread: int, delivery: str, comment_id: str, author: str = "bob") -> int:
    event = comment_event(delivery, comment_id, "/frogfix rebase", author=author, intent="update")
    request_id = _record(thread, event)
    assert request_id is not None
    with session_scope() as s:
        assert rounds.judge_request(s, request_id, RequestStatus.accepted, f"{author} asked to merge main in")
    return request_id


def test_an_update_round_goes_first_and_takes_only_update_requests(database: str) -> None:
    thread = make_thread()
    review = _accept(thread, "d-1", "301")
    update_request = _update_request(thread, "d-2", "302", author="carol")
    with session_scope() as s:
        first = rounds.start_round_if_idle(s, thread)
        assert first is not None
        job = records.get_job(s, first)
        assert job.round_kind == "update" and job.trigger_user == "carol"
        assert [r.id for r in rounds.take_requests(s, first)] == [update_request]
    _finish(first)
    with session_scope() as s:
        [second] = rounds.follow_up(s)
        assert records.get_job(s, second).round_kind == "review"
        assert [r.id for r in rounds.take_requests(s, second)] == [review]  # the update request is not taken again
        assert rounds.rounds_used(s, thread, "update") == 1 and rounds.rounds_used(s, thread, "review") == 1
    settings = get_settings().model_copy(update={"max_update_rounds": 1})
    assert triage.cap_reason("update", 1, settings) == "the MR reached FROGFIX_MAX_UPDATE_ROUNDS (1)"
    assert triage.cap_reason("review", 1, settings) is None
    assert "updates from the target branch" in triage.cap_reply("update", "x")


def test_frogfix_asks_for_an_update_once_per_target_head(database: str) -> None:
    thread = make_thread()
    with session_scope() as s:
        job = records.get_job(s, thread)
        first = rounds.record_auto_update(s, job, 7, "c" * 40, "conflicts with main")
        assert first is not None
        assert rounds.record_auto_update(s, job, 7, "c" * 40, "conflicts with main") is None  # the same head
        again = rounds.record_auto_update(s, job, 7, "d" * 40, "conflicts with main")
        assert again is not None and again != first
        made = rounds.requests_of(s, thread_id=thread)
        assert [(r.kind, r.status, r.author, r.dedupe_key) for r in made] == [
            ("update", "accepted", None, "auto:" + "c" * 40),
            ("update", "accepted", None, "auto:" + "d" * 40),
        ]
        round_job = rounds.start_round_if_idle(s, thread)
        assert round_job is not None and records.get_job(s, round_job).trigger_user == "alice"  # the thread's


def test_the_sweep_checks_open_threads_that_were_not_checked_lately(database: str) -> None:
    thread = make_thread()
    other = make_thread(mr=8, issue=2, branch="frogfix/issue-2", pushed="b" * 40)
    never = make_thread(mr=9, issue=3, branch="frogfix/issue-3", pushed="e" * 40, status="failed")
    now = utcnow()
    with session_scope() as s:
        assert rounds.threads_to_check(s, now) == [thread, other]  # a failed job opened no MR to keep up to date
        rounds.note_update_sent(s, [thread])
        assert rounds.threads_to_check(s, now - timedelta(minutes=10)) == [other]
        rounds.note_update_check(s, other, "merged")
        assert rounds.threads_to_check(s, now + timedelta(minutes=10)) == [thread]  # merged: never again
        assert never not in rounds.threads_to_check(s, now + timedelta(minutes=10))


def test_the_proof_an_update_must_keep(database: str) -> None:
    """What `thread_proof` reads is what the pipeline writes: the chosen attempt's TestEvidence, whose
    `evidence` holds the verdict; only jobs that pushed count, never the asking round, strongest first."""
    from app.models import JobAttempt
    from worker.attempts.verifier import TestEvidence

    def attempt(job_id: int, number: int, level: str, chosen: bool) -> JobAttempt:
        tests = TestEvidence("pytest", {"exit_code": 0}, [], verdict={"level": level}).to_dict()
        return JobAttempt(job_id=job_id, run=1, number=number, status="verified", chosen=chosen, tests=tests)

    thread = make_thread()
    asking = _round(thread, 2, "update", status="running")
    with session_scope() as s:
        assert rounds.thread_proof(s, thread, asking) is None
        s.add(attempt(thread, 1, "failed_before", True))
        s.add(attempt(thread, 2, "reproduced", False))  # not the one published
        s.add(attempt(asking, 1, "reproduced", True))  # the asking round's own: never its own yardstick
    with session_scope() as s:
        assert rounds.thread_proof(s, thread, asking) == "failed_before"
    refused = _round(thread, 1, "review", status="no_fix")  # pushed nothing: proved nothing
    later = _round(thread, 3, "review", pushed="f" * 40)
    with session_scope() as s:
        s.add(attempt(refused, 1, "reproduced", True))
        s.add(attempt(later, 1, "reproduced", True))
    with session_scope() as s:
        assert rounds.thread_proof(s, thread, asking) == "reproduced"  # the strongest proof the thread pushed
        s.execute(update(Job).where(Job.id == later).values(status="failed"))
        assert rounds.thread_proof(s, thread, asking) == "failed_before"
