"""Local jobs are jobs (issue 38): a real `manage.py demo` or `fix` makes a jobs row (forge `local`, project
the checkout's folder) that `jobs`, `show`, `retry`, `cancel`, the dashboard and `/api/jobs` see as they
see any job; older local records are imported once; unknown ids get the not-found page."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import local, records, transitions
from app.models import Job
from app.statuses import JobStatus
from tests.conftest import ADMIN_TOKEN, configure
from tests.dashboard.scenario import finished_job, new_job
from tests.doubles.openai_server import ScriptedOpenAIServer, assistant, tool_call
from tests.fix.sample_repo import make_sample_repo
from tests.fix.test_fix_command import ISSUE, fixing_script
from tests.servers import wait_until

ROOT = Path(__file__).resolve().parents[2]
BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"  # what Chromium sends
POLL_S = 180.0  # generous: two loaded CPUs, a sandbox per step


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], env=dict(os.environ), capture_output=True, text=True,
        timeout=300,
    )


def listed() -> list[dict[str, Any]]:
    proc = manage("jobs", "--json")
    assert proc.returncode == 0, proc.stderr
    items: list[dict[str, Any]] = json.loads(proc.stdout)["items"]
    return items


@pytest.fixture
def demo_job(local_env: dict[str, Any]) -> int:
    """The id of a `manage.py demo` run made with the test's data folder."""
    proc = manage("demo", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    job_id: int = json.loads(proc.stdout)["job_id"]
    return job_id


def stage_states(html: str) -> dict[str, str]:
    return dict(re.findall(r'data-stage="([a-z_]+)" data-state="([a-z]+)"', html))


@pytest.mark.bwrap
def test_the_demo_is_a_job_in_the_cli_the_api_and_every_page(demo_job: int, signed_in: Any) -> None:
    with session_scope() as session:
        job = records.get_job(session, demo_job)
        assert (job.forge, job.status, job.run, job.issue) == ("local", "done", 1, 1)
        assert job.project.endswith("/calc") and Path(job.project).is_absolute()
        assert job.usage.prompt_tokens == 9390 and job.finished_at is not None
        [attempt] = records.job_attempts(session, demo_job)
        assert attempt.status == "verified" and attempt.chosen and "+    return a + b" in (attempt.patch or "")
        kinds = {e.kind for e in records.job_events(session, demo_job)}
    assert {"created", "admitted", "prepared", "agent_started", "verified", "chosen", "done"} <= kinds

    [line] = [line for line in manage("jobs").stdout.splitlines() if line.split()[:1] == [str(demo_job)]]
    assert " done " in line and " local " in line and "/calc#1" in line
    only_local = json.loads(manage("jobs", "--forge", "local", "--status", "done", "--json").stdout)
    assert [item["id"] for item in only_local["items"]] == [demo_job] and only_local["total"] == 1
    assert json.loads(manage("jobs", "--forge", "gitlab", "--json").stdout)["items"] == []
    assert manage("show", str(demo_job)).stdout.startswith(f"job {demo_job}: done\n")

    api = signed_in.get("/api/jobs", headers={"authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    assert [(i["id"], i["forge"], i["status"]) for i in api["items"]] == [(demo_job, "local", "done")]
    assert signed_in.get("/api/jobs?forge=local").json()["total"] == 1

    overview = signed_in.get("/").text
    assert '<span class="value" data-testid="total-jobs">1</span>' in overview
    assert f'href="/jobs/{demo_job}"' in overview
    assert "9,390" in signed_in.get("/usage").text
    assert f'href="/jobs/{demo_job}"' in signed_in.get("/jobs?forge=local&status=done").text
    page = signed_in.get(f"/jobs/{demo_job}").text
    assert 'data-testid="diff"' in page and "return a + b" in page and "Evidence:" in page
    states = stage_states(page)
    assert states["agent"] == states["verifying"] == "done" and states["done"] == "done", states
    trajectory = signed_in.get(f"/jobs/{demo_job}/attempts/{attempt.id}/trajectory")
    assert trajectory.status_code == 200 and "calc.py" in trajectory.text


def _fix(repo: Path, model_url: str, *extra: str, **env: str) -> subprocess.Popen[str]:
    issue = repo.parent / "issue.md"
    issue.write_text(ISSUE)
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "fix", str(repo), "--issue", str(issue), "--json", *extra],
        env={**os.environ, "FROGFIX_MODEL_BASE_URL": model_url, "FROGFIX_MODEL_NAME": "scripted", **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


@pytest.mark.bwrap
def test_cancel_reaches_a_running_fix_as_it_reaches_a_workers_job(local_env: dict[str, Any], tmp_path: Path) -> None:
    repo = make_sample_repo(tmp_path)
    forever = assistant(None, tool_calls=[tool_call("Bash", {"command": "sleep 0.3"})])
    with ScriptedOpenAIServer(lambda _i, _b: forever) as server:
        proc = _fix(repo, server.base_url, FROGFIX_LEAF_MAX_STEPS="500")
        try:
            # The fix's job running, with a step taken.
            job = wait_until(lambda: next((j for j in listed() if j["status"] == "running" and j["steps"] > 0), None),
                             timeout=POLL_S)
            asked = manage("cancel", str(job["id"]))
            assert asked.returncode == 0 and "asked the worker to stop" in asked.stdout, asked.stderr
            out, err = proc.communicate(timeout=POLL_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 2, err[-2000:]
    answer = json.loads(out)
    assert answer["job_id"] == job["id"] and answer["exit_reason"] == "cancelled" and answer["status"] == "failed"
    [ended] = listed()
    assert ended["status"] == "cancelled" and ended["error"] == "cancelled on request"
    assert not any(j["status"] == "running" for j in listed())


@pytest.mark.bwrap
def test_retry_queues_a_local_job_and_the_worker_runs_it_from_its_folder(
    local_env: dict[str, Any], tmp_path: Path
) -> None:
    from worker.job import runs
    from worker.job.job_context import Deps

    repo = make_sample_repo(tmp_path)
    # Nothing listens on port 9: the model goes down after the check (skipped here).
    down = _fix(repo, "http://127.0.0.1:9/v1", "--skip-model-check", FROGFIX_MODEL_MAX_RETRIES="1")
    down.communicate(timeout=300)
    [failed] = listed()
    assert failed["status"] == "failed" and failed["exit_reason"] == "llm_query_error", failed
    queued = manage("retry", str(failed["id"]))
    assert queued.returncode == 0 and "queued again" in queued.stdout, queued.stderr

    with ScriptedOpenAIServer(fixing_script()) as server:
        configure(local_env["monkeypatch"], model_base_url=server.base_url, model_name="scripted")
        with session_scope() as session:
            assert transitions.claim_job(session, failed["id"])
        assert runs.run(failed["id"], Deps.from_settings()) == "done"
    with session_scope() as session:
        job = records.get_job(session, failed["id"])
        assert (job.status, job.run, job.forge, job.project) == ("done", 2, "local", str(repo.resolve()))
        chosen = [a for a in records.job_attempts(session, job.id) if a.chosen]
    assert [(a.run, a.status) for a in chosen] == [(2, "verified")] and "+    return a + b" in (chosen[0].patch or "")


def test_a_retried_local_job_whose_folder_is_gone_fails_saying_so(frogfix_env: dict[str, Any], tmp_path: Path) -> None:
    from worker.job import runs
    from worker.job.job_context import Deps

    gone = tmp_path / "gone" / "calc"
    with session_scope() as session:
        job_id = local.create(session, folder=str(gone), title="t", body="b", who="alice", kind="fix")
        transitions.set_status(session, job_id, JobStatus.failed, error="the first run failed")
        transitions.retry_job(session, job_id, "bob")
    with session_scope() as session:
        assert transitions.claim_job(session, job_id)
    assert runs.run(job_id, Deps.from_settings()) == "failed"
    with session_scope() as session:
        job = records.get_job(session, job_id)
    assert job.status == "failed" and f"the folder {gone} is gone" in (job.error or "")


def test_a_local_job_whose_fix_died_follows_a_workers_job_rule(frogfix_env: dict[str, Any], tmp_path: Path) -> None:
    """Its heartbeat goes stale: the sweep queues it again, and a worker then runs it from its folder
    (here gone: the job fails saying so), never leaving it `running`."""
    from datetime import timedelta

    from app.models import utcnow
    from worker.job import runs
    from worker.job.job_context import Deps

    gone = tmp_path / "gone" / "calc"
    with session_scope() as session:
        job_id = local.create(session, folder=str(gone), title="t", body="b", who="alice", kind="fix")
        records.update_job(session, job_id, heartbeat_at=utcnow() - timedelta(hours=1))
    with session_scope() as session:
        assert transitions.recover_stale_jobs(session, timedelta(minutes=5), max_runs=3) == [(job_id, "requeued")]
    with session_scope() as session:
        assert records.get_job(session, job_id).status == "queued" and transitions.claim_job(session, job_id)
    assert runs.run(job_id, Deps.from_settings()) == "failed"
    with session_scope() as session:
        assert records.get_job(session, job_id).run == 2


@pytest.mark.bwrap
def test_a_fix_stopped_by_a_signal_ends_its_job_cancelled(local_env: dict[str, Any], tmp_path: Path) -> None:
    import signal

    repo = make_sample_repo(tmp_path)
    forever = assistant(None, tool_calls=[tool_call("Bash", {"command": "sleep 0.3"})])
    with ScriptedOpenAIServer(lambda _i, _b: forever) as server:
        proc = _fix(repo, server.base_url, FROGFIX_LEAF_MAX_STEPS="500")
        try:
            # The fix's first step.
            wait_until(lambda: any(j["status"] == "running" and j["steps"] > 0 for j in listed()), timeout=POLL_S)
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=POLL_S)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    [ended] = listed()
    assert ended["status"] == "cancelled" and "stopped by SIGTERM" in ended["error"], ended


def test_two_local_jobs_on_one_folder_are_two_issues_of_it(frogfix_env: dict[str, Any]) -> None:
    with session_scope() as session:
        first = local.create(session, folder="/r/calc", title="a", body="", who="alice", kind="fix")
        second = local.create(session, folder="/r/calc", title="b", body="", who="alice", kind="demo")
        other = local.create(session, folder="/r/other", title="c", body="", who="alice", kind="fix")
        issues = [records.get_job(session, j).issue for j in (first, second, other)]
        statuses = {records.get_job(session, j).status for j in (first, second, other)}
    assert issues == [1, 2, 1] and statuses == {"running"}  # claimed by the process that made it, never queued


# -- older records --------------------------------------------------------------------------------

LOCAL_ID = "local-20261130-101500-a1b2c3"


def old_record(**fields: Any) -> dict[str, Any]:
    """A record as the previous version's `fix` wrote it (app/local_jobs.py's `LocalJobRecord`)."""
    usage = {"prompt_tokens": 9390, "completion_tokens": 227, "cached_tokens": 6733, "calls": 4, "steps": 4,
             "model_seconds": 1.25, "sandbox_seconds": 1.5}
    attempt = {"number": 1, "chosen": True, "outcome": "verified", "reason": "", "exit_reason": "agent", "steps": 4,
               "evidence": {"level": "failed_before"}, "changed_lines": 2, "flags": [], "usage": usage,
               "status": "verified", "trajectory_path": f"trajectories/{LOCAL_ID}.json",
               "patch": "--- a/calc.py\n+++ b/calc.py\n-    return a - b\n+    return a + b\n",
               "summary": "Fixed add().",
               "tests": {"command": "python3 -m pytest -q", "evidence": {"level": "failed_before"}},
               "error": None}
    return {
        "record_format": "frogfix-local-job", "format_version": 1, "id": LOCAL_ID, "kind": "demo",
        "title": "add() returns the difference", "body": "2 + 3 is -1", "repository": "/tmp/frogfix-demo-x/calc",
        "base_commit": "ab" * 20, "model": "ReplayModel (no model server)", "model_url": None, "status": "fixed",
        "pid": 1, "host": "elsewhere", "exit_reason": "agent", "error": None, "steps": 4,
        "created_at": "2026-11-30T10:15:00.000+00:00", "started_at": "2026-11-30T10:15:00.000+00:00",
        "finished_at": "2026-11-30T10:15:09.000+00:00",
        "events": [{"id": 1, "at": "2026-11-30T10:15:00.000+00:00", "kind": "created", "message": "demo started"},
                   {"id": 2, "at": "2026-11-30T10:15:09.000+00:00", "kind": "finished", "message": "ended fixed"}],
        "attempts": [attempt], "selection": {"chosen": 1, "attempts": 1}, "usage": usage, "environment": None,
        "flags": [], "summary": "Fixed add().", "tests": attempt["tests"], "evidence": {"level": "failed_before"},
        **fields,
    }


def plant(data_dir: Path, name: str, document: Any) -> None:
    folder = data_dir / local.OLD_RECORDS
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(document if isinstance(document, str) else json.dumps(document))


def test_an_old_record_is_imported_once_with_its_usage_attempts_events_trajectory_and_patch(
    signed_in: Any, data_dir: Path
) -> None:
    plant(data_dir, LOCAL_ID, old_record())
    (data_dir / "trajectories").mkdir(parents=True, exist_ok=True)
    saved = {"trajectory_format": "leaf-function-calling", "job_id": LOCAL_ID, "messages": [], "steps": []}
    (data_dir / f"trajectories/{LOCAL_ID}.json").write_text(json.dumps(saved))
    with session_scope() as session:
        [job_id] = local.import_records(session, data_dir)
    with session_scope() as session:
        assert local.import_records(session, data_dir) == []  # a second import adds nothing
        assert session.query(Job).count() == 1
        job = records.get_job(session, job_id)
        assert (job.forge, job.project, job.status, job.trigger_user) == (
            "local", "/tmp/frogfix-demo-x/calc", "done", "./manage.py demo")
        assert (job.usage.prompt_tokens, job.usage.cached_tokens, job.usage.steps) == (9390, 6733, 4)
        assert job.title == "add() returns the difference" and job.base_commit == "ab" * 20
        [attempt] = records.job_attempts(session, job_id)
        assert attempt.trajectory_path == f"trajectories/{LOCAL_ID}.json"
        assert "+    return a + b" in (attempt.patch or "")
        assert attempt.chosen and attempt.status == "verified" and attempt.prompt_tokens == 9390
        assert [e.kind for e in records.job_events(session, job_id)] == ["created", "finished", "imported"]
        assert local.by_local_id(session, LOCAL_ID) == job_id
    shown = manage("show", LOCAL_ID)
    assert shown.returncode == 0 and shown.stdout.startswith(f"job {job_id}: done\n"), shown.stderr
    assert signed_in.get(f"/jobs/{LOCAL_ID}").status_code == 200
    assert "9,390" in signed_in.get("/usage?days=30").text
    assert signed_in.get(f"/jobs/{job_id}/attempts/{attempt.id}/trajectory.json").status_code == 200
    assert [i["id"] for i in json.loads(manage("jobs", "--json").stdout)["items"]] == [job_id]


@pytest.mark.parametrize(("fields", "status", "error"), [
    ({"status": "no_fix"}, "no_fix", None),
    ({"status": "environment_error", "error": "no tests"}, "failed", "no tests"),
    ({"status": "failed", "exit_reason": "cancelled", "error": "the run stopped"}, "cancelled", "the run stopped"),
    ({"status": "running", "finished_at": None}, "failed", local.STOPPED),
])
def test_an_old_records_ending_becomes_a_job_status(
    frogfix_env: dict[str, Any], fields: dict[str, Any], status: str, error: str | None
) -> None:
    plant(frogfix_env["data_dir"], LOCAL_ID, old_record(**fields))
    with session_scope() as session:
        [job_id] = local.import_records(session, frogfix_env["data_dir"])
        job = records.get_job(session, job_id)
        assert (job.status, job.error) == (status, error) and job.finished_at is not None


@pytest.mark.parametrize(
    "text",
    [
        json.dumps(old_record(steps=1)).replace('"steps": 1,', '"steps": Infinity,'),
        json.dumps(old_record(steps=1)).replace('"steps": 1,', '"steps": 1e999,'),
        json.dumps(old_record(steps=10**30)),
        json.dumps(old_record(usage={"prompt_tokens": 10**30})),
        json.dumps(old_record(attempts=[{"number": 10**30}])),
        json.dumps(old_record(events=[{"id": 1}], title=None)).replace("null", "[" * 100_000 + "]" * 100_000, 1),
        "{not json",
        json.dumps({"id": LOCAL_ID}),
    ],
    ids=["infinity", "overflow", "steps-range", "usage-range", "attempt-number", "deep", "not-json", "foreign"],
)
def test_a_malformed_record_is_not_imported_and_the_others_are(frogfix_env: dict[str, Any], text: str) -> None:
    plant(frogfix_env["data_dir"], "local-bad", text)
    plant(frogfix_env["data_dir"], "local-good", old_record(title="the good one"))
    with session_scope() as session:
        local.import_records(session, frogfix_env["data_dir"])
    assert [(j["title"], j["forge"]) for j in listed()] == [("the good one", "local")]


def test_a_planted_record_names_no_other_file(signed_in: Any, data_dir: Path) -> None:
    (data_dir / "secret_key").write_text("SESSION-SIGNING-KEY")
    attempt = {"number": 1, "status": "verified", "trajectory_path": "secret_key", "patch": "", "chosen": True}
    plant(data_dir, "local-planted", old_record(id="5", attempts=[attempt]))
    with session_scope() as session:
        [job_id] = local.import_records(session, data_dir)
        [row] = records.job_attempts(session, job_id)
    assert row.trajectory_path == "trajectories/local-planted.json"
    raw = signed_in.get(f"/jobs/{job_id}/attempts/{row.id}/trajectory.json")
    assert raw.status_code == 404 and "SESSION-SIGNING-KEY" not in raw.text


# -- pages ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/jobs/local-20261202-000000-abcdef",
        "/jobs/not-a-job",
        "/jobs/0",
        "/jobs/007",
        "/jobs/99999999999999",
        "/jobs/424242",
        "/jobs/local-20261202-000000-abcdef/attempts/1/trajectory",
        "/jobs/424242/attempts/1/trajectory",
        "/jobs/%2e%2e%2fsecrets/attempts/1/trajectory",
    ],
)
def test_unknown_job_ids_get_the_not_found_page(signed_in: Any, path: str) -> None:
    response = signed_in.get(path, headers={"accept": BROWSER_ACCEPT})
    assert response.status_code == 404, path
    assert response.headers["content-type"].startswith("text/html") and "<h1>Not found</h1>" in response.text


def test_scripts_keep_json_answers_for_what_is_not_there(signed_in: Any) -> None:
    for path in ("/api/jobs/424242", "/jobs/424242/attempts/1/trajectory.json", "/jobs/424242/progress"):
        response = signed_in.get(path, headers={"accept": BROWSER_ACCEPT})
        assert response.status_code == 404 and response.headers["content-type"] == "application/json", path
    assert signed_in.get("/no/such/page").headers["content-type"] == "application/json"  # no text/html asked


def test_a_forge_jobs_page_shows_no_publishing_it_never_did(signed_in: Any, data_dir: Path) -> None:
    job_id = finished_job(data_dir, status="no_fix")  # admitted, agent started, then no fix
    with session_scope() as session:
        records.add_event(session, job_id, "not_verified", "attempt 1: tests before exit 1, after exit 1")
    states = stage_states(signed_in.get(f"/jobs/{job_id}").text)
    assert states["verifying"] == "done" and states["publishing"] == "skipped" and states["no_fix"] == "ended"
    assert states["prepared"] == "skipped", states  # the scenario's job has no `prepared` event
    failed = finished_job(data_dir, status="failed", issue=8)
    states = stage_states(signed_in.get(f"/jobs/{failed}").text)
    assert states["agent"] == "done" and states["verifying"] == states["publishing"] == "skipped", states
    done = finished_job(data_dir, status="done", issue=9)
    states = stage_states(signed_in.get(f"/jobs/{done}").text)
    assert states["publishing"] == states["verifying"] == "done" and states["done"] == "done", states
    queued = new_job(issue=77)
    states = stage_states(signed_in.get(f"/jobs/{queued}").text)
    assert states["queued"] == "current" and states["finished"] == "todo", states


def test_a_retrys_page_shows_the_current_run_not_the_last_ones_ending(signed_in: Any, data_dir: Path) -> None:
    job_id = finished_job(data_dir, status="no_fix", steps=6)
    with session_scope() as session:
        records.add_event(session, job_id, "not_verified", "attempt 1: tests before exit 1, after exit 1")
        transitions.retry_job(session, job_id, "alice")
    with session_scope() as session:
        assert transitions.claim_job(session, job_id)
        records.add_event(session, job_id, "admitted", "bob may trigger")
    page = signed_in.get(f"/jobs/{job_id}").text
    states = stage_states(page)
    assert states["admitted"] == "current" and states["agent"] == states["verifying"] == "todo", states
    status = re.search(r'<dd id="fact-status">(.*?)</dd>', page, re.S)
    assert status and status.group(1).strip() == "running", status  # not "running (the agent finished)"
    assert '<dd id="fact-steps">0</dd>' in page  # not run 1's 6 steps
    assert 'id="why"' not in page
