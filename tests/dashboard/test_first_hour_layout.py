"""Two layout faults of the first hour, measured in Chromium (issue 26).

- The job page's MR link never breaks inside a word: it stays on one line, whole where the page is wide
  enough, ended by an ellipsis inside its own box where it is not.
- An evaluation report's figure and its confidence interval stay on one line.

Each character's line is read from the rendered page (a Range per character), not from the CSS.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import evaluations as ev_records
from app.models import Job
from tests.dashboard.conftest import browser_sign_in, screenshot
from tests.dashboard.scenario import finished_job

pytestmark = pytest.mark.timeout(120)

LONG_MR = "https://gitlab.example.com/platform-team/backend-services/payments-api/-/merge_requests/1234"

# The text of `selector`'s first match split into the lines it is drawn on, and its box against its parent's.
LINES_JS = """(selector) => {
  const el = document.querySelector(selector);
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  const range = document.createRange();
  const lines = [];
  let top = null;
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    for (let i = 0; i < node.length; i++) {
      range.setStart(node, i); range.setEnd(node, i + 1);
      const rect = range.getClientRects()[0];
      if (!rect || !node.data[i].trim()) continue;
      const y = Math.round(rect.top);
      if (top === null || Math.abs(y - top) > 2) { lines.push(''); top = y; }
      lines[lines.length - 1] += node.data[i];
    }
  }
  const box = el.getBoundingClientRect(), parent = el.parentElement.getBoundingClientRect();
  return {lines, right: box.right, parentRight: parent.right, truncated: el.scrollWidth > el.clientWidth};
}"""


@pytest.mark.parametrize("width", [1366, 900, 600, 380])
def test_the_mr_link_never_breaks_inside_a_word(browser_page: Any, data_dir: Path, width: int) -> None:
    page = browser_page
    job_id = finished_job(data_dir, "done")
    with session_scope() as session:
        session.get(Job, job_id).mr_url = LONG_MR  # type: ignore[union-attr]
    page.set_viewport_size({"width": width, "height": 900})
    browser_sign_in(page)
    page.goto(f"/jobs/{job_id}")
    link = page.evaluate(LINES_JS, "#mr-link")
    assert len(link["lines"]) == 1, link["lines"]  # one line: no break inside "merge_requests" or anywhere
    assert link["right"] <= link["parentRight"] + 1, link  # inside its own fact, never over the next one
    if width >= 900:
        assert not link["truncated"] and link["lines"][0] == LONG_MR  # wide enough: the whole URL shows
    assert page.locator("#mr-link").get_attribute("href") == LONG_MR
    screenshot(page, f"job-mr-link-{width}", full_page=False)


@pytest.mark.parametrize("width", [1366, 900])
def test_a_figure_and_its_interval_stay_on_one_line(browser_page: Any, frogfix_env: dict[str, Any], width: int) -> None:
    tasks = [{"key": str(i), "project": "acme/calc", "title": "t", "recorded_solved": i % 2 == 0, "human": "merged"}
             for i in range(1, 7)]
    with session_scope() as session:
        eid = ev_records.create_evaluation(session, model="FrogNano-4B-2609-candidate", base_url="http://m/v1",
                                           selector="", attempts=3, tasks=tasks, who="t")
        runner = ev_records.Runner("test-host", 1, "1")
        ev_records.claim(session, eid, runner, 60)
        for task in tasks:
            for attempt in (1, 2, 3):
                solved = (int(task["key"]) + attempt) % 3 == 0
                assert ev_records.record_result(session, eid, {
                    "task": task["key"], "attempt": attempt, "solved": solved,
                    "outcome": "verified" if solved else "no_patch", "exit_reason": "agent", "steps": 4,
                    "prompt_tokens": 1000, "completion_tokens": 100, "cached_tokens": 500, "model_seconds": 2.0,
                    "wall_seconds": 3.0, "trajectory": None, "reason": None,
                }, runner)
    page = browser_page
    page.set_viewport_size({"width": width, "height": 900})
    browser_sign_in(page)
    page.goto(f"/evaluations/{eid}")
    cells = page.locator('[data-testid="overall"] tbody td:nth-child(n+2)')
    assert cells.count() >= 8
    checked = 0
    for i in range(cells.count()):
        text = cells.nth(i).inner_text()
        if "[" not in text:
            continue
        cells.nth(i).evaluate("el => el.setAttribute('data-measure', '1')")
        lines = page.evaluate(LINES_JS, "[data-measure]")["lines"]
        cells.nth(i).evaluate("el => el.removeAttribute('data-measure')")
        assert len(lines) == 1, (text, lines)
        checked += 1
    assert checked >= 5  # the solve rates, pass@1..3 and chosen@2..3 all carry an interval
    screenshot(page, f"evaluation-figures-{width}", full_page=False)
