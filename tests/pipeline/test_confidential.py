"""A GitLab issue made confidential after its webhook: checked again at admission and before publishing.

The webhook drops confidential issues, but an issue can be marked confidential at any time after
it: between the webhook and the worker, or while the agent runs. Each test flips `confidential` on
the GitLab double at one of those points and follows the job through the real pipeline, the real
git server and the scripted model.
"""

from __future__ import annotations

import io
import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import read_model, records
from app.logs import configure_logging
from app.settings import get_settings
from tests.conftest import configure
from tests.pipeline.conftest import PROJECT, TRIGGER, World, fixing_script
from tests.pipeline.test_pipeline_e2e import stored_trajectory
from worker.tasks import run_job

PUBLIC_TITLE = "PUBLIC-CANARY-7d1e add() returns the difference"
PUBLIC_BODY = "PUBLIC-CANARY-body-3a9c: add(2, 3) gives -1"
SECRET_TITLE = "SECRET-CANARY-5b2f admin reset bypass"
SECRET_BODY = "SECRET-CANARY-body-9e4d: POST /reset?user=admin skips the token check"


@pytest.fixture
def logged(world: World) -> Iterator[io.StringIO]:
    """Everything the worker logs during the test, as one JSON-lines stream."""
    stream = io.StringIO()
    configure_logging("DEBUG", get_settings().secret_values(), stream=stream)
    yield stream


def _labelled_issue(client: Any, world: World) -> tuple[int, int]:
    """A public issue labelled by a developer and the job its webhook made: `(iid, job_id)`."""
    issue = world.gitlab.add_issue(PROJECT, title=PUBLIC_TITLE, description=PUBLIC_BODY, author="rep")
    world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
    raw, headers = world.gitlab_webhook(issue["iid"])
    body = json.loads(raw)
    body["object_attributes"].update(title=PUBLIC_TITLE, description=PUBLIC_BODY)
    r = client.post("/webhooks/gitlab", content=json.dumps(body).encode(), headers=headers)
    assert r.status_code == 202, r.text
    job_id = int(r.json()["job_id"])
    with session_scope() as s:
        assert records.get_job(s, job_id).title == PUBLIC_TITLE  # the webhook's copy, stored at intake
    return issue["iid"], job_id


def _no_branch_pushed(world: World) -> bool:
    refs = subprocess.run(
        ["git", "--git-dir", str(world.bare("gitlab")), "for-each-ref", "refs/heads/frogfix"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return refs == ""


def _job_text(job_id: int) -> tuple[Any, str]:
    """The job row and everything FrogFix recorded for it (fields, events, attempts) as one string."""
    with session_scope() as s:
        job = records.get_job(s, job_id)
        answer = read_model.job_detail(s, job_id).as_json()  # the job, its events and attempts, as the API answers
        stored = [(a.tests, a.flags) for a in records.job_attempts(s, job_id)]  # and the columns as stored
    return job, json.dumps([answer, stored], default=str)


def _model_requests(world: World) -> str:
    return json.dumps([world.model.request_json(i) for i in range(world.model.count)])


def test_made_confidential_after_the_webhook_runs_no_agent_and_says_nothing_of_it(
    client: Any, world: World, logged: io.StringIO
) -> None:
    iid, job_id = _labelled_issue(client, world)
    world.gitlab.set_confidential(PROJECT, iid, title=SECRET_TITLE, description=SECRET_BODY)

    assert run_job(job_id) == "rejected"

    job, recorded = _job_text(job_id)
    assert job.status == "rejected" and "confidential" in (job.error or "")
    assert job.title is None and job.body is None  # the copy the webhook brought is not kept either
    assert world.model.count == 0 and world.gitlab.open_mrs(PROJECT) == [] and _no_branch_pushed(world)
    [note] = [n["body"] for n in world.gitlab.notes]  # no "working on it"; one word on why not
    assert "confidential" in note
    said = recorded + world.gitlab.sent_text() + logged.getvalue()
    for canary in (SECRET_TITLE, SECRET_BODY, PUBLIC_TITLE, PUBLIC_BODY):
        assert canary not in said, canary
    assert "SECRET-CANARY" not in said and "PUBLIC-CANARY" not in said


def test_made_confidential_while_the_agent_runs_pushes_nothing_and_opens_no_mr(
    client: Any, world: World, logged: io.StringIO
) -> None:
    script = fixing_script()
    iid, job_id = _labelled_issue(client, world)

    def respond(index: int, body: bytes) -> Any:
        if index == len(script) - 1:  # the agent's last turn: the issue becomes confidential meanwhile
            world.gitlab.set_confidential(PROJECT, iid, title=SECRET_TITLE, description=SECRET_BODY)
        return script[index]

    world.model._responder = respond

    assert run_job(job_id) == "rejected"

    job, recorded = _job_text(job_id)
    assert job.status == "rejected" and "confidential" in (job.error or "")
    assert job.title is None and job.body is None
    assert world.gitlab.open_mrs(PROJECT) == [] and _no_branch_pushed(world)
    assert world.gitlab.calls("POST", "merge_requests") == []
    started, refused = [n["body"] for n in world.gitlab.notes]
    assert "working on this issue" in started and "confidential" in refused and "published nothing" in refused
    # The agent ran while the issue was public (its trajectory keeps that); the confidential text reached nothing.
    with session_scope() as s:
        trajectories = "".join(
            stored_trajectory(a.trajectory_path).read_text()
            for a in records.job_attempts(s, job_id)
            if a.trajectory_path
        )
    said = recorded + world.gitlab.sent_text() + logged.getvalue() + _model_requests(world) + trajectories
    assert "SECRET-CANARY" not in said
    assert PUBLIC_TITLE not in job.error and PUBLIC_TITLE not in refused


def test_with_confidential_issues_allowed_it_publishes(client: Any, world: World) -> None:
    configure(world.env["monkeypatch"], gitlab_allow_confidential="true")
    iid, job_id = _labelled_issue(client, world)
    world.gitlab.set_confidential(PROJECT, iid)  # before admission, and still so at publishing

    assert run_job(job_id) == "done"

    job, _ = _job_text(job_id)
    [mr] = world.gitlab.open_mrs(PROJECT)
    assert job.mr_url == mr["web_url"] and job.title == PUBLIC_TITLE
    assert not _no_branch_pushed(world)
