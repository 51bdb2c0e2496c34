#!/usr/bin/env python3
"""bench/pipeline: time from a signed webhook to a draft MR, with an instant scripted model.

Everything runs for real on 127.0.0.1 (the app, the pipeline, bubblewrap sandboxes, a git
smart-HTTP server) except the forge API and the model, which are test doubles. Prints each
stage's median and the pipeline's own share: the total minus the time the model server and
the repository's own test command took.
Usage: python bench/pipeline.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "fixtures" / "forge"
TOKEN = "glpat-bench-0123456789"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    if not SHARED.is_dir():
        sys.exit(f"bench/pipeline needs the shared forge fixtures at {SHARED}")
    tmp = Path(tempfile.mkdtemp(prefix="frogfix-bench-pipeline-"))
    ws = Path(tempfile.mkdtemp(prefix="frogfix-bench-ws-"))
    ws.chmod(0o711)

    from app.forge.api import basic_auth_header
    from tests.doubles.git_http import GitHttpDouble, bare_repo_from
    from tests.doubles.gitlab_api import GitLabDouble
    from tests.doubles.openai_server import ScriptedOpenAIServer
    from tests.pipeline.conftest import fixing_script
    from worker.commands.demo import make_sample_repo

    sample = make_sample_repo(tmp / "src")
    git = GitHttpDouble(tmp / "git", authorization=basic_auth_header("oauth2", TOKEN))
    bare_repo_from(sample, tmp / "git", "acme/calc.git")
    gitlab = GitLabDouble(token=TOKEN, fixtures=SHARED)
    gitlab.add_project("acme/calc", default_branch="main", clone_url=git.url_for("acme/calc.git"))
    gitlab.add_member("acme/calc", "dev", 30)
    model = ScriptedOpenAIServer([]).start()
    os.environ.update(
        {
            "FROGFIX_DATA_DIR": str(tmp / "data"),
            "FROGFIX_WORKSPACE_DIR": str(ws),
            "FROGFIX_GITLAB_URL": gitlab.base_url,
            "FROGFIX_GITLAB_TOKEN": TOKEN,
            "FROGFIX_GITLAB_WEBHOOK_SECRET": "bench-secret",
            "FROGFIX_LOG_LEVEL": "WARNING",
            "FROGFIX_MODEL_BASE_URL": model.base_url,
            "FROGFIX_MODEL_NAME": "scripted",
            "FROGFIX_SWEEP_INTERVAL_SECONDS": "0",
        }
    )
    import json

    from fastapi.testclient import TestClient

    from app.db import session_scope
    from app.jobs import records
    from app.logs import configure_logging
    from app.migrate import upgrade
    from app.settings import get_settings
    from app.web.main import create_app
    from worker.tasks import run_job

    upgrade(get_settings().resolved_database_url())
    app = create_app(run_sweep=False)
    configure_logging("WARNING")
    payload = json.loads((ROOT / "tests" / "payloads" / "gitlab_label_added.json").read_text())
    rows = []
    with TestClient(app) as client:
        for run in range(args.runs):
            issue = gitlab.add_issue("acme/calc", title="add() returns the difference", author="dev")
            gitlab.add_label("acme/calc", issue["iid"], "frognano-fix", by="dev")
            payload["object_attributes"]["iid"] = issue["iid"]
            payload["project"]["path_with_namespace"] = "acme/calc"
            model.add(*fixing_script())
            server_before = sum(model.server_seconds)
            started = time.perf_counter()
            r = client.post(
                "/webhooks/gitlab",
                content=json.dumps(payload).encode(),
                headers={
                    "Content-Type": "application/json",
                    "X-Gitlab-Event": "Issue Hook",
                    "X-Gitlab-Token": "bench-secret",
                    "Idempotency-Key": f"bench-{run}",
                },
            )
            job_id = r.json()["job_id"]
            intake = time.perf_counter() - started
            status = run_job(job_id)
            total = time.perf_counter() - started
            with session_scope() as s:
                events = {e.kind: e.at for e in records.job_events(s, job_id)}
                attempt = records.job_attempts(s, job_id)[0]
            tests_s = attempt.tests["before"]["seconds"] + sum(a["seconds"] for a in attempt.tests["after"])
            model_s = sum(model.server_seconds) - server_before

            def span(a: str, b: str, ev: dict[str, datetime] = events) -> float:
                return (ev[b] - ev[a]).total_seconds()

            rows.append(
                {
                    "status": status,
                    "total": total,
                    "intake": intake,
                    "admit": span("claimed", "admitted"),
                    "prepare": span("admitted", "prepared"),
                    "agent": span("agent_started", "agent_finished"),
                    "verify": span("agent_finished", "verified"),
                    "publish": span("verified", "done"),
                    "tests": tests_s,
                    "model": model_s,
                }
            )
    model.stop()
    gitlab.close()
    git.close()

    def med(key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(f"bench/pipeline: {args.runs} jobs, webhook -> draft MR, instant scripted model, SQLite, bubblewrap")
    print(f"statuses: {[r['status'] for r in rows]}")
    for key in ("intake", "admit", "prepare", "agent", "verify", "publish", "total"):
        print(f"  {key:<8} median {med(key) * 1000:8.0f} ms")
    own = med("total") - med("tests") - med("model")
    print(
        f"  of which the repository's test command (3 runs): {med('tests') * 1000:.0f} ms; model server: "
        f"{med('model') * 1000:.0f} ms"
    )
    print(
        f"pipeline's own share: {own * 1000:.0f} ms of {med('total') * 1000:.0f} ms ({own / med('total') * 100:.0f}%)"
    )


if __name__ == "__main__":
    main()
