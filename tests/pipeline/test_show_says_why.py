"""`manage.py show` says in one line why a forge job failed (issue 26), for jobs the real pipeline ended.

The world is tests/pipeline/conftest.py's: GitLab and Gitea API doubles, a git server and a scripted
model, all on loopback; the job runs through `run_job`, and `show` runs as its own process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import configure
from tests.doubles.openai_server import Status
from tests.fix.test_fix_says_why import shown_why
from tests.pipeline.conftest import World
from tests.pipeline.test_pipeline_e2e import _gitlab_job, _job
from worker.tasks import run_job

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def show(job_id: int) -> str:
    proc = subprocess.run([sys.executable, str(MANAGE), "show", str(job_id)], env=dict(os.environ),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout




def test_a_rejected_forge_token_is_why(client: Any, world: World) -> None:
    job_id = _gitlab_job(client, world, title="bug")
    configure(world.env["monkeypatch"], gitlab_token="glpat-not-the-right-one")
    assert run_job(job_id) == "failed"
    job, _, _ = _job(job_id)
    assert "HTTP 401" in (job.error or "")
    text = show(job_id)
    assert text.startswith(f"job {job_id}: failed\n")
    assert shown_why(text) == (
        "the forge (GitLab) answered 401 to read issue #1 of acme/calc: the FrogFix token was rejected;"
        " check FROGFIX_GITLAB_TOKEN"
    )
    assert "  error      GitLab read issue #1 of acme/calc: HTTP 401" in text  # and the forge's own words below


def test_an_unreachable_forge_is_why(client: Any, world: World) -> None:
    job_id = _gitlab_job(client, world, title="bug")
    world.gitlab.close()
    assert run_job(job_id) == "failed"
    job, _, _ = _job(job_id)
    assert (job.error or "").startswith("the forge or git server kept failing: GitLab")
    why = shown_why(show(job_id))
    assert why.startswith("the forge (GitLab) could not be reached for read issue #1 of acme/calc (ConnectionError")
    assert "gave up after" in why and why.endswith("; run ./manage.py doctor")


def test_a_model_server_that_keeps_failing_is_why_with_its_url(client: Any, world: World) -> None:
    world.model._script[:] = [Status(503, {"error": "down"})] * 10
    job_id = _gitlab_job(client, world, title="bug")
    assert run_job(job_id) == "failed"
    text = show(job_id)
    assert shown_why(text) == (
        f"the model server at {world.model.base_url} kept failing (HTTP 503: down); run ./manage.py doctor"
    )
    assert "  agent      model unreachable after 0 steps; runs 1" in text
    attempt = next(line for line in text.splitlines() if line.startswith("  1.1 "))
    assert "model unreachable after 0 steps" in attempt and "llm_query_error" not in text.split("timeline")[0]
