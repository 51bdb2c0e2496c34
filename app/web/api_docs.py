"""`/docs` (Swagger UI) and `/redoc` (ReDoc) from assets FrogFix serves itself, never a CDN.

FastAPI's default pages load both from a public CDN, which an on-prem network cannot reach: they
were blank. The `fastapi-offline` package (MIT) ships the built Swagger UI bundle and stylesheet and
ReDoc's standalone bundle, kept in step with their releases; they are served under `/static/api-docs/`
(open like the dashboard's static files; the pages themselves stay behind sign-in or the admin token),
and FastAPI's own page builders point at them. No web fonts are fetched and Swagger UI's online
validator badge (an outside request) is off.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_PATH = "/static/api-docs"
DOCS_PATH, REDOC_PATH, OAUTH2_REDIRECT_PATH = "/docs", "/redoc", "/docs/oauth2-redirect"


def assets_dir() -> Path:
    """The folder of the package that ships the assets (swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js)."""
    return Path(str(files("fastapi_offline") / "static"))


def add_api_docs(app: FastAPI) -> None:
    """Serve the assets and the two pages; `app` must be made with `docs_url=None, redoc_url=None`."""
    app.mount(ASSETS_PATH, StaticFiles(directory=assets_dir()), name="api-docs")

    def root(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        base = root(request)
        return get_swagger_ui_html(
            openapi_url=f"{base}{app.openapi_url}",
            title=f"{app.title} - API",
            oauth2_redirect_url=f"{base}{OAUTH2_REDIRECT_PATH}",
            swagger_js_url=f"{base}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{base}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{base}{ASSETS_PATH}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(OAUTH2_REDIRECT_PATH, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_PATH, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        base = root(request)
        return get_redoc_html(
            openapi_url=f"{base}{app.openapi_url}",
            title=f"{app.title} - API",
            redoc_js_url=f"{base}{ASSETS_PATH}/redoc.standalone.js",
            redoc_favicon_url=f"{base}{ASSETS_PATH}/favicon.png",
            with_google_fonts=False,
        )
