"""`fix` and `eval` ask the model server for its model list before anything else (issue 40): when it cannot
answer they stop with doctor's why and remedy, having made no job, built no environment and run no test.

The repository's suite sleeps a minute, so a `fix` that ran it would leave a job row, its events and a
workspace behind; what is asserted is what was recorded, never how long it took.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from app.answers import FixAnswer
from tests.conftest import seeded
from tests.doubles.openai_server import ScriptedOpenAIServer
from tests.fix.sample_repo import git, make_sample_repo
from tests.fix.test_fix_command import ROOT, run_fix, workspace_dir
from tests.servers import free_port

SLOW_TEST = "import time\n\n\ndef test_takes_a_minute():\n    time.sleep(60)\n"


def slow_repo(tmp_path: Path) -> Path:
    repo = make_sample_repo(tmp_path)
    (repo / "test_slow.py").write_text(SLOW_TEST)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a suite that takes a minute")
    return repo


def recorded(data: Path) -> dict[str, int]:
    """What the run left in its data folder's database and on disk."""
    with sqlite3.connect(data / "frogfix.db") as db:
        counts = {t: db.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                  for t in ("jobs", "job_events", "job_attempts", "evaluations")}
    counts["trajectories"] = len(list((data / "trajectories").glob("*"))) if (data / "trajectories").exists() else 0
    counts["workspaces"] = len(list(workspace_dir(data).glob("*"))) if workspace_dir(data).exists() else 0
    return counts


NOTHING = {"jobs": 0, "job_events": 0, "job_attempts": 0, "evaluations": 0, "trajectories": 0, "workspaces": 0}


def test_fix_stops_before_building_anything_when_the_model_server_refuses(tmp_path: Path) -> None:
    repo, data = slow_repo(tmp_path), tmp_path / "data"
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there: connections are refused
    proc = run_fix(repo, data, url)
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    [line] = proc.stderr.splitlines()  # doctor's why and remedy, one line
    said = f"frogfix fix: the model server cannot be used: nothing answers at {url}: ConnectError"
    assert line.startswith(said), line
    assert "fix: start SGLang" in line and "FROGFIX_MODEL_BASE_URL" in line and "--skip-model-check" in line
    assert "canary" not in line
    assert recorded(data) == NOTHING


def test_fix_json_for_a_model_server_that_cannot_answer(tmp_path: Path) -> None:
    repo, data = slow_repo(tmp_path), tmp_path / "data"
    url = f"http://127.0.0.1:{free_port()}/v1"
    proc = run_fix(repo, data, url, "--json")
    assert proc.returncode == 2, proc.stderr
    out = json.loads(proc.stdout)
    FixAnswer.model_validate(out)  # the one shape of `fix --json`
    assert (out["status"], out["exit_reason"], out["job_id"]) == ("failed", "llm_query_error", None)
    assert out["ending"]["kind"] == "model_unreachable" and "nothing answers at" in out["ending"]["cause"]
    assert out["error"] == proc.stderr.strip().removeprefix("frogfix fix: ")
    assert out["tests"]["before"] is None and out["trajectory"] == "" and out["patch"] == ""
    assert recorded(data) == NOTHING


def test_fix_names_a_model_the_server_does_not_serve(tmp_path: Path) -> None:
    repo, data = slow_repo(tmp_path), tmp_path / "data"
    with ScriptedOpenAIServer([], model="another-model") as server:
        proc = run_fix(repo, data, server.base_url, "--json")
    out = json.loads(proc.stdout)
    assert proc.returncode == 2 and out["ending"]["kind"] == "model_refused", proc.stderr
    assert "serves another-model, not scripted" in out["error"] and "FROGFIX_MODEL_NAME" in out["error"]
    assert recorded(data) == NOTHING


def test_eval_stops_before_recording_an_evaluation_when_the_model_server_refuses(tmp_path: Path) -> None:
    data = tmp_path / "data"
    seeded(data)
    url = f"http://127.0.0.1:{free_port()}/v1"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env.update({"FROGFIX_DATA_DIR": str(data), "FROGFIX_MODEL_BASE_URL": url, "FROGFIX_MODEL_NAME": "scripted"})
    proc = subprocess.run([sys.executable, str(ROOT / "manage.py"), "eval"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"frogfix eval: the model server cannot be used: nothing answers at {url}"), line
    assert "--skip-model-check" in line
    assert recorded(data) == NOTHING
