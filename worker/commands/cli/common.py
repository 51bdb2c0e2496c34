"""manage.py's Typer app and what its commands share: the settings, the failure line and exit code, job ids,
times and text fitted to 80 columns."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer

from app import statuses as _statuses

cli = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="FrogFix: labelled issues become draft MRs.",
)


def load_settings():  # type: ignore[no-untyped-def]
    from app.settings import get_settings

    return get_settings()


@cli.callback()
def settings_first(ctx: typer.Context) -> None:
    """Every setting checked once, before any command runs: a bad value is one line and exit 2, never a traceback."""
    import sys

    from app.settings import BadSettings, checked_settings

    if ctx.resilient_parsing or {"--help", "-h"} & set(sys.argv[1:]):  # help needs no settings
        return
    try:
        settings = checked_settings()
    except BadSettings as exc:
        typer.echo(f"frogfix {ctx.invoked_subcommand}: {exc}", err=True)
        raise typer.Exit(2) from None
    problem = data_folder_problem(settings.data_dir)
    if problem:
        typer.echo(f"frogfix {ctx.invoked_subcommand}: {problem}", err=True)
        raise typer.Exit(2)


def data_folder_problem(folder: Path) -> str:
    """Why the data folder (database, broker, trajectories, keys) cannot be used, or "" when it can, so the failure
    names the folder rather than whatever first writes there. Nothing is made: the folder, or the nearest folder
    above it that exists (where it would be made), must be one this user may write."""
    import os

    existing = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if existing is None or not existing.is_dir():
        why = f"{existing} is not a folder" if existing is not None else "no folder above it exists"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = f"{existing} is not writable by this user ({_user(os.getuid())})"
    else:
        return ""
    return (f"FROGFIX_DATA_DIR: the data folder {folder} cannot be made or written ({why}); point FROGFIX_DATA_DIR "
            "at a folder this user may write (e.g. FROGFIX_DATA_DIR=~/.frogfix)")


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"





# ---------------------------------------------------------------------------------------------
# Job commands: jobs, show, cancel, retry, replay. Errors are one line on stderr: exit 2 for an
# unknown job or bad input, 1 when the job cannot make the change asked for.
# ---------------------------------------------------------------------------------------------

WIDTH = 80
STATUSES, FINAL = _statuses.STATUS_ORDER, _statuses.FINAL_STATUSES
JOB_ARG = typer.Argument(help="The job's id (a number; an imported local job's old local-... id too).")


def fail(command: str, message: str, code: int = 2) -> NoReturn:
    first = " ".join(str(message).split())  # one line, whatever the message held
    typer.echo(f"frogfix {command}: {first[:1000]}", err=True)
    raise typer.Exit(code)


def actor() -> str:
    """Who acts through manage.py, for a job's timeline ("alice (manage.py)")."""
    import getpass

    try:
        return f"{getpass.getuser()} (manage.py)"
    except Exception:  # no user name in this environment
        return "manage.py"


@contextmanager
def job_errors(command: str) -> Iterator[None]:
    """Turn the expected failures into one line and an exit code, never a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    from app.jobs.records import UnknownJob
    from app.jobs.transitions import InvalidTransition

    try:
        yield
    except UnknownJob as exc:
        fail(command, str(exc), 2)
    except InvalidTransition as exc:
        fail(command, str(exc), 1)
    except SQLAlchemyError as exc:
        missing = "no such table" in str(exc) or "does not exist" in str(exc)
        hint = " (run ./manage.py migrate first?)" if missing else ""
        fail(command, f"database error: {type(exc).__name__}{hint}", 2)


def no_tables(exc: Exception) -> bool:
    """The database has no `jobs` table yet, in SQLite's or PostgreSQL's words (not a missing column or database)."""
    text = str(exc)
    return "no such table: jobs" in text or 'relation "jobs" does not exist' in text


def import_local_records() -> None:
    """Older versions' local job records (app/jobs/local.py), brought into the jobs table once."""
    from app.db import session_scope
    from app.jobs import local

    with session_scope() as session:
        local.import_records(session, load_settings().data_dir)


def job_number(command: str, value: str) -> int:
    """A job's number; an imported local job's old `local-…` id names the job it became."""
    from app.db import session_scope
    from app.jobs import local
    from app.trajectory import LOCAL_ID

    text = value.strip()
    if LOCAL_ID.fullmatch(text):
        import_local_records()
        with session_scope() as session:
            return local.by_local_id(session, text)
    if not text.lstrip("-").isdigit():
        fail(command, f"no job with id {text[:80]!r}", 2)
    return int(text)


def utc_text(value: str | None, *, date: bool = True) -> str:
    """An ISO timestamp as `YYYY-MM-DD HH:MM:SS` (UTC), or `-`."""
    from datetime import UTC, datetime

    if not value:
        return "-"
    moment = datetime.fromisoformat(value).astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")


def wrap(text: str, first: str, indent: int) -> list[str]:
    import textwrap

    return textwrap.wrap(
        " ".join(text.split()) or "-",
        width=WIDTH,
        initial_indent=first,
        subsequent_indent=" " * indent,
        break_long_words=False,  # a URL or path stays whole (and may run past the edge)
        break_on_hyphens=False,
    ) or [first.rstrip()]


def fit(text: str, width: int, keep: str = "end") -> str:
    """`text` in `width` characters: a path keeps its end (the project's name), a title its start."""
    if len(text) <= width:
        return text
    return text[: width - 1] + "…" if keep == "start" else "…" + text[-(width - 1) :]


def dump(value: Any) -> None:
    import json

    typer.echo(json.dumps(value, ensure_ascii=False, indent=2))
