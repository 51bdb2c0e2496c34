#!/usr/bin/env python3
"""bench/soak: the whole system under webhook load and injected faults, then an audit of what it lost.

Run by hand, not in CI. Everything runs for real on 127.0.0.1: a throwaway PostgreSQL and Redis,
the FastAPI app under uvicorn (its requeue sweep on, every 2 s), K `manage.py worker` processes
(each in its own session, so a SIGKILL takes its pool child, and --die-with-parent its bubblewrap
sandboxes), git over smart HTTP. The forge APIs (GitLab and Gitea) and the model are the test
doubles; the model plays the fixing script per conversation (with ~0.4 s of thinking time a
turn), so every admitted job can end `done` with one draft MR.

Signed deliveries (about 30% re-sends of the same delivery id, half of them racing the original,
and 5% with a bad token or signature) are spread over the first three quarters of the run and
sent concurrently; a delivery answered 5xx (or not at all) is sent again with the same id, as a
forge redelivers. On a timer, one fault at a time, each printed as it happens: SIGKILL a worker
mid-job (a replacement starts), restart Redis, restart PostgreSQL (fast or immediate), model
faults (500, 429, dropped connection, a hang shorter than the client timeout, a 200 with a broken
JSON body, a malformed tool call) or forge faults (429, 5xx, a hang, an answer lost after the
forge acted). Opt-in: `pause` SIGSTOPs a worker mid-job past the stale-job limit, then SIGCONTs
it (a zombie run next to its replacement). Then it drains (bounded) and prints one table.

What counts (every loss column must be 0; the exit status is 1 otherwise, 2 if it could not run):
- jobs expected: distinct labelled issues that got at least one correctly signed delivery.
- duplicates created: issues with more than one job, or more than one open MR/PR on the double.
- 5xx: answers >= 500 and tries with no answer, except a 503 while an injected PostgreSQL
  outage was in progress (the documented "database unavailable, the forge will retry" answer).
- jobs lost: an expected issue with no job, or whose job is not final at the end, or final but
  not `done` (here the script always fixes the bug, the trigger user may trigger, and each fault
  is one a retry cures, so any other ending is a job the faults cost), or `done` without an open
  MR on the double. A kill or pause only hits a job on its first run: the product gives up after
  FROGFIX_MAX_JOB_RUNS (3) dead workers by design. The breakdown by reason follows the table.
- orphaned sandboxes: bwrap processes over this soak's workspace folder, plus job-* folders left
  in it, once every job is final.
- secrets leaked: canary values (forge tokens, the model key, webhook secrets, the admin token, the
  session key, and the Basic-auth forms of the tokens) found in the app and worker logs, any file
  under the data folder (trajectories), the PostgreSQL log, the text of the jobs, job_events,
  job_attempts and webhook_deliveries rows, what the forge doubles received, the model's recorded
  request bodies, and `git log -p --all` of every bare repository and mirror. The model key must
  show up in the model's Authorization headers, where it belongs, or the audit itself fails.
Unexpected jobs (for issues only forged deliveries named) and a drain that timed out also fail.

Usage: python bench/soak.py [--quick] [--issues 120] [--workers 2] [--duration 300] [--fault-every 10]
       [--seed 7] [--faults kill,redis,postgres,model,forge[,pause]] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import random
import re
import secrets
import shutil
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.doubles.git_http import GitHttpDouble, bare_repo_from  # noqa: E402
from tests.doubles.gitea_api import GiteaDouble  # noqa: E402
from tests.doubles.gitlab_api import FIXTURES, Fault, GitLabDouble, JsonApiDouble  # noqa: E402
from tests.doubles.openai_server import (  # noqa: E402
    Counted,
    Drop,
    Hang,
    Reply,
    Responder,
    ScriptedOpenAIServer,
    ScriptItem,
    Status,
    assistant,
    sglang_error,
)
from tests.pipeline.conftest import fixing_script  # noqa: E402
from tests.servers import Postgres, Redis, free_port, postgres_server, redis_server, wait_for_port  # noqa: E402
from tests.webhook_requests import gitea_headers, gitlab_headers  # noqa: E402

PAYLOADS = ROOT / "tests" / "payloads"
TRIGGER = "frognano-fix"
ACTIVE = ("queued", "running", "verifying", "publishing")
MALFORMED_MARK = "soak-malformed-call"  # lets the responder skip its own broken turns when counting
GITLAB_PROJECTS = ("soak/calc-a", "soak/calc-b")
GITEA_PROJECTS = ("soak/calc-g",)
FAULT_GROUPS = ("kill", "redis", "postgres", "model", "forge")  # the default mix
EXTRA_FAULTS = ("pause",)  # SIGSTOP a worker past the stale-job limit, then SIGCONT: opt-in
MODEL_TIMEOUT_S = 10.0  # FROGFIX_MODEL_TIMEOUT_SECONDS; model hangs stay shorter
JOB_FOLDER = re.compile(r"job-(\d+)-run-(\d+)")  # the pipeline's workspace folder for one run of a job
SEND_TRIES = 8  # a delivery answered 5xx is sent again this many times at most (backoff 1, 2, 4, 8 s)
SEND_SHARE = 0.75  # deliveries are spread over this share of --duration
OUTAGE_GRACE_S = 3.0  # after PostgreSQL is back, pooled connections may still fail once


def say(line: str) -> None:
    print(line, flush=True)


# ---------------------------------------------------------------------------------------------
# The plan: which deliveries go out, when
# ---------------------------------------------------------------------------------------------


@dataclass
class Delivery:
    """One webhook delivery as a forge would send it; `at` is seconds after the send phase starts."""

    forge: str
    project: str
    issue: int
    delivery_id: str
    body: bytes
    headers: dict[str, str]
    kind: str  # original, duplicate, forged
    at: float

    @property
    def path(self) -> str:
        return f"/webhooks/{self.forge}"


@dataclass
class Sent:
    """One HTTP try of a delivery and what came back (status None: no answer)."""

    delivery: Delivery
    attempt: int
    status: int | None
    outcome: str
    started: float
    finished: float


def gitlab_body(project: str, iid: int, note: str) -> bytes:
    body = json.loads((PAYLOADS / "gitlab_label_added.json").read_text())
    body["object_attributes"]["iid"] = iid
    body["object_attributes"]["description"] = note
    body["project"]["path_with_namespace"] = project
    return json.dumps(body).encode()


def gitea_body(project: str, number: int, note: str) -> bytes:
    body = json.loads((PAYLOADS / "gitea_label_updated.json").read_text())
    body["issue"]["number"] = body["number"] = number
    body["issue"]["body"] = note
    body["repository"]["full_name"] = project
    body["sender"]["login"] = "dev"
    return json.dumps(body).encode()


def make_delivery(
    forge: str, project: str, issue: int, delivery_id: str, kind: str, at: float, secret: str | None
) -> Delivery:
    """A signed delivery; `secret` is the wrong one (or None) for a forged delivery."""
    note = f"delivery {delivery_id}"
    if forge == "gitlab":
        body = gitlab_body(project, issue, note)
        headers = gitlab_headers(token=secret, delivery=delivery_id)
    else:
        body = gitea_body(project, issue, note)
        headers = gitea_headers(body, secret=secret, delivery=delivery_id)
    return Delivery(forge, project, issue, delivery_id, body, headers, kind, at)


def plan(
    rng: random.Random,
    issues: list[tuple[str, str, int]],
    forged_only: list[tuple[str, str, int]],
    window: float,
    secrets_by_forge: dict[str, str],
) -> list[Delivery]:
    """Originals spread over `window`; 30% of all sends are re-sends of one; 5% carry a bad signature."""
    originals = []
    for n, (forge, project, issue) in enumerate(issues):
        originals.append(
            make_delivery(
                forge, project, issue, f"soak-{forge}-{n}", "original", rng.uniform(0, window), secrets_by_forge[forge]
            )
        )
    total = round(len(originals) / 0.65)
    sends = list(originals)
    for _ in range(max(1, round(total * 0.30))):
        first = rng.choice(originals)
        # Half race the original (sent at the same moment), half come later: dedupe must be durable.
        at = first.at if rng.random() < 0.5 else rng.uniform(first.at, window)
        sends.append(Delivery(**{**first.__dict__, "kind": "duplicate", "at": at}))
    targets = forged_only + [(d.forge, d.project, d.issue) for d in rng.sample(originals, min(2, len(originals)))]
    for n in range(max(len(forged_only), round(total * 0.05))):
        forge, project, issue = targets[n % len(targets)]
        wrong = rng.choice([None, "wrong-" + secrets_by_forge[forge]])
        sends.append(make_delivery(forge, project, issue, f"soak-forged-{n}", "forged", rng.uniform(0, window), wrong))
    sends.sort(key=lambda d: d.at)
    return sends


async def send_all(
    base_url: str, deliveries: list[Delivery], concurrency: int, started: float, stop: threading.Event
) -> list[Sent]:
    """Send each delivery at its time, `concurrency` at once; 5xx or no answer: send again, bounded."""
    results: list[Sent] = []
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=30.0, limits=limits) as client:

        async def one(d: Delivery) -> None:
            while (wait := started + d.at - time.monotonic()) > 0:
                if stop.is_set():
                    return
                await asyncio.sleep(min(wait, 0.5))
            for attempt in range(SEND_TRIES):
                async with gate:
                    t0 = time.monotonic()
                    status: int | None = None
                    outcome = ""
                    try:
                        answer = await client.post(d.path, content=d.body, headers=d.headers)
                        status = answer.status_code
                        with contextlib.suppress(ValueError, AttributeError):
                            outcome = str(answer.json().get("outcome", ""))
                    except httpx.HTTPError as exc:
                        outcome = type(exc).__name__
                results.append(Sent(d, attempt, status, outcome, t0, time.monotonic()))
                if (status is not None and status < 500) or stop.is_set():
                    return
                await asyncio.sleep(min(8.0, 2.0**attempt))

        await asyncio.gather(*(one(d) for d in deliveries))
    return results


# ---------------------------------------------------------------------------------------------
# Processes: the app and the workers
# ---------------------------------------------------------------------------------------------


def stop_group(proc: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the process group (it is a session leader), SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
        os.killpg(proc.pid, signal.SIGCONT)  # a paused worker acts on SIGTERM only once continued
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class Workers:
    """`manage.py worker` processes, each the leader of its own session so SIGKILL takes its children."""

    def __init__(self, env: dict[str, str], logs: Path) -> None:
        self.env, self.logs = env, logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.started = 0
        self.unexpected_exits = 0
        self.paused: dict[int, tuple[subprocess.Popen[bytes], float]] = {}  # pid: (proc, when to SIGCONT)

    def start(self) -> subprocess.Popen[bytes]:
        with open(self.logs / f"worker-{self.started}.log", "wb") as log:
            proc = subprocess.Popen(
                [sys.executable, str(ROOT / "manage.py"), "worker"],
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started += 1
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        self.procs.remove(proc)
        self.paused.pop(proc.pid, None)

    def busy(self) -> dict[int, tuple[subprocess.Popen[bytes], int, int]]:
        """Workers mid-job, by the (job, run) in their sandbox's workspace path: {pid: (proc, job, run)}.

        bwrap runs in a session of its own, so it is found by walking parents, not by process group.
        """
        parents = process_parents()
        found: dict[int, tuple[subprocess.Popen[bytes], int, int]] = {}
        for pid, (_ppid, comm) in parents.items():
            if comm != "bwrap":
                continue
            try:
                argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            match = JOB_FOLDER.search(argv)
            above = ancestors(pid, parents)
            for proc in self.procs:
                if match and proc.pid in above:
                    found[proc.pid] = (proc, int(match[1]), int(match[2]))
        return found

    def resume_due(self, now: float | None = None) -> None:
        """SIGCONT the paused workers whose time is up (all of them without `now`)."""
        for pid, (proc, when) in list(self.paused.items()):
            if now is None or now >= when:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGCONT)
                del self.paused[pid]

    def replace_dead(self) -> None:
        """A worker that exited on its own is a finding; start another so the soak goes on."""
        for proc in [p for p in self.procs if p.poll() is not None]:
            self.procs.remove(proc)
            self.paused.pop(proc.pid, None)
            self.unexpected_exits += 1
            say(f"  !! worker pid {proc.pid} exited on its own (code {proc.returncode}); starting another")
            self.start()

    def stop_all(self) -> None:
        self.resume_due()
        for proc in self.procs:
            stop_group(proc)
        self.procs.clear()


def quiet(server: socketserver.BaseServer) -> None:
    """A client whose worker was SIGKILLed resets its connection; the doubles would print a traceback each time."""
    vars(server)["handle_error"] = lambda request, client_address: None


def process_parents() -> dict[int, tuple[int, str]]:
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        parents[int(entry.name)] = (ppid, comm)
    return parents


def ancestors(pid: int, parents: dict[int, tuple[int, str]]) -> set[int]:
    seen: set[int] = set()
    while pid in parents and pid not in seen and pid > 1:
        seen.add(pid)
        pid = parents[pid][0]
    return seen


def sandboxes_over(folder: Path) -> list[str]:
    """bwrap processes whose command line names this soak's workspace folder."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and Path(argv[0].decode(errors="replace")).name == "bwrap" and str(folder).encode() in b" ".join(argv):
            found.append(f"pid {entry.name}")
    return found


# ---------------------------------------------------------------------------------------------
# The soak's world
# ---------------------------------------------------------------------------------------------


@dataclass
class Canaries:
    """Per-run secret values; any of them found where the audit looks is a leak."""

    gitlab_token: str = field(default_factory=lambda: f"glpat-CANARY-soak-{secrets.token_hex(8)}")
    gitea_token: str = field(default_factory=lambda: f"gitea-CANARY-soak-{secrets.token_hex(8)}")
    model_key: str = field(default_factory=lambda: f"model-CANARY-soak-{secrets.token_hex(8)}")
    gitlab_hook: str = field(default_factory=lambda: f"gl-hook-CANARY-soak-{secrets.token_hex(8)}")
    gitea_hook: str = field(default_factory=lambda: f"gt-hook-CANARY-soak-{secrets.token_hex(8)}")
    admin_token: str = field(default_factory=lambda: f"admin-CANARY-soak-{secrets.token_hex(8)}")
    secret_key: str = field(default_factory=lambda: f"session-CANARY-soak-{secrets.token_hex(16)}")

    def gitlab_basic(self) -> str:
        return "Basic " + base64.b64encode(f"oauth2:{self.gitlab_token}".encode()).decode()

    def gitea_basic(self) -> str:
        return "Basic " + base64.b64encode(f"{self.gitea_token}:x-oauth-basic".encode()).decode()

    def values(self) -> dict[str, str]:
        named = {k: v for k, v in self.__dict__.items() if isinstance(v, str)}
        named["gitlab_token (Basic)"] = self.gitlab_basic().removeprefix("Basic ")
        named["gitea_token (Basic)"] = self.gitea_basic().removeprefix("Basic ")
        return named


class Reporter:
    """Prints a timestamped line per fault and counts them by kind (thread-safe: doubles call it)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def fault(self, kind: str, detail: str) -> None:
        with self.lock:
            self.counts[kind] += 1
            n = sum(self.counts.values())
            say(f"[{time.monotonic() - self.t0:6.1f}s] fault {n:>3}: {kind:<18} {detail}")

    def note(self, line: str) -> None:
        with self.lock:
            say(f"[{time.monotonic() - self.t0:6.1f}s] {line}")


class ModelFaults:
    """Faults armed on the timer, consumed by the next model requests whatever conversation they are in."""

    KINDS = ("model-500", "model-429", "model-drop", "model-hang", "model-badjson", "model-badcall")

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.armed: list[str] = []
        self.lock = threading.Lock()
        self.script = fixing_script()

    def arm(self, kind: str, count: int) -> None:
        with self.lock:
            self.armed += [kind] * count

    def respond(self, index: int, body: bytes) -> ScriptItem:
        """The fixing script's next turn for this conversation, unless a fault is armed."""
        messages = json.loads(body)["messages"]
        turn = sum(
            1 for m in messages if m["role"] == "assistant" and MALFORMED_MARK not in str(m.get("content") or "")
        )
        with self.lock:
            kind = self.armed.pop(0) if self.armed else None
        if kind is not None:
            item = self.item(kind)
            self.reporter.fault(kind, f"model request {index} (conversation turn {turn})")
            return item
        return self.script[min(turn, len(self.script) - 1)]

    @staticmethod
    def item(kind: str) -> ScriptItem:
        if kind == "model-500":
            return Status(500, sglang_error(500, "injected by the soak", "InternalServerError"))
        if kind == "model-429":
            return Status(429, {"error": {"message": "slow down"}}, {"Retry-After": "1"})
        if kind == "model-drop":
            return Drop()
        if kind == "model-hang":
            return Hang(random.uniform(2.0, MODEL_TIMEOUT_S * 0.6))
        if kind == "model-badjson":
            return Status(200, b"{not json")
        broken = (
            f"{MALFORMED_MARK}\n<tool_call>\n<function=Edit>\nfile_path=calc.py\n</function>\n</tool_call>"
        )
        return assistant(broken)


class SlowModelServer(ScriptedOpenAIServer):
    """The scripted server with a model's thinking time per answer, outside the double's lock.

    An instant model makes a job take about a second, so a fault would rarely land mid-job.
    """

    def __init__(self, responder: Responder, *, latency: float) -> None:
        super().__init__(responder)
        self.latency = latency

    def _next(self, body: bytes, headers: dict[str, str]) -> tuple[ScriptItem, Counted]:
        item, counted = super()._next(body, headers)
        if isinstance(item, Reply) and self.latency > 0:
            time.sleep(random.uniform(0.5, 1.5) * self.latency)
        return item, counted


GITLAB_PATHS = (
    (None, "/issues/"),
    ("GET", "/resource_label_events"),
    ("GET", "/members/all/"),
    ("GET", "/merge_requests"),
    ("POST", "/merge_requests"),
    ("PUT", "/merge_requests/"),
    ("POST", "/notes"),
    (None, None),
)
GITEA_PATHS = (
    (None, "/issues/"),
    ("GET", "/timeline"),
    ("GET", "/collaborators/"),
    ("GET", "/pulls"),
    ("POST", "/pulls"),
    ("PATCH", "/pulls/"),
    ("POST", "/comments"),
    (None, None),
)
LOST_ANSWER = {
    "gitlab": (("POST", "/merge_requests"), ("POST", "/notes")),
    "gitea": (("POST", "/pulls"), ("POST", "/comments")),
}


@dataclass
class ArmedForgeFault:
    kind: str
    detail: str
    double: JsonApiDouble
    fault: Fault


class Soak:
    """Everything the soak started, so it can all be stopped whatever happens."""

    def __init__(self, args: argparse.Namespace, stack: contextlib.ExitStack) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.stack = stack
        self.reporter = Reporter()
        self.canaries = Canaries()
        self.tmp = Path(tempfile.mkdtemp(prefix="frogfix-soak-"))
        if not args.keep:
            stack.callback(shutil.rmtree, self.tmp, True)
        # bwrap's unprivileged uid must be able to pass through every folder above the workspaces.
        self.workspaces = Path(tempfile.mkdtemp(prefix="frogfix-soak-ws-"))
        self.workspaces.chmod(0o711)
        stack.callback(shutil.rmtree, self.workspaces, True)
        self.logs = self.tmp / "logs"
        self.logs.mkdir()
        self.data = self.tmp / "data"
        self.outages: list[tuple[float, float]] = []
        self.forge_faults: list[ArmedForgeFault] = []
        self.model_faults = ModelFaults(self.reporter)
        self.pg: Postgres
        self.redis: Redis
        self.db_url = ""
        self.app: subprocess.Popen[bytes] | None = None
        self.base_url = ""

    # -- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        c = self.canaries
        self.pg = self.stack.enter_context(postgres_server())
        self.redis = self.stack.enter_context(redis_server())
        self.db_url = self.pg.create_database("soak")
        from app.migrate import upgrade

        upgrade(self.db_url)

        sample = make_sample(self.tmp / "src")
        self.git_gitlab = GitHttpDouble(self.tmp / "git-gitlab", authorization=c.gitlab_basic())
        self.git_gitea = GitHttpDouble(self.tmp / "git-gitea", authorization=c.gitea_basic())
        self.gitlab = GitLabDouble(token=c.gitlab_token)
        self.gitea = GiteaDouble(token=c.gitea_token)
        for double in (self.git_gitlab, self.git_gitea, self.gitlab, self.gitea):
            self.stack.callback(double.close)
            quiet(double._server)
        for project in GITLAB_PROJECTS:
            bare_repo_from(sample, self.tmp / "git-gitlab", f"{project}.git")
            self.gitlab.add_project(project, default_branch="main", clone_url=self.git_gitlab.url_for(f"{project}.git"))
            self.gitlab.add_member(project, "dev", 30)
        for project in GITEA_PROJECTS:
            bare_repo_from(sample, self.tmp / "git-gitea", f"{project}.git")
            self.gitea.add_repo(project, default_branch="main", clone_url=self.git_gitea.url_for(f"{project}.git"))
            self.gitea.set_permission(project, "dev", "write")
        self.model = SlowModelServer(self.model_faults.respond, latency=self.args.model_latency).start()
        self.stack.callback(self.model.stop)
        quiet(self.model._server)

        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
        self.env.update(
            {
                "FROGFIX_DATA_DIR": str(self.data),
                "FROGFIX_DATABASE_URL": self.db_url,
                "FROGFIX_BROKER_URL": self.redis.url,
                "FROGFIX_WORKSPACE_DIR": str(self.workspaces),
                "FROGFIX_MODEL_BASE_URL": self.model.base_url,
                "FROGFIX_MODEL_NAME": "scripted",
                "FROGFIX_MODEL_API_KEY": c.model_key,
                "FROGFIX_MODEL_TIMEOUT_SECONDS": str(MODEL_TIMEOUT_S),
                "FROGFIX_MODEL_MAX_RETRIES": "4",
                "FROGFIX_GITLAB_URL": self.gitlab.base_url,
                "FROGFIX_GITLAB_TOKEN": c.gitlab_token,
                "FROGFIX_GITLAB_WEBHOOK_SECRET": c.gitlab_hook,
                "FROGFIX_GITEA_URL": self.gitea.base_url,
                "FROGFIX_GITEA_TOKEN": c.gitea_token,
                "FROGFIX_GITEA_WEBHOOK_SECRET": c.gitea_hook,
                "FROGFIX_ADMIN_TOKEN": c.admin_token,
                "FROGFIX_SECRET_KEY": c.secret_key,
                "FROGFIX_PUBLIC_URL": "https://frogfix.example",
                "FROGFIX_STALE_JOB_SECONDS": str(self.args.stale_seconds),
                "FROGFIX_REQUEUE_AFTER_SECONDS": str(self.args.requeue_after),
                "FROGFIX_SWEEP_INTERVAL_SECONDS": "2",
                "FROGFIX_LOG_LEVEL": "INFO",
            }
        )
        self.data.mkdir()
        port = free_port()
        with open(self.logs / "app.log", "wb") as log:
            self.app = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "app.web.main:create_app",
                    "--factory",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--log-level",
                    "warning",
                    "--no-access-log",
                ],
                env=self.env,
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        app = self.app
        self.stack.callback(stop_group, app)
        wait_for_port(port, 60)
        self.base_url = f"http://127.0.0.1:{port}"
        self.workers = Workers(self.env, self.logs)
        self.stack.callback(self.workers.stop_all)
        for _ in range(self.args.workers):
            self.workers.start()

    def make_issues(self) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
        """Labelled issues on the doubles: the real ones, and a few that only forged deliveries name."""
        projects = [("gitlab", p) for p in GITLAB_PROJECTS] + [("gitea", p) for p in GITEA_PROJECTS]
        forged_count = max(1, round(self.args.issues * 0.05))
        made: list[tuple[str, str, int]] = []
        for n in range(self.args.issues + forged_count):
            forge, project = projects[n % len(projects)]
            title = f"add() returns the difference ({n})"
            if forge == "gitlab":
                iid = self.gitlab.add_issue(project, title=title, description="add(2, 3) gives -1", author="rep")["iid"]
                self.gitlab.add_label(project, iid, TRIGGER, by="dev")
            else:
                iid = self.gitea.add_issue(project, title=title, body="add(2, 3) gives -1", author="rep")["number"]
                self.gitea.add_label(project, iid, TRIGGER, by="dev")
            made.append((forge, project, int(iid)))
        return made[: self.args.issues], made[self.args.issues :]

    # -- faults --------------------------------------------------------------------------------

    def inject(self) -> None:
        group = self.rng.choice(self.args.faults)
        if group == "kill":
            victim, job = self.mid_job_worker()
            self.workers.kill(victim)
            self.reporter.fault(
                "kill-worker", f"SIGKILL worker group {victim.pid} ({f'mid job {job}' if job else 'idle'})"
            )
            self.workers.start()
        elif group == "pause":
            victim, job = self.mid_job_worker()
            # Longer than the stale-job limit plus a sweep: the sweep will think the worker is dead.
            seconds = self.args.stale_seconds + self.rng.uniform(2.0, 8.0)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(victim.pid, signal.SIGSTOP)
            self.workers.paused[victim.pid] = (victim, time.monotonic() + seconds)
            self.reporter.fault(
                "pause-worker",
                f"SIGSTOP worker group {victim.pid} for {seconds:.0f}s ({f'mid job {job}' if job else 'idle'})",
            )
        elif group == "redis":
            t0 = time.monotonic()
            self.redis.stop()
            time.sleep(self.rng.uniform(0.5, 3.0))
            self.redis.start()
            self.reporter.fault("restart-redis", f"down {time.monotonic() - t0:.1f}s (queued messages lost)")
        elif group == "postgres":
            mode = self.rng.choice(("fast", "immediate"))
            t0 = time.monotonic()
            self.pg.stop(mode)
            time.sleep(self.rng.uniform(0.5, 2.0))
            self.pg.start()
            t1 = time.monotonic()
            self.outages.append((t0, t1 + OUTAGE_GRACE_S))
            self.reporter.fault("restart-postgres", f"stop -m {mode}, down {t1 - t0:.1f}s")
        elif group == "model":
            kind = self.rng.choice(ModelFaults.KINDS)
            count = self.rng.randint(1, 2)
            self.model_faults.arm(kind, count)
            self.reporter.note(f"armed {count} x {kind} for the next model requests")
        else:
            self.arm_forge()

    def mid_job_worker(self) -> tuple[subprocess.Popen[bytes], int]:
        """A worker mid-job on the job's first run, waiting up to 5 s for one; else an idle one (job 0).

        The product re-runs a job whose worker died up to FROGFIX_MAX_JOB_RUNS (3) times, so hitting
        the same job again and again would test our aim, not its recovery.
        """
        waited = time.monotonic() + 5.0
        while True:
            targets = [
                (proc, job)
                for proc, job, run in self.workers.busy().values()
                if run == 1 and proc.pid not in self.workers.paused
            ]
            if targets or time.monotonic() > waited:
                break
            time.sleep(0.1)
        if targets:
            return self.rng.choice(targets)
        return self.rng.choice(
            [p for p in self.workers.procs if p.pid not in self.workers.paused] or self.workers.procs
        ), 0

    def arm_forge(self) -> None:
        forge = self.rng.choice(("gitlab", "gitea"))
        double: JsonApiDouble = self.gitlab if forge == "gitlab" else self.gitea
        kind = self.rng.choice(("forge-429", "forge-5xx", "forge-hang", "forge-lost-answer"))
        method, path = self.rng.choice(GITLAB_PATHS if forge == "gitlab" else GITEA_PATHS)
        with double.lock:
            before = list(double.faults)
            if kind == "forge-429":
                double.fail_next(1, 429, retry_after="1", method=method, path_contains=path)
            elif kind == "forge-5xx":
                status = self.rng.choice((500, 502, 503))
                double.fail_next(self.rng.randint(1, 2), status, method=method, path_contains=path)
            elif kind == "forge-hang":
                double.hang_next(1, self.rng.uniform(2.0, 5.0), method=method, path_contains=path)
            else:
                method, path = self.rng.choice(LOST_ANSWER[forge])
                double.fail_next(1, 502, method=method, path_contains=path, after=True)
            new = [f for f in double.faults if all(f is not b for b in before)]
        detail = f"{forge} {kind.removeprefix('forge-')} on {method or 'any'} {path or 'any path'}"
        self.forge_faults += [ArmedForgeFault(kind, detail, double, f) for f in new]
        self.reporter.note(f"armed {len(new)} x {detail}")

    def forge_faults_hit(self) -> None:
        """Count an armed forge fault once the double has used it up."""
        for armed in list(self.forge_faults):
            with armed.double.lock:
                pending = any(f is armed.fault for f in armed.double.faults)
            if not pending:
                self.forge_faults.remove(armed)
                self.reporter.fault(armed.kind, armed.detail)

    def in_outage(self, started: float, finished: float) -> bool:
        return any(started <= end and finished >= begin for begin, end in self.outages)

    # -- the database, read directly (it may be restarting) -------------------------------------

    def query(self, sql: str) -> list[tuple[Any, ...]] | None:
        import psycopg

        try:
            with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.pg.port}/soak", connect_timeout=5) as conn:
                return list(conn.execute(sql).fetchall())
        except psycopg.Error:
            return None

    def status_counts(self) -> Counter[str] | None:
        rows = self.query("SELECT status, count(*) FROM jobs GROUP BY status")
        return None if rows is None else Counter({str(s): int(n) for s, n in rows})


def make_sample(root: Path) -> Path:
    from worker.commands.demo import make_sample_repo

    return make_sample_repo(root)


# ---------------------------------------------------------------------------------------------
# The audit
# ---------------------------------------------------------------------------------------------


def git_repos(*roots: Path) -> list[Path]:
    found = []
    for root in roots:
        if root.is_dir():
            for head in root.rglob("HEAD"):
                repo = head.parent
                if (repo / "objects").is_dir() and (repo / "refs").is_dir():
                    found.append(repo)
    return found


def find_leaks(soak: Soak) -> tuple[list[str], bool]:
    """Where each canary shows up (one entry per canary and place), and whether the audit can see at all.

    The check on the model's Authorization headers, where the key belongs, proves the search finds a
    canary where one is.
    """
    places: dict[str, bytes] = {}
    for log in sorted(soak.logs.glob("*.log")):
        places[f"log {log.name}"] = log.read_bytes()
    for path in sorted(p for p in soak.data.rglob("*") if p.is_file() and p.stat().st_size < 64 * 1024 * 1024):
        places[f"data {path.relative_to(soak.data)}"] = path.read_bytes()
    pg_log = soak.pg.datadir / "log.txt"
    if pg_log.is_file():
        places["postgresql log"] = pg_log.read_bytes()
    for table in ("jobs", "job_events", "job_attempts", "webhook_deliveries"):
        rows = soak.query(f"SELECT t::text FROM {table} t")
        places[f"table {table}"] = "\n".join(str(r[0]) for r in rows or []).encode()
        if rows is None:
            places[f"table {table}"] = b""
            say(f"  !! could not read table {table} for the leak audit")
    places["gitlab double requests"] = soak.gitlab.sent_text().encode()
    places["gitea double requests"] = soak.gitea.sent_text().encode()
    places["model requests"] = b"\n".join(list(soak.model.requests))
    for repo in git_repos(soak.tmp / "git-gitlab", soak.tmp / "git-gitea", soak.data):
        shown = subprocess.run(["git", "--git-dir", str(repo), "log", "-p", "--all"], capture_output=True, timeout=120)
        places[f"git {repo.relative_to(soak.tmp)}"] = shown.stdout
    leaks = []
    for name, value in soak.canaries.values().items():
        needle = value.encode()
        leaks += [f"{name} in {place}" for place, text in places.items() if needle in text]
    headers = "\n".join(value for sent in list(soak.model.headers) for value in sent.values())
    return leaks, soak.canaries.model_key in headers


def open_mrs(soak: Soak) -> Counter[tuple[str, str, str]]:
    """Open MRs/PRs per (forge, project, source branch)."""
    found: Counter[tuple[str, str, str]] = Counter()
    with soak.gitlab.lock:
        paths = {pid: p["path_with_namespace"] for pid, p in soak.gitlab.projects.items()}
        for mr in soak.gitlab.mrs:
            if mr["state"] == "opened":
                found[("gitlab", paths[mr["project_id"]], mr["source_branch"])] += 1
    with soak.gitea.lock:
        for (repo, _), pull in soak.gitea.pulls.items():
            if pull["state"] == "open":
                found[("gitea", repo, pull["head"]["ref"])] += 1
    return found


def print_table(columns: list[tuple[str, int]]) -> None:
    widths = [max(len(name), len(str(value))) for name, value in columns]
    say("  ".join(f"{name:>{w}}" for (name, _), w in zip(columns, widths, strict=True)))
    say("  ".join(f"{value:>{w}}" for (_, value), w in zip(columns, widths, strict=True)))


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------


def all_final(soak: Soak, sending: threading.Thread) -> bool:
    """Everything was sent, no worker is paused, and every job (at least one) is in a final status."""
    counts = soak.status_counts()
    return (
        not sending.is_alive()
        and not soak.workers.paused
        and counts is not None
        and counts.total() > 0
        and not any(counts[s] for s in ACTIVE)
    )


def tick(soak: Soak) -> None:
    """The soak's housekeeping between faults: count forge faults hit, resume paused workers, replace dead ones."""
    soak.forge_faults_hit()
    soak.workers.resume_due(time.monotonic())
    soak.workers.replace_dead()


def load_and_faults(soak: Soak, sending: threading.Thread, started: float) -> None:
    """Faults on a timer until the duration is up, or earlier once everything was sent and is final."""
    args = soak.args
    next_fault = started + args.fault_every * soak.rng.uniform(0.5, 1.0)
    while time.monotonic() < started + args.duration:
        if args.faults and time.monotonic() >= next_fault:
            soak.inject()
            next_fault = time.monotonic() + args.fault_every * soak.rng.uniform(0.7, 1.3)
        tick(soak)
        if all_final(soak, sending):
            soak.reporter.note("everything sent and every job final before the duration was up")
            return
        time.sleep(0.5)


def drain(soak: Soak, sending: threading.Thread) -> bool:
    """No new faults: wait (bounded) for the sweep and the workers to finish every job."""
    soak.reporter.note("faults stop; draining")
    deadline = time.monotonic() + soak.args.drain_timeout
    while time.monotonic() < deadline:
        tick(soak)
        if all_final(soak, sending):
            soak.reporter.note("drained")
            return True
        time.sleep(1.0)
    soak.workers.resume_due()
    soak.reporter.note(f"drain timed out after {soak.args.drain_timeout:.0f}s: {dict(soak.status_counts() or {})}")
    return False


def orphans(soak: Soak) -> list[str]:
    """Sandboxes and job folders left over; the pipeline removes them just after a job's final status."""
    deadline = time.monotonic() + 15
    while True:
        found = sandboxes_over(soak.workspaces)
        found += sorted(p.name for p in soak.workspaces.iterdir() if p.name.startswith("job-"))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


Key = tuple[str, str, int]  # forge, project, issue


@dataclass
class Audit:
    """What the soak measured once every job was final (or the drain gave up)."""

    deliveries: list[Delivery]
    sent: list[Sent]
    expected: set[Key]
    jobs: list[tuple[Any, ...]]  # id, forge, project, issue, status, error, runs, tasks sent
    mrs: Counter[tuple[str, str, str]]
    orphans: list[str]
    leaks: list[str]
    audit_sees: bool
    drained: bool
    endings: list[tuple[Any, ...]]  # (job id, its final events) for jobs whose timeline ends more than once
    per_issue: dict[Key, list[tuple[Any, ...]]] = field(default_factory=dict)
    lost: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        for row in sorted(self.jobs, key=lambda r: int(r[0])):
            self.per_issue.setdefault((str(row[1]), str(row[2]), int(row[3])), []).append(row)
        for key in sorted(self.expected):
            found = self.per_issue.get(key)
            status, error = (str(found[-1][4]), str(found[-1][5])) if found else ("", "")
            if not found:
                self.lost["no job for the issue"] += 1
            elif status in ACTIVE:
                self.lost[f"not final: {status}"] += 1
            elif status != "done":
                self.lost[f"{status}: {error[:110]}"] += 1
            elif self.mrs[(key[0], key[1], f"frogfix/issue-{key[2]}")] == 0:
                self.lost["done, but no open MR on the forge"] += 1

    @property
    def doubled_jobs(self) -> list[Key]:
        return sorted(k for k, v in self.per_issue.items() if len(v) > 1)

    @property
    def doubled_mrs(self) -> list[tuple[str, str, str]]:
        return sorted(k for k, n in self.mrs.items() if n > 1)

    @property
    def unexpected(self) -> list[Key]:
        """Jobs for issues that only forged deliveries named."""
        return sorted(k for k in self.per_issue if k not in self.expected)

    def unexplained_5xx(self, soak: Soak) -> list[Sent]:
        return [
            s
            for s in self.sent
            if (s.status is None or s.status >= 500) and not (s.status == 503 and soak.in_outage(s.started, s.finished))
        ]

    def columns(self, soak: Soak) -> list[tuple[str, int]]:
        doubled = {(f, p, f"frogfix/issue-{i}") for f, p, i in self.doubled_jobs} | set(self.doubled_mrs)
        return [
            ("deliveries sent", sum(1 for s in self.sent if s.attempt == 0)),
            ("jobs expected", len(self.expected)),
            ("jobs created", len(self.jobs)),
            ("duplicates created", len(doubled)),
            ("5xx", len(self.unexplained_5xx(soak))),
            ("faults injected", soak.reporter.counts.total()),
            ("jobs lost", sum(self.lost.values())),
            ("orphaned sandboxes", len(self.orphans)),
            ("secrets leaked", len(self.leaks)),
        ]


LOSS_COLUMNS = ("duplicates created", "5xx", "jobs lost", "orphaned sandboxes", "secrets leaked")


def report(soak: Soak, audit: Audit, elapsed: float) -> bool:
    """Print the table and what lies behind any non-zero loss; True when the soak passed."""
    args, sent = soak.args, audit.sent
    columns = audit.columns(soak)
    say("")
    say(
        f"bench/soak: {columns[0][1]} deliveries ({sum(1 for d in audit.deliveries if d.kind == 'duplicate')} "
        f"re-sends, {sum(1 for d in audit.deliveries if d.kind == 'forged')} forged) over "
        f"{args.duration * SEND_SHARE:.0f}s, {args.workers} workers, PostgreSQL + Redis + uvicorn + bubblewrap, "
        f"{elapsed:.0f}s from first delivery to audit"
    )
    print_table(columns)
    say(f"job statuses: {dict(sorted(Counter(str(r[4]) for r in audit.jobs).items()))}")
    say(f"faults by kind: {dict(sorted(soak.reporter.counts.items()))}")
    unused = Counter(a.kind for a in soak.forge_faults)
    with soak.model_faults.lock:
        unused.update(soak.model_faults.armed)
    if unused:
        say(f"armed but never hit (not counted): {dict(sorted(unused.items()))}")
    codes = Counter(s.status if s.status is not None else -1 for s in sent)
    outcomes = Counter(s.outcome for s in sent if s.outcome)
    say(f"answers: {dict(sorted(codes.items()))} (-1: no answer); outcomes: {dict(sorted(outcomes.items()))}")
    fivexx = [s for s in sent if s.status is None or s.status >= 500]
    unexplained = audit.unexplained_5xx(soak)
    answered = {id(s.delivery) for s in sent if s.status is not None and s.status < 500}
    say(
        f"re-sent after 5xx/no answer: {sum(1 for s in sent if s.attempt > 0)}; 503 while PostgreSQL was down "
        f"(documented, re-sent, not counted): {len(fivexx) - len(unexplained)}; deliveries never answered below "
        f"500: {len({id(s.delivery) for s in sent} - answered)}"
    )
    if audit.jobs:
        runs = Counter(int(r[6]) for r in audit.jobs)
        tasks = sum(int(r[7]) for r in audit.jobs)
        say(f"runs per job: {dict(sorted(runs.items()))}; tasks sent: {tasks} ({tasks / len(audit.jobs):.1f} a job)")
    say(f"workers started: {soak.workers.started} ({soak.workers.unexpected_exits} exited on their own)")
    for reason, n in sorted(audit.lost.items()):
        say(f"  lost {n:>3} x {reason}")
    for key in audit.doubled_jobs:
        say(f"  duplicate jobs for {key}: {[int(r[0]) for r in audit.per_issue[key]]}")
    for branch in audit.doubled_mrs:
        say(f"  {audit.mrs[branch]} open MRs for {branch}")
    for key in audit.unexpected:
        say(f"  !! a job for {key}, which only forged deliveries named")
    for item in unexplained:
        say(f"  5xx: {item.status or item.outcome} for {item.delivery.delivery_id} ({item.delivery.kind})")
    for name in audit.orphans:
        say(f"  orphan: {name}")
    for job_id, kinds in audit.endings:  # not a loss by itself: the status is what counts
        say(f"  !! job {job_id}'s timeline ends more than once: {kinds}")
    for leak in audit.leaks:
        say(f"  LEAK: {leak}")
    if not audit.audit_sees:
        say("  !! the leak audit did not find the model key even in the model's Authorization headers")
    if not audit.drained:
        say("  !! the drain timed out: raise --drain-timeout, or see the logs (--keep)")
    passed = (
        not any(value for name, value in columns if name in LOSS_COLUMNS)
        and not audit.unexpected
        and audit.drained
        and audit.audit_sees
    )
    say("RESULT: " + ("PASS" if passed else "FAIL"))
    return passed


def run(args: argparse.Namespace, stack: contextlib.ExitStack) -> int:
    soak = Soak(args, stack)
    say(
        f"bench/soak: {args.issues} issues, {args.workers} workers, {args.duration:.0f}s of load and faults "
        f"(one every ~{args.fault_every:.0f}s: {', '.join(args.faults) or 'none'}), seed {args.seed}"
    )
    soak.start()
    issues, forged_only = soak.make_issues()
    hook_secrets = {"gitlab": soak.canaries.gitlab_hook, "gitea": soak.canaries.gitea_hook}
    deliveries = plan(soak.rng, issues, forged_only, args.duration * SEND_SHARE, hook_secrets)
    say(
        f"world up in {time.monotonic() - soak.reporter.t0:.1f}s: app {soak.base_url}, PostgreSQL :{soak.pg.port}, "
        f"Redis :{soak.redis.port}, workspaces {soak.workspaces}"
        + (f", logs {soak.logs} (kept)" if args.keep else " (--keep keeps the logs)")
    )

    stop = threading.Event()
    stack.callback(stop.set)
    sent: list[Sent] = []
    started = time.monotonic()

    def sender() -> None:
        sent.extend(asyncio.run(send_all(soak.base_url, deliveries, args.concurrency, started, stop)))

    sending = threading.Thread(target=sender, name="soak-sender", daemon=True)
    sending.start()
    load_and_faults(soak, sending, started)
    drained = drain(soak, sending)
    stop.set()
    sending.join(30)

    left = orphans(soak)
    jobs = soak.query("SELECT id, forge, project, issue, status, coalesce(error, ''), run, enqueue_count FROM jobs")
    if jobs is None:
        say("  !! could not read the jobs table; every expected job counts as lost")
    soak.workers.stop_all()  # before the leak audit, so every log line is written
    if soak.app is not None:
        stop_group(soak.app)
    endings = soak.query(
        "SELECT job_id, string_agg(kind, ', ' ORDER BY id) FROM job_events "
        "WHERE kind IN ('done', 'no_fix', 'failed', 'cancelled', 'rejected') GROUP BY job_id HAVING count(*) > 1"
    )
    leaks, audit_sees = find_leaks(soak)
    audit = Audit(
        deliveries=deliveries,
        sent=list(sent),
        expected={(d.forge, d.project, d.issue) for d in deliveries if d.kind != "forged"},
        jobs=jobs or [],
        mrs=open_mrs(soak),
        orphans=left,
        leaks=leaks,
        audit_sees=audit_sees,
        drained=drained,
        endings=endings or [],
    )
    passed = report(soak, audit, time.monotonic() - started)
    if args.keep:
        say(f"kept: {soak.tmp}")
    return 0 if passed else 1


def interrupted(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small run: 40 issues, 100 s, a fault every ~6 s")
    parser.add_argument("--issues", type=int, help="labelled issues that get valid deliveries (default 120)")
    parser.add_argument("--workers", type=int, help="worker processes (default 2)")
    parser.add_argument("--duration", type=float, help="seconds of load and faults (default 300)")
    parser.add_argument("--fault-every", type=float, help="mean seconds between faults (default 10)")
    parser.add_argument("--drain-timeout", type=float, help="seconds to wait for every job to be final (default 600)")
    parser.add_argument(
        "--faults",
        default=",".join(FAULT_GROUPS),
        help=f"comma-separated, from {','.join(FAULT_GROUPS + EXTRA_FAULTS)} (default {','.join(FAULT_GROUPS)})",
    )
    parser.add_argument("--concurrency", type=int, default=20, help="deliveries in flight at once")
    parser.add_argument("--stale-seconds", type=float, default=8.0, help="FROGFIX_STALE_JOB_SECONDS")
    parser.add_argument("--requeue-after", type=float, default=15.0, help="FROGFIX_REQUEUE_AFTER_SECONDS")
    parser.add_argument("--model-latency", type=float, default=0.4, help="mean seconds the model takes to answer")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the temp folder (logs, data) and print its path")
    args = parser.parse_args(argv)
    quick = {"issues": 40, "workers": 2, "duration": 100.0, "fault_every": 6.0, "drain_timeout": 240.0}
    full = {"issues": 120, "workers": 2, "duration": 300.0, "fault_every": 10.0, "drain_timeout": 600.0}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.faults = [f for f in (x.strip() for x in args.faults.split(",")) if f]
    unknown = set(args.faults) - set(FAULT_GROUPS + EXTRA_FAULTS)
    if unknown:
        parser.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    if args.issues < 1 or args.workers < 1:
        parser.error("--issues and --workers must be at least 1")
    return args


@contextlib.contextmanager
def signals_as_interrupt() -> Iterator[None]:
    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main() -> None:
    args = parse_args()
    if not FIXTURES.is_dir():
        sys.exit(
            f"bench/soak needs the shared forge fixtures at {FIXTURES} (the forge doubles take their shapes there)"
        )
    missing = [tool for tool in ("bwrap", "redis-server", "git") if shutil.which(tool) is None]
    if missing:
        sys.exit(f"bench/soak needs {', '.join(missing)} (./install.sh installs them)")
    code = 2
    try:
        with signals_as_interrupt(), contextlib.ExitStack() as stack:
            code = run(args, stack)
            say("stopping everything the soak started")
    except KeyboardInterrupt:
        say("interrupted; everything the soak started is stopped")
        code = 130
    except Exception:  # the soak itself could not run: say why, still exit non-zero
        traceback.print_exc()
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
