"""One schema per answer (app/answers.py): the one `tests` shape, older stored shapes read into it, and the
OpenAPI document of /api/jobs and /api/jobs/{id} listing a job's real fields."""

from __future__ import annotations

from typing import Any

import pytest

from app.answers import AttemptAnswer, FixAnswer, JobAnswer, JobDetailAnswer, TestRunAnswer, TestsAnswer
from app.models import Job
from tests.conftest import ADMIN_TOKEN
from tests.webhook_requests import gitlab_headers, payload

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BEFORE = {"exit_code": 1, "log": "1 failed, 1 passed", "timed_out": False, "seconds": 0.5,
          "counts": {"failed": 1, "passed": 1}}
RUN = {"exit_code": 0, "log": "2 passed", "timed_out": False, "seconds": 0.25, "counts": {"passed": 2}}
FLAKY_RUN = {"exit_code": 1, "log": "1 failed", "timed_out": False, "seconds": 0.25, "counts": {"failed": 1}}
VERDICT = {"level": "failed_before", "fail_to_pass": ["t.py::test_add"], "pass_to_fail": [], "still_failing": [],
           "flaky": [], "reproduction": {"tests": [], "failed_on_base": False, "ran": False, "files": []},
           "per_test": True, "reason": "a failing test passes with the patch", "passing": True, "checks": []}


@pytest.mark.parametrize(
    ("stored", "exit_codes"),
    [
        # `fix --json` before the one shape: `after` the first patched run, `after_runs` every one.
        ({"command": "pytest", "before": BEFORE, "after": RUN, "after_runs": [RUN, FLAKY_RUN], "flaky": True,
          "reproduction": None}, [0, 1]),
        # Older still: one `after` run and no `after_runs`.
        ({"command": "pytest", "before": BEFORE, "after": RUN}, [0]),
        # No patched run (the agent found nothing): `after` null, `after_runs` empty.
        ({"command": "pytest", "before": BEFORE, "after": None, "after_runs": []}, []),
        # A forge attempt's row: already the list, with its verdict kept beside the runs.
        ({"command": "pytest", "before": BEFORE, "after": [RUN, FLAKY_RUN], "flaky": True, "evidence": VERDICT},
         [0, 1]),
        # Runs written before `seconds`, `counts`, `tampered` and `checks`.
        ({"command": "pytest", "before": {"exit_code": 1}, "after": [{"exit_code": 0, "log": "ok"}]}, [0]),
    ],
    ids=["fix-after-runs", "fix-one-after", "fix-no-run", "forge-attempt", "oldest-runs"],
)
def test_every_stored_tests_shape_is_read_into_the_one_shape(stored: dict[str, Any], exit_codes: list[int]) -> None:
    read = TestsAnswer.read(stored)
    assert read is not None
    shown = read.as_json()
    assert set(shown) == {"command", "before", "after", "flaky", "reproduction"}
    assert [run["exit_code"] for run in shown["after"]] == exit_codes
    assert all(set(run) == set(TestRunAnswer.model_fields) for run in [shown["before"], *shown["after"]])
    assert shown["before"]["exit_code"] == stored["before"]["exit_code"]
    assert TestsAnswer.model_validate(shown).as_json() == shown  # the one shape reads back as itself
    assert TestsAnswer.read(None) is None and TestsAnswer.read({}) is None


def test_an_attempts_verdict_stored_in_its_tests_is_its_evidence() -> None:
    stored = {"number": 2, "run": 1, "status": "verified", "chosen": True, "steps": 4,
              "tests": {"command": "pytest", "before": BEFORE, "after": [RUN], "flaky": False, "evidence": VERDICT}}
    attempt = AttemptAnswer.model_validate(stored)
    assert attempt.evidence is not None and attempt.evidence.as_json() == VERDICT
    assert attempt.tests is not None and "evidence" not in attempt.tests.as_json()
    assert AttemptAnswer.model_validate(attempt.as_json()) == attempt  # round trip


def test_a_fix_answer_of_the_old_shape_reads_as_the_one_shape() -> None:
    old = {"status": "fixed", "exit_reason": "agent", "steps": 4, "patch": "diff", "job_id": 7,
           "tests": {"command": "pytest", "before": BEFORE, "after": RUN, "after_runs": [RUN, RUN], "flaky": False,
                     "reproduction": None},
           "evidence": VERDICT, "trajectory": "t.json", "error": None, "flags": [], "summary": "s",
           "usage": {"prompt_tokens": 10, "completion_tokens": 2, "cached_tokens": 5, "cached_share": 0.5,
                     "calls": 1, "steps": 4, "model_seconds": 1.0, "sandbox_seconds": 2.0},
           "environment": None, "attempts": [], "selection": None}
    answer = FixAnswer.model_validate(old).as_json()
    assert answer["tests"]["after"] == [TestsAnswer.model_validate({"after": [RUN]}).as_json()["after"][0]] * 2
    assert "after_runs" not in answer["tests"] and answer["evidence"] == VERDICT and answer["usage"] == old["usage"]


def test_a_job_row_is_the_job_answer() -> None:
    job = Job(id=7, forge="gitlab", project="acme/calc", issue=3, status="queued", run=2, steps=0,
              queue_wait_seconds=1.23456, flags=None, selection={"chosen": 1, "attempts": 2, "why": "w", "ranked": []})
    answer = JobAnswer.of(job).as_json()
    assert (answer["id"], answer["forge"], answer["attempt"], answer["run"]) == (7, "gitlab", 2, 2)
    assert answer["flags"] == [] and answer["queue_wait_seconds"] == 1.235
    assert answer["usage"]["prompt_tokens"] == 0 and answer["selection"]["chosen"] == 1
    assert JobAnswer.model_validate(answer).as_json() == answer


def _resolved(schema: dict[str, Any], ref: str) -> dict[str, Any]:
    name = ref.rsplit("/", 1)[-1]
    return dict(schema["components"]["schemas"][name])


def _properties(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """A schema node's properties, following a $ref or the non-null branch of an anyOf."""
    if "$ref" in node:
        node = _resolved(schema, node["$ref"])
    for branch in node.get("anyOf", []):
        if "$ref" in branch:
            node = _resolved(schema, branch["$ref"])
    return dict(node.get("properties", {}))


def _response(schema: dict[str, Any], path: str) -> dict[str, Any]:
    return dict(schema["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]["schema"])


def test_the_openapi_document_lists_a_jobs_fields(client: Any) -> None:
    schema = client.get("/openapi.json", headers=AUTH).json()
    job = _properties(schema, _response(schema, "/api/jobs/{job_id}"))
    wanted = {"id", "status", "forge", "project", "issue", "trigger_user", "mr_url", "created_at", "updated_at",
              "attempts", "events", "thread", "tests", "evidence", "usage", "queue_wait_seconds", "hold_reason"}
    assert wanted <= set(job), wanted - set(job)
    attempt = _properties(schema, job["attempts"]["items"])
    assert {"number", "status", "tests", "evidence", "usage", "patch"} <= set(attempt)
    tests = _properties(schema, attempt["tests"])
    assert set(tests) == {"command", "before", "after", "flaky", "reproduction"}
    assert tests["after"]["type"] == "array"  # the one shape: every patched run
    run = _properties(schema, tests["after"]["items"])
    assert {"exit_code", "log", "timed_out", "seconds", "counts"} <= set(run)
    usage = _properties(schema, job["usage"])
    assert {"prompt_tokens", "completion_tokens", "cached_tokens", "calls", "steps", "model_seconds"} <= set(usage)
    listing = _properties(schema, _response(schema, "/api/jobs"))
    assert set(listing) == {"items", "total"}
    item = _properties(schema, listing["items"]["items"])
    assert {"id", "status", "forge", "project", "issue", "usage"} <= set(item) and "attempts" not in item


def test_a_real_answer_validates_against_the_served_schema(client: Any) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    job_id = r.json()["job_id"]
    schema = client.get("/openapi.json", headers=AUTH).json()
    for path, answer in ((f"/api/jobs/{job_id}", "/api/jobs/{job_id}"), ("/api/jobs", "/api/jobs")):
        body = client.get(path, headers=AUTH).json()
        document = {**_response(schema, answer), "components": schema["components"]}
        jsonschema.Draft202012Validator(document).validate(body)
    detail = client.get(f"/api/jobs/{job_id}", headers=AUTH).json()
    assert JobDetailAnswer.model_validate(detail).as_json() == detail
