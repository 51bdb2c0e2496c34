"""An evaluation shares the model slots with production and lets production go first."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.models import Job
from tests.eval.conftest import Candidate, recorded_job
from worker.evaluate import EvalOptions, SlotGate, evaluate


def _job(status: str, issue: int = 1) -> int:
    with session_scope() as session:
        job = Job(forge="gitlab", project="acme/calc", issue=issue, status=status)
        session.add(job)
        session.flush()
        return job.id


def _set(job_id: int, status: str) -> None:
    with session_scope() as session:
        session.get(Job, job_id).status = status  # type: ignore[union-attr]


def test_the_gate_takes_a_slot_only_when_no_production_job_waits(frogfix_env: dict[str, Any]) -> None:
    gate = SlotGate(2, poll_seconds=0.01)
    job = _job("queued")
    assert not gate.try_acquire()  # a queued production job: the evaluation waits, whatever the free slots
    _set(job, "running")
    assert gate.try_acquire()  # one slot busy with production, one free
    assert not gate.try_acquire()  # both slots held now
    gate.release()
    _set(job, "done")
    assert gate.try_acquire() and gate.try_acquire() and not gate.try_acquire()
    with pytest.raises(Exception, match="at least one model slot"):
        SlotGate(0)
    stopped = SlotGate(1, poll_seconds=0.01, stop=lambda: True)
    assert not stopped.acquire()  # asked to stop while waiting: gives up rather than blocks


@pytest.mark.bwrap
def test_a_queued_production_job_waits_for_at_most_the_one_running_eval_attempt(
    local_env: dict[str, Any], tmp_path: Path
) -> None:
    task = recorded_job(tmp_path / "a", solved=True)
    started: dict[int, float] = {}
    production: dict[str, float] = {}

    def production_worker(job_id: int) -> None:
        """A worker that claims the job a moment after it is queued and holds the model slot for 2 s."""
        time.sleep(0.3)
        _set(job_id, "running")
        production["claimed"] = time.monotonic()
        time.sleep(2.0)
        _set(job_id, "done")
        production["done"] = time.monotonic()

    def on_attempt(_key: str, attempt: int) -> None:
        started[attempt] = time.monotonic()
        if attempt == 1:  # a production job arrives while the first eval attempt holds the one slot
            production["queued"] = time.monotonic()
            threading.Thread(target=production_worker, args=(_job("queued"),), daemon=True).start()

    candidate = Candidate({(task, 1), (task, 2)})
    candidate.on_attempt = on_attempt
    _, status, _ = evaluate(EvalOptions("candidate-s", "", attempts=2), models=candidate, poll_seconds=0.02)
    assert status == "finished"
    # The job was queued after attempt 1 began (the one slot it may wait for); attempt 2 began
    # only once the production job had been claimed and had given its slot back.
    assert started[1] <= production["queued"] < production["claimed"]
    assert started[2] >= production["done"]


def test_a_job_held_by_its_projects_budget_does_not_stop_the_evaluation(frogfix_env: dict[str, Any]) -> None:
    """A held job cannot start whatever eval does, so only runnable queued jobs count as waiting."""
    said: list[str] = []
    gate = SlotGate(1, poll_seconds=0.01, progress=said.append)
    held = _job("queued")
    with session_scope() as session:
        session.get(Job, held).hold_reason = "waiting for tokens: the project used its tokens today"  # type: ignore[union-attr]
    assert gate.try_acquire()  # only a held job is queued: the slot is free for eval
    gate.release()
    _job("queued", issue=2)  # a runnable production job waits: eval waits, and says so once
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    gate.stop = stop
    assert not gate.acquire()
    assert said == ["waiting for a model slot (1 production jobs queued)"]


def test_two_slots_a_queued_production_job_stops_new_eval_attempts(frogfix_env: dict[str, Any]) -> None:
    """With slots=2, eval takes at most the slots production leaves, and none once a job waits."""
    gate = SlotGate(2, poll_seconds=0.01)
    assert gate.try_acquire()  # one eval attempt running, one slot free
    job = _job("queued")
    assert not gate.try_acquire()  # a production job waits: the free slot is production's
    _set(job, "running")
    assert not gate.try_acquire()  # one eval + one production = both slots
    gate.release()
    assert gate.try_acquire() and not gate.try_acquire()
