"""Engine and session factory. One short transaction per request or task step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app.retrying import RetryPolicy

T = TypeVar("T")
_engines: dict[str, Engine] = {}
_factories: dict[str, sessionmaker[Session]] = {}


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30}, pool_size=20)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(url, pool_pre_ping=True, pool_size=20, max_overflow=20)


def get_engine(url: str | None = None) -> Engine:
    """One engine per URL for the process (settings decide the default)."""
    if url is None:
        from app.settings import get_settings

        url = get_settings().resolved_database_url()
    if url not in _engines:
        _engines[url] = make_engine(url)
    return _engines[url]


def dispose_engines() -> None:
    for engine in _engines.values():
        engine.dispose()
    _engines.clear()
    _factories.clear()


@contextmanager
def session_scope(url: str | None = None) -> Iterator[Session]:
    """A session that commits on success and rolls back on error: one commit per unit of work."""
    engine = get_engine(url)
    key = str(engine.url)
    if key not in _factories:
        _factories[key] = sessionmaker(bind=engine, expire_on_commit=False)
    session = _factories[key]()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def lost_connection(exc: BaseException) -> bool:
    """Whether a database error is the connection's loss (a restart, a failover): worth another try;
    a bad statement or a broken constraint is not."""
    if not isinstance(exc, DBAPIError):
        return False
    return isinstance(exc, OperationalError | InterfaceError) or exc.connection_invalidated


# Five more tries, 0.5-1 s after the first failure and doubling to 8-16 s: at least 15.5 s in all,
# a database restart's length. No bound in seconds beside that: a long transaction that lost its
# connection is worth its next try as much as a short one.
DATABASE_RETRY = RetryPolicy(attempts=6, budget_s=None, base_delay_s=1.0, max_delay_s=16.0)


def in_transaction(work: Callable[[Session], T], *, retry: RetryPolicy = DATABASE_RETRY) -> T:
    """`work` in one transaction, done again under `retry` while the database is unreachable.

    For a worker's writes: without this, a database restart in the middle of a job costs the whole
    run (its end cannot be written, so the job waits for the stale-job sweep). Only losing the
    connection is retried; `work` must be safe to repeat, which guarded updates and events are.
    """

    def once() -> T:
        with session_scope() as session:
            return work(session)

    return retry.call("transaction (database unreachable)", once, transient=lost_connection)
