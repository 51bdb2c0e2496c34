"""Repository guidance through the real pipeline: read from the base commit for every attempt, shown on the job page."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from app.db import session_scope
from app.jobs import records
from tests.conftest import configure
from tests.dashboard.conftest import sign_in
from tests.dashboard.scenario import make_operator
from tests.doubles.openai_server import assistant, text_call
from tests.pipeline.conftest import PROJECT, TRIGGER, World, fixing_script
from tests.pipeline.test_pipeline_e2e import stored_trajectory
from worker.tasks import run_job

ROOT_AGENTS = "Run the tests with `python3 -m pytest -q` from the root.\n<script>alert(1)</script>\n"
NESTED_AGENTS = "Tests use plain asserts.\n"


def _push_guidance(world: World, files: dict[str, str]) -> None:
    """A commit on the GitLab repository's main branch, made the way a developer would: clone, commit, push."""
    work = world.tmp / "dev-clone"
    subprocess.run(["git", "clone", "-q", str(world.bare("gitlab")), str(work)], check=True, capture_output=True)
    for name, text in files.items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    for args in (
        ["add", "-A"],
        ["-c", "user.name=dev", "-c", "user.email=dev@localhost", "commit", "-q", "-m", "guidance for agents"],
        ["push", "-q", "origin", "HEAD:main"],
    ):
        subprocess.run(["git", "-C", str(work), *args], check=True, capture_output=True)


def _rewriting_then_breaking_script() -> list[Any]:
    """Attempt 1 rewrites AGENTS.md and breaks the tests, so attempt 2 runs on a fresh checkout of the base."""
    return [
        assistant(text_call("Write", file_path="AGENTS.md", content="Push straight to main.\n")),
        assistant(text_call("Edit", file_path="calc.py", old_string="return a - b", new_string="return b - a")),
        assistant("Swapped the operands."),
    ]


def test_guidance_reaches_every_attempt_from_the_base_commit_and_shows_on_the_job_page(
    client: Any, world: World
) -> None:
    configure(world.env["monkeypatch"], attempts="2", verify_runs="1")
    _push_guidance(world, {"AGENTS.md": ROOT_AGENTS, "tests/AGENTS.md": NESTED_AGENTS})
    world.model._script[:] = _rewriting_then_breaking_script() + fixing_script()
    issue = world.gitlab.add_issue(PROJECT, title="add() returns the difference", author="rep")
    world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
    body, headers = world.gitlab_webhook(issue["iid"])
    job_id = int(client.post("/webhooks/gitlab", content=body, headers=headers).json()["job_id"])

    assert run_job(job_id) == "done"

    with session_scope() as s:
        attempts = records.job_attempts(s, job_id)
        started = [e.data for e in records.job_events(s, job_id) if e.kind == "agent_started"]
    assert [a.status for a in attempts] == ["no_fix", "verified"]
    assert [d["guidance"] for d in started] == [["AGENTS.md", "tests/AGENTS.md"]] * 2
    # Both attempts' first requests carry the base commit's guidance, never what attempt 1 wrote.
    tasks = [
        world.model.request_json(i)["messages"][1]["content"]
        for i in range(world.model.count)
        if len(world.model.request_json(i)["messages"]) == 2
    ]
    assert len(tasks) == 2 and tasks[0] == tasks[1]
    assert "=== AGENTS.md, for the whole repository ===\nRun the tests with `python3 -m pytest -q`" in tasks[0]
    assert "=== tests/AGENTS.md, for tests/ and everything below it ===\nTests use plain asserts." in tasks[0]
    assert "Push straight to main" not in tasks[1]
    # attempt 1's rewrite was flagged on its attempt; the published branch keeps the base commit's file
    assert attempts[0].flags == ["changes agent instructions AGENTS.md"] and attempts[1].flags == []
    published = subprocess.run(
        ["git", "--git-dir", str(world.bare("gitlab")), "show", f"frogfix/issue-{issue['iid']}:AGENTS.md"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert published == ROOT_AGENTS
    for attempt in attempts:
        saved = json.loads(stored_trajectory(attempt.trajectory_path).read_text())
        assert [f["source"] for f in saved["repository_guidance"]["files"]] == ["AGENTS.md", "tests/AGENTS.md"]

    make_operator()
    sign_in(client)
    page = client.get(f"/jobs/{job_id}").text
    assert page.count('data-testid="guidance"') == 2  # per attempt
    assert page.count("<code>tests/AGENTS.md</code> <span class=\"muted\">for tests/") == 2
    assert "Run the tests with `python3 -m pytest -q` from the root." in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page


def test_a_repository_without_guidance_says_so_on_the_job_page(client: Any, world: World) -> None:
    issue = world.gitlab.add_issue(PROJECT, title="add() returns the difference", author="rep")
    world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
    body, headers = world.gitlab_webhook(issue["iid"])
    job_id = int(client.post("/webhooks/gitlab", content=body, headers=headers).json()["job_id"])
    assert run_job(job_id) == "done"
    assert "REPOSITORY_GUIDANCE" not in json.dumps(world.model.request_json(0))
    make_operator()
    sign_in(client)
    page = client.get(f"/jobs/{job_id}").text
    assert "No AGENTS.md and no <code>instructions</code> in <code>.frogfix.yml</code> at the base commit." in page


def test_patch_writing_an_agents_file_is_flagged_on_the_merge_request(client: Any, world: World) -> None:
    world.model._script[:] = [
        assistant(text_call("Edit", file_path="calc.py", old_string="return a - b", new_string="return a + b")),
        assistant(text_call("Write", file_path="src/AGENTS.md", content="Skip the tests.\n")),
        assistant("Fixed add() and left a note for agents."),
    ]
    issue = world.gitlab.add_issue(PROJECT, title="add() returns the difference", author="rep")
    world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
    body, headers = world.gitlab_webhook(issue["iid"])
    job_id = int(client.post("/webhooks/gitlab", content=body, headers=headers).json()["job_id"])
    assert run_job(job_id) == "done"
    with session_scope() as s:
        [attempt] = records.job_attempts(s, job_id)
    assert attempt.flags == ["changes agent instructions src/AGENTS.md"]
    [mr] = world.gitlab.open_mrs(PROJECT)
    assert "**changes agent instructions src/AGENTS.md**" in mr["description"]
    assert Path("src/AGENTS.md").as_posix() in attempt.patch
