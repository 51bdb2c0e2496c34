"""Migrations bring an empty database to head on SQLite and PostgreSQL, and match the models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from app import migrate
from app.models import Base

HEAD = "0013"


def _check_schema(url: str) -> None:
    migrate.upgrade(url)
    assert migrate.current_revision(url) == HEAD
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
            assert diff == [], f"models and migrations disagree: {diff}"
            tables = set(inspect(conn).get_table_names())
            indexes = {i["name"]: i for i in inspect(conn).get_indexes("jobs")}
        assert {"jobs", "webhook_deliveries", "job_events", "operators", "alembic_version"} <= tables
        assert indexes["uq_jobs_active_issue"]["unique"]
    finally:
        engine.dispose()
    migrate.downgrade(url, "base")
    assert migrate.current_revision(url) is None
    migrate.upgrade(url)
    assert migrate.current_revision(url) == HEAD


def test_sqlite_migrations(tmp_path: Path) -> None:
    _check_schema(f"sqlite:///{tmp_path / 'nested' / 'm.db'}")


def test_postgres_migrations(pg: Any) -> None:
    _check_schema(pg.create_database("migrations"))


def test_manage_migrate_on_an_empty_database(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env["FROGFIX_DATA_DIR"] = str(tmp_path / "fresh")
    out = subprocess.run(
        [sys.executable, str(root / "manage.py"), "migrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert f"revision {HEAD}" in out.stdout
    assert (tmp_path / "fresh" / "frogfix.db").is_file()


@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_partial_unique_index_allows_finished_duplicates(where: str, tmp_path: Path, request: Any) -> None:
    from sqlalchemy.exc import IntegrityError
    from sqlalchemy.orm import Session

    from app.models import Job

    url = (
        f"sqlite:///{tmp_path / 'p.db'}"
        if where == "sqlite"
        else request.getfixturevalue("pg").create_database("partial")
    )
    migrate.upgrade(url)
    engine = create_engine(url)
    try:
        with Session(engine) as s:
            for status in ("done", "failed", "queued"):
                s.add(
                    Job(
                        forge="gitlab",
                        project="a/b",
                        issue=1,
                        status=status,
                        run=0,
                        cancel_requested=False,
                        enqueue_count=0,
                    )
                )
            s.commit()
            s.add(
                Job(
                    forge="gitlab",
                    project="a/b",
                    issue=1,
                    status="running",
                    run=0,
                    cancel_requested=False,
                    enqueue_count=0,
                )
            )
            with pytest.raises(IntegrityError):
                s.commit()
    finally:
        engine.dispose()


@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_run_rename_keeps_each_jobs_run_number(where: str, tmp_path: Path, request: Any) -> None:
    """0004 renames jobs.attempt to jobs.run in place: the number survives upgrade and downgrade."""
    from sqlalchemy import text

    url = (
        f"sqlite:///{tmp_path / 'r.db'}"
        if where == "sqlite"
        else request.getfixturevalue("pg").create_database("runrename")
    )
    migrate.upgrade(url, "0003")
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO jobs (forge, project, issue, status, attempt, cancel_requested, enqueue_count,"
                    " steps, created_at, updated_at) VALUES ('gitlab', 'a/b', 1, 'done', 3, false, 1, 0,"
                    " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
        migrate.upgrade(url)
        with engine.connect() as conn:
            assert conn.execute(text("SELECT run FROM jobs")).scalar_one() == 3
            assert "attempt" not in {c["name"] for c in inspect(conn).get_columns("jobs")}
        migrate.downgrade(url, "0003")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT attempt FROM jobs")).scalar_one() == 3
    finally:
        engine.dispose()


@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_usage_columns_arrive_as_zero_and_leave_cleanly(where: str, tmp_path: Path, request: Any) -> None:
    """0005 gives existing jobs and attempts zero usage (NOT NULL, default 0) and an unknown queue wait."""
    from sqlalchemy import text

    url = (
        f"sqlite:///{tmp_path / 'u.db'}"
        if where == "sqlite"
        else request.getfixturevalue("pg").create_database("usage")
    )
    migrate.upgrade(url, "0004")
    engine = create_engine(url)
    usage = ("prompt_tokens", "completion_tokens", "cached_tokens", "model_calls", "model_seconds", "sandbox_seconds")
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO jobs (forge, project, issue, status, run, cancel_requested, enqueue_count,"
                    " steps, created_at, updated_at) VALUES ('gitlab', 'a/b', 1, 'done', 1, false, 1, 4,"
                    " CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO job_attempts (job_id, run, number, status, steps, started_at)"
                    " VALUES ((SELECT id FROM jobs), 1, 1, 'verified', 4, CURRENT_TIMESTAMP)"
                )
            )
        migrate.upgrade(url)
        with engine.connect() as conn:
            for table in ("jobs", "job_attempts"):
                row = conn.execute(text(f"SELECT {', '.join(usage)}, steps FROM {table}")).one()
                assert tuple(row) == (0, 0, 0, 0, 0, 0, 4)
            waits = conn.execute(text("SELECT queue_wait_seconds, queue_wait_total_seconds FROM jobs")).one()
            assert tuple(waits) == (None, None)
            # Counts are BIGINT: int4 refused a sum past 2**31 and the attempt's final write with it.
            big = 3_000_000_000
            conn.execute(text("UPDATE jobs SET prompt_tokens = :n, cached_tokens = :n"), {"n": big})
            assert tuple(conn.execute(text("SELECT prompt_tokens, cached_tokens FROM jobs")).one()) == (big, big)
            # New rows get the defaults from the database itself.
            conn.execute(
                text(
                    "INSERT INTO job_attempts (job_id, run, number, status, steps, started_at)"
                    " VALUES ((SELECT id FROM jobs), 1, 2, 'no_fix', 1, CURRENT_TIMESTAMP)"
                )
            )
            assert conn.execute(text("SELECT sum(cached_tokens) FROM job_attempts")).scalar_one() == 0
            conn.rollback()
        migrate.downgrade(url, "0004")
        with engine.connect() as conn:
            for table in ("jobs", "job_attempts"):
                columns = {c["name"] for c in inspect(conn).get_columns(table)}
                assert not columns & {*usage, "queue_wait_seconds", "queue_wait_total_seconds"} and "steps" in columns
            assert conn.execute(text("SELECT steps FROM job_attempts")).scalar_one() == 4
    finally:
        engine.dispose()


@pytest.mark.parametrize("where", ["sqlite", "postgres"])
def test_endings_are_backfilled_once_from_old_jobs_text(where: str, tmp_path: Path, request: Any) -> None:
    """0013 gives each finished job its ending's kind and facts from the text it stored, so old jobs keep
    their words (app/outcome_words.py reads the kind only); active and done jobs get none."""
    from sqlalchemy import text

    from app.endings import Ending
    from app.outcome_words import why

    url = f"sqlite:///{tmp_path / 'e.db'}" if where == "sqlite" else request.getfixturevalue("pg").create_database(
        "endings")
    migrate.upgrade(url, "0012")
    old = [  # status, exit_reason, error, the kind, the why line old jobs had
        ("failed", "llm_query_error", "the model could not be used: model call failed after 5 attempt(s): connection"
         " error: ConnectError: [Errno 111] Connection refused", "model_unreachable",
         "the model server could not be reached (Connection refused); run ./manage.py doctor"),
        ("failed", None, "the forge or git server kept failing: GitLab read issue #1 of a/b: HTTP 503 503 Service"
         " Unavailable (gave up after 5 attempts in 5.5s)", "forge_error",
         "the forge (GitLab) answered 503 to read issue #1 of a/b (Service Unavailable, gave up after 5 attempts in"
         " 5.5s); an operator can retry"),
        ("failed", None, "GitLab read issue #1 of a/b: HTTP 401 401 Unauthorized (the forge token was rejected)",
         "forge_error", "the forge (GitLab) answered 401 to read issue #1 of a/b: the FrogFix token was rejected;"
         " check FROGFIX_GITLAB_TOKEN"),
        ("failed", None, ".frogfix.yml is not valid YAML: bad", "config_error",
         "the repository's .frogfix.yml is not usable: it is not valid YAML: bad"),
        ("failed", None, "environment error: the tests could not start on the base commit: x", "tests_unstartable",
         "the test environment is not usable: the tests could not start on the base commit: x"),
        ("failed", None, "sandbox failure: bwrap: denied", "sandbox_failure", "the sandbox failed: bwrap: denied"),
        ("failed", None, "internal error: KeyError: 'x'", "internal_error",
         "FrogFix hit an internal error (KeyError: 'x'); the worker's log has more"),
        ("cancelled", None, "cancelled on request", "cancelled", "it was cancelled on request"),
        ("rejected", None, "bob may not trigger FrogFix here", "rejected",
         "the trigger was refused: bob may not trigger FrogFix here"),
        ("no_fix", "max_turns", None, "limits",
         "the agent used every step it may take (FROGFIX_LEAF_MAX_STEPS) without a fix"),
        ("no_fix", "agent", None, "no_fix", "the agent ended without a fix the tests prove"),
        ("done", "agent", None, None, None),
        ("running", None, None, None, None),
    ]
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for n, (status, exit_reason, error, _kind, _words) in enumerate(old, start=1):
                conn.execute(
                    text(
                        "INSERT INTO jobs (forge, project, issue, status, run, cancel_requested, enqueue_count, steps,"
                        " exit_reason, error, created_at, updated_at) VALUES ('gitlab', 'a/b', :n, :status, 1, false,"
                        " 1, 0, :exit_reason, :error, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                    ),
                    {"n": n, "status": status, "exit_reason": exit_reason, "error": error},
                )
        migrate.upgrade(url)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT issue, ending_kind, ending_facts FROM jobs ORDER BY issue")).all()
        for (issue, kind, facts), (status, exit_reason, error, expected_kind, words) in zip(rows, old, strict=True):
            assert kind == expected_kind, (issue, kind)
            if kind is None:
                continue
            if isinstance(facts, str):  # a driver that hands JSON back as text
                import json

                facts = json.loads(facts)
            assert why(status, exit_reason, Ending.stored(kind, error, facts)) == words
        migrate.downgrade(url, "0012")
        with engine.connect() as conn:
            assert "ending_kind" not in {c["name"] for c in inspect(conn).get_columns("jobs")}
    finally:
        engine.dispose()
