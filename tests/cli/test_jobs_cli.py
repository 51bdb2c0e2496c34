"""`manage.py jobs | show | cancel | retry` in a child process, against the test's own database and broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import records
from app.models import Job, JobAttempt, utcnow

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def manage(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """manage.py with the FROGFIX_* environment the fixture set (plus `env`)."""
    return subprocess.run(
        [sys.executable, str(MANAGE), *args],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def add_job(status: str, *, forge: str = "gitlab", project: str = "acme/calc", issue: int = 1, age: int = 0,
            **fields: Any) -> int:
    now = utcnow() - timedelta(minutes=age)
    with session_scope() as s:
        job = Job(forge=forge, project=project, issue=issue, status=status, title=f"bug {issue}",
                  trigger_user="dev", created_at=now, updated_at=now, **fields)
        s.add(job)
        s.flush()
        records.add_event(s, job.id, "created", f"label added on issue {issue}")
        return job.id


@pytest.fixture
def three_jobs(frogfix_env: dict[str, Any]) -> dict[str, int]:
    done = add_job(
        "done", issue=3, age=30, mr_url="https://gitlab.example/acme/calc/-/merge_requests/7", run=1,
        base_commit="2ab0eb359c65fbedec34653546507a73f1e232ab", branch="frogfix/issue-3", steps=4,
        exit_reason="agent",
    )
    with session_scope() as s:
        s.add(JobAttempt(job_id=done, run=1, number=1, status="verified", exit_reason="agent", steps=4,
                         trajectory_path="/data/trajectories/job-1-run-1-1.json",
                         tests={"command": "pytest", "before": {"exit_code": 1}, "after": [{"exit_code": 0}] * 2}))
        records.add_event(s, done, "verified", "attempt 1: tests before exit 1, after exit 0, 0; " * 4)
        records.add_event(s, done, "done", "opened draft https://gitlab.example/acme/calc/-/merge_requests/7")
    failed = add_job("failed", forge="gitea", project="acme/" + "very-long-name" * 5, issue=4, age=20,
                     error="the forge or git server kept failing")
    queued = add_job("queued", issue=5, age=10)
    return {"done": done, "failed": failed, "queued": queued}


def test_jobs_lists_and_filters_like_the_dashboard(three_jobs: dict[str, int]) -> None:
    out = json.loads(manage("jobs", "--json").stdout)
    assert out["total"] == 3
    assert [j["id"] for j in out["items"]] == [three_jobs["queued"], three_jobs["failed"], three_jobs["done"]]
    assert {"id", "forge", "project", "issue", "status", "trigger_user", "mr_url", "created_at"} <= set(out["items"][0])

    failed = json.loads(manage("jobs", "--status", "failed", "--json").stdout)
    assert failed["total"] == 1 and failed["items"][0]["forge"] == "gitea"
    assert json.loads(manage("jobs", "--forge", "gitea", "--json").stdout)["total"] == 1
    assert json.loads(manage("jobs", "--project", "acme/calc", "--json").stdout)["total"] == 2
    page = json.loads(manage("jobs", "--limit", "1", "--offset", "1", "--json").stdout)
    assert page["total"] == 3 and [j["id"] for j in page["items"]] == [three_jobs["failed"]]

    human = manage("jobs")
    assert human.returncode == 0
    lines = human.stdout.splitlines()
    assert lines[0].split() == ["ID", "STATUS", "FORGE", "ISSUE", "CREATED", "(UTC)"]
    assert "acme/calc#3" in human.stdout and "jobs 1-3 of 3" in lines[-1]
    assert max(len(line) for line in lines) <= 80  # the long project name is cut to fit

    bad = manage("jobs", "--status", "finished")
    assert bad.returncode == 2 and bad.stderr.startswith("frogfix jobs: unknown status 'finished'")
    assert manage("jobs", "--status", "rejected").stdout.strip() == "no jobs match"


def test_show_prints_fields_attempts_and_timeline(three_jobs: dict[str, int]) -> None:
    done = three_jobs["done"]
    proc = manage("show", str(done))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    for expected in (
        f"job {done}: done",
        "acme/calc#3 on gitlab: bug 3",
        "https://gitlab.example/acme/calc/-/merge_requests/7",
        "2ab0eb359c65, branch frogfix/issue-3",
        "the agent finished after 4 steps",
        "1.1   verified",
        "timeline (UTC)",
        "created",
        "label added on issue 3",
    ):
        assert expected in text, expected
    assert "tests: before: failed; after: passed (2 runs)" in " ".join(text.split())  # wrapped to fit
    assert "  why " not in text  # a job that is done needs none
    assert all(len(line) <= 80 for line in text.splitlines() if "/data/" not in line and "://" not in line)

    data = json.loads(manage("show", str(done), "--json").stdout)
    assert data["id"] == done and data["mr_url"].endswith("/7")
    assert data["attempts"][0]["tests"]["before"]["exit_code"] == 1
    assert [e["kind"] for e in data["events"]] == ["created", "verified", "done"]


def test_show_prints_where_each_trajectory_is_in_this_data_folder(three_jobs: dict[str, int],
                                                                    frogfix_env: dict[str, Any]) -> None:
    """Jobs store the path relative to the data folder; older ones an absolute path that may have moved."""
    done = three_jobs["done"]
    here = Path(os.path.realpath(frogfix_env["data_dir"])) / "trajectories"
    with session_scope() as s:
        for number, stored in enumerate(("trajectories/job-1-run-2-1.json", "../../etc/passwd"), 1):
            s.add(JobAttempt(job_id=done, run=2, number=number, status="no_fix", trajectory_path=stored))
    text = manage("show", str(done)).stdout
    assert f"{here}/job-1-run-1-1.json" in text  # stored as /data/trajectories/..., a folder since moved
    assert f"{here}/job-1-run-2-1.json" in text
    assert "../../etc/passwd is outside this server's data folder" in text
    data = json.loads(manage("show", str(done), "--json").stdout)
    stored = [a["trajectory_path"] for a in data["attempts"]]
    assert stored[1:] == ["trajectories/job-1-run-2-1.json", "../../etc/passwd"]  # as recorded


def test_show_finds_a_local_job_from_before_records_by_its_old_id(frogfix_env: dict[str, Any]) -> None:
    """A `fix` from before local jobs had records left its trajectory only: it is imported as a job once."""
    from app import trajectory

    (frogfix_env["data_dir"] / trajectory.DIRECTORY).mkdir(parents=True, exist_ok=True)
    broken = frogfix_env["data_dir"] / trajectory.local_path("local-20260101-000000-broken")
    broken.write_text("{cut short")
    path = frogfix_env["data_dir"] / trajectory.local_path("local-20260101-000000-abcdef")
    document = {"trajectory_format": "leaf-function-calling", "repository": "/src/calc", "base_commit": "ab" * 20,
                "exit_reason": "agent", "n_steps": 3, "fix": {"status": "fixed", "flags": []}, "messages": []}
    trajectory.write_atomic(path, json.dumps(document).encode())
    data = json.loads(manage("show", "local-20260101-000000-abcdef", "--json").stdout)
    summary = (data["forge"], data["project"], data["status"], data["steps"], data["attempts"][0]["trajectory_path"])
    assert summary == ("local", "/src/calc", "done", 3, "trajectories/local-20260101-000000-abcdef.json")
    shown = manage("show", "local-20260101-000000-abcdef").stdout
    assert shown.startswith(f"job {data['id']}: done\n") and str(path.resolve()) in shown
    assert manage("show", str(data["id"])).stdout == shown
    for unknown in ("local-nothing-here", "local-../../x", "local-20260101-000000-broken"):
        proc = manage("show", unknown)
        assert proc.returncode == 2 and proc.stderr.strip() == f"frogfix show: no job with id {unknown!r}"


def test_cancel_and_retry(three_jobs: dict[str, int]) -> None:
    queued, failed, done = three_jobs["queued"], three_jobs["failed"], three_jobs["done"]

    proc = manage("cancel", str(queued))
    assert proc.returncode == 0 and proc.stdout.strip() == f"job {queued} cancelled"
    again = manage("cancel", str(queued))
    assert again.returncode == 1 and again.stderr.strip() == f"frogfix cancel: job {queued} is already cancelled"
    with session_scope() as s:
        s.get(Job, done).status = "publishing"  # type: ignore[union-attr]
    late = manage("cancel", str(done))
    assert late.returncode == 1 and "not cancelled: the job was already publishing" in late.stderr, late.stderr
    with session_scope() as s:
        s.get(Job, done).status = "done"  # type: ignore[union-attr]

    proc = manage("retry", str(failed))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"job {failed} queued again and sent to the workers"
    with session_scope() as s:
        job = records.get_job(s, failed)
        assert job.status == "queued" and job.error is None and job.last_enqueued_at is not None
        assert [e.kind for e in records.job_events(s, failed)][-1] == "retried"

    refused = manage("retry", str(done))
    assert refused.returncode == 1 and "only failed, no_fix, cancelled, rejected jobs" in refused.stderr

    # The broker is unusable: the job is queued all the same and the sweep sends it later. (An
    # unknown transport fails at once; a refused Redis connection takes seconds to give up.)
    down = manage("retry", str(queued), env={"FROGFIX_BROKER_URL": "nosuch://broker"})
    assert down.returncode == 0, down.stderr
    assert "the sweep will send it" in down.stdout
    with session_scope() as s:
        job = records.get_job(s, queued)
        assert job.status == "queued" and job.last_enqueued_at is None


def test_unknown_jobs_are_one_line_errors_with_exit_2(frogfix_env: dict[str, Any]) -> None:
    cases = [("show", "77", "77"), ("cancel", "77", "77"), ("retry", "nope", "'nope'"), ("show", "x y", "'x y'")]
    for command, job, shown in cases:  # replay's own are in tests/replay
        proc = manage(command, job)
        assert proc.returncode == 2, (command, proc.stderr)
        assert proc.stderr.strip() == f"frogfix {command}: no job with id {shown}", proc.stderr
        assert proc.stdout == ""
