"""The fair queue and per-project budgets (app/jobs/scheduler.py), on SQLite and PostgreSQL.

A flood from one project cannot starve another; a job over its project's budget waits, queued,
with the reason on the job, and runs once the budget allows without anyone sending it again;
every claim stays guarded, so no job runs twice in one run number.
"""

from __future__ import annotations

import base64
import json
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from app.db import session_scope
from app.forge.webhook import WebhookEvent
from app.jobs import intake, records, scheduler, transitions
from app.models import Job, JobAttempt, utcnow
from app.settings import ProjectLimits, Settings, get_settings
from app.statuses import RUN_STATUSES, JobStatus
from app.sweep import sweep_once
from tests.conftest import ADMIN_TOKEN, configure, shared_fixture
from tests.doubles.gitlab_api import GitLabDouble
from worker.tasks import release_after_run, run_job

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


_deliveries = Counter[str]()


def queue(project: str, issue: int, forge: str = "gitlab") -> int:
    """A job as a webhook creates it (committed, stamped as sent)."""
    _deliveries[project] += 1
    delivery = f"{project}-{issue}-{_deliveries[project]}"
    event = WebhookEvent(forge, delivery, "Issue Hook", "start", "t", project=project, issue=issue)  # type: ignore[arg-type]
    with session_scope() as s:
        job_id = intake.record_delivery(s, event).job_id
    assert job_id is not None
    return job_id


def claim(ticket: int, now: datetime | None = None) -> int | None:
    """What a worker does with a ticket, up to the pipeline: the fair claim."""
    with session_scope() as s:
        got = scheduler.claim_next(s, get_settings(), now or utcnow(), preferred=ticket)
    return None if got is None else got.job_id


def end(job_id: int) -> None:
    with session_scope() as s:
        assert transitions.set_status(s, job_id, JobStatus.done, expected=RUN_STATUSES)


def job(job_id: int) -> Job:
    with session_scope() as s:
        return records.get_job(s, job_id)


def kinds(job_id: int) -> list[str]:
    with session_scope() as s:
        return [e.kind for e in records.job_events(s, job_id)]


def broker_tickets(data_dir: Path) -> Counter[int]:
    """Job ids of the run_job messages waiting in the embedded (filesystem) broker."""
    ids: Counter[int] = Counter()
    for path in (data_dir / "broker" / "queue").iterdir():
        message = json.loads(path.read_bytes())
        if message.get("headers", {}).get("task") == "frogfix.run_job":
            ids[int(json.loads(base64.b64decode(message["body"]))[0][0])] += 1
    return ids


# -- the fair order ---------------------------------------------------------------------------


def test_a_flood_from_one_project_does_not_starve_another(database: str) -> None:
    flood = [queue("big/flood", n) for n in range(1, 7)]
    small = queue("small/one", 1)
    # two worker slots take the tickets in the broker's order: flood[0], flood[1], ...
    assert claim(flood[0]) == flood[0]
    assert claim(flood[1]) == small  # first in, first out would run flood[1] and keep `small` waiting behind all six
    end(flood[0])
    assert claim(flood[2]) == flood[2]  # a ticket runs its own job when fair: the flood keeps the broker's order
    assert claim(small) == flood[1]  # the small project's ticket, its job already running, runs the flood's oldest
    assert kinds(small)[-1] == "created" and job(small).run == 1


def test_ties_go_round_robin_so_a_third_project_is_not_starved(frogfix_env: dict[str, Any]) -> None:
    a = [queue("team/a", n) for n in range(1, 4)]
    b = [queue("team/b", n) for n in range(1, 4)]
    c = queue("team/c", 1)
    assert claim(a[0]) == a[0]
    assert claim(a[1]) == b[0]
    end(a[0])
    # a and c both have none running; a was served a moment ago, c never: c goes first
    assert claim(a[2]) == c
    end(b[0])
    assert claim(b[1]) in (a[1], b[1])  # a and b have each been served; the longest ago of them goes
    assert {job(j).status for j in (a[0], b[0])} == {"done"}


def test_each_ticket_runs_at_most_one_job_and_no_job_twice(frogfix_env: dict[str, Any]) -> None:
    first, second = queue("one/project", 1), queue("one/project", 2)
    assert claim(second) == second  # the ticket's own job while it is queued: the broker's order holds
    assert claim(second) == first  # a redelivered ticket whose job already runs runs the next job
    assert claim(second) is None and claim(first) is None  # nothing queued: nothing runs
    assert job(first).run == job(second).run == 1


def test_concurrent_claims_run_each_job_once_and_keep_max_running(database: str, frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], project_max_running="2")
    ids = [queue("p/a", n) for n in range(1, 6)] + [queue("p/b", n) for n in range(1, 4)]
    barrier = threading.Barrier(10)
    got: list[int | None] = []

    def worker(ticket: int) -> None:
        barrier.wait()
        got.append(claim(ticket))

    threads = [threading.Thread(target=worker, args=(ids[i % len(ids)],)) for i in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    claimed = [j for j in got if j is not None]
    assert len(got) == 10 and len(claimed) == len(set(claimed)) == 4, got
    assert Counter(job(j).project for j in claimed) == {"p/a": 2, "p/b": 2}
    assert all(job(j).run == 1 for j in claimed)
    waiting = [j for j in ids if j not in claimed]
    assert all("waiting for a slot: 2 of the project's 2" in (job(j).hold_reason or "") for j in waiting)


def test_one_ticket_delivered_to_many_workers_at_once_runs_the_job_once(database: str) -> None:
    job_id = queue("a/b", 1)
    barrier = threading.Barrier(6)
    results: list[str] = []

    def deliver() -> None:
        barrier.wait()
        results.append(run_job(job_id))

    threads = [threading.Thread(target=deliver) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert sorted(results) == ["failed"] + ["not_claimed"] * 5  # no forge configured: a clear, final failure
    assert kinds(job_id).count("claimed") == 1 and job(job_id).run == 1


# -- budgets ------------------------------------------------------------------------------------


def test_project_limits_setting_exact_path_beats_pattern_and_zero_means_no_limit(
    frogfix_env: dict[str, Any],
) -> None:
    limits = '{"acme/*": {"max_running": 4}, "acme/app": {"tokens_per_day": 0}, "x/y": {}}'
    configure(frogfix_env["monkeypatch"], project_limits=limits, project_max_running="2",
              project_tokens_per_day="1000")
    s = get_settings()
    assert s.limits_for("acme/app") == ProjectLimits(max_running=2, tokens_per_day=0)
    assert s.limits_for("acme/lib") == ProjectLimits(max_running=4, tokens_per_day=1000)
    assert s.limits_for("x/y") == s.limits_for("other/z") == ProjectLimits(max_running=2, tokens_per_day=1000)
    with pytest.raises(ValueError, match="max_runing"):
        Settings(project_limits={"a/b": {"max_runing": 1}})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="greater than or equal to 0"):
        Settings(project_limits={"a/b": {"tokens_per_day": -5}})  # type: ignore[dict-item]


def test_over_the_concurrency_limit_a_job_waits_with_the_reason_and_starts_when_one_ends(
    frogfix_env: dict[str, Any], client: Any
) -> None:
    """End to end through `run_job`: a real pipeline holds the project's one slot (its forge call hangs)."""
    forge = GitLabDouble(token="glpat-fairness-test", fixtures=shared_fixture("MANIFEST.json").parent)
    configure(frogfix_env["monkeypatch"], project_limits='{"acme/app": {"max_running": 1}}',
              gitlab_url=forge.base_url, gitlab_token="glpat-fairness-test", forge_retry_budget_seconds="1")
    forge.hang_next(1, 120, method="GET", path_contains="/issues/")
    first, second = queue("acme/app", 1), queue("acme/app", 2)
    results: list[str] = []
    running = threading.Thread(target=lambda: results.append(run_job(first)))
    running.start()
    try:
        _wait(lambda: forge.calls("GET", "/issues/") != [])
        assert run_job(second) == "not_claimed"  # the slot is taken: the ticket is spent, the job stays
        held = job(second)
        assert held.status == "queued" and "waiting for a slot: 1 of the project's 1" in (held.hold_reason or "")
        api = client.get(f"/api/jobs/{second}", headers=AUTH).json()
        assert api["status"] == "queued" and api["hold_reason"] == held.hold_reason
        assert sweep_once(older_than_s=0) == (0, 0)  # held, so not sent again only to be held again
    finally:
        forge.close()  # the hung call ends; the first job fails (no forge), and its worker releases the second
        running.join(60)
    assert results == ["failed"] and job(first).status == "failed"
    assert broker_tickets(frogfix_env["data_dir"])[second] >= 1  # sent by the worker that ended the first
    assert job(second).hold_reason is None and kinds(second)[-2:] == ["held", "released"]
    assert run_job(second) == "failed"  # the forge is gone; what counts is that it was claimed and ran
    assert kinds(second).count("claimed") == 1 and job(second).run == 1


def _attempt(job_id: int, started: datetime, prompt: int, completion: int) -> None:
    with session_scope() as s:
        s.add(JobAttempt(job_id=job_id, run=1, number=1, status="no_fix", started_at=started,
                         finished_at=started, prompt_tokens=prompt, completion_tokens=completion))


def test_over_the_token_budget_a_job_waits_until_the_next_utc_day(database: str, frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], project_tokens_per_day="1000")
    day = datetime(2026, 3, 10, tzinfo=UTC)
    spent = queue("acme/app", 1)
    claim(spent, day)
    end(spent)
    _attempt(spent, day + timedelta(hours=10), 900, 200)
    other = queue("other/app", 1)
    waiting = queue("acme/app", 2)

    noon = day + timedelta(hours=12)
    assert claim(waiting, noon) == other  # the ticket goes to a project within its budget
    assert claim(waiting, noon) is None
    reason = job(waiting).hold_reason or ""
    assert "waiting for tokens: the project used 1,100 of its 1,000 tokens today (UTC)" in reason
    assert "after 00:00 UTC" in reason and kinds(waiting)[-1] == "held"
    with session_scope() as s:
        assert scheduler.release_held(s, get_settings(), day + timedelta(hours=23, minutes=59)) == []
    tomorrow = day + timedelta(days=1, seconds=1)
    with session_scope() as s:
        assert scheduler.release_held(s, get_settings(), tomorrow) == [waiting]
    assert job(waiting).hold_reason is None and job(waiting).last_enqueued_at is None  # the sweep sends it now
    assert claim(waiting, tomorrow) == waiting


def test_a_raised_token_limit_lets_the_sweep_send_the_held_job(frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], project_tokens_per_day="1000")
    spent = queue("acme/app", 1)
    claim(spent)
    end(spent)
    _attempt(spent, utcnow(), 1500, 10)
    waiting = queue("acme/app", 2)
    assert run_job(waiting) == "not_claimed" and job(waiting).hold_reason
    before = broker_tickets(frogfix_env["data_dir"])[waiting]
    assert sweep_once(older_than_s=0) == (0, 0)  # still over: not sent again
    configure(frogfix_env["monkeypatch"], project_limits='{"acme/app": {"tokens_per_day": 5000}}')
    assert sweep_once() == (1, 1)  # released and sent at once, without anyone re-sending it by hand
    assert broker_tickets(frogfix_env["data_dir"])[waiting] == before + 1
    assert run_job(waiting) == "failed" and job(waiting).run == 1  # claimed and run (no forge configured)


def test_cancelling_a_held_job_clears_its_hold(frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], project_max_running="1")
    running, held = queue("a/b", 1), queue("a/b", 2)
    assert claim(running) == running and claim(held) is None
    with session_scope() as s:
        assert transitions.cancel_job(s, held, "alice") == "cancelled"
    assert job(held).status == "cancelled" and job(held).hold_reason is None
    end(running)
    assert release_after_run(scheduler.Claimed(running, "gitlab", "a/b")) == []  # nothing left to release


def test_a_stale_job_requeued_by_the_sweep_frees_its_slot_and_counts_its_runs(frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], project_max_running="1", max_job_runs="2", stale_job_seconds="60")
    dead, held = queue("a/b", 1), queue("a/b", 2)
    assert claim(dead) == dead and claim(held) is None

    def worker_dies() -> None:
        with session_scope() as s:
            s.execute(update(Job).where(Job.id == dead).values(heartbeat_at=utcnow() - timedelta(minutes=5)))
        sweep_once()

    worker_dies()  # the sweep queues it again, and the slot it held lets the held job go
    assert job(dead).status == "queued" and job(held).hold_reason is None
    assert claim(dead) == dead and job(dead).run == 2  # the sweep's ticket: its second run
    assert claim(held) is None and job(held).hold_reason is not None
    worker_dies()  # its second dead worker: failed for good (FROGFIX_MAX_JOB_RUNS), and its slot is free again
    assert job(dead).status == "failed" and "stopped 2 times" in (job(dead).error or "")
    assert job(held).hold_reason is None
    assert claim(dead) == held and job(held).run == 1


def test_a_project_of_the_same_path_on_the_other_forge_has_a_budget_of_its_own(frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], project_max_running="1")
    gitlab, gitlab_2 = queue("acme/app", 1), queue("acme/app", 2)
    gitea = queue("acme/app", 1, forge="gitea")  # anyone who may create a Gitea repository can pick this path
    assert claim(gitlab) == gitlab
    assert claim(gitlab_2) == gitea  # the GitLab project is at its limit; the Gitea one is not
    assert job(gitlab_2).hold_reason is not None and job(gitea).status == "running"


def test_the_job_page_and_manage_show_say_why_a_job_waits(frogfix_env: dict[str, Any], client: Any) -> None:
    import os
    import subprocess
    import sys

    from tests.dashboard.conftest import make_operator, sign_in

    configure(frogfix_env["monkeypatch"], project_max_running="1")
    first, second = queue("a/b", 1), queue("a/b", 2)
    assert claim(first) == first and claim(second) is None
    make_operator()
    sign_in(client)
    page = client.get(f"/jobs/{second}").text
    assert 'id="hold-reason"' in page and "waiting for a slot: 1 of the project&#39;s 1" in page
    manage = Path(__file__).resolve().parent.parent / "manage.py"
    shown = subprocess.run([sys.executable, str(manage), "show", str(second)], env=dict(os.environ),
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "waiting for a slot: 1 of the project's 1 concurrent jobs" in " ".join(shown.stdout.split())


def _wait(cond: Any, timeout: float = 30.0) -> None:
    from tests.servers import wait_until

    wait_until(cond, timeout=timeout, interval=0.05)
