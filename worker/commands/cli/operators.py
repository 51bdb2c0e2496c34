"""`manage.py operators`: the dashboard's accounts listed, a password reset, an account removed (never the last).

`create-admin` (cli/service.py) makes an account; these keep them. A password is read from stdin (asked for
twice, hidden, at a terminal), never from an argument that `ps` would show.
"""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from worker.commands.cli.common import cli, dump, fail, load_settings, utc_text

operators = typer.Typer(help="List the dashboard's operators, reset a password, remove an account.",
                        no_args_is_help=False, invoke_without_command=True)
cli.add_typer(operators, name="operators")


def _schema() -> None:
    """The database at the code's schema (the embedded one upgraded; a configured one only checked)."""
    from app import migrate

    settings = load_settings()
    try:
        migrate.ensure_schema(settings.resolved_database_url(), configured=bool(settings.database_url))
    except migrate.SchemaBehind as exc:
        fail("operators", str(exc), 2)


@operators.callback()
def listed(
    ctx: typer.Context,
    json_out: Annotated[bool, typer.Option("--json", help="Print the list as JSON.")] = False,
) -> None:
    """With no subcommand: every operator, with when it was made and last signed in."""
    if ctx.invoked_subcommand is not None:
        return
    from app.auth import list_operators
    from app.db import session_scope

    _schema()
    with session_scope() as session:
        rows: list[dict[str, Any]] = [
            {"username": o.username, "created_at": o.created_at.isoformat() if o.created_at else None,
             "last_login_at": o.last_login_at.isoformat() if o.last_login_at else None}
            for o in list_operators(session)
        ]
    if json_out:
        dump(rows)
        return
    if not rows:
        typer.echo("no operators yet: ./manage.py create-admin NAME makes one")
        return
    typer.echo(f"{'OPERATOR':<24} {'CREATED (UTC)':<20} LAST SIGN-IN (UTC)")
    for row in rows:
        typer.echo(f"{row['username']:<24} {utc_text(row['created_at']):<20} {utc_text(row['last_login_at'])}")


def _password() -> str:
    if sys.stdin.isatty():
        return str(typer.prompt("New password", hide_input=True, confirmation_prompt=True))
    return sys.stdin.readline().rstrip("\n")


@operators.command("set-password")
def set_password_command(username: Annotated[str, typer.Argument(help="The operator's user name.")]) -> None:
    """Reset an operator's password (read from stdin); the operator's open sessions end."""
    from app.auth import set_password
    from app.db import session_scope

    _schema()
    password = _password()
    try:
        with session_scope() as session:
            set_password(session, username, password)
    except ValueError as exc:
        fail("operators set-password", str(exc), 2)
    typer.echo(f"operator {username}: password changed; their open sessions have ended")


@operators.command("remove")
def remove_command(username: Annotated[str, typer.Argument(help="The operator's user name.")]) -> None:
    """Delete an operator account (never the last one); its open sessions end."""
    from app.auth import LastOperator, remove_operator
    from app.db import session_scope

    _schema()
    try:
        with session_scope() as session:
            remove_operator(session, username)
    except LastOperator as exc:
        fail("operators remove", str(exc), 1)
    except ValueError as exc:
        fail("operators remove", str(exc), 2)
    typer.echo(f"operator {username} removed")
