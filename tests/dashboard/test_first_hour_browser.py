"""README's first hour, as a newcomer does it, in Chromium: `./manage.py demo`, `./manage.py create-admin`,
`./manage.py serve`, sign in, find the demo's job on the overview's count, in the list, on its page with
the diff and the tests, and its tokens on Usage; `/api/jobs` lists it, and `retry` and `cancel` with its id
answer as they do for a forge job (a local job is a job: issue 38).

Real processes with the embedded defaults (SQLite, filesystem broker) on a temp data folder; nothing
is prepared behind the CLI's back.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.conftest import SCREENSHOTS
from tests.servers import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
STARTUP_S = 120.0  # migrations, uvicorn and the embedded worker on a loaded two-CPU machine
PASSWORD = "first-hour-password-1"


@pytest.fixture
def newcomer_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A clean FROGFIX_* environment: only the data folder (and a workspace folder the sandbox can enter)."""
    workspaces = Path(tempfile.mkdtemp(prefix="frogfix-first-hour-"))
    workspaces.chmod(0o711)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env.update(
        FROGFIX_DATA_DIR=str(tmp_path / "data"), FROGFIX_WORKSPACE_DIR=str(workspaces),
        FROGFIX_SWEEP_INTERVAL_SECONDS="0",
    )
    try:
        yield env
    finally:
        shutil.rmtree(workspaces, ignore_errors=True)


def manage(env: dict[str, str], *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], env=env, input=stdin, capture_output=True, text=True,
        timeout=300,
    )


@contextlib.contextmanager
def serving(env: dict[str, str], log: Path) -> Iterator[str]:
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        wait_for_port(port, STARTUP_S)
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.mark.bwrap
def test_demo_then_serve_then_the_demos_job_on_the_dashboard(
    newcomer_env: dict[str, str], chromium: Any, tmp_path: Path
) -> None:
    demo = manage(newcomer_env, "demo", "--json")
    assert demo.returncode == 0, demo.stderr[-2000:]
    job_id = json.loads(demo.stdout)["job_id"]
    made = manage(newcomer_env, "create-admin", "newcomer", "--password-stdin", stdin=PASSWORD + "\n")
    assert made.returncode == 0, made.stderr

    with serving(newcomer_env, tmp_path / "serve.log") as base:
        context = chromium.new_context(base_url=base, viewport={"width": 1400, "height": 900})
        context.set_default_timeout(30_000)
        page = context.new_page()
        try:
            page.goto("/login")
            page.fill("input[name=username]", "newcomer")
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url(lambda url: "/login" not in url)

            page.goto("/")
            assert page.locator('[data-testid="total-jobs"]').inner_text() == "1"  # not `Jobs 0` above the demo
            assert page.locator("#job-rows").get_by_text("add() returns the difference").count() == 1

            page.goto("/jobs")
            row = page.locator(f'#job-rows tr[data-job-id="{job_id}"]')
            row.wait_for()
            assert "local" in row.inner_text().lower() and "add() returns the difference" in row.inner_text()
            assert page.locator('[data-testid="job-count"]').inner_text().startswith("1 job")
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SCREENSHOTS / "first-hour-jobs.png"), full_page=True)

            row.locator(f'a[href="/jobs/{job_id}"]').first.click()
            page.wait_for_url(f"**/jobs/{job_id}")
            assert page.locator("h1").inner_text().startswith(f"Job {job_id}")
            assert page.locator('[data-testid="forge"]').inner_text().lower() == "local"
            assert "+    return a + b" in page.locator('[data-testid="diff"]').inner_text().replace("\u2212", "-")
            tests = page.locator(".tests").inner_text()
            assert "before the patch" in tests.lower() and "passed" in tests
            assert page.locator(".evidence-level").inner_text() in ("reproduced", "failed_before")
            page.screenshot(path=str(SCREENSHOTS / "first-hour-demo-job.png"), full_page=True)

            page.goto("/usage")
            usage = page.locator("main").inner_text()
            assert "No jobs in this window" not in usage and "9,390" in usage  # the demo's prompt tokens

            listed = context.request.get("/api/jobs").json()  # the signed-in session reads the API too
            [item] = listed["items"]
            assert (item["id"], item["forge"], item["status"]) == (job_id, "local", "done")
            assert item["project"].endswith("/calc") and item["usage"]["prompt_tokens"] == 9390

            page.goto("/jobs/local-20261202-000000-ffffff")
            assert page.locator("h1").inner_text() == "Not found"
        finally:
            context.close()

        # `retry` and `cancel` with the demo's id say what they say of a finished forge job.
        retried = manage(newcomer_env, "retry", str(job_id))
        assert retried.returncode == 1 and f"job {job_id} is done; only failed" in retried.stderr, retried.stderr
        cancelled = manage(newcomer_env, "cancel", str(job_id))
        assert cancelled.returncode == 1 and f"job {job_id} is already done" in cancelled.stderr, cancelled.stderr
