"""`/docs` and `/redoc` load with no network but FrogFix's own (issue 40): Chromium, every request to a host
other than 127.0.0.1 aborted, signed in as an operator, finds the API's operations listed on both pages."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from tests.dashboard.conftest import browser_sign_in, screenshot

OPERATION = "/api/jobs/{job_id}"  # one of the API's operations, as both pages list its path


def cut_off(page: Any) -> list[tuple[str, str]]:
    """Abort every request that leaves 127.0.0.1; the list of what was aborted (its kind, its URL)."""
    aborted: list[tuple[str, str]] = []

    def route(r: Any) -> None:
        if urlsplit(r.request.url).hostname == "127.0.0.1":
            r.continue_()
        else:
            aborted.append((r.request.resource_type, r.request.url))
            r.abort()

    page.route("**/*", route)
    return aborted


def test_swagger_ui_loads_offline_and_lists_the_operations(browser_page: Any) -> None:
    page = browser_page
    aborted = cut_off(page)
    browser_sign_in(page)
    page.goto("/docs")
    page.wait_for_selector(".opblock", timeout=30_000)  # Swagger UI rendered the operations
    paths = page.locator(".opblock-summary-path").all_inner_texts()
    assert OPERATION in [p.replace("\u200b", "") for p in paths], paths[:20]
    assert page.locator("link[href*='cdn'], script[src*='cdn']").count() == 0
    screenshot(page, "api-docs-swagger")
    assert aborted == []  # nothing asked for a host outside


def test_redoc_loads_offline_and_lists_the_operations(browser_page: Any) -> None:
    page = browser_page
    aborted = cut_off(page)
    browser_sign_in(page)
    page.goto("/redoc")
    page.wait_for_selector("[data-section-id^='operation/']", timeout=30_000)  # ReDoc rendered the operations
    assert page.locator("[data-section-id^='operation/']").count() > 5
    assert OPERATION in page.inner_text("body")
    assert page.locator("link[href*='fonts.googleapis'], script[src*='cdn']").count() == 0
    screenshot(page, "api-docs-redoc")
    # ReDoc's "API docs by Redocly" footer links its maker's logo, an image the page does without; no script,
    # style sheet or font is asked of an outside host.
    assert all(kind == "image" for kind, _url in aborted), aborted
