"""A real worker process against a real Redis: committed jobs are received; a broker outage loses nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import intake, records
from app.models import FINAL_STATUSES
from app.sweep import sweep_once
from tests.conftest import configure
from tests.servers import Redis, wait_until
from tests.webhook_requests import gitlab_headers, payload

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def redis_env(frogfix_env: dict[str, Any], redis: Redis) -> dict[str, Any]:
    configure(frogfix_env["monkeypatch"], broker_url=redis.url)
    return frogfix_env


@pytest.fixture
def worker_process(redis_env: dict[str, Any], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "worker", "--pool", "solo"],
        env=dict(os.environ),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
    )
    yield proc
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def _job(job_id: int) -> Any:
    with session_scope() as s:
        job = records.get_job(s, job_id)
        return job, [e.kind for e in records.job_events(s, job_id)]


def test_worker_receives_the_task_for_a_committed_job(client: Any, worker_process: Any) -> None:
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    assert r.status_code == 202
    job_id = r.json()["job_id"]
    wait_until(lambda: _job(job_id)[0].status in FINAL_STATUSES, timeout=90)  # the worker may still be starting
    job, kinds = _job(job_id)
    assert kinds[:2] == ["created", "claimed"]
    # No forge is configured here, so the pipeline ends the job with a clear reason.
    assert job.status == "failed" and "FROGFIX_GITLAB_URL" in (job.error or "") and job.run == 1


def test_broker_outage_keeps_the_job_queued_and_the_sweep_sends_it_later(
    client: Any, redis: Redis, worker_process: Any
) -> None:
    redis.stop()
    try:
        started = time.monotonic()
        r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
        assert r.status_code == 202, r.text  # the delivery is accepted: the job is safe in the database
        # the bounded publish (app/queue.py) gives up in well under a second; 5 s leaves a loaded runner room
        assert time.monotonic() - started < 5, "a broker outage must not stall webhook answers"
        job_id = r.json()["job_id"]
        job, _ = _job(job_id)
        assert job.status == "queued" and job.last_enqueued_at is None and job.enqueue_count == 0
        assert sweep_once(older_than_s=0) == (1, 0)  # still down: found, not sent, not lost
        time.sleep(1)
        assert _job(job_id)[0].status == "queued"
    finally:
        redis.start()
    assert sweep_once(older_than_s=0) == (1, 1)
    wait_until(lambda: _job(job_id)[0].status in FINAL_STATUSES, timeout=60)
    job, kinds = _job(job_id)
    assert kinds.count("claimed") == 1 and job.enqueue_count == 1
    assert sweep_once(older_than_s=0) == (0, 0)  # nothing left to send


def test_redelivered_task_does_not_run_a_job_twice(redis_env: dict[str, Any]) -> None:
    from app.forge.webhook import WebhookEvent
    from worker.tasks import run_job

    event = WebhookEvent("gitlab", "d-1", "Issue Hook", "start", "test", project="a/b", issue=1)
    with session_scope() as s:
        job_id = intake.record_delivery(s, event).job_id
    assert job_id is not None
    assert run_job(job_id) == "failed"  # no forge configured: a clear, final failure
    assert run_job(job_id) == "not_claimed"
    assert _job(job_id)[1].count("claimed") == 1
