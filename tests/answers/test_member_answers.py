"""Only a member's `/frogfix` answers FrogFix's question, and a member's answer is never dropped (issue 36).

Through the real webhook endpoints with the real payloads, the real pipeline, the GitLab and Gitea API
doubles, the git server and the scripted model: a non-member's `/frogfix` queues nothing and is told so
once per person and issue; a member's answer that comes while a run is queued or active joins the queued
run or runs when the run ends; the answered task holds the comments up to the member's `/frogfix` and
none after it, and others' comments never crowd the reporter's or a member's out of it.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import select, text, update

from app.db import session_scope
from app.forge.reviews import IssueComment
from app.jobs import answer_gate, records, rounds, transitions
from app.models import AnswerRefusal, Job, utcnow
from tests.answers.test_answer_pipeline import (
    ANSWER,
    BEFORE,
    _gitea_asked,
    _gitlab_answer,
    _gitlab_asked,
    _job,
)
from tests.conftest import GITEA_SECRET
from tests.pipeline.conftest import PROJECT, World, breaking_script, fixing_script
from tests.servers import uvicorn_app
from tests.webhook_requests import gitea_headers, gitlab_headers, payload
from worker.job.question import QUESTION_MARKER, answers_since, within_bounds
from worker.leaf.prompts import COMMENTS_BEGIN, COMMENTS_END, MAX_ANSWERS, MAX_ANSWERS_CHARS
from worker.tasks import run_job

MEMBER_ANSWER = "MEMBER-CANARY-9d41: the failing call is add(2, 3) on Python 3.12"
LATE = "LATE-CANARY-2e77: written after the member's /frogfix"
REFUSED = "only members with at least Developer"


def _section(world: World) -> str:
    """The comments section of the newest task the model was sent (a fresh run's first request)."""
    for index in reversed(range(world.model.count)):
        content = str(world.model.request_json(index)["messages"][1]["content"])
        if COMMENTS_BEGIN in content:
            return content.split(COMMENTS_BEGIN, 1)[1].split(COMMENTS_END, 1)[0]
    raise AssertionError("no task with comments reached the model")


def _bot_notes(world: World, text: str) -> list[dict[str, Any]]:
    return [n for n in world.gitlab.notes if n["author"]["username"] == "frogfix-bot" and text in n["body"]]


def _events(job_id: int) -> list[tuple[str, Any]]:
    with session_scope() as s:
        return [(e.kind, e.data) for e in records.job_events(s, job_id)]


# --- GitLab -------------------------------------------------------------------------------------------


def test_a_members_answer_runs_after_a_non_members_frogfix(client: Any, world: World) -> None:
    """The finding: a Reporter's `/frogfix`, then a Developer's real answer a moment later. The Reporter's
    queues nothing; the Developer's runs: not `rejected`, the model is called, the answer is in the task."""
    iid, job_id = _gitlab_asked(client, world)
    before = _job(job_id)[0]

    r = _gitlab_answer(client, world, iid, by="rep", text="/frogfix")  # Reporter (20): not a member
    assert r.status_code == 200 and r.json()["outcome"] == "answer_refused", r.text
    job = _job(job_id)[0]
    assert (job.status, job.run, job.enqueue_count, job.trigger_user) == (
        "no_fix", 1, before.enqueue_count, before.trigger_user)  # fmt: skip

    r = _gitlab_answer(client, world, iid, by="dev", text=f"/frogfix {MEMBER_ANSWER}")
    assert r.status_code == 202 and r.json()["outcome"] == "job_requeued", r.text

    assert run_job(job_id) == "done"
    job, kinds = _job(job_id)
    assert job.trigger_user == "dev" and job.run == 2 and "rejected" not in kinds
    assert world.model.count > 0 and MEMBER_ANSWER in _section(world)
    assert len(world.gitlab.open_mrs(PROJECT)) == 1


def test_five_refused_frogfix_comments_give_one_reply_and_no_requeue(client: Any, world: World) -> None:
    iid, job_id = _gitlab_asked(client, world)
    before = _job(job_id)[0]
    notes_before = len(world.gitlab.notes)

    outcomes = [_gitlab_answer(client, world, iid, by="rep", text=f"/frogfix try {n}").json() for n in range(5)]

    assert [o["outcome"] for o in outcomes] == ["answer_refused"] * 5
    assert "told once" in outcomes[0]["reason"] and all("told before" in o["reason"] for o in outcomes[1:])
    assert len(_bot_notes(world, REFUSED)) == 1 and "@rep" not in _bot_notes(world, REFUSED)[0]["body"]
    assert len(world.gitlab.notes) == notes_before + 5 + 1  # rep's five comments and the one reply
    job, kinds = _job(job_id)
    assert (job.status, job.run, job.enqueue_count) == ("no_fix", 1, before.enqueue_count)
    assert records.ANSWERED not in kinds and kinds.count("answer_refused") == 1
    assert world.model.count == 0
    with session_scope() as s:
        assert s.execute(select(AnswerRefusal.author, AnswerRefusal.issue)).all() == [("rep", iid)]
    # A member is still heard: the question stays open.
    assert _gitlab_answer(client, world, iid, by="dev", text="/frogfix").json()["outcome"] == "job_requeued"


def test_a_refusal_whose_reply_could_not_be_posted_is_told_by_the_next(client: Any, world: World) -> None:
    iid, _job_id = _gitlab_asked(client, world)
    world.gitlab.fail_next(1, 500, method="POST", path_contains="/notes")
    first = _gitlab_answer(client, world, iid, by="rep", text="/frogfix").json()
    assert first["outcome"] == "answer_refused" and "could not be posted" in first["reason"]
    assert _bot_notes(world, REFUSED) == []
    second = _gitlab_answer(client, world, iid, by="rep", text="/frogfix").json()
    assert "told once" in second["reason"] and len(_bot_notes(world, REFUSED)) == 1


def test_a_strangers_twenty_comments_leave_the_reporters_answer_in_the_task(client: Any, world: World) -> None:
    iid, job_id = _gitlab_asked(client, world)
    world.gitlab.add_issue_note(PROJECT, iid, ANSWER, by="rep")  # the reporter answers
    for n in range(20):
        world.gitlab.add_issue_note(PROJECT, iid, f"NOISE-{n:02d} me too, any news?", by="zed")

    assert _gitlab_answer(client, world, iid, by="dev", text="/frogfix").json()["outcome"] == "job_requeued"
    assert run_job(job_id) == "done"

    section = _section(world)
    assert ANSWER in section and BEFORE not in section
    assert section.count("NOISE-") == MAX_ANSWERS - 1  # the bound holds: the oldest noise made room
    assert "NOISE-00" not in section and "NOISE-19" in section and "left out" not in section
    assert f"[comment {MAX_ANSWERS}]" in section and f"[comment {MAX_ANSWERS + 1}]" not in section


def test_comments_after_the_members_frogfix_are_not_in_the_task(client: Any, world: World) -> None:
    iid, job_id = _gitlab_asked(client, world)
    world.gitlab.add_issue_note(PROJECT, iid, ANSWER, by="rep")
    assert _gitlab_answer(client, world, iid, by="dev", text="/frogfix").json()["outcome"] == "job_requeued"
    world.gitlab.add_issue_note(PROJECT, iid, LATE, by="rep")  # before the worker runs the job
    world.gitlab.add_issue_note(PROJECT, iid, f"{LATE} (a stranger)", by="zed")

    assert run_job(job_id) == "done"
    section = _section(world)
    assert ANSWER in section and LATE not in section


def test_a_members_answer_joins_the_queued_run(client: Any, world: World) -> None:
    world.gitlab.add_member(PROJECT, "mae", 40)
    iid, job_id = _gitlab_asked(client, world)
    assert _gitlab_answer(client, world, iid, by="dev", text="/frogfix").json()["outcome"] == "job_requeued"

    r = _gitlab_answer(client, world, iid, by="mae", text=f"/frogfix {MEMBER_ANSWER}")
    assert r.json()["outcome"] == "answer_joined", r.text
    job = _job(job_id)[0]
    assert (job.status, job.trigger_user, job.answer_waiting) == ("queued", "mae", None)

    assert run_job(job_id) == "done"
    assert MEMBER_ANSWER in _section(world) and _job(job_id)[0].trigger_user == "mae"
    with session_scope() as s:
        assert rounds.follow_up(s) == []  # nothing waits: the answer ran in this run


def test_a_members_answer_during_a_run_runs_next(client: Any, world: World) -> None:
    """A member answers while the run a first answer queued is under way: it waits, and when that run ends
    (`no_fix`, asking again) the job is queued again with it, and its task holds the new answer."""
    world.gitlab.add_member(PROJECT, "mae", 40)
    iid, job_id = _gitlab_asked(client, world)
    assert _gitlab_answer(client, world, iid, by="dev", text="/frogfix").json()["outcome"] == "job_requeued"
    queue = breaking_script() + fixing_script()
    answered: list[Any] = []

    def respond(index: int, body: bytes) -> Any:
        if b"Write ONE concrete question" in body:  # the first run asks again (worker/job/question.py)
            return {"role": "assistant", "content": "Which input fails for you now?"}
        if not answered:  # the first model call of the first run: the member answers meanwhile
            answered.append(_gitlab_answer(client, world, iid, by="mae", text=f"/frogfix {MEMBER_ANSWER}").json())
        return queue.pop(0)

    world.model._responder = respond
    assert run_job(job_id) == "no_fix"  # the run ends; its follow-up queues the job again with the answer
    assert answered[0]["outcome"] == "answer_waiting", answered
    job, kinds = _job(job_id)
    assert (job.status, job.trigger_user, job.answer_waiting) == ("queued", "mae", None)
    assert kinds[-1] == records.ANSWERED

    assert run_job(job_id) == "done"
    assert MEMBER_ANSWER in _section(world) and _job(job_id)[0].run == 3


def test_when_intake_cannot_ask_the_forge_a_members_answer_still_runs_after_the_refused_run(
    client: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forge does not answer the webhook's membership question: the answers count as before issue 36 and
    the worker decides. The Reporter's run ends `rejected`; the Developer's answer, which came while that run
    was queued, is not dropped: it runs next."""
    monkeypatch.setattr(answer_gate, "may_answer", lambda *args: None)
    iid, job_id = _gitlab_asked(client, world)
    assert _gitlab_answer(client, world, iid, by="rep", text="/frogfix").json()["outcome"] == "job_requeued"
    r = _gitlab_answer(client, world, iid, by="dev", text=f"/frogfix {MEMBER_ANSWER}")
    assert r.json()["outcome"] == "answer_waiting", r.text

    assert run_job(job_id) == "rejected" and world.model.count == 0
    job = _job(job_id)[0]
    assert (job.status, job.trigger_user) == ("queued", "dev")  # the run's follow-up queued the answer

    assert run_job(job_id) == "done"
    assert world.model.count > 0 and MEMBER_ANSWER in _section(world)


def test_a_non_members_frogfix_during_a_run_changes_nothing(client: Any, world: World) -> None:
    iid, job_id = _gitlab_asked(client, world)
    assert _gitlab_answer(client, world, iid, by="dev", text="/frogfix").json()["outcome"] == "job_requeued"
    r = _gitlab_answer(client, world, iid, by="rep", text="/frogfix")
    assert r.json()["outcome"] == "answer_refused"
    job = _job(job_id)[0]
    assert (job.status, job.trigger_user, job.answer_waiting) == ("queued", "dev", None)


def test_a_waiting_answer_is_let_go_when_the_run_published_or_was_cancelled(client: Any, world: World) -> None:
    _iid, job_id = _gitlab_asked(client, world)
    waiting = {"comment_id": "1", "author": "dev", "member": True, "delivery_id": "d", "url": None}
    for status, queued in (("done", False), ("cancelled", False), ("failed", True)):
        with session_scope() as s:
            s.execute(update(Job).where(Job.id == job_id).values(status=status, answer_waiting=waiting))
        with session_scope() as s:
            assert rounds.follow_up(s) == ([job_id] if queued else [])
        job, kinds = _job(job_id)
        assert job.answer_waiting is None and job.status == ("queued" if queued else status)
        assert kinds[-1] == (records.ANSWERED if queued else records.ANSWER_LET_GO)
    with session_scope() as s:  # what was let go or ran is gone: a finished job has nothing waiting
        s.execute(update(Job).where(Job.id == job_id).values(status="no_fix"))
    with session_scope() as s:
        assert rounds.follow_up(s) == [] and s.get(Job, job_id).answer_waiting is None  # type: ignore[union-attr]
        raw = s.execute(text("SELECT answer_waiting IS NULL FROM jobs WHERE id = :id"), {"id": job_id}).scalar()
        assert raw  # SQL NULL, not JSON null


def test_refused_frogfix_comments_at_once_still_give_one_reply(database: str, world: World) -> None:
    """Ten refused `/frogfix` comments of one account delivered at the same moment, on SQLite and PostgreSQL:
    the unique key of the refusal memory lets exactly one of them reply."""
    from app.web.main import create_app

    with uvicorn_app(create_app(run_sweep=False)) as base, httpx.Client(base_url=base, timeout=60) as http:
        iid, job_id = _gitlab_asked(http, world)
        requests = []
        for n in range(10):
            note = world.gitlab.add_issue_note(PROJECT, iid, f"/frogfix {n}", by="rep")
            data = json.loads(payload("gitlab_issue_note.json"))
            data["user"]["username"] = "rep"
            data["object_attributes"].update(id=note["id"], note=f"/frogfix {n}")
            data["issue"]["iid"] = iid
            requests.append(json.dumps(data).encode())

        async def blast() -> list[str]:
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                answers = await asyncio.gather(*(
                    client.post("/webhooks/gitlab", content=body, headers=gitlab_headers(event="Note Hook"))
                    for body in requests
                ))  # fmt: skip
            return [r.json()["outcome"] for r in answers]

        assert asyncio.run(blast()) == ["answer_refused"] * 10
    assert len(_bot_notes(world, REFUSED)) == 1
    job = _job(job_id)[0]
    assert (job.status, job.run) == ("no_fix", 1)


# --- Gitea ----------------------------------------------------------------------------------------------




def _gitea_answer(client: Any, world: World, number: int, *, by: str, text: str) -> Any:
    comment = world.gitea.add_issue_comment(PROJECT, number, text, by=by)
    data = json.loads(payload("gitea_issue_comment.json"))
    data["issue"]["number"] = number
    data["comment"].update(id=comment["id"], body=text, user=world.gitea.users[by])
    data["sender"] = world.gitea.users[by]
    body = json.dumps(data).encode()
    hook = gitea_headers(body, event="issue_comment", event_type="issue_comment", secret=GITEA_SECRET)
    return client.post("/webhooks/gitea", content=body, headers=hook)


def _gitea_bot_replies(world: World) -> list[dict[str, Any]]:
    bot = world.gitea.bot["login"]
    return [c for c in world.gitea.comments if c["user"]["login"] == bot and REFUSED in c["body"]]


def test_gitea_a_members_answer_runs_after_a_read_only_users_frogfix(client: Any, world: World) -> None:
    number, job_id = _gitea_asked(client, world)
    for _ in range(5):  # rep has read access only
        assert _gitea_answer(client, world, number, by="rep", text="/frogfix").json()["outcome"] == "answer_refused"
    assert len(_gitea_bot_replies(world)) == 1 and _job(job_id)[0].status == "no_fix"

    r = _gitea_answer(client, world, number, by="dev", text=f"/frogfix {MEMBER_ANSWER}")
    assert r.status_code == 202 and r.json()["outcome"] == "job_requeued", r.text
    world.gitea.add_issue_comment(PROJECT, number, LATE, by="rep")
    assert run_job(job_id) == "done"
    section = _section(world)
    assert world.model.count > 0 and MEMBER_ANSWER in section and LATE not in section


def test_gitea_a_strangers_twenty_comments_leave_the_reporters_answer_in_the_task(
    client: Any, world: World
) -> None:
    number, job_id = _gitea_asked(client, world)
    world.gitea.add_issue_comment(PROJECT, number, ANSWER, by="rep")
    for n in range(20):
        world.gitea.add_issue_comment(PROJECT, number, f"NOISE-{n:02d} +1", by="zed")
    assert _gitea_answer(client, world, number, by="dev", text="/frogfix").json()["outcome"] == "job_requeued"
    assert run_job(job_id) == "done"
    section = _section(world)
    assert ANSWER in section and section.count("NOISE-") == MAX_ANSWERS - 1 and "NOISE-00" not in section


# --- the selection, alone --------------------------------------------------------------------------------

ASKED = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)


def _note(id_: int, author: str, body: str) -> IssueComment:
    return IssueComment(str(id_), author, body, ASKED + timedelta(minutes=id_))


class _Forge:
    """What `answers_since` asks of a forge, with `members` for `can_trigger` (each question counted)."""

    def __init__(self, comments: list[IssueComment], members: set[str]) -> None:
        self.comments, self.members = comments, members
        self.asked: list[str] = []

    def issue_comments(self, project: str, number: int) -> list[IssueComment]:
        return list(self.comments)

    def bot_username(self) -> str:
        return "frogfix-bot"

    def can_trigger(self, project: str, username: str) -> bool:
        self.asked.append(username)
        return username in self.members


def _read(forge: _Forge, **options: Any) -> list[str]:
    found = answers_since(forge, PROJECT, 7, ASKED, **options)  # type: ignore[arg-type]
    return [c.body for c in found]


def test_the_window_ends_at_the_frogfix_that_queued_the_run() -> None:
    comments = [
        _note(1, "rep", "before"),
        _note(2, "frogfix-bot", f"<!-- frogfix:0011 -->\n{QUESTION_MARKER}\nWhich input?"),
        _note(3, "rep", "the answer"),
        _note(4, "dev", "/frogfix first"),
        _note(5, "rep", "after the first"),
        _note(6, "frogfix-bot", f"<!-- frogfix:0022 -->\n{QUESTION_MARKER}\nAnd now?"),  # a later run asked again
        _note(7, "mae", "/frogfix second"),
        _note(8, "rep", "after the second"),
    ]
    forge = _Forge(comments, {"dev", "mae"})
    assert _read(forge, until="4") == ["the answer", "/frogfix first"]
    assert _read(forge, until="7") == ["/frogfix second"]  # after the question newest before it
    assert _read(forge) == ["/frogfix second", "after the second"]  # no bound: as before issue 36
    # The queuing comment deleted: the ids, which the forges hand out in order, still end the window.
    forge.comments = [c for c in comments if c.id != "4"]
    assert _read(forge, until="4") == ["the answer"]
    assert forge.asked == []  # everything fit: no one's rights were asked


def test_members_and_the_reporter_come_first_then_others_while_room_is_left() -> None:
    comments = [_note(1, "frogfix-bot", QUESTION_MARKER), _note(2, "rep", "reporter's answer"),
                _note(3, "mae", "member's hint")]
    comments += [_note(10 + n, f"sybil{n % 3}", f"noise {n}") for n in range(40)]
    comments += [_note(60, "dev", "/frogfix")]
    forge = _Forge(comments, {"mae", "dev"})
    read = _read(forge, until="60", reporter="REP")  # usernames compare as the forges do
    assert len(read) == MAX_ANSWERS and read[:2] == ["reporter's answer", "member's hint"]
    assert read[2:] == [f"noise {n}" for n in range(22, 40)]  # the newest others fill what is left
    assert set(forge.asked) <= {"mae", "sybil0", "sybil1", "sybil2"}  # at most each author once


def test_the_size_bound_keeps_the_reporters_answer_too() -> None:
    big = "y" * 7_000
    comments = [_note(1, "rep", "short answer")] + [_note(2 + n, "zed", f"{big} {n}") for n in range(6)]
    kept = within_bounds(comments, lambda c: c.author == "rep")
    assert kept[0].body == "short answer" and len(kept) < len(comments)
    from worker.leaf.prompts import render_comments

    assert "left out" not in render_comments(kept) and len(render_comments(kept)) < MAX_ANSWERS_CHARS + 2_000


def test_the_refusal_memory_is_one_row_per_person_and_issue(frogfix_env: dict[str, Any]) -> None:
    with session_scope() as s:
        assert records.note_refusal(s, "gitlab", PROJECT, 7, "Rep", "1") is True
        assert records.note_refusal(s, "gitlab", PROJECT, 7, "rep", "2") is False  # the same account
        assert records.note_refusal(s, "gitlab", PROJECT, 8, "rep", "3") is True  # another issue
        assert records.note_refusal(s, "gitea", PROJECT, 7, "rep", "4") is True  # another forge


def test_the_run_s_bound_is_the_newest_answer_unless_an_operator_queued_it_since(frogfix_env: dict[str, Any]) -> None:
    with session_scope() as s:
        job = Job(forge="gitlab", project=PROJECT, issue=7, status="no_fix", run=1, created_at=utcnow(),
                  updated_at=utcnow())
        s.add(job)
        s.flush()
        job_id = job.id
        records.add_event(s, job_id, "created", "label added")
        assert records.answer_comment(s, job_id) is None  # a job nobody answered reads unbounded, as before
        records.add_event(s, job_id, records.ANSWERED, "dev answered", {"comment_id": "11", "author": "dev"})
        assert records.answer_comment(s, job_id) == "11"
        records.add_event(s, job_id, records.ANSWER_WAITING, "mae waits", {"comment_id": "12", "author": "mae"})
        assert records.answer_comment(s, job_id) == "11"  # a waiting answer is the next run's, not this one's
        records.add_event(s, job_id, records.ANSWER_JOINED, "mae joined", {"comment_id": "13", "author": "mae"})
        assert records.answer_comment(s, job_id) == "13"
        records.add_event(s, job_id, "retried", "queued again by an operator")
        assert records.answer_comment(s, job_id) is None


def test_a_late_delivery_of_an_older_frogfix_never_cuts_a_newer_answer_out(frogfix_env: dict[str, Any]) -> None:
    """Webhooks may arrive out of order (GitLab sends them asynchronously; a resend): the run's window ends at
    the newest `/frogfix` by the forge's comment id, and a waiting answer is never replaced by an older one."""
    with session_scope() as s:
        job = Job(forge="gitlab", project=PROJECT, issue=9, status="queued", run=2, asked_at=utcnow(),
                  created_at=utcnow(), updated_at=utcnow())
        s.add(job)
        s.flush()
        job_id = job.id
        records.add_event(s, job_id, "created", "label added")
        records.add_event(s, job_id, records.ANSWERED, "dev answered", {"comment_id": "101", "author": "dev"})
        records.add_event(s, job_id, records.ANSWER_JOINED, "older, late", {"comment_id": "100", "author": "ann"})
        assert records.answer_comment(s, job_id) == "101"
        s.execute(update(Job).where(Job.id == job_id).values(status="running"))
        newer = {"comment_id": "201", "author": "mae", "member": True}
        assert transitions.keep_answer(s, job_id, newer, member=True) == "waiting"
        older = {"comment_id": "200", "author": "dev", "member": True}
        assert transitions.keep_answer(s, job_id, older, member=True) == "waiting"
        kept = s.execute(select(Job.answer_waiting).where(Job.id == job_id)).scalar_one()
        assert kept["comment_id"] == "201", kept


def test_no_database_lock_is_held_while_the_forge_is_asked_about_a_frogfix(client: Any, world: World) -> None:
    """The webhook asks the forge whether the commenter may trigger FrogFix before the delivery's transaction
    opens (review of issue 36): a slow forge held SQLite's write lock, and every worker write and webhook
    waited behind it. While the membership request hangs, another writer takes the lock at once."""
    import sqlite3
    import threading

    from app.settings import get_settings
    from tests.servers import wait_until

    iid, _job_id = _gitlab_asked(client, world)
    world.gitlab.hang_next(1, seconds=60, method="GET", path_contains="/members/all")
    seen_before = len(world.gitlab.calls("GET", "/members/all"))
    answered: list[Any] = []
    thread = threading.Thread(target=lambda: answered.append(_gitlab_answer(client, world, iid, by="dev",
                                                                            text="/frogfix")))
    thread.start()
    try:
        wait_until(lambda: len(world.gitlab.calls("GET", "/members/all")) > seen_before, timeout=60)
        database = get_settings().resolved_database_url().removeprefix("sqlite:///")
        probe = sqlite3.connect(database, timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")  # "database is locked" at once if the delivery's transaction held it
            probe.execute("ROLLBACK")
        finally:
            probe.close()
        assert thread.is_alive(), "the forge was still being asked when the lock was taken"
    finally:
        thread.join(timeout=120)
    assert answered and answered[0].status_code in (200, 202), answered
