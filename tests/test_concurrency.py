"""Duplicates under concurrency, against a real server on loopback, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from sqlalchemy import func, select

from app.db import session_scope
from app.models import Job, WebhookDelivery
from tests.servers import uvicorn_app
from tests.webhook_requests import gitea_headers, gitlab_headers, payload


async def _blast(base: str, requests: list[tuple[str, bytes, dict[str, str]]]) -> list[int]:
    limits = httpx.Limits(max_connections=50)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as http:
        responses = await asyncio.gather(*(http.post(path, content=body, headers=h) for path, body, h in requests))
    return [r.status_code for r in responses]


def _count(model: Any) -> int:
    with session_scope() as s:
        return int(s.execute(select(func.count()).select_from(model)).scalar_one())


def test_same_delivery_50_times_concurrently_is_one_job(database: str) -> None:
    from app.web.main import create_app

    body = payload("gitlab_label_added.json")
    headers = gitlab_headers(delivery="the-one-delivery")
    with uvicorn_app(create_app(run_sweep=False)) as base:
        codes = asyncio.run(_blast(base, [("/webhooks/gitlab", body, headers)] * 50))
    assert sorted(codes) == [200] * 49 + [202]
    assert _count(Job) == 1 and _count(WebhookDelivery) == 1


def test_different_deliveries_for_one_issue_make_one_active_job(database: str) -> None:
    from app.web.main import create_app

    gl = payload("gitlab_label_added.json")
    gt = payload("gitea_label_updated.json")
    reqs = [("/webhooks/gitlab", gl, gitlab_headers()) for _ in range(25)]
    reqs += [("/webhooks/gitea", gt, gitea_headers(gt)) for _ in range(25)]
    with uvicorn_app(create_app(run_sweep=False)) as base:
        codes = asyncio.run(_blast(base, reqs))
    assert codes.count(202) == 2 and codes.count(200) == 48  # one job per forge's issue
    assert _count(Job) == 2 and _count(WebhookDelivery) == 50
    with session_scope() as s:
        outcomes = dict(
            s.execute(select(WebhookDelivery.outcome, func.count()).group_by(WebhookDelivery.outcome)).all()
        )
    assert outcomes == {"job_created": 2, "already_active": 48}
