"""The commands that run a job here: fix, demo, replay, eval."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from app import statuses as _statuses
from worker.commands.cli.common import JOB_ARG, WIDTH, actor, cli, fail, job_errors, load_settings, wrap
from worker.commands.cli.jobs import tests_summary


@cli.command()
def fix(
    repo_dir: Annotated[Path, typer.Argument(help="A local git checkout.")],
    issue: Annotated[Path, typer.Option("--issue", help="A file with the issue: first line title, rest body.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    skip_model_check: Annotated[
        bool, typer.Option("--skip-model-check", help="Do not ask the model server for its model list first.")
    ] = False,
) -> None:
    """Run one job on a local checkout, without a forge (local sandbox, model from settings).

    The model server is asked for its model list first (doctor's check): when it cannot answer, fix
    stops in seconds with doctor's why and remedy, before anything is built or run."""
    from worker.commands.fix import run_fix_command

    raise typer.Exit(run_fix_command(repo_dir, issue, json_out, check_model=not skip_model_check))




@cli.command()
def demo(json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False) -> None:
    """Fix a bug in a generated repository with a replayed model: the whole local job, no server needed."""
    from worker.commands.fix import run_demo_command

    raise typer.Exit(run_demo_command(json_out))




def print_replay(report: Any) -> None:
    """The replay's outcome, in 80 columns."""
    from worker.commands.replay import matched_count

    lines = [f"{report.mode} of job {report.job_id} ({report.attempt_label}): {report.status.upper()}"]

    def field(label: str, value: str) -> None:
        lines.extend(wrap(value, f"  {label:<10} ", 13))

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
        from app.patches import patch_size

        replayed = patch_size(report.patch)
        field(
            "patch",
            ("identical to the recording" if report.patch_identical else "differs from the recording")
            + f": {replayed}",
        )
    for note in report.notes:
        field("note", note)
    if report.tests_after:
        field("tests", f"{report.tests_after.get('command')}: {tests_summary(report.tests_after)}")
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

    configure_logging("WARNING", load_settings().secret_values(), stream=sys.stderr)

    def progress(message: str) -> None:
        typer.echo(f"[replay {job}] {message}", err=True)

    with job_errors("replay"):
        try:
            report = replay_job(
                job,
                attempt=attempt,
                live=live,
                publish=publish,
                progress=progress,
                who=who or actor(),
                repo_dir=repo,
                recording=trajectory,
                requested=requested,
            )
        except ReplayError as exc:
            fail("replay", str(exc), 2)
    if json_out:
        typer.echo(json.dumps(report.to_dict(), ensure_ascii=False))
    else:
        print_replay(report)
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
    skip_model_check: Annotated[
        bool, typer.Option("--skip-model-check", help="Do not ask the model server for its model list first.")
    ] = False,
) -> None:
    """Re-run past jobs' tasks on a candidate model, verified like the pipeline, never published.

    Exit 0: finished, gates passed; 1: a gate failed; 2: it could not run; 3: stopped before the
    end (run it again, or with --resume ID, to finish it).
    """
    from app.jobs.evaluations import UnknownEvaluation
    from app.logs import configure_logging
    from worker.commands.evaluate import CommandOptions, EvalError, EvalOptions, ensure_schema, run_eval_command

    settings = load_settings()
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
        selector=jobs, attempts=attempts, concurrency=concurrency, who=actor(), api_key=api_key,
    )
    command = CommandOptions(json_out, out, fail_below, fail_if_lost, resume, scripted_model, model, base_url,
                             check_model=not skip_model_check)
    with job_errors("eval"):
        try:
            ensure_schema(settings)
            code, text = run_eval_command(
                options, command, lambda m: typer.echo(f"[eval] {m}", err=True), lambda: stop["asked"]
            )
        except (EvalError, UnknownEvaluation) as exc:
            fail("eval", str(exc), 2)
    typer.echo(text, nl=not text.endswith("\n"))
    raise typer.Exit(code)
