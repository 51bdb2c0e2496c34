"""Liveness, readiness (database and broker reachable) and Prometheus metrics."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Header, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import text

from app.db import session_scope
from app.jobs.read_model import UsageCounters, usage_counters
from app.jobs.records import count_deliveries, count_jobs_by_status, oldest_queued_age
from app.queue import broker_folder, celery_app
from app.settings import get_settings
from app.statuses import JobStatus
from app.web.security import bearer_matches

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is alive")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


def check_database() -> str | None:
    try:
        with session_scope() as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


def check_broker() -> str | None:
    s = get_settings()
    if s.embedded_broker:
        folder = broker_folder(s) / "queue"
        return None if folder.is_dir() else f"broker folder {folder} is missing"
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=2)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:300]
    return None


@router.get("/readyz", summary="The database and the broker are reachable")
def readyz() -> JSONResponse:
    checks = {"database": check_database(), "broker": check_broker()}
    ok = all(v is None for v in checks.values())
    return JSONResponse(
        {"status": "ok" if ok else "unavailable", "checks": {k: v or "ok" for k, v in checks.items()}},
        status_code=200 if ok else 503,
    )


class DatabaseCollector(Collector):
    """Counts read from the database at scrape time, so every API replica reports the same truth."""

    def collect(self) -> Iterator[Metric]:
        deliveries = GaugeMetricFamily(
            "frogfix_webhook_deliveries",
            "Webhook deliveries recorded, by forge and outcome",
            labels=["forge", "outcome"],
        )
        by_status = GaugeMetricFamily("frogfix_jobs", "Jobs by status", labels=["status"])
        queued_age = GaugeMetricFamily("frogfix_oldest_queued_job_seconds", "Age of the oldest queued job")
        with session_scope() as session:
            for (forge, outcome), n in sorted(count_deliveries(session).items()):
                deliveries.add_metric([forge, outcome], n)
            counts = count_jobs_by_status(session)
            for status in JobStatus:
                by_status.add_metric([status.value], counts.get(status.value, 0))
            queued_age.add_metric([], oldest_queued_age(session))
            counters = usage_counters(session)
        yield deliveries
        yield by_status
        yield queued_age
        yield from usage_metrics(counters)


def usage_metrics(counters: UsageCounters) -> Iterator[Metric]:
    """Tokens by kind, model and sandbox seconds, calls and jobs by forge, project and outcome; the cached share.

    `forge` is on every series because a project is (forge, path), as budgets key it: the same
    path on GitLab and on Gitea is two projects, and their figures must not be merged.
    """
    labels = ["forge", "project", "outcome"]
    tokens = CounterMetricFamily(
        "frogfix_tokens", "Tokens of finished attempts, by forge, project, attempt outcome and kind (prompt, "
        "completion, cached: the prompt tokens the server's prefix cache served)", labels=[*labels, "kind"],
    )
    model_seconds = CounterMetricFamily(
        "frogfix_model_seconds", "Wall time inside model calls of finished attempts, retries included", labels=labels
    )
    sandbox_seconds = CounterMetricFamily(
        "frogfix_sandbox_seconds", "Wall time inside sandbox tool calls and test runs of finished attempts",
        labels=labels,
    )
    calls = CounterMetricFamily("frogfix_model_calls", "Model replies of finished attempts", labels=labels)
    # A gauge: a retry or a review round takes a job out of its final status, and a counter never goes down.
    jobs = GaugeMetricFamily("frogfix_jobs_finished", "Jobs now in a final status, by forge, project and status",
                             labels=labels)
    share = GaugeMetricFamily(
        "frogfix_prompt_cached_ratio", "Share of prompt tokens served from the prefix cache, by forge and project",
        labels=["forge", "project"],
    )
    for key, u in sorted(counters.attempts.items()):
        for kind, value in (("prompt", u.prompt_tokens), ("completion", u.completion_tokens),
                            ("cached", u.cached_tokens)):
            tokens.add_metric([*key, kind], value)
        model_seconds.add_metric(list(key), u.model_seconds)
        sandbox_seconds.add_metric(list(key), u.sandbox_seconds)
        calls.add_metric(list(key), u.model_calls)
    for key, n in sorted(counters.jobs.items()):
        jobs.add_metric(list(key), n)
    for project_key, ratio in sorted(counters.cached_share().items()):
        share.add_metric(list(project_key), ratio)
    yield from (tokens, model_seconds, sandbox_seconds, calls, jobs, share)


registry = CollectorRegistry()
registry.register(DatabaseCollector())


@router.get("/metrics", summary="Prometheus metrics (with FROGFIX_METRICS_TOKEN set: its bearer token only)")
def metrics(authorization: str | None = Header(default=None)) -> Response:
    """The metrics name every project and its token use, so a configured token guards them."""
    expected = get_settings().metrics_token.get_secret_value()
    if expected and not bearer_matches(authorization, expected):
        return Response("missing or wrong bearer token\n", status_code=401, media_type="text/plain",
                        headers={"WWW-Authenticate": "Bearer"})
    return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")
