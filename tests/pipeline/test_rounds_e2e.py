"""Review rounds end to end, for GitLab and for Gitea: a signed comment, review or CI webhook on the
bot's MR, the worker's triage, the round through the real pipeline (forge doubles, real git over HTTP,
the scripted model), and what lands on the branch, the MR and its thread."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import records, rounds
from app.models import Job, RoundRequest
from tests.conftest import GITEA_SECRET, PAYLOADS
from tests.doubles.openai_server import assistant, text_call, tool_call
from tests.pipeline.conftest import PROJECT, TRIGGER, World
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

    def pipeline_hook(self, *, status: str, sha: str, jobs: list[dict[str, Any]]) -> dict[str, Any]:
        pipeline = self.world.gitlab.add_pipeline(PROJECT, sha=sha, ref=self.branch, status=status, jobs=jobs)
        payload = json.loads((PAYLOADS / "gitlab_pipeline_failed.json").read_text())
        payload["object_attributes"].update(id=pipeline["id"], sha=sha, ref=self.branch, status=status)
        payload["project"]["path_with_namespace"] = PROJECT
        payload["merge_request"] = None
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
    [(old, _, _)] = [u for p in world.git_gitlab.pushes for u in p.updates if u[1] == after]
    assert old == before  # the push named the previous head: a fast-forward, never a force
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


def test_gitlab_stop_cancels_and_label_removal_drops_waiting_requests(client: Any, world: World) -> None:
    mr = GitLabMr(client, world)
    first = mr.comment("/frogfix please document mul() too")
    triage(first["request_id"])
    queued = newest_round(mr.thread_id)
    stop = mr.comment("/frogfix stop")
    triage(stop["request_id"])
    assert job(queued.id).cancel_requested or job(queued.id).status == "cancelled"
    assert run_job(queued.id) in ("cancelled", "not_claimed")
    assert job(queued.id).status == "cancelled"
    assert [j.round for j in thread(mr.thread_id)] == [0, 1]


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

    def status(self, sha: str, state: str, description: str) -> dict[str, Any]:
        self.world.gitea.add_status(PROJECT, sha, "ci/tests", state, description, "https://ci.example/1")

        def fill(p: dict[str, Any]) -> None:
            p.update(sha=sha, state=state, context="ci/tests", description=description)
            if p.get("branches"):
                p["branches"][0]["name"] = self.branch

        return self._post("gitea_status_failure.json", "status", "status", fill)

    def bot_comments(self) -> list[dict[str, Any]]:
        return [c for c in self.world.gitea.pr_comments(PROJECT, self.number) if c["user"]["login"] == "frogfix-bot"]


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
