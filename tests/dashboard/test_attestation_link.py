"""The job page of a job with an MR, or a local job whose patch was signed, links its attestation bundle,
which a signed-in session downloads."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from app.attestations.keys import keygen
from app.attestations.statement import subject_digest
from tests.conftest import configure
from tests.dashboard.scenario import finished_job
from worker.commands.demo import ISSUE_BODY, ISSUE_TITLE, demo_model, make_sample_repo
from worker.commands.fix import LocalFix
from worker.git import mirrors


def test_the_job_page_links_the_bundle(signed_in: Any, data_dir: Path) -> None:
    job_id = finished_job(data_dir, "done")
    page = signed_in.get(f"/jobs/{job_id}").text
    assert f'href="/api/jobs/{job_id}/attestations"' in page and 'data-testid="attestations-link"' in page
    r = signed_in.get(f"/api/jobs/{job_id}/attestations")
    assert r.status_code == 200 and r.json()["job"] == job_id


@pytest.mark.bwrap
def test_a_signed_local_job_is_served_and_linked(signed_in: Any, local_env: dict[str, Any], tmp_path: Path) -> None:
    """A `fix` job with a key configured signs its patch as a forge job's change: the API serves it, with the
    base commit as the commit subject (no commit was made, the predicate says), and its page links it."""
    private = tmp_path / "keys" / "signing.pem"
    keygen(private, tmp_path / "trusted")
    configure(local_env["monkeypatch"], attestation_key=str(private), require_attestation="true")
    repo = make_sample_repo(tmp_path / "src")
    outcome = LocalFix(repo, ISSUE_TITLE, ISSUE_BODY, model=demo_model()).run()
    assert outcome.status == "fixed", outcome.error

    bundle = signed_in.get(f"/api/jobs/{outcome.job_id}/attestations").json()
    (item,) = bundle["attestations"]
    document = json.loads(base64.b64decode(item["envelope"]["payload"]))
    assert document["predicate"]["commit"]["made"] is False and item["patch"] == outcome.patch
    assert subject_digest(document, "gitCommit") == mirrors.resolve(repo, "HEAD")
    page = signed_in.get(f"/jobs/{outcome.job_id}").text
    assert 'data-testid="attestations-link"' in page


@pytest.mark.bwrap
def test_a_local_job_without_a_key_signs_nothing(signed_in: Any, local_env: dict[str, Any], tmp_path: Path) -> None:
    outcome = LocalFix(make_sample_repo(tmp_path / "src"), ISSUE_TITLE, ISSUE_BODY, model=demo_model()).run()
    assert outcome.status == "fixed", outcome.error
    assert signed_in.get(f"/api/jobs/{outcome.job_id}/attestations").json()["attestations"] == []
    assert 'data-testid="attestations-link"' not in signed_in.get(f"/jobs/{outcome.job_id}").text
