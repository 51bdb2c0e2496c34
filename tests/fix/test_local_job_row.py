"""`fix` makes its job a row of the jobs table (a local job is a job, issue 38): written as the job goes,
scrubbed of secrets like the trajectory, and never made for a call that is refused."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from app.redaction import REDACTED
from tests.doubles.openai_server import ScriptedOpenAIServer, assistant
from tests.fix.sample_repo import make_sample_repo
from tests.fix.test_fix_command import CANARY, fixing_script, run_fix


def database_text(data_dir: Path) -> str:
    """Every row of the embedded database, as text (what a secret must not be found in)."""
    with sqlite3.connect(data_dir / "frogfix.db") as db:
        tables = [name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return "\n".join(repr(row) for table in tables for row in db.execute(f"SELECT * FROM {table}"))


def row(data_dir: Path, job_id: int) -> dict[str, object]:
    with sqlite3.connect(data_dir / "frogfix.db") as db:
        db.row_factory = sqlite3.Row
        found = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return dict(found)


@pytest.mark.bwrap
def test_the_row_holds_the_job_and_no_secret(tmp_path: Path) -> None:
    repo = make_sample_repo(tmp_path)
    script = fixing_script()
    script[-1] = assistant(f"Fixed add(). The deploy token is {CANARY}, do not share it.")
    with ScriptedOpenAIServer(script) as server:
        proc = run_fix(repo, tmp_path / "data", server.base_url, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    text = database_text(tmp_path / "data")
    assert CANARY not in text and REDACTED in text
    job = row(tmp_path / "data", out["job_id"])
    assert (job["forge"], job["project"], job["status"], job["run"]) == ("local", str(repo.resolve()), "done", 1)
    assert job["steps"] == out["steps"] and job["exit_reason"] == "agent" and job["prompt_tokens"] == out["usage"][
        "prompt_tokens"]
    with sqlite3.connect(tmp_path / "data" / "frogfix.db") as db:
        [(status, chosen, patch, tests, path)] = db.execute(
            "SELECT status, chosen, patch, tests, trajectory_path FROM job_attempts WHERE job_id = ?", (out["job_id"],))
        kinds = [kind for (kind,) in db.execute("SELECT kind FROM job_events WHERE job_id = ? ORDER BY id",
                                                (out["job_id"],))]
    assert status == "verified" and chosen and "+    return a + b" in patch
    assert json.loads(tests)["evidence"]["level"] == out["evidence"]["level"]
    assert path == f"trajectories/job-{out['job_id']}-run-1-1.json" and out["trajectory"].endswith(path)
    assert kinds[0] == "created" and kinds[-1] == "done" and "agent_started" in kinds
    logs = [out["tests"]["before"]["log"], *(run["log"] for run in out["tests"]["after"])]
    assert all("1 failed" in logs[0] or "passed" in log for log in logs)
    assert not any("generated xml file" in log for log in logs)  # FrogFix's own report option, not the project's


@pytest.mark.parametrize("where", ["missing", "file", "not_git"])
def test_a_refused_call_makes_no_job(tmp_path: Path, where: str) -> None:
    target = {"missing": tmp_path / "no-such-folder", "file": tmp_path / "a-file", "not_git": tmp_path}[where]
    if where == "file":
        target.write_text("x")
    proc = run_fix(target, tmp_path / "data", "http://127.0.0.1:9/v1")
    expected = {"missing": "does not exist", "file": "is not a folder", "not_git": "is not a git checkout"}[where]
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    with sqlite3.connect(tmp_path / "data" / "frogfix.db") as db:  # run_fix seeds it at head: no row was made
        assert db.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


@pytest.mark.bwrap
def test_a_job_the_model_server_failed_keeps_no_password(tmp_path: Path) -> None:
    repo = make_sample_repo(tmp_path)
    url = "http://frog:sekret-pw-31@127.0.0.1:9/v1"  # nothing listens on port 9: the model is down
    proc = run_fix(repo, tmp_path / "data", url, "--json", "--skip-model-check",
                   env_extra={"FROGFIX_MODEL_MAX_RETRIES": "1"})
    out = json.loads(proc.stdout)
    assert out["status"] == "failed", proc.stderr
    assert "sekret-pw-31" not in database_text(tmp_path / "data") + proc.stdout + proc.stderr
    job = row(tmp_path / "data", out["job_id"])
    assert (job["status"], job["exit_reason"]) == ("failed", "llm_query_error")
    with sqlite3.connect(tmp_path / "data" / "frogfix.db") as db:
        [(status, path)] = db.execute("SELECT status, trajectory_path FROM job_attempts WHERE job_id = ?",
                                      (out["job_id"],))
    assert status == "failed" and path == f"trajectories/job-{out['job_id']}-run-1-1.json"  # kept, though no verdict
