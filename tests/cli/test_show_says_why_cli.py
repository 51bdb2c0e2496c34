"""`manage.py show` in a child process: the why line and the tests in words (issue 26), for jobs as stored.

Forge jobs are rows in the test's own database (as tests/cli/test_jobs_cli.py makes them), with the
error texts the pipeline stores; a local job from before records existed is its trajectory alone.
"""

from __future__ import annotations

import json
from typing import Any

from app.db import session_scope
from app.models import JobAttempt
from tests.cli.test_jobs_cli import add_job, manage


def joined(text: str) -> str:
    return " ".join(text.split())


def test_a_forge_error_a_step_limit_and_a_refusal_each_say_why(frogfix_env: dict[str, Any]) -> None:
    not_found = add_job("failed", forge="gitea", issue=4, run=1,
                        error="Gitea read issue #4 of acme/calc: HTTP 404 The target couldn't be found.",
                        ending_kind="forge_error", ending_facts={
                            "forge": "Gitea", "call": "read issue #4 of acme/calc", "http_status": 404,
                            "said": "The target couldn't be found."})
    proc = manage("show", str(not_found))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[1].startswith("  why        the forge (Gitea) answered 404 to read issue #4")
    assert ("the forge (Gitea) answered 404 to read issue #4 of acme/calc: it does not exist, or the FrogFix token"
            " may not see it (The target couldn't be found.)") in joined(proc.stdout)
    assert "the agent did not run; runs 1" in proc.stdout

    limit = add_job("no_fix", issue=5, run=1, exit_reason="max_turns", steps=150)
    with session_scope() as s:
        s.add(JobAttempt(job_id=limit, run=1, number=1, status="no_fix", exit_reason="max_turns", steps=150,
                         tests={"command": "pytest", "before": {"exit_code": 1, "counts": {"failed": 1, "passed": 3}},
                                "after": [{"exit_code": 1, "counts": {"failed": 1, "passed": 3}}]}))
    text = manage("show", str(limit)).stdout
    assert text.startswith(f"job {limit}: no fix\n")
    assert "why the agent used every step it may take (FROGFIX_LEAF_MAX_STEPS) without a fix" in joined(text)
    assert "  agent      step limit reached after 150 steps; runs 1" in text
    assert "step limit reached after 150 steps; tests: before: 1 failed, 3 passed; after: 1 failed, 3 passed" in (
        joined(text)
    )

    done = add_job("done", issue=6, run=1, exit_reason="agent", steps=3)
    assert "  why " not in manage("show", str(done)).stdout


def test_a_local_job_from_before_records_is_imported_and_says_why(frogfix_env: dict[str, Any]) -> None:
    from app import trajectory

    job = "local-20260101-000000-abcdef"
    error = "model call failed after 5 attempt(s): connection error: ConnectError: [Errno 111] Connection refused"
    document = {"trajectory_format": "leaf-function-calling", "repository": "/src/calc", "base_commit": "ab" * 20,
                "exit_reason": "llm_query_error", "n_steps": 0, "error": error, "messages": [],
                "fix": {"status": "failed", "flags": [], "error": error,
                        "ending": {"kind": "model_unreachable", "detail": error, "cause": "Connection refused"},
                        "tests": {"command": "pytest", "before": {"exit_code": 1}, "after": None, "after_runs": []}}}
    trajectory.write_atomic(frogfix_env["data_dir"] / trajectory.local_path(job), json.dumps(document).encode())
    proc = manage("show", job, env={"FROGFIX_MODEL_BASE_URL": "http://10.0.0.7:30000/v1"})
    assert proc.returncode == 0, proc.stderr
    text = joined(proc.stdout)
    assert ("why the model server at http://10.0.0.7:30000/v1 could not be reached (Connection refused);"
            " run ./manage.py doctor") in text
    assert "agent model unreachable after 0 steps" in text
    assert "tests: before: failed; after: did not run" in text  # its attempt's, as a forge job's attempt says it
