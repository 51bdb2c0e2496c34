"""The dashboard in Debian's Chromium (Playwright): sign-in, a job that runs live, trajectory, diff, actions.

The app runs under uvicorn on 127.0.0.1; a thread plays the worker through app/jobs/ (ScriptedRun).
Screenshots land in test-artifacts/screenshots/ in light and dark mode.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.dashboard.conftest import browser_sign_in, screenshot
from tests.dashboard.scenario import ScriptedRun, finished_job, job_status, new_job
from tests.servers import wait_until
from tests.webhook_requests import gitlab_headers, payload

pytestmark = pytest.mark.timeout(120)


def _expect() -> Any:
    from playwright.sync_api import expect

    return expect


def test_not_signed_in_redirects_to_sign_in_and_back(browser_page: Any, data_dir: Path) -> None:
    page = browser_page
    job_id = finished_job(data_dir, "done")
    page.goto(f"/jobs/{job_id}")
    assert re.search(r"/login\?next=%2Fjobs%2F\d+$", page.url), page.url
    screenshot(page, "sign-in-light")
    page.fill("input[name=username]", "alice")
    page.fill("input[name=password]", "not the password at all")
    page.click("button[type=submit]")
    _expect()(page.locator("[role=alert]")).to_contain_text("Wrong username or password")
    page.fill("input[name=password]", "correct horse battery staple")
    page.click("button[type=submit]")
    page.wait_for_url(f"**/jobs/{job_id}")
    _expect()(page.locator("h1")).to_contain_text(f"Job {job_id}")


def test_a_job_appears_and_progresses_live_then_shows_trajectory_and_diff(
    browser_page: Any, data_dir: Path, live_app: str, chromium: Any
) -> None:
    expect = _expect()
    page = browser_page
    problems: list[str] = []  # script errors and Content-Security-Policy violations
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    finished_job(data_dir, "done", project="acme/older", issue=3, age_minutes=90)
    finished_job(data_dir, "failed", project="acme/older", issue=4, age_minutes=60, with_trajectory=False)
    browser_sign_in(page)
    page.goto("/jobs")
    expect(page.locator("tr[data-job-id]")).to_have_count(2)

    # A labelled issue arrives through the real webhook; the list shows it without a reload.
    delivered = httpx.post(f"{live_app}/webhooks/gitlab", content=payload("gitlab_label_added.json"),
                           headers=gitlab_headers(), timeout=10)
    assert delivered.status_code == 202, delivered.text
    job_id = delivered.json()["job_id"]
    row = page.locator(f'tr[data-job-id="{job_id}"]')
    expect(row).to_be_visible(timeout=8_000)
    expect(row.locator(".badge")).to_have_text("queued")

    row.locator(f'a[href="/jobs/{job_id}"]').click()
    page.wait_for_url(f"**/jobs/{job_id}")
    expect(page.locator("#live-status")).to_have_text("queued")

    run = ScriptedRun(job_id, data_dir, steps=4, delay=0.7)
    run.start()
    expect(page.locator("#live-status")).to_have_text("running", timeout=8_000)
    # Past the first step, live: a poll may skip a step (0.7 s each, polled every 0.5 s), so any later one will do.
    expect(page.locator("#live-steps")).to_contain_text(re.compile(r"step [2-4]\b"), timeout=8_000)
    expect(page.locator("#live-current")).not_to_be_empty()
    expect(page.locator('#timeline .kind:text-is("agent_started")')).to_be_visible()
    screenshot(page, "job-running-light")

    # When the run ends the page reloads itself with the patch, the tests and the trajectory link.
    expect(page.locator("#job-status .badge")).to_have_text("done", timeout=15_000)
    run.join(10)
    assert run.error is None and run.outcome == "done"
    expect(page.locator("#live")).to_have_count(0, timeout=8_000)
    expect(page.locator("#mr-link")).to_have_attribute("href", "https://git.acme.test/acme/calc/-/merge_requests/3")
    diff = page.locator("[data-testid=diff]")
    expect(diff.locator("tr.d-add")).to_contain_text("return a + b")
    expect(diff.locator("tr.d-del")).to_contain_text("return a - b")
    expect(page.locator(".testrun.fail summary")).to_contain_text("before the patch")
    expect(page.locator(".testrun.pass").first).to_contain_text("with the patch")
    screenshot(page, "job-done-light")

    page.locator("[data-testid=trajectory-link]").first.click()
    page.wait_for_url("**/trajectory")
    expect(page.locator("li.step")).to_have_count(5)  # four tool steps and the final answer
    expect(page.locator("#step-5 .say")).to_contain_text("it now adds")
    first = page.locator("#step-1")
    expect(first.locator(".tool")).to_have_text("Read")
    expect(first.locator("table.args")).to_contain_text("calc.py")
    reasoning = first.locator("details.reasoning")
    expect(reasoning).not_to_have_attribute("open", "")
    reasoning.locator("summary").click()
    expect(reasoning.locator("pre")).to_contain_text("add() subtracts")
    long_output = page.locator("#step-2 details.output")
    expect(long_output).not_to_have_attribute("open", "")  # a long output starts folded
    expect(page.locator("#step-4 .headline")).to_have_text("python3 -m pytest -q")
    screenshot(page, "trajectory-light")

    # The same pages in dark mode.
    dark = chromium.new_context(base_url=live_app, viewport={"width": 1366, "height": 860}, color_scheme="dark")
    try:
        dark_page = dark.new_page()
        browser_sign_in(dark_page)
        dark_page.goto("/")
        expect(dark_page.locator("[data-testid=total-jobs]")).to_have_text("3")
        screenshot(dark_page, "overview-dark")
        dark_page.goto(f"/jobs/{job_id}")
        screenshot(dark_page, "job-done-dark")
        dark_page.goto("/jobs")
        screenshot(dark_page, "jobs-dark")
    finally:
        dark.close()
    page.goto("/")
    screenshot(page, "overview-light")
    assert problems == [], problems


def test_cancel_a_running_job(browser_page: Any, data_dir: Path) -> None:
    expect = _expect()
    page = browser_page
    job_id = new_job(issue=11)
    run = ScriptedRun(job_id, data_dir, steps=2, delay=0.2, hold=True)
    run.start()
    wait_until(lambda: job_status(job_id) == "running", timeout=10)
    browser_sign_in(page)
    page.goto(f"/jobs/{job_id}")
    expect(page.locator("#live-status")).to_have_text("running")
    page.click("#cancel-button")  # the confirmation dialog is accepted by the fixture
    expect(page.locator("#flash")).to_contain_text("Cancel requested")
    expect(page.locator("#job-status .badge").first).to_have_text("cancelled", timeout=10_000)
    run.join(10)
    assert run.error is None and run.outcome == "cancelled"
    expect(page.locator('#timeline .kind:text-is("cancel_requested")')).to_be_visible()
    screenshot(page, "job-cancelled-light")


def test_retry_a_failed_job(browser_page: Any, data_dir: Path) -> None:
    expect = _expect()
    page = browser_page
    job_id = finished_job(data_dir, "failed", issue=12)
    browser_sign_in(page)
    page.goto(f"/jobs/{job_id}")
    expect(page.locator("#job-status .badge")).to_have_text("failed")
    page.click("#retry-button")
    expect(page.locator("#flash")).to_contain_text("Queued again")
    expect(page.locator("#job-status .badge")).to_have_text("queued")
    expect(page.locator('#timeline .kind:text-is("retried")')).to_be_visible()
    assert job_status(job_id) == "queued"


def test_a_post_without_the_csrf_token_is_refused(browser_page: Any, data_dir: Path) -> None:
    page = browser_page
    job_id = new_job(issue=13)
    browser_sign_in(page)
    page.goto(f"/jobs/{job_id}")
    refused = page.request.post(f"/jobs/{job_id}/cancel", form={"note": "no token"}, max_redirects=0)
    assert refused.status == 403 and "CSRF" in refused.text()
    forged = page.request.post(f"/jobs/{job_id}/cancel", form={"csrf_token": "forged"}, max_redirects=0)
    assert forged.status == 403
    assert job_status(job_id) == "queued"
    token = page.locator("input[name=csrf_token]").first.get_attribute("value")
    accepted = page.request.post(f"/jobs/{job_id}/cancel", form={"csrf_token": token}, max_redirects=0)
    assert accepted.status == 303 and job_status(job_id) == "cancelled"
