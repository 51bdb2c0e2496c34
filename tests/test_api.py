"""The JSON API, health, readiness, metrics and the OpenAPI schema."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest

from app.db import session_scope
from app.forge.webhook import WebhookEvent
from app.jobs import intake, records
from app.models import Job, utcnow
from tests.conftest import ADMIN_TOKEN, configure
from tests.webhook_requests import gitea_headers, gitlab_headers, payload

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _seed(n: int) -> None:
    with session_scope() as s:
        for i in range(n):
            forge = "gitlab" if i % 2 == 0 else "gitea"
            s.add(
                Job(
                    forge=forge,
                    project=f"team/p{i % 3}",
                    issue=i + 1,
                    status=["done", "failed", "queued"][i % 3],
                    run=0,
                    cancel_requested=False,
                    enqueue_count=0,
                    created_at=utcnow() - timedelta(minutes=n - i),
                    updated_at=utcnow(),
                )
            )


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": ADMIN_TOKEN},
        {"Authorization": f"Basic {ADMIN_TOKEN}"},
    ],
)
def test_api_requires_the_admin_token(client: Any, headers: dict[str, str]) -> None:
    assert client.get("/api/jobs", headers=headers).status_code == 401
    assert client.get("/api/jobs/1", headers=headers).status_code == 401


def test_api_is_closed_when_no_admin_token_is_set(client: Any, frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], admin_token="")
    r = client.get("/api/jobs", headers={"Authorization": "Bearer "})
    assert r.status_code == 401 and "FROGFIX_ADMIN_TOKEN" in r.json()["detail"]


def test_list_jobs_newest_first_with_total_and_filters(client: Any) -> None:
    _seed(12)
    r = client.get("/api/jobs", headers=AUTH)
    body = r.json()
    assert r.status_code == 200 and body["total"] == 12
    assert [j["issue"] for j in body["items"]] == list(range(12, 0, -1))
    required = {
        "id",
        "forge",
        "project",
        "issue",
        "status",
        "trigger_user",
        "mr_url",
        "created_at",
        "updated_at",
    }
    assert required <= set(body["items"][0])
    # The run number under its new name, and under its first name for clients written before it.
    assert all(j["run"] == j["attempt"] == 0 for j in body["items"])
    page = client.get("/api/jobs", params={"limit": 5, "offset": 5}, headers=AUTH).json()
    assert [j["issue"] for j in page["items"]] == [7, 6, 5, 4, 3] and page["total"] == 12
    failed = client.get("/api/jobs", params={"status": "failed"}, headers=AUTH).json()
    assert failed["total"] == 4 and {j["status"] for j in failed["items"]} == {"failed"}
    gitea = client.get("/api/jobs", params={"forge": "gitea", "project": "team/p1"}, headers=AUTH).json()
    assert gitea["total"] == 2 and all(j["forge"] == "gitea" and j["project"] == "team/p1" for j in gitea["items"])


@pytest.mark.parametrize(
    "params", [{"limit": 0}, {"limit": 5001}, {"offset": -1}, {"status": "exploded"}, {"forge": "github"}]
)
def test_list_jobs_rejects_bad_parameters(client: Any, params: dict[str, Any]) -> None:
    assert client.get("/api/jobs", params=params, headers=AUTH).status_code == 422


def test_list_jobs_accepts_the_largest_limit(client: Any) -> None:
    _seed(3)
    assert client.get("/api/jobs", params={"limit": 5000}, headers=AUTH).json()["total"] == 3


def test_job_detail_has_the_timeline(client: Any) -> None:
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    job_id = r.json()["job_id"]
    detail = client.get(f"/api/jobs/{job_id}", headers=AUTH).json()
    assert detail["id"] == job_id and detail["body"] == "Calling add(2, 3) gives -1."
    assert [e["kind"] for e in detail["events"]] == ["created"]
    missing = client.get("/api/jobs/999999", headers=AUTH)
    assert missing.status_code == 404 and "999999" in missing.json()["detail"]


def test_health_and_readiness(client: Any, frogfix_env: dict[str, Any]) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_readiness_fails_when_the_broker_is_unreachable(client: Any, frogfix_env: dict[str, Any]) -> None:
    from tests.servers import free_port

    configure(frogfix_env["monkeypatch"], broker_url=f"redis://127.0.0.1:{free_port()}/0")
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["checks"]["database"] == "ok"
    assert ready.json()["checks"]["broker"] != "ok"


def test_readiness_fails_when_the_database_is_unreachable(client: Any, frogfix_env: dict[str, Any]) -> None:
    from tests.servers import free_port

    configure(frogfix_env["monkeypatch"], database_url=f"postgresql+psycopg://x@127.0.0.1:{free_port()}/none")
    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.json()["checks"]["database"] != "ok"
    # and a webhook during a database outage is a 503 the forge retries, never a 500
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    assert r.status_code == 503


def test_metrics_count_deliveries_and_jobs(client: Any) -> None:
    client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    client.post(
        "/webhooks/gitlab",
        content=payload("gitlab_label_added.json"),
        headers=gitlab_headers(event="Note Hook"),
    )
    body = payload("gitea_label_updated.json")
    client.post("/webhooks/gitea", content=body, headers=gitea_headers(body))
    text = client.get("/metrics").text
    assert 'frogfix_webhook_deliveries{forge="gitlab",outcome="job_created"} 1.0' in text
    assert 'frogfix_webhook_deliveries{forge="gitlab",outcome="ignored"} 1.0' in text
    assert 'frogfix_webhook_deliveries{forge="gitea",outcome="job_created"} 1.0' in text
    assert 'frogfix_jobs{status="queued"} 2.0' in text and 'frogfix_jobs{status="done"} 0.0' in text


def test_metrics_need_the_metrics_token_when_one_is_set(frogfix_env: dict[str, Any]) -> None:
    """/metrics names every project and its token use: with FROGFIX_METRICS_TOKEN set, only its bearer reads it."""
    from fastapi.testclient import TestClient

    from app.web.main import create_app

    metrics_token = "metrics-token-5b2e91"
    configure(frogfix_env["monkeypatch"], metrics_token=metrics_token)
    with TestClient(create_app(run_sweep=False), raise_server_exceptions=False) as c:
        for headers in ({}, AUTH, {"Authorization": f"Basic {metrics_token}"},
                        {"Authorization": f"Bearer {metrics_token}x"}, {"Authorization": "Bearer "}):
            r = c.get("/metrics", headers=headers)
            assert r.status_code == 401 and "frogfix_" not in r.text, headers
            assert r.headers["www-authenticate"] == "Bearer"
        r = c.get("/metrics", headers={"Authorization": f"Bearer {metrics_token}"})
        assert r.status_code == 200 and "frogfix_jobs{" in r.text
        assert c.get("/healthz").status_code == 200  # the probes stay open
    from app.settings import get_settings

    assert metrics_token in get_settings().secret_values()  # redacted from logs like the other tokens


def test_openapi_schema_is_served(client: Any) -> None:
    assert client.get("/openapi.json").status_code == 401  # the schema and /docs need the token or a sign-in
    schema = client.get("/openapi.json", headers=AUTH).json()
    for path in (
        "/webhooks/gitlab",
        "/webhooks/gitea",
        "/api/jobs",
        "/api/jobs/{job_id}",
        "/healthz",
        "/readyz",
        "/metrics",
    ):
        assert path in schema["paths"]


def test_log_lines_carry_ids_and_never_secrets(frogfix_env: dict[str, Any]) -> None:
    """A canary secret in settings never reaches a log line, even when a request carries it."""
    from fastapi.testclient import TestClient

    from app.logs import configure_logging
    from app.web.main import create_app

    canary = "canary-gitlab-token-7f3a9c"
    configure(frogfix_env["monkeypatch"], gitlab_token=canary, gitlab_webhook_secret=canary + "-hook")
    app = create_app(run_sweep=False)
    from app.settings import get_settings

    stream = io.StringIO()
    configure_logging("INFO", get_settings().secret_values(), stream=stream)
    with TestClient(app) as c:
        body = payload("gitlab_label_added.json").replace(b"Calling add", f"token {canary} add".encode())
        ok = c.post("/webhooks/gitlab", content=body, headers=gitlab_headers(token=canary + "-hook", delivery="dlv-9"))
        c.post("/webhooks/gitlab", content=body, headers=gitlab_headers(token=canary, delivery="dlv-10"))
    assert ok.status_code == 202
    with session_scope() as s:
        records.add_event(s, ok.json()["job_id"], "note", f"a message mentioning {canary}")
        from app.logs import get_logger

        get_logger().info("job_note", job_id=ok.json()["job_id"], detail=f"the token is {canary}")
    lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
    assert lines, "nothing was logged"
    assert canary not in stream.getvalue()
    webhook_lines = [ln for ln in lines if ln.get("event") in ("webhook", "webhook_refused")]
    assert webhook_lines and all(ln.get("delivery_id") or ln.get("status") == 401 for ln in webhook_lines)
    assert any(ln.get("delivery_id") == "dlv-9" and ln.get("job_id") for ln in webhook_lines)


def test_job_ids_are_unique_per_issue_in_events(frogfix_env: dict[str, Any]) -> None:
    with session_scope() as s:
        first = intake.record_delivery(s, WebhookEvent("gitea", "x1", "issues", "start", "t", project="a/b", issue=2))
    with session_scope() as s:
        second = intake.record_delivery(s, WebhookEvent("gitea", "x2", "issues", "start", "t", project="a/b", issue=3))
    assert first.job_id != second.job_id and first.enqueue and second.enqueue
