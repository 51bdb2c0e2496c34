"""`/api/jobs/{id}/attestations`: behind the admin token, 404 for an unknown job, an empty bundle for a job
that published nothing signed, and listed in the OpenAPI document with its schema."""

from __future__ import annotations

from typing import Any

from app.db import session_scope
from app.jobs import local
from tests.conftest import ADMIN_TOKEN

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_the_bundle_endpoint(client: Any, tmp_path: Any) -> None:
    assert client.get("/api/jobs/1/attestations").status_code == 401
    assert client.get("/api/jobs/999/attestations", headers=AUTH).status_code == 404
    with session_scope() as session:
        job_id = local.create(session, folder=str(tmp_path), title="fix it", body="", who="me", kind="fix")
    r = client.get(f"/api/jobs/{job_id}/attestations", headers=AUTH)
    assert r.status_code == 200 and r.json()["attestations"] == [] and r.json()["log"]["entries"] == []
    spec = client.get("/openapi.json", headers=AUTH).json()
    assert "/api/jobs/{job_id}/attestations" in spec["paths"]
    assert "AttestationBundleAnswer" in spec["components"]["schemas"]
