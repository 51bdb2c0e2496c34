"""`fix` keeps a record of its job (app/local_jobs.py) that `jobs`, `show` and the dashboard read: written as
the job goes, scrubbed of secrets like the trajectory, and never written for a call that is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app import local_jobs
from app.redaction import REDACTED
from tests.doubles.openai_server import ScriptedOpenAIServer, assistant
from tests.fix.sample_repo import make_sample_repo
from tests.fix.test_fix_command import CANARY, fixing_script, run_fix


@pytest.mark.bwrap
def test_the_record_holds_the_job_and_no_secret(tmp_path: Path) -> None:
    repo = make_sample_repo(tmp_path)
    script = fixing_script()
    script[-1] = assistant(f"Fixed add(). The deploy token is {CANARY}, do not share it.")
    with ScriptedOpenAIServer(script) as server:
        proc = run_fix(repo, tmp_path / "data", server.base_url, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    file = local_jobs.path(tmp_path / "data", out["job_id"])
    text = file.read_text()
    assert CANARY not in text and REDACTED in text
    job = local_jobs.load(tmp_path / "data", out["job_id"])
    assert job.status == "fixed" and job.kind == "fix" and job.repository == str(repo.resolve())
    assert job.steps == out["steps"] and job.exit_reason == "agent"
    [attempt] = job.attempt_list
    assert attempt.chosen and attempt.status == "verified" and "+    return a + b" in attempt.patch
    assert attempt.tests is not None and attempt.tests["evidence"]["level"] == out["evidence"]["level"]
    assert attempt.trajectory_path == f"trajectories/{out['job_id']}.json"
    kinds = [e.kind for e in job.events]
    assert kinds[0] == "created" and kinds[-1] == "finished" and "agent_started" in kinds
    assert job.usage_figures == out["usage"]
    logs = [out["tests"]["before"]["log"], *(run["log"] for run in out["tests"]["after"])]
    assert all("1 failed" in logs[0] or "passed" in log for log in logs)
    assert not any("generated xml file" in log for log in logs)  # FrogFix's own report option, not the project's


@pytest.mark.parametrize("where", ["missing", "file", "not_git"])
def test_a_refused_call_records_no_job(tmp_path: Path, where: str) -> None:
    target = {"missing": tmp_path / "no-such-folder", "file": tmp_path / "a-file", "not_git": tmp_path}[where]
    if where == "file":
        target.write_text("x")
    proc = run_fix(target, tmp_path / "data", "http://127.0.0.1:9/v1")
    expected = {"missing": "does not exist", "file": "is not a folder", "not_git": "is not a git checkout"}[where]
    assert proc.returncode == 2 and expected in proc.stderr, proc.stderr
    assert not (tmp_path / "data" / local_jobs.DIRECTORY).exists()


@pytest.mark.bwrap
def test_the_record_keeps_the_model_url_without_its_password(tmp_path: Path) -> None:
    repo = make_sample_repo(tmp_path)
    url = "http://frog:sekret-pw-31@127.0.0.1:9/v1"  # nothing listens on port 9: the model is down
    proc = run_fix(repo, tmp_path / "data", url, "--json", env_extra={"FROGFIX_MODEL_MAX_RETRIES": "1"})
    out = json.loads(proc.stdout)
    assert out["status"] == "failed", proc.stderr
    text = local_jobs.path(tmp_path / "data", out["job_id"]).read_text()
    assert "sekret-pw-31" not in text
    job = local_jobs.load(tmp_path / "data", out["job_id"])
    assert job.model_url == "http://127.0.0.1:9/v1"
    [attempt] = job.attempt_list  # recorded when it began, though it never reached a verdict
    assert attempt.status == "failed" and attempt.trajectory_path == f"trajectories/{out['job_id']}.json"
