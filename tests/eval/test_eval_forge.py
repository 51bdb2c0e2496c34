"""Forge jobs as eval tasks: picked from the job records, re-run from their mirror, never published."""

from __future__ import annotations

from typing import Any

import pytest

from app.jobs.evaluations import parse_selector
from app.settings import get_settings
from tests.eval.conftest import Candidate
from tests.pipeline.conftest import PROJECT, TRIGGER, World, breaking_script
from worker.commands.evaluate import EvalOptions, evaluate, load_report, select_tasks
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


def _mr_iid(world: World, job_id: str) -> int:
    from app.db import session_scope
    from app.forge.api import mr_number_from_url
    from app.models import Job

    with session_scope() as session:
        job = session.get(Job, int(job_id))
        assert job is not None
        number = mr_number_from_url(job.mr_url)
    assert number is not None
    return number


def test_human_verdicts_are_read_from_the_forge_once_and_an_outage_leaves_unknown(
    client: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Merged MRs the candidate solves (1 of 2), closed-unmerged ones it "solves" (1 of 1), and an MR the
    forge would not tell about (503s) counted unknown; a resume asks the forge nothing again."""
    from tests.conftest import configure
    from tests.pipeline.conftest import fixing_script

    jobs = []
    for _ in range(4):
        world.model._script[:] = fixing_script()
        jobs.append(_job(client, world, "done"))
    merged_a, merged_b, closed, outage = jobs
    world.gitlab.set_mr_state(PROJECT, _mr_iid(world, merged_a), "merged", by="dev")
    world.gitlab.set_mr_state(PROJECT, _mr_iid(world, merged_b), "merged", by="dev")
    world.gitlab.set_mr_state(PROJECT, _mr_iid(world, closed), "closed", by="dev")
    configure(monkeypatch, forge_retry_budget_seconds="1")
    world.gitlab.fail_next(50, 503, method="GET", path_contains=f"/merge_requests/{_mr_iid(world, outage)}")

    candidate = Candidate({(merged_a, 1), (closed, 1), (outage, 1)})  # misses merged_b
    evaluation_id, status, errors = evaluate(EvalOptions("cand", "", attempts=1), models=candidate)
    assert (status, errors) == ("finished", [])
    report = load_report(evaluation_id)
    assert report["human"] == {"merged": 2, "merged_solved": 1, "closed_unmerged": 1, "closed_unmerged_solved": 1,
                               "open": 0, "unknown": 1}
    assert {r["task"]: r["human"] for r in report["tasks"]} == {
        merged_a: "merged", merged_b: "merged", closed: "closed", outage: "unknown"}
    from app.evaluation_report import to_markdown

    assert 'Human verdicts: 1 of 2 merged MRs solved; 1 of 1 closed-unmerged MRs "solved"' in to_markdown(report)

    asked = len(world.gitlab.calls("GET", "/merge_requests/"))
    world.gitlab.faults.clear()
    world.gitlab.set_mr_state(PROJECT, _mr_iid(world, outage), "merged", by="dev")
    evaluate(EvalOptions("cand", "", attempts=1), resume=evaluation_id, models=candidate)
    assert len(world.gitlab.calls("GET", "/merge_requests/")) == asked  # the verdicts are frozen in the row
    assert load_report(evaluation_id)["human"]["unknown"] == 1


def test_a_candidate_elsewhere_never_receives_the_production_key(
    client: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--base-url` other than production: FROGFIX_EVAL_API_KEY or `--api-key` or nothing, never MODEL_KEY."""
    from tests.conftest import configure
    from tests.doubles.openai_server import ScriptedOpenAIServer, assistant
    from tests.pipeline.conftest import MODEL_KEY

    job = _job(client, world, "done")
    give_up = [assistant("I cannot find the bug.") for _ in range(3)]
    with ScriptedOpenAIServer(give_up) as candidate:
        for api_key, env_key in ((None, ""), (None, "eval-CANARY-key-1"), ("flag-CANARY-key-2", "eval-CANARY-key-1")):
            configure(monkeypatch, eval_api_key=env_key)
            _id, status, errors = evaluate(EvalOptions(f"cand-{env_key}-{api_key}", candidate.base_url,
                                                       selector=job, api_key=api_key))
            assert (status, errors) == ("finished", [])
        sent = [h.get("Authorization") or h.get("authorization") for h in candidate.headers]
    assert len(sent) == 3 and not any(MODEL_KEY in str(h) for h in sent)
    assert sent[1:] == ["Bearer eval-CANARY-key-1", "Bearer flag-CANARY-key-2"]
    assert sent[0] in (None, "Bearer EMPTY")
    # The production URL itself is the one place the production key goes.
    world.model._script[:] = [assistant("I cannot find the bug.")]
    production_url = get_settings().model_base_url
    _id, status, errors = evaluate(EvalOptions("prod", production_url, selector=job))
    assert (status, errors) == ("finished", [])
    last = world.model.headers[-1]
    assert (last.get("Authorization") or last.get("authorization")) == f"Bearer {MODEL_KEY}"
