#!/usr/bin/env python3
"""bench/joblist: the dashboard's job list and /api/jobs with 100,000 jobs in a throwaway PostgreSQL.

Fills a fresh cluster (tests.servers.postgres_server) with jobs spread over a year, 300 projects of
very different sizes, a realistic status mix, an issue body per job and one attempt per job; runs the
app under uvicorn in its own process; signs in as an operator; then times, one request at a time:
the first page, a deep page (~90,000 jobs down), a filtered page and searches, for the dashboard list
and for /api/jobs, against a baseline measured in the same run: GET /readyz, a `SELECT 1` round trip
through the same app stack. Prints median and p95 in milliseconds and each median over the baseline's.

Usage: python bench/joblist.py [--jobs 100000] [--repeat 30]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.servers import free_port, postgres_server, wait_for_port  # noqa: E402

ADMIN_TOKEN = "bench-admin-token-0123456789"
USERNAME, PASSWORD = "bench", "bench passphrase for the list"

FILL = """
INSERT INTO jobs (forge, project, project_id, issue, issue_url, clone_url, title, body, trigger_user, status, run,
                  base_commit, branch, mr_url, error, delivery_id, cancel_requested, enqueue_count, steps, exit_reason,
                  flags, heartbeat_at, last_enqueued_at, created_at, updated_at, started_at, finished_at)
SELECT forge, project, NULL, g, 'https://git.example/' || project || '/-/issues/' || g, NULL,
       'Bug ' || g || ': ' || (ARRAY['crash in', 'wrong result from', 'timeout in', 'leak in', 'typo in'])[1 + g % 5]
           || ' module_' || (g % 997),
       repeat('Steps to reproduce and a stack trace. ', 30),
       'user' || (g % 150), status, 1, md5(g::text), 'frogfix/issue-' || g,
       CASE WHEN status = 'done' THEN 'https://git.example/' || project || '/-/merge_requests/' || g END,
       NULL, 'delivery-' || g, false, 1, (g * 7) % 150, 'agent', NULL, NULL, created,
       created, created, created + started, CASE WHEN status IN ('queued', 'running') THEN NULL
                                                  ELSE created + started + ((g * 13) % 3600) * interval '1 second' END
FROM (
    SELECT g,
           CASE WHEN g % 2 = 0 THEN 'gitlab' ELSE 'gitea' END AS forge,
           -- a few large projects and a long tail of small ones
           'group' || (p % 7) || '/project' || p AS project,
           CASE WHEN g > %(n)s - 5 THEN 'running' WHEN g > %(n)s - 40 THEN 'queued'
                ELSE (ARRAY['done', 'done', 'done', 'done', 'no_fix', 'no_fix', 'failed', 'failed', 'cancelled',
                            'rejected'])[1 + (g * 31) % 10] END AS status,
           now() - interval '365 days' + (g::float / %(n)s) * interval '365 days' AS created,
           ((g * 17) % 60) * interval '1 second' AS started
    FROM generate_series(1, %(n)s) AS g,
         LATERAL (SELECT floor(power((g * 2654435761 % 1000003) / 1000003.0, 3) * 300)::int AS p) AS pick
) AS s;
INSERT INTO job_attempts (job_id, run, number, status, exit_reason, steps, trajectory_path, patch, summary, tests,
                          flags, error, started_at, finished_at)
SELECT id, 1, 1, CASE WHEN status = 'done' THEN 'verified' WHEN status = 'running' THEN 'running' ELSE 'no_fix' END,
       'agent', steps, NULL, NULL, NULL, NULL, NULL, NULL, created_at, finished_at
FROM jobs WHERE status <> 'queued';
"""


def fill(url: str, n: int) -> float:
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(FILL.replace("%(n)s", str(int(n))))
        conn.execute("VACUUM ANALYZE")  # the steady state autovacuum reaches shortly after a bulk load
    return time.perf_counter() - started


def timed(client: httpx.Client, path: str, repeat: int) -> tuple[float, float, int]:
    for _ in range(3):  # warm the connection pool, the statement cache and the templates
        client.get(path)
    samples = []
    size = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        response = client.get(path)
        samples.append((time.perf_counter() - t0) * 1000)
        if response.status_code != 200:
            raise SystemExit(f"{path}: HTTP {response.status_code} {response.text[:200]}")
        size = len(response.content)
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))]
    return statistics.median(samples), p95, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()

    with postgres_server() as pg, tempfile.TemporaryDirectory(prefix="frogfix-bench-joblist-") as tmp:
        url = pg.create_database("joblist")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
        env.update(
            FROGFIX_DATABASE_URL=url,
            FROGFIX_DATA_DIR=str(Path(tmp) / "data"),
            FROGFIX_ADMIN_TOKEN=ADMIN_TOKEN,
            FROGFIX_SWEEP_INTERVAL_SECONDS="0",
            FROGFIX_LOG_LEVEL="WARNING",
        )
        os.environ.update(env)
        from app import auth
        from app.db import session_scope
        from app.migrate import upgrade

        upgrade(url)
        seconds = fill(url, args.jobs)
        with session_scope(url) as session:
            auth.create_operator(session, USERNAME, PASSWORD)
            from sqlalchemy import text

            deep = session.execute(
                text("SELECT created_at, id FROM jobs ORDER BY created_at DESC, id DESC OFFSET :o LIMIT 1"),
                {"o": min(90_000, args.jobs - 1)},
            ).one()
            project, size = session.execute(
                text("SELECT project, count(*) FROM jobs GROUP BY project ORDER BY count(*) DESC LIMIT 1")
            ).one()
            projects = session.execute(text("SELECT count(DISTINCT project) FROM jobs")).scalar_one()
        print(f"filled {args.jobs:,} jobs (+ attempts) in {seconds:.1f} s; {projects} projects, the largest "
              f"({project}, filtered on below) has {size:,} jobs")

        port = free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.web.main:create_app", "--factory", "--host", "127.0.0.1",
             "--port", str(port), "--no-access-log", "--log-level", "warning"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            wait_for_port(port, 30)
            base = f"http://127.0.0.1:{port}"
            with httpx.Client(base_url=base, timeout=30, follow_redirects=True) as browser, httpx.Client(
                base_url=base, timeout=30, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
            ) as api:
                login = browser.get("/login").text
                token = re.search(r'name="csrf_token" value="([^"]+)"', login)
                assert token
                signed = browser.post("/login", data={"username": USERNAME, "password": PASSWORD,
                                                      "csrf_token": token.group(1)})
                assert signed.status_code == 200 and "Overview" in signed.text, signed.status_code
                epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
                cursor = f"{(deep.created_at - epoch) // dt.timedelta(microseconds=1)}_{deep.id}"
                filtered = f"status=failed&forge=gitea&{httpx.QueryParams({'project': project})}"
                deep_offset = min(90_000, args.jobs - 50)
                cases = [
                    ("baseline: GET /readyz (SELECT 1)", browser, "/readyz"),
                    ("dashboard: first page", browser, "/jobs"),
                    ("dashboard: deep page (~90,000 down)", browser, f"/jobs?older={cursor}"),
                    ("dashboard: filtered (status+forge+project)", browser, f"/jobs?{filtered}"),
                    ("dashboard: search, common word", browser, "/jobs?q=timeout"),
                    ("dashboard: search, rare (none in 1st window)", browser, "/jobs?q=Bug+4242%3A"),
                    ("dashboard: search, no match", browser, "/jobs?q=no-such-words"),
                    ("dashboard: overview", browser, "/"),
                    ("api: first page", api, "/api/jobs?limit=50"),
                    ("api: deep page (offset 90,000)", api, f"/api/jobs?limit=50&offset={deep_offset}"),
                    ("api: filtered (status+forge+project)", api, f"/api/jobs?limit=50&{filtered}"),
                ]
                results = []
                for label, client, path in cases:
                    median, p95, size_bytes = timed(client, path, args.repeat)
                    results.append((label, median, p95, size_bytes))
        finally:
            server.terminate()
            server.wait(15)

    baseline = results[0][1]
    print(f"\n{args.repeat} sequential requests each, after 3 warm-ups; ratio = median / baseline median\n")
    print(f"{'case':48} {'median ms':>10} {'p95 ms':>9} {'ratio':>7} {'bytes':>9}")
    for label, median, p95, size_bytes in results:
        print(f"{label:48} {median:10.1f} {p95:9.1f} {median / baseline:7.1f} {size_bytes:9,}")


if __name__ == "__main__":
    main()
