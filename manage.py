#!/usr/bin/env python3
"""FrogFix's one command line: serve, worker, migrate, sweep, fix, demo, reap-sandboxes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

cli = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="FrogFix: labelled issues become draft MRs.",
)


def _settings():  # type: ignore[no-untyped-def]
    from app.settings import get_settings

    return get_settings()


@cli.command()
def migrate(revision: str = "head") -> None:
    """Create or upgrade the database schema."""
    from app import migrate as migrations

    url = _settings().resolved_database_url()
    migrations.upgrade(url, revision)
    typer.echo(f"database at revision {migrations.current_revision(url)} ({url.split('@')[-1]})")


@cli.command()
def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    workers: int = 1,
    no_migrate: Annotated[bool, typer.Option("--no-migrate", help="Do not upgrade the schema first.")] = False,
    no_worker: Annotated[bool, typer.Option("--no-worker", help="Do not start a worker beside the app.")] = False,
) -> None:
    """Run the web app; with the embedded broker, also a worker beside it."""
    import uvicorn

    settings = _settings()
    if not no_migrate:
        migrate()
    worker_proc: subprocess.Popen[bytes] | None = None
    if settings.embedded_broker and not no_worker:
        worker_proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "worker", "--pool", "solo"])
        typer.echo(f"embedded broker: started a worker beside the app (pid {worker_proc.pid})")
    try:
        uvicorn.run(
            "app.web.main:create_app",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_config=None,
            access_log=False,
        )
    finally:
        if worker_proc is not None and worker_proc.poll() is None:
            worker_proc.send_signal(signal.SIGTERM)
            try:
                worker_proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker_proc.kill()


@cli.command()
def worker(
    concurrency: int = 1,
    pool: Annotated[str, typer.Option(help="prefork, solo or threads")] = "prefork",
    loglevel: str = "INFO",
) -> None:
    """Run a Celery worker for FrogFix jobs."""
    from app.logs import configure_logging
    from app.queue import celery_app

    settings = _settings()
    configure_logging(settings.log_level, settings.secret_values())
    import worker.tasks  # noqa: F401  (registers the tasks)

    celery_app.worker_main(
        [
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


@cli.command()
def sweep(older_than: Annotated[float, typer.Option(help="seconds; default from settings")] = -1) -> None:
    """Send again every job left queued too long (the app also does this periodically)."""
    from app.sweep import sweep_once

    due, sent = sweep_once(None if older_than < 0 else older_than)
    typer.echo(f"{due} queued job(s) due, {sent} sent")


@cli.command()
def fix(
    repo_dir: Annotated[Path, typer.Argument(help="A local git checkout.")],
    issue: Annotated[Path, typer.Option("--issue", help="A file with the issue: first line title, rest body.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Run one job on a local checkout, without a forge (local sandbox, model from settings)."""
    from worker.localfix import run_fix_command

    raise typer.Exit(run_fix_command(repo_dir, issue, json_out))


@cli.command("reap-sandboxes")
def reap_sandboxes(
    older_than: Annotated[
        float, typer.Option(help="also delete sandboxes older than this many seconds (at least the job time limit)")
    ] = -1,
) -> None:
    """Delete Kubernetes sandbox pods and network policies left past their deadline."""
    from app.settings import get_settings
    from worker.tasks import reap_sandboxes as reap

    if get_settings().sandbox != "kubernetes":
        typer.echo("FROGFIX_SANDBOX is not kubernetes: the local sandbox leaves nothing to reap")
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
def demo(json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False) -> None:
    """Fix a bug in a generated repository with a replayed model: the whole local job, no server needed."""
    from worker.localfix import run_demo_command

    raise typer.Exit(run_demo_command(json_out))


if __name__ == "__main__":
    cli()
