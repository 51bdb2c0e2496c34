#!/usr/bin/env python3
"""bench/intake: signed GitLab deliveries (30% duplicates) against a real FrogFix server on loopback.

Prints deliveries per second, p50/p99 latency, jobs created versus expected, errors, and the
same throughput for a no-op FastAPI endpoint measured in the same run (the baseline ratio).
Usage: python bench/intake.py [--deliveries 3000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.servers import free_port, wait_for_port  # noqa: E402

SECRET = "bench-secret"


def payload(issue: int) -> bytes:
    return json.dumps(
        {
            "object_kind": "issue",
            "user": {"username": "bench"},
            "project": {
                "id": 1,
                "path_with_namespace": "bench/repo",
                "git_http_url": "http://127.0.0.1/bench/repo.git",
            },
            "object_attributes": {
                "iid": issue,
                "state": "opened",
                "action": "update",
                "title": f"bug {issue}",
                "description": "x" * 400,
            },
            "labels": [{"title": "frognano-fix"}],
            "changes": {"labels": {"previous": [], "current": [{"title": "frognano-fix"}]}},
        }
    ).encode()


def start(args: list[str], env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_port(port, 30)
    return proc


async def blast(
    url: str, requests: list[tuple[bytes, dict[str, str]]], concurrency: int
) -> tuple[float, list[float], dict[int, int]]:
    latencies: list[float] = []
    codes: dict[int, int] = {}
    queue: asyncio.Queue[tuple[bytes, dict[str, str]]] = asyncio.Queue()
    for item in requests:
        queue.put_nowait(item)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            body, headers = queue.get_nowait()
            t0 = time.perf_counter()
            try:
                r = await client.post(url, content=body, headers=headers)
                code = r.status_code
            except httpx.HTTPError:
                code = -1
            latencies.append(time.perf_counter() - t0)
            codes[code] = codes.get(code, 0) + 1

    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:
        started = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return elapsed, latencies, codes


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deliveries", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()

    rng = random.Random(7)
    unique = int(args.deliveries * 0.7)
    originals = [(payload(i + 1), str(uuid.uuid4())) for i in range(unique)]
    sends = list(originals) + [rng.choice(originals) for _ in range(args.deliveries - unique)]
    rng.shuffle(sends)
    requests = [
        (
            body,
            {
                "Content-Type": "application/json",
                "X-Gitlab-Event": "Issue Hook",
                "X-Gitlab-Token": SECRET,
                "Idempotency-Key": key,
            },
        )
        for body, key in sends
    ]

    data = Path(tempfile.mkdtemp(prefix="frogfix-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env.update(
        {
            "FROGFIX_DATA_DIR": str(data),
            "FROGFIX_GITLAB_WEBHOOK_SECRET": SECRET,
            "FROGFIX_SWEEP_INTERVAL_SECONDS": "0",
            "FROGFIX_LOG_LEVEL": "WARNING",
        }
    )
    subprocess.run([sys.executable, "manage.py", "migrate"], env=env, cwd=ROOT, check=True, capture_output=True)

    results = {}
    for name, module in (("noop", "bench.noop_app:app"), ("frogfix", "app.web.main:create_app")):
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "uvicorn",
            module,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ]
        if name == "frogfix":
            cmd.append("--factory")
        proc = start(cmd, env, port)
        try:
            url = f"http://127.0.0.1:{port}/webhooks/gitlab"
            asyncio.run(blast(url, requests[:50] if name == "noop" else [], 8))  # warm-up (noop only: no side effects)
            results[name] = asyncio.run(blast(url, requests, args.concurrency))
        finally:
            proc.terminate()
            proc.wait(20)

    db = sqlite3.connect(data / "frogfix.db")
    jobs_created = db.execute("SELECT count(*) FROM jobs").fetchone()[0]
    deliveries = db.execute("SELECT count(*) FROM webhook_deliveries").fetchone()[0]
    doubled = db.execute("SELECT count(*) FROM (SELECT issue FROM jobs GROUP BY issue HAVING count(*) > 1)").fetchone()[
        0
    ]
    queued_msgs = len(list((data / "broker" / "queue").glob("*")))

    print(
        f"bench/intake: {args.deliveries} signed GitLab deliveries, {args.deliveries - unique} duplicates, "
        f"concurrency {args.concurrency}, one uvicorn process each, SQLite + embedded broker"
    )
    print(f"{'endpoint':<10}{'deliveries/s':>14}{'p50 ms':>10}{'p99 ms':>10}{'errors':>8}  status codes")
    for name, (elapsed, lat, codes) in results.items():
        errors = sum(n for c, n in codes.items() if c < 0 or c >= 500)
        print(
            f"{name:<10}{len(lat) / elapsed:>14.0f}{pct(lat, 0.5):>10.1f}{pct(lat, 0.99):>10.1f}{errors:>8}  "
            f"{dict(sorted(codes.items()))}"
        )
    ratio = (len(results["frogfix"][1]) / results["frogfix"][0]) / (len(results["noop"][1]) / results["noop"][0])
    print(
        f"jobs expected {unique}, jobs created {jobs_created}, issues with more than one job {doubled}, "
        f"deliveries recorded {deliveries}, tasks enqueued {queued_msgs}"
    )
    print(f"intake / no-op throughput ratio: {ratio:.2f} (target >= 0.50)")
    ok = jobs_created == unique and doubled == 0 and queued_msgs == unique and ratio >= 0.5
    print("RESULT:", "PASS" if ok else "FAIL")


if __name__ == "__main__":
    main()
