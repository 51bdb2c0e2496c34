"""Evaluations share the model slots with production and with each other, and let production go first.

The count of eval attempts in flight lives on the evaluation rows (`slots_held`), so two evaluation
processes, or one with --concurrency N, never hold more than production leaves.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app.db import session_scope
from app.jobs import evaluations as ev_records
from app.migrate import upgrade
from app.models import Evaluation, Job, utcnow
from tests.conftest import configure
from tests.eval.conftest import Candidate, recorded_job
from worker.commands.evaluate import EvalError, EvalOptions, ModelFactory, SlotGate, evaluate
from worker.leaf.model import ModelClient, ModelReply

HERE = ev_records.Runner.of(os.getpid())


def _job(status: str, issue: int = 1) -> int:
    with session_scope() as session:
        job = Job(forge="gitlab", project="acme/calc", issue=issue, status=status)
        session.add(job)
        session.flush()
        return job.id


def _set(job_id: int, status: str) -> None:
    with session_scope() as session:
        session.get(Job, job_id).status = status  # type: ignore[union-attr]


def _gate(slots: int, runner: ev_records.Runner = HERE, **kw: Any) -> SlotGate:
    """A gate for a new evaluation that `runner` holds (another host's runner: live while its heartbeat is fresh)."""
    with session_scope() as session:
        eid = ev_records.create_evaluation(session, model="m", base_url="", selector="", attempts=1, tasks=[],
                                           who="t")
        ev_records.claim(session, eid, runner, 60)
    return SlotGate(eid, runner, slots, stale_seconds=60, poll_seconds=0.01, **kw)


def _held() -> int:
    with session_scope() as session:
        return int(session.scalar(select(func.sum(Evaluation.slots_held))) or 0)


def test_the_gate_takes_a_slot_only_when_no_production_job_waits(frogfix_env: dict[str, Any]) -> None:
    gate = _gate(2)
    job = _job("queued")
    assert not gate.try_acquire()  # a queued production job: the evaluation waits, whatever the free slots
    _set(job, "running")
    assert gate.try_acquire()  # one slot busy with production, one free
    assert not gate.try_acquire()  # both slots held now
    gate.release()
    _set(job, "done")
    assert gate.try_acquire() and gate.try_acquire() and not gate.try_acquire()
    assert _held() == 2
    with pytest.raises(EvalError, match="at least one model slot"):
        SlotGate(gate.evaluation_id, HERE, 0, stale_seconds=60)
    stopped = _gate(1, stop=lambda: True)
    assert not stopped.acquire()  # asked to stop while waiting: gives up rather than blocks


def test_two_evaluations_in_two_processes_share_the_slots(frogfix_env: dict[str, Any]) -> None:
    """Evaluation A here and B on another host: together with production they never pass the slot count."""
    slots = 3
    a = _gate(slots)
    elsewhere = ev_records.Runner("gpu-host-2.example", 4242, "99")
    b = _gate(slots, elsewhere)
    assert a.try_acquire() and a.try_acquire()  # A: --concurrency 2, two attempts in flight
    assert b.try_acquire()  # B takes the third slot
    assert not a.try_acquire() and not b.try_acquire()  # 2 + 1 = 3: none left for either
    assert a.last is not None and (a.last.busy, a.last.evaluations) == (0, 3)
    a.release()
    assert b.try_acquire() and not a.try_acquire()  # the slot A gave back went to B
    production = _job("running")
    b.release()
    assert not a.try_acquire() and not b.try_acquire()  # the freed slot is production's busy job's now
    _set(production, "done")
    assert a.try_acquire()

    # B's host died: once its heartbeat is stale, its two attempts no longer count.
    with session_scope() as session:
        session.get(Evaluation, b.evaluation_id).heartbeat_at = utcnow() - timedelta(seconds=120)  # type: ignore[union-attr]
    assert a.try_acquire() and not a.try_acquire()  # A alone: 3 of 3
    assert not b.try_acquire() and b.last is not None and not b.last.lost  # B's row is still B's, just not counted
    # A run that loses its claim takes no slot and gives up waiting.
    with session_scope() as session:
        ev_records.claim(session, b.evaluation_id, HERE, 60)
    assert not b.acquire() and b.claim_lost


def test_a_production_job_queued_stops_every_evaluation(frogfix_env: dict[str, Any]) -> None:
    a, b = _gate(4), _gate(4, ev_records.Runner("gpu-host-2.example", 7, "7"))
    assert a.try_acquire() and b.try_acquire()
    job = _job("queued")
    assert not a.try_acquire() and not b.try_acquire()
    said: list[str] = []
    b.progress, calls = said.append, {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    b.stop = stop
    assert not b.acquire()
    assert said == ["waiting for a model slot (1 production job queued)"]
    _set(job, "running")
    assert a.try_acquire() and not b.try_acquire()  # 1 production + 3 eval = 4


def test_a_job_held_by_its_projects_budget_does_not_stop_the_evaluation(frogfix_env: dict[str, Any]) -> None:
    """A held job cannot start whatever eval does, so only runnable queued jobs count as waiting."""
    gate = _gate(1)
    held = _job("queued")
    with session_scope() as session:
        session.get(Job, held).hold_reason = "waiting for tokens: the project used its tokens today"  # type: ignore[union-attr]
    assert gate.try_acquire()  # only a held job is queued: the slot is free for eval
    gate.release()
    assert _held() == 0


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, frogfix_env: dict[str, Any]) -> str:
    if request.param == "postgres":
        url = request.getfixturevalue("pg").create_database("eval_slots")
        configure(frogfix_env["monkeypatch"], database_url=url)
        upgrade(url)
    return str(request.param)


def test_racing_gates_never_hold_more_than_the_slots(database: str) -> None:
    """Eight threads over three evaluations take and give slots as fast as they can: never more than two at once.

    A holder waits (briefly) for a second holder before it gives its slot back, so the race reaches
    the limit however slow the machine is; only the gates decide whether a third can join. The race
    ends after a count of takes, not after a time, so a slow machine runs it longer instead of failing.
    """
    slots, enough = 2, 30  # the race runs until 30 takes, however long a loaded machine needs
    gates = [_gate(slots), _gate(slots), _gate(slots, ev_records.Runner("gpu-host-2.example", 1, "1"))]
    held = threading.Condition()
    state = {"now": 0, "most": 0, "taken": 0}
    errors: list[BaseException] = []

    def work(gate: SlotGate) -> None:
        try:
            deadline = time.monotonic() + 60  # a bound for a broken gate, not the race's length
            while time.monotonic() < deadline:
                with held:
                    if state["taken"] >= enough:
                        return
                if not gate.try_acquire():
                    continue
                with held:
                    state["now"] += 1
                    state["most"] = max(state["most"], state["now"])
                    state["taken"] += 1
                    held.notify_all()
                    held.wait_for(lambda: state["now"] >= slots, timeout=0.5)
                time.sleep(0.005)  # both held: room for a third to (wrongly) get in
                with held:
                    state["now"] -= 1
                gate.release()
        except BaseException as exc:  # a database error must fail the test, not vanish in the thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(gates[i % 3],)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert errors == []
    assert state["most"] == slots and state["taken"] >= enough, state
    assert _held() == 0


class _Timed:
    """A candidate's model that notes when its attempt ended (the evaluator closes it after the attempt)."""

    def __init__(self, inner: ModelClient, spans: list[list[float]]) -> None:
        self.inner, self.span = inner, [time.monotonic(), 0.0]
        spans.append(self.span)

    def complete(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]], *,
                 timeout: float | None = None, max_completion_tokens: int | None = None) -> ModelReply:
        return self.inner.complete(messages, tools, timeout=timeout, max_completion_tokens=max_completion_tokens)

    def close(self) -> None:
        self.span[1] = time.monotonic()


@pytest.mark.bwrap
def test_two_evaluations_with_concurrency_2_hold_only_the_slots_production_leaves(
    local_env: dict[str, Any], tmp_path: Path
) -> None:
    """FROGFIX_MODEL_SLOTS=2 with one production job busy: two evaluations of --concurrency 2 run one attempt
    at a time between them, where each alone would have run two."""
    configure(local_env["monkeypatch"], model_slots="2")
    task = recorded_job(tmp_path / "a", solved=True)
    production = _job("running")
    spans: list[list[float]] = []
    in_flight: list[int] = []

    def candidate() -> ModelFactory:
        solving = Candidate({(task, 1), (task, 2)})

        def make(key: str, attempt: int) -> ModelClient:
            in_flight.append(_held())  # this attempt's slot is taken before its model is made
            return _Timed(solving(key, attempt), spans)

        return make

    results: dict[str, tuple[int, str, list[str]]] = {}

    def run(name: str) -> None:
        results[name] = evaluate(EvalOptions(name, "", attempts=2, concurrency=2), models=candidate(),
                                 poll_seconds=0.02)

    threads = [threading.Thread(target=run, args=(name,)) for name in ("cand-a", "cand-b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert {name: status for name, (_, status, _) in results.items()} == {"cand-a": "finished", "cand-b": "finished"}
    assert len(spans) == 4 and all(end > 0 for _, end in spans)
    assert in_flight == [1, 1, 1, 1]  # production's one busy job + one eval attempt = both slots, every time
    ordered = sorted(spans)
    assert all(ordered[i][1] <= ordered[i + 1][0] for i in range(3)), ordered  # never two at once
    _set(production, "done")
    assert _held() == 0


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
        production["done"] = time.monotonic()  # before the commit: the eval may see "done" the moment it lands
        _set(job_id, "done")

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
