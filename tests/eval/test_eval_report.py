"""`manage.py eval` over real recorded local jobs with a scripted candidate that solves a known subset."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest

from app import trajectory
from app.db import session_scope
from app.jobs import evaluations as ev_records
from tests.eval.conftest import Candidate, recorded_job
from worker.commands.evaluate import (
    EXIT_GATE,
    EXIT_INCOMPLETE,
    EXIT_OK,
    CommandOptions,
    EvalError,
    EvalOptions,
    evaluate,
    load_report,
    run_eval_command,
)

pytestmark = pytest.mark.bwrap


def _four_tasks(tmp_path: Path) -> dict[str, str]:
    """Two tasks the recorded run solved (a, b) and two it did not (c, d)."""
    return {name: recorded_job(tmp_path / name, solved=name in "ab") for name in "abcd"}


def test_counts_pass_at_k_gained_and_lost_are_exact(local_env: dict[str, Any], tmp_path: Path) -> None:
    t = _four_tasks(tmp_path)
    # a: solved twice; b: never (lost); c: once of two, at the second (the recorded run had one attempt:
    # not comparable, not a gain); d: never.
    candidate = Candidate({(t["a"], 1), (t["a"], 2), (t["c"], 2)})
    evaluation_id, status, errors = evaluate(
        EvalOptions("candidate-1", "http://model.invalid/v1", attempts=2), models=candidate
    )
    assert (status, errors) == ("finished", [])
    assert sorted(candidate.calls) == sorted((t[n], k) for n in "abcd" for k in (1, 2))

    report = load_report(evaluation_id)
    assert (report["attempts_finished"], report["attempts_solved"]) == (8, 3)
    assert report["candidate"]["solve_rate"]["value"] == 0.375
    assert report["candidate"]["pass@1"]["value"] == 0.375  # mean of 1, 0, 1/2, 0
    assert report["candidate"]["pass@2"]["value"] == 0.5  # mean of 1, 0, 1, 0
    assert report["candidate"]["tasks_solved"] == 2
    assert report["recorded"]["solve_rate"]["value"] == 0.5 and report["recorded"]["tasks_solved"] == 2
    assert report["gained"] == [] and report["lost"] == [t["b"]] and report["not_comparable"] == [t["c"]]
    assert report["recorded"]["attempts"] == [1] and "1 attempt per task" in report["recorded"]["solve_rate"]["method"]
    lo, hi = report["candidate"]["solve_rate"]["ci95"]
    assert lo < 0.375 < hi and "Wilson" in report["candidate"]["solve_rate"]["method"]
    assert report["human"] == {"merged": 0, "merged_solved": 0, "closed_unmerged": 0,
                               "closed_unmerged_solved": 0, "open": 0, "unknown": 4}

    rows = {r["task"]: r for r in report["tasks"]}
    solved = rows[t["a"]]["attempts"][0]
    assert solved["exit_reason"] == "agent" and solved["steps"] == 4 and solved["tokens"] > 0
    assert 0 < solved["cached_share"] < 1 and solved["wall_seconds"] > 0
    assert rows[t["b"]]["attempts"][0]["outcome"] == "no_patch"
    # Every attempt left a trajectory under the data folder, marked as this evaluation's.
    for row in report["tasks"]:
        for attempt in row["attempts"]:
            doc = trajectory.read(trajectory.resolve(local_env["data_dir"], attempt["trajectory"]))
            assert doc["mode"] == "eval" and doc["evaluation"] == evaluation_id
            assert doc["eval_task"] == row["task"] and doc["eval_attempt"] == attempt["attempt"]

    # The gates read the same report: exit 1 on a failed gate, 0 when every gate passes.
    again = EvalOptions("candidate-1", "http://model.invalid/v1", attempts=2)
    def gate(**kw: Any) -> int:
        return run_eval_command(again, CommandOptions(resume=evaluation_id, **kw), lambda _m: None)[0]
    assert gate(fail_below=0.4) == EXIT_GATE
    assert gate(fail_below=0.375) == EXIT_OK
    assert gate(fail_if_lost=1) == EXIT_GATE
    assert gate(fail_if_lost=2) == EXIT_OK
    code, text = run_eval_command(again, CommandOptions(resume=evaluation_id, as_json=True), lambda _m: None)
    assert code == EXIT_OK and json.loads(text)["lost"] == [t["b"]]
    with pytest.raises(EvalError):
        gate(fail_if_lost=0)
    assert candidate.calls.count((t["a"], 1)) == 1  # resuming a finished evaluation re-runs nothing


def test_an_interrupted_evaluation_resumes_without_rerunning_finished_attempts(
    local_env: dict[str, Any], tmp_path: Path
) -> None:
    a, b = recorded_job(tmp_path / "a", solved=True), recorded_job(tmp_path / "b", solved=False)
    options = EvalOptions("candidate-2", "http://model.invalid/v1", attempts=2)
    first = Candidate({(a, 1), (a, 2), (b, 1)})
    stop = lambda: len(first.calls) >= 2  # noqa: E731  (the interruption: between the second and third attempt)
    code, _ = run_eval_command(options, CommandOptions(), lambda _m: None, should_stop=stop, models=first)
    assert code == EXIT_INCOMPLETE
    with session_scope() as session:
        (row,) = [e for e, _, _ in ev_records.list_evaluations(session)]
        assert row.status == "stopped"
        done = ev_records.finished_pairs(session, row.id)
    assert done == set(first.calls) and len(done) == 2

    # The same command again resumes that evaluation and runs only what is missing.
    second = Candidate({(a, 1), (a, 2), (b, 1)})
    evaluation_id, status, _ = evaluate(options, models=second)
    assert evaluation_id == row.id and status == "finished"
    assert sorted(second.calls) == sorted({(a, 1), (a, 2), (b, 1), (b, 2)} - done)
    report = load_report(evaluation_id)
    assert report["attempts_finished"] == 4 and report["attempts_solved"] == 3
    assert report["gained"] == [b] and report["lost"] == []


def test_a_model_server_failure_is_not_counted_as_unsolved(local_env: dict[str, Any], tmp_path: Path) -> None:
    from worker.leaf.model import ReplayModel

    task = recorded_job(tmp_path / "a", solved=True)
    options = EvalOptions("candidate-down", "http://model.invalid/v1", attempts=1)
    code, _ = run_eval_command(options, CommandOptions(), lambda _m: None, models=lambda _k, _a: ReplayModel([]))
    assert code == EXIT_INCOMPLETE  # every call failed (llm_query_error): nothing recorded, left for a resume
    with session_scope() as session:
        (evaluation,) = [e for e, _, _ in ev_records.list_evaluations(session)]
        assert evaluation.status == "stopped" and ev_records.finished_pairs(session, evaluation.id) == set()
    evaluation_id, status, _ = evaluate(options, models=Candidate({(task, 1)}))
    assert (evaluation_id, status) == (evaluation.id, "finished")
    assert load_report(evaluation_id)["attempts_solved"] == 1


class Overlapping(Candidate):
    """A candidate that counts its attempts in flight (from model creation to `close`); its first `width`
    attempts wait for each other at a barrier, which breaks (failing them) unless they run at the same time."""

    def __init__(self, solves: set[tuple[str, int]], width: int) -> None:
        super().__init__(solves)
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.barrier = threading.Barrier(width, timeout=60)

    def __call__(self, key: str, attempt: int) -> Any:
        model = super().__call__(key, attempt)
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            meet = len(self.calls) <= self.barrier.parties
        if meet:
            self.barrier.wait()

        def close() -> None:
            with self.lock:
                self.in_flight -= 1

        model.close = close
        return model


def _comparable(value: Any) -> Any:
    """A report without what differs between two runs of the same attempts: ids, names, times, file names."""
    if isinstance(value, dict):
        volatile = {"evaluation", "model", "created_at", "wall_seconds", "trajectory"}
        return {k: _comparable(v) for k, v in value.items() if k not in volatile}
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    return value


def test_concurrent_attempts_run_at_once_within_the_slots_and_report_like_a_serial_run(
    local_env: dict[str, Any], tmp_path: Path
) -> None:
    from tests.conftest import configure

    a, b = recorded_job(tmp_path / "a", solved=True), recorded_job(tmp_path / "b", solved=False)
    configure(local_env["monkeypatch"], model_slots="2")
    solves = {(a, 1), (b, 1)}
    wide = Overlapping(solves, width=2)
    ev_wide, status, errors = evaluate(EvalOptions("wide", "", attempts=2, concurrency=3), models=wide,
                                       poll_seconds=0.05)
    assert (status, errors) == ("finished", [])
    assert len(wide.calls) == 4 and not wide.barrier.broken
    assert wide.most == 2  # two at once (the barrier met), never three: --concurrency 3, but 2 model slots

    serial = Overlapping(solves, width=1)
    ev_serial, status, errors = evaluate(EvalOptions("serial", "", attempts=2), models=serial)
    assert (status, errors) == ("finished", []) and serial.most == 1
    wide_report, serial_report = load_report(ev_wide), load_report(ev_serial)
    assert wide_report["attempts_solved"] == 2 and wide_report["gained"] == [b] and wide_report["lost"] == []
    assert _comparable(wide_report) == _comparable(serial_report)


def test_a_task_that_can_never_run_is_recorded_unrunnable_and_left_out_of_the_rates(
    local_env: dict[str, Any], tmp_path: Path
) -> None:
    import shutil

    a, gone = recorded_job(tmp_path / "a", solved=True), recorded_job(tmp_path / "b", solved=False)
    shutil.rmtree(tmp_path / "b")  # the task's repository no longer exists: no resume can ever run it
    options = EvalOptions("candidate-gone", "http://model.invalid/v1", attempts=1)
    code, _ = run_eval_command(options, CommandOptions(fail_below=1.0), lambda _m: None,
                               models=Candidate({(a, 1)}))
    assert code == EXIT_OK  # finished, and the gate judged only the task that can run
    (evaluation,) = [e for e, _, _ in _evaluations()]
    report = load_report(evaluation.id)
    assert report["status"] == "finished" and report["tasks_evaluated"] == 1
    assert report["candidate"]["solve_rate"]["value"] == 1.0 and report["recorded"]["tasks_solved"] == 1
    (excluded,) = report["unrunnable"]
    assert excluded["task"] == gone and "is gone" in excluded["reason"]


def test_a_run_whose_claim_was_taken_over_stops_and_records_nothing_more(
    local_env: dict[str, Any], tmp_path: Path
) -> None:
    from app.models import Evaluation

    task = recorded_job(tmp_path / "a", solved=True)
    candidate = Candidate({(task, 1), (task, 2)})

    def taken_over(_key: str, _attempt: int) -> None:
        """Another host takes the evaluation over while this process's first attempt runs."""
        with session_scope() as session:
            (row,) = session.query(Evaluation).all()
            row.runner_host, row.runner_pid, row.runner_started = "elsewhere", 4242, "1"

    candidate.on_attempt = taken_over
    said: list[str] = []
    code, _ = run_eval_command(EvalOptions("candidate-lost", "", attempts=2), CommandOptions(), said.append,
                               models=candidate)
    assert code == EXIT_INCOMPLETE and any("taken over" in m for m in said)
    assert candidate.calls == [(task, 1)]  # the second attempt never started
    with session_scope() as session:
        (row,) = session.query(Evaluation).all()
        assert ev_records.finished_pairs(session, row.id) == set()  # the new holder records its own results
        assert row.runner_host == "elsewhere" and row.status == "running"  # its row is left to it


def _evaluations() -> list[Any]:
    with session_scope() as session:
        return ev_records.list_evaluations(session)
