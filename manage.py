#!/usr/bin/env python3
"""FrogFix's one command line: serve, worker, migrate, sweep, fix, demo, doctor, reap-sandboxes, and the
job commands: jobs, show, cancel, retry, replay; and eval."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"  # where ./install.sh puts FrogFix's Python dependencies
_REEXEC_MARK = "FROGFIX_MANAGE_REEXEC"  # set on the re-exec, so a broken .venv cannot loop


def _missing_dependencies() -> list[str]:
    """pyproject.toml's runtime dependencies that this interpreter has no distribution of.

    Looked up by name only (no import, no version check), so the wrong interpreter is told from
    the right one in milliseconds, before anything third-party is imported."""
    import importlib.metadata
    import re

    try:
        import tomllib
    except ImportError:
        return [f"Python 3.11 or newer, not {sys.version.split()[0]}"]
    try:
        declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    except (OSError, ValueError, KeyError):
        return []  # no pyproject.toml beside manage.py to go by: let the imports decide
    missing = []
    for requirement in declared:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        if name is None:
            continue
        try:
            importlib.metadata.distribution(name.group())
        except importlib.metadata.PackageNotFoundError:
            missing.append(name.group())
    return missing


def _use_checkout_venv() -> None:
    """Run under .venv/bin/python when this interpreter lacks the dependencies and .venv exists.

    So `./manage.py` works after ./install.sh without anyone activating the environment, while
    `python manage.py` under any interpreter that has the project installed runs right there."""
    reexeced = os.environ.pop(_REEXEC_MARK, None)  # popped, so no child of ours inherits it
    missing = _missing_dependencies()
    if not missing:
        return
    venv_python = VENV / "bin" / "python"
    in_venv = Path(sys.prefix).resolve() == VENV.resolve()  # a half-finished ./install.sh: nowhere better to go
    if in_venv or reexeced or not os.access(venv_python, os.X_OK):
        names = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
        sys.exit(f"manage.py: {sys.executable} lacks FrogFix's dependencies ({names}); run ./install.sh")
    os.environ[_REEXEC_MARK] = "1"
    os.execv(venv_python, [str(venv_python), str(ROOT / "manage.py"), *sys.argv[1:]])


_use_checkout_venv()

import typer  # noqa: E402  (after the interpreter is settled)

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from app import statuses as _statuses  # noqa: E402  (standard library only: cheap at start-up)

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

    # The address first, as uvicorn will bind it: a port in use is one plain line, with nothing started.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            in_use = exc.errno == errno.EADDRINUSE
            _fail("serve", f"port {port} on {host} is in use; pass --port" if in_use
                  else f"cannot listen on {host} port {port}: {exc.strerror or exc}", 1)
    signals = _StopSignals()
    embedded: EmbeddedWorker | None = None
    try:
        settings = _settings()
        if not no_migrate:
            migrate()
            _import_local_records()
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

    settings = _settings()
    configure_logging(settings.log_level, settings.secret_values())
    if lifeline_fd >= 0:
        from worker.embedded import watch_lifeline

        try:
            watch_lifeline(lifeline_fd)
        except OSError as exc:  # not an open descriptor: say so rather than run unwatched
            _fail("worker", f"--lifeline-fd {lifeline_fd}: {exc.strerror}")
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
    from worker.commands.fix import run_fix_command

    raise typer.Exit(run_fix_command(repo_dir, issue, json_out))


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
    migrations.upgrade(_settings().resolved_database_url())
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
def demo(json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False) -> None:
    """Fix a bug in a generated repository with a replayed model: the whole local job, no server needed."""
    from worker.commands.fix import run_demo_command

    raise typer.Exit(run_demo_command(json_out))


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

    from pydantic import ValidationError

    from worker.commands.doctor import exit_code, render_text, run_doctor
    from worker.commands.doctor.results import DoctorOptions, settings_invalid

    try:
        settings = _settings()
    except ValidationError as exc:  # the first thing doctor is for: say which variable, not a traceback
        results = [settings_invalid([dict(error) for error in exc.errors()])]
    else:
        results = run_doctor(settings, DoctorOptions(min_free_bytes=int(min_free_gib * 1024**3)))
    if json_out:
        typer.echo(json.dumps([r.to_dict() for r in results], ensure_ascii=False, indent=2))
    else:
        typer.echo(render_text(results))
    raise typer.Exit(exit_code(results))


# ---------------------------------------------------------------------------------------------
# Job commands: jobs, show, cancel, retry, replay. Errors are one line on stderr: exit 2 for an
# unknown job or bad input, 1 when the job cannot make the change asked for.
# ---------------------------------------------------------------------------------------------

WIDTH = 80
STATUSES, FINAL = _statuses.STATUS_ORDER, _statuses.FINAL_STATUSES
JOB_ARG = typer.Argument(help="The job's id (a number; an imported local job's old local-... id too).")


def _fail(command: str, message: str, code: int = 2) -> NoReturn:
    first = " ".join(str(message).split())  # one line, whatever the message held
    typer.echo(f"frogfix {command}: {first[:1000]}", err=True)
    raise typer.Exit(code)


def _who() -> str:
    import getpass

    try:
        return f"{getpass.getuser()} (manage.py)"
    except Exception:  # no user name in this environment
        return "manage.py"


@contextmanager
def _job_errors(command: str) -> Iterator[None]:
    """Turn the expected failures into one line and an exit code, never a traceback."""
    from sqlalchemy.exc import SQLAlchemyError

    from app.jobs.records import UnknownJob
    from app.jobs.transitions import InvalidTransition

    try:
        yield
    except UnknownJob as exc:
        _fail(command, str(exc), 2)
    except InvalidTransition as exc:
        _fail(command, str(exc), 1)
    except SQLAlchemyError as exc:
        missing = "no such table" in str(exc) or "does not exist" in str(exc)
        hint = " (run ./manage.py migrate first?)" if missing else ""
        _fail(command, f"database error: {type(exc).__name__}{hint}", 2)


def _no_tables(exc: Exception) -> bool:
    """The database has no `jobs` table yet, in SQLite's or PostgreSQL's words (not a missing column or database)."""
    text = str(exc)
    return "no such table: jobs" in text or 'relation "jobs" does not exist' in text


def _import_local_records() -> None:
    """Older versions' local job records (app/jobs/local.py), brought into the jobs table once."""
    from app.db import session_scope
    from app.jobs import local

    with session_scope() as session:
        local.import_records(session, _settings().data_dir)


def _job_id(command: str, value: str) -> int:
    """A job's number; an imported local job's old `local-…` id names the job it became."""
    from app.db import session_scope
    from app.jobs import local
    from app.trajectory import LOCAL_ID

    text = value.strip()
    if LOCAL_ID.fullmatch(text):
        _import_local_records()
        with session_scope() as session:
            return local.by_local_id(session, text)
    if not text.lstrip("-").isdigit():
        _fail(command, f"no job with id {text[:80]!r}", 2)
    return int(text)


def _when(value: str | None, *, date: bool = True) -> str:
    """An ISO timestamp as `YYYY-MM-DD HH:MM:SS` (UTC), or `-`."""
    from datetime import UTC, datetime

    if not value:
        return "-"
    moment = datetime.fromisoformat(value).astimezone(UTC)
    return moment.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")


def _wrap(text: str, first: str, indent: int) -> list[str]:
    import textwrap

    return textwrap.wrap(
        " ".join(text.split()) or "-",
        width=WIDTH,
        initial_indent=first,
        subsequent_indent=" " * indent,
        break_long_words=False,  # a URL or path stays whole (and may run past the edge)
        break_on_hyphens=False,
    ) or [first.rstrip()]


def _fit(text: str, width: int, keep: str = "end") -> str:
    """`text` in `width` characters: a path keeps its end (the project's name), a title its start."""
    if len(text) <= width:
        return text
    return text[: width - 1] + "…" if keep == "start" else "…" + text[-(width - 1) :]


def _dump(value: Any) -> None:
    import json

    typer.echo(json.dumps(value, ensure_ascii=False, indent=2))


@cli.command("jobs")
def jobs_command(
    status: Annotated[str | None, typer.Option(help=f"one of {', '.join(STATUSES)}")] = None,
    forge: Annotated[str | None, typer.Option(help="gitlab, gitea, or local (fix and demo runs)")] = None,
    project: Annotated[
        str | None,
        typer.Option(help="the project's path with namespace, e.g. acme/calc; a local job's: its checkout's folder"),
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=5000)] = 50,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"items": [...], "total": n}, as the API.')] = False,
) -> None:
    """List jobs, newest first, filtered like the dashboard: forge jobs and local (fix, demo) jobs alike."""
    from app.answers import JobAnswer
    from app.db import session_scope
    from app.jobs import records

    if status is not None and status not in STATUSES:
        _fail("jobs", f"unknown status {status!r} (one of: {', '.join(STATUSES)})")
    if forge is not None and forge not in ("gitlab", "gitea", "local"):
        _fail("jobs", f"unknown forge {forge!r} (gitlab, gitea or local)")
    with _job_errors("jobs"):
        _import_local_records()
        with session_scope() as session:
            items, total = records.list_jobs(session, records.JobFilter(status, forge, project), limit, offset)
            rows = [JobAnswer.of(job).as_json() for job in items]
    if json_out:
        _dump({"items": rows, "total": total})
        return
    if not rows:
        typer.echo("no jobs match" if total == 0 else f"no jobs at offset {offset} ({total} match)")
        return
    width = max(6, *(len(str(row["id"])) for row in rows))
    typer.echo(f"{'ID':>{width}} {'STATUS':<10} {'FORGE':<6} {'ISSUE':<36} CREATED (UTC)")
    for row in rows:
        issue = _fit(f"{row['project']}#{row['issue']}", 36)
        created = _when(row["created_at"])[:16]
        typer.echo(f"{row['id']:>{width}} {row['status']:<10} {row['forge']:<6} {issue:<36} {created}")
    typer.echo(f"jobs {offset + 1}-{offset + len(rows)} of {total}, newest first")


def _job_details(job_id: int) -> dict[str, Any]:
    """The job as `/api/jobs/{id}` answers it (app/answers.py `JobDetailAnswer`)."""
    from app.db import session_scope
    from app.jobs import read_model

    with session_scope() as session:
        return read_model.job_detail(session, job_id).as_json()


def _tests_summary(tests: dict[str, Any] | None, evidence: dict[str, Any] | None = None) -> str:
    """The tests in plain words (app/outcome_words.py, as `fix` words them), then the evidence line naming them.
    `tests` of any stored shape is read in the one shape (app/answers.py) first."""
    from app.answers import TestsAnswer
    from app.outcome_words import tests_line

    read = TestsAnswer.read(tests)
    if read is None or not (read.command or read.before or read.after):
        return "no tests run"
    line = tests_line(read.as_json())
    verdict = evidence or (tests or {}).get("evidence")
    if isinstance(verdict, dict) and verdict.get("level"):
        from worker.attempts.evidence import Evidence, evidence_line

        line += "; " + evidence_line(Evidence.from_dict(verdict))
    return line


def _print_job(d: dict[str, Any]) -> None:
    from app.endings import Ending
    from app.outcome_words import ending, says_more, why

    status = _statuses.status_label(d["status"])
    lines = [f"job {d['id']}: {status}" + (" (cancel requested)" if d.get("cancel_requested") else "")]

    def field(label: str, value: str) -> None:
        lines.extend(_wrap(value, f"  {label:<10} ", 13))

    end = Ending.kept(d.get("ending"), d.get("error"), status=d["status"], exit_reason=d.get("exit_reason"))
    because = why(d["status"], d.get("exit_reason"), end, model_url=_settings().model_base_url)
    if because:
        field("why", because)

    field("issue", f"{d['project']}#{d['issue']} on {d['forge']}: {d.get('title') or '(no title)'}")
    if d.get("issue_url"):
        lines.append(f"  {'':<10} {d['issue_url']}")
    field("trigger", d.get("trigger_user") or "-")
    if d.get("base_commit"):
        field("base", f"{d['base_commit'][:12]}, branch {d.get('branch') or '-'}")
    field("MR", d.get("mr_url") or "none")
    if d["status"] in _statuses.ACTIVE_STATUSES and d.get("run"):
        field("agent", f"{d.get('steps') or 0} steps so far; runs {d.get('run') or 0}")
    elif d.get("exit_reason") or d.get("run"):
        field("agent", f"{ending(d.get('exit_reason'), d.get('steps'))}; runs {d.get('run') or 0}")
    else:
        field("agent", "has not run")
    if says_more(d.get("error"), because):  # the raw text, where the why line did not already say it all
        field("error", d["error"])
    if d.get("hold_reason") and d["status"] == _statuses.JobStatus.queued:
        field("waiting", d["hold_reason"])
    for flag in d.get("flags") or []:
        field("flag", flag)
    field("created", _when(d.get("created_at")))
    field("started", _when(d.get("started_at")))
    field("finished", _when(d.get("finished_at")))
    lines.append("attempts" if d["attempts"] else "attempts: none")
    selection = d.get("selection") or {}
    if isinstance(selection, dict) and selection.get("why"):
        field("chosen", str(selection["why"]))
    for a in d["attempts"]:
        head = f"  {a['run']}.{a['number']:<3} {a['status']:<9} " + ("(chosen) " if a.get("chosen") else "")
        indent = " " * len(head)
        agent = "still running" if a["status"] == "running" else ending(a.get("exit_reason"), a.get("steps"))
        lines.extend(_wrap(f"{agent}; tests: {_tests_summary(a.get('tests'), a.get('evidence'))}", head, len(head)))
        if a.get("error"):
            lines.extend(_wrap(f"error: {a['error']}", indent, len(head)))
        for flag in a.get("flags") or []:
            lines.extend(_wrap(f"flag: {flag}", indent, len(head)))
        if a.get("trajectory_path"):
            lines.append(f"{indent}{_trajectory_shown(a['trajectory_path'])}")
    lines.extend(_usage_lines(d))
    lines.extend(_timeline_lines(d["events"]))
    typer.echo("\n".join(lines))


def _timeline_lines(events: list[dict[str, Any]]) -> list[str]:
    """A job's timeline, a heading per UTC day: forge and local jobs alike."""
    lines = ["timeline (UTC)"]
    day = None
    for e in events:
        when = _when(e.get("at"))
        if when[:10] != day:
            day = when[:10]
            lines.append(f"  {day}")
        lines.extend(_event_lines(e))
    return lines


def _usage_lines(d: dict[str, Any]) -> list[str]:
    """The job's usage table: one row per attempt, then the job's sums, then its queue waits."""
    from app.usage import UsageFigures, usage_table

    rows = [(f"{a['run']}.{a['number']}", UsageFigures.from_dict(a.get("usage"))) for a in d["attempts"]]
    rows.append(("job", UsageFigures.from_dict(d.get("usage"))))
    wait, total = d.get("queue_wait_seconds"), d.get("queue_wait_total_seconds")
    queued = (
        f"  queue wait {wait:.1f} s before the latest claim, {total or 0.0:.1f} s over all runs"
        if isinstance(wait, int | float) else ""
    )
    return ["usage", *("  " + line for line in usage_table(rows).splitlines()), *([queued] if queued else [])]


def _trajectory_shown(stored: str) -> str:
    """Where an attempt's trajectory is on this machine (jobs store it relative to the data folder)."""
    from app import trajectory
    from app.settings import get_settings

    try:
        return str(trajectory.resolve(get_settings().data_dir, stored))
    except trajectory.TrajectoryError as exc:  # refused: say why rather than print a path not to open
        return str(exc)


def _event_lines(e: dict[str, Any]) -> list[str]:
    """One event: time of day, kind, and its message wrapped to the right of them."""
    return _wrap(e.get("message") or "", f"    {_when(e.get('at'))[11:]}  {e['kind']:<16} ", 31)


def _follow(command: str, job_id: int, seen: int, timeout: float) -> str:
    """Print the job's new timeline events as they come, until it is final (or `timeout` passes)."""
    import time

    from app.answers import EventAnswer
    from app.db import session_scope
    from app.jobs import records

    deadline = time.monotonic() + timeout
    while True:
        with session_scope() as session:
            status = records.get_job(session, job_id).status
            new = [e for e in records.job_events(session, job_id) if e.id > seen]
            events = [EventAnswer.model_validate(e).as_json() for e in new]
        for e in events:
            typer.echo("\n".join(_event_lines(e)), err=True)
            seen = e["id"]
        if status in FINAL:
            return status
        if time.monotonic() >= deadline:
            typer.echo(f"frogfix {command}: job {job_id} is still {status}; stopped following", err=True)
            return status
        time.sleep(1.0)


def _last_event_id(job_id: int) -> int:
    from app.db import session_scope
    from app.jobs import records

    with session_scope() as session:
        events = records.job_events(session, job_id)
    return events[-1].id if events else 0


@cli.command()
def show(
    job: Annotated[str, JOB_ARG],
    json_out: Annotated[bool, typer.Option("--json", help="Print the job, its attempts and events as JSON.")] = False,
    follow: Annotated[
        bool, typer.Option("--follow", help="Then print new timeline events until it ends.")
    ] = False,
) -> None:
    """A job's fields, attempts and timeline, with its outcome and MR link."""
    with _job_errors("show"):
        job_id = _job_id("show", job)
        details = _job_details(job_id)
        if json_out:
            _dump(details)
        else:
            _print_job(details)
        if follow and details["status"] not in FINAL:
            last = details["events"][-1]["id"] if details["events"] else 0
            _follow("show", job_id, last, timeout=24 * 3600)


@cli.command()
def cancel(
    job: Annotated[str, JOB_ARG],
    wait: Annotated[bool, typer.Option("--wait", help="Wait until a running job has stopped.")] = False,
    timeout: Annotated[float, typer.Option(help="seconds --wait waits at most")] = 600,
) -> None:
    """Cancel a job: a queued one ends now, a running one stops at its next check; a publishing one is past stopping."""
    from app.db import session_scope
    from app.jobs.transitions import TOO_LATE, cancel_job

    with _job_errors("cancel"):
        job_id = _job_id("cancel", job)
        last = _last_event_id(job_id)
        with session_scope() as session:
            outcome = cancel_job(session, job_id, _who())
        if outcome == "cancelled":
            typer.echo(f"job {job_id} cancelled")
            return
        if outcome == "too_late":
            typer.echo(f"job {job_id} not cancelled: {TOO_LATE}", err=True)
            raise typer.Exit(1)
        typer.echo(f"job {job_id}: asked the worker to stop at its next check")
        if wait:
            status = _follow("cancel", job_id, last, timeout)
            typer.echo(f"job {job_id} is {status}")
            if status not in FINAL:
                raise typer.Exit(1)


@cli.command()
def retry(
    job: Annotated[str, JOB_ARG],
    follow: Annotated[bool, typer.Option("--follow", help="Then print its timeline until it ends.")] = False,
    timeout: Annotated[float, typer.Option(help="seconds --follow follows at most")] = 24 * 3600,
) -> None:
    """Queue a failed, no_fix, cancelled or rejected job again, as a new run of the same job."""
    from app.jobs.requeue import requeue_and_send

    with _job_errors("retry"):
        job_id = _job_id("retry", job)
        last = _last_event_id(job_id)
        sent = requeue_and_send(
            job_id,
            _who(),
            committed=lambda: typer.echo(f"job {job_id} is queued again; sending it to the workers…", err=True),
        )
        if sent:
            typer.echo(f"job {job_id} queued again and sent to the workers")
        else:
            typer.echo(
                f"job {job_id} queued again; the broker is unreachable, so the sweep will send it when it is back"
            )
        if follow:
            status = _follow("retry", job_id, last, timeout)
            typer.echo(f"job {job_id} is {status}")


def _print_replay(report: Any) -> None:
    """The replay's outcome, in 80 columns."""
    from worker.commands.replay import matched_count

    lines = [f"{report.mode} of job {report.job_id} ({report.attempt_label}): {report.status.upper()}"]

    def field(label: str, value: str) -> None:
        lines.extend(_wrap(value, f"  {label:<10} ", 13))

    if report.mode == "queued":
        field("result", report.message)
        typer.echo("\n".join(lines))
        return
    field("result", report.message)
    field("base", (report.base_commit or "-")[:12])
    field(
        "steps",
        f"{report.steps_replayed} replayed of {report.steps_recorded} recorded; "
        f"{matched_count(report.tool_results_checked)}"
        if report.mode == "replay"
        else f"{report.steps_replayed}",
    )
    exit_text = f"{report.exit_reason}"
    if report.divergence is not None and report.exit_reason == _statuses.ExitReason.cancelled:
        exit_text = "stopped at the divergence"
    if report.mode == "replay":
        exit_text += f" (recorded: {report.recorded_exit_reason})"
        if report.reached_recording_end:
            exit_text += "; stopped where the recording ends"
    field("exit", exit_text)
    if report.error:
        field("error", report.error)
    d = report.divergence
    if d is not None:
        where = f"step {d.step}" + (f", {d.tool} call {d.call_id}" if d.call_id else "")
        field("diverged", f"{where}: {d.reason}" + (f" (output line {d.line})" if d.line and d.call_id else ""))
        if d.call_id:
            for label, text in (("expected", d.expected), ("actual", d.actual)):
                lines.append(f"  {label}:")
                for line in (text or "(empty)").splitlines()[:12] or ["(empty)"]:
                    lines.append("    " + (line if len(line) <= WIDTH - 4 else line[: WIDTH - 5] + "…"))
    if report.patch_identical is None:
        field("patch", "the recording holds no patch to compare")
    else:
        replayed = f"{len(report.patch.splitlines())} lines" if report.patch else "empty"
        field(
            "patch",
            ("identical to the recording" if report.patch_identical else "differs from the recording")
            + f" ({replayed})",
        )
    for note in report.notes:
        field("note", note)
    if report.tests_after:
        field("tests", f"{report.tests_after.get('command')}: {_tests_summary(report.tests_after)}")
    lines.append(f"  {'recorded':<10} {report.recorded_trajectory}")
    lines.append(f"  {'trajectory':<10} {report.trajectory}")
    typer.echo("\n".join(lines))


@cli.command()
def replay(
    job: Annotated[str, JOB_ARG],
    attempt: Annotated[
        str | None, typer.Option(help="N (attempt N of the latest run that has it) or RUN.N; default: the last")
    ] = None,
    live: Annotated[
        bool, typer.Option("--live", help="Run the task again with the live model, as a new unpublished attempt.")
    ] = False,
    publish: Annotated[
        bool, typer.Option("--publish", help="With --live: queue a new run that updates the job's MR.")
    ] = False,
    repo: Annotated[Path | None, typer.Option(help="Local jobs: where the checkout lives now, if it moved.")] = None,
    trajectory: Annotated[
        str | None,
        typer.Option(help="Replay this live or eval attempt's trajectory (as the eval report lists it) instead."),
    ] = None,
    who: Annotated[str | None, typer.Option(hidden=True)] = None,
    requested: Annotated[
        bool, typer.Option("--requested", hidden=True, help="The dashboard noted the request on the timeline.")
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    """Re-run a job's recorded model replies in a fresh sandbox and check every tool result.

    Exit 0: reproduced (every tool result matched, same patch); 1: it diverged or the patch
    differs; 2: the replay could not run (unknown job, no recording, repository gone). A plain
    replay never publishes anything, and a call refused before it starts (no such attempt, nothing
    to replay) leaves the job's timeline as it was.
    """
    import json

    from app.logs import configure_logging
    from worker.commands.replay import ReplayError, replay_job

    configure_logging("WARNING", _settings().secret_values(), stream=sys.stderr)

    def progress(message: str) -> None:
        typer.echo(f"[replay {job}] {message}", err=True)

    with _job_errors("replay"):
        try:
            report = replay_job(
                job,
                attempt=attempt,
                live=live,
                publish=publish,
                progress=progress,
                who=who or _who(),
                repo_dir=repo,
                recording=trajectory,
                requested=requested,
            )
        except ReplayError as exc:
            _fail("replay", str(exc), 2)
    if json_out:
        typer.echo(json.dumps(report.to_dict(), ensure_ascii=False))
    else:
        _print_replay(report)
    raise typer.Exit(report.exit_code)


@cli.command("eval")
def eval_command(
    model: Annotated[str | None, typer.Option(help="The candidate model's name (default: FROGFIX_MODEL_NAME).")] = None,
    base_url: Annotated[
        str | None, typer.Option("--base-url", help="Its OpenAI-compatible URL (default: FROGFIX_MODEL_BASE_URL).")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            help="The candidate server's key (default: FROGFIX_EVAL_API_KEY, or none; prefer the env var, a "
            "flag shows in `ps`). FROGFIX_MODEL_API_KEY is sent only when --base-url is the production URL.",
        ),
    ] = None,
    jobs: Annotated[
        str, typer.Option("--jobs", help="Which past jobs: ids, project=PATH, status=S, since=DATE, until=DATE.")
    ] = "",
    attempts: Annotated[int, typer.Option(help="K: attempts per task (pass@1..K).")] = 1,
    concurrency: Annotated[int, typer.Option(help="Attempts at once (each still waits for a free model slot).")] = 1,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
    out: Annotated[
        Path | None,
        typer.Option(help="Also write three reports into this folder: report.md, report.json and report.html "
                     "(the dashboard's page, standalone)."),
    ] = None,
    fail_below: Annotated[
        float | None, typer.Option("--fail-below", help="Exit 1 when the solve rate is below this (0..1).")
    ] = None,
    fail_if_lost: Annotated[
        int | None, typer.Option("--fail-if-lost", help="Exit 1 when this many tasks or more are lost.")
    ] = None,
    resume: Annotated[
        int | None,
        typer.Option(help="Resume evaluation ID, or report it again once finished (the same command again "
                     "resumes an unfinished one; a finished one makes it start a new evaluation)."),
    ] = None,
    scripted_model: Annotated[
        str | None, typer.Option("--scripted-model", help="demo: the demo's recorded replies, no model server.")
    ] = None,
) -> None:
    """Re-run past jobs' tasks on a candidate model, verified like the pipeline, never published.

    Exit 0: finished, gates passed; 1: a gate failed; 2: it could not run; 3: stopped before the
    end (run it again, or with --resume ID, to finish it).
    """
    from app.jobs.evaluations import UnknownEvaluation
    from app.logs import configure_logging
    from worker.commands.evaluate import CommandOptions, EvalError, EvalOptions, ensure_schema, run_eval_command

    settings = _settings()
    configure_logging("WARNING", settings.secret_values(), stream=sys.stderr)
    stop = {"asked": False}

    def ask_stop(signum: int, frame: object) -> None:
        if stop["asked"]:
            os._exit(128 + signum)
        stop["asked"] = True
        typer.echo("frogfix eval: stopping after the attempts now running (again to quit at once)", err=True)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, ask_stop)
    options = EvalOptions(
        model=model or (f"scripted:{scripted_model}" if scripted_model else settings.model_name),
        base_url=base_url or ("" if scripted_model else settings.model_base_url),
        selector=jobs, attempts=attempts, concurrency=concurrency, who=_who(), api_key=api_key,
    )
    command = CommandOptions(json_out, out, fail_below, fail_if_lost, resume, scripted_model, model, base_url)
    with _job_errors("eval"):
        try:
            ensure_schema(settings)
            code, text = run_eval_command(
                options, command, lambda m: typer.echo(f"[eval] {m}", err=True), lambda: stop["asked"]
            )
        except (EvalError, UnknownEvaluation) as exc:
            _fail("eval", str(exc), 2)
    typer.echo(text, nl=not text.endswith("\n"))
    raise typer.Exit(code)


if __name__ == "__main__":
    cli()
