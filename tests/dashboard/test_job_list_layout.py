"""The job list at 1366 px (issue 40): every column shows whole (the Created column was cut off), and a project's
name breaks only after a `/`, never inside a word. Measured in Chromium from the rendered page."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.models import Job
from tests.dashboard.conftest import browser_sign_in, screenshot
from tests.dashboard.scenario import finished_job
from tests.dashboard.test_first_hour_layout import LINES_JS

pytestmark = pytest.mark.timeout(120)

PROJECTS = ("/tmp/frogfix-demo-x7k2m9qa/calc", "platform-team/backend-services/payments-api")
TITLE = "add() returns the difference of its arguments instead of their sum when both are negative"


@pytest.mark.parametrize("width", [1366, 1280])
def test_the_job_list_shows_every_column_and_breaks_projects_at_slashes(browser_page: Any, data_dir: Path,
                                                                        width: int) -> None:
    for project in PROJECTS:
        job_id = finished_job(data_dir, "done", project=project)
        with session_scope() as session:
            job = session.get(Job, job_id)
            assert job is not None
            job.title, job.trigger_user = TITLE, "a.long.user.name@example.com"
            if project.startswith("/"):
                job.forge = "local"
    page = browser_page
    page.set_viewport_size({"width": width, "height": 900})
    browser_sign_in(page)
    page.goto("/jobs")
    page.wait_for_selector("tr[data-job-id]")
    wrap = page.evaluate("""() => { const w = document.querySelector('.tablewrap');
        return {scroll: w.scrollWidth, client: w.clientWidth, right: w.getBoundingClientRect().right}; }""")
    widths = page.evaluate("() => [...document.querySelectorAll('tr[data-job-id]:first-child td')]"
                           ".map(td => Math.round(td.getBoundingClientRect().width))")
    assert wrap["scroll"] <= wrap["client"] + 1, (wrap, str(widths))  # nothing hidden to the right
    for cell in page.locator("tr[data-job-id] td.when").all():
        box = cell.bounding_box()
        assert box is not None and box["x"] + box["width"] <= wrap["right"] + 1
        assert cell.evaluate("el => el.scrollWidth <= el.clientWidth + 1")  # the Created text is not clipped
    for row in page.locator("tr[data-job-id]").all():
        row.locator("td.project a").evaluate("el => el.setAttribute('data-measure', '1')")
        lines = page.evaluate(LINES_JS, "[data-measure]")["lines"]
        row.locator("td.project a").evaluate("el => el.removeAttribute('data-measure')")
        assert "".join(lines) in [p.replace(" ", "") for p in PROJECTS]
        for line in lines[:-1]:
            assert line.endswith("/"), lines  # each break comes right after a slash
    screenshot(page, f"job-list-{width}", full_page=False)
