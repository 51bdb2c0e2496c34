"""`manage.py eval` as an operator runs it: over `manage.py demo`'s job, killed with SIGKILL, then resumed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import evaluations as ev_records
from tests.servers import wait_until

pytestmark = pytest.mark.bwrap
ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str, timeout: float = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], env=env or dict(os.environ), cwd=ROOT,
        capture_output=True, text=True, timeout=timeout,
    )


def _rows() -> list[tuple[int, str, int, str | None]]:
    with session_scope() as session:
        return [
            (r.id, r.task, r.attempt, r.trajectory)
            for e, _, _ in ev_records.list_evaluations(session)
            for r in ev_records.evaluation_results(session, e.id)
        ]


def test_a_killed_eval_resumes_from_its_finished_attempts(local_env: dict[str, Any], tmp_path: Path) -> None:
    assert manage("demo").returncode == 0
    command = ["eval", "--scripted-model", "demo", "--attempts", "3"]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *command], env=dict(os.environ), cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while not _rows() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # mid-run: no handler, no cleanup
    proc.wait(10)
    before = _rows()
    assert 1 <= len(before) < 3, before

    done = manage(*command, "--json", "--fail-if-lost", "1", "--fail-below", "0.9")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["evaluation"] == 1 and report["status"] == "finished"
    assert report["attempts_finished"] == 3 and report["attempts_solved"] == 3
    assert report["lost"] == [] and report["gained"] == [] and report["gate_failures"] == []
    after = _rows()
    assert len(after) == 3 and set(before) <= set(after)  # the finished attempts were kept, not run again
    left = 3 - len(before)
    assert f"{left} attempt{'' if left == 1 else 's'} to run" in done.stderr

    # Each eval attempt is a replayable trajectory: `manage.py replay TASK --trajectory PATH` reproduces it.
    task, stored = report["tasks"][0]["task"], report["tasks"][0]["attempts"][-1]["trajectory"]
    replayed = manage("replay", task, "--trajectory", stored, "--json")
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["status"] == "reproduced"
    assert manage("replay", task, "--trajectory", "../../etc/passwd").returncode == 2

    # Evaluation 1 finished: `--resume 1` reports it again and runs nothing; the same command starts evaluation 2.
    again = manage("eval", "--resume", "1", "--json", "--fail-below", "1.0")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["evaluation"] == 1 and "0 attempts to run" in again.stderr
    assert len(_rows()) == 3
    md = manage(*command)
    assert md.returncode == 0, md.stderr
    assert md.stdout.startswith("# Evaluation 2: scripted:demo") and "| solve rate (Wilson 95%) | 1.00" in md.stdout
    assert "evaluation 1 of the same command finished; starting a new one" in md.stderr
    assert "evaluation 2: 3 attempts to run" in md.stderr and len(_rows()) == 6
    # Bad options exit 2.
    assert manage("eval", "--resume", "2", "--fail-below", "1.01").returncode == 2  # not a rate
    assert manage("eval", "--scripted-model", "demo", "--jobs", "project=nowhere").returncode == 2
    bad = manage("eval", "--jobs", "drop table")
    assert bad.returncode == 2 and "not a job id" in bad.stderr
    assert manage("eval", "--resume", "99").returncode == 2


def test_demo_then_eval_works_in_a_fresh_data_folder(local_env: dict[str, Any], tmp_path: Path) -> None:
    """README's example as a new user runs it: no `migrate` first. The embedded SQLite database is upgraded
    by eval itself; a configured database (FROGFIX_DATABASE_URL) is never migrated behind the operator's back."""
    fresh = tmp_path / "fresh-data"
    env = {**os.environ, "FROGFIX_DATA_DIR": str(fresh)}
    env.pop("FROGFIX_DATABASE_URL", None)
    demo = manage("demo", env=env)
    assert demo.returncode == 0, demo.stderr
    run = manage("eval", "--scripted-model", "demo", "--attempts", "2", "--out", str(tmp_path / "out"), env=env)
    assert run.returncode == 0, run.stderr
    assert "database error" not in run.stderr and run.stdout.startswith("# Evaluation 1: scripted:demo")
    assert "2 of 2 attempts solved" in run.stdout
    assert (tmp_path / "out" / "report.md").read_text() == run.stdout

    production = tmp_path / "production.db"
    configured = {**env, "FROGFIX_DATABASE_URL": f"sqlite:///{production}"}
    refused = manage("eval", "--scripted-model", "demo", env=configured)
    assert refused.returncode == 2
    assert "is at schema none, not " in refused.stderr and "back it up, then run ./manage.py migrate" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert manage("migrate", env=configured).returncode == 0
    # A local job is a job of the configured database (issue 38): the demo's went to the embedded one.
    assert "no executable task" in manage("eval", "--scripted-model", "demo", env=configured).stderr
    assert manage("demo", env=configured).returncode == 0
    assert manage("eval", "--scripted-model", "demo", env=configured).returncode == 0


def test_a_second_run_of_a_running_evaluation_exits_2_and_names_the_process(local_env: dict[str, Any]) -> None:
    """The claim on the evaluation row: a live holder refuses a second run; a dead or reused pid is taken over."""
    assert manage("demo").returncode == 0
    assert manage("eval", "--scripted-model", "demo").returncode == 0  # evaluation 1, finished, released
    with session_scope() as session:
        row = ev_records.get_evaluation(session, 1)
        assert (row.runner_pid, row.runner_host, row.heartbeat_at) == (None, None, None)
    holder = subprocess.Popen(["sleep", "120"])  # stands in for a live `manage.py eval` on this host
    try:
        with session_scope() as session:
            ev_records.claim(session, 1, ev_records.Runner.of(holder.pid), 600)
        second = manage("eval", "--resume", "1")
        assert second.returncode == 2, second.stderr
        assert f"evaluation 1 is running in process {holder.pid}" in second.stderr
        assert "Traceback" not in second.stderr and "IntegrityError" not in second.stderr
        with session_scope() as session:  # the refused run left the holder's claim alone
            assert ev_records.get_evaluation(session, 1).runner_pid == holder.pid
            # A claim whose pid now belongs to another process (a different start time) is stale.
            ev_records.claim(session, 1, ev_records.Runner(ev_records.Runner.of(holder.pid).host, holder.pid, "1"), 600)
        assert manage("eval", "--resume", "1").returncode == 0
    finally:
        holder.kill()
        holder.wait(10)
    with session_scope() as session:
        ev_records.claim(session, 1, ev_records.Runner.of(holder.pid), 600)  # now a dead process's claim
    assert manage("eval", "--resume", "1").returncode == 0


def test_a_claim_from_another_host_lives_while_its_heartbeat_beats(frogfix_env: dict[str, Any]) -> None:
    """A pid on another host cannot be checked: its claim holds while the run's Heartbeat keeps it fresh."""
    from datetime import UTC, timedelta

    from app.models import Evaluation, utcnow
    from worker.commands.evaluate import Heartbeat

    with session_scope() as session:
        eid = ev_records.create_evaluation(session, model="m", base_url="", selector="", attempts=1, tasks=[], who="t")
    elsewhere = ev_records.Runner("other-host.example", 4242, "123")
    here = ev_records.Runner.of(os.getpid())
    with session_scope() as session:
        ev_records.claim(session, eid, elsewhere, stale_seconds=4)
    with Heartbeat(eid, elsewhere, stale_seconds=4):  # beats every second (stale / 4)
        with session_scope() as session:  # make the last beat look old: the heartbeat must refresh it
            session.get(Evaluation, eid).heartbeat_at = utcnow() - timedelta(seconds=60)  # type: ignore[union-attr]

        def beaten() -> bool:  # the 60 s old beat was refreshed
            with session_scope() as session:
                beat = ev_records.get_evaluation(session, eid).heartbeat_at
            return beat is not None and utcnow() - beat.replace(tzinfo=beat.tzinfo or UTC) < timedelta(seconds=2)

        wait_until(beaten, timeout=20)  # the first beat is due after a second; a loaded runner may take longer
        with session_scope() as session, pytest.raises(ev_records.EvaluationBusy, match="process 4242 on other-host"):
            ev_records.claim(session, eid, here, stale_seconds=4)
    # That run died: judged 4.5 s later, its last beat is older than stale_seconds (no waiting on the clock).
    with session_scope() as session:
        last = ev_records.get_evaluation(session, eid).heartbeat_at
        assert last is not None
        with pytest.raises(ev_records.EvaluationBusy):  # a moment before the beat goes stale, still busy
            ev_records.claim(session, eid, here, stale_seconds=4, now=last + timedelta(seconds=3.5))
    with session_scope() as session:
        ev_records.claim(session, eid, here, stale_seconds=4, now=last + timedelta(seconds=4.5))
    with session_scope() as session:
        assert ev_records.get_evaluation(session, eid).runner_host == here.host
        assert not ev_records.beat(session, eid, elsewhere)  # the old run's heartbeat stops once it lost the claim
