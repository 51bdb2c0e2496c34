"""The FastAPI application: webhooks, the JSON API, health and metrics, and the dashboard."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from app.logs import configure_logging
from app.settings import get_settings
from app.sweep import SweepThread
from app.web import api, dashboard, health, webhooks
from app.web.security import DashboardSecurity

STATIC_DIR = Path(__file__).resolve().parent / "static"


def create_app(run_sweep: bool | None = None) -> FastAPI:
    settings = get_settings()
    configure_logging(settings.log_level, settings.secret_values())
    sweep_enabled = settings.sweep_interval_seconds > 0 if run_sweep is None else run_sweep

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        sweeper = SweepThread(settings.sweep_interval_seconds) if sweep_enabled else None
        if sweeper:
            sweeper.start()
        try:
            yield
        finally:
            if sweeper:
                sweeper.stop()

    app = FastAPI(
        title="FrogFix",
        version="0.1.0",
        description="On-prem bug-fix bot: labelled issues become draft merge requests.",
        lifespan=lifespan,
    )
    app.include_router(webhooks.router)
    app.include_router(api.router)
    app.include_router(health.router)
    app.include_router(dashboard.router)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    # Sign-in and CSRF for every path but the webhooks, health, metrics and static files.
    app.add_middleware(DashboardSecurity)
    return app
