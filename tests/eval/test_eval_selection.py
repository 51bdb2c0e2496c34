"""Which recorded jobs an evaluation takes, what it knows of their recorded run, and who may record results."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from app import trajectory
from app.db import session_scope
from app.evaluation_report import build_report
from app.jobs import evaluations as ev_records
from app.jobs.evaluations import parse_selector
from app.models import Job, JobAttempt
from app.settings import get_settings
from tests.eval.conftest import recorded_job
from worker.commands.evaluate import CommandOptions, EvalError, EvalOptions, run_eval_command

FAILED_BEFORE = {"command": "pytest -q", "before": {"exit_code": 1}, "after": {"exit_code": 0}}


def _finished(status: str, attempts: int = 1, issue: int = 1) -> int:
    with session_scope() as session:
        job = Job(forge="gitlab", project="acme/calc", issue=issue, status=status)
        session.add(job)
        session.flush()
        for n in range(1, attempts + 1):
            session.add(JobAttempt(job_id=job.id, number=n, status="no_fix", tests=FAILED_BEFORE))
        return job.id


def test_the_default_set_is_real_verdicts_and_other_statuses_only_when_asked(frogfix_env: dict[str, Any]) -> None:
    """A crashed, cancelled or rejected job has no model verdict: a candidate solving it is not a gain."""
    ids = {status: _finished(status, issue=i) for i, status in enumerate(
        ("done", "no_fix", "failed", "cancelled", "rejected"), start=1)}
    with session_scope() as session:
        default = [c.key for c in ev_records.finished_jobs_with_tests(session, parse_selector(""))]
        failed = [c.key for c in ev_records.finished_jobs_with_tests(session, parse_selector("status=failed"))]
    assert default == [str(ids["done"]), str(ids["no_fix"])]
    assert failed == [str(ids["failed"])]


def test_the_recorded_runs_attempt_count_is_frozen_and_lost_compares_like_with_like(
    frogfix_env: dict[str, Any]
) -> None:
    """A job that needed 3 attempts is pass@3 evidence: a candidate given 1 attempt has not 'lost' it."""
    job = _finished("done", attempts=3)
    with session_scope() as session:
        (found,) = ev_records.finished_jobs_with_tests(session, parse_selector(""))
    assert found.attempts == 3
    task = {"key": str(job), "recorded_solved": True, "recorded_attempts": 3}
    result = {"task": str(job), "attempt": 1, "solved": False, "outcome": "no_patch", "exit_reason": "agent",
              "steps": 1, "prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 0, "model_seconds": 0.0,
              "wall_seconds": 0.0, "trajectory": None, "reason": ""}
    report = build_report({"id": 1, "model": "m", "attempts": 1, "tasks": [task]}, [result])
    assert report["lost"] == [] and report["not_comparable"] == [str(job)]
    assert "3 attempts" in report["recorded"]["solve_rate"]["method"]
    assert report["tasks"][0]["recorded_attempts"] == 3
    report3 = build_report({"id": 1, "model": "m", "attempts": 3, "tasks": [task]},
                           [{**result, "attempt": n} for n in (1, 2, 3)])
    assert report3["lost"] == [str(job)]


def test_a_result_from_a_process_that_lost_its_claim_is_not_recorded(frogfix_env: dict[str, Any]) -> None:
    with session_scope() as session:
        eid = ev_records.create_evaluation(session, model="m", base_url="", selector="", attempts=1,
                                           tasks=[{"key": "1"}], who=None)
    old, new = ev_records.Runner("elsewhere", 1, "1"), ev_records.Runner("elsewhere", 2, "2")
    with session_scope() as session:
        ev_records.claim(session, eid, old, 60)
    with session_scope() as session:
        ev_records.claim(session, eid, new, 0)  # stale: taken over
    values = {"task": "1", "attempt": 1, "solved": True, "outcome": "verified"}
    with session_scope() as session:
        assert not ev_records.record_result(session, eid, values, old)
    with session_scope() as session:
        assert ev_records.finished_pairs(session, eid) == set()
        assert ev_records.record_result(session, eid, values, new)
    with session_scope() as session:
        assert ev_records.finished_pairs(session, eid) == {("1", 1)}


def test_resuming_with_another_model_is_refused(frogfix_env: dict[str, Any]) -> None:
    with session_scope() as session:
        real = ev_records.create_evaluation(session, model="qwen", base_url="http://gpu:30000/v1", selector="",
                                            attempts=1, tasks=[{"key": "1"}], who=None)
    with pytest.raises(EvalError, match="scripted"):
        run_eval_command(EvalOptions("scripted:demo", ""), CommandOptions(resume=real, scripted="demo"),
                         lambda _m: None)
    with pytest.raises(EvalError, match="model"):
        run_eval_command(EvalOptions("other", "http://x/v1"), CommandOptions(resume=real, model="other"),
                         lambda _m: None)


def test_a_job_whose_tests_passed_before_is_no_task(frogfix_env: dict[str, Any]) -> None:
    """Tests that passed on the base commit cannot tell a fix from no fix: such a job is never selected."""
    from worker.commands.evaluate import select_tasks

    failed_before = _finished("done")
    with session_scope() as session:
        job = Job(forge="gitlab", project="acme/calc", issue=2, status="done")
        session.add(job)
        session.flush()
        passed = {"command": "pytest -q", "before": {"exit_code": 0}, "after": {"exit_code": 0}}
        session.add(JobAttempt(job_id=job.id, number=1, status="verified", tests=passed))
        passed_before = job.id
    settings = get_settings()
    assert [t["key"] for t in select_tasks(parse_selector(""), settings)] == [str(failed_before)]
    assert select_tasks(parse_selector(str(passed_before)), settings) == []
    assert select_tasks(parse_selector(f"status=done, {passed_before}"), settings) == []


@pytest.mark.bwrap
def test_local_jobs_are_dated_by_their_id_not_the_files_mtime(local_env: dict[str, Any], tmp_path: Path) -> None:
    """An older local job's trajectory copied, restored or touched keeps its job's date once imported (app/jobs/
    local.py): the UTC stamp in `local-YYYYMMDD-HHMMSS-…`, else the trajectory's start, never the file's mtime."""
    from app.jobs import local
    from worker.commands.evaluate import local_job_time, select_tasks

    real = recorded_job(tmp_path / "a", solved=True)
    folder = local_env["data_dir"] / trajectory.DIRECTORY
    original = json.loads((folder / f"job-{real}-run-1-1.json").read_text())

    def copy(key: str, change: Callable[[dict[str, Any]], None] = lambda _d: None) -> None:
        data = json.loads(json.dumps(original))
        data["job_id"] = key
        change(data)
        (folder / f"{key}.json").write_text(json.dumps(data))  # written now: its mtime is today

    copy("local-20200105-101010-aaaaaa")
    copy("local-20200106-090000-bbbbbb", lambda d: d["fix"]["tests"]["before"].update(exit_code=0))  # passed before
    copy("local-named-by-hand", lambda d: d.update(started_at="2020-01-07T08:00:00+00:00"))
    os.utime(folder / f"job-{real}-run-1-1.json", (0, 0))  # the real job's file claims 1970; its row says today
    today = datetime.now(UTC).strftime("%Y-%m-%d")

    def keys(selector: str) -> list[str]:
        found = [t["key"] for t in select_tasks(parse_selector(selector), get_settings())]
        with session_scope() as session:
            names = {str(local.by_local_id(session, old)): old for old in local.imported_ids(session)}
        return [names.get(key, key) for key in found]

    assert sorted(keys("")) == sorted([real, "local-20200105-101010-aaaaaa", "local-named-by-hand"])
    assert keys("until=2020-01-31") == ["local-20200105-101010-aaaaaa", "local-named-by-hand"]
    assert keys("since=2020-01-06, until=2020-01-31") == ["local-named-by-hand"]
    assert keys("until=2020-01-05") == ["local-20200105-101010-aaaaaa"]  # `until` takes the whole day
    assert keys(f"since={today}") == [real]
    assert local_job_time("local-20200105-101010-aaaaaa", {}) == datetime(2020, 1, 5, 10, 10, 10, tzinfo=UTC)
    assert local_job_time("local-x", {"started_at": "not a time"}) is None
