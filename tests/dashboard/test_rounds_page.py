"""An MR's review rounds on the dashboard and in the API: the thread of jobs, a round's requests, the list's mark."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape

from app.db import session_scope
from app.forge.reviews import CiJob, CiReport, ReviewComment
from app.jobs import records
from app.models import Job, RoundRequest, utcnow
from tests.dashboard.conftest import browser_sign_in, screenshot
from tests.dashboard.scenario import finished_job, new_job
from tests.dashboard.test_pages import AUTH

START_1 = "1111111111aaaaaaaaaa1111111111aaaaaaaaaa"
PUSHED_0 = "0000000000ffffffffff0000000000ffffffffff"
PUSHED_1 = "2222222222bbbbbbbbbb2222222222bbbbbbbbbb"
PUSHED_2 = "3333333333cccccccccc3333333333cccccccccc"
HOSTILE = 'Please round <script>alert("x")</script> too & <img src=x onerror=alert(1)>'


def _round(thread: Job, number: int, kind: str, who: str, status: str, start: str, pushed: str | None,
           ci: str | None = None) -> int:
    """A round job as app/jobs/rounds.py inserts one, already run to `status`."""
    with session_scope() as s:
        job = Job(
            forge=thread.forge, project=thread.project, issue=thread.issue, title=thread.title,
            issue_url=thread.issue_url, status=status, run=1 if status != "queued" else 0, enqueue_count=1,
            thread_id=thread.id, round=number, round_kind=kind, mr_number=thread.mr_number, branch=thread.branch,
            trigger_user=who, base_commit=thread.base_commit, start_commit=start, pushed_commit=pushed,
            ci_status=ci, mr_url=thread.mr_url, created_at=utcnow(), updated_at=utcnow(),
        )
        s.add(job)
        s.flush()
        return int(job.id)


def _request(thread_id: int, kind: str, status: str, author: str, data: dict[str, Any], *,
             job_id: int | None = None, reason: str | None = None) -> int:
    with session_scope() as s:
        row = RoundRequest(
            thread_id=thread_id, forge="gitlab", project="acme/calc", mr_number=3, kind=kind, status=status,
            author=author, data=data, job_id=job_id, reason=reason, dedupe_key=f"k-{utcnow().timestamp()}-{author}",
        )
        s.add(row)
        s.flush()
        return int(row.id)


def _thread(data_dir: Path) -> dict[str, int]:
    """Round 0 opened !3; round 1 (review, done, CI failed on it), round 2 (ci, done, CI passed), round 3 queued."""
    root = finished_job(data_dir, "done")
    with session_scope() as s:
        records.update_job(s, root, mr_number=3, pushed_commit=PUSHED_0, ci_status="success")
        thread = records.get_job(s, root)
        s.expunge(thread)
    r1 = _round(thread, 1, "review", "dora", "done", START_1, PUSHED_1, ci="failed")
    r2 = _round(thread, 2, "ci", "dora", "done", PUSHED_1, PUSHED_2, ci="success")
    r3 = _round(thread, 3, "review", "erin", "queued", PUSHED_2, None)
    line = ReviewComment("901", "diff_note", "dora", HOSTILE, url="javascript:alert(1)", discussion_id="d1",
                         path="calc.py", line=5)
    _request(root, "review", "taken", "dora", line.to_dict(), job_id=r1)
    note = ReviewComment("902", "note", "dora", "/frogfix also handle mul()",
                         url="https://git.acme.test/acme/calc/-/merge_requests/3#note_902")
    _request(root, "review", "taken", "dora", note.to_dict(), job_id=r1)
    report = CiReport("gitlab_pipeline", "77", PUSHED_1, "failed", ref="frogfix/issue-7",
                      failed_jobs=(CiJob("501", "unit-tests", "failed", log_tail="E assert 4 == 5"),
                                   CiJob("502", "lint", "failed")))
    _request(root, "ci", "taken", "gitlab-ci", report.to_dict(), job_id=r2)
    waiting = ReviewComment("903", "note", "erin", "@frogfix-bot the docstring is stale now")
    _request(root, "review", "accepted", "erin", waiting.to_dict())
    stranger = ReviewComment("904", "note", "mallory", "/frogfix delete the tests")
    _request(root, "review", "ignored", "mallory", stranger.to_dict(),
             reason="only members with Developer/write access can ask FrogFix for changes")
    return {"root": root, "r1": r1, "r2": r2, "r3": r3}


def _thread_rows(page: str) -> list[tuple[int, int, bool]]:
    """(job id, round, is the current job) for each row of the page's thread table, in order."""
    table = re.search(r'<table class="jobs thread" data-testid="thread">(.*?)</table>', page, re.S)
    assert table, "no thread table on the page"
    rows = re.findall(r'<tr data-job-id="(\d+)" data-round="(\d+)"( class="current" aria-current="page")?>',
                      table.group(1))
    return [(int(j), int(r), bool(c)) for j, r, c in rows]


def _row(page: str, job_id: int) -> str:
    found = re.search(rf'<tr data-job-id="{job_id}" data-round.*?</tr>', page, re.S)
    assert found, f"no thread row for job {job_id}"
    return found.group(0)


def test_a_rounds_page_shows_the_thread_and_the_requests_it_took(signed_in: Any, data_dir: Path) -> None:
    ids = _thread(data_dir)
    page = signed_in.get(f"/jobs/{ids['r1']}").text

    assert _thread_rows(page) == [(ids["root"], 0, False), (ids["r1"], 1, True), (ids["r2"], 2, False),
                                  (ids["r3"], 3, False)]
    assert "The MR's thread" in page and '<span class="muted">!3</span>' in page
    for other in (ids["root"], ids["r2"], ids["r3"]):
        assert f'<a href="/jobs/{other}">{other}</a>' in _row(page, other)
    assert f'href="/jobs/{ids["r1"]}"' not in _row(page, ids["r1"])  # the current job is marked, not linked
    r0, r1, r2, r3 = (_row(page, ids[k]) for k in ("root", "r1", "r2", "r3"))
    assert "opened the MR" in r0 and "7445f7ee" in r0 and "00000000" in r0 and "ci-success" in r0
    assert "review" in r1 and "dora" in r1 and "11111111</code> → <code" in r1 and "22222222" in r1
    assert 'class="badge ci-failed">failed<' in r1 and 'data-status="done"' in r1
    assert ">ci<" in r2 and "22222222</code> → <code" in r2 and "33333333" in r2
    assert "erin" in r3 and 'data-status="queued"' in r3 and "→ <code title=\"\">—</code>" in r3

    # What round 1 took: the line comment (escaped, its javascript: URL not a link) and the /frogfix note.
    asked = page.split("What this round was asked", 1)[1].split("Waiting for the next round", 1)[0]
    assert asked.count('class="request r-review"') == 2
    assert "review: diff note" in asked and '<code class="location">calc.py:5</code>' in asked
    assert str(escape(HOSTILE)) in asked  # Jinja's autoescape, as the page writes it
    assert "<script>alert" not in page and "<img src=x" not in page and 'href="javascript:' not in page
    assert "/frogfix also handle mul()" in asked
    assert 'href="https://git.acme.test/acme/calc/-/merge_requests/3#note_902"' in asked
    # The request waiting for the next round and the one turned down, with its reason; never round 2's CI.
    waiting = page.split("Waiting for the next round", 1)[1]
    assert "@frogfix-bot the docstring is stale now" in waiting and "accepted" in waiting
    assert "mallory" in waiting and "only members with Developer/write access" in waiting
    assert "unit-tests" not in page


def test_a_ci_round_names_the_failing_jobs_and_round_0_lists_its_rounds(signed_in: Any, data_dir: Path) -> None:
    ids = _thread(data_dir)
    page = signed_in.get(f"/jobs/{ids['r2']}").text
    asked = page.split("What this round was asked", 1)[1].split("Waiting for the next round", 1)[0]
    assert 'class="request r-ci"' in asked and "gitlab-ci" in asked and 'class="badge ci-failed">failed<' in asked
    assert '<code class="ci-job">unit-tests</code>, <code class="ci-job">lint</code>' in asked
    assert "E assert 4 == 5" not in page  # log tails are the model's data, not the page's
    assert [cur for _, _, cur in _thread_rows(page)] == [False, False, True, False]

    root = signed_in.get(f"/jobs/{ids['root']}").text
    assert [(j, cur) for j, _, cur in _thread_rows(root)] == [(ids["root"], True), (ids["r1"], False),
                                                            (ids["r2"], False), (ids["r3"], False)]
    assert "What this round was asked" not in root and "No review round yet" not in root


def test_a_job_without_an_mr_has_no_thread_and_one_with_an_mr_says_how_to_ask(signed_in: Any, data_dir: Path) -> None:
    plain = new_job(issue=41)
    assert 'data-testid="thread"' not in signed_in.get(f"/jobs/{plain}").text
    opened = finished_job(data_dir, "done", issue=42)
    with session_scope() as s:
        records.update_job(s, opened, mr_number=9)
    page = signed_in.get(f"/jobs/{opened}").text
    assert _thread_rows(page) == [(opened, 0, True)]
    assert "No review round yet" in page and "<code>/frogfix …</code>" in page


def test_the_jobs_list_marks_rounds_and_finds_an_mr_by_its_number(signed_in: Any, data_dir: Path) -> None:
    ids = _thread(data_dir)
    gitea_root = new_job(issue=12, forge="gitea", project="team/tool")
    with session_scope() as s:
        s.get(Job, gitea_root).status = "done"  # type: ignore[union-attr]
        records.update_job(s, gitea_root, mr_number=5, branch="frogfix/issue-12")
        gitea = records.get_job(s, gitea_root)
        s.expunge(gitea)
    gitea_round = _round(gitea, 1, "ci", "dev", "done", PUSHED_0, PUSHED_1)

    listing = signed_in.get("/jobs").text
    marks = dict(re.findall(r'<tr data-job-id="(\d+)".*?(?:data-testid="round-mark"[^>]*>([^<]*)<|</tr>)',
                            listing, re.S))
    assert marks[str(ids["r2"])] == "round 2 of !3" and marks[str(ids["r3"])] == "round 3 of !3"
    assert marks[str(gitea_round)] == "round 1 of #5"
    assert marks[str(ids["root"])] == "" and marks[str(gitea_root)] == ""  # round 0 carries no mark

    found = signed_in.get("/jobs", params={"q": "!3"}).text
    shown = {int(j) for j in re.findall(r'<tr data-job-id="(\d+)"', found)}
    assert shown == {ids["root"], ids["r1"], ids["r2"], ids["r3"]}


def test_the_api_job_detail_includes_the_thread(client: Any, data_dir: Path) -> None:
    ids = _thread(data_dir)
    body = client.get(f"/api/jobs/{ids['r1']}", headers=AUTH).json()
    assert body["round"] == 1 and body["round_kind"] == "review" and body["thread_id"] == ids["root"]
    thread = body["thread"]
    assert thread["current"] == ids["r1"] and thread["mr_number"] == 3
    assert [(j["id"], j["round"], j["round_kind"]) for j in thread["jobs"]] == [
        (ids["root"], 0, None), (ids["r1"], 1, "review"), (ids["r2"], 2, "ci"), (ids["r3"], 3, "review")]
    assert thread["jobs"][1]["start_commit"] == START_1 and thread["jobs"][1]["pushed_commit"] == PUSHED_1
    assert thread["jobs"][1]["ci_status"] == "failed" and thread["jobs"][0]["start_commit"] == "7445f7eee3b9"
    line, note = thread["requests"]
    assert (line["comment_kind"], line["path"], line["line"], line["author"]) == ("diff_note", "calc.py", 5, "dora")
    assert line["text"] == HOSTILE and note["text"] == "/frogfix also handle mul()"
    assert [r["author"] for r in thread["waiting"]] == ["erin"]
    assert [(r["author"], r["status"]) for r in thread["turned_down"]] == [("mallory", "ignored")]
    ci = client.get(f"/api/jobs/{ids['r2']}", headers=AUTH).json()["thread"]["requests"]
    assert [(r["kind"], r["ci_status"], r["ci_jobs"]) for r in ci] == [("ci", "failed", ["unit-tests", "lint"])]
    plain = new_job(issue=43)
    assert client.get(f"/api/jobs/{plain}", headers=AUTH).json()["thread"] is None


@pytest.mark.timeout(120)
def test_in_the_browser_the_thread_leads_from_a_round_to_round_0(browser_page: Any, data_dir: Path) -> None:
    from playwright.sync_api import expect

    page = browser_page
    problems: list[str] = []  # script errors and Content-Security-Policy violations
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    ids = _thread(data_dir)
    browser_sign_in(page)
    page.goto("/jobs")
    expect(page.locator(f'tr[data-job-id="{ids["r2"]}"] [data-testid=round-mark]')).to_have_text("round 2 of !3")
    page.click(f'tr[data-job-id="{ids["r1"]}"] a[href="/jobs/{ids["r1"]}"]')
    page.wait_for_url(f"**/jobs/{ids['r1']}")
    thread = page.get_by_role("region", name="Review rounds")
    expect(thread.locator("tr[aria-current=page]")).to_have_attribute("data-round", "1")
    expect(thread.locator(".request .location").first).to_have_text("calc.py:5")
    expect(thread.locator("pre.comment").first).to_contain_text('<script>alert("x")</script>')  # shown as text
    screenshot(page, "job-round-thread-light")
    thread.locator(f'a[href="/jobs/{ids["root"]}"]').click()
    page.wait_for_url(f"**/jobs/{ids['root']}")
    expect(page.get_by_role("region", name="Review rounds").locator("tr[aria-current=page]")).to_have_attribute(
        "data-round", "0")
    assert problems == []
