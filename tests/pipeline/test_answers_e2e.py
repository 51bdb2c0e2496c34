"""A job the real pipeline ran, answered in one schema (app/answers.py): the API's answer validates against its
served OpenAPI document, reads back as itself, and `show --json` prints the same answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.answers import JobDetailAnswer
from tests.conftest import ADMIN_TOKEN
from tests.pipeline.conftest import World, fixing_script
from tests.pipeline.test_pipeline_e2e import _gitlab_job
from worker.tasks import run_job

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"
AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_a_finished_jobs_answer_is_the_one_schema(client: Any, world: World) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    world.model._script[:] = fixing_script()
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"

    detail = client.get(f"/api/jobs/{job_id}", headers=AUTH).json()
    schema = client.get("/openapi.json", headers=AUTH).json()
    ref = schema["paths"]["/api/jobs/{job_id}"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    jsonschema.Draft202012Validator({**ref, "components": schema["components"]}).validate(detail)
    assert JobDetailAnswer.model_validate(detail).as_json() == detail

    [attempt] = [a for a in detail["attempts"] if a["chosen"]]
    assert attempt["evidence"]["level"] in ("reproduced", "failed_before") and attempt["usage"]["calls"] > 0
    tests = attempt["tests"]
    assert set(tests) == {"command", "before", "after", "flaky", "reproduction"}
    assert isinstance(tests["after"], list) and tests["after"][0]["exit_code"] == 0
    # The job's own tests, evidence and patch are its chosen attempt's, as `fix --json` has them.
    assert (detail["tests"], detail["evidence"], detail["patch"]) == (tests, attempt["evidence"], attempt["patch"])
    assert detail["patch"] and detail["usage"]["calls"] == sum(a["usage"]["calls"] for a in detail["attempts"])

    shown = subprocess.run([sys.executable, str(MANAGE), "show", "--json", str(job_id)], env={**os.environ},
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == detail
