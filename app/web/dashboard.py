"""The operators' dashboard under `/`: sign-in, overview, job list, job page, cancel/retry/replay.

Server-rendered with Jinja2; the only script is our own static/app.js (live updates by polling),
and every page works without it. Sign-in and CSRF are enforced by app/web/security.py before a
request reaches these routes; the routes read the operator from `request.state`.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool

from app import auth, statuses
from app.attestations import store as attestations
from app.db import session_scope
from app.jobs import evaluations, local, read_model, records
from app.jobs.requeue import requeue_and_send
from app.jobs.transitions import TOO_LATE, InvalidTransition, cancel_job
from app.logs import get_logger
from app.models import utcnow
from app.patches import patch_size
from app.queue import send_replay_job
from app.settings import get_settings
from app.statuses import ACTIVE_STATUSES, FINAL_STATUSES, RETRYABLE_STATUSES, STATUS_ORDER, JobStatus
from app.trajectory import LOCAL_ID, TrajectoryError, TrajectoryMissing
from app.usage import UsageFigures
from app.web import views
from app.web.params import (
    NO_NUL,
    AttemptId,
    EvaluationId,
    JobId,
    JobRef,
    Offset,
    ProjectFilter,
    path_job_id,
)
from app.web.security import clear_cookie_header, safe_next, session_cookie_header

HERE = Path(__file__).resolve().parent
router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters.update(
    time=views.fmt_time,
    ago=views.fmt_ago,
    duration=views.fmt_duration,
    status_label=statuses.status_label,
    exit_label=statuses.exit_label,
    http_url=views.http_url,
    short_sha=views.short_sha,
    mr_ref=views.mr_ref,
    patch_size=patch_size,
    path_breaks=views.path_breaks,
)
templates.env.globals.update(STATUS_ORDER=STATUS_ORDER, ACTIVE=ACTIVE_STATUSES, FINAL=FINAL_STATUSES)
log = get_logger("frogfix.dashboard")
# Failed sign-ins: 10 per username from one address, and 100 per username from anywhere, in 5 minutes.
# Keyed on the pair so that, behind a reverse proxy (one address for everyone), one person guessing
# cannot lock all operators out.
throttle = auth.LoginThrottle(limit=10, window=300)
user_throttle = auth.LoginThrottle(limit=100, window=300)

PAGE_SIZE = 50
LIVE_POLL_MS = 2000
LIST_POLL_MS = 5000
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
MODEL_SLOTS_HELP = "jobs in status running: each holds one model slot while its agent works"
SANDBOX_HELP = "attempts in status running, of jobs that are still active: each has a sandbox open"


def _render(request: Request, name: str, context: dict[str, Any], status: int = 200) -> HTMLResponse:
    """Render a page with what every page needs, and headers that keep it in its own frame and origin."""
    flash = _take_flash(request)
    base = {
        "operator": getattr(request.state, "operator", None),
        "csrf_token": getattr(request.state, "csrf_token", ""),
        "flash": flash,
        "now": datetime.now(UTC),
        "path": request.url.path,
    }
    response = templates.TemplateResponse(request, name, {**base, **context}, status_code=status)
    response.headers["content-security-policy"] = CSP
    response.headers["x-content-type-options"] = "nosniff"
    response.headers["x-frame-options"] = "DENY"
    response.headers["referrer-policy"] = "same-origin"
    response.headers["cache-control"] = "no-store"
    if flash is not None:
        response.headers.append("set-cookie", clear_cookie_header(auth.FLASH_COOKIE))
    return response


def wants_page(request: Request) -> bool:
    """A browser asking for a dashboard page (not the API, a webhook, a JSON file or the progress poll)."""
    path = request.url.path
    return (
        request.method in ("GET", "HEAD")
        and "text/html" in request.headers.get("accept", "")
        and not path.startswith(("/api/", "/webhooks/"))
        and not path.endswith((".json", "/progress"))
    )


def not_found(request: Request, message: str, status: int = 404, heading: str = "Not found") -> HTMLResponse:
    return _render(request, "not_found.html", {"message": message, "heading": heading}, status=status)


def _key() -> bytes:
    return auth.secret_key(get_settings())


def _redirect_with_flash(url: str, message: str, kind: str = "ok") -> RedirectResponse:
    """After an action: back to a page, with a one-time message in a signed cookie (not in the URL)."""
    response = RedirectResponse(url, status_code=303)
    value = auth.sign(_key(), "flash", {"m": message[:500], "k": kind, "t": int(time.time())})
    response.headers.append("set-cookie", f"{auth.FLASH_COOKIE}={value}; Path=/; Max-Age=60; HttpOnly; SameSite=Lax")
    return response


def _take_flash(request: Request) -> dict[str, str] | None:
    data = auth.unsign(_key(), "flash", request.cookies.get(auth.FLASH_COOKIE))
    if not data or not isinstance(data.get("t"), int) or time.time() - int(str(data["t"])) > 60:
        return None
    return {"message": str(data.get("m", "")), "kind": "error" if data.get("k") == "error" else "ok"}


def _who(request: Request) -> str:
    operator = getattr(request.state, "operator", None)
    return f"{operator} (dashboard)" if operator else "an operator (dashboard)"


# -- sign-in ------------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/") -> Response:
    if getattr(request.state, "operator", None):
        return RedirectResponse(safe_next(next), status_code=303)
    return _render(request, "login.html", {"next": safe_next(next), "error": None, "username": ""})


@router.post("/login", response_class=HTMLResponse)
def login(
    request: Request,
    username: Annotated[str, Form(max_length=200)] = "",
    password: Annotated[str, Form(max_length=auth.MAX_PASSWORD_LENGTH + 1)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    username = username.strip()
    client = request.client.host if request.client else "unknown"
    pair, user_key = f"{username.casefold()}|{client}", username.casefold()
    target = safe_next(next)
    if throttle.blocked(pair) or user_throttle.blocked(user_key):
        log.warning("sign_in_throttled", username=username[:64], client=client)
        context = {"next": target, "error": "Too many failed sign-ins; wait a few minutes.", "username": username}
        return _render(request, "login.html", context, status=429)
    with session_scope() as session:
        operator = auth.verify_operator(session, username, password)
        fingerprint = auth.password_fingerprint(_key(), operator.password_hash) if operator else ""
    if operator is None:
        throttle.failed(pair)
        user_throttle.failed(user_key)
        log.info("sign_in_failed", username=username[:64], client=client)
        context = {"next": target, "error": "Wrong username or password.", "username": username}
        return _render(request, "login.html", context, status=401)
    throttle.succeeded(pair)
    log.info("sign_in", username=username, client=client)
    settings = get_settings()
    fresh = auth.new_session(username, "password", fingerprint)  # a new id: no session fixation
    response = RedirectResponse(target, status_code=303)
    value = auth.encode_session(_key(), fresh)
    response.headers.append("set-cookie", session_cookie_header(request, value, settings.session_max_age_seconds))
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    response = RedirectResponse("/login", status_code=303)
    response.headers.append("set-cookie", clear_cookie_header(auth.SESSION_COOKIE))
    return response


# -- overview and list --------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
def overview(request: Request) -> Response:
    with session_scope() as session:
        data = read_model.dashboard_overview(session)
        recent = read_model.dashboard_jobs(session, records.JobFilter(), limit=8)
    total = sum(data.by_status.values())
    context = {
        "o": data,
        "total": total,
        "chart": views.jobs_per_day_svg(data.per_day),
        "series": views.CHART_SERIES,
        "recent": recent.rows,
        "model_slots_help": MODEL_SLOTS_HELP,
        "sandbox_help": SANDBOX_HELP,
        "poll_ms": LIST_POLL_MS,
        "job_seconds": views.job_seconds,
    }
    return _render(request, "overview.html", context)


UsageDays = Annotated[int, Query(ge=1, le=366)]


@router.get("/usage", response_class=HTMLResponse)
def usage_page(
    request: Request, days: UsageDays = 14, project: ProjectFilter = None,
    forge: Annotated[str | None, Query(max_length=16)] = None,
) -> Response:
    """Tokens, cached share, model hours, jobs and outcomes per (forge, project) and per day, with a chart.

    A project is (forge, path), as budgets key it, so a row and its link name the forge too.
    """
    project = (project or "").strip() or None
    forge = forge if forge in ("gitlab", "gitea") else None
    with session_scope() as session:
        report = read_model.usage_report(session, days=days, project=project, forge=forge)
    context = {
        "r": report,
        "days": days,
        "project": project,
        "forge": forge,
        "chart": views.tokens_per_day_svg(report.per_day),
        "series": views.TOKEN_SERIES,
    }
    return _render(request, "usage.html", context)


def evaluation_report_html(report: dict[str, Any]) -> str:
    """`manage.py eval --out`'s report.html: the evaluation page's own report template, as one standalone file."""
    return templates.env.get_template("evaluation_file.html").render(r=report)


@router.get("/evaluations", response_class=HTMLResponse)
def evaluations_page(request: Request) -> Response:
    """Past `manage.py eval` runs, newest first."""
    with session_scope() as session:
        rows = [
            ({"id": e.id, "model": e.model, "created_at": e.created_at, "status": e.status, "tasks": e.tasks,
              "attempts": e.attempts, "selector": e.selector}, done, solved)
            for e, done, solved in evaluations.list_evaluations(session)
        ]
        comparisons = evaluations.list_comparisons(session)
    return _render(request, "evaluations.html", {"rows": rows, "comparisons": comparisons})


@router.get("/evaluations/{evaluation_id}", response_class=HTMLResponse)
def evaluation_page(request: Request, evaluation_id: EvaluationId) -> Response:
    """One evaluation's report: the overall figures beside the recorded run's, and a row per task."""
    with session_scope() as session:
        try:
            report = evaluations.report_of(session, evaluation_id)
        except evaluations.UnknownEvaluation as exc:
            return not_found(request, str(exc))
    return _render(request, "evaluation.html", {"r": report})


def _cursor(value: str | None) -> tuple[datetime, int] | None:
    """`<microseconds since the epoch>_<id>`: exact, short, and opaque enough for a URL."""
    if not value:
        return None
    try:
        micros, job_id = value.split("_", 1)
        return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(micros)), int(job_id)
    except (ValueError, OverflowError) as exc:
        raise HTTPException(400, "bad page cursor") from exc


def _cursor_text(cursor: tuple[datetime, int] | None) -> str | None:
    if cursor is None:
        return None
    at = cursor[0]
    assert at is not None
    delta = at - datetime(1970, 1, 1, tzinfo=UTC)
    return f"{delta // timedelta(microseconds=1)}_{cursor[1]}"


@router.get("/jobs", response_class=HTMLResponse)
def job_list(
    request: Request,
    status: Annotated[str | None, Query(max_length=16)] = None,
    forge: Annotated[str | None, Query(max_length=16)] = None,
    project: ProjectFilter = None,
    q: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
    older: Annotated[str | None, Query(max_length=64, pattern=NO_NUL)] = None,
    newer: Annotated[str | None, Query(max_length=64, pattern=NO_NUL)] = None,
) -> Response:
    status = status if status in STATUS_ORDER else None
    forge = forge if forge in ("gitlab", "gitea", "local") else None
    project = (project or "").strip() or None
    q = (q or "").strip() or None
    with session_scope() as session:
        page = read_model.dashboard_jobs(
            session, records.JobFilter(status, forge, project), q, older_than=_cursor(older),
            newer_than=_cursor(newer), limit=PAGE_SIZE,
        )
    filters = {k: v for k, v in {"status": status, "forge": forge, "project": project, "q": q}.items() if v}
    first_page = older is None and newer is None
    context = {
        "page": page,
        "page_size": PAGE_SIZE,
        "trigger_label": get_settings().trigger_label,
        "filters": filters,
        "older": _cursor_text(page.older),
        "newer": _cursor_text(page.newer),
        "first_page": first_page,
        "search_window": read_model.SEARCH_WINDOW,
        "poll_ms": LIST_POLL_MS,
        "job_seconds": views.job_seconds,
    }
    return _render(request, "jobs.html", context)


# -- one job ------------------------------------------------------------------------------------


def _attempt_view(attempt: Any, data_dir: Path) -> dict[str, Any]:
    command, runs, flaky = views.test_logs(attempt.tests)
    trajectory_meta: dict[str, Any] = {}
    problem = None
    readable = bool(attempt.trajectory_path)
    if attempt.trajectory_path:
        try:
            trajectory_meta = views.load_trajectory(attempt.trajectory_path, data_dir).meta
        except (views.TrajectoryUnavailable, OSError) as exc:
            readable = False
            # A running attempt writes its file after its first step; before that, nothing is wrong. A finished
            # one with no step never reached the agent (its environment or tests stopped it): there is no file.
            missing = isinstance(exc, TrajectoryMissing | FileNotFoundError)
            running = attempt.status == statuses.AttemptStatus.running
            if missing and running:
                problem = "no step saved yet"
            elif missing and not attempt.steps:
                problem = "no trajectory: the attempt ended before the agent ran"
            else:
                problem = str(exc)
    return {
        "trajectory": readable or attempt.status == statuses.AttemptStatus.running,
        "a": attempt,
        "diff": views.parse_diff(attempt.patch),
        "test_command": command,
        "test_runs": runs,
        "flaky": flaky,
        "evidence": views.evidence_of(attempt.tests),
        "meta": trajectory_meta,
        "guidance": views.repository_guidance(trajectory_meta),
        "trajectory_problem": problem,
    }


@router.get("/jobs/{job_ref}", response_class=HTMLResponse)
def job_page(request: Request, job_ref: JobRef) -> Response:
    """A job (a number; an imported local job also by its old `local-…` id); anything else is not found."""
    job_id = job_number(job_ref)
    if job_id is None:
        return not_found(request, f"no job {job_ref[:80]!r}")
    settings = get_settings()
    with session_scope() as session:
        try:
            job = records.get_job(session, job_id)
        except records.UnknownJob as exc:
            return not_found(request, str(exc))
        events = records.job_events(session, job_id)
        attempts = records.job_attempts(session, job_id)
        thread = read_model.job_thread(session, job)
    views_ = [_attempt_view(a, settings.data_dir) for a in attempts]
    current = views.current_run_events(events)
    context = {
        **_job_context(job, events, views_),
        "thread": thread,
        "active": job.status in ACTIVE_STATUSES,
        "retryable": job.status in RETRYABLE_STATUSES,
        # A recording with no step has nothing to replay (replay refuses it): an attempt the agent never reached.
        "can_replay": job.status not in ACTIVE_STATUSES and any(a.trajectory_path and a.steps for a in attempts),
        "stages": _stages(job.status, [e.kind for e in current]),
        "live_state": live_state(job, attempts[-1] if attempts else None, len(attempts)),
        "usage_rows": [(f"attempt {a.number} of run {a.run}", UsageFigures.of(a)) for a in attempts],
        "usage": job.usage,
        "attested": bool(attestations.records(settings.data_dir, job_id)),  # a local job's signed patch too
    }
    return _render(request, "job.html", context)


def _job_context(job: Any, events: list[Any], views_: list[dict[str, Any]]) -> dict[str, Any]:
    """What the job page shows of any job, forge or local."""
    verified = statuses.AttemptStatus.verified
    shown = next((v for v in views_ if v["a"].chosen), None) or next(
        (v for v in reversed(views_) if v["a"].status == verified), views_[-1] if views_ else None
    )
    return {
        "job": job,
        "events": events,
        "attempts": views_,
        "shown": shown,
        "selection": views.selection_of(job.selection),
        "provenance": _provenance(job, shown),
        "seconds": views.job_seconds(job.started_at, job.finished_at),
        "poll_ms": LIVE_POLL_MS,
        "last_event_id": events[-1].id if events else 0,
        "why": views.why_line(job),
        "environment_log": views.environment_log(events),
        "thread": None,
        "active": False,
        "retryable": False,
        "can_replay": False,
    }


def live_state(job: Any, latest: Any, attempts: int) -> str:
    """Changes whenever the server-rendered parts of the job page would: the page then re-fetches them."""
    attempt = f"{latest.number}/{latest.run}:{latest.status}" if latest is not None else "-"
    return f"{job.status}|{attempts}|{attempt}|{int(bool(job.cancel_requested))}|{job.mr_url or ''}"


# The stages of the strip and the events that show a run reached each (the job's status counts too).
JOB_STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("queued", ()),
    ("admitted", ("admitted",)),
    ("prepared", ("prepared",)),
    ("agent", ("agent_started",)),
    ("verifying", ("verifying", "verified", "not_verified")),
    ("publishing", ("pushing", "pushed")),
)


def _stages(status: str, kinds: list[str]) -> list[tuple[str, str]]:
    """The strip's stages with a state each: done, current, todo, skipped (a finished job never reached
    it) or the final status. `kinds` are the current run's events, so a retry starts the strip again."""
    seen = set(kinds)
    reached = [bool(set(events) & seen) for _name, events in JOB_STAGES]
    names = [name for name, _events in JOB_STAGES]
    reached[0] = True  # a job is queued (or, a local one, claimed) from its start; its status may run ahead
    if status in (JobStatus.verifying, JobStatus.publishing, JobStatus.done):
        reached[names.index("verifying")] = True
    if status in (JobStatus.publishing, JobStatus.done):
        reached[names.index("publishing")] = True
    final = status in FINAL_STATUSES
    last = max((i for i, hit in enumerate(reached) if hit), default=0)
    out = []
    for i, name in enumerate(names):
        if reached[i]:
            out.append((name, "current" if i == last and not final else "done"))
        elif final:
            out.append((name, "skipped"))
        else:
            out.append((name, "todo"))
    out.append((status, _final_state(status)) if final else ("finished", "todo"))
    return out


def _final_state(status: str) -> str:
    """The last chip's colour, as the status badge has it: a fix, no fix (or an unproven one), a failure."""
    if status in (JobStatus.done, statuses.FixStatus.fixed):
        return "done"
    if status in (JobStatus.no_fix, statuses.FixStatus.unproven, JobStatus.cancelled):
        return "ended"
    return "failed"


def _provenance(job: Any, shown: dict[str, Any] | None) -> list[tuple[str, str]]:
    meta = shown["meta"] if shown else {}
    sampling = meta.get("sampling") or {}
    rows = [
        ("forge", job.forge),
        ("project", job.project),
        ("issue", f"#{job.issue}" if job.issue else "—"),
        ("triggered by", job.trigger_user or "—"),
        ("webhook delivery", job.delivery_id or "—"),
        ("base commit", job.base_commit or meta.get("base_commit") or "—"),
        ("branch", job.branch or "—"),
        ("model", str(meta.get("model") or "—")),
        ("sampling", ", ".join(f"{k}={v}" for k, v in sampling.items()) if isinstance(sampling, dict) and sampling
         else "—"),
        ("harness", str(meta.get("harness_version") or "—")),
        ("attempt shown", f"{shown['a'].number} of run {shown['a'].run}" if shown else "—"),
        ("runs of this job", str(job.run)),
    ]
    return rows


@router.get("/jobs/{job_id}/progress")
def job_progress(job_id: JobId, after: Offset = 0) -> JSONResponse:
    """What the job page polls while the job is active: status, steps, the newest step, new events."""
    settings = get_settings()
    with session_scope() as session:
        try:
            job = records.get_job(session, job_id)
        except records.UnknownJob as exc:
            raise HTTPException(404, str(exc)) from exc
        events = records.events_after(session, job_id, after)
        attempt = records.latest_attempt(session, job_id)
        attempts = read_model.attempt_counts(session, [job_id]).get(job_id, 0)
    step = None
    if attempt is not None and attempt.status == statuses.AttemptStatus.running and attempt.trajectory_path:
        try:
            step = views.current_step(views.load_trajectory(attempt.trajectory_path, settings.data_dir))
        except (views.TrajectoryUnavailable, OSError):
            step = None
    seconds = views.job_seconds(job.started_at, job.finished_at)
    body = {
        "id": job.id,
        "state": live_state(job, attempt, attempts),
        "status": job.status,
        "status_label": statuses.status_label(job.status),
        "active": job.status in ACTIVE_STATUSES,
        "steps": job.steps,
        "cancel_requested": job.cancel_requested,
        "duration": views.fmt_duration(seconds),
        "attempt": None
        if attempt is None
        else {
            "id": attempt.id, "number": attempt.number, "run": attempt.run, "status": attempt.status,
            "steps": attempt.steps,
        },
        "current_step": step,
        "mr_url": job.mr_url,
        "events": [
            {"id": e.id, "at": views.fmt_time(e.at), "kind": e.kind, "message": e.message} for e in events
        ],
    }
    return JSONResponse(body, headers={"cache-control": "no-store"})


@router.get("/jobs/{job_ref}/attempts/{attempt_id}/trajectory", response_class=HTMLResponse)
def trajectory_page(request: Request, job_ref: JobRef, attempt_id: AttemptId) -> Response:
    """An attempt's trajectory, step by step."""
    settings = get_settings()
    try:
        job, attempt = _job_attempt(job_ref, attempt_id)
    except (records.UnknownJob, TrajectoryError) as exc:
        return not_found(request, str(exc))
    try:
        trajectory = views.load_trajectory(attempt.trajectory_path, settings.data_dir)
        problem = None
    except (views.TrajectoryUnavailable, OSError) as exc:
        trajectory, problem = None, str(exc)
    context = {"job": job, "attempt": attempt, "t": trajectory, "problem": problem}
    return _render(request, "trajectory.html", context)


def job_number(job_ref: str) -> int | None:
    """The job a page path names: its number, or an imported local job's old `local-…` id; None: no job."""
    job_id = path_job_id(job_ref)
    if job_id is not None or not LOCAL_ID.fullmatch(job_ref):
        return job_id
    with session_scope() as session:
        try:
            return local.by_local_id(session, job_ref)
        except records.UnknownJob:
            return None


def _job_attempt(job_ref: str, attempt_id: int) -> tuple[Any, Any]:
    """The job and its attempt (by the attempt's id)."""
    job_id = job_number(job_ref)
    if job_id is None:
        raise records.UnknownJob(f"no job {job_ref[:80]!r}")
    with session_scope() as session:
        return records.get_job(session, job_id), records.get_attempt(session, job_id, attempt_id)


@router.get("/jobs/{job_ref}/attempts/{attempt_id}/trajectory.json")
def trajectory_file(job_ref: JobRef, attempt_id: AttemptId) -> Response:
    """The raw file, as the worker saved it (already redacted), for tools and for `replay`."""
    settings = get_settings()
    try:
        job, attempt = _job_attempt(job_ref, attempt_id)
    except (records.UnknownJob, TrajectoryError) as exc:
        raise HTTPException(404, str(exc)) from exc
    try:
        path = views.trajectory_file(attempt.trajectory_path, settings.data_dir)
    except views.TrajectoryUnavailable as exc:
        raise HTTPException(404, str(exc)) from exc
    return FileResponse(
        path,
        media_type="application/json",
        filename=f"job-{job.id}-run-{attempt.run}-attempt-{attempt.number}.json",
        headers={"cache-control": "no-store", "x-content-type-options": "nosniff"},
    )


# -- actions ------------------------------------------------------------------------------------


@router.post("/jobs/{job_id}/cancel")
def cancel(request: Request, job_id: JobId) -> Response:
    try:
        with session_scope() as session:
            outcome = cancel_job(session, job_id, _who(request))
    except records.UnknownJob as exc:
        raise HTTPException(404, str(exc)) from exc
    except InvalidTransition as exc:
        return _redirect_with_flash(f"/jobs/{job_id}", f"Not cancelled: {exc}.", "error")
    log.info("job_cancel", job_id=job_id, by=_who(request), outcome=outcome)
    if outcome == "too_late":
        return _redirect_with_flash(f"/jobs/{job_id}", f"Not cancelled: {TOO_LATE}.", "error")
    message = (
        "Cancelled."
        if outcome == "cancelled"
        else "Cancel requested: the worker stops the job at its next check (after the current step)."
    )
    return _redirect_with_flash(f"/jobs/{job_id}", message)


@router.post("/jobs/{job_id}/retry")
async def retry(request: Request, job_id: JobId) -> Response:
    """Queue the job again, commit, and only then send the task (DESIGN: enqueue after the commit)."""

    def queue_again() -> str | None:
        try:
            requeue_and_send(job_id, _who(request))  # a failed send leaves it to the sweep
        except InvalidTransition as exc:
            return str(exc)
        return None

    try:
        problem = await run_in_threadpool(queue_again)
    except records.UnknownJob as exc:
        raise HTTPException(404, str(exc)) from exc
    except SQLAlchemyError:
        log.exception("job_retry_failed", job_id=job_id)
        return _redirect_with_flash(f"/jobs/{job_id}", "Not retried: the database is unavailable.", "error")
    if problem:
        return _redirect_with_flash(f"/jobs/{job_id}", f"Not retried: {problem}.", "error")
    log.info("job_retry", job_id=job_id, by=_who(request))
    return _redirect_with_flash(f"/jobs/{job_id}", "Queued again; a worker picks it up shortly.")


@router.post("/jobs/{job_id}/replay")
def replay(request: Request, job_id: JobId) -> Response:
    """Ask a worker to replay the job's recording: note it on the timeline, commit, then send the task.

    The replay itself (recorded model replies in a fresh sandbox) runs where sandboxes run, on a
    worker, as the task `frogfix.replay_job` sent by name (app/ never imports worker/); it writes its
    outcome on the timeline. When the broker cannot take the task, the operator is told the command.
    """
    who = _who(request)
    with session_scope() as session:
        try:
            job = records.get_job(session, job_id)
        except records.UnknownJob as exc:
            raise HTTPException(404, str(exc)) from exc
        if job.status in ACTIVE_STATUSES:
            return _redirect_with_flash(f"/jobs/{job_id}", "Not replayed: the job is still running.", "error")
        if not any(a.trajectory_path for a in records.job_attempts(session, job_id)):
            return _redirect_with_flash(f"/jobs/{job_id}", "Nothing to replay: this job has no trajectory.", "error")
        records.add_event(
            session, job.id, "replay_requested", f"replay requested by {who}", {"requested_at": utcnow().isoformat()}
        )
    if not send_replay_job(job_id, who):
        log.warning("job_replay_not_sent", job_id=job_id, by=who)
        return _redirect_with_flash(
            f"/jobs/{job_id}",
            f"The task queue is unreachable, so no worker got the replay: run ./manage.py replay {job_id} "
            "on a worker host.",
            "error",
        )
    log.info("job_replay", job_id=job_id, by=who)
    return _redirect_with_flash(
        f"/jobs/{job_id}",
        "Replay queued: a worker re-runs the recorded model replies in a fresh sandbox; the result appears on "
        f"the timeline (or run ./manage.py replay {job_id} on a worker host).",
    )
