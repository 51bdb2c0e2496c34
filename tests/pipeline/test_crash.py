"""Crash safety with a real Redis and real worker processes: SIGKILL in the middle of a job."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from app import jobs
from app.db import session_scope
from app.models import FINAL_STATUSES
from app.sweep import sweep_once
from tests.conftest import configure
from tests.doubles.openai_server import ScriptItem
from tests.pipeline.conftest import PROJECT, TRIGGER, World, fixing_script
from tests.processes import Workers, sandboxes_running
from tests.servers import Redis, wait_until


def _state(job_id: int) -> tuple[str, list[str], int]:
    with session_scope() as s:
        job = jobs.get_job(s, job_id)
        return job.status, [e.kind for e in jobs.job_events(s, job_id)], job.attempt


def _sandboxes_running() -> list[str]:
    return sandboxes_running(os.environ["FROGFIX_WORKSPACE_DIR"])


def test_sigkill_mid_job_then_recovery_opens_exactly_one_mr(
    client: Any, world: World, redis: Redis, workers: Workers
) -> None:
    script = fixing_script()
    slow_first = {"done": False}

    def respond(index: int, body: bytes) -> ScriptItem:
        turn = sum(1 for m in json.loads(body)["messages"] if m["role"] == "assistant")
        if turn == 1 and not slow_first["done"]:  # give the test time to kill the worker mid-run
            slow_first["done"] = True
            time.sleep(4)
        return script[turn]

    world.model._responder = respond
    configure(
        world.env["monkeypatch"],
        broker_url=redis.url,
        stale_job_seconds="3",
        requeue_after_seconds="1",
        model_timeout_seconds="30",
    )
    first = workers.start()
    issue = world.gitlab.add_issue(PROJECT, title="add() returns the difference", author="rep")
    world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
    body, headers = world.gitlab_webhook(issue["iid"])
    job_id = client.post("/webhooks/gitlab", content=body, headers=headers).json()["job_id"]

    wait_until(lambda: world.model.count >= 2, timeout=60)  # the agent is mid-run, inside its sandbox
    assert _state(job_id)[0] == "running"
    workers.kill(first)
    time.sleep(0.5)
    assert _sandboxes_running() == [], "the sandbox outlived its worker"

    workers.start()

    def recovered() -> bool:
        sweep_once()  # finds the stale job (no heartbeat for 3 s) and sends it again
        return _state(job_id)[0] in FINAL_STATUSES

    wait_until(recovered, timeout=120, interval=1.0)
    status, kinds, runs = _state(job_id)
    assert status == "done", kinds
    assert "requeued" in kinds and runs == 2 and kinds.count("done") == 1
    with session_scope() as s:
        attempts = [(a.run, a.status) for a in jobs.job_attempts(s, job_id)]
    assert attempts == [(1, "failed"), (2, "verified")]  # the dead run's attempt is not left "running"
    assert len(world.gitlab.open_mrs(PROJECT)) == 1
    branch = f"frogfix/issue-{issue['iid']}"
    shown = subprocess.run(
        ["git", "--git-dir", str(world.bare("gitlab")), "show", f"{branch}:calc.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "return a + b" in shown
    assert _sandboxes_running() == []
    workspaces = Path(os.environ["FROGFIX_WORKSPACE_DIR"])
    assert [p.name for p in workspaces.iterdir() if p.name != ".pool"] == []  # the pool keeps ready ones
