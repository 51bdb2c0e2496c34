"""Issue 12, findings 3, 4 (push side) and 7: what the patch, the model or the issue chose stays inert
wherever FrogFix posts it, and forge CI does not run on the bot's branch unless a setting allows it.

End to end through the pipeline, for GitLab and for Gitea: a signed webhook, the real local sandbox,
real git over HTTP, a scripted model that creates files whose names hold line breaks, a hostile
summary and a hostile issue title. The checks below are oracles written from the forges' own
rules (GitLab's default closing pattern and quick-action syntax, Gitea's keyword and reference
patterns), applied to every text FrogFix left on the forge: MR title and description, commit
message and comments.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import records
from tests.conftest import configure
from tests.doubles.openai_server import assistant, text_call, tool_call
from tests.forge_oracles import bare_mentions, closing_references, quick_action_lines, rendered_outside_code
from tests.pipeline.conftest import PROJECT, TRIGGER, World
from worker.tasks import run_job

# The finding's four names, one with a carriage return, and one that would close a code span.
HOSTILE_NAMES = ["a\n/ready\n", "c\n/merge\n", "b\n@all\n", "e\n/assign @eve\n", "r\r/close\r", "t`/unlock`"]
HOSTILE_TITLE = (
    "add() broken. Closes other-group/billing#17 @all\n/merge fixes #2, Resolves PROJ-9 and "
    "closes https://forge.example/other-group/billing/-/issues/18"
)
HOSTILE_SUMMARY = (
    "Fixed add().\n```\n/merge\n@all look\nCloses other-group/billing#17\n   ```   \n/approve\n"
    "<img src=http://127.0.0.1:9/x> ![i](http://127.0.0.1:9/y)"
)


def _bash_quoted(name: str) -> str:
    """`name` as a bash $'...' word."""
    return "$'" + "".join(f"\\x{ord(c):02x}" if not c.isalnum() else c for c in name) + "'"


def hostile_script() -> list[Any]:
    """The fix, plus files with hostile names, plus a summary that tries to leave its code block."""
    words = " ".join(_bash_quoted(n) for n in HOSTILE_NAMES)
    make = f'for n in {words}; do case "$n" in */*) mkdir -p -- "${{n%/*}}";; esac; printf "x\\n" > "$n"; done'
    return [
        assistant(text_call("Edit", file_path="calc.py", old_string="return a - b", new_string="return a + b")),
        assistant(None, tool_calls=[tool_call("Bash", {"command": make})]),
        assistant(HOSTILE_SUMMARY),
    ]


def assert_inert(text: str, own_issue: int, where: str) -> None:
    """Even inside code: no quick action, no mention, no closing reference but the job's own;
    and nothing a browser would fetch where the forge renders Markdown."""
    assert quick_action_lines(text) == [], where
    assert bare_mentions(text) == [], where
    assert closing_references(text) <= {f"#{own_issue}"}, where
    assert "<img" not in rendered_outside_code(text), where


def test_the_oracles_see_what_the_finding_describes() -> None:
    """The checks fail on what today's code posted, so a pass means something."""
    raw = "| `a\n/ready\n` | 1 | 0 |\nadd() broken. Closes other-group/billing#17 @all\r/merge"
    assert quick_action_lines(raw) == ["/ready", "/merge"]
    assert quick_action_lines("````text\nx\n```\n/merge\n````") == ["/merge"]  # GitLab's reader, not CommonMark's
    assert bare_mentions(raw) == ["@all"]
    assert closing_references(raw) == {"other-group/billing#17"}
    assert closing_references("Fix #5: x") == {"#5"}
    assert closing_references("fixes #2, other/x#3 and https://h/g/p/-/issues/4") == {
        "#2",
        "other/x#3",
        "https://h/g/p/-/issues/4",
    }
    assert closing_references("Resolves PROJ-9") == {"PROJ-9"}


# -- helpers -----------------------------------------------------------------------------------


def _git(bare: Path, *args: str) -> str:
    """Git's output as it is: no universal-newline translation, which would turn a `\r` into `\n`."""
    done = subprocess.run(["git", "--git-dir", str(bare), *args], capture_output=True, check=True)
    return done.stdout.decode("utf-8", "surrogateescape")


def _quoted(name: str) -> str:
    """The name as the MR shows it: git's C-quoting of a name that holds odd characters."""
    escapes = {"\n": "\\n", "\r": "\\r", '"': '\\"', "\\": "\\\\"}
    return '"' + "".join(escapes.get(c, c) for c in name) + '"'


def _run_gitlab(client: Any, world: World) -> tuple[int, int]:
    issue = world.gitlab.add_issue(PROJECT, title=HOSTILE_TITLE, author="rep")
    world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
    body, headers = world.gitlab_webhook(issue["iid"])
    r = client.post("/webhooks/gitlab", content=body, headers=headers)
    assert r.status_code == 202, r.text
    return int(r.json()["job_id"]), int(issue["iid"])


def _run_gitea(client: Any, world: World) -> tuple[int, int]:
    issue = world.gitea.add_issue(PROJECT, title=HOSTILE_TITLE, author="rep")
    world.gitea.add_label(PROJECT, issue["number"], TRIGGER, by="dev")
    body, headers = world.gitea_webhook(issue["number"])
    r = client.post("/webhooks/gitea", content=body, headers=headers)
    assert r.status_code == 202, r.text
    return int(r.json()["job_id"]), int(issue["number"])


def _job(job_id: int) -> Any:
    with session_scope() as s:
        return records.get_job(s, job_id)


def _check_published(world: World, forge: str, job_id: int, number: int) -> None:
    job = _job(job_id)
    bare = world.bare(forge)
    notes = world.gitlab.notes if forge == "gitlab" else world.gitea.comments
    for comment in [n["body"] for n in notes]:
        assert_inert(comment, number, "comment")
    if forge == "gitlab":
        mrs = world.gitlab.open_mrs(PROJECT)
        texts = [(m["title"], m["description"]) for m in mrs]
    else:
        pulls = world.gitea.open_pulls(PROJECT)
        texts = [(p["title"], p["body"]) for p in pulls]
    if job.status != "done":  # refusing such a patch is fine, as long as what was posted stays inert
        assert texts == []
        return
    [(title, description)] = texts
    message = _git(bare, "log", "-1", "--format=%B", job.branch)
    assert "\n" not in title and "\r" not in title, "a title with a newline still publishes, as one line"
    assert message.split("\n", 1)[0].startswith(f"Fix #{number}: ")
    assert "\r" not in message and len(message.split("\n\n", 1)[0].splitlines()) == 1, "the subject is one line"
    for where, text in (("title", title), ("description", description), ("commit message", message)):
        assert_inert(text, number, where)
    assert "add() broken." in title and "billing" in title  # still readable
    for name in HOSTILE_NAMES:
        shown = (_quoted(name) if re.search(r"[\r\n]", name) else name).replace("@", "@\u200b")
        assert re.search("`+ ?" + re.escape(shown) + " ?`+", description), name  # inside a code span
    for line in description.splitlines():  # each file name stays inside its table row
        if line.startswith("| ") and "\\n" in line:
            assert line.endswith(" | 1 | 0 |"), line
    stored = _git(bare, "ls-tree", "-r", "-z", "--name-only", job.branch).split("\0")
    assert set(HOSTILE_NAMES) <= set(stored)  # what git stored is what the MR names


@pytest.mark.parametrize("forge", ["gitlab", "gitea"])
def test_hostile_names_summary_and_title_are_posted_inert(client: Any, world: World, forge: str) -> None:
    world.model._script[:] = hostile_script()
    job_id, number = _run_gitlab(client, world) if forge == "gitlab" else _run_gitea(client, world)
    # published: the names, summary and title are made inert, not refused, so every check below runs
    assert run_job(job_id) == "done", _job(job_id).error
    _check_published(world, forge, job_id, number)


# -- CI on the bot's branch --------------------------------------------------------------------


def _pushed(world: World, forge: str) -> list[Any]:
    double = world.git_gitlab if forge == "gitlab" else world.git_gitea
    return [p for p in double.pushes if any(ref.startswith("refs/heads/frogfix/") for _, _, ref in p.updates)]


def _ordinary_job(client: Any, world: World, forge: str) -> tuple[int, int]:
    if forge == "gitlab":
        issue = world.gitlab.add_issue(PROJECT, title="add() returns the difference", author="rep")
        world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
        body, headers = world.gitlab_webhook(issue["iid"])
        r = client.post("/webhooks/gitlab", content=body, headers=headers)
        number = issue["iid"]
    else:
        issue = world.gitea.add_issue(PROJECT, title="add() returns the difference", author="rep")
        world.gitea.add_label(PROJECT, issue["number"], TRIGGER, by="dev")
        body, headers = world.gitea_webhook(issue["number"])
        r = client.post("/webhooks/gitea", content=body, headers=headers)
        number = issue["number"]
    assert r.status_code == 202, r.text
    return int(r.json()["job_id"]), int(number)


@pytest.mark.parametrize("forge", ["gitlab", "gitea"])
def test_forge_ci_does_not_run_on_the_bots_branch_by_default(client: Any, world: World, forge: str) -> None:
    job_id, _ = _ordinary_job(client, world, forge)
    assert run_job(job_id) == "done"
    message = _git(world.bare(forge), "log", "-1", "--format=%B", _job(job_id).branch)
    [push] = _pushed(world, forge)
    # Gitea and Forgejo Actions (and Woodpecker, Drone) skip on the message; GitLab too, for the
    # merge request pipeline that opening the MR would start, which the push option does not cover.
    assert "[skip ci]" in message
    assert push.options == (["ci.skip"] if forge == "gitlab" else [])


@pytest.mark.parametrize("forge", ["gitlab", "gitea"])
def test_the_setting_lets_forge_ci_run(client: Any, world: World, forge: str) -> None:
    configure(world.env["monkeypatch"], allow_forge_ci="true")
    job_id, _ = _ordinary_job(client, world, forge)
    assert run_job(job_id) == "done"
    message = _git(world.bare(forge), "log", "-1", "--format=%B", _job(job_id).branch)
    [push] = _pushed(world, forge)
    assert "skip ci" not in message.lower() and "ci skip" not in message.lower()
    assert push.options == []
