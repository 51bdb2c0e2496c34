"""Forge jobs as eval tasks: picked from the job records, re-run from their mirror, never published."""

from __future__ import annotations

from typing import Any

import pytest

from app.jobs.evaluations import parse_selector
from app.settings import get_settings
from tests.eval.conftest import Candidate
from tests.pipeline.conftest import PROJECT, TRIGGER, World, breaking_script
from worker.evaluate import EvalOptions, evaluate, load_report, select_tasks
from worker.tasks import run_job

pytestmark = pytest.mark.bwrap


def _job(client: Any, world: World, expected: str) -> str:
    issue = world.gitlab.add_issue(PROJECT, title="add() returns the difference", author="rep")
    world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
    body, headers = world.gitlab_webhook(issue["iid"])
    response = client.post("/webhooks/gitlab", content=body, headers=headers)
    assert response.status_code == 202, response.text
    job_id = int(response.json()["job_id"])
    assert run_job(job_id) == expected
    return str(job_id)


def test_forge_jobs_are_selected_rerun_and_nothing_is_published(client: Any, world: World) -> None:
    done = _job(client, world, "done")
    world.model._script[:] = breaking_script()  # its patch fails the tests: a no_fix job with a failing `before`
    no_fix = _job(client, world, "no_fix")
    settings = get_settings()
    assert [t["key"] for t in select_tasks(parse_selector(""), settings)] == [done, no_fix]
    assert [t["key"] for t in select_tasks(parse_selector("status=no_fix"), settings)] == [no_fix]
    assert [t["key"] for t in select_tasks(parse_selector(f"{done}, project={PROJECT}"), settings)] == [done]
    assert select_tasks(parse_selector("project=other/x"), settings) == []
    assert select_tasks(parse_selector("until=2000-01-01"), settings) == []

    calls, notes, mrs = world.model.count, len(world.gitlab.notes), world.gitlab.open_mrs(PROJECT)
    candidate = Candidate({(no_fix, 1)})  # fixes the job the recorded run did not, misses the one it did
    evaluation_id, status, errors = evaluate(EvalOptions("cand", "", attempts=1), models=candidate)
    assert (status, errors) == ("finished", [])
    report = load_report(evaluation_id)
    assert report["gained"] == [no_fix] and report["lost"] == [done]
    assert report["recorded"]["tasks_solved"] == 1 and report["candidate"]["tasks_solved"] == 1
    # Never published, and the production model server was not asked.
    assert world.model.count == calls
    assert len(world.gitlab.notes) == notes and world.gitlab.open_mrs(PROJECT) == mrs
