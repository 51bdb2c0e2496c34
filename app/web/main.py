"""The FastAPI application: webhooks, the JSON API, health and metrics, and the dashboard."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.logs import configure_logging
from app.settings import get_settings
from app.sweep import SweepThread
from app.web import api, dashboard, health, webhooks
from app.web.api_docs import add_api_docs
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
        docs_url=None,  # app/web/api_docs.py serves /docs and /redoc from local assets, not a CDN
        redoc_url=None,
    )
    app.include_router(webhooks.router)
    app.include_router(api.router)
    app.include_router(health.router)
    app.include_router(dashboard.router)
    add_api_docs(app)  # before /static: its assets live under /static/api-docs/
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    # A person's browser that asks for a page that is not there gets the dashboard's not-found page;
    # the API, webhooks and scripts keep FastAPI's JSON answers.
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404 and dashboard.wants_page(request):
            specific = isinstance(exc.detail, str) and exc.detail != "Not Found"
            return dashboard.not_found(
                request, exc.detail if specific else f"There is no page at {request.url.path[:200]}."
            )
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        if dashboard.wants_page(request):
            errors = exc.errors()
            if any(e.get("loc", ("",))[0] == "path" for e in errors):  # a path no page has (an id out of range)
                return dashboard.not_found(request, f"There is no page at {request.url.path[:200]}.")
            where = ", ".join(str(e.get("loc", ("", "?"))[-1]) for e in errors)[:200]
            return dashboard.not_found(
                request, f"This page cannot read the value of {where} in its address.", status=400,
                heading="Bad request",
            )
        return await request_validation_exception_handler(request, exc)

    # Sign-in and CSRF for every path but the webhooks, health, metrics and static files.
    app.add_middleware(DashboardSecurity)
    return app
