"""Review rounds (issue 14): the rounds domain, intake and triage, on SQLite and PostgreSQL.

Shared here: the `database` fixture (import it by name in a test module) and the builders of a
thread (a job that opened an MR) and of the webhook events the parsers produce.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import pytest
from sqlalchemy import update

from app.db import session_scope
from app.forge.reviews import CiJob, CiReport, CommentKind, ReviewComment
from app.forge.webhook import Intent, WebhookEvent
from app.jobs import intake
from app.migrate import upgrade
from app.models import Job
from tests.conftest import configure

PROJECT = "grp/app"
BRANCH = "frogfix/issue-1"
HEAD = "a" * 40


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, frogfix_env: dict[str, Any]) -> str:
    """The test's FrogFix database: the embedded SQLite one, or a fresh PostgreSQL database."""
    if request.param == "postgres":
        pg = request.getfixturevalue("pg")
        name = "rounds_" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:16]
        url = pg.create_database(name)
        configure(frogfix_env["monkeypatch"], database_url=url)
        upgrade(url)
    return str(request.param)


def make_thread(
    *, mr: int = 7, issue: int = 1, branch: str = BRANCH, pushed: str | None = HEAD, legacy_url: bool = False,
    forge: Literal["gitlab", "gitea"] = "gitlab", status: str = "done",
) -> int:
    """A job that opened MR `mr` for `issue` and pushed `pushed` (round 0); `legacy_url`: only its mr_url is known."""
    with session_scope() as s:
        started = intake.record_delivery(
            s,
            WebhookEvent(
                forge, f"start-{forge}-{issue}-{mr}", "Issue Hook", "start", "label added",
                project=PROJECT, issue=issue, title="Rounding is off", body="0.1 + 0.2", sender="alice",
            ),
        )
        assert started.job_id is not None
        url = f"https://forge.test/{PROJECT}/-/merge_requests/{mr}"
        number = None if legacy_url else mr
        s.execute(
            update(Job)
            .where(Job.id == started.job_id)
            .values(status=status, branch=branch, pushed_commit=pushed, mr_url=url, mr_number=number)
        )
    return started.job_id


def comment_event(
    delivery: str, comment_id: str, body: str = "/frogfix also round negative amounts", *,
    author: str = "bob", kind: CommentKind = "note", mr: int = 7, mr_state: str = "open",
    intent: Intent = "review", discussion: str | None = "disc-1",
) -> WebhookEvent:
    """A comment on MR `mr` as the parsers report it (intent review, or stop for `/frogfix stop`)."""
    return WebhookEvent(
        "gitlab", delivery, "Note Hook", intent, "a comment on a merge request", project=PROJECT, sender=author,
        mr=mr, mr_state=mr_state, source_branch=BRANCH,
        comment=ReviewComment(id=comment_id, kind=kind, author=author, body=body, discussion_id=discussion),
    )


def ci_event(
    delivery: str, status: Literal["success", "failed", "canceled", "skipped"] = "failed", *,
    pipeline: str = "501", sha: str = HEAD, mr: int | None = None, branch: str | None = BRANCH,
) -> WebhookEvent:
    """A finished GitLab pipeline on `sha` (a branch pipeline unless `mr` is given)."""
    failed = (CiJob(id="9001", name="unit", status="failed", stage="test"),) if status == "failed" else ()
    report = CiReport(
        system="gitlab_pipeline", id=pipeline, sha=sha, status=status, ref=branch, source="push",
        url=f"https://forge.test/{PROJECT}/-/pipelines/{pipeline}", failed_jobs=failed,
    )
    return WebhookEvent(
        "gitlab", delivery, "Pipeline Hook", "ci", f"pipeline {status}", project=PROJECT, sender="ci-runner",
        mr=mr, source_branch=branch, ci=report,
    )
