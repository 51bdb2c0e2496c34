"""The fault matrix: real worker processes on real Redis and PostgreSQL, the bubblewrap sandbox,
and forge, git and model doubles on 127.0.0.1, with one fault injected at a time while jobs run.

After every fault the same things must hold (`assert_settled`): every job is final or honestly
queued, no issue has more than one MR, no sandbox or workspace is left, and what the database
recorded before the fault is still there.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import redis as redis_client
from sqlalchemy import func, select

from app.db import session_scope
from app.jobs import records, transitions
from app.migrate import upgrade
from app.models import FINAL_STATUSES, Job, JobEvent, WebhookDelivery
from app.sweep import sweep_once
from tests.conftest import configure
from tests.doubles.git_http import GitFault, git
from tests.doubles.gitlab_api import Fault
from tests.doubles.openai_server import Cut, Drop, Hang, Reply, ScriptItem, Status, assistant, text_call
from tests.pipeline.conftest import PROJECT, TRIGGER, World, fixing_script, world  # noqa: F401  (fixture)
from tests.processes import Workers, sandboxes_running, workspaces_left
from tests.servers import Postgres, Redis, wait_until

# --------------------------------------------------------------------------------------------
# The system under test
# --------------------------------------------------------------------------------------------


@dataclass
class System:
    world: World
    client: Any
    workers: Workers
    pg: Postgres
    redis: Redis
    release: threading.Event  # set at teardown: frees every held model answer

    @property
    def workspaces(self) -> Path:
        return Path(os.environ["FROGFIX_WORKSPACE_DIR"])

    def labelled_issue(self, title: str = "add() returns the difference") -> int:
        issue = self.world.gitlab.add_issue(PROJECT, title=title, author="rep")
        self.world.gitlab.add_label(PROJECT, issue["iid"], TRIGGER, by="dev")
        return int(issue["iid"])

    def deliver(self, iid: int) -> Any:
        body, headers = self.world.gitlab_webhook(iid)
        return self.client.post("/webhooks/gitlab", content=body, headers=headers)

    def job_for(self, iid: int) -> int:
        r = self.deliver(iid)
        assert r.status_code == 202, r.text
        return int(r.json()["job_id"])

    def recover_until_final(self, job_ids: list[int], timeout: float = 120.0) -> None:
        """Run the sweep (stale heartbeats re-queued, unsent jobs sent) until every job is final."""

        def settled() -> bool:
            sweep_once()
            return all(status(j) in FINAL_STATUSES for j in job_ids)

        wait_until(settled, timeout=timeout, interval=0.5)


def status(job_id: int) -> str:
    with session_scope() as s:
        return records.get_job(s, job_id).status


def kinds(job_id: int) -> list[str]:
    with session_scope() as s:
        return [e.kind for e in records.job_events(s, job_id)]


def job(job_id: int) -> Job:
    with session_scope() as s:
        return records.get_job(s, job_id)


def snapshot() -> dict[str, int]:
    """Row counts that may only grow: what the database holds must survive every fault."""
    with session_scope() as s:
        return {
            "jobs": s.scalar(select(func.count()).select_from(Job)) or 0,
            "events": s.scalar(select(func.count()).select_from(JobEvent)) or 0,
            "deliveries": s.scalar(select(func.count()).select_from(WebhookDelivery)) or 0,
        }


def assert_settled(system: System, before: dict[str, int] | None = None) -> None:
    """The post-conditions every fault must leave behind."""
    with session_scope() as s:
        rows = s.execute(select(Job.id, Job.status, Job.issue)).all()
    for job_id, job_status, _ in rows:
        assert job_status in FINAL_STATUSES or job_status == "queued", (job_id, job_status, kinds(job_id))
    issues = [issue for _, _, issue in rows]
    for issue in set(issues):
        mrs = [m for m in system.world.gitlab.open_mrs(PROJECT) if m["source_branch"] == f"frogfix/issue-{issue}"]
        assert len(mrs) <= 1, f"issue {issue} has {len(mrs)} MRs"
    # a job is final a moment before its worker has cleaned up (the last comment is posted after)
    try:
        wait_until(lambda: not sandboxes_running(system.workspaces) and not workspaces_left(system.workspaces), 20)
    except TimeoutError:
        raise AssertionError(
            f"left behind: sandboxes {sandboxes_running(system.workspaces)}, "
            f"workspaces {workspaces_left(system.workspaces)}"
        ) from None
    if before is not None:
        after = snapshot()
        assert all(after[k] >= v for k, v in before.items()), (before, after)


@pytest.fixture
def system(
    world: World,  # noqa: F811
    client: Any,
    pg: Postgres,
    redis: Redis,
    workers: Workers,
) -> Iterator[System]:
    """The world's doubles, a fresh PostgreSQL database, an empty Redis, and fast recovery settings."""
    url = pg.create_database(f"faults_{uuid.uuid4().hex[:12]}")
    redis_client.Redis.from_url(redis.url).flushall()
    configure(
        world.env["monkeypatch"],
        database_url=url,
        broker_url=redis.url,
        stale_job_seconds="3",
        requeue_after_seconds="2",
        max_job_runs="4",
        model_timeout_seconds="30",
        forge_timeout_seconds="30",
    )
    upgrade(url)
    script = fixing_script()
    world.model._responder = lambda index, body: script[model_turn(body)]  # any number of runs fix the bug
    release = threading.Event()
    sys_ = System(world, client, workers, pg, redis, release)
    try:
        yield sys_
    finally:
        release.set()
        workers.stop_all()
        if not pg_running(pg):
            pg.start()
        if redis.proc is None:
            redis.start()


def pg_running(pg: Postgres) -> bool:
    try:
        import psycopg

        psycopg.connect(f"postgresql://postgres@127.0.0.1:{pg.port}/postgres", connect_timeout=2).close()
        return True
    except Exception:
        return False


def model_turn(body: bytes) -> int:
    return sum(1 for m in json.loads(body)["messages"] if m["role"] == "assistant")


def issue_title(body: bytes) -> str:
    """The issue's title as the task prompt carries it (the first user message)."""
    messages = json.loads(body)["messages"]
    return next(str(m["content"]) for m in messages if m["role"] == "user")


def commit_to_bare(bare: Path, files: dict[str, str], tmp: Path) -> None:
    """A new commit on main of the double's repository, as a developer's push would make it."""
    work = tmp / f"push-{uuid.uuid4().hex[:8]}"
    git("clone", "-q", str(bare), str(work))
    for name, text in files.items():
        (work / name).write_text(text)
    git("add", "-A", cwd=work)
    git("-c", "user.name=dev", "-c", "user.email=dev@example.com", "commit", "-qm", "config", cwd=work)
    git("push", "-q", "origin", "HEAD:main", cwd=work)
    shutil.rmtree(work)


def hold_turn_one(system: System, holds: int) -> list[threading.Event]:
    """The fixing script, whose turn-1 answer waits on a gate of its own for the first `holds` runs.

    Gate k lets the k-th held answer go (the test sets it once the worker is killed, paused or
    meant to go on); later runs are not held, and teardown frees whatever is still waiting.
    """
    script = fixing_script()
    gates = [threading.Event() for _ in range(holds)]
    asked = {"n": 0}
    lock = threading.Lock()

    def respond(index: int, body: bytes) -> ScriptItem:
        turn = model_turn(body)
        with lock:
            gate = gates[asked["n"]] if turn == 1 and asked["n"] < holds else None
            asked["n"] += turn == 1
        while gate is not None and not (gate.wait(0.1) or system.release.is_set()):
            pass
        return script[turn]

    system.world.model._responder = respond
    return gates


# --------------------------------------------------------------------------------------------
# SIGKILL at each stage, twice, then a run that finishes
# --------------------------------------------------------------------------------------------

HOLD_S = 60.0  # a held call outlasts the kill; the double lets go at teardown


def _hold(system: System, stage: str, run: int, iid: int, job_id: Callable[[], int]) -> Callable[[], bool]:
    """Arm a double so that run `run` stops inside `stage` (armed before the run claims the job);
    return 'the worker is there now'."""
    w = system.world
    if stage == "admit":
        seen = len(w.gitlab.calls("GET", f"/issues/{iid}"))
        w.gitlab.hang_next(1, HOLD_S, method="GET", path_contains=f"/issues/{iid}")
        return lambda: len(w.gitlab.calls("GET", f"/issues/{iid}")) > seen
    if stage == "prepare":
        seen = len([r for r in w.git_gitlab.requests if r.path.endswith("git-upload-pack")])
        w.git_gitlab.hang_next(HOLD_S, path_contains="git-upload-pack")
        return lambda: len([r for r in w.git_gitlab.requests if r.path.endswith("git-upload-pack")]) > seen
    if stage == "agent":  # the model's second answer is held by the responder (see the test)
        seen = w.model.count
        return lambda: w.model.count >= seen + 2
    if stage == "verify":  # the repository's tests are slow (see the test)
        return lambda: (j := job(job_id())).run == run and j.status == "verifying"
    if stage == "push":
        seen = len(w.git_gitlab.pushes)
        w.git_gitlab.hang_next(HOLD_S, path_contains="git-receive-pack", after=True)  # lands, answer lost
        return lambda: len(w.git_gitlab.pushes) > seen
    if stage == "open_mr":
        method = "POST" if run == 1 else "PUT"  # run 2 finds the MR run 1 opened and updates it
        seen = len(w.gitlab.calls(method, "/merge_requests"))
        w.gitlab.hang_next(1, HOLD_S, method=method, path_contains="/merge_requests", after=True)
        return lambda: len(w.gitlab.calls(method, "/merge_requests")) > seen
    raise AssertionError(stage)


STAGE_STATUS = {
    "admit": "running",
    "prepare": "running",
    "agent": "running",
    "verify": "verifying",
    "push": "publishing",
    "open_mr": "publishing",
}


@pytest.mark.parametrize("stage", list(STAGE_STATUS))
def test_sigkill_at_each_stage_twice_then_one_mr(system: System, stage: str, tmp_path: Path) -> None:
    w = system.world
    if stage == "verify":  # slow tests, so the kill lands while the worker verifies
        commit_to_bare(w.bare("gitlab"), {".frogfix.yml": "test_command: sleep 2 && python3 -m pytest -q\n"}, tmp_path)
    killed = hold_turn_one(system, 2 if stage == "agent" else 0)  # the agent stage's runs 1 and 2 wait there
    iid = system.labelled_issue()
    ids: list[int] = []
    there = _hold(system, stage, 1, iid, lambda: ids[0])
    proc = system.workers.start()
    ids.append(system.job_for(iid))
    job_id = ids[0]
    for run in (1, 2):
        wait_until(there, timeout=90, interval=0.05)
        assert status(job_id) == STAGE_STATUS[stage] and job(job_id).run == run, kinds(job_id)
        before = snapshot()
        system.workers.kill(proc)
        if killed:
            killed[run - 1].set()
        # The kernel kills the sandbox with its worker (PR_SET_PDEATHSIG), but a bwrap caught in the
        # middle of creating its namespaces dies only when that syscall returns: give it seconds, not forever.
        try:
            wait_until(lambda: not sandboxes_running(system.workspaces), timeout=15, interval=0.1)
        except TimeoutError:
            left = [line.split()[0] for line in sandboxes_running(system.workspaces)]
            table = subprocess.run(["ps", "-eo", "pid,ppid,stat,wchan:32,args"], capture_output=True, text=True).stdout
            tree, rows = set(left), table.splitlines()
            for _ in range(4):
                tree |= {r.split()[0] for r in rows[1:] if r.split()[1] in tree}
            states = "\n".join([rows[0]] + [r[:300] for r in rows[1:] if r.split()[0] in tree])
            raise AssertionError(f"the sandbox outlived its worker:\n{states}") from None
        if run == 1:
            there = _hold(system, stage, 2, iid, lambda: job_id)
        proc = system.workers.start()
        wait_until(lambda r=run: sweep_once() is not None and job(job_id).run > r, timeout=60, interval=0.5)
        assert snapshot()["events"] >= before["events"]

    system.recover_until_final([job_id])
    done = job(job_id)
    timeline = kinds(job_id)
    assert done.status == "done", timeline
    assert done.run == 3 and timeline.count("requeued") == 2 and timeline.count("done") == 1
    with session_scope() as s:
        attempts = [(a.run, a.status) for a in records.job_attempts(s, job_id)]
    assert all(st != "running" for _, st in attempts) and attempts[-1] == (3, "verified"), attempts
    [mr] = w.gitlab.open_mrs(PROJECT)
    assert mr["draft"] and mr["source_branch"] == f"frogfix/issue-{iid}" and done.mr_url == mr["web_url"]
    assert "return a + b" in git("--git-dir", str(w.bare("gitlab")), "show", f"frogfix/issue-{iid}:calc.py").stdout
    started = [n for n in w.gitlab.notes if "working on this issue" in n["body"]]
    finished = [n for n in w.gitlab.notes if mr["web_url"] in n["body"]]
    assert len(finished) == 1 and len(started) == 1  # the runs that replaced dead ones did not announce again
    assert_settled(system)


# --------------------------------------------------------------------------------------------
# Redis and PostgreSQL restarted while jobs run
# --------------------------------------------------------------------------------------------


def test_redis_restarted_twice_while_jobs_run(system: System) -> None:
    gates = hold_turn_one(system, 2)
    system.workers.start()
    first = system.job_for(system.labelled_issue())
    wait_until(lambda: system.world.model.count >= 2, timeout=60)
    # Redis goes away mid-run: intake still answers (the job waits, queued, for the sweep to send it)
    system.redis.stop()
    second_iid = system.labelled_issue()
    r = system.deliver(second_iid)
    assert r.status_code == 202, r.text
    second = int(r.json()["job_id"])
    assert status(second) == "queued" and job(second).last_enqueued_at is None
    system.redis.start()
    gates[0].set()  # the first job goes on, and finishes, with a new Redis under its worker
    wait_until(lambda: status(first) in FINAL_STATUSES, timeout=60, interval=0.2)
    assert status(first) == "done", kinds(first)
    # the sweep sends the second job; the worker reconnected and runs it; Redis restarts again mid-run
    wait_until(lambda: sweep_once()[1] > 0 or status(second) != "queued", timeout=30, interval=0.5)
    wait_until(lambda: system.world.model.count >= 6, timeout=60)  # 4 answers for the first, 2 for the second
    system.redis.stop()
    system.redis.start()
    gates[1].set()
    system.recover_until_final([first, second])
    assert status(second) == "done", kinds(second)
    assert len(system.world.gitlab.open_mrs(PROJECT)) == 2
    assert_settled(system)


def test_postgres_restarted_twice_while_a_job_runs(system: System) -> None:
    # a heartbeat missed during an outage is not a dead worker: give it more than the outage lasts
    configure(system.world.env["monkeypatch"], stale_job_seconds="20")
    [gate] = hold_turn_one(system, 1)
    system.workers.start()
    job_id = system.job_for(system.labelled_issue())
    wait_until(lambda: system.world.model.count >= 2, timeout=60)
    before = snapshot()
    system.pg.stop()
    later = system.labelled_issue()
    r = system.deliver(later)  # intake with the database away: 503, nothing half-written
    assert r.status_code == 503, r.text
    gate.set()  # the agent goes on and finishes while the database is away: the worker must write its end
    wait_until(lambda: "database unreachable" in system.workers.logs(), timeout=30, interval=0.2)
    system.pg.start()
    wait_until(lambda: status(job_id) in ("verifying", "publishing", "done"), timeout=60, interval=0.1)
    system.pg.stop()  # again, while the job verifies or publishes
    time.sleep(1.0)
    system.pg.start()
    system.recover_until_final([job_id])
    timeline = kinds(job_id)
    assert status(job_id) == "done", (timeline, job(job_id).error)
    assert job(job_id).run == 1, timeline  # the outages cost no run: the worker waited for the database
    assert len(system.world.gitlab.open_mrs(PROJECT)) == 1
    assert_settled(system, before)
    # the delivery refused with 503 is redelivered by the forge and becomes a job now
    r = system.deliver(later)
    assert r.status_code == 202, r.text
    system.recover_until_final([int(r.json()["job_id"])])


# --------------------------------------------------------------------------------------------
# Model faults: one worker, one issue per fault, the model's answer chosen by the issue's title
# --------------------------------------------------------------------------------------------

BROKEN_EDIT = "<tool_call>\n<function=Edit>\n<parameter=file_path>\ncalc.py\n</parameter>\n</tool_call>"


TRANSIENT_MODEL_FAULTS: dict[str, Callable[[Reply], ScriptItem]] = {
    "[500s]": lambda _: Status(500, {"error": {"message": "upstream overloaded"}}),
    "[hang]": lambda _: Hang(30),  # longer than FROGFIX_MODEL_TIMEOUT_SECONDS in the test
    "[cut]": lambda reply: Cut(reply),  # the connection closes halfway through the answer
    "[drop]": lambda _: Drop(),  # closed before any answer
    "[broken-json]": lambda _: Status(200, b'{"id": "x", "choices": [{"message": {"role": "assist'),
}
FAULTED_TURNS = (0, 2)  # each transient fault strikes twice in its job, at these turns


def _model_faults(system: System, fired: set[tuple[str, int]]) -> dict[str, tuple[str, str | None]]:
    """Scenario tag (in the issue title) -> (expected status, text the job's error or exit must carry)."""
    script = fixing_script()

    def respond(index: int, body: bytes) -> ScriptItem:
        title, turn = issue_title(body), model_turn(body)
        tag = re.search(r"\[[a-z0-9-]+\]", title).group(0)  # type: ignore[union-attr]
        if tag in TRANSIENT_MODEL_FAULTS and turn in FAULTED_TURNS and (tag, turn) not in fired:
            fired.add((tag, turn))
            return TRANSIENT_MODEL_FAULTS[tag](script[turn])
        if tag == "[malformed-call]" and turn >= 1:
            if (tag, turn) not in fired and turn == 1:
                fired.add((tag, turn))
                return assistant(BROKEN_EDIT)  # answered with an error; the model then calls Edit properly
            turn -= 1
        if tag == "[overflow]":
            return Status(400, {"error": {"message": "This model's maximum context length is 32768 tokens"}})
        if tag == "[down]":
            return Status(503, {"error": {"message": "no GPU"}})
        return script[turn]

    system.world.model._responder = respond
    return {
        **{tag: ("done", None) for tag in TRANSIENT_MODEL_FAULTS},
        "[malformed-call]": ("done", None),
        "[overflow]": ("no_fix", "max_context_len"),
        "[down]": ("failed", "the model could not be used"),
    }


def test_model_faults_each_end_honestly(system: System) -> None:
    configure(system.world.env["monkeypatch"], model_timeout_seconds="2", model_max_retries="3")
    fired: set[tuple[str, int]] = set()
    expected = _model_faults(system, fired)
    system.workers.start()
    made = {tag: system.job_for(system.labelled_issue(f"add() is wrong {tag}")) for tag in expected}
    system.recover_until_final(list(made.values()), timeout=180)
    for tag, job_id in made.items():
        want, why = expected[tag]
        got = job(job_id)
        timeline = kinds(job_id)
        assert got.status == want, (tag, timeline, got.error)
        if why is not None:
            assert why in f"{got.error} {got.exit_reason}", (tag, got.error, got.exit_reason)
    # every job that ended without a fix told its issue why: the failed one that it stopped, the one with
    # no fix in FrogFix's question (worker/job/question.py), which names why its attempt ended
    for tag, said in (("[overflow]", "<!-- frogfix:question -->"), ("[down]", "stopped")):
        iid = job(made[tag]).issue
        bodies = [n["body"] for n in system.world.gitlab.notes if n.get("noteable_iid") == iid]
        assert any(said in b.lower() for b in bodies), (tag, bodies)
    assert len(system.world.gitlab.open_mrs(PROJECT)) == 6
    struck = {(tag, turn) for tag in TRANSIENT_MODEL_FAULTS for turn in FAULTED_TURNS}
    assert fired == struck | {("[malformed-call]", 1)}  # every fault did strike, twice where transient
    assert_settled(system)


# --------------------------------------------------------------------------------------------
# Forge and git faults on every call in turn
# --------------------------------------------------------------------------------------------


FORGE_FAULTS = {
    "429": Fault(status=429, retry_after="0"),
    "502": Fault(status=502),
    "timeout": Fault(status=504, hang_s=3.0),  # longer than FROGFIX_FORGE_TIMEOUT_SECONDS below
}


@pytest.mark.parametrize("kind", list(FORGE_FAULTS))
def test_forge_fault_on_every_call_in_turn(system: System, kind: str) -> None:
    configure(system.world.env["monkeypatch"], forge_timeout_seconds="1")
    w = system.world
    iid = system.labelled_issue()
    w.gitlab.fail_each_first(FORGE_FAULTS[kind])
    if kind == "502":
        w.git_gitlab.fail_each_first(GitFault(status=502))
    system.workers.start()
    job_id = system.job_for(iid)
    system.recover_until_final([job_id], timeout=150)
    timeline = kinds(job_id)
    assert status(job_id) == "done", (timeline, job(job_id).error)
    faulted = w.gitlab.first_seen
    assert len(faulted) >= 8, faulted  # issue, label events, member, note, project, MR list, MR create, ...
    calls = {(r.method, r.path) for r in w.gitlab.requests}
    assert {(m, p) for m, p, _ in faulted} == calls  # every call the job made met the fault once
    assert len(w.gitlab.open_mrs(PROJECT)) == 1
    assert len(w.gitlab.notes) == 2, [n["body"][:60] for n in w.gitlab.notes]  # no comment posted twice
    if kind == "502":
        assert any(r.status == 502 for r in w.git_gitlab.requests) and w.git_gitlab.pushes[-1].status == 200
    assert_settled(system)


def test_gitea_fault_on_every_call_in_turn(system: System) -> None:
    configure(system.world.env["monkeypatch"], forge_timeout_seconds="1")
    w = system.world
    issue = w.gitea.add_issue(PROJECT, title="add() returns the difference", author="rep")
    w.gitea.add_label(PROJECT, issue["number"], TRIGGER, by="dev")
    w.gitea.fail_each_first(Fault(status=502))
    w.git_gitea.fail_each_first(GitFault(status=502))
    system.workers.start()
    body, headers = w.gitea_webhook(issue["number"])
    r = system.client.post("/webhooks/gitea", content=body, headers=headers)
    assert r.status_code == 202, r.text
    job_id = int(r.json()["job_id"])
    system.recover_until_final([job_id], timeout=150)
    assert status(job_id) == "done", (kinds(job_id), job(job_id).error)
    assert {(m, p) for m, p, _ in w.gitea.first_seen} == {(r.method, r.path) for r in w.gitea.requests}
    assert len(w.gitea.first_seen) >= 8 and len(w.gitea.open_pulls(PROJECT)) == 1 and len(w.gitea.comments) == 2
    assert w.git_gitea.pushes[-1].status == 200
    assert_settled(system)


def test_forge_down_at_publish_fails_then_a_retry_opens_one_mr(system: System) -> None:
    configure(system.world.env["monkeypatch"], forge_timeout_seconds="1", forge_retry_budget_seconds="3")
    w = system.world
    w.gitlab.fail_next(50, 503, method="POST", path_contains="/merge_requests")
    system.workers.start()
    job_id = system.job_for(system.labelled_issue())
    system.recover_until_final([job_id])
    ended = job(job_id)
    assert ended.status == "failed" and "kept failing" in (ended.error or ""), ended.error
    assert w.gitlab.open_mrs(PROJECT) == []
    assert_settled(system)
    w.gitlab.faults.clear()  # the forge is back; an operator retries
    with session_scope() as s:
        transitions.retry_job(s, job_id, "operator")
    system.recover_until_final([job_id])
    assert status(job_id) == "done", (kinds(job_id), job(job_id).error)
    assert len(w.gitlab.open_mrs(PROJECT)) == 1
    started = [n for n in w.gitlab.notes if "working on this issue" in n["body"]]
    assert len(started) == 2  # an operator's retry is a new round, announced again
    assert_settled(system)


# --------------------------------------------------------------------------------------------
# The git remote unreachable; the disk full
# --------------------------------------------------------------------------------------------


def test_git_remote_unreachable_fails_the_job_and_says_so(system: System) -> None:
    w = system.world
    w.git_gitlab.fail_next(100, 503)  # every git request: the git server is down for good
    system.workers.start()
    job_id = system.job_for(system.labelled_issue())
    system.recover_until_final([job_id])
    ended = job(job_id)
    assert ended.status == "failed" and "git" in (ended.error or ""), ended.error
    assert any("could not reach" in n["body"] for n in w.gitlab.notes), [n["body"] for n in w.gitlab.notes]
    assert len([r for r in w.git_gitlab.requests if r.status == 503]) >= 3  # tried again before giving up
    assert_settled(system)


@pytest.fixture
def small_disk(system: System) -> Iterator[Path]:
    """The workspace folder on a 24 MiB tmpfs, and the sandbox's own workspace (a tmpfs of
    FROGFIX_SANDBOX_WORKSPACE_SIZE, where the agent's writes go) as small, so a job can really fill it."""
    mount = Path(tempfile.mkdtemp(prefix="frogfix-small-disk-"))
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m,mode=0711", "tmpfs", str(mount)], check=True)
    try:
        # No worker dies here: a stale claim (3 s in `system`, for the kill tests) would only be a
        # loaded machine's heartbeat arriving late, and a second run of the job.
        configure(
            system.world.env["monkeypatch"],
            workspace_dir=str(mount),
            sandbox_workspace_size="24Mi",
            stale_job_seconds="60",
        )
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)
        mount.rmdir()


def test_disk_filled_in_the_workspace_ends_that_job_and_the_next_one_works(system: System, small_disk: Path) -> None:
    script = fixing_script()

    def respond(index: int, body: bytes) -> ScriptItem:
        title, turn = issue_title(body), model_turn(body)
        if "[fill]" in title and turn == 0:
            return assistant(text_call("Bash", command="head -c 100M /dev/zero > fill.bin; df -k . | tail -1"))
        if "[fill]" in title and turn == 1:
            return assistant("I filled the disk.")
        return script[turn]

    system.world.model._responder = respond
    system.workers.start()
    full = system.job_for(system.labelled_issue("add() is wrong [fill]"))
    system.recover_until_final([full], timeout=120)
    ended = job(full)
    assert ended.status in ("failed", "no_fix"), kinds(full)
    with session_scope() as s:
        [attempt] = records.job_attempts(s, full)
    said = f"{ended.error} {attempt.error} {attempt.summary}"
    assert "space" in said.lower() or "larger than" in said.lower(), said
    assert workspaces_left(small_disk) == [] and sandboxes_running(small_disk) == []
    # the space came back: the next job on the same worker fixes its issue
    ok = system.job_for(system.labelled_issue("add() returns the difference"))
    system.recover_until_final([ok], timeout=120)
    assert status(ok) == "done", (kinds(ok), job(ok).error)
    assert_settled(system)


def test_cancel_check_rides_out_a_database_outage(frogfix_env: dict[str, Any]) -> None:
    """Asked between tool calls; the database being away for a moment must not end the run."""
    from tests.servers import free_port
    from worker.job.job_context import CancelCheck

    configure(frogfix_env["monkeypatch"], database_url=f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x")
    check = CancelCheck(job_id=1, every=0.0)
    assert check() is False and check() is False


# --------------------------------------------------------------------------------------------
# Runs the sweep replaced: a worker that died for good, and one that was only paused
# --------------------------------------------------------------------------------------------


def test_a_job_whose_workers_keep_dying_fails_and_its_workspaces_go(system: System) -> None:
    configure(system.world.env["monkeypatch"], max_job_runs="2")
    gates = hold_turn_one(system, 2)
    proc = system.workers.start()
    doomed = system.job_for(system.labelled_issue())
    for run in (1, 2):
        wait_until(lambda r=run: system.world.model.count >= 2 * r, timeout=60)
        system.workers.kill(proc)
        gates[run - 1].set()
        proc = system.workers.start()
        wait_until(lambda r=run: sweep_once() is not None and (job(doomed).run > r or status(doomed) != "running"))
    ended = job(doomed)
    assert ended.status == "failed" and "stopped 2 times" in (ended.error or ""), (ended.error, kinds(doomed))
    assert workspaces_left(system.workspaces) == [f"job-{doomed}-run-2"]  # the sweep cannot reach the worker's disk
    ok = system.job_for(system.labelled_issue())  # the next run on this host removes what the failed job left
    system.recover_until_final([ok])
    assert status(ok) == "done", kinds(ok)
    assert_settled(system)


def test_a_paused_worker_that_wakes_up_cannot_touch_the_run_that_replaced_it(system: System) -> None:
    gates = hold_turn_one(system, 2)
    paused = system.workers.start()
    job_id = system.job_for(system.labelled_issue())
    wait_until(lambda: system.world.model.count >= 2, timeout=60)  # run 1 waits for its second answer
    os.killpg(paused.pid, signal.SIGSTOP)  # not dead: frozen, as a VM pause or a swap storm would
    try:
        wait_until(lambda: sweep_once() is not None and status(job_id) == "queued", timeout=30, interval=0.5)
        system.workers.start()
        wait_until(lambda: system.world.model.count >= 4, timeout=60)  # run 2 waits for its second answer
    finally:
        os.killpg(paused.pid, signal.SIGCONT)
    gates[0].set()  # run 1 goes on, in a workspace run 2 has removed, and ends
    wait_until(lambda: "superseded" in system.workers.logs() or status(job_id) != "running", timeout=90, interval=0.5)
    now = job(job_id)
    assert now.status == "running" and now.run == 2, (now.status, now.error, kinds(job_id))  # run 2's still
    gates[1].set()
    system.recover_until_final([job_id])
    timeline = kinds(job_id)
    assert status(job_id) == "done" and timeline.count("done") == 1, timeline
    assert not {"failed", "no_fix", "cancelled"} & set(timeline), timeline
    with session_scope() as s:
        attempts = {(a.run, a.status) for a in records.job_attempts(s, job_id)}
    assert attempts == {(1, "failed"), (2, "verified")}, attempts
    assert len(system.world.gitlab.open_mrs(PROJECT)) == 1
    assert_settled(system)


def test_in_transaction_waits_for_the_database_and_gives_up_in_bounds(frogfix_env: dict[str, Any]) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError

    from app.db import DATABASE_RETRY, in_transaction
    from app.retrying import RetryPolicy
    from tests.servers import free_port

    waited: list[float] = []
    retry = replace(DATABASE_RETRY, sleep=waited.append)
    assert in_transaction(lambda s: s.execute(text("select 1")).scalar(), retry=retry) == 1
    configure(frogfix_env["monkeypatch"], database_url=f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x")
    retry = RetryPolicy(attempts=3, base_delay_s=0.1, max_delay_s=0.2, sleep=waited.append, jitter=lambda: 1.0)
    with pytest.raises(OperationalError):
        in_transaction(lambda s: s.execute(text("select 1")), retry=retry)
    assert waited == [0.1, 0.2]  # tried again while the database was unreachable, then gave up


def test_in_transaction_does_not_repeat_a_bad_statement(pg: Postgres, frogfix_env: dict[str, Any]) -> None:
    from sqlalchemy import text
    from sqlalchemy.exc import ProgrammingError

    from app.db import DATABASE_RETRY, in_transaction

    configure(frogfix_env["monkeypatch"], database_url=pg.url())
    waited: list[float] = []
    with pytest.raises(ProgrammingError):
        in_transaction(lambda s: s.execute(text("select * from no_such_table")),
                       retry=replace(DATABASE_RETRY, sleep=waited.append))
    assert waited == []
