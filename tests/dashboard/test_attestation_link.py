"""The job page of a job with an MR links its attestation bundle, which a signed-in session downloads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.dashboard.scenario import finished_job


def test_the_job_page_links_the_bundle(signed_in: Any, data_dir: Path) -> None:
    job_id = finished_job(data_dir, "done")
    page = signed_in.get(f"/jobs/{job_id}").text
    assert f'href="/api/jobs/{job_id}/attestations"' in page and 'data-testid="attestations-link"' in page
    r = signed_in.get(f"/api/jobs/{job_id}/attestations")
    assert r.status_code == 200 and r.json()["job"] == job_id
