"""Request parameters every route shares, bounded to what the database can hold (else a 422, never a 500)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

MAX_DB_INT = 2**31 - 1  # PostgreSQL's integer; ids and offsets beyond it cannot exist
NO_NUL = r"^[^\x00]*$"  # PostgreSQL refuses NUL in text

# A job in a page's path: its number, or an imported local job's old id (`local-…`, app/jobs/local.py).
JobRef = Annotated[str, Path(max_length=200, description="A job's number, or an imported local job's old id")]
JobId = Annotated[int, Path(ge=1, le=MAX_DB_INT, description="A job's id")]
EvaluationId = Annotated[int, Path(ge=1, le=MAX_DB_INT, description="An evaluation's id")]
AttemptId = Annotated[int, Path(ge=1, le=MAX_DB_INT, description="An attempt's id")]
Offset = Annotated[int, Query(ge=0, le=MAX_DB_INT)]
ProjectFilter = Annotated[str | None, Query(max_length=255, pattern=NO_NUL)]


def path_job_id(job_ref: str) -> int | None:
    """The job's number a page path names; None for anything else (an old local id, or no job at all)."""
    if job_ref.isascii() and job_ref.isdigit() and 1 <= int(job_ref) <= MAX_DB_INT and job_ref[0] != "0":
        return int(job_ref)
    return None
