"""Local jobs (`manage.py fix`, `demo`): rows of the jobs table like a forge job's, and the import of
the records older versions kept in the data folder instead.

A local job's forge is `local`, its project the checkout's absolute folder, its issue the next
number of that folder's local jobs (so two runs on one folder can be active at once under the
one-active-job-per-issue index), its trigger user the OS user who ran it. The process that runs
it claims it as it creates it (status `running`, run 1, a first heartbeat): it is never queued
for a worker unless an operator retries it or the sweep finds its process dead.

Older versions wrote each local job to `local-jobs/<local-id>.json` under the data folder (and,
before that, only its trajectory, `trajectories/<local-id>.json`, with `fix`'s verdict in it).
`import_records` brings each such job into the table once, keyed by its id kept in
`delivery_id` (a second import adds nothing), so `show local-…` and `replay local-…` still find
it (`by_local_id`); the files are left where they are.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session

from app.endings import Ending
from app.jobs.records import UnknownJob, add_event
from app.models import Job, JobAttempt, utcnow
from app.moments import as_utc
from app.statuses import AttemptStatus, ExitReason, FixStatus, JobStatus
from app.trajectory import DIRECTORY, LOCAL_ID, local_id_time, local_path
from app.usage import UsageFigures

FORGE: Final = "local"
OLD_RECORDS: Final = "local-jobs"  # the folder under the data folder older versions wrote records to
KINDS: Final = ("fix", "demo")
MAX_COUNT: Final = 2**31 - 1  # a count in an older record, as an integer column holds it
MAX_PROJECT: Final = 255  # the column's width: a deeper folder cannot be a local job's project
NUMBER_TRIES: Final = 5


class LocalJobRefused(ValueError):
    """The folder cannot name a local job (its path is longer than the project column holds)."""


def create(session: Session, *, folder: str, title: str, body: str, who: str, kind: str) -> int:
    """A new local job, already claimed by the calling process (running, run 1, beating); its id.

    Its issue is the folder's next local number; two runs starting at once on one folder get two
    numbers (the loser of the index's race takes the next)."""
    if len(folder) > MAX_PROJECT:
        raise LocalJobRefused(f"the folder's path is longer than {MAX_PROJECT} characters: {folder[:80]}…")
    now = utcnow()
    for _ in range(NUMBER_TRIES):
        number = 1 + int(session.scalar(
            select(func.coalesce(func.max(Job.issue), 0)).where(Job.forge == FORGE, Job.project == folder)) or 0)
        job = Job(forge=FORGE, project=folder, issue=number, title=title, body=body, trigger_user=who,
                  status=JobStatus.running.value, run=1, created_at=now, started_at=now, heartbeat_at=now,
                  last_enqueued_at=now, queue_wait_seconds=0.0, queue_wait_total_seconds=0.0, steps=0)
        try:
            with session.begin_nested():
                session.add(job)
                session.flush()
        except IntegrityError:
            continue
        add_event(session, job.id, "created", f"{kind if kind in KINDS else 'fix'} started on {folder}",
                  {"kind": kind if kind in KINDS else "fix"})
        return job.id
    raise LocalJobRefused(f"could not number a new local job of {folder}: too many starting at once")


def by_local_id(session: Session, local_id: str) -> int:
    """The job an imported record became, by the record's `local-…` id."""
    found = session.scalar(select(Job.id).where(Job.forge == FORGE, Job.delivery_id == local_id).limit(1))
    if found is None:
        raise UnknownJob(f"no job with id {local_id[:80]!r}")
    return int(found)


def imported_ids(session: Session) -> set[str]:
    """The `local-…` ids of every imported record."""
    return set(session.scalars(select(Job.delivery_id).where(Job.forge == FORGE, Job.delivery_id.is_not(None))))


# -- the import of older records -----------------------------------------------------------------

# `fix`'s words, as an older record's status, to the job status and (for a run that stopped) the reason.
_STATUS: Final[dict[str, JobStatus]] = {
    FixStatus.fixed: JobStatus.done, FixStatus.unproven: JobStatus.done, FixStatus.no_fix: JobStatus.no_fix,
    FixStatus.tampered: JobStatus.no_fix, FixStatus.environment_error: JobStatus.failed,
    FixStatus.failed: JobStatus.failed,
}
STOPPED: Final = "the run stopped without finishing (found when its record was imported)"


def _old_files(data_dir: Path) -> dict[str, tuple[Path, bool]]:
    """Each older local job's file by its id: its record, else (a job from before records) its first
    attempt's trajectory (`True`: a trajectory)."""
    found: dict[str, tuple[Path, bool]] = {}
    for folder, is_trajectory in ((Path(data_dir) / DIRECTORY, True), (Path(data_dir) / OLD_RECORDS, False)):
        try:
            files = [f for f in folder.iterdir() if f.suffix == ".json" and LOCAL_ID.fullmatch(f.stem)]
        except OSError:  # none of this kind
            continue
        found.update((f.stem, (f, is_trajectory)) for f in files if ".attempt-" not in f.stem)
    return found


def import_records(session: Session, data_dir: Path) -> list[int]:
    """Each older local job of the data folder not yet in the table, added as a finished job; their ids.

    A file that is not a whole record (or trajectory) is skipped, left in place as before."""
    known = imported_ids(session)
    added = []
    for local_id, (file, is_trajectory) in sorted(_old_files(data_dir).items()):
        if local_id in known:
            continue
        try:
            document = json.loads(file.read_bytes(), parse_float=_finite, parse_constant=_no_constant)
        except (OSError, ValueError, RecursionError):
            continue
        if is_trajectory and isinstance(document, dict):
            document = _from_trajectory(document)
        if not isinstance(document, dict) or document.get("record_format") != "frogfix-local-job":
            continue
        try:
            with session.begin_nested():
                added.append(_add_record(session, local_id, document))
        except (KeyError, TypeError, ValueError, OverflowError, RecursionError, SQLAlchemyError):
            continue  # not a whole record (its savepoint rolled back): left where it is
    return added


# `fix`'s word to the status of the one attempt a job from before records ran.
_ATTEMPT: Final[dict[str, AttemptStatus]] = {
    FixStatus.fixed: AttemptStatus.verified, FixStatus.unproven: AttemptStatus.unproven,
    FixStatus.tampered: AttemptStatus.tampered, FixStatus.no_fix: AttemptStatus.no_fix,
}


def _from_trajectory(data: dict[str, Any]) -> dict[str, Any]:
    """A job from before records, as a record: what its trajectory and `fix`'s verdict in it say."""
    fix: dict[str, Any] = data["fix"] if isinstance(data.get("fix"), dict) else {}
    issue: dict[str, Any] = data["issue"] if isinstance(data.get("issue"), dict) else {}
    status = fix.get("status") or "running"
    usage = fix.get("usage") or data.get("usage")
    attempt = {
        "number": 1, "status": _ATTEMPT.get(status, AttemptStatus.failed).value, "trajectory_path": True,
        "patch": data.get("output_patch"), "tests": fix.get("tests"), "chosen": status in _ATTEMPT,
        "exit_reason": data.get("exit_reason"), "steps": data.get("n_steps"), "usage": usage,
        "error": fix.get("error") or data.get("error"), "flags": fix.get("flags"),
    }
    return {
        "record_format": "frogfix-local-job", "kind": data.get("kind"), "title": issue.get("title"),
        "repository": data.get("repository"), "base_commit": data.get("base_commit"), "status": status,
        "exit_reason": data.get("exit_reason"), "error": attempt["error"], "steps": data.get("n_steps"),
        "created_at": data.get("started_at"), "started_at": data.get("started_at"),
        "finished_at": data.get("updated_at"), "usage": usage, "flags": fix.get("flags"), "attempts": [attempt],
        "ending": fix.get("ending"),
    }


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _count(value: Any) -> int:
    """A count the record holds, as the database's integer holds it."""
    number = int(value or 0)
    if not 0 <= number <= MAX_COUNT:
        raise ValueError(f"{number} is out of range")
    return number


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _when(value: Any) -> datetime | None:
    try:
        return as_utc(datetime.fromisoformat(value)) if isinstance(value, str) else None
    except ValueError:
        return None


def _add_record(session: Session, local_id: str, d: dict[str, Any]) -> int:
    fix_status, exit_reason = _text(d.get("status")) or "", _text(d.get("exit_reason"))
    status = _STATUS.get(fix_status)
    error = _text(d.get("error"))
    if status is None:  # still `running`: its process is long gone
        status, error = JobStatus.failed, STOPPED
    elif status == JobStatus.failed and exit_reason == ExitReason.cancelled:
        status = JobStatus.cancelled
    folder = (_text(d.get("repository")) or "")[:MAX_PROJECT]
    created = local_id_time(local_id) or _when(d.get("created_at")) or utcnow()  # a copied file keeps its day
    number = 1 + int(session.scalar(
        select(func.coalesce(func.max(Job.issue), 0)).where(Job.forge == FORGE, Job.project == folder)) or 0)
    kind = d.get("kind") if d.get("kind") in KINDS else "fix"
    ended = Ending.from_dict(d.get("ending"))  # a record written since endings were typed keeps its kind
    job = Job(
        forge=FORGE, project=folder, issue=number, title=_text(d.get("title")), body=_text(d.get("body")),
        trigger_user=f"./manage.py {kind}", status=status.value, run=1, base_commit=_text(d.get("base_commit")),
        error=error, delivery_id=local_id, steps=_count(d.get("steps")), exit_reason=exit_reason,
        ending_kind=ended.kind.value if ended else None, ending_facts=(ended.facts() or None) if ended else None,
        flags=[f for f in d.get("flags") or [] if isinstance(f, str)],
        selection=d.get("selection") if isinstance(d.get("selection"), dict) else None,
        created_at=created, started_at=_when(d.get("started_at")) or created,
        finished_at=max(_when(d.get("finished_at")) or created, created), queue_wait_seconds=0.0,
        queue_wait_total_seconds=0.0,
        **_usage(d.get("usage")),
    )
    session.add(job)
    session.flush()
    for entry in d.get("attempts") or []:
        if isinstance(entry, dict):
            session.add(_attempt(job.id, local_id, entry, job.finished_at))
    for event in (d.get("events") or [])[:1000]:
        if isinstance(event, dict) and isinstance(event.get("kind"), str):
            data = event.get("data") if isinstance(event.get("data"), dict) else None
            add_event(session, job.id, event["kind"][:32], _text(event.get("message")) or "", data)
    add_event(session, job.id, "imported", f"imported from the local job record {local_id}", {"local_id": local_id})
    session.flush()
    return job.id


def _attempt(job_id: int, local_id: str, entry: dict[str, Any], finished: datetime | None) -> JobAttempt:
    number = _count(entry.get("number") or 1)
    if not 1 <= number <= 1000:
        raise ValueError(f"attempt number {number} is out of range")
    status = entry.get("status") if entry.get("status") in tuple(AttemptStatus) else AttemptStatus.failed.value
    if status == AttemptStatus.running:
        status = AttemptStatus.failed.value
    return JobAttempt(
        job_id=job_id, run=1, number=number, status=status, exit_reason=_text(entry.get("exit_reason")),
        steps=_count(entry.get("steps")),
        # Where `fix` wrote it, never the path the file names: a planted record leads nowhere else.
        trajectory_path=local_path(local_id, number) if entry.get("trajectory_path") else None,
        patch=_text(entry.get("patch")), summary=_text(entry.get("summary")),
        tests=entry.get("tests") if isinstance(entry.get("tests"), dict) else None,
        flags=[f for f in entry.get("flags") or [] if isinstance(f, str)], error=_text(entry.get("error")),
        chosen=bool(entry.get("chosen")), finished_at=finished, **_usage(entry.get("usage")),
    )


def _usage(value: Any) -> dict[str, Any]:
    """The usage columns of a record's figures (its counts within the column's range)."""
    columns = UsageFigures.from_dict(value if isinstance(value, dict) else {}).columns()
    if any(not 0 <= number < 2**63 for number in columns.values()):  # BigInteger's range
        raise ValueError("a usage figure is out of range")
    return columns
