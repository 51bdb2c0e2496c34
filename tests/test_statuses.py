"""app/statuses.py is the one list of statuses and exit reasons: complete, consistent, and stdlib only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from app import statuses
from app.models import ACTIVE_PREDICATE
from app.statuses import (
    ACTIVE_STATUSES,
    FINAL_STATUSES,
    INFRA_EXITS,
    LEAF_EXITS,
    OUTCOME_STATUSES,
    RETRYABLE_STATUSES,
    RUN_STATUSES,
    STATUS_LABELS,
    STATUS_ORDER,
    SUCCESS_STATUSES,
    AttemptStatus,
    ExitReason,
    FixStatus,
    JobStatus,
)

ROOT = Path(__file__).resolve().parent.parent


def test_it_imports_only_the_standard_library() -> None:
    """worker/leaf imports it, and worker/leaf may import no database, web or Celery code."""
    tree = ast.parse((ROOT / "app" / "statuses.py").read_text("utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported and imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_every_job_status_is_active_or_final_and_shown_in_order() -> None:
    assert set(ACTIVE_STATUSES) | set(FINAL_STATUSES) == set(JobStatus)
    assert not set(ACTIVE_STATUSES) & set(FINAL_STATUSES)
    assert tuple(ACTIVE_STATUSES + FINAL_STATUSES) == STATUS_ORDER
    assert set(STATUS_LABELS) == set(JobStatus) | set(FixStatus) and STATUS_LABELS["no_fix"] == "no fix"
    assert STATUS_LABELS["environment_error"] == "environment error"  # a local job's status reads well too


def test_groups_nest_as_their_names_say() -> None:
    assert set(RUN_STATUSES) < set(ACTIVE_STATUSES) and JobStatus.queued not in RUN_STATUSES
    assert set(RETRYABLE_STATUSES) < set(FINAL_STATUSES) and JobStatus.done not in RETRYABLE_STATUSES
    assert set(SUCCESS_STATUSES) < set(OUTCOME_STATUSES) < set(FINAL_STATUSES)
    assert set(INFRA_EXITS) < set(LEAF_EXITS) < set(ExitReason)
    assert AttemptStatus.running not in FINAL_STATUSES


def test_members_equal_the_stored_strings_and_groups_hold_plain_strings() -> None:
    assert JobStatus.no_fix == "no_fix" and f"{JobStatus.done}" == "done"
    for group in (ACTIVE_STATUSES, FINAL_STATUSES, RUN_STATUSES, RETRYABLE_STATUSES, LEAF_EXITS, INFRA_EXITS):
        assert all(type(value) is str for value in group)  # bound as SQL parameters by any driver


def test_the_leaf_loop_stops_only_for_listed_reasons() -> None:
    from worker.leaf.loop import EXIT_REASONS

    assert tuple(EXIT_REASONS) == LEAF_EXITS


def test_the_active_job_index_predicate_is_built_from_the_active_statuses() -> None:
    migration = (ROOT / "migrations" / "versions" / "0001_initial.py").read_text("utf-8")
    assert ACTIVE_PREDICATE == "status IN ('queued', 'running', 'verifying', 'publishing')"
    assert f'ACTIVE = "{ACTIVE_PREDICATE}"' in migration


def test_labels_fall_back_to_the_stored_value() -> None:
    assert statuses.exit_label("max_turns") == "step limit reached"
    assert statuses.exit_label("something_new") == "something_new" and statuses.exit_label(None) == "—"
    assert set(statuses.EXIT_LABELS) == set(ExitReason)  # every exit reason has words
    assert statuses.status_label("something_new") == "something_new"
