"""Moments in time, one way: aware and in UTC, written as ISO 8601 with their offset.

Standard library only, so the light modules (local job records, the trajectory) share it with the
database's `UtcDateTime` column type (app/models.py), which hands every datetime back aware.
"""

from __future__ import annotations

from datetime import UTC, datetime


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """`value` in UTC; a naive one (SQLite's, an old record's) is taken as UTC already."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def iso(value: datetime | None) -> str | None:
    """The one text form of a moment FrogFix writes (JSON, the CLI, records): ISO 8601 in UTC with its offset."""
    return as_utc(value).isoformat() if value is not None else None
