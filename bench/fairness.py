#!/usr/bin/env python3
"""bench/fairness: how many jobs run before a small project's one job, behind another project's flood.

200 jobs of project A are queued (as webhooks queue them: committed, one `frogfix.run_job`
ticket each, in order), then 1 of project B. Two claimer threads (two GPU slots) take the
tickets in the broker's order (first in, first out) and run each claimed job with a fixed-time
stand-in for the agent, then end it `done`, until every ticket is spent. Counted: how many jobs
were claimed before B's, and how long each claim took (all 201 claims).

Two policies, each on a fresh database in the same run:
- fifo: the order before issue 13, the ticket's own job (`transitions.claim_job(ticket)`);
- fair: `scheduler.claim_next` (fewest running, round-robin, within budgets), what workers use now.
Printed per database (a SQLite file, and PostgreSQL when initdb is installed): jobs before B,
B's wait in seconds, the median claim in milliseconds, and fair over fifo as a ratio.

Usage: python bench/fairness.py [--flood 200] [--agent-seconds 0.02] [--no-postgres]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.update({"FROGFIX_DATA_DIR": tempfile.mkdtemp(prefix="frogfix-bench-fair-"), "FROGFIX_LOG_LEVEL": "WARNING"})

from app.db import dispose_engines, session_scope  # noqa: E402
from app.forge.webhook import WebhookEvent  # noqa: E402
from app.jobs import intake, scheduler, transitions  # noqa: E402
from app.migrate import upgrade  # noqa: E402
from app.models import utcnow  # noqa: E402
from app.settings import get_settings, reset_settings_cache  # noqa: E402
from app.statuses import RUN_STATUSES, JobStatus  # noqa: E402

SLOTS = 2


@dataclass
class Outcome:
    before_b: int = -1
    b_wait_s: float = 0.0
    claims_ms: list[float] = field(default_factory=list)


def use_database(url: str) -> None:
    os.environ["FROGFIX_DATABASE_URL"] = url
    reset_settings_cache()
    dispose_engines()
    upgrade(url)


def queue_flood(flood: int) -> tuple[list[int], int]:
    """A's jobs, then B's: the tickets in the broker's order, and B's job id."""
    tickets = []
    for n, project in enumerate(["acme/flood"] * flood + ["small/team"], start=1):
        event = WebhookEvent("gitlab", f"d-{n}", "Issue Hook", "start", "bench", project=project, issue=n)
        with session_scope() as s:
            job_id = intake.record_delivery(s, event).job_id
        assert job_id is not None
        tickets.append(job_id)
    return tickets, tickets[-1]


def claim(policy: str, ticket: int) -> int | None:
    with session_scope() as s:
        if policy == "fifo":
            return ticket if transitions.claim_job(s, ticket) else None
        got = scheduler.claim_next(s, get_settings(), utcnow(), preferred=ticket)
        return None if got is None else got.job_id


def run_policy(policy: str, flood: int, agent_s: float) -> Outcome:
    tickets, b_job = queue_flood(flood)
    broker = deque(tickets)
    lock = threading.Lock()
    claimed: list[int] = []
    out = Outcome()
    started = time.perf_counter()

    def slot() -> None:
        while True:
            with lock:
                if not broker:
                    return
                ticket = broker.popleft()
            t0 = time.perf_counter()
            job_id = claim(policy, ticket)
            elapsed = time.perf_counter() - t0
            if job_id is None:
                continue
            with lock:
                out.claims_ms.append(elapsed * 1000)
                claimed.append(job_id)
                if job_id == b_job:
                    out.before_b, out.b_wait_s = len(claimed) - 1, time.perf_counter() - started
            time.sleep(agent_s)  # the stand-in for the agent
            with session_scope() as s:
                transitions.set_status(s, job_id, JobStatus.done, expected=RUN_STATUSES)

    threads = [threading.Thread(target=slot) for _ in range(SLOTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def bench(label: str, urls: dict[str, str], flood: int, agent_s: float) -> None:
    results = {}
    for policy in ("fifo", "fair"):
        use_database(urls[policy])
        results[policy] = run_policy(policy, flood, agent_s)
    fifo, fair = results["fifo"], results["fair"]
    print(f"\n{label}: {flood} jobs of A queued, then 1 of B; {SLOTS} slots; agent stand-in {agent_s * 1000:.0f} ms")
    print(f"  {'policy':<6} {'jobs before B':>14} {'B waited (s)':>13} {'claim median (ms)':>18}")
    for policy, r in results.items():
        median = statistics.median(r.claims_ms) if r.claims_ms else float("nan")
        print(f"  {policy:<6} {r.before_b:>14} {r.b_wait_s:>13.2f} {median:>18.2f}")
    ratio = fair.before_b / fifo.before_b if fifo.before_b > 0 else float("nan")
    print(f"  fair / fifo, jobs before B: {fair.before_b} / {fifo.before_b} = {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--flood", type=int, default=200)
    parser.add_argument("--agent-seconds", type=float, default=0.02)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    folder = Path(os.environ["FROGFIX_DATA_DIR"])
    try:
        urls = {p: f"sqlite:///{folder / f'{p}.db'}" for p in ("fifo", "fair")}
        bench("SQLite file", urls, args.flood, args.agent_seconds)
        has_pg = shutil.which("initdb") or list(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if args.no_postgres or not has_pg:
            print("\nPostgreSQL: skipped" + ("" if args.no_postgres else " (initdb not installed)"))
            return
        from tests.servers import postgres_server

        with postgres_server() as server:
            urls = {p: server.create_database(f"fair_{p}") for p in ("fifo", "fair")}
            bench("PostgreSQL", urls, args.flood, args.agent_seconds)
    finally:
        dispose_engines()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
