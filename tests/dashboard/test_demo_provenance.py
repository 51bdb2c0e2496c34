"""Provenance shows what ran (issue 40): the demo's scripted replies are named as such on its job page, in the
API, in its record (the trajectory) and in `show`; never the configured model with its sampling parameters,
which did not run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.settings import get_settings
from tests.conftest import ADMIN_TOKEN
from worker.commands.demo import DEMO_MODEL_LABEL

ROOT = Path(__file__).resolve().parents[2]


def manage(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=dict(os.environ),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.bwrap
def test_the_demo_names_its_scripted_replies_and_no_model_that_did_not_run(local_env: dict[str, Any],
                                                                           signed_in: Any) -> None:
    configured = get_settings().model_name  # FrogNano-4B-2609 unless set: it never runs in the demo
    demo = manage("demo", "--json")
    assert demo.returncode == 0, demo.stderr
    out = json.loads(demo.stdout)
    job_id = out["job_id"]

    record = json.loads(Path(out["trajectory"]).read_text())
    assert (record["model"], record["sampling"]) == (DEMO_MODEL_LABEL, {})

    page = signed_in.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    assert configured not in page.text and "temperature" not in page.text and "top_p" not in page.text
    assert DEMO_MODEL_LABEL.replace("'", "&#39;") in page.text
    # The Attempts card says which attempt was chosen once, and the patch's size in the one wording.
    assert "Chosen: <strong>attempt 1 of 1: failed_before; 2 changed lines</strong>" in page.text
    assert "of 1 attempt 1 of 1" not in page.text
    assert '<span class="muted small" data-testid="patch-size">2 changed lines (+1 -1)</span>' in page.text

    api = signed_in.get(f"/api/jobs/{job_id}", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert api.status_code == 200 and configured not in api.text, api.text[:300]
    assert any(DEMO_MODEL_LABEL in e["message"] for e in api.json()["events"])

    shown = manage("show", str(job_id))
    assert shown.returncode == 0 and configured not in shown.stdout, shown.stdout
    assert "scripted" in shown.stdout
