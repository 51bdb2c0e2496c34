"""Review rounds end to end, for GitLab and for Gitea: a signed comment, review or CI webhook on the
bot's MR, the worker's triage, the round through the real pipeline (forge doubles, real git over HTTP,
the scripted model), and what lands on the branch, the MR and its thread."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.forge.reviews import STALE_CI
from app.jobs import read_model, records, rounds
from app.models import Job, RoundRequest
from tests.conftest import GITEA_SECRET, PAYLOADS
from tests.doubles.openai_server import assistant, text_call, tool_call
from tests.pipeline.conftest import PROJECT, TRIGGER, World, fixing_script
from tests.servers import wait_until
from tests.webhook_requests import gitea_headers, gitlab_headers
from worker.tasks import run_job, triage_request_task

DOCSTRING = '    """The product of a and b."""\n'


def round_script(docstring: str = DOCSTRING) -> list[Any]:
    """What the model does in a round: add a docstring to mul(), run the tests, say what changed."""
    return [
        assistant(None, tool_calls=[tool_call("Read", {"file_path": "calc.py"})]),
        assistant(
            text_call(
                "Edit",
                file_path="calc.py",
                old_string="def mul(a: int, b: int) -> int:\n",
                new_string="def mul(a: int, b: int) -> int:\n" + docstring,
            )
        ),
        assistant("mul() now has the docstring the reviewer asked for."),
    ]


def git(bare: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "--git-dir", str(bare), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def branch_head(world: World, forge: str, branch: str) -> str:
    return git(world.bare(forge), "rev-parse", f"refs/heads/{branch}")


def commit_to(
    world: World, forge: str, branch: str, files: dict[str, str], message: str, who: str = "Rev"
) -> str:
    """Someone (not FrogFix) pushes a commit writing `files` to `branch` of the forge's repository; its sha."""
    bare, parent = world.bare(forge), branch_head(world, forge, branch)
    env = {"GIT_INDEX_FILE": str(world.tmp / f"index-{forge}-{who}"), "PATH": "/usr/bin:/bin"}
    for role in ("AUTHOR", "COMMITTER"):
        env.update({f"GIT_{role}_NAME": who, f"GIT_{role}_EMAIL": f"{who.lower()}@example.test"})

    def run(*args: str, stdin: str | None = None) -> str:
        done = subprocess.run(
            ["git", "--git-dir", str(bare), *args], input=stdin, capture_output=True, text=True, check=True, env=env
        )
        return done.stdout.strip()

    run("read-tree", parent)
    for path, text in files.items():
        blob = run("hash-object", "-w", "--stdin", stdin=text)
        run("update-index", "--add", "--cacheinfo", f"100644,{blob},{path}")
    commit = run("commit-tree", run("write-tree"), "-p", parent, "-m", message)
    run("update-ref", f"refs/heads/{branch}", commit, parent)
    return commit


def human_push(world: World, forge: str, branch: str, path: str = "NOTES.md", text: str = "by hand\n") -> str:
    """A reviewer pushes a commit of their own to the bot's branch (adding `path`); its sha."""
    return commit_to(world, forge, branch, {path: text}, "a reviewer's own commit")


def first_user_message(world: World) -> str:
    """The newest model call's first user message (the round's task)."""
    messages = world.model.request_json(world.model.count - 1)["messages"]
    return str(next(m["content"] for m in messages if m["role"] == "user"))


def gated(world: World, script: list[Any]) -> threading.Event:
    """The model answers `script`, its first turn held until the returned gate is set (a round kept running)."""
    gate = threading.Event()
    turns = {"n": 0}

    def respond(index: int, body: bytes) -> Any:
        n = turns["n"]
        turns["n"] += 1
        if n == 0:
            gate.wait(60)
        return script[min(n, len(script) - 1)]

    world.model._responder = respond
    return gate


@pytest.fixture
def prompt_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The running round reads its cancel flag at every check (not once every 2 s), so a test that
    cancels it while its model turn is held sees the very next check stop it."""
    from worker.job import job_context

    monkeypatch.setattr(job_context.CancelCheck.__init__, "__defaults__", (0.0,))


def run_in_background(job_id: int) -> tuple[threading.Thread, dict[str, str]]:
    results: dict[str, str] = {}
    worker = threading.Thread(target=lambda: results.update(status=run_job(job_id)))
    worker.start()
    return worker, results


@contextmanager
def round_held_running(mr: GitLabMr | GiteaPr, world: World) -> Iterator[tuple[Job, dict[str, str]]]:
    """Round 1, asked for by one `/frogfix` comment, running in the background with its first model
    turn held (its request taken) until the block ends; yields its job and the dict where its run's
    status lands under "status" once the block ended and the round finished."""
    gate = gated(world, round_script())
    first = mr.comment("/frogfix please document mul() too")
    triage(first["request_id"])
    running = newest_round(mr.thread_id)
    worker, results = run_in_background(running.id)
    try:
        wait_until(lambda: job(running.id).status == "running" and requests(mr.thread_id)[0].status == "taken")
        yield running, results
    finally:
        gate.set()
        worker.join(120)


def job(job_id: int) -> Job:
    with session_scope() as s:
        found = records.get_job(s, job_id)
        s.expunge(found)
        return found


def thread(thread_id: int) -> list[Job]:
    with session_scope() as s:
        jobs = rounds.thread_jobs(s, thread_id)
        for j in jobs:
            s.expunge(j)
        return jobs


def requests(thread_id: int) -> list[RoundRequest]:
    with session_scope() as s:
        found = rounds.requests_of(s, thread_id=thread_id)
        for r in found:
            s.expunge(r)
        return found


def triage(request_id: int) -> str:
    """What the Celery task `frogfix.triage_request` does, run here (the test plays the worker)."""
    return str(triage_request_task.run(request_id))


def newest_round(thread_id: int) -> Job:
    return thread(thread_id)[-1]


# ----------------------------------------------------------------------------------------------
# GitLab
# ----------------------------------------------------------------------------------------------


class GitLabMr:
    """Round 0 on the GitLab double (an issue labelled, its job run, its draft MR), and deliveries on that MR."""

    def __init__(self, client: Any, world: World) -> None:
        self.client, self.world = client, world
        issue = world.gitlab.add_issue(PROJECT, title="add() returns the difference", author="rep")
        world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
        body, headers = world.gitlab_webhook(issue["iid"])
        r = client.post("/webhooks/gitlab", content=body, headers=headers)
        assert r.status_code == 202, r.text
        self.thread_id = int(r.json()["job_id"])
        assert run_job(self.thread_id) == "done"
        self.issue = issue["iid"]
        [mr] = world.gitlab.open_mrs(PROJECT)
        self.iid = int(mr["iid"])
        self.branch = str(mr["source_branch"])
        self.sync_head()

    def sync_head(self) -> str:
        """GitLab moves the MR's head with every push to its branch; the double is told."""
        head = branch_head(self.world, "gitlab", self.branch)
        self.world.gitlab.set_mr_head(PROJECT, self.iid, head)
        return head

    def mr(self) -> dict[str, Any]:
        return self.world.gitlab.mr(PROJECT, self.iid)

    def note_hook(self, note: dict[str, Any], *, author: str) -> dict[str, Any]:
        """POST the Note Hook GitLab sends for `note` (made on the double); the endpoint's JSON answer."""
        payload = json.loads((PAYLOADS / "gitlab_mr_note.json").read_text())
        attrs = payload["object_attributes"]
        attrs.update(
            id=note["id"],
            note=note["body"],
            discussion_id=note.get("discussion_id"),
            type=note.get("type"),
            position=note.get("position"),
            noteable_id=self.mr()["id"],
            url=f"{self.mr()['web_url']}#note_{note['id']}",
        )
        payload["user"]["username"] = author
        payload["project"]["path_with_namespace"] = PROJECT
        payload["merge_request"].update(
            iid=self.iid,
            id=self.mr()["id"],
            source_branch=self.branch,
            state="opened",
            last_commit={**payload["merge_request"]["last_commit"], "id": self.mr()["sha"]},
        )
        r = self.client.post(
            "/webhooks/gitlab", content=json.dumps(payload).encode(), headers=gitlab_headers(event="Note Hook")
        )
        assert r.status_code in (200, 202), r.text
        return dict(r.json())

    def comment(self, body: str, *, by: str = "dev", **where: Any) -> dict[str, Any]:
        note = self.world.gitlab.add_mr_note(PROJECT, self.iid, body, by=by, **where)
        note = next(n for n in self.world.gitlab.mr_notes(PROJECT, self.iid) if n["id"] == note["id"])
        return self.note_hook(note, author=by)

    def pipeline_hook(
        self,
        *,
        status: str,
        sha: str,
        jobs: list[dict[str, Any]],
        ref: str | None = None,
        mr: int | None = None,
        payload_name: str = "gitlab_pipeline_failed.json",
    ) -> dict[str, Any]:
        """A finished pipeline on `sha`: a branch pipeline, or with `mr` one whose hook names that MR
        (`ref` refs/merge-requests/N/head, or /merge for merged results)."""
        ref = ref or self.branch
        source = "merge_request_event" if mr is not None else "push"
        pipeline = self.world.gitlab.add_pipeline(PROJECT, sha=sha, ref=ref, status=status, jobs=jobs, source=source)
        payload = json.loads((PAYLOADS / payload_name).read_text())
        payload["object_attributes"].update(id=pipeline["id"], sha=sha, ref=ref, status=status, source=source)
        payload["commit"]["id"] = sha
        payload["project"]["path_with_namespace"] = PROJECT
        payload["merge_request"] = None if mr is None else {
            **payload["merge_request"], "iid": mr, "id": self.mr()["id"], "source_branch": self.branch,
            "state": "opened",
        }  # fmt: skip
        payload["builds"] = [
            {**payload["builds"][0], "id": j["id"], "name": j["name"], "status": j["status"], "allow_failure": False}
            for j in self.world.gitlab.jobs.values()
            if j["pipeline"]["id"] == pipeline["id"]
        ]
        r = self.client.post(
            "/webhooks/gitlab", content=json.dumps(payload).encode(), headers=gitlab_headers(event="Pipeline Hook")
        )
        assert r.status_code in (200, 202), r.text
        return dict(r.json())

    def bot_notes(self) -> list[dict[str, Any]]:
        return [n for n in self.world.gitlab.mr_notes(PROJECT, self.iid) if n["author"]["username"] == "frogfix-bot"]

    def label_hook(self, *, added: bool) -> dict[str, Any]:
        """The trigger label added to (or removed from) the issue, and the Issue Hook GitLab sends for it."""
        if added:
            self.world.gitlab.add_label(PROJECT, self.issue, TRIGGER, by="dev")
            body, headers = self.world.gitlab_webhook(self.issue)
        else:
            self.world.gitlab.remove_label(PROJECT, self.issue, TRIGGER, by="dev")
            payload = json.loads((PAYLOADS / "gitlab_label_removed.json").read_text())
            payload["object_attributes"]["iid"] = self.issue
            payload["project"]["path_with_namespace"] = PROJECT
            body, headers = json.dumps(payload).encode(), gitlab_headers()
        r = self.client.post("/webhooks/gitlab", content=body, headers=headers)
        assert r.status_code in (200, 202), r.text
        return dict(r.json())

    def ci_cells(self) -> dict[int, str]:
        """The forge CI each round shows in the MR description's rounds section (round number: cell)."""
        cells = {}
        for line in self.mr()["description"].splitlines():
            parts = [p.strip() for p in line.strip().strip("|").split("|")]
            if len(parts) == 6 and parts[0] and parts[0][0] in "[0123456789":
                cells[int(parts[0].lstrip("[").split("]")[0])] = parts[5]
        return cells


def test_gitlab_review_comment_gives_one_commit_on_the_branch_and_a_reply(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    before = mr.sync_head()
    world.model.add(*round_script())

    answer = mr.comment("/frogfix please document mul() too")
    assert answer["outcome"] == "round_request", answer
    assert triage(answer["request_id"]) == "accepted"
    round_job = newest_round(mr.thread_id)
    assert round_job.round == 1 and round_job.round_kind == "review" and round_job.trigger_user == "dev"
    assert run_job(round_job.id) == "done"

    after = branch_head(world, "gitlab", mr.branch)
    assert git(world.bare("gitlab"), "rev-list", "--count", f"{before}..{after}") == "1"
    assert git(world.bare("gitlab"), "rev-parse", f"{after}^") == before  # on top of the previous head
    assert '"""The product of a and b."""' in git(world.bare("gitlab"), "show", f"{after}:calc.py")
    assert "return a + b" in git(world.bare("gitlab"), "show", f"{after}:calc.py")  # round 0's fix kept
    done = job(round_job.id)
    assert done.status == "done" and done.start_commit == before and done.pushed_commit == after
    [reply] = mr.bot_notes()
    assert "calc.py" in reply["body"] and "docstring" in reply["body"]
    assert mr.mr()["draft"] is True  # it was a draft and stays one
    assert "Review rounds" in mr.mr()["description"]
    [push] = [p for p in world.git_gitlab.pushes if any(u[1] == after for u in p.updates)]
    assert push.updates == [(before, after, f"refs/heads/{mr.branch}")]  # named the previous head: never a force
    # forge CI stays off the bot's branch: the push option skips the branch pipeline, the commit
    # message the merge request pipeline too
    assert push.options == ["ci.skip"] and "[skip ci]" in git(world.bare("gitlab"), "log", "-1", "--format=%B", after)
    # the round's first user message holds the reviewer's comment and the issue
    first_user = next(
        m["content"] for m in world.model.request_json(world.model.count - 1)["messages"] if m["role"] == "user"
    )
    assert "please document mul() too" in first_user and "add() returns the difference" in first_user


def test_gitlab_non_member_gets_no_round_and_one_polite_reply(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    head = mr.sync_head()
    world.gitlab.add_user("stranger")
    for text in ("/frogfix rewrite it all", "/frogfix please?"):
        answer = mr.comment(text, by="stranger")
        assert triage(answer["request_id"]) == "ignored"
    assert [j.round for j in thread(mr.thread_id)] == [0]
    replies = mr.bot_notes()
    assert len(replies) == 1 and "Developer" in replies[0]["body"]
    assert branch_head(world, "gitlab", mr.branch) == head


def test_gitlab_bot_reply_never_starts_a_round(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    world.model.add(*round_script())
    answer = mr.comment("/frogfix please document mul() too")
    triage(answer["request_id"])
    assert run_job(newest_round(mr.thread_id).id) == "done"
    [reply] = mr.bot_notes()
    echoed = mr.note_hook(reply, author="frogfix-bot")  # GitLab sends a Note Hook for the bot's own reply too
    assert echoed["outcome"] == "ignored" or triage(echoed["request_id"]) == "ignored"
    assert [j.round for j in thread(mr.thread_id)] == [0, 1]


def test_gitlab_two_comments_during_a_round_become_one_next_round(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    gate = threading.Event()
    script = round_script() + round_script('    """Multiply."""\n')
    turns = {"n": 0}

    def respond(index: int, body: bytes) -> Any:
        n = turns["n"]
        turns["n"] += 1
        if n == 0:
            gate.wait(60)  # round 1's first model turn waits until both comments are in
        return script[n]

    world.model._responder = respond
    first = mr.comment("/frogfix please document mul() too")
    triage(first["request_id"])
    round_one = newest_round(mr.thread_id)
    results: dict[str, str] = {}
    worker = threading.Thread(target=lambda: results.update(one=run_job(round_one.id)))
    worker.start()
    try:
        wait_until(
            lambda: job(round_one.id).status == "running" and all(r.status == "taken" for r in requests(mr.thread_id)),
            timeout=60,
        )
        for text in ("/frogfix and mention the types", "@frogfix-bot also keep it short"):
            answer = mr.comment(text)
            assert triage(answer["request_id"]) == "accepted"
        assert [j.round for j in thread(mr.thread_id)] == [0, 1]  # one round at a time
    finally:
        gate.set()
        worker.join(120)
    assert results["one"] == "done"
    jobs = thread(mr.thread_id)
    assert [j.round for j in jobs] == [0, 1, 2]  # the run's follow-up started exactly one next round
    round_two = jobs[-1]
    mr.sync_head()
    assert run_job(round_two.id) == "done"
    with session_scope() as s:
        taken = rounds.requests_of(s, job_id=round_two.id)
        assert sorted(r.data["body"] for r in taken) == [
            "/frogfix and mention the types",
            "@frogfix-bot also keep it short",
        ]


def test_gitlab_failed_pipeline_gives_one_round_and_the_rounds_stop_at_the_cap(
    client: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import configure

    configure(monkeypatch, max_ci_rounds="1")
    mr = GitLabMr(client, world)
    head = mr.sync_head()
    world.model.add(*round_script())
    trace = (
        "\x1b[32;1m$ python3 -m pytest\x1b[0m\nE   AssertionError: mul() has no docstring\nJob failed: exit code 1\n"
    )
    answer = mr.pipeline_hook(
        status="failed", sha=head, jobs=[{"name": "pytest", "stage": "test", "status": "failed", "trace": trace}]
    )
    assert triage(answer["request_id"]) == "accepted"
    assert job(mr.thread_id).ci_status == "failed"
    assert mr.ci_cells() == {0: "failed", 1: "-"}  # shown on the MR too (round 1 is queued already)
    round_job = newest_round(mr.thread_id)
    assert round_job.round_kind == "ci"
    assert run_job(round_job.id) == "done"
    task = next(
        m["content"] for m in world.model.request_json(world.model.count - 1)["messages"] if m["role"] == "user"
    )
    assert "mul() has no docstring" in task and "\x1b[" not in task  # the job's log tail, cleaned
    new_head = mr.sync_head()
    assert new_head != head

    again = mr.pipeline_hook(
        status="failed", sha=new_head, jobs=[{"name": "pytest", "status": "failed", "trace": "still failing\n"}]
    )
    assert triage(again["request_id"]) == "ignored"  # FROGFIX_MAX_CI_ROUNDS=1 reached
    assert [j.round for j in thread(mr.thread_id)] == [0, 1]
    assert any("FROGFIX_MAX_CI_ROUNDS" in n["body"] for n in mr.bot_notes())
    assert mr.ci_cells() == {0: "failed", 1: "failed"} and job(round_job.id).ci_status == "failed"
    passed = mr.pipeline_hook(status="success", sha=new_head, jobs=[{"name": "pytest", "status": "success"}])
    assert passed["outcome"] == "noted" and triage(passed["request_id"]) == "ignored"  # nothing to fix
    assert mr.ci_cells() == {0: "failed", 1: "success"} and job(round_job.id).ci_status == "success"
    with session_scope() as s:  # the dashboard's thread: a passing pipeline is no request turned down
        shown = read_model.job_thread(s, records.get_job(s, round_job.id))
        assert shown is not None and [r.reason for r in shown.turned_down] == [
            "the MR reached FROGFIX_MAX_CI_ROUNDS (1)"
        ]
    # review rounds do not count towards the CI cap
    world.model.add(*round_script('    """Multiply."""\n'))
    asked = mr.comment("/frogfix shorter docstring please")
    assert triage(asked["request_id"]) == "accepted"


def test_gitlab_human_ready_mr_stays_ready(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    world.gitlab.set_mr_ready(PROJECT, mr.iid)
    world.model.add(*round_script())
    answer = mr.comment("/frogfix please document mul() too", position={"new_path": "calc.py", "new_line": 5})
    assert triage(answer["request_id"]) == "accepted"
    assert run_job(newest_round(mr.thread_id).id) == "done"
    assert mr.mr()["draft"] is False and not mr.mr()["title"].startswith("Draft")
    # the reply went into the line comment's thread, which stays unresolved for the reviewer
    [reply] = mr.bot_notes()
    [line_note] = [n for n in world.gitlab.mr_notes(PROJECT, mr.iid) if n["author"]["username"] == "dev"]
    assert reply["discussion_id"] == line_note["discussion_id"]
    assert all(not n.get("resolved") for n in world.gitlab.mr_notes(PROJECT, mr.iid))


def test_gitlab_stop_cancels_the_queued_round_and_drops_what_waits(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    first = mr.comment("/frogfix please document mul() too")
    triage(first["request_id"])
    queued = newest_round(mr.thread_id)
    stop = mr.comment("/frogfix stop")
    assert triage(stop["request_id"]) == "taken"
    assert job(queued.id).status == "cancelled"  # it had not started: cancelled at once
    assert run_job(queued.id) == "not_claimed"
    assert [j.round for j in thread(mr.thread_id)] == [0, 1]
    [reply] = mr.bot_notes()
    assert reply["body"].endswith("FrogFix stopped: it cancelled the queued round and dropped 1 waiting request(s).")
    assert [r.status for r in requests(mr.thread_id)] == ["dropped", "taken"]
    with session_scope() as s:
        assert rounds.rounds_used(s, mr.thread_id) == 0  # the cancelled round did nothing: no round spent


def test_gitlab_stop_during_a_round_is_answered_once(client: Any, world: World, prompt_cancel: None) -> None:
    mr = GitLabMr(client, world)
    head = mr.sync_head()
    with round_held_running(mr, world) as (_, results):
        waiting = mr.comment("/frogfix and mention the types")
        assert triage(waiting["request_id"]) == "accepted"
        stop = mr.comment("/frogfix stop")
        assert triage(stop["request_id"]) == "taken"
    assert results["status"] == "cancelled" and branch_head(world, "gitlab", mr.branch) == head
    # One reply says it all: the stop's; the cancelled round adds no "ended" reply of its own.
    [reply] = mr.bot_notes()
    assert "cancelled the running round and dropped 1 waiting request(s)" in reply["body"]
    assert [r.status for r in requests(mr.thread_id)] == ["taken", "dropped", "taken"]
    assert [j.round for j in thread(mr.thread_id)] == [0, 1]  # nothing started after it


def test_gitlab_label_removal_cancels_the_round_and_drops_waiting_requests(
    client: Any, world: World, prompt_cancel: None
) -> None:
    mr = GitLabMr(client, world)
    head = mr.sync_head()
    with round_held_running(mr, world) as (running, results):
        second = mr.comment("/frogfix and mention the types")
        assert triage(second["request_id"]) == "accepted"  # waits for the next round
        removed = mr.label_hook(added=False)
        assert (removed["outcome"], removed["job_id"]) == ("cancelled_job", running.id)
        assert requests(mr.thread_id)[1].status == "dropped"  # at once, not when the round ends
    assert results["status"] == "cancelled" and branch_head(world, "gitlab", mr.branch) == head
    assert [j.round for j in thread(mr.thread_id)] == [0, 1]  # no next round for the dropped request
    assert [(r.status, r.reason) for r in requests(mr.thread_id)] == [
        ("taken", "dev asked for changes"), ("dropped", "label 'frognano-fix' was removed"),
    ]  # fmt: skip
    [reply] = mr.bot_notes()  # the round says it ended; nobody else is told twice
    assert "ended: **cancelled**; nothing was pushed" in reply["body"]
    with session_scope() as s:
        assert rounds.rounds_used(s, mr.thread_id, "review") == 1  # it took a request, so it counts

    # A round still queued when the label goes does nothing, and spends nothing of the cap.
    world.gitlab.add_label(PROJECT, mr.issue, TRIGGER, by="dev")  # back (its hook would start a new job 0)
    queued_ask = mr.comment("/frogfix once more")
    assert triage(queued_ask["request_id"]) == "accepted"
    queued = newest_round(mr.thread_id)
    assert queued.round == 2 and queued.status == "queued"
    assert mr.label_hook(added=False)["outcome"] == "cancelled_job"
    assert job(queued.id).status == "cancelled" and requests(mr.thread_id)[-1].status == "dropped"
    with session_scope() as s:
        assert rounds.rounds_used(s, mr.thread_id, "review") == 1


def test_gitlab_label_readded_after_a_round_and_a_human_push_keeps_both_commits(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    world.model.add(*round_script())
    asked = mr.comment("/frogfix please document mul() too")
    triage(asked["request_id"])
    assert run_job(newest_round(mr.thread_id).id) == "done"
    ours = mr.sync_head()
    theirs = human_push(world, "gitlab", mr.branch)
    mr.sync_head()
    description = mr.mr()["description"]
    pushes = len(world.git_gitlab.pushes)

    mr.label_hook(added=False)
    readded = mr.label_hook(added=True)
    assert readded["outcome"] == "job_created"
    world.model.add(*fixing_script())
    assert run_job(int(readded["job_id"])) == "rejected"

    assert branch_head(world, "gitlab", mr.branch) == theirs  # nothing was force-pushed over them
    assert git(world.bare("gitlab"), "rev-parse", f"{theirs}^") == ours  # and the round's commit is under theirs
    assert len(world.git_gitlab.pushes) == pushes
    assert mr.mr()["description"] == description and len(world.gitlab.open_mrs(PROJECT)) == 1
    refused = job(int(readded["job_id"]))
    why = f"{mr.branch} ends at {theirs[:12]}, a commit FrogFix did not push"
    assert refused.error == f"FrogFix did not start over: {why}"
    told = world.gitlab.notes[-1]["body"]
    assert "did not start over" in told and "`/frogfix`" in told and "never replaces those commits" in told
    assert not refused.steps  # refused before any attempt: the model was never asked


def test_gitlab_label_readded_on_round_zeros_own_commit_replaces_it_under_a_lease(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    old = mr.sync_head()
    # a passing pipeline on round 0's commit: the MR's rounds section shows it
    passed = mr.pipeline_hook(status="success", sha=old, jobs=[{"name": "pytest", "status": "success"}])
    assert triage(passed["request_id"]) == "ignored" and mr.ci_cells() == {0: "success"}

    mr.label_hook(added=False)
    readded = mr.label_hook(added=True)
    world.model.add(*fixing_script())
    assert run_job(int(readded["job_id"])) == "done"
    new = branch_head(world, "gitlab", mr.branch)
    assert new != old and git(world.bare("gitlab"), "rev-parse", f"{new}^") != old  # started from the base again
    [push] = [p for p in world.git_gitlab.pushes if any(u[1] == new for u in p.updates)]
    assert push.updates == [(old, new, f"refs/heads/{mr.branch}")]  # leased on round 0's commit, nothing else
    [only] = world.gitlab.open_mrs(PROJECT)
    assert only["iid"] == mr.iid and "python3 -m pytest -q" in only["description"]
    assert mr.ci_cells() == {0: "success"}  # the rewritten description kept the rounds section
    assert job(int(readded["job_id"])).pushed_commit == new


def test_gitlab_stale_ci_result_behind_a_review_round_ends_quietly(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    head = mr.sync_head()
    with round_held_running(mr, world) as (_, results):
        failed = mr.pipeline_hook(
            status="failed", sha=head, jobs=[{"name": "pytest", "status": "failed", "trace": "E  old failure\n"}]
        )
        assert triage(failed["request_id"]) == "accepted"  # on the head, for now
    assert results["status"] == "done"
    new_head = mr.sync_head()
    follow = newest_round(mr.thread_id)
    assert (follow.round, follow.round_kind, follow.status) == (2, "ci", "queued")
    calls = world.model.count
    assert run_job(follow.id) == "cancelled"

    assert branch_head(world, "gitlab", mr.branch) == new_head and world.model.count == calls  # no model call
    ci = requests(mr.thread_id)[-1]
    assert (ci.kind, ci.status, ci.reason, ci.job_id) == ("ci", "dropped", "stale: the branch moved on", follow.id)
    assert len(mr.bot_notes()) == 1  # round 1's reply only: the empty round says nothing
    with session_scope() as s:
        assert rounds.rounds_used(s, mr.thread_id, "ci") == 0  # FROGFIX_MAX_CI_ROUNDS is not spent on it


def test_gitlab_merged_results_pipeline_gives_a_round_on_the_mr_head(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    head = mr.sync_head()
    main = git(world.bare("gitlab"), "rev-parse", "refs/heads/main")
    merge, stale = "8c2d4e6f10a3b5c7d9e1f20a4b6c8d0e2f4a6b81", "9d3e5f7a21b4c6d8e0f2a31b5c7d9e1f3a5b7c92"
    world.gitlab.add_commit(PROJECT, merge, parents=[main, head], title="Merge branch into 'main'")
    world.gitlab.add_commit(PROJECT, stale, parents=[main, main], title="an older merged result")
    merged_ref = f"refs/merge-requests/{mr.iid}/merge"

    def merged(sha: str, trace: str, *, for_mr: int = mr.iid) -> dict[str, Any]:
        return mr.pipeline_hook(
            status="failed",
            sha=sha,
            ref=merged_ref,
            mr=for_mr,
            payload_name="gitlab_pipeline_merged_results.json",
            jobs=[{"name": "pytest", "status": "failed", "trace": trace}],
        )

    # A merged result of an older head, and one whose hook names another MR, are about no head of this MR.
    older = merged(stale, "E   old\n")
    assert triage(older["request_id"]) == "ignored"
    other = world.gitlab.add_mr(PROJECT, "feature/x")
    assert merged(merge, "E   x\n", for_mr=other["iid"])["outcome"] == "ignored"  # not an MR FrogFix opened
    world.model.add(*round_script())
    answer = merged(merge, "E   AssertionError: mul() has no docstring\n")
    assert answer["outcome"] == "round_request"
    assert triage(answer["request_id"]) == "accepted"
    ci = requests(mr.thread_id)[-1]
    assert ci.data["sha"] == head and ci.data["ref"] == merged_ref  # mapped to the MR's head
    assert (requests(mr.thread_id)[0].status, requests(mr.thread_id)[0].reason) == ("ignored", STALE_CI)
    assert job(mr.thread_id).ci_status == "failed" and mr.ci_cells() == {0: "failed", 1: "-"}  # on round 0's commit
    round_job = newest_round(mr.thread_id)
    assert round_job.round_kind == "ci" and run_job(round_job.id) == "done"
    assert "mul() has no docstring" in first_user_message(world)
    assert git(world.bare("gitlab"), "rev-parse", f"{branch_head(world, 'gitlab', mr.branch)}^") == head


def test_gitlab_mr_pipeline_on_the_head_ref_gives_a_round(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    head = mr.sync_head()
    world.model.add(*round_script())
    answer = mr.pipeline_hook(
        status="failed",
        sha=head,
        ref=f"refs/merge-requests/{mr.iid}/head",
        mr=mr.iid,
        jobs=[{"name": "pytest", "status": "failed", "trace": "E   boom in mul\n"}],
    )
    assert answer["outcome"] == "round_request" and triage(answer["request_id"]) == "accepted"
    [ci] = requests(mr.thread_id)
    assert ci.data["failed_jobs"][0]["log_tail"] == "E   boom in mul"  # fetched by FrogFix: the hook has no logs
    round_job = newest_round(mr.thread_id)
    assert round_job.round_kind == "ci" and run_job(round_job.id) == "done"
    assert "boom in mul" in first_user_message(world)


def test_gitlab_plain_line_comment_starts_a_round(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    world.model.add(*round_script())
    answer = mr.comment("please document mul() too", position={"new_path": "calc.py", "new_line": 5})
    assert answer["outcome"] == "round_request"
    assert triage(answer["request_id"]) == "accepted"  # a line comment on its MR is addressed to FrogFix
    assert run_job(newest_round(mr.thread_id).id) == "done"
    task = first_user_message(world)
    assert "please document mul() too" in task and "calc.py:5" in task and "unresolved" in task
    plain = mr.comment("looks fine to me")  # a plain comment that neither says /frogfix nor mentions it
    assert triage(plain["request_id"]) == "ignored"
    assert [j.round for j in thread(mr.thread_id)] == [0, 1]


def test_gitlab_round_builds_on_a_humans_push(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    theirs = human_push(world, "gitlab", mr.branch, "NOTES.md", "keep me\n")
    mr.sync_head()
    world.model.add(*round_script())
    answer = mr.comment("/frogfix please document mul() too")
    assert triage(answer["request_id"]) == "accepted"
    round_job = newest_round(mr.thread_id)
    assert run_job(round_job.id) == "done"
    after = branch_head(world, "gitlab", mr.branch)
    assert git(world.bare("gitlab"), "rev-parse", f"{after}^") == theirs and job(round_job.id).start_commit == theirs
    assert git(world.bare("gitlab"), "show", f"{after}:NOTES.md") == "keep me"
    assert '"""The product of a and b."""' in git(world.bare("gitlab"), "show", f"{after}:calc.py")


def test_gitlab_round_that_breaks_a_passing_test_pushes_nothing_and_says_why(
    client: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.conftest import configure

    configure(monkeypatch, attempts="1")
    mr = GitLabMr(client, world)
    head = mr.sync_head()
    world.model.add(
        assistant(text_call("Edit", file_path="calc.py", old_string="return a * b", new_string="return a ** b")),
        assistant("mul() now raises to the power, as asked."),
    )
    answer = mr.comment("/frogfix make mul() faster")
    assert triage(answer["request_id"]) == "accepted"
    round_job = newest_round(mr.thread_id)
    assert run_job(round_job.id) == "no_fix"
    assert branch_head(world, "gitlab", mr.branch) == head  # test_mul passed on the head: nothing pushed
    assert not any(u[1] != head and u[0] == head for p in world.git_gitlab.pushes for u in p.updates)
    [reply] = mr.bot_notes()
    assert "ended: **no fix**; nothing was pushed." in reply["body"]
    assert "did not pass the tests" in reply["body"]
    assert job(round_job.id).pushed_commit is None


# ----------------------------------------------------------------------------------------------
# Gitea
# ----------------------------------------------------------------------------------------------


class GiteaPr:
    """Round 0 on the Gitea double, and deliveries on its pull request."""

    def __init__(self, client: Any, world: World) -> None:
        self.client, self.world = client, world
        issue = world.gitea.add_issue(PROJECT, title="add() returns the difference", author="rep")
        world.gitea.add_label(PROJECT, issue["number"], TRIGGER, by="dev")
        body, headers = world.gitea_webhook(issue["number"])
        r = client.post("/webhooks/gitea", content=body, headers=headers)
        assert r.status_code == 202, r.text
        self.thread_id = int(r.json()["job_id"])
        assert run_job(self.thread_id) == "done"
        self.issue = int(issue["number"])
        [pull] = world.gitea.open_pulls(PROJECT)
        self.number = int(pull["number"])
        self.branch = str(pull["head"]["ref"])
        self.sync_head()

    def sync_head(self) -> str:
        head = branch_head(self.world, "gitea", self.branch)
        self.world.gitea.set_pull_head(PROJECT, self.number, head)
        return head

    def pull(self) -> dict[str, Any]:
        return self.world.gitea.pulls[(PROJECT, self.number)]

    def _post(self, name: str, event: str, event_type: str, fill: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        payload = json.loads((PAYLOADS / name).read_text())
        payload["repository"]["full_name"] = PROJECT
        fill(payload)
        raw = json.dumps(payload).encode()
        r = self.client.post(
            "/webhooks/gitea",
            content=raw,
            headers=gitea_headers(raw, event=event, event_type=event_type, secret=GITEA_SECRET),
        )
        assert r.status_code in (200, 202), r.text
        return dict(r.json())

    def comment(self, body: str, *, by: str = "dev") -> dict[str, Any]:
        made = self.world.gitea.add_pr_comment(PROJECT, self.number, body, by=by)

        def fill(p: dict[str, Any]) -> None:
            p["comment"].update(id=made["id"], body=body)
            p["comment"]["user"]["login"] = p["comment"]["user"]["username"] = by
            p["sender"]["login"] = p["sender"]["username"] = by
            p["issue"]["number"] = self.number
            p["issue"]["state"] = "open"

        return self._post("gitea_pr_comment.json", "issue_comment", "pull_request_comment", fill)

    def request_changes(self, body: str, *, by: str = "dev") -> dict[str, Any]:
        self.world.gitea.add_review(
            PROJECT,
            self.number,
            by=by,
            type="REQUEST_CHANGES",
            body=body,
            comments=[{"path": "calc.py", "line": 5, "body": body}],
        )

        def fill(p: dict[str, Any]) -> None:
            p["review"]["content"] = body
            p["sender"]["login"] = p["sender"]["username"] = by
            p["pull_request"].update(number=self.number, state="open", merged=False)
            p["pull_request"]["head"].update(ref=self.branch, sha=self.pull()["head"]["sha"])
            p["number"] = self.number

        return self._post("gitea_review_rejected.json", "pull_request_rejected", "pull_request_review_rejected", fill)

    def status(self, sha: str, state: str, description: str, context: str = "ci/tests") -> dict[str, Any]:
        self.world.gitea.add_status(PROJECT, sha, context, state, description, "https://ci.example/1")

        def fill(p: dict[str, Any]) -> None:
            p.update(sha=sha, state=state, context=context, description=description)
            if p.get("branches"):
                p["branches"][0]["name"] = self.branch

        return self._post("gitea_status_failure.json", "status", "status", fill)

    def bot_comments(self) -> list[dict[str, Any]]:
        return [c for c in self.world.gitea.pr_comments(PROJECT, self.number) if c["user"]["login"] == "frogfix-bot"]

    def label_removed(self) -> dict[str, Any]:
        """A member takes the trigger label off the issue: Gitea's label_updated names the labels left
        (it does not say which one went, so it is a hint the worker checks with the API)."""
        self.world.gitea.remove_label(PROJECT, self.issue, TRIGGER, by="dev")

        def fill(p: dict[str, Any]) -> None:
            p["issue"]["number"] = p["number"] = self.issue
            p["sender"]["login"] = p["sender"]["username"] = "dev"

        return self._post("gitea_label_updated_without.json", "issues", "issue_label", fill)


def test_gitea_review_comment_gives_one_commit_on_the_branch_and_a_reply(client: Any, world: World) -> None:
    pr = GiteaPr(client, world)
    before = pr.sync_head()
    world.model.add(*round_script())
    answer = pr.comment("/frogfix please document mul() too")
    assert answer["outcome"] == "round_request", answer
    assert triage(answer["request_id"]) == "accepted"
    assert run_job(newest_round(pr.thread_id).id) == "done"
    after = branch_head(world, "gitea", pr.branch)
    assert git(world.bare("gitea"), "rev-list", "--count", f"{before}..{after}") == "1"
    assert git(world.bare("gitea"), "rev-parse", f"{after}^") == before
    replies = pr.bot_comments()
    assert any("calc.py" in c["body"] for c in replies)
    assert pr.pull()["draft"] is True if "draft" in pr.pull() else pr.pull()["title"].startswith("WIP")
    # Gitea has no push option for CI: the commit message's marker keeps Actions off the branch
    [push] = [p for p in world.git_gitea.pushes if any(u[1] == after for u in p.updates)]
    assert push.options == [] and "[skip ci]" in git(world.bare("gitea"), "log", "-1", "--format=%B", after)


def test_gitea_request_changes_review_and_non_member_and_bot(client: Any, world: World) -> None:
    pr = GiteaPr(client, world)
    world.gitea.set_pull_ready(PROJECT, pr.number)
    world.model.add(*round_script())
    review = pr.request_changes("please document mul() too")
    assert triage(review["request_id"]) == "accepted"
    assert run_job(newest_round(pr.thread_id).id) == "done"
    assert not pr.pull()["title"].upper().startswith("WIP")  # a ready PR stays ready
    # a non-member asks: no round, one polite reply
    world.gitea.add_user("stranger")
    stranger = pr.comment("/frogfix do more", by="stranger")
    assert triage(stranger["request_id"]) == "ignored"
    polite = [c["body"] for c in pr.bot_comments() if "can ask FrogFix for changes" in c["body"]]
    assert len(polite) == 1 and "@stranger" in polite[0]
    # the bot's own comment, delivered back (the double posts it as the bot), starts nothing
    own = pr.bot_comments()[-1]
    echoed = pr.comment(own["body"], by="frogfix-bot")
    assert echoed["outcome"] == "ignored" or triage(echoed["request_id"]) == "ignored"
    assert [j.round for j in thread(pr.thread_id)] == [0, 1]


def test_gitea_failed_status_gives_one_ci_round(client: Any, world: World) -> None:
    pr = GiteaPr(client, world)
    head = pr.sync_head()
    world.model.add(*round_script())
    answer = pr.status(head, "failure", "pytest: 1 failed (mul has no docstring)")
    assert triage(answer["request_id"]) == "accepted"
    round_job = newest_round(pr.thread_id)
    assert round_job.round_kind == "ci"
    assert run_job(round_job.id) == "done"
    redelivered = pr.status(head, "failure", "pytest: 1 failed (mul has no docstring)")
    assert redelivered["outcome"] != "round_request" or triage(redelivered["request_id"]) == "ignored"
    assert [j.round for j in thread(pr.thread_id)] == [0, 1]


def test_gitea_failed_statuses_stop_at_the_ci_cap(client: Any, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import configure

    configure(monkeypatch, max_ci_rounds="1")
    pr = GiteaPr(client, world)
    head = pr.sync_head()
    world.model.add(*round_script())
    assert triage(pr.status(head, "failure", "pytest: mul has no docstring")["request_id"]) == "accepted"
    assert run_job(newest_round(pr.thread_id).id) == "done"
    new_head = pr.sync_head()
    # Gitea Actions posts one status per job: two jobs fail on the new head, and the cap holds.
    for context in ("ci/tests", "ci/lint"):
        answer = pr.status(new_head, "failure", f"{context} failed", context=context)
        assert triage(answer["request_id"]) == "ignored"
    assert [j.round for j in thread(pr.thread_id)] == [0, 1]
    capped = [c["body"] for c in pr.bot_comments() if "FROGFIX_MAX_CI_ROUNDS" in c["body"]]
    assert len(capped) == 1  # said once
    row = next(line for line in pr.pull()["body"].splitlines() if line.startswith("| [1]"))
    assert row.endswith("| ci | `dev` | `" + new_head[:12] + "` | pushed | failed |")  # its CI, on the PR
    assert job(newest_round(pr.thread_id).id).ci_status == "failed"


def test_gitea_stop_during_a_round_is_answered_once(client: Any, world: World, prompt_cancel: None) -> None:
    pr = GiteaPr(client, world)
    head = pr.sync_head()
    with round_held_running(pr, world) as (_, results):
        stop = pr.comment("/frogfix stop")
        assert stop["outcome"] == "round_request" and triage(stop["request_id"]) == "taken"
    assert results["status"] == "cancelled" and branch_head(world, "gitea", pr.branch) == head
    [reply] = pr.bot_comments()
    assert "FrogFix stopped: it cancelled the running round" in reply["body"]
    assert [j.round for j in thread(pr.thread_id)] == [0, 1]


def test_gitea_label_removed_during_a_round_drops_waiting_requests(client: Any, world: World) -> None:
    pr = GiteaPr(client, world)
    head = pr.sync_head()
    with round_held_running(pr, world) as (running, results):
        second = pr.comment("/frogfix and mention the types")
        assert triage(second["request_id"]) == "accepted"
        hint = pr.label_removed()
        assert (hint["outcome"], hint["job_id"]) == ("noted", running.id)  # a hint: the round asks the API
    # The round found the label gone before it published: nothing pushed, the waiting request dropped.
    assert results["status"] == "cancelled" and branch_head(world, "gitea", pr.branch) == head
    assert [r.status for r in requests(pr.thread_id)] == ["taken", "dropped"]
    assert [j.round for j in thread(pr.thread_id)] == [0, 1]
