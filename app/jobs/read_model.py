"""The dashboard's read model: the job list page by page, an MR's thread of rounds, one job's answer, the overview.

Read-only queries for app/web/dashboard.py and app/web/api.py. The job list selects only the columns
it shows (never the issue body) and pages by keyset on (created_at, id), so a deep page costs what the
first one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Row, Select, and_, distinct, func, or_, select
from sqlalchemy.orm import Session

from app.answers import (
    AttemptAnswer,
    EventAnswer,
    JobAnswer,
    JobDetailAnswer,
    RequestAnswer,
    ThreadAnswer,
    ThreadJobAnswer,
)
from app.jobs import rounds
from app.jobs.records import JobFilter, count_jobs_by_status, filter_conditions, get_job, job_attempts, job_events
from app.models import Job, JobAttempt, RoundRequest, utcnow
from app.statuses import (
    ACTIVE_STATUSES,
    FINAL_STATUSES,
    OUTCOME_STATUSES,
    SUCCESS_STATUSES,
    AttemptStatus,
    JobStatus,
    RequestStatus,
    RoundKind,
)
from app.usage import USAGE_COLUMNS, UsageFigures

LIST_COUNT_CAP = 10_000
SEARCH_MAX_CHARS = 100
# A search is a substring match that no index serves; each page reads at most this many jobs
# (newest first from the cursor), so a page costs the same at 100,000 jobs as at 10,000.
SEARCH_WINDOW = 10_000

Cursor = tuple[datetime, int]


@dataclass(frozen=True)
class JobRow:
    """One line of the dashboard's job list."""

    id: int
    forge: str
    project: str
    issue: int
    issue_url: str | None
    title: str | None
    status: str
    trigger_user: str | None
    mr_url: str | None
    steps: int
    runs: int
    cancel_requested: bool
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int = 0
    round: int = 0  # 0: the job that opened the MR (or never did); N: the Nth round on it
    round_kind: str | None = None
    mr_number: int | None = None


@dataclass(frozen=True)
class JobPage:
    """A page of the job list and the cursors of its neighbours (None where there is none).

    With a search, `total` is None (counting matches would mean reading every job) and, when the
    search window ran out before the page filled, `searched_to` is how far back it looked: the
    `older` cursor then continues the search from there.
    """

    rows: list[JobRow]
    older: Cursor | None
    newer: Cursor | None
    total: int | None
    total_capped: bool  # True: there are at least `total` matches, maybe more
    searched_to: datetime | None = None


_ROW_COLUMNS = (
    Job.id,
    Job.forge,
    Job.project,
    Job.issue,
    Job.issue_url,
    Job.title,
    Job.status,
    Job.trigger_user,
    Job.mr_url,
    Job.steps,
    Job.run,
    Job.cancel_requested,
    Job.created_at,
    Job.started_at,
    Job.finished_at,
    Job.round,
    Job.round_kind,
    Job.mr_number,
)


def _like_pattern(text_: str) -> str:
    escaped = text_.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _search_condition(columns: Any, search: str) -> Any:
    """Project or title contains the text (case-insensitive); `#12` or `12` also finds issue or job 12."""
    pattern = _like_pattern(search)
    matches: list[Any] = [
        columns.project.ilike(pattern, escape="\\"),
        columns.title.ilike(pattern, escape="\\"),
    ]
    number = search.lstrip("#!")
    if number.isdigit() and len(number) < 10:
        matches += [columns.issue == int(number), columns.id == int(number)]
        if search.startswith("!"):  # `!7`: every job of merge request 7 (round 0 and its rounds)
            matches.append(columns.mr_number == int(number))
    if search.startswith("@") or search.isidentifier():
        matches.append(columns.trigger_user == search.lstrip("@"))
    return or_(*matches)


@dataclass(frozen=True)
class _Walk:
    """Which way a page walks from its cursor, and the keyset conditions that start it there."""

    conditions: list[Any]
    descending: bool
    order: tuple[Any, Any]


def _walk(flt: JobFilter, older_than: Cursor | None, newer_than: Cursor | None) -> _Walk:
    conditions = filter_conditions(flt)
    descending = newer_than is None
    if newer_than is not None:
        at, job_id = newer_than
        conditions += [Job.created_at >= at, or_(Job.created_at > at, Job.id > job_id)]
    elif older_than is not None:
        at, job_id = older_than
        conditions += [Job.created_at <= at, or_(Job.created_at < at, Job.id < job_id)]
    order = (Job.created_at.desc(), Job.id.desc()) if descending else (Job.created_at.asc(), Job.id.asc())
    return _Walk(conditions, descending, order)


def _page_query(walk: _Walk, search: str) -> Select[*tuple[Any, ...]]:
    """The page's rows in walking order; a search filters a window of at most SEARCH_WINDOW jobs."""
    if not search:
        return select(*_ROW_COLUMNS).where(*walk.conditions).order_by(*walk.order)
    window = select(*_ROW_COLUMNS).where(*walk.conditions).order_by(*walk.order).limit(SEARCH_WINDOW).subquery()
    c = window.c
    outer = (c.created_at.desc(), c.id.desc()) if walk.descending else (c.created_at.asc(), c.id.asc())
    return select(window).where(_search_condition(c, search)).order_by(*outer)


def _window_end(session: Session, walk: _Walk) -> Cursor | None:
    """The last job a search window covers, when the window (not the jobs) ended the search."""
    end = session.execute(
        select(Job.created_at, Job.id).where(*walk.conditions).order_by(*walk.order).offset(SEARCH_WINDOW - 1).limit(1)
    ).first()
    return (end[0], end[1]) if end is not None else None


def _job_rows(session: Session, fetched: list[Row[Any]]) -> list[JobRow]:
    counts = attempt_counts(session, [r.id for r in fetched])
    return [
        JobRow(
            id=r.id,
            forge=r.forge,
            project=r.project,
            issue=r.issue,
            issue_url=r.issue_url,
            title=r.title,
            status=r.status,
            trigger_user=r.trigger_user,
            mr_url=r.mr_url,
            steps=r.steps or 0,
            runs=r.run or 0,
            cancel_requested=bool(r.cancel_requested),
            created_at=r.created_at,
            started_at=r.started_at,
            finished_at=r.finished_at,
            attempts=counts.get(r.id, 0),
            round=r.round or 0,
            round_kind=r.round_kind,
            mr_number=r.mr_number,
        )
        for r in fetched
    ]


def _neighbours(
    rows: list[JobRow],
    walk: _Walk,
    more: bool,
    window_end: Cursor | None,
    older_than: Cursor | None,
    newer_than: Cursor | None,
) -> tuple[Cursor | None, Cursor | None]:
    """The (older, newer) cursors: where the next page in each direction starts, None where none is."""
    first = (rows[0].created_at, rows[0].id) if rows else None
    last = (rows[-1].created_at, rows[-1].id) if rows else None
    if walk.descending:
        older = last if more else window_end
        newer = (first or older_than) if older_than is not None else None
        return older, newer
    newer = first if more else window_end
    return last or newer_than, newer


def _capped_total(session: Session, flt: JobFilter, count_cap: int) -> int:
    """How many jobs match the filter, counting no further than one past `count_cap`."""
    capped = select(Job.id).where(*filter_conditions(flt)).limit(count_cap + 1).subquery()
    return int(session.execute(select(func.count()).select_from(capped)).scalar_one())


def dashboard_jobs(
    session: Session,
    flt: JobFilter,
    search: str | None = None,
    *,
    older_than: Cursor | None = None,
    newer_than: Cursor | None = None,
    limit: int = 50,
    count_cap: int = LIST_COUNT_CAP,
) -> JobPage:
    """Newest first, `limit` rows after a keyset cursor; the count stops at `count_cap`.

    `older_than` pages towards older jobs, `newer_than` back towards newer ones. Both walk
    ix_jobs_created (or ix_jobs_status_created with a status filter) and stop after limit + 1 rows;
    a search looks through at most SEARCH_WINDOW jobs per page.
    """
    q = (search or "").strip()[:SEARCH_MAX_CHARS]
    walk = _walk(flt, older_than, newer_than)
    fetched = list(session.execute(_page_query(walk, q).limit(limit + 1)).all())
    more = len(fetched) > limit
    fetched = fetched[:limit]
    # Did the window stop the search early? Then it goes on from the window's end.
    window_end = _window_end(session, walk) if q and not more else None
    if not walk.descending:
        fetched.reverse()
    rows = _job_rows(session, fetched)
    older, newer = _neighbours(rows, walk, more, window_end, older_than, newer_than)
    if q:
        return JobPage(rows, older, newer, None, False, window_end[0] if window_end and walk.descending else None)
    total = _capped_total(session, flt, count_cap)
    return JobPage(rows, older, newer, min(total, count_cap), total > count_cap)


def attempt_counts(session: Session, job_ids: list[int]) -> dict[int, int]:
    """Attempts per job for a page of jobs (uq_attempts_job_run_number leads with job_id)."""
    if not job_ids:
        return {}
    rows = session.execute(
        select(JobAttempt.job_id, func.count()).where(JobAttempt.job_id.in_(job_ids)).group_by(JobAttempt.job_id)
    )
    return {int(j): int(n) for j, n in rows}


# -- an MR's thread of rounds --------------------------------------------------------------------

REQUEST_TEXT_CHARS = 4_000  # a comment is shown up to here; the forge keeps the whole of it
THREAD_REQUESTS_SHOWN = 200  # the thread's newest requests read for one page (waiting and turned down)
_TURNED_DOWN = (RequestStatus.ignored.value, RequestStatus.dropped.value)
_WAITING = (RequestStatus.pending.value, RequestStatus.accepted.value)


def _text(value: Any, limit: int | None = None) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    return value[:limit] if limit else value


def _ci_job_names(data: dict[str, Any]) -> tuple[str, ...]:
    """The failing jobs' names (at most 50); a Gitea status without job records names its context."""
    jobs = data.get("failed_jobs")
    names = [_text(j.get("name"), 200) for j in jobs if isinstance(j, dict)] if isinstance(jobs, list) else []
    found = tuple(n for n in names if n)[:50]
    if not found and data.get("system") == "gitea_status":
        context = _text(data.get("id"), 200)
        return (context,) if context else ()
    return found


_THREAD_COLUMNS = (
    Job.id, Job.round, Job.round_kind, Job.trigger_user, Job.status, Job.cancel_requested, Job.start_commit,
    Job.base_commit, Job.pushed_commit, Job.ci_status, Job.mr_url, Job.mr_number, Job.created_at, Job.finished_at,
)


def thread_jobs(session: Session, thread_id: int) -> list[ThreadJobAnswer]:
    """rounds.thread_jobs's rows, as the dashboard and the API show them (only the columns they read).

    Round 0's start is its base commit; a round's `trigger_user` is the newest request's author."""
    rows = session.execute(select(*_THREAD_COLUMNS).where(rounds.in_thread(thread_id)).order_by(*rounds.THREAD_ORDER))
    return [
        ThreadJobAnswer(
            id=r.id,
            round=r.round or 0,
            round_kind=r.round_kind,
            trigger_user=r.trigger_user,
            status=r.status,
            cancel_requested=bool(r.cancel_requested),
            start_commit=r.start_commit or (None if r.round else r.base_commit),
            pushed_commit=r.pushed_commit,
            ci_status=r.ci_status,
            mr_url=r.mr_url,
            mr_number=r.mr_number,
            created_at=r.created_at,
            finished_at=r.finished_at,
        )
        for r in rows
    ]


def request_answer(request: RoundRequest) -> RequestAnswer:
    """A stored request as the job page and the API show it; its `data` is read defensively (a ReviewComment or
    CiReport dict). Every text field came from the forge, typed by people FrogFix does not trust: the page
    escapes it (Jinja's autoescape), links only http(s) URLs, and the comment is cut to REQUEST_TEXT_CHARS."""
    data = request.data if isinstance(request.data, dict) else {}
    ci = request.kind == RoundKind.ci.value
    text = _text(data.get("description") if ci else data.get("body")) or ""
    return RequestAnswer(
        id=request.id,
        kind=request.kind,
        status=request.status,
        reason=request.reason,
        author=request.author,
        job_id=request.job_id,
        created_at=request.created_at,
        comment_kind=_text(data.get("kind"), 32) if not ci else None,
        path=_text(data.get("path"), 500),
        line=data["line"] if isinstance(data.get("line"), int) and not isinstance(data["line"], bool) else None,
        text=text[:REQUEST_TEXT_CHARS],
        text_cut=len(text) > REQUEST_TEXT_CHARS,
        url=_text(data.get("url"), 2000),
        ci_status=_text(data.get("status"), 32) if ci else None,
        ci_jobs=list(_ci_job_names(data)) if ci else [],
    )


def job_thread(session: Session, job: Job) -> ThreadAnswer | None:
    """The thread of `job`'s MR; None for a job that opened no MR, is no round and was asked nothing."""
    root = job.thread_id or job.id
    if job.thread_id is None and job.mr_number is None:
        has_rounds = session.execute(select(Job.id).where(Job.thread_id == job.id).limit(1)).first()
        asked = session.execute(select(RoundRequest.id).where(RoundRequest.thread_id == job.id).limit(1)).first()
        if has_rounds is None and asked is None:
            return None
    jobs = thread_jobs(session, root)
    mr_number = next((j.mr_number for j in jobs if j.mr_number is not None), None)  # round 0 records it first
    taken = session.scalars(select(RoundRequest).where(RoundRequest.job_id == job.id).order_by(RoundRequest.id))
    newest = session.scalars(
        select(RoundRequest)
        .where(RoundRequest.thread_id == root, RoundRequest.status.in_((*_WAITING, *_TURNED_DOWN)))
        .order_by(RoundRequest.id.desc())
        .limit(THREAD_REQUESTS_SHOWN)
    ).all()
    # A CI result that did not fail asks for nothing: the job shows it (ci_status), the requests do not.
    asking = [r for r in newest if r.kind != "ci" or (r.data or {}).get("status") == "failed"]
    return ThreadAnswer(
        current=job.id,
        mr_number=mr_number,
        jobs=jobs,
        requests=[request_answer(r) for r in taken],
        waiting=[request_answer(r) for r in reversed(asking) if r.status in _WAITING],
        turned_down=[request_answer(r) for r in asking if r.status in _TURNED_DOWN],
    )


def job_detail(session: Session, job_id: int) -> JobDetailAnswer:
    """One forge job as `/api/jobs/{id}` and `show --json` answer it (app/answers.py); UnknownJob if none."""
    job = get_job(session, job_id)
    return JobDetailAnswer.of_parts(
        JobAnswer.of(job),
        [EventAnswer.model_validate(e) for e in job_events(session, job_id)],
        [AttemptAnswer.of(a) for a in job_attempts(session, job_id)],
        body=job.body,
        thread=job_thread(session, job),
    )


# -- the overview -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Overview:
    """The dashboard's headline numbers; the windowed ones cover jobs created since `since`."""

    by_status: dict[str, int]
    queue_depth: int
    model_slots_in_use: int  # jobs in status running (each holds one model slot)
    running_sandboxes: int  # attempts in status running, of jobs still active
    since: datetime
    finished: int  # done + no_fix + failed in the window
    succeeded: int
    median_seconds: float | None
    p95_seconds: float | None
    per_day: list[tuple[str, dict[str, int]]]  # (YYYY-MM-DD, status -> jobs created that day)

    @property
    def success_rate(self) -> float | None:
        return self.succeeded / self.finished if self.finished else None


def dashboard_overview(session: Session, now: datetime | None = None, days: int = 14) -> Overview:
    """Counts by status, queue and slot use, success rate and durations, and jobs per day."""
    now = now or utcnow()
    since = (now - timedelta(days=days - 1)).replace(hour=0, minute=0, second=0, microsecond=0)
    by_status = count_jobs_by_status(session)
    window = and_(Job.created_at >= since, Job.status.in_(OUTCOME_STATUSES))
    outcome_counts = {
        s: int(n) for s, n in session.execute(select(Job.status, func.count()).where(window).group_by(Job.status))
    }
    ran = and_(window, Job.started_at.is_not(None), Job.finished_at.is_not(None))
    median, p95 = _duration_percentiles(session, ran)
    return Overview(
        by_status=by_status,
        queue_depth=by_status.get(JobStatus.queued.value, 0),
        model_slots_in_use=by_status.get(JobStatus.running.value, 0),
        running_sandboxes=_running_sandboxes(session),
        since=since,
        finished=sum(outcome_counts.values()),
        succeeded=sum(outcome_counts.get(s, 0) for s in SUCCESS_STATUSES),
        median_seconds=median,
        p95_seconds=p95,
        per_day=_jobs_per_day(session, since, days),
    )


def _running_sandboxes(session: Session) -> int:
    """Attempts still running, of jobs still active: each holds a sandbox open."""
    query = (
        select(func.count())
        .select_from(JobAttempt)
        .join(Job, Job.id == JobAttempt.job_id)
        .where(JobAttempt.status == AttemptStatus.running.value, Job.status.in_(ACTIVE_STATUSES))
    )
    return int(session.execute(query).scalar_one())


def _jobs_per_day(session: Session, since: datetime, days: int) -> list[tuple[str, dict[str, int]]]:
    """Jobs created each day since `since` (UTC days), by status; days without jobs are present and empty."""
    day = _created_day(session)
    per_day: dict[str, dict[str, int]] = {}
    for d in range(days):
        per_day[(since + timedelta(days=d)).strftime("%Y-%m-%d")] = {}
    rows = session.execute(
        select(day.label("day"), Job.status, func.count()).where(Job.created_at >= since).group_by("day", Job.status)
    )
    for d, status, n in rows:
        per_day.setdefault(str(d), {})[status] = int(n)
    return sorted(per_day.items())


def _duration_percentiles(session: Session, where: Any) -> tuple[float | None, float | None]:
    """Median and p95 of finished_at - started_at: in the database on PostgreSQL, in Python on SQLite."""
    if session.get_bind().dialect.name == "postgresql":
        epoch: Any = func.extract("epoch", Job.finished_at - Job.started_at)
        row = session.execute(
            select(
                func.percentile_cont(0.5).within_group(epoch),
                func.percentile_cont(0.95).within_group(epoch),
            ).where(where)
        ).one()
        return (None if row[0] is None else float(row[0]), None if row[1] is None else float(row[1]))
    seconds = (func.julianday(Job.finished_at) - func.julianday(Job.started_at)) * 86400.0
    values = sorted(float(v) for (v,) in session.execute(select(seconds).where(where)) if v is not None)
    if not values:
        return None, None
    return percentile(values, 0.5), percentile(values, 0.95)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, as PostgreSQL's percentile_cont does (values sorted)."""
    position = (len(values) - 1) * q
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


# -- usage --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UsageRow:
    """One project's attempts started on one UTC day: their jobs, how those ended, and what they used.

    A project is (forge, path), as budgets key it: `acme/calc` on GitLab and on Gitea are two.
    """

    day: str  # YYYY-MM-DD
    forge: str
    project: str
    jobs: int
    outcomes: dict[str, int]  # job status -> jobs
    usage: UsageFigures

    @property
    def model_hours(self) -> float:
        return self.usage.model_seconds / 3600.0


def _largest_first(row: UsageRow) -> tuple[int, str, str]:
    return (-row.usage.prompt_tokens, row.project, row.forge)


@dataclass(frozen=True)
class UsageReport:
    """The usage page: rows per (day, forge, project), newest day first, and the days for the chart."""

    since: datetime
    rows: list[UsageRow]
    per_day: list[tuple[str, UsageFigures]]  # every day of the window, oldest first, empty days included

    def by_project(self) -> list[UsageRow]:
        """The window's totals per (forge, project), largest prompt-token use first."""
        totals: dict[tuple[str, str], UsageRow] = {}
        for row in self.rows:
            key = (row.forge, row.project)
            seen = totals.get(key)
            if seen is None:
                totals[key] = UsageRow("", row.forge, row.project, row.jobs, dict(row.outcomes), row.usage)
                continue
            outcomes = dict(seen.outcomes)
            for status, n in row.outcomes.items():
                outcomes[status] = outcomes.get(status, 0) + n
            totals[key] = UsageRow("", row.forge, row.project, seen.jobs + row.jobs, outcomes, seen.usage + row.usage)
        return sorted(totals.values(), key=_largest_first)


def _utc_day(session: Session, column: Any) -> Any:
    """A timestamp column's UTC day as YYYY-MM-DD, in the session's SQL dialect."""
    if session.get_bind().dialect.name == "postgresql":
        return func.to_char(func.timezone("UTC", column), "YYYY-MM-DD")
    return func.date(column)


def _created_day(session: Session) -> Any:
    """A job's creation day in UTC (the jobs-per-day chart counts jobs by it)."""
    return _utc_day(session, Job.created_at)


def usage_report(
    session: Session, now: datetime | None = None, days: int = 14, project: str | None = None,
    forge: str | None = None,
) -> UsageReport:
    """Tokens, cached share, model time, jobs and outcomes per (forge, project) and per day (UTC).

    An attempt's figures count on the UTC day it started, the day the per-project token budget
    (app/jobs/scheduler.py `tokens_today`) counts them on, so "today" here is the budget's today.
    A day's jobs are those with an attempt started that day, by their status now. `project` and
    `forge` narrow the report; a path alone keeps every forge's project of that path.
    """
    now = now or utcnow()
    since = (now - timedelta(days=days - 1)).replace(hour=0, minute=0, second=0, microsecond=0)
    day = _utc_day(session, JobAttempt.started_at).label("day")
    where = [JobAttempt.started_at >= since]
    if project:
        where.append(Job.project == project)
    if forge:
        where.append(Job.forge == forge)
    query = (
        select(day, Job.forge, Job.project, Job.status, func.count(distinct(Job.id)).label("jobs"), *_attempt_sums())
        .join(Job, Job.id == JobAttempt.job_id)
        .where(*where)
        .group_by("day", Job.forge, Job.project, Job.status)
    )
    cells: dict[tuple[str, str, str], tuple[int, dict[str, int], UsageFigures]] = {}
    for found in session.execute(query):
        key = (str(found.day), found.forge, found.project)
        figures = UsageFigures.of(found)  # PostgreSQL sums BIGINT as numeric: `of` makes ints of them
        jobs, outcomes, usage = cells.get(key, (0, {}, UsageFigures()))
        cells[key] = (jobs + int(found.jobs), {**outcomes, found.status: int(found.jobs)}, usage + figures)
    rows = [UsageRow(d, f, p, jobs, outcomes, usage) for (d, f, p), (jobs, outcomes, usage) in cells.items()]
    rows.sort(key=_largest_first)
    rows.sort(key=lambda r: r.day, reverse=True)  # stable: newest day first, largest use first within it
    per_day = {(since + timedelta(days=i)).strftime("%Y-%m-%d"): UsageFigures() for i in range(days)}
    for row in rows:
        per_day[row.day] = per_day.get(row.day, UsageFigures()) + row.usage
    return UsageReport(since, rows, sorted(per_day.items()))


@dataclass(frozen=True)
class UsageCounters:
    """/metrics' usage counters, read at scrape time so every API replica reports the same truth.

    Tokens and seconds are summed over finished attempts by forge, project and attempt outcome:
    an attempt's status never changes once it ends, so these only grow. Jobs are counted by
    forge, project and final status, which /metrics exposes as a gauge: a retried job leaves its
    old outcome. The forge is part of every key because a project is (forge, path), as budgets
    key it: the same path on two forges is two projects.
    """

    attempts: dict[tuple[str, str, str], UsageFigures]  # (forge, project, attempt status) -> figures
    jobs: dict[tuple[str, str, str], int]  # (forge, project, final job status) -> jobs

    def cached_share(self) -> dict[tuple[str, str], float]:
        """Per (forge, project), the share of prompt tokens the prefix cache served (projects with prompts only)."""
        per_project: dict[tuple[str, str], UsageFigures] = {}
        for (forge, project, _), figures in self.attempts.items():
            key = (forge, project)
            per_project[key] = per_project.get(key, UsageFigures()) + figures
        return {key: u.cached_share for key, u in per_project.items() if u.cached_share is not None}


def _attempt_sums() -> list[Any]:
    """Each usage column of `job_attempts` (and `steps`) summed, labelled by its name for UsageFigures.of."""
    return [func.coalesce(func.sum(getattr(JobAttempt, name)), 0).label(name) for name in (*USAGE_COLUMNS, "steps")]


def usage_counters(session: Session) -> UsageCounters:
    """The sums behind /metrics' usage counters (two grouped scans, no per-job work)."""
    attempt_rows = session.execute(
        select(Job.forge, Job.project, JobAttempt.status.label("outcome"), *_attempt_sums())
        .join(Job, Job.id == JobAttempt.job_id)
        .where(JobAttempt.status != AttemptStatus.running.value)
        .group_by(Job.forge, Job.project, JobAttempt.status)
    )
    attempts = {(found.forge, found.project, found.outcome): UsageFigures.of(found) for found in attempt_rows}
    job_rows = session.execute(
        select(Job.forge, Job.project, Job.status, func.count())
        .where(Job.status.in_(FINAL_STATUSES))
        .group_by(Job.forge, Job.project, Job.status)
    )
    return UsageCounters(attempts, {(forge, project, status): int(n) for forge, project, status, n in job_rows})
