"""The service's commands: migrate, serve, worker, sweep, create-admin, reap-sandboxes, doctor."""

from __future__ import annotations

import os
import signal
import sys
from typing import Annotated

import typer

from worker.commands.bootstrap import ROOT
from worker.commands.cli.common import cli, fail, import_local_records, load_settings


@cli.command()
def migrate(revision: str = "head") -> None:
    """Create or upgrade the database schema."""
    from app import migrate as migrations

    url = load_settings().resolved_database_url()
    migrations.upgrade(url, revision)
    typer.echo(f"database at revision {migrations.current_revision(url)} ({url.split('@')[-1]})")


class _Stopped(Exception):
    """serve was asked to stop by a signal (after uvicorn's own graceful shutdown, if it was serving)."""


class _StopSignals:
    """SIGTERM, SIGINT and SIGHUP stop serve through its cleanup, then end it by that same signal.

    uvicorn answers SIGTERM and SIGINT while it serves and re-raises them after its graceful
    shutdown; left to their default actions they ended serve right there, skipping the cleanup that
    stops and waits for the embedded worker. Here they raise `_Stopped` instead. SIGHUP, which
    uvicorn does not answer, asks it for the same graceful shutdown as SIGTERM. A second signal
    while serve waits for its worker ends serve at once (the worker's lifeline still stops it).
    """

    def __init__(self) -> None:
        self.received: int | None = None
        self.stopping = False
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        if self.stopping:
            os._exit(128 + signum)
        self.received = self.received or signum
        if signum == signal.SIGHUP:
            signal.raise_signal(signal.SIGTERM)  # uvicorn's graceful shutdown, or straight to `_Stopped`
            return
        self.stopping = True
        raise _Stopped

    def end_like_the_signal(self) -> None:
        """Die of the signal that stopped serve, so a service manager reads the stop as it asked for it."""
        if self.received is not None:
            signal.signal(self.received, signal.SIG_DFL)
            os.kill(os.getpid(), self.received)


@cli.command()
def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    no_migrate: Annotated[bool, typer.Option("--no-migrate", help="Do not upgrade the schema first.")] = False,
    no_worker: Annotated[bool, typer.Option("--no-worker", help="Do not start a worker beside the app.")] = False,
) -> None:
    """Run the web app; with the embedded broker, also a worker beside it, which ends when serve ends."""
    import errno
    import socket

    import uvicorn

    from worker.embedded import EmbeddedWorker

    if not 1 <= port <= 65535:
        fail("serve", f"--port {port} is not a TCP port: give one from 1 to 65535 (e.g. --port 8000)", 2)
    if workers < 1:
        fail("serve", f"--workers {workers}: serve needs at least one web worker process (e.g. --workers 1)", 2)
    # The address first, as uvicorn will bind it: a port in use is one plain line, with nothing started.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            in_use = exc.errno == errno.EADDRINUSE
            fail("serve", f"port {port} on {host} is in use; pass --port" if in_use
                  else f"cannot listen on {host} port {port}: {exc.strerror or exc}", 1)
    signals = _StopSignals()
    embedded: EmbeddedWorker | None = None
    try:
        settings = load_settings()
        if not no_migrate:
            migrate()
            import_local_records()
        if settings.embedded_broker and not no_worker:
            embedded = EmbeddedWorker([sys.executable, str(ROOT / "manage.py"), "worker", "--pool", "solo"])
            typer.echo(f"embedded broker: started a worker beside the app (pid {embedded.pid})")
        uvicorn.run(
            "app.web.main:create_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_config=None,
            access_log=False,
        )
    except _Stopped:
        pass
    finally:
        if embedded is not None:
            embedded.stop()
    signals.end_like_the_signal()


@cli.command()
def worker(
    concurrency: int = 1,
    pool: Annotated[str, typer.Option(help="prefork, solo or threads")] = "prefork",
    loglevel: str = "INFO",
    lifeline_fd: Annotated[
        int, typer.Option("--lifeline-fd", hidden=True, help="serve's lifeline: stop when it reads end-of-file.")
    ] = -1,
) -> None:
    """Run a Celery worker for FrogFix jobs."""
    from app.logs import configure_logging
    from app.queue import celery_app

    settings = load_settings()
    configure_logging(settings.log_level, settings.secret_values())
    if lifeline_fd >= 0:
        from worker.embedded import watch_lifeline

        try:
            watch_lifeline(lifeline_fd)
        except OSError as exc:  # not an open descriptor: say so rather than run unwatched
            fail("worker", f"--lifeline-fd {lifeline_fd}: {exc.strerror}")
    import worker.tasks  # noqa: F401  (registers the tasks)

    quiet_celery(concurrency, pool)
    celery_app.worker_main(
        [
            "--quiet",  # no banner on stdout: the log is JSON lines (quiet_celery says the same, as one)
            "worker",
            "-l",
            loglevel,
            "-Q",
            "frogfix",
            "-c",
            str(concurrency),
            "-P",
            pool,
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"frogfix@{os.uname().nodename}",
        ]
    )


def quiet_celery(concurrency: int, pool: str) -> None:
    """Celery's banner and its root warning (a Python warning, printed raw) kept out of the JSON log: the facts
    they hold are one structured line each instead."""
    import warnings

    from celery.exceptions import SecurityWarning

    from app.logs import get_logger

    log = get_logger("frogfix.worker")
    warnings.filterwarnings("ignore", category=SecurityWarning)
    log.info("worker_starting", queue="frogfix", concurrency=concurrency, pool=pool)
    if os.geteuid() == 0:
        log.warning("worker_runs_as_root", detail="the worker runs as root; the shipped image runs it as uid 10001 "
                    "(each sandbox drops to its own unprivileged uid either way)")


@cli.command()
def sweep(older_than: Annotated[float, typer.Option(help="seconds; default from settings")] = -1) -> None:
    """Send again every job left queued too long (the app also does this periodically)."""
    from app.sweep import sweep_once

    due, sent = sweep_once(None if older_than < 0 else older_than)
    typer.echo(f"{due} queued job(s) due, {sent} sent")




@cli.command("create-admin")
def create_admin(
    username: Annotated[str, typer.Argument(help="The operator's user name.")],
    password_stdin: Annotated[bool, typer.Option("--password-stdin", help="Read the password from stdin.")] = False,
) -> None:
    """Create a dashboard operator account (the password is asked for, or read from stdin)."""
    from app import migrate as migrations
    from app.auth import create_operator
    from app.db import session_scope

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = typer.prompt("Password", hide_input=True, confirmation_prompt=True)
    migrations.upgrade(load_settings().resolved_database_url())
    try:
        with session_scope() as session:
            create_operator(session, username, password)
    except ValueError as exc:
        typer.echo(f"create-admin: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"operator {username} created; sign in at /login")


@cli.command("reap-sandboxes")
def reap_sandboxes(
    older_than: Annotated[
        float, typer.Option(help="also delete sandboxes older than this many seconds (at least the job time limit)")
    ] = -1,
) -> None:
    """Delete Kubernetes sandbox pods and network policies left past their deadline; locally, the
    cgroups of sandboxes whose worker was killed (a live worker's are kept)."""
    from app.settings import get_settings
    from worker.tasks import reap_sandboxes as reap

    if get_settings().sandbox != "kubernetes":
        from sandbox.cgroups import reap_stale

        removed = reap_stale()
        typer.echo("\n".join(removed) if removed else "nothing to reap")
        return
    limit = get_settings().job_timeout_seconds
    if 0 <= older_than < limit:
        typer.echo(
            f"reap-sandboxes: --older-than below the job time limit ({limit:.0f} s) would delete live sandboxes",
            err=True,
        )
        raise typer.Exit(2)
    try:
        removed = reap(None if older_than < 0 else older_than)
    except Exception as exc:
        typer.echo(f"reap-sandboxes: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo("\n".join(removed) if removed else "nothing to reap")




@cli.command()
def doctor(
    json_out: Annotated[bool, typer.Option("--json", help="Print the checks as a JSON list.")] = False,
    min_free_gib: Annotated[float, typer.Option(min=0, help="Free GiB wanted in the data and workspace folders.")] = 2,
) -> None:
    """Check the configuration end to end: database, broker, forges, model, sandbox, disk.

    One line a check, with the fix for a failure; exit 1 exactly when a check fails (a forge that
    is not configured is skipped).
    """
    import json

    from worker.commands.doctor import exit_code, render_text, run_doctor
    from worker.commands.doctor.results import DoctorOptions

    # Settings that do not load never get here: the command line's first step says which, in one line (exit 2).
    results = run_doctor(load_settings(), DoctorOptions(min_free_bytes=int(min_free_gib * 1024**3)))
    if json_out:
        typer.echo(json.dumps([r.to_dict() for r in results], ensure_ascii=False, indent=2))
    else:
        typer.echo(render_text(results))
    raise typer.Exit(exit_code(results))
