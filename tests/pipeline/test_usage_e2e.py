"""Usage through the real pipeline: two attempts' figures per attempt row, their sums on the job,
the queue wait, and the same figures in the API, `manage.py show` and the trajectories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from app.db import session_scope
from app.jobs import records
from app.usage import UsageFigures
from tests.conftest import ADMIN_TOKEN
from tests.doubles.openai_server import Reply
from tests.pipeline.conftest import World, breaking_script, fixing_script
from tests.pipeline.test_pipeline_e2e import _gitlab_job, stored_trajectory
from worker.tasks import run_job

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def with_usage(script: list[Any], prompt: int, cached_step: int, completion: int) -> list[Reply]:
    """Each reply gets figures as SGLang with --enable-cache-report sends them: prompt grows, the cache serves most."""
    for i, reply in enumerate(script):
        reply.usage = {
            "prompt_tokens": prompt + 100 * i,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached_step * i},
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }
    return script


def test_usage_is_summed_per_attempt_and_per_job(client: Any, world: World) -> None:
    from tests.conftest import configure

    configure(world.env["monkeypatch"], attempts="2", verify_runs="1")
    first = with_usage(breaking_script(), prompt=1000, cached_step=900, completion=20)  # 2 replies
    second = with_usage(fixing_script(), prompt=2000, cached_step=1500, completion=30)  # 4 replies
    world.model._script[:] = first + second
    job_id = _gitlab_job(client, world)

    assert run_job(job_id) == "done"

    with session_scope() as s:
        job = records.get_job(s, job_id)
        attempts = records.job_attempts(s, job_id)
        a1, a2 = (UsageFigures.of(a) for a in attempts)
        total, wait = job.usage, job.queue_wait_seconds
    assert (a1.prompt_tokens, a1.cached_tokens, a1.completion_tokens, a1.model_calls, a1.steps) == (
        1000 + 1100, 900, 40, 2, 2)
    assert (a2.prompt_tokens, a2.cached_tokens, a2.completion_tokens, a2.model_calls, a2.steps) == (
        2000 + 2100 + 2200 + 2300, 1500 * 6, 120, 4, 4)
    assert a1.model_seconds > 0 and a2.model_seconds > 0
    # Sandbox time: the tool calls and the test runs (before once, then the patched run of each attempt).
    assert a1.sandbox_seconds > 0 and a2.sandbox_seconds > 0
    assert total.prompt_tokens == a1.prompt_tokens + a2.prompt_tokens
    assert total.cached_tokens == 900 + 9000 and total.model_calls == 6 and total.steps == 6
    assert abs(total.model_seconds - (a1.model_seconds + a2.model_seconds)) < 1e-6
    assert abs(total.sandbox_seconds - (a1.sandbox_seconds + a2.sandbox_seconds)) < 1e-6
    assert wait is not None and 0 <= wait < 60

    # The API carries the same figures, under the one usage shape.
    api = client.get(f"/api/jobs/{job_id}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert api["usage"] == total.to_dict() and api["queue_wait_seconds"] == round(wait, 3)
    assert api["usage"]["cached_share"] == round(9900 / total.prompt_tokens, 4)
    listed = client.get("/api/jobs", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()["items"]
    assert next(j for j in listed if j["id"] == job_id)["usage"]["prompt_tokens"] == total.prompt_tokens

    # Each trajectory records its replies' usage per step and its run's sums.
    saved = json.loads(stored_trajectory(attempts[1].trajectory_path).read_text())
    assert [s["usage"]["cached_tokens"] for s in saved["steps"]] == [0, 1500, 3000, 4500]
    assert saved["usage"]["prompt_tokens"] == a2.prompt_tokens and saved["usage"]["steps"] == 4
    # The trajectory's seconds are its tool calls' only (`tool_seconds`); the attempt's sandbox
    # seconds add its test runs, and only the attempt's figures carry that name.
    assert "sandbox_seconds" not in saved["usage"] and 0 < saved["usage"]["tool_seconds"] < a2.sandbox_seconds

    # `show` prints the table and `show --json` the same dicts.
    env = {**os.environ}
    shown = subprocess.run([sys.executable, str(MANAGE), "show", str(job_id)], env=env, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    table = shown.stdout[shown.stdout.index("\nusage\n"):]
    job_line = next(line for line in table.splitlines() if line.strip().startswith("job "))
    assert job_line.split()[1:5] == [str(total.prompt_tokens), str(total.cached_tokens),
                                     f"{total.cached_share:.0%}", str(total.completion_tokens)]
    assert "queue wait" in table
    as_json = json.loads(subprocess.run([sys.executable, str(MANAGE), "show", "--json", str(job_id)], env=env,
                                        capture_output=True, text=True, timeout=120).stdout)
    assert as_json["usage"] == total.to_dict()
    assert [a["usage"]["calls"] for a in as_json["attempts"]] == [2, 4]


def test_each_steps_usage_is_written_while_the_job_runs(client: Any, world: World) -> None:
    """Budgets read running attempts' tokens: the per-step write must land before the attempt ends."""
    from app.jobs.scheduler import tokens_today
    from app.models import utcnow
    from tests.conftest import configure
    from tests.pipeline.conftest import PROJECT

    configure(world.env["monkeypatch"], attempts="1", verify_runs="1")
    script = with_usage(fixing_script(), prompt=1000, cached_step=900, completion=20)
    seen: list[tuple[Any, ...]] = []

    def respond(index: int, body: bytes) -> Any:
        if index == 1:  # the model is asked for its second reply: step 0 is done, the attempt runs on
            with session_scope() as s:
                job = records.get_job(s, job_id)
                attempt = records.job_attempts(s, job_id)[-1]
                seen.append((job.status, attempt.status, attempt.prompt_tokens, attempt.cached_tokens,
                             attempt.completion_tokens, attempt.model_calls, job.prompt_tokens,
                             tokens_today(s, [("gitlab", PROJECT)], utcnow())))
        return script[index]

    world.model._responder = respond
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    assert seen == [("running", "running", 1000, 0, 20, 1, 1000, {("gitlab", PROJECT): 1020})]
