"""Liveness, readiness (database and broker reachable) and Prometheus metrics."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import text

from app.db import session_scope
from app.jobs.records import count_deliveries, count_jobs_by_status, oldest_queued_age
from app.queue import broker_folder, celery_app
from app.settings import get_settings
from app.statuses import JobStatus

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

    def collect(self) -> Iterator[GaugeMetricFamily]:
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
        yield deliveries
        yield by_status
        yield queued_age


registry = CollectorRegistry()
registry.register(DatabaseCollector())


@router.get("/metrics", summary="Prometheus metrics")
def metrics() -> Response:
    return Response(generate_latest(registry), media_type="text/plain; version=0.0.4; charset=utf-8")
