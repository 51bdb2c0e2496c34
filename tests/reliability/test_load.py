"""Load: 10,000 mixed GitLab/Gitea deliveries at concurrency 50 against uvicorn + PostgreSQL.

30% are exact re-sends of an earlier delivery, 5% carry a bad token or signature. Every expected
job must exist exactly once (and be sent to the broker exactly once), every good delivery must
be recorded exactly once, forged ones nowhere, and nothing may answer 5xx. The intake latency
percentiles are printed and written to test-artifacts/reliability/load.txt.
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from sqlalchemy import func, select

from app.db import session_scope
from app.migrate import upgrade
from app.models import Job, WebhookDelivery
from tests.conftest import configure
from tests.reliability.rawhttp import Answer, Connection
from tests.servers import uvicorn_app
from tests.webhook_requests import gitea_headers, gitlab_headers

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
ARTIFACT = ROOT / "test-artifacts" / "reliability" / "load.txt"
DELIVERIES = 10_000
CONCURRENCY = 50
DUPLICATE_SHARE = 0.30
FORGED_SHARE = 0.05
BUDGET_S = 150.0  # the blast itself; it takes about a quarter of that on two cores
PROJECTS = ("acme/calc", "acme/web", "ops/infra-tools")
FORGED_PROJECT = "evil/forged"


def gitlab_body(project: str, issue: int, n: int) -> bytes:
    return json.dumps(
        {
            "object_kind": "issue",
            "user": {"username": f"dev{n % 7}"},
            "project": {"id": 42, "path_with_namespace": project, "git_http_url": f"https://git.test/{project}.git"},
            "object_attributes": {
                "iid": issue,
                "state": "opened",
                "action": "update",
                "title": f"bug {issue}",
                "description": f"delivery {n}: " + "x" * 300,
            },
            "labels": [{"title": "bug"}, {"title": "frognano-fix"}],
            "changes": {
                "labels": {"previous": [{"title": "bug"}], "current": [{"title": "bug"}, {"title": "frognano-fix"}]}
            },
        }
    ).encode()


def gitea_body(project: str, issue: int, n: int) -> bytes:
    return json.dumps(
        {
            "action": "label_updated",
            "number": issue,
            "issue": {
                "number": issue,
                "title": f"bug {issue}",
                "body": f"delivery {n}: " + "y" * 300,
                "state": "open",
                "labels": [{"name": "frognano-fix"}],
                "pull_request": None,
                "html_url": f"https://gitea.test/{project}/issues/{issue}",
            },
            "repository": {"id": 7, "full_name": project, "clone_url": f"https://gitea.test/{project}.git"},
            "sender": {"login": f"dev{n % 7}"},
        }
    ).encode()


Request = tuple[str, bytes, dict[str, str], str]  # path, body, headers, kind (good, dup, forged)


def plan(rng: random.Random) -> tuple[list[Request], set[tuple[str, str, int]], set[tuple[str, str]]]:
    forged = int(DELIVERIES * FORGED_SHARE)
    duplicates = int((DELIVERIES - forged) * DUPLICATE_SHARE)
    unique = DELIVERIES - forged - duplicates
    originals: list[Request] = []
    expected_jobs: set[tuple[str, str, int]] = set()
    expected_deliveries: set[tuple[str, str]] = set()
    for n in range(unique):
        forge = rng.choice(("gitlab", "gitea"))
        project = rng.choice(PROJECTS)
        issue = rng.randint(1, unique // 3)  # so most issues get several different deliveries
        delivery = f"load-{forge}-{n}"
        if forge == "gitlab":
            body = gitlab_body(project, issue, n)
            originals.append(("/webhooks/gitlab", body, gitlab_headers(delivery=delivery), "good"))
        else:
            body = gitea_body(project, issue, n)
            originals.append(("/webhooks/gitea", body, gitea_headers(body, delivery=delivery), "good"))
        expected_jobs.add((forge, project, issue))
        expected_deliveries.add((forge, delivery))
    sends = list(originals)
    sends += [(p, b, h, "dup") for p, b, h, _ in (rng.choice(originals) for _ in range(duplicates))]
    for n in range(forged):
        issue = 100_000 + n
        if n % 2:
            body = gitlab_body(FORGED_PROJECT, issue, n)
            token = rng.choice([None, "wrong-token", "gitlab-hook-secret-for-test"])
            sends.append(("/webhooks/gitlab", body, gitlab_headers(token=token, delivery=f"forged-{n}"), "forged"))
        else:
            body = gitea_body(FORGED_PROJECT, issue, n)
            headers = gitea_headers(body, delivery=f"forged-{n}", secret=rng.choice([None, "wrong-secret"]))
            if n % 6 == 0:  # the right signature of different bytes
                headers = gitea_headers(body + b" ", delivery=f"forged-{n}")
            sends.append(("/webhooks/gitea", body, headers, "forged"))
    rng.shuffle(sends)
    return sends, expected_jobs, expected_deliveries


async def blast(base: str, sends: list[Request]) -> list[tuple[str, Answer | BaseException]]:
    url = urlsplit(base)
    assert url.hostname == "127.0.0.1" and url.port
    queue: asyncio.Queue[Request] = asyncio.Queue()
    for item in sends:
        queue.put_nowait(item)
    results: list[tuple[str, Answer | BaseException]] = []

    async def worker() -> None:
        conn = Connection("127.0.0.1", int(url.port or 0))
        try:
            while not queue.empty():
                path, body, headers, kind = queue.get_nowait()
                try:
                    results.append((kind, await conn.post(path, body, headers)))
                except (TimeoutError, OSError, ValueError, asyncio.IncompleteReadError) as exc:
                    results.append((kind, exc))
                    await conn.close()
        finally:
            await conn.close()

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(CONCURRENCY))), BUDGET_S)
    return results


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000


def broker_job_ids(data_dir: Path) -> Counter[int]:
    """Job ids of the run_job messages waiting in the embedded (filesystem) broker."""
    ids: Counter[int] = Counter()
    for path in (data_dir / "broker" / "queue").iterdir():
        message = json.loads(path.read_bytes())
        if message.get("headers", {}).get("task") != "frogfix.run_job":
            continue
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        ids[int(args[0])] += 1
    return ids


def test_ten_thousand_deliveries_make_every_job_exactly_once(frogfix_env: dict[str, Any], pg: Any) -> None:
    from app.web.main import create_app

    url = pg.create_database("reliability_load")
    configure(frogfix_env["monkeypatch"], database_url=url, log_level="WARNING")  # 10,000 log lines cost time
    upgrade(url)
    sends, expected_jobs, expected_deliveries = plan(random.Random(20261129))

    with uvicorn_app(create_app(run_sweep=False)) as base:
        started = time.perf_counter()
        results = asyncio.run(blast(base, sends))
        elapsed = time.perf_counter() - started

    failures = [(kind, exc) for kind, exc in results if isinstance(exc, BaseException)]
    assert len(results) == DELIVERIES and not failures[:5], failures[:5]
    answers = [(kind, a) for kind, a in results if isinstance(a, Answer)]
    codes = Counter(a.status for _, a in answers)
    assert not [c for c in codes if c >= 500], codes
    assert {a.status for kind, a in answers if kind == "forged"} == {401}
    good = [a for kind, a in answers if kind != "forged"]
    outcomes = Counter(json.loads(a.body)["outcome"] for a in good)
    duplicates = sum(1 for kind, _ in answers if kind == "dup")
    assert outcomes["job_created"] == len(expected_jobs) == codes[202]
    assert outcomes["duplicate"] == duplicates
    assert outcomes["already_active"] == len(expected_deliveries) - len(expected_jobs)
    assert codes[200] == len(good) - len(expected_jobs)

    with session_scope() as s:
        per_issue = Counter(
            {
                (f, p, i): n
                for f, p, i, n in s.execute(
                    select(Job.forge, Job.project, Job.issue, func.count()).group_by(Job.forge, Job.project, Job.issue)
                )
            }
        )
        recorded = Counter(
            {
                (f, d): n
                for f, d, n in s.execute(
                    select(WebhookDelivery.forge, WebhookDelivery.delivery_id, func.count()).group_by(
                        WebhookDelivery.forge, WebhookDelivery.delivery_id
                    )
                )
            }
        )
        job_ids = set(s.execute(select(Job.id)).scalars())
    assert set(per_issue) == expected_jobs and set(per_issue.values()) == {1}
    assert set(recorded) == expected_deliveries and set(recorded.values()) == {1}
    sent = broker_job_ids(frogfix_env["data_dir"])
    assert set(sent) == job_ids and set(sent.values()) == {1}

    latencies = [a.seconds for _, a in answers]
    report = (
        f"deliveries={DELIVERIES} concurrency={CONCURRENCY} database=postgresql broker=filesystem\n"
        f"duplicates={duplicates} forged={sum(1 for k, _ in answers if k == 'forged')} jobs={len(expected_jobs)}\n"
        f"elapsed_s={elapsed:.1f} deliveries_per_s={DELIVERIES / elapsed:.0f}\n"
        f"p50_ms={percentile(latencies, 0.50):.1f} p99_ms={percentile(latencies, 0.99):.1f} "
        f"max_ms={max(latencies) * 1000:.1f}\n"
        f"codes={dict(sorted(codes.items()))}\n"
    )
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(report)
    print("\n" + report)
