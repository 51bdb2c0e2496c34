"""The dashboard over HTTP (TestClient): what is open, sign-in and CSRF, pages, list paging, actions."""

from __future__ import annotations

import html
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from app import auth
from app.db import session_scope
from app.jobs import read_model, records, transitions
from app.models import Job, JobAttempt, Operator, utcnow
from app.settings import get_settings
from tests.conftest import ADMIN_TOKEN, configure
from tests.dashboard.conftest import csrf_from, sign_in
from tests.dashboard.scenario import finished_job, job_status, new_job
from tests.webhook_requests import gitlab_headers, payload

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _seed(n: int, *, start_minutes: int = 0) -> None:
    """n jobs a minute apart (newest last): statuses, forges and projects in a fixed rotation."""
    now = utcnow()
    with session_scope() as s:
        for i in range(n):
            s.add(
                Job(
                    forge="gitlab" if i % 2 == 0 else "gitea",
                    project=f"team/p{i % 3}",
                    issue=i + 1,
                    title=f"bug number {i + 1}" + (" with unicode ümlaut" if i == 5 else ""),
                    status=["done", "failed", "no_fix", "cancelled"][i % 4],
                    run=1,
                    cancel_requested=False,
                    enqueue_count=1,
                    trigger_user="carol" if i == 7 else "bob",
                    created_at=now - timedelta(minutes=start_minutes + n - i),
                    updated_at=now,
                )
            )


# -- what is open, and to whom ------------------------------------------------------------------


def test_only_webhooks_health_metrics_and_static_files_are_open(client: Any) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/static/app.css", "/static/app.js", "/login"):
        assert client.get(path).status_code == 200, path
    for path in ("/", "/jobs", "/jobs/1", "/jobs/1/attempts/1/trajectory"):
        r = client.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login"), path
    assert client.get("/jobs/1/progress", headers={"Accept": "application/json"}).status_code == 401
    for path in ("/docs", "/redoc", "/openapi.json", "/api/jobs", "/api/jobs/1"):
        assert client.get(path).status_code == 401, path
    job_id = new_job(issue=99)
    for action in ("cancel", "retry", "replay"):
        assert client.post(f"/jobs/{job_id}/{action}", data={}).status_code == 401
    assert job_status(job_id) == "queued"
    # a webhook needs no session and no CSRF token: it is signed by the forge
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    assert r.status_code == 202


def test_a_signed_in_session_also_opens_the_api_and_its_schema(signed_in: Any) -> None:
    assert signed_in.get("/api/jobs").status_code == 200
    assert "/api/jobs" in signed_in.get("/openapi.json").json()["paths"]
    assert signed_in.get("/docs").status_code == 200


def test_the_bearer_token_alone_opens_the_api_but_not_the_dashboard(client: Any) -> None:
    assert client.get("/api/jobs", headers=AUTH).status_code == 200
    assert client.get("/docs", headers=AUTH).status_code == 200
    assert client.get("/jobs", headers=AUTH, follow_redirects=False).status_code == 303


def test_sign_in_needs_the_form_token_and_gives_a_new_session_id(client: Any, operator: str) -> None:
    page = client.get("/login")
    before = auth.decode_session(auth.secret_key(get_settings()), client.cookies.get(auth.SESSION_COOKIE), 3600)
    assert before is not None and before.user is None
    no_token = client.post("/login", data={"username": "alice", "password": "correct horse battery staple"})
    assert no_token.status_code == 403
    r = client.post(
        "/login",
        data={"username": "alice", "password": "correct horse battery staple", "csrf_token": csrf_from(page.text)},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"] == "/"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Max-Age=43200" in cookie
    after = auth.decode_session(auth.secret_key(get_settings()), client.cookies.get(auth.SESSION_COOKIE), 3600)
    assert after is not None and after.user == "alice" and after.sid != before.sid
    assert client.get("/", follow_redirects=False).status_code == 200


def test_sign_in_goes_back_only_to_a_local_path(client: Any, operator: str) -> None:
    for target, expected in (("/jobs?status=failed", "/jobs?status=failed"), ("//evil.example/x", "/"),
                             ("https://evil.example/", "/"), ("/\\evil.example", "/")):
        client.cookies.clear()
        token = csrf_from(client.get("/login").text)
        r = client.post(
            "/login",
            data={"username": "alice", "password": "correct horse battery staple", "csrf_token": token,
                  "next": target},
            follow_redirects=False,
        )
        assert r.headers["location"] == expected, target


def test_wrong_passwords_are_throttled(client: Any, operator: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from app.web import dashboard

    monkeypatch.setattr(dashboard, "throttle", auth.LoginThrottle(limit=3, window=60))
    token = csrf_from(client.get("/login").text)
    for _ in range(3):
        r = client.post("/login", data={"username": "alice", "password": "wrong password 123", "csrf_token": token})
        assert r.status_code == 401
    r = client.post("/login", data={"username": "alice", "password": "correct horse battery staple",
                                     "csrf_token": token})
    assert r.status_code == 429 and "Too many" in r.text


def test_sign_out_needs_the_token_and_ends_the_session(signed_in: Any) -> None:
    assert signed_in.post("/logout", data={}).status_code == 403
    token = csrf_from(signed_in.get("/").text)
    r = signed_in.post("/logout", data={"csrf_token": token}, follow_redirects=False)
    assert r.status_code == 303 and "Max-Age=0" in r.headers["set-cookie"]
    assert signed_in.get("/", follow_redirects=False).status_code == 303


def test_a_new_password_or_a_deleted_account_ends_sessions(signed_in: Any) -> None:
    assert signed_in.get("/", follow_redirects=False).status_code == 200
    with session_scope() as s:
        auth.set_password(s, "alice", "a brand new passphrase")
    assert signed_in.get("/", follow_redirects=False).status_code == 303
    sign_in(signed_in, password="a brand new passphrase")
    assert signed_in.get("/", follow_redirects=False).status_code == 200
    with session_scope() as s:
        s.query(Operator).delete()
    assert signed_in.get("/", follow_redirects=False).status_code == 303


def test_csrf_token_in_a_header_works_and_a_foreign_sessions_token_does_not(signed_in: Any, client: Any) -> None:
    job_id = new_job()
    token = csrf_from(signed_in.get(f"/jobs/{job_id}").text)
    r = signed_in.post(f"/jobs/{job_id}/replay", headers={"X-CSRF-Token": "nope"})
    assert r.status_code == 403
    other = auth.csrf_token(b"z" * 32, auth.new_session("alice", "password"))
    assert signed_in.post(f"/jobs/{job_id}/cancel", data={"csrf_token": other}).status_code == 403
    assert signed_in.post(f"/jobs/{job_id}/cancel", data={"csrf_token": token}, json=None).status_code == 200
    assert job_status(job_id) == "cancelled"


def test_a_trusted_proxy_header_signs_in_without_a_password(frogfix_env: dict[str, Any], client: Any) -> None:
    configure(frogfix_env["monkeypatch"], trust_proxy_user_header="X-Forwarded-User")
    header = {"X-Forwarded-User": "dora"}
    page = client.get("/", headers=header)
    assert page.status_code == 200 and "dora" in page.text
    job_id = new_job()
    assert client.post(f"/jobs/{job_id}/cancel", headers=header, data={}).status_code == 403  # CSRF still applies
    token = csrf_from(client.get(f"/jobs/{job_id}", headers=header).text)
    r = client.post(f"/jobs/{job_id}/cancel", headers=header, data={"csrf_token": token}, follow_redirects=False)
    assert r.status_code == 303 and job_status(job_id) == "cancelled"
    # the cookie the proxy session got is worthless without the header
    assert client.get("/", follow_redirects=False).status_code == 303
    # and with the setting off, the header means nothing
    configure(frogfix_env["monkeypatch"], trust_proxy_user_header="")
    assert client.get("/", headers=header, follow_redirects=False).status_code == 303


# -- pages --------------------------------------------------------------------------------------


def test_pages_carry_security_headers_and_escape_what_forges_send(signed_in: Any) -> None:
    job_id = new_job(title="<script>alert('x')</script> broken")
    with session_scope() as s:
        records.update_job(s, job_id, issue_url="javascript:alert(1)")
    for path in ("/", "/jobs", f"/jobs/{job_id}"):
        r = signed_in.get(path)
        assert r.status_code == 200
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert r.headers["x-frame-options"] == "DENY"
        assert "<script>alert" not in r.text and "&lt;script&gt;alert" in r.text
        assert 'href="javascript:' not in r.text


def test_the_job_page_has_timeline_diff_tests_flags_provenance_and_trajectory(signed_in: Any, data_dir: Path) -> None:
    job_id = finished_job(data_dir, "done")
    with session_scope() as s:
        records.update_job(s, job_id, flags=["changes tests: tests/test_calc.py"])
    page = signed_in.get(f"/jobs/{job_id}").text
    assert re.search(r'class="d-add">.*return a \+ b', page) and re.search(r'class="d-del">.*return a - b', page)
    assert "before the patch" in page and "with the patch, run 2" in page and "1 failed, 1 passed" in page
    assert "⚑ changes tests: tests/test_calc.py" in page
    assert "FrogNano-4B-2609" in page and "frogfix/issue-7" in page and "temperature=0.6" in page
    assert "merge_requests/3" in page and 'id="retry-button"' not in page and 'id="cancel-button"' not in page
    attempt_id = re.search(rf"/jobs/{job_id}/attempts/(\d+)/trajectory\"", page)
    assert attempt_id
    trajectory = signed_in.get(f"/jobs/{job_id}/attempts/{attempt_id.group(1)}/trajectory").text
    assert trajectory.count('class="step card"') == 5 and "Reasoning (51 characters)" in trajectory
    assert "old_string" in trajectory and "Edited calc.py (1 replacement)." in trajectory
    raw = signed_in.get(f"/jobs/{job_id}/attempts/{attempt_id.group(1)}/trajectory.json")
    assert raw.status_code == 200 and raw.json()["trajectory_format"] == "leaf-function-calling"
    assert signed_in.get(f"/jobs/{job_id}/attempts/999/trajectory").status_code == 404
    assert signed_in.get("/jobs/424242").status_code == 404


def test_a_trajectory_outside_the_data_folder_is_not_read(signed_in: Any, data_dir: Path, tmp_path: Path) -> None:
    job_id = finished_job(data_dir, "failed", with_trajectory=False)
    outside = tmp_path / "elsewhere.json"
    outside.write_text('{"messages": []}')
    with session_scope() as s:
        attempt = s.query(JobAttempt).filter_by(job_id=job_id).one()
        attempt.trajectory_path = str(outside)
        attempt_id = attempt.id
    page = signed_in.get(f"/jobs/{job_id}/attempts/{attempt_id}/trajectory")
    assert page.status_code == 200 and "outside this server&#39;s data folder" in page.text
    assert signed_in.get(f"/jobs/{job_id}/attempts/{attempt_id}/trajectory.json").status_code == 404


def _set_trajectory_path(job_id: int, stored: str) -> int:
    with session_scope() as s:
        attempt = s.query(JobAttempt).filter_by(job_id=job_id).one()
        attempt.trajectory_path = stored
        return int(attempt.id)


def test_a_trajectory_stored_relative_to_the_data_folder_is_shown(signed_in: Any, data_dir: Path) -> None:
    job_id = finished_job(data_dir, "done")
    with session_scope() as s:
        stored = s.query(JobAttempt).filter_by(job_id=job_id).one().trajectory_path
    assert stored == f"trajectories/job-{job_id}-run-1-1.json"
    page = signed_in.get(f"/jobs/{job_id}").text
    assert "FrogNano-4B-2609" in page and "not on this server" not in page and "outside this server" not in page
    attempt_id = _set_trajectory_path(job_id, stored)
    assert signed_in.get(f"/jobs/{job_id}/attempts/{attempt_id}/trajectory").text.count('class="step card"') == 5
    raw = signed_in.get(f"/jobs/{job_id}/attempts/{attempt_id}/trajectory.json")
    assert raw.status_code == 200 and raw.json()["job_id"] == job_id


def test_an_absolute_path_from_a_data_folder_that_has_moved_is_found_here(signed_in: Any, data_dir: Path) -> None:
    """Older versions stored absolute paths; after a move or a restore the file is in this data folder."""
    job_id = finished_job(data_dir, "done")
    old = f"/srv/frogfix-before-the-move/data/trajectories/job-{job_id}-run-1-1.json"
    assert not Path(old).exists()
    attempt_id = _set_trajectory_path(job_id, old)
    page = signed_in.get(f"/jobs/{job_id}").text
    assert "outside this server&#39;s data folder" not in page and "FrogNano-4B-2609" in page
    trajectory = signed_in.get(f"/jobs/{job_id}/attempts/{attempt_id}/trajectory").text
    assert "outside this server" not in trajectory and trajectory.count('class="step card"') == 5
    raw = signed_in.get(f"/jobs/{job_id}/attempts/{attempt_id}/trajectory.json")
    assert raw.status_code == 200 and raw.json()["trajectory_format"] == "leaf-function-calling"


@pytest.mark.parametrize(
    "stored",
    ["trajectories/../../elsewhere.json", "../elsewhere.json", "/srv/old/data/trajectories/../../../elsewhere.json"],
)
def test_a_stored_path_that_escapes_the_data_folder_is_refused(
    signed_in: Any, data_dir: Path, stored: str
) -> None:
    job_id = finished_job(data_dir, "failed", with_trajectory=False)
    (data_dir.parent / "elsewhere.json").write_text('{"messages": []}')
    attempt_id = _set_trajectory_path(job_id, stored)
    page = signed_in.get(f"/jobs/{job_id}/attempts/{attempt_id}/trajectory")
    assert page.status_code == 200 and "outside this server&#39;s data folder" in page.text
    assert signed_in.get(f"/jobs/{job_id}/attempts/{attempt_id}/trajectory.json").status_code == 404


def test_the_diff_shows_file_names_git_quotes(signed_in: Any, data_dir: Path, tmp_path: Path) -> None:
    """Git C-quotes names with non-ASCII bytes, tabs or quotes; the page reads them back and shows them
    as on the MR: real non-ASCII letters, and a tab or a quote escaped on one line."""
    from app.patches import shown_path
    from tests.doubles.git_http import git, make_worktree

    names = ["src/tést file.py", "tab\there.py", 'say "hi".py']
    repo = make_worktree(tmp_path / "repo", {name: "old line\nkept\n" for name in names})
    for i, name in enumerate(names):
        (repo / name).write_text(f"new line {i}\nkept\n", encoding="utf-8")
    assert git("add", "-A", cwd=repo).returncode == 0
    patch = git("diff", "--cached", "--binary", "HEAD", cwd=repo).stdout
    assert '"a/src/t\\303\\251st file.py"' in patch and '"a/tab\\there.py"' in patch
    assert '"a/say \\"hi\\".py"' in patch
    job_id = finished_job(data_dir, "done")
    with session_scope() as s:
        s.query(JobAttempt).filter_by(job_id=job_id).one().patch = patch
    page = html.unescape(signed_in.get(f"/jobs/{job_id}").text)
    shown = re.findall(r'<span class="path">(.*?)</span> <span class="muted small">(\w+)</span>', page, re.S)
    # as a reviewer must see them: as is, or C-quoted on one line when a name holds a tab, a quote
    # or a backslash, so two names never look the same (app.patches.shown_path, as on the MR)
    assert shown == [(shown_path(name), "modified") for name in sorted(names)]
    assert ("src/tést file.py", "modified") in shown and ('"tab\\there.py"', "modified") in shown
    for i in range(len(names)):
        assert re.search(rf'class="d-add">.*?new line {i}</td>', page)
    assert page.count('class="d-del">') == 3 and page.count('class="d-ctx">') == 3


def test_progress_reports_status_steps_current_step_and_new_events(signed_in: Any, data_dir: Path) -> None:
    from tests.dashboard.scenario import ScriptedTrajectory

    job_id = new_job()
    with session_scope() as s:
        transitions.claim_job(s, job_id)
        attempt_id = records.start_attempt(s, job_id, 1, 1)
        path = data_dir / "trajectories" / "live.json"
        records.update_attempt(s, attempt_id, trajectory_path=str(path), steps=2)
        records.update_job(s, job_id, steps=2)
    trajectory = ScriptedTrajectory(path, job_id)
    trajectory.step(0)
    trajectory.step(1)
    first = signed_in.get(f"/jobs/{job_id}/progress").json()
    assert first["status"] == "running" and first["active"] and first["steps"] == 2
    assert first["attempt"]["steps"] == 2 and first["attempt"]["status"] == "running"
    assert first["current_step"] == {"number": 2, "calls": [{"name": "Bash", "headline": "python3 -m pytest -q"}]}
    assert [e["kind"] for e in first["events"]] == ["created"]
    with session_scope() as s:
        records.add_event(s, job_id, "note", "something new")
    later = signed_in.get(f"/jobs/{job_id}/progress", params={"after": first["events"][-1]["id"]}).json()
    assert [e["message"] for e in later["events"]] == ["something new"] and later["state"] == first["state"]
    with session_scope() as s:
        records.update_job(s, job_id, cancel_requested=True)
    assert signed_in.get(f"/jobs/{job_id}/progress").json()["state"] != first["state"]


def test_replay_is_noted_then_sent_to_a_worker_by_task_name(
    signed_in: Any, data_dir: Path, frogfix_env: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.web import dashboard

    sent: list[tuple[int, str]] = []
    monkeypatch.setattr(dashboard, "send_replay_job", lambda job_id, who: sent.append((job_id, who)) or True)
    job_id = finished_job(data_dir, "done")
    token = csrf_from(signed_in.get(f"/jobs/{job_id}").text)
    page = signed_in.post(f"/jobs/{job_id}/replay", data={"csrf_token": token})
    assert "Replay queued" in page.text and sent == [(job_id, "alice (dashboard)")]
    with session_scope() as s:
        kinds = [e.kind for e in records.job_events(s, job_id)]
    assert kinds[-1] == "replay_requested"
    empty = new_job(issue=99)
    assert "Not replayed: the job is still running" in signed_in.post(
        f"/jobs/{empty}/replay", data={"csrf_token": token}).text
    with session_scope() as s:
        transitions.cancel_job(s, empty, "test")
    assert "Nothing to replay" in signed_in.post(f"/jobs/{empty}/replay", data={"csrf_token": token}).text
    assert len(sent) == 1


def test_replay_with_the_broker_down_names_the_command(
    signed_in: Any, data_dir: Path, frogfix_env: dict[str, Any]
) -> None:
    from tests.servers import free_port

    job_id = finished_job(data_dir, "done")
    token = csrf_from(signed_in.get(f"/jobs/{job_id}").text)
    configure(frogfix_env["monkeypatch"], broker_url=f"redis://127.0.0.1:{free_port()}/0")
    page = signed_in.post(f"/jobs/{job_id}/replay", data={"csrf_token": token})
    assert f"run ./manage.py replay {job_id} on a worker host" in page.text and "unreachable" in page.text


def test_cancel_and_retry_refuse_the_wrong_state_with_a_message(signed_in: Any, data_dir: Path) -> None:
    done = finished_job(data_dir, "done")
    token = csrf_from(signed_in.get(f"/jobs/{done}").text)
    assert "Not cancelled: job" in signed_in.post(f"/jobs/{done}/cancel", data={"csrf_token": token}).text
    assert "Not retried: job" in signed_in.post(f"/jobs/{done}/retry", data={"csrf_token": token}).text
    assert signed_in.post("/jobs/424242/cancel", data={"csrf_token": token}).status_code == 404
    pushing = new_job(issue=98)
    with session_scope() as s:
        s.get(Job, pushing).status = "publishing"  # type: ignore[union-attr]
    page = signed_in.post(f"/jobs/{pushing}/cancel", data={"csrf_token": token}).text
    assert f"Not cancelled: {html.escape(transitions.TOO_LATE)}" in page
    assert job_status(pushing) == "publishing"


# -- the list and the overview ---------------------------------------------------------------------


def test_the_job_list_pages_by_keyset_and_filters(signed_in: Any) -> None:
    _seed(120)
    seen: list[int] = []
    url = "/jobs"
    pages = []
    while url:
        page = signed_in.get(url).text
        pages.append(url)
        ids = [int(i) for i in re.findall(r'<tr data-job-id="(\d+)"', page)]
        assert ids == sorted(ids, reverse=True)
        seen += ids
        older = re.search(r'rel="next" href="([^"]+)"', page)
        url = older.group(1).replace("&amp;", "&") if older else ""
    assert len(pages) == 3 and len(seen) == 120 and len(set(seen)) == 120
    second = signed_in.get(pages[1]).text
    newer = re.search(r'rel="prev" href="([^"]+)"', second)
    assert newer
    newer_page = signed_in.get(newer.group(1).replace("&amp;", "&")).text
    back = [int(i) for i in re.findall(r'<tr data-job-id="(\d+)"', newer_page)]
    assert back == seen[:50]
    assert _count_line(signed_in.get("/jobs").text) == "120 jobs"

    failed = signed_in.get("/jobs", params={"status": "failed", "forge": "gitea"}).text
    rows = re.findall(r'<tr data-job-id="(\d+)"', failed)
    assert len(rows) == 30 and 'data-status="done"' not in failed
    project = signed_in.get("/jobs", params={"project": "team/p1"}).text
    assert len(re.findall(r'<tr data-job-id=', project)) == 40
    for q, expected in (("bug number 11", {11, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119}), ("#7", {7}),
                        ("ÜMLAUT", {6}), ("@carol", {8}), ("100%", set()), ("team/p2", None)):
        found = signed_in.get("/jobs", params={"q": q}).text
        issues = {int(i) for i in re.findall(r'data-issue="(\d+)"', found)}
        if expected is None:
            assert len(issues) == 40
        elif q != "ÜMLAUT" or "ümlaut" in found:  # SQLite's LIKE folds ASCII only
            assert issues == expected, q
    assert signed_in.get("/jobs", params={"older": "not-a-cursor"}).status_code == 400
    assert "No jobs match" in signed_in.get("/jobs", params={"status": "exploded", "q": "zzz-none"}).text


def _count_line(page: str) -> str:
    match = re.search(r'data-testid="job-count">(.*?)</p>', page, re.S)
    assert match
    return " ".join(re.sub(r"<[^>]+>", "", match.group(1)).split())


def test_a_search_reads_a_bounded_window_per_page_and_continues_older(
    signed_in: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(read_model, "SEARCH_WINDOW", 10)
    _seed(30)  # issues 1..30, newest last; "bug number 1" is in issues 1 and 10..19
    found: list[int] = []
    cursor = None
    windows = 0
    while True:
        with session_scope() as s:
            page = read_model.dashboard_jobs(s, records.JobFilter(), "bug number 1", older_than=cursor, limit=4)
        windows += 1
        assert page.total is None
        found += [r.issue for r in page.rows]
        if page.older is None:
            break
        cursor = page.older
    assert found == [19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 1] and windows <= 8
    first = signed_in.get("/jobs", params={"q": "bug number 1"}).text
    assert "0 matches on this page" in _count_line(first) and "search older jobs" in _count_line(first)
    more = re.search(r'rel="next" href="([^"]+)"', first)
    assert more and "Search older jobs" in first
    second = signed_in.get(more.group(1).replace("&amp;", "&")).text
    assert re.findall(r'data-issue="(\d+)"', second)[:2] == ["19", "18"]


def test_the_list_count_is_capped(frogfix_env: dict[str, Any]) -> None:
    _seed(30)
    with session_scope() as s:
        page = read_model.dashboard_jobs(s, records.JobFilter(), None, limit=5, count_cap=10)
        assert page.total == 10 and page.total_capped and len(page.rows) == 5 and page.older is not None
        exact = read_model.dashboard_jobs(s, records.JobFilter(status="done"), None, limit=5, count_cap=10)
        assert exact.total == 8 and not exact.total_capped


def _overview_fixture() -> None:
    now = utcnow()
    midnight = now.replace(hour=0, minute=0, second=0, microsecond=0)  # the per-day counts do not depend on the hour
    rows = [("done", 60), ("done", 120), ("done", 600), ("failed", 30), ("cancelled", 5), ("queued", None),
            ("queued", None), ("running", None)]
    with session_scope() as s:
        for i, (status, seconds) in enumerate(rows):
            start = now - timedelta(hours=2)
            job = Job(forge="gitlab", project="a/b", issue=i + 1, status=status, run=1, cancel_requested=False,
                      enqueue_count=1, created_at=midnight - timedelta(days=i % 3), updated_at=now,
                      started_at=start if seconds or status == "running" else None,
                      finished_at=start + timedelta(seconds=seconds) if seconds else None)
            s.add(job)
            s.flush()
            if status == "running":
                s.add(JobAttempt(job_id=job.id, run=1, number=1, status="running", steps=3))
            if status == "failed":  # an attempt left "running" by a dead worker does not count
                s.add(JobAttempt(job_id=job.id, run=1, number=1, status="running", steps=3))


def _check_overview() -> None:
    with session_scope() as s:
        o = read_model.dashboard_overview(s)
    assert o.queue_depth == 2 and o.model_slots_in_use == 1 and o.running_sandboxes == 1
    assert o.finished == 4 and o.succeeded == 3 and o.success_rate == 0.75
    assert o.median_seconds == pytest.approx(90.0, abs=0.01)
    assert o.p95_seconds == pytest.approx(120 + 0.85 * 480, abs=0.01)
    assert len(o.per_day) == 14 and sum(sum(c.values()) for _, c in o.per_day) == 8
    assert o.per_day[-1][1] == {"done": 1, "failed": 1, "queued": 1}  # rows 0, 3 and 6 were created today


def test_the_overview_numbers(signed_in: Any) -> None:
    _overview_fixture()
    _check_overview()
    page = signed_in.get("/").text
    for testid, value in (("queue-depth", "2"), ("model-slots", "1"), ("sandboxes", "1"), ("success-rate", "75%"),
                          ("total-jobs", "8")):
        assert re.search(rf'data-testid="{testid}">{re.escape(value)}<', page), testid
    assert "1 min 30 s" in page and "<svg" in page and "jobs in status running" in page


@pytest.mark.postgres
def test_the_dashboard_queries_on_postgresql(pg: Any, frogfix_env: dict[str, Any]) -> None:
    from app.migrate import upgrade

    url = pg.create_database("dashboard")
    upgrade(url)
    configure(frogfix_env["monkeypatch"], database_url=url)
    _overview_fixture()
    _check_overview()
    _seed(60, start_minutes=60 * 24 * 20)
    with session_scope() as s:
        first = read_model.dashboard_jobs(s, records.JobFilter(), None, limit=20)
        second = read_model.dashboard_jobs(s, records.JobFilter(), None, older_than=first.older, limit=20)
        back = read_model.dashboard_jobs(s, records.JobFilter(), None, newer_than=second.newer, limit=20)
        assert [r.id for r in back.rows] == [r.id for r in first.rows]
        assert not {r.id for r in first.rows} & {r.id for r in second.rows}
        found = read_model.dashboard_jobs(s, records.JobFilter(), "ÜMLAUT")
        assert [r.issue for r in found.rows] == [6]  # ILIKE folds non-ASCII letters on PostgreSQL
        assert read_model.dashboard_jobs(s, records.JobFilter(), "50%").rows == []
