"""A claimed job beats from the claim on: what runs before its pipeline (importing it, building its
clients) can take seconds on a loaded worker, and a claim without a heartbeat that long was taken
for a dead worker's and run a second time."""

from __future__ import annotations

import time
from typing import Any

import pytest

from app.db import session_scope
from app.forge.webhook import WebhookEvent
from app.jobs import intake, records
from app.sweep import sweep_once
from tests.conftest import configure
from worker.job import runs
from worker.tasks import run_job


def _queued() -> int:
    event = WebhookEvent("gitlab", "hb-1", "Issue Hook", "start", "t", project="a/b", issue=1)  # type: ignore[arg-type]
    with session_scope() as s:
        job_id = intake.record_delivery(s, event).job_id
    assert job_id is not None
    return job_id


def test_a_claim_that_is_slow_to_start_its_pipeline_keeps_beating_and_is_not_requeued(
    frogfix_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    configure(frogfix_env["monkeypatch"], stale_job_seconds="4")  # a beat every second
    job_id = _queued()
    seen: list[tuple[object, str]] = []

    def slow_start(claimed: int, **_: Any) -> str:
        """Stands in for a pipeline whose start takes twice the stale limit."""
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            with session_scope() as s:
                row = records.get_job(s, claimed)
                seen.append((row.heartbeat_at, row.status))
            assert sweep_once() is not None  # the sweep runs meanwhile, as it does in production
            time.sleep(0.5)
        return "done"

    monkeypatch.setattr(runs, "run", slow_start)
    assert run_job(job_id) == "done"
    beats = {beat for beat, _ in seen if beat is not None}
    assert len(beats) >= 3, seen  # stamped again and again while the pipeline had not started
    assert all(status == "running" for _, status in seen), seen  # never taken back for a dead worker's
    with session_scope() as s:
        assert records.get_job(s, job_id).run == 1
