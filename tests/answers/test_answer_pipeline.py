"""Abstain and ask, answered (issue 24): a `/frogfix` comment on the issue re-queues the job that asked,
and the comments since the question reach the agent's task, through the real webhook endpoint, the
real pipeline, the forge API doubles, the real git server and the scripted model.

Each test starts where the pipeline's abstain path leaves a job: ended `no_fix`, `asked_at` set, and its
question (`worker/job/question.py`) posted on the issue by the bot.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import update

from app.db import session_scope
from app.jobs import records
from app.models import Job, utcnow
from tests.conftest import GITEA_SECRET
from tests.pipeline.conftest import PROJECT, TRIGGER, World
from tests.webhook_requests import gitea_headers, gitlab_headers, payload
from worker.job.question import question_comment
from worker.leaf.model import ModelReply, ReplayModel
from worker.leaf.prompts import COMMENTS_BEGIN, COMMENTS_END, render_task
from worker.tasks import run_job

BEFORE = "OLD-CANARY-7c1e: a comment written before FrogFix asked"
ANSWER = "ANSWER-CANARY-3b9d: add(2, 3) must be 5, I get -1"
QUESTION = "QUESTION-CANARY-5a2f: which input fails for you?"


def _question(job_id: int) -> str:
    model = ReplayModel([ModelReply({"role": "assistant", "content": QUESTION}, "stop")])
    return question_comment(model, title="add() returns the difference", body="add(2, 3) gives -1", attempts=[],
                            test_command="python3 -m pytest -q", redact=lambda t: t, job_id=job_id, job_url=None)


def _abstained(job_id: int) -> None:
    """The job as the abstain path ends it: no_fix, after one run, having asked."""
    now = utcnow()
    with session_scope() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status="no_fix", run=1, finished_at=now, asked_at=now))


def _gitlab_asked(client: Any, world: World) -> tuple[int, int]:
    """A GitLab issue labelled by a developer, its job, and FrogFix's question on it: `(iid, job_id)`."""
    issue = world.gitlab.add_issue(PROJECT, title="add() returns the difference", description="add(2, 3) gives -1",
                                   author="rep")
    iid = issue["iid"]
    world.gitlab.add_label(PROJECT, iid, TRIGGER, by="dev")
    body, headers = world.gitlab_webhook(iid)
    r = client.post("/webhooks/gitlab", content=body, headers=headers)
    assert r.status_code == 202, r.text
    job_id = int(r.json()["job_id"])
    world.gitlab.add_issue_note(PROJECT, iid, BEFORE, by="rep")
    world.gitlab.add_issue_note(PROJECT, iid, "<!-- frogfix:00112233aabbccdd -->\n" + _question(job_id),
                                by="frogfix-bot")
    _abstained(job_id)
    return iid, job_id


def _gitlab_answer(client: Any, world: World, iid: int, *, by: str, text: str) -> Any:
    """`by` comments `text` on the issue, and GitLab's Note Hook for it arrives."""
    note = world.gitlab.add_issue_note(PROJECT, iid, text, by=by)
    data = json.loads(payload("gitlab_issue_note.json"))
    data["user"]["username"] = by
    data["object_attributes"].update(id=note["id"], note=text)
    data["issue"]["iid"] = iid
    return client.post("/webhooks/gitlab", content=json.dumps(data).encode(), headers=gitlab_headers(event="Note Hook"))


def _task(world: World, index: int = 0) -> str:
    content: str = world.model.request_json(index)["messages"][1]["content"]
    return content


def _job(job_id: int) -> tuple[Job, list[str]]:
    with session_scope() as s:
        job = records.get_job(s, job_id)
        kinds = [e.kind for e in records.job_events(s, job_id)]
        s.expunge(job)
        return job, kinds


def test_gitlab_answer_requeues_the_job_and_reaches_the_task(client: Any, world: World) -> None:
    iid, job_id = _gitlab_asked(client, world)
    world.gitlab.add_issue_note(PROJECT, iid, ANSWER, by="rep")

    r = _gitlab_answer(client, world, iid, by="dev", text="/frogfix please try again with that")

    assert r.status_code == 202 and r.json()["outcome"] == "job_requeued" and r.json()["job_id"] == job_id
    assert run_job(job_id) == "done"

    job, kinds = _job(job_id)
    assert job.trigger_user == "dev" and job.run == 2 and "answered" in kinds and "answers_read" in kinds
    task = _task(world)
    assert task.startswith(render_task("add() returns the difference", "add(2, 3) gives -1", project=PROJECT,
                                       issue_number=iid))  # the issue's task, as always, comes first
    section = task.split(COMMENTS_BEGIN, 1)[1].split(COMMENTS_END, 1)[0]
    assert ANSWER in section and "| /frogfix please try again with that" in section
    assert BEFORE not in task  # written before the question
    assert QUESTION not in task and "FrogFix could not reproduce" not in task  # FrogFix's own comments
    [mr] = world.gitlab.open_mrs(PROJECT)
    assert "working on this issue" in world.gitlab.notes[-2]["body"]  # the answer run says it works on it again
    assert mr["title"].startswith("Draft:")


def test_a_non_members_answer_is_refused_and_a_members_still_counts(client: Any, world: World) -> None:
    iid, job_id = _gitlab_asked(client, world)
    world.gitlab.add_issue_note(PROJECT, iid, ANSWER, by="rep")

    r = _gitlab_answer(client, world, iid, by="rep", text="/frogfix")  # rep has Reporter access (20)
    assert r.json()["outcome"] == "answer_refused"  # intake asks the forge (issue 36): nothing is queued
    job, _ = _job(job_id)
    assert job.status == "no_fix" and job.run == 1 and world.model.count == 0
    refused = world.gitlab.notes[-1]["body"]
    assert "only members" in refused and "@rep" not in refused and world.gitlab.open_mrs(PROJECT) == []

    r = _gitlab_answer(client, world, iid, by="dev", text="/frogfix")  # the question is still open
    assert r.json()["outcome"] == "job_requeued"
    assert run_job(job_id) == "done"
    assert ANSWER in _task(world) and _job(job_id)[0].trigger_user == "dev"


def test_an_answer_after_the_label_was_removed_cancels_as_today(client: Any, world: World) -> None:
    iid, job_id = _gitlab_asked(client, world)
    world.gitlab.remove_label(PROJECT, iid, TRIGGER, by="dev")
    assert _gitlab_answer(client, world, iid, by="dev", text="/frogfix").json()["outcome"] == "job_requeued"
    assert run_job(job_id) == "cancelled" and world.model.count == 0


def test_a_normal_job_s_task_has_no_comments_section(client: Any, world: World) -> None:
    issue = world.gitlab.add_issue(PROJECT, title="add() returns the difference", description="add(2, 3) gives -1",
                                   author="rep")
    world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
    world.gitlab.add_issue_note(PROJECT, issue["iid"], BEFORE, by="rep")
    body, headers = world.gitlab_webhook(issue["iid"])
    job_id = client.post("/webhooks/gitlab", content=body, headers=headers).json()["job_id"]
    assert run_job(job_id) == "done"
    task = _task(world)
    assert COMMENTS_BEGIN not in task and BEFORE not in task
    assert world.gitlab.calls("GET", "/notes") == []  # a job that asked nothing reads no comments


def _gitea_asked(client: Any, world: World) -> tuple[int, int]:
    issue = world.gitea.add_issue(PROJECT, title="add() returns the difference", body="add(2, 3) gives -1",
                                  author="rep")
    number = issue["number"]
    world.gitea.add_label(PROJECT, number, TRIGGER, by="dev")
    raw, headers = world.gitea_webhook(number)
    job_id = int(client.post("/webhooks/gitea", content=raw, headers=headers).json()["job_id"])
    world.gitea.add_issue_comment(PROJECT, number, BEFORE, by="rep")
    world.gitea.add_issue_comment(PROJECT, number, "<!-- frogfix:00112233aabbccdd -->\n" + _question(job_id),
                                  by=world.gitea.bot["login"])
    _abstained(job_id)
    return number, job_id


def test_gitea_answer_requeues_the_job_and_reaches_the_task(client: Any, world: World) -> None:
    by = "dev"
    number, job_id = _gitea_asked(client, world)
    world.gitea.add_issue_comment(PROJECT, number, ANSWER, by="rep")
    comment = world.gitea.add_issue_comment(PROJECT, number, "/frogfix", by=by)
    data = json.loads(payload("gitea_issue_comment.json"))
    data["issue"]["number"] = number
    data["comment"].update(id=comment["id"], body="/frogfix", user=world.gitea.users[by])
    data["sender"] = world.gitea.users[by]
    body = json.dumps(data).encode()
    hook = gitea_headers(body, event="issue_comment", event_type="issue_comment", secret=GITEA_SECRET)

    r = client.post("/webhooks/gitea", content=body, headers=hook)

    assert r.status_code == 202 and r.json()["outcome"] == "job_requeued", r.text
    assert run_job(job_id) == "done"
    task = _task(world)
    assert ANSWER in task and BEFORE not in task and QUESTION not in task
    assert _job(job_id)[0].trigger_user == by
