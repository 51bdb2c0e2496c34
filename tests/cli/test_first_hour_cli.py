"""The first hour with the command line (issue 26): what `replay`, `eval` and `serve` say is true and plain.

- replay's report counts its tool results in words that agree with the number;
- `eval --help` names the three reports `--out` writes, and `eval --jobs 999` names the missing job;
- `serve` on a port already in use says so in one line and starts nothing (no migration, no worker).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.evaluation_report import build_report
from app.models import Job
from worker.commands.evaluate import write_outputs
from worker.commands.replay import ReplayReport, all_matched, matched_count

ROOT = Path(__file__).resolve().parents[2]
MANAGE = ROOT / "manage.py"


def manage(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), *args], env=env or dict(os.environ), cwd=ROOT,
        capture_output=True, text=True, timeout=timeout,
    )


# -- replay: "all 1 tool results matched" -----------------------------------------------------------


def test_replay_counts_its_tool_results_in_agreeing_words(capsys: pytest.CaptureFixture[str]) -> None:
    assert all_matched(1) == "the 1 tool result matched the recording"
    assert all_matched(3) == "all 3 tool results matched the recording"
    assert all_matched(0) == "the recording holds no tool result to compare"
    assert (matched_count(1), matched_count(2), matched_count(0)) == (
        "1 tool result matched", "2 tool results matched", "0 tool results matched"
    )

    from worker.commands.cli.runs import print_replay as printer
    for checked, said in ((1, "1 tool result matched"), (3, "3 tool results matched")):
        report = ReplayReport(
            job_id=1, mode="replay", status="reproduced", run=1, number=1, steps_recorded=checked + 1,
            steps_replayed=checked + 1, tool_results_checked=checked,
            message=f"{all_matched(checked)}; the same patch (12 lines)", exit_reason="agent",
            recorded_exit_reason="agent", patch_identical=True, patch="x\n" * 12,
        )
        printer(report)
        out = capsys.readouterr().out
        assert f"{checked + 1} replayed of {checked + 1} recorded; {said}" in out, out
        assert "1 tool results" not in out and "all 1 " not in out


# -- eval: --out's help, and --jobs naming a job that does not exist ----------------------------


def test_eval_help_names_the_three_reports_out_writes(tmp_path: Path) -> None:
    report = build_report({"id": 1, "model": "m", "attempts": 1, "tasks": []}, [])
    written = {path.name for path in write_outputs(report, tmp_path)}
    proc = manage("eval", "--help", env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    assert proc.returncode == 0, proc.stderr
    help_text = " ".join(proc.stdout.split())
    out_help = help_text[help_text.index("--out"):help_text.index("--fail-below")]
    assert set(re.findall(r"report\.\w+", out_help)) == written == {"report.md", "report.json", "report.html"}
    assert "three reports" in out_help


def test_eval_names_the_job_ids_that_do_not_exist(frogfix_env: dict[str, Any]) -> None:
    proc = manage("eval", "--scripted-model", "demo", "--jobs", "999")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "frogfix eval: no job 999"

    with session_scope() as s:  # a job that exists is not named; every missing one is, in the order given
        job = Job(forge="gitlab", project="acme/calc", issue=1, status="done")
        s.add(job)
        s.flush()
        existing = job.id
    local = "local-20990101-000000-abcdef"
    proc = manage("eval", "--scripted-model", "demo", "--jobs", f"998,{existing},{local}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"frogfix eval: no jobs 998, {local}"

    # A job that exists but recorded no failing tests is still "no executable task", not "no job".
    proc = manage("eval", "--scripted-model", "demo", "--jobs", str(existing))
    assert proc.returncode == 2 and "no executable task" in proc.stderr


# -- serve: a port already in use ---------------------------------------------------------------


def test_serve_on_a_port_in_use_says_so_and_starts_nothing(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    data_dir = tmp_path / "data"
    env.update(FROGFIX_DATA_DIR=str(data_dir), FROGFIX_SWEEP_INTERVAL_SECONDS="0")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "serve", "--port", str(port)], cwd=tmp_path, env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=120)  # it must end by itself, at once; 120 s for a busy machine
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(10)
    assert proc.returncode == 1, (out, err)
    assert err.strip() == f"frogfix serve: port {port} on 127.0.0.1 is in use; pass --port", err
    assert out == ""  # no migration, no worker: nothing was started
    assert not data_dir.exists()  # the database was never opened, let alone upgraded
