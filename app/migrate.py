"""Bring a database to the newest schema with Alembic (used by `manage.py migrate` and the tests)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def _ensure_sqlite_folder(url: str) -> None:
    if url.startswith("sqlite") and "///" in url:
        path = url.split("///", 1)[1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)


def upgrade(url: str, revision: str = "head") -> None:
    _ensure_sqlite_folder(url)
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)


def current_revision(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


class SchemaBehind(RuntimeError):
    """A configured database is not at the schema this code needs; the message says what to do."""


def ensure_schema(url: str, *, configured: bool) -> None:
    """The embedded SQLite database (`configured` False: no FROGFIX_DATABASE_URL) is upgraded here, as `serve`
    does, so `demo`, `fix` and `eval` work in a fresh data folder. A configured database is only checked:
    upgrading production is the operator's step (`./manage.py migrate`, after a backup), never a side effect."""
    from alembic.script import ScriptDirectory

    if not configured:
        upgrade(url)
        return
    head = ScriptDirectory.from_config(alembic_config(url)).get_current_head()
    current = current_revision(url)
    if current != head:
        raise SchemaBehind(f"the database (FROGFIX_DATABASE_URL) is at schema {current or 'none'}, not {head}: "
                           "back it up, then run ./manage.py migrate")
