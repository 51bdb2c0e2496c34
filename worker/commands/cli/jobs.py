"""The job commands: jobs, show, cancel, retry (a forge's jobs and local ones alike)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from app import statuses as _statuses
from worker.commands.cli.common import (
    FINAL,
    JOB_ARG,
    STATUSES,
    actor,
    cli,
    dump,
    fail,
    fit,
    import_local_records,
    job_errors,
    job_number,
    load_settings,
    utc_text,
    wrap,
)


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
        fail("jobs", f"unknown status {status!r} (one of: {', '.join(STATUSES)})")
    if forge is not None and forge not in ("gitlab", "gitea", "local"):
        fail("jobs", f"unknown forge {forge!r} (gitlab, gitea or local)")
    with job_errors("jobs"):
        import_local_records()
        with session_scope() as session:
            items, total = records.list_jobs(session, records.JobFilter(status, forge, project), limit, offset)
            rows = [JobAnswer.of(job).as_json() for job in items]
    if json_out:
        dump({"items": rows, "total": total})
        return
    if not rows:
        typer.echo("no jobs match" if total == 0 else f"no jobs at offset {offset} ({total} match)")
        return
    width = max(6, *(len(str(row["id"])) for row in rows))
    typer.echo(f"{'ID':>{width}} {'STATUS':<10} {'FORGE':<6} {'ISSUE':<36} CREATED (UTC)")
    for row in rows:
        issue = fit(f"{row['project']}#{row['issue']}", 36)
        created = utc_text(row["created_at"])[:16]
        typer.echo(f"{row['id']:>{width}} {row['status']:<10} {row['forge']:<6} {issue:<36} {created}")
    typer.echo(f"jobs {offset + 1}-{offset + len(rows)} of {total}, newest first")


def _job_details(job_id: int) -> dict[str, Any]:
    """The job as `/api/jobs/{id}` answers it (app/answers.py `JobDetailAnswer`)."""
    from app.db import session_scope
    from app.jobs import read_model

    with session_scope() as session:
        return read_model.job_detail(session, job_id).as_json()


def tests_summary(tests: dict[str, Any] | None, evidence: dict[str, Any] | None = None) -> str:
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
        lines.extend(wrap(value, f"  {label:<10} ", 13))

    end = Ending.kept(d.get("ending"), d.get("error"), status=d["status"], exit_reason=d.get("exit_reason"))
    because = why(d["status"], d.get("exit_reason"), end, model_url=load_settings().model_base_url)
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
    field("created", utc_text(d.get("created_at")))
    field("started", utc_text(d.get("started_at")))
    field("finished", utc_text(d.get("finished_at")))
    lines.append("attempts" if d["attempts"] else "attempts: none")
    selection = d.get("selection") or {}
    if isinstance(selection, dict) and selection.get("why"):
        field("chosen", str(selection["why"]))
    for a in d["attempts"]:
        head = f"  {a['run']}.{a['number']:<3} {a['status']:<9} " + ("(chosen) " if a.get("chosen") else "")
        indent = " " * len(head)
        agent = "still running" if a["status"] == "running" else ending(a.get("exit_reason"), a.get("steps"))
        lines.extend(wrap(f"{agent}; tests: {tests_summary(a.get('tests'), a.get('evidence'))}", head, len(head)))
        if a.get("error"):
            lines.extend(wrap(f"error: {a['error']}", indent, len(head)))
        for flag in a.get("flags") or []:
            lines.extend(wrap(f"flag: {flag}", indent, len(head)))
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
        when = utc_text(e.get("at"))
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
    return wrap(e.get("message") or "", f"    {utc_text(e.get('at'))[11:]}  {e['kind']:<16} ", 31)


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
    with job_errors("show"):
        job_id = job_number("show", job)
        details = _job_details(job_id)
        if json_out:
            dump(details)
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

    with job_errors("cancel"):
        job_id = job_number("cancel", job)
        last = _last_event_id(job_id)
        with session_scope() as session:
            outcome = cancel_job(session, job_id, actor())
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

    with job_errors("retry"):
        job_id = job_number("retry", job)
        last = _last_event_id(job_id)
        sent = requeue_and_send(
            job_id,
            actor(),
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
