"""The usage page (per project and day: tokens, cached share, model hours, jobs, outcomes, chart),
the job page's usage table, and the usage counters on /metrics, from figures the worker's own
writer (records.record_usage) stored."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import read_model, records, transitions
from app.models import Job, JobAttempt, JobStatus, utcnow
from app.usage import UsageFigures
from tests.conftest import configure
from tests.dashboard.conftest import browser_sign_in, screenshot
from tests.dashboard.scenario import new_job


def used_job(project: str, issue: int, status: str, usage: UsageFigures, *, days_ago: int = 0,
             attempt_status: str | None = None, forge: str = "gitlab") -> int:
    """A job created `days_ago`, claimed, with one finished attempt holding `usage`, ended `status`."""
    job_id = new_job(project=project, issue=issue, forge=forge)
    with session_scope() as session:
        assert transitions.claim_job(session, job_id)
        attempt_id = records.start_attempt(session, job_id, 1, 1)
        records.update_attempt(session, attempt_id, finished=True, steps=usage.steps,
                               status=attempt_status or ("verified" if status == "done" else status))
        records.record_usage(session, job_id, attempt_id, usage)
        transitions.set_status(session, job_id, JobStatus(status))
        created = utcnow() - timedelta(days=days_ago)
        session.query(Job).filter(Job.id == job_id).update({"created_at": created})
        session.query(JobAttempt).filter(JobAttempt.id == attempt_id).update({"started_at": created})
    return job_id


def seed() -> dict[str, int]:
    """acme/calc: two jobs today, one yesterday; acme/web: one today, from a server without cache reports."""
    return {
        "calc-today-done": used_job("acme/calc", 1, "done", UsageFigures(10_000, 500, 8_000, 5, 5, 1800.0, 30.0)),
        "calc-today-nofix": used_job("acme/calc", 2, "no_fix", UsageFigures(6_000, 300, 3_000, 3, 3, 1800.0, 12.0)),
        "calc-yesterday": used_job("acme/calc", 3, "failed", UsageFigures(4_000, 100, 1_000, 2, 2, 360.0, 5.0),
                                   days_ago=1),
        "web-today": used_job("acme/web", 1, "done", UsageFigures(2_000, 50, 0, 1, 1, 36.0, 1.0)),
    }


def _row(html: str, table: str, project: str, day: str | None = None, forge: str = "gitlab") -> str:
    body = html[html.index(f'id="{table}"'):]
    body = body[: body.index("</table>")]
    day_attr = f' data-day="{day}"' if day else ""
    head = f'<tr data-forge="{re.escape(forge)}" data-project="{re.escape(project)}"{day_attr}>'
    match = re.search(rf"{head}(.*?)</tr>", body, re.S)
    assert match, f"no row for {forge} {project} {day} in {table}"
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", match.group(1))).strip()


def test_the_usage_page_shows_projects_days_and_a_chart(signed_in: Any) -> None:
    seed()
    today = utcnow().strftime("%Y-%m-%d")
    yesterday = (utcnow() - timedelta(days=1)).strftime("%Y-%m-%d")
    page = signed_in.get("/usage")
    assert page.status_code == 200
    html = page.text

    # Per project over the window: jobs, outcomes, prompt, cached, share, completion, model hours.
    assert _row(html, "usage-projects", "acme/calc") == (
        "gitlab acme/calc 3 done 1 no fix 1 failed 1 20,000 12,000 60% 900 1.10"
    )
    assert _row(html, "usage-projects", "acme/web") == "gitlab acme/web 1 done 1 2,000 0 0% 50 0.01"
    # Per project and day.
    assert _row(html, "usage-days", "acme/calc", today) == (
        f"{today} gitlab acme/calc 2 done 1 no fix 1 16,000 11,000 69% 800 1.00"
    )
    assert _row(html, "usage-days", "acme/calc", yesterday) == (
        f"{yesterday} gitlab acme/calc 1 failed 1 4,000 1,000 25% 100 0.10"
    )
    # The chart: one stacked bar per day, split into cached, uncached prompt and completion tokens.
    svg = html[html.index("<svg"): html.index("</svg>")]
    assert 'aria-label="Tokens per day, cached and not"' in svg
    assert f"<title>{today}: 11000 cached prompt tokens</title>" in svg
    assert f"<title>{today}: 7000 uncached prompt tokens</title>" in svg
    assert f"<title>{today}: 850 completion tokens</title>" in svg
    assert f"<title>{yesterday}: 1000 cached prompt tokens</title>" in svg
    assert 'href="/usage"' in html and 'aria-current="page"' in html

    only_web = signed_in.get("/usage", params={"project": "acme/web", "days": 7}).text
    assert 'data-project="acme/calc"' not in only_web and 'data-project="acme/web"' in only_web
    assert signed_in.get("/usage", params={"days": 0}).status_code == 422


def test_the_job_page_shows_each_attempts_usage_and_the_sum(signed_in: Any) -> None:
    job_id = seed()["calc-today-done"]
    with session_scope() as session:
        attempt_id = records.start_attempt(session, job_id, 2, 1)
        records.record_usage(session, job_id, attempt_id, UsageFigures(1_000, 10, 900, 1, 0, 4.0, 2.0))
        records.update_job(session, job_id, queue_wait_seconds=42.0)
    html = signed_in.get(f"/jobs/{job_id}").text
    table = html[html.index('id="usage-table"'):]
    table = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", table[: table.index("</table>")]))
    assert "attempt 1 of run 1 10,000 8,000 80% 500 5 5 30 min 00 s 30 s" in table
    assert "job 11,000 8,900 81% 510 6 5 30 min 04 s 32 s" in table
    assert re.search(r'id="fact-queue-wait">42 s<', html)


def test_metrics_count_usage_by_project_and_outcome(client: Any) -> None:
    seed()
    text = client.get("/metrics").text
    assert 'frogfix_tokens_total{forge="gitlab",kind="prompt",outcome="verified",project="acme/calc"} 10000.0' in text
    assert 'frogfix_tokens_total{forge="gitlab",kind="cached",outcome="no_fix",project="acme/calc"} 3000.0' in text
    assert 'frogfix_tokens_total{forge="gitlab",kind="completion",outcome="failed",project="acme/calc"} 100.0' in text
    assert 'frogfix_model_seconds_total{forge="gitlab",outcome="verified",project="acme/calc"} 1800.0' in text
    assert 'frogfix_sandbox_seconds_total{forge="gitlab",outcome="verified",project="acme/web"} 1.0' in text
    assert 'frogfix_model_calls_total{forge="gitlab",outcome="no_fix",project="acme/calc"} 3.0' in text
    # Jobs leave a final status (a retry, a review round): a gauge, since a counter must never go down.
    assert 'frogfix_jobs_finished{forge="gitlab",outcome="done",project="acme/calc"} 1.0' in text
    assert 'frogfix_jobs_finished{forge="gitlab",outcome="failed",project="acme/calc"} 1.0' in text
    assert "# TYPE frogfix_jobs_finished gauge" in text and "frogfix_jobs_finished_total" not in text
    assert 'frogfix_prompt_cached_ratio{forge="gitlab",project="acme/calc"} 0.6' in text
    assert 'frogfix_prompt_cached_ratio{forge="gitlab",project="acme/web"} 0.0' in text
    assert "# TYPE frogfix_tokens_total counter" in text and "# TYPE frogfix_prompt_cached_ratio gauge" in text

    # A running attempt's figures are not counted until it ends: counters only grow.
    job_id = new_job(project="acme/calc", issue=9)
    with session_scope() as session:
        assert transitions.claim_job(session, job_id)
        running = records.start_attempt(session, job_id, 1, 1)
        records.record_usage(session, job_id, running, UsageFigures(99_999, 1, 0, 1, 1, 1.0, 1.0))
    text = client.get("/metrics").text
    assert 'frogfix_tokens_total{forge="gitlab",kind="prompt",outcome="verified",project="acme/calc"} 10000.0' in text
    assert "running" not in re.findall(r"frogfix_tokens_total\{[^}]*\}", text)[0]


def test_the_same_path_on_two_forges_is_two_projects(signed_in: Any) -> None:
    """Budgets key on (forge, path): /metrics and the usage page keep a GitLab and a Gitea
    project of the same path apart instead of merging their figures."""
    used_job("acme/calc", 1, "done", UsageFigures(10_000, 500, 8_000, 5, 5, 1800.0, 30.0))
    used_job("acme/calc", 1, "failed", UsageFigures(4_000, 100, 1_000, 2, 2, 360.0, 5.0), forge="gitea")

    text = signed_in.get("/metrics").text
    assert 'frogfix_tokens_total{forge="gitlab",kind="prompt",outcome="verified",project="acme/calc"} 10000.0' in text
    assert 'frogfix_tokens_total{forge="gitea",kind="prompt",outcome="failed",project="acme/calc"} 4000.0' in text
    assert 'frogfix_model_calls_total{forge="gitea",outcome="failed",project="acme/calc"} 2.0' in text
    assert 'frogfix_jobs_finished{forge="gitlab",outcome="done",project="acme/calc"} 1.0' in text
    assert 'frogfix_jobs_finished{forge="gitea",outcome="failed",project="acme/calc"} 1.0' in text
    assert 'frogfix_prompt_cached_ratio{forge="gitlab",project="acme/calc"} 0.8' in text
    assert 'frogfix_prompt_cached_ratio{forge="gitea",project="acme/calc"} 0.25' in text
    assert not re.search(r'frogfix_\w+\{(?![^}]*forge=)[^}]*project=', text)  # every usage series names its forge

    today = utcnow().strftime("%Y-%m-%d")
    html = signed_in.get("/usage").text
    assert _row(html, "usage-projects", "acme/calc") == "gitlab acme/calc 1 done 1 10,000 8,000 80% 500 0.50"
    assert _row(html, "usage-projects", "acme/calc", forge="gitea") == (
        "gitea acme/calc 1 failed 1 4,000 1,000 25% 100 0.10")
    assert _row(html, "usage-days", "acme/calc", today, forge="gitea").startswith(f"{today} gitea acme/calc 1 failed")
    assert 'href="/usage?forge=gitea&amp;project=acme/calc&amp;days=14"' in html
    # A row's link narrows to its own forge; the path alone still shows both.
    only_gitea = signed_in.get("/usage", params={"forge": "gitea", "project": "acme/calc"}).text
    assert 'data-forge="gitea"' in only_gitea and 'data-forge="gitlab"' not in only_gitea
    both = signed_in.get("/usage", params={"project": "acme/calc"}).text
    assert 'data-forge="gitea"' in both and 'data-forge="gitlab"' in both
    unknown = signed_in.get("/usage", params={"forge": "github"}).text  # not a forge: no filter, as /jobs does
    assert 'data-forge="gitea"' in unknown and 'data-forge="gitlab"' in unknown


def test_the_queue_wait_is_from_the_latest_queueing_to_the_claim(frogfix_env: dict[str, Any]) -> None:
    job_id = new_job(project="acme/calc", issue=11)
    with session_scope() as session:
        # The job was created an hour ago, retried ten minutes ago: the wait counts from the retry.
        session.query(Job).filter(Job.id == job_id).update({"created_at": utcnow() - timedelta(hours=1)})
        records.add_event(session, job_id, "retried", "queued again")
        from app.models import JobEvent

        session.query(JobEvent).filter(JobEvent.job_id == job_id, JobEvent.kind == "created").update(
            {"at": utcnow() - timedelta(hours=1)})
        session.query(JobEvent).filter(JobEvent.job_id == job_id, JobEvent.kind == "retried").update(
            {"at": utcnow() - timedelta(minutes=10)})
    with session_scope() as session:
        assert transitions.claim_job(session, job_id)
    with session_scope() as session:
        wait = records.get_job(session, job_id).queue_wait_seconds
    assert wait is not None and 599 <= wait <= 660


@pytest.mark.postgres
def test_the_usage_queries_on_postgresql(pg: Any, frogfix_env: dict[str, Any]) -> None:
    from app.migrate import upgrade

    url = pg.create_database("usage_page")
    upgrade(url)
    configure(frogfix_env["monkeypatch"], database_url=url)
    seed()
    with session_scope() as s:
        report = read_model.usage_report(s)
        counters = read_model.usage_counters(s)
        job = s.get(Job, records.list_jobs(s, records.JobFilter(project="acme/web"))[0][0].id)
        assert job is not None and job.usage.steps == 1
    calc = next(r for r in report.by_project() if (r.forge, r.project) == ("gitlab", "acme/calc"))
    assert (calc.jobs, calc.usage.prompt_tokens, calc.usage.cached_tokens) == (3, 20_000, 12_000)
    assert calc.outcomes == {"done": 1, "no_fix": 1, "failed": 1}
    assert [d for d, u in report.per_day if u.prompt_tokens] == sorted({r.day for r in report.rows})
    assert counters.cached_share()[("gitlab", "acme/calc")] == pytest.approx(0.6)
    assert counters.jobs[("gitlab", "acme/calc", "done")] == 1


@pytest.mark.timeout(120)
def test_the_usage_page_in_chromium(browser_page: Any) -> None:
    from playwright.sync_api import expect

    seed()
    page = browser_page
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    browser_sign_in(page)
    page.click("nav.mainnav >> text=Usage")
    page.wait_for_url("**/usage")
    expect(page.locator("#usage-projects tr[data-project]")).to_have_count(2)
    expect(page.locator("#usage-days tr[data-day]")).to_have_count(3)
    expect(page.locator("svg.chart rect.bar.s-cached")).to_have_count(2)
    assert page.locator("svg.chart").bounding_box()["height"] > 100
    screenshot(page, "usage-light")
    page.click("#usage-projects >> text=acme/web")
    expect(page.locator("#usage-projects tr[data-project]")).to_have_count(1)
    assert problems == []


def test_the_usage_page_needs_a_sign_in_and_escapes_project_names(client: Any, operator: str) -> None:
    from tests.dashboard.conftest import sign_in

    hostile = 'acme/<img src=x onerror=alert(1)>"'
    used_job(hostile, 1, "done", UsageFigures(10, 1, 5, 1, 1, 1.0, 1.0))
    refused = client.get("/usage", follow_redirects=False)
    assert refused.status_code in (302, 303) and "/login" in refused.headers["location"]
    sign_in(client)
    html = client.get("/usage").text
    assert "<img src=x" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html


def test_the_queue_wait_of_every_run_adds_up(signed_in: Any) -> None:
    """Review round, retry, budget hold: the job keeps the latest run's wait and the total over its runs."""
    from app.models import JobEvent

    job_id = new_job(project="acme/calc", issue=12)

    def claim_after(minutes: int, kind: str) -> None:
        with session_scope() as session:
            session.query(JobEvent).filter(JobEvent.job_id == job_id, JobEvent.kind == kind).update(
                {"at": utcnow() - timedelta(minutes=minutes)})
            session.query(Job).filter(Job.id == job_id).update({"created_at": utcnow() - timedelta(minutes=minutes)})
        with session_scope() as session:
            assert transitions.claim_job(session, job_id)

    claim_after(10, "created")
    with session_scope() as session:
        transitions.set_status(session, job_id, JobStatus.failed)
        transitions.retry_job(session, job_id, "ops")
    claim_after(5, "retried")
    with session_scope() as session:
        job = records.get_job(session, job_id)
        latest, total = job.queue_wait_seconds, job.queue_wait_total_seconds
    assert latest is not None and 299 <= latest <= 360
    assert total is not None and 899 <= total <= 1000
    api = signed_in.get(f"/api/jobs/{job_id}").json()
    assert (api["queue_wait_seconds"], api["queue_wait_total_seconds"]) == (round(latest, 3), round(total, 3))
    html = signed_in.get(f"/jobs/{job_id}").text
    assert "Queue wait, latest run" in html and re.search(r'id="fact-queue-wait-total">1[45] min', html)


def test_the_usage_page_counts_a_day_as_the_budget_does(signed_in: Any) -> None:
    """An attempt counts on the UTC day it started (the budget's tokens_today), not on its job's creation day."""
    from app.jobs.scheduler import tokens_today

    job_id = used_job("acme/late", 1, "done", UsageFigures(7_000, 70, 0, 1, 1, 10.0, 1.0), days_ago=1)
    with session_scope() as session:  # created yesterday, but it only ran today
        session.query(JobAttempt).filter(JobAttempt.job_id == job_id).update({"started_at": utcnow()})
        budget_today = tokens_today(session, [("gitlab", "acme/late")], utcnow())[("gitlab", "acme/late")]
    today = utcnow().strftime("%Y-%m-%d")
    html = signed_in.get("/usage").text
    assert budget_today == 7_070
    assert _row(html, "usage-days", "acme/late", today).startswith(f"{today} gitlab acme/late 1 done 1 7,000 ")
    assert f'data-project="acme/late" data-day="{(utcnow() - timedelta(days=1)).strftime("%Y-%m-%d")}"' not in html
    assert "the day a project&#39;s daily token budget counts them on" in html or \
        "the day a project's daily token budget counts them on" in html
