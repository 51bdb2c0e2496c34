"""Dashboard fixtures: an operator account, a signed-in test client, the app on 127.0.0.1, Chromium."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.scenario import PASSWORD, USERNAME, make_operator
from tests.servers import uvicorn_app

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-artifacts" / "screenshots"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]


def csrf_from(html: str) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def sign_in(client: Any, username: str = USERNAME, password: str = PASSWORD) -> Any:
    """Sign a TestClient in through the real form (CSRF token included); returns the final response."""
    token = csrf_from(client.get("/login").text)
    return client.post("/login", data={"username": username, "password": password, "csrf_token": token})


@pytest.fixture
def operator(frogfix_env: dict[str, Any]) -> str:
    make_operator()
    return USERNAME


@pytest.fixture
def signed_in(client: Any, operator: str) -> Any:
    response = sign_in(client)
    assert response.status_code == 200 and response.url.path == "/", response.text[:300]
    return client


@pytest.fixture
def data_dir(frogfix_env: dict[str, Any]) -> Path:
    path: Path = frogfix_env["data_dir"]
    return path


@pytest.fixture(scope="module")  # a live sync_playwright holds an event loop; others need asyncio.run
def chromium() -> Iterator[Any]:
    """One headless Debian Chromium per module, driven by Playwright (never `playwright install`)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright is not installed: pip install -e '.[dev]' (it drives /usr/bin/chromium)")
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (install.sh does)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def live_app(operator: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The whole app under uvicorn on 127.0.0.1, polling faster than in production so tests stay short."""
    from app.web import dashboard
    from app.web.main import create_app

    monkeypatch.setattr(dashboard, "LIVE_POLL_MS", 500)
    monkeypatch.setattr(dashboard, "LIST_POLL_MS", 1000)
    with uvicorn_app(create_app(run_sweep=False)) as base:
        yield base


@pytest.fixture
def browser_page(chromium: Any, live_app: str) -> Iterator[Any]:
    context = chromium.new_context(base_url=live_app, viewport={"width": 1366, "height": 860}, color_scheme="light")
    context.set_default_timeout(10_000)
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    try:
        yield page
    finally:
        context.close()


def screenshot(page: Any, name: str, full_page: bool = True) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def browser_sign_in(page: Any, username: str = USERNAME, password: str = PASSWORD) -> None:
    page.goto("/login")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login" not in url)
