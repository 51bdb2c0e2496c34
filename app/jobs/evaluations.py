"""Evaluation records (`manage.py eval`): the task selector, the SQL over jobs it reads, and the writes.

Callers own the transaction, as with app/jobs/records.py. An evaluation's task list is frozen in its
row when it starts; each finished attempt is one `evaluation_results` row, so a resumed evaluation
runs exactly the (task, attempt) pairs that have no row yet.

Model slots: each evaluation row counts the attempts it has in flight (`slots_held`). `take_slot`
adds one only when no runnable production job is queued and busy production jobs plus every live
evaluation's count stay below FROGFIX_MODEL_SLOTS, checked and written under one lock, so two
processes (or hosts) never both take the last free slot.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any, Final

from sqlalchemy import case, false, func, select, update
from sqlalchemy.orm import Session

from app.evaluation_report import UNRUNNABLE, build_report, comparison
from app.jobs.scheduler import production_load
from app.models import Evaluation, EvaluationResult, Job, JobAttempt, utcnow
from app.statuses import FINAL_STATUSES, VERDICT_STATUSES
from app.trajectory import LOCAL_ID


class SelectorError(ValueError):
    """`--jobs` could not be read; the message says which part and what is accepted."""


class UnknownEvaluation(LookupError):
    """No evaluation has that id."""


class EvaluationBusy(Exception):
    """Another live process is running that evaluation; the message names it."""


@dataclass(frozen=True)
class Runner:
    """A process that runs an evaluation: host, pid and the pid's start time (a reused pid is another process)."""

    host: str
    pid: int
    started: str

    @classmethod
    def of(cls, pid: int) -> Runner:
        return cls(socket.gethostname()[:255], pid, process_start(pid) or "")

    def alive(self, heartbeat: datetime | None, stale_seconds: float, now: datetime | None = None) -> bool:
        """On this host: the pid still runs and started when it did. Elsewhere: its heartbeat is recent
        (`now`, the clock it is judged by: the present unless a caller says)."""
        if self.host == socket.gethostname()[:255]:
            return bool(self.started) and process_start(self.pid) == self.started
        if heartbeat is None:
            return False
        return ((now or utcnow()) - heartbeat).total_seconds() < stale_seconds


def process_start(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat); None when it is gone."""
    try:
        stat = Path(f"/proc/{int(pid)}/stat").read_text()
    except (OSError, ValueError):
        return None
    fields = stat.rpartition(")")[2].split()  # after the command name, which may hold spaces and parentheses
    return fields[19] if len(fields) > 19 else None


SELECTOR_HELP = (
    "comma-separated: job ids (12, local-...), project=PATH, status=STATUS, since=YYYY-MM-DD, until=YYYY-MM-DD"
)


@dataclass(frozen=True)
class TaskSelector:
    """Which finished jobs an evaluation takes; empty parts select everything (see `parse_selector`)."""

    ids: tuple[str, ...] = ()
    projects: tuple[str, ...] = ()
    statuses: tuple[str, ...] = ()
    since: datetime | None = None
    until: datetime | None = None  # exclusive: the day after the `until` date

    def takes(self, key: str, project: str, status: str, when: datetime | None) -> bool:
        """True when a job with these fields is selected (the same rule for forge and local jobs)."""
        if self.ids and key not in self.ids:
            return False
        if self.projects and project not in self.projects:
            return False
        if self.statuses and status not in self.statuses:
            return False
        if self.since is not None and (when is None or when < self.since):
            return False
        return not (self.until is not None and (when is None or when >= self.until))


def _day(value: str, part: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError as exc:
        raise SelectorError(f"{part!r}: the date must be YYYY-MM-DD") from exc


def parse_selector(text: str | None) -> TaskSelector:
    """`12, local-x, project=group/app, status=done, since=2026-11-01, until=2026-11-30`.

    Local jobs' statuses are `fixed`, `no_fix` and `failed` (as `manage.py fix` reports them).
    """
    ids: list[str] = []
    projects: list[str] = []
    statuses: list[str] = []
    since = until = None
    allowed = {*FINAL_STATUSES, "fixed"}
    for raw in re.split(r"[,\s]+", (text or "").strip()):
        part = raw.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep:
            if not (part.isdigit() or LOCAL_ID.fullmatch(part)):
                raise SelectorError(f"{part[:80]!r} is not a job id; --jobs takes {SELECTOR_HELP}")
            ids.append(str(int(part)) if part.isdigit() else part)
        elif name == "project" and value:
            projects.append(value)
        elif name == "status" and value in allowed:
            statuses.append(value)
        elif name == "since":
            since = datetime.combine(_day(value, part), time(), UTC)
        elif name == "until":
            until = datetime.combine(_day(value, part), time(), UTC) + timedelta(days=1)
        else:
            raise SelectorError(f"{part[:80]!r} is not understood; --jobs takes {SELECTOR_HELP} "
                                f"(statuses: {', '.join(sorted(allowed))})")
    return TaskSelector(tuple(ids), tuple(projects), tuple(statuses), since, until)


@dataclass
class JobCandidate:
    """A finished forge job and the test evidence of its attempts (the caller checks the `before` run)."""

    key: str
    project: str
    title: str
    status: str
    created_at: datetime
    forge: str = ""
    mr_url: str | None = None  # the MR the job opened, whose fate (merged, closed) eval reads from the forge
    tests: list[dict[str, Any]] = field(default_factory=list)
    attempts: int = 0  # attempts the recorded run made (FROGFIX_ATTEMPTS at most; the first verified one ends it)



def existing_job_ids(session: Session, ids: list[int]) -> set[int]:
    """Which of these forge job ids a job has (`--jobs 999` is refused by name when none does)."""
    return set(session.scalars(select(Job.id).where(Job.id.in_(ids)))) if ids else set()


def finished_jobs_with_tests(session: Session, selector: TaskSelector) -> list[JobCandidate]:
    """Finished forge jobs that recorded at least one test run, oldest first, filtered by `selector`."""
    statuses = selector.statuses or VERDICT_STATUSES  # a failed/cancelled/rejected run is no verdict
    query = (
        select(Job.id, Job.project, Job.title, Job.status, Job.created_at, Job.forge, Job.mr_url, JobAttempt.tests)
        .join(JobAttempt, JobAttempt.job_id == Job.id)
        .where(Job.status.in_(statuses), JobAttempt.tests.is_not(None))
        .order_by(Job.created_at, Job.id, JobAttempt.id)
    )
    if selector.projects:
        query = query.where(Job.project.in_(selector.projects))
    numeric = [int(i) for i in selector.ids if i.isdigit()]
    if selector.ids:
        query = query.where(Job.id.in_(numeric))
    found: dict[int, JobCandidate] = {}
    for job_id, project, title, status, created, forge, mr_url, tests in session.execute(query):
        if not selector.takes(str(job_id), project, status, created):
            continue
        entry = found.setdefault(
            job_id, JobCandidate(str(job_id), project, title or "", status, created, forge, mr_url)
        )
        if isinstance(tests, dict):
            entry.tests.append(tests)
    counts = session.execute(
        select(JobAttempt.job_id, func.count()).where(JobAttempt.job_id.in_(list(found))).group_by(JobAttempt.job_id)
    )
    for job_id, n in counts:
        found[job_id].attempts = int(n)
    return list(found.values())


# -- the evaluation rows ------------------------------------------------------------------------


def create_evaluation(
    session: Session, *, model: str, base_url: str, selector: str, attempts: int, tasks: list[dict[str, Any]],
    who: str | None,
) -> int:
    row = Evaluation(
        model=model, base_url=base_url, selector=selector, attempts=attempts, tasks=tasks, who=who, status="running"
    )
    session.add(row)
    session.flush()
    return row.id


def get_evaluation(session: Session, evaluation_id: int) -> Evaluation:
    row = session.get(Evaluation, evaluation_id)
    if row is None:
        raise UnknownEvaluation(f"no evaluation with id {evaluation_id}")
    return row


def latest_of_command(
    session: Session, *, model: str, base_url: str, selector: str, attempts: int
) -> tuple[int, str] | None:
    """The newest evaluation of the same command (model, server, selector, K): its id and status.

    Unfinished, the same command again resumes it; finished, the same command starts a new one.
    """
    found = session.execute(
        select(Evaluation.id, Evaluation.status)
        .where(
            Evaluation.model == model,
            Evaluation.base_url == base_url,
            Evaluation.selector == selector,
            Evaluation.attempts == attempts,
        )
        .order_by(Evaluation.id.desc())
        .limit(1)
    ).first()
    return (int(found[0]), str(found[1])) if found is not None else None


def claim(
    session: Session, evaluation_id: int, runner: Runner, stale_seconds: float, now: datetime | None = None
) -> None:
    """Make `runner` the evaluation's one process, or raise EvaluationBusy naming the live one that has it.
    `now`: the clock a holder elsewhere is judged by (the present unless a caller says).

    The row is locked (SELECT ... FOR UPDATE) so two processes cannot both take it; a claim whose
    process is gone (killed, crashed) is taken over, so a killed run can always be resumed.
    """
    row = session.scalars(select(Evaluation).where(Evaluation.id == evaluation_id).with_for_update()).first()
    if row is None:
        raise UnknownEvaluation(f"no evaluation with id {evaluation_id}")
    if row.runner_pid is not None and (row.runner_host, row.runner_pid) != (runner.host, runner.pid):
        holder = Runner(row.runner_host or "", row.runner_pid, row.runner_started or "")
        if holder.alive(row.heartbeat_at, stale_seconds, now):
            raise EvaluationBusy(
                f"evaluation {evaluation_id} is running in process {holder.pid} on {holder.host}; "
                "wait for it, or stop it (Ctrl-C / SIGTERM) and run this again to resume"
            )
    row.runner_host, row.runner_pid, row.runner_started = runner.host, runner.pid, runner.started
    row.heartbeat_at = utcnow()
    row.slots_held = 0  # a dead holder's attempts ended with it


def beat(session: Session, evaluation_id: int, runner: Runner) -> bool:
    """Refresh `runner`'s heartbeat; False when it no longer holds the claim (another process took it over)."""
    row = session.get(Evaluation, evaluation_id)
    if row is None or (row.runner_host, row.runner_pid) != (runner.host, runner.pid):
        return False
    row.heartbeat_at = utcnow()
    return True


def release(session: Session, evaluation_id: int, runner: Runner) -> None:
    """Give up `runner`'s claim (only its own: a process that lost it to a take-over leaves the new one's)."""
    row = session.get(Evaluation, evaluation_id)
    if row is not None and (row.runner_host, row.runner_pid) == (runner.host, runner.pid):
        row.runner_host = row.runner_pid = row.runner_started = row.heartbeat_at = None
        row.slots_held = 0


# -- model slots shared with production ---------------------------------------------------------

# PostgreSQL advisory lock key for taking eval slots ("EVAL"); transaction-scoped.
SLOT_LOCK_KEY: Final = 0x4556414C


@dataclass(frozen=True)
class SlotAnswer:
    """What `take_slot` saw: whether it took a slot, and the load that decided it."""

    taken: bool
    queued: int  # runnable production jobs queued
    busy: int  # production jobs holding a slot
    evaluations: int  # slots held by live evaluations' attempts (this one's included), before this take
    lost: bool = False  # this runner no longer holds the evaluation's claim


def serialize_slot_takes(session: Session) -> None:
    """One take at a time across processes: PostgreSQL by an advisory lock, SQLite by taking its write lock
    now (a write that matches nothing), so the counts read next cannot change before this one commits."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(select(func.pg_advisory_xact_lock(SLOT_LOCK_KEY)))
    else:
        session.execute(update(Evaluation).where(false()).values(slots_held=Evaluation.slots_held))


def slots_in_use(session: Session, stale_seconds: float) -> int:
    """Slots held by evaluations whose claim is live; a killed run's count dies with its claim."""
    rows = session.execute(
        select(Evaluation.runner_host, Evaluation.runner_pid, Evaluation.runner_started, Evaluation.heartbeat_at,
               Evaluation.slots_held)
        .where(Evaluation.runner_pid.is_not(None), Evaluation.slots_held > 0)
    )
    live = 0
    for host, pid, started, beat, held in rows:
        if pid is not None and Runner(host or "", pid, started or "").alive(beat, stale_seconds):
            live += int(held)
    return live


def take_slot(session: Session, evaluation_id: int, runner: Runner, slots: int, stale_seconds: float) -> SlotAnswer:
    """One more attempt of `runner`'s evaluation in flight, if production and every live evaluation leave a slot."""
    serialize_slot_takes(session)
    row = session.scalars(
        select(Evaluation).where(Evaluation.id == evaluation_id).execution_options(populate_existing=True)
    ).first()
    queued, busy = production_load(session)
    held = slots_in_use(session, stale_seconds)
    if row is None or (row.runner_host, row.runner_pid) != (runner.host, runner.pid):
        return SlotAnswer(False, queued, busy, held, lost=True)
    if queued == 0 and busy + held < slots:
        # Relative, as in `give_slot`: a give that commits meanwhile (it takes no lock) is never overwritten.
        session.execute(
            update(Evaluation).where(Evaluation.id == evaluation_id).values(slots_held=Evaluation.slots_held + 1)
        )
        return SlotAnswer(True, queued, busy, held)
    return SlotAnswer(False, queued, busy, held)


def give_slot(session: Session, evaluation_id: int, runner: Runner) -> None:
    """One attempt of `runner`'s evaluation ended (a claim lost meanwhile is the new holder's to count)."""
    session.execute(
        update(Evaluation)
        .where(Evaluation.id == evaluation_id, Evaluation.runner_host == runner.host,
               Evaluation.runner_pid == runner.pid, Evaluation.slots_held > 0)
        .values(slots_held=Evaluation.slots_held - 1)
    )


def set_evaluation_status(session: Session, evaluation_id: int, status: str) -> None:
    row = get_evaluation(session, evaluation_id)
    row.status = status
    row.finished_at = utcnow() if status == "finished" else None


def finished_pairs(session: Session, evaluation_id: int) -> set[tuple[str, int]]:
    """The (task, attempt) pairs that already have a result: what a resumed run skips."""
    rows = session.execute(
        select(EvaluationResult.task, EvaluationResult.attempt).where(EvaluationResult.evaluation_id == evaluation_id)
    )
    return {(task, attempt) for task, attempt in rows}


def record_result(session: Session, evaluation_id: int, values: dict[str, Any], runner: Runner) -> bool:
    """One finished attempt, only while `runner` holds the claim (False, nothing written, when another
    process took it over: its own run records that pair). It also beats the heartbeat."""
    row = session.scalars(select(Evaluation).where(Evaluation.id == evaluation_id).with_for_update()).first()
    if row is None or (row.runner_host, row.runner_pid) != (runner.host, runner.pid):
        return False
    session.add(EvaluationResult(evaluation_id=evaluation_id, **values))
    row.heartbeat_at = utcnow()
    return True


def evaluation_results(session: Session, evaluation_id: int) -> list[EvaluationResult]:
    return list(
        session.scalars(
            select(EvaluationResult)
            .where(EvaluationResult.evaluation_id == evaluation_id)
            .order_by(EvaluationResult.task, EvaluationResult.attempt)
        )
    )


def list_evaluations(session: Session, limit: int = 100) -> list[tuple[Evaluation, int, int]]:
    """Newest first: each evaluation with its count of finished attempts and of solved ones, counted as its
    report counts them (an unrunnable attempt is out of every rate), so solved / finished is its solve rate."""
    counts = (
        select(
            EvaluationResult.evaluation_id.label("eid"),
            func.sum(case((EvaluationResult.outcome == UNRUNNABLE, 0), else_=1)).label("done"),
            func.sum(case((EvaluationResult.solved, 1), else_=0)).label("solved"),
        )
        .group_by(EvaluationResult.evaluation_id)
        .subquery()
    )
    rows = session.execute(
        select(Evaluation, counts.c.done, counts.c.solved)
        .outerjoin(counts, counts.c.eid == Evaluation.id)
        .order_by(Evaluation.id.desc())
        .limit(limit)
    )
    return [(ev, int(done or 0), int(solved or 0)) for ev, done, solved in rows]


def list_comparisons(session: Session, limit: int = 100) -> dict[int, dict[str, list[str]]]:
    """The newest `limit` evaluations' (those `list_evaluations` lists) gained, lost and not comparable tasks
    against their recorded run, by evaluation id: the report's own judgement (app/evaluation_report.py
    `comparison`), for the evaluations list; an evaluation without results has empty lists."""
    found = session.execute(select(Evaluation.id, Evaluation.tasks).order_by(Evaluation.id.desc()).limit(limit))
    tasks = {eid: task_list for eid, task_list in found}
    results: dict[int, list[dict[str, Any]]] = {eid: [] for eid in tasks}
    rows = session.execute(
        select(EvaluationResult.evaluation_id, EvaluationResult.task, EvaluationResult.attempt,
               EvaluationResult.solved, EvaluationResult.outcome)
        .where(EvaluationResult.evaluation_id.in_(list(tasks)))
    )
    for eid, task, attempt, solved, outcome in rows:
        results[eid].append({"task": task, "attempt": attempt, "solved": solved, "outcome": outcome})
    return {eid: comparison({"tasks": list(tasks[eid] or [])}, results[eid]) for eid in tasks}


RESULT_FIELDS = (
    "task", "attempt", "solved", "outcome", "exit_reason", "steps", "prompt_tokens", "completion_tokens",
    "cached_tokens", "model_seconds", "wall_seconds", "trajectory", "reason", "limits", "evidence",
)


def report_of(session: Session, evaluation_id: int) -> dict[str, Any]:
    """The evaluation's report (app/evaluation_report.py) from its rows, as the CLI and the dashboard show it."""
    row = get_evaluation(session, evaluation_id)
    evaluation = {
        "id": row.id, "model": row.model, "base_url": row.base_url, "selector": row.selector,
        "status": row.status, "attempts": row.attempts, "tasks": list(row.tasks),
    }
    results = [{c: getattr(r, c) for c in RESULT_FIELDS} for r in evaluation_results(session, evaluation_id)]
    report = build_report(evaluation, results)
    report["created_at"] = row.created_at.isoformat() if row.created_at else None
    return report
