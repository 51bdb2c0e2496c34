"""A local job's record: one JSON file per `fix` or `demo` run, in the data folder.

A local job has no forge and no database row, yet it is a job: `manage.py jobs` lists it, the
dashboard lists it (marked local) and shows its page, `show` prints it. This module is the one
home of that record: `LocalJobRecord` writes it as the run goes (worker/commands/fix.py), and
`load` / `newest` read it back as `LocalJob`, which has the attributes the job list and the job
page read from a forge job, so one template serves both.

The file (`local-jobs/<id>.json`) is replaced whole on every change (a reader sees the old file
or the new one). What it holds passes through the caller's `scrub` first (worker/commands/fix.py
gives the trajectory writer's redaction), so a secret never reaches it. Standard library and app/
only.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from app.answers import AttemptAnswer, EventAnswer, JobAnswer, JobDetailAnswer
from app.endings import Ending, EndingKind
from app.moments import as_utc
from app.statuses import FixStatus
from app.trajectory import LOCAL_ID, TrajectoryError, local_path, write_atomic

DIRECTORY: Final = "local-jobs"  # under the data folder
RECORD_FORMAT: Final = "frogfix-local-job"
FORMAT_VERSION: Final = 1
FORGE: Final = "local"  # what the job list shows in its forge column
RUNNING: Final = "running"
FINAL: Final = tuple(s.value for s in FixStatus)  # a local job ends with `fix`'s outcome
STATUSES: Final = (RUNNING, *FINAL)  # the one list of a local job's statuses (filters, the CLI's help)
KINDS: Final = ("fix", "demo")
MAX_EVENTS: Final = 500  # a run writes a few dozen; the cap keeps a looping caller from growing the file


class UnknownLocalJob(LookupError):
    """No record with that id in this data folder (or the id is not a local id)."""


def path(data_dir: Path, local_id: str) -> Path:
    if not LOCAL_ID.fullmatch(local_id):
        raise UnknownLocalJob(f"{local_id[:80]!r} is not a local job id")
    return Path(data_dir) / DIRECTORY / f"{local_id}.json"


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


class LocalJobRecord:
    """Writes one local job's record; `scrub` (a JSON value to its redacted copy) runs before every write."""

    def __init__(self, data_dir: Path, local_id: str, scrub: Callable[[Any], Any]) -> None:
        self.file = path(data_dir, local_id)
        self.scrub = scrub
        self.document: dict[str, Any] = {}
        self.lock = threading.Lock()  # side-by-side attempts report from their own threads

    @property
    def started(self) -> bool:
        return bool(self.document)

    def start(
        self, *, kind: str, title: str, body: str, repository: str, base_commit: str, model: str,
        model_url: str | None = None,
    ) -> None:
        at = now_iso()
        self.document = {
            "record_format": RECORD_FORMAT,
            "format_version": FORMAT_VERSION,
            "id": self.file.stem,
            "kind": kind if kind in KINDS else "fix",
            "title": title,
            "body": body,
            "repository": repository,
            "base_commit": base_commit,
            "model": model,
            "model_url": model_url,  # the server this run asked (a why line names it), without credentials
            "status": RUNNING,
            # Who runs it: a reader on this host shows a job whose process is gone as stopped, not running.
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "exit_reason": None,
            "error": None,
            "steps": 0,
            "created_at": at,
            "started_at": at,
            "finished_at": None,
            "events": [],
            "attempts": [],
            "selection": None,
            "usage": None,
            "environment": None,
        }
        self.event("created", f"{'demo' if kind == 'demo' else 'fix'} started on {repository}")

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
        with self.lock:
            if not self.started:
                return
            events = self.document["events"]
            if len(events) < MAX_EVENTS:
                entry: dict[str, Any] = {"id": len(events) + 1, "at": now_iso(), "kind": kind, "message": message}
                if data:
                    entry["data"] = data
                events.append(entry)
            self.save()

    def status(self, status: str) -> None:
        """A running job's stage as the attempt's recorder moves it (attempt_events.py): the record stays
        running until `finish` and the stage is a row on its timeline (the page's strip reads it)."""
        self.event(status, f"the job is {status.replace('_', ' ')}")

    def update(self, **fields: Any) -> None:
        """The running job's plain fields the recorder sets (how the agent ended, its steps)."""
        with self.lock:
            if self.started:
                self.document.update(fields)
                self.save()

    def attempt_started(self, number: int, trajectory_path: str) -> None:
        """An attempt begins: listed at once, with its trajectory, so a run that dies keeps what it did."""
        with self.lock:
            if self.started:
                entry = {"number": number, "status": RUNNING, "steps": 0, "trajectory_path": trajectory_path}
                self.document["attempts"] = [a for a in self.document["attempts"] if a["number"] != number] + [entry]
                self.save()

    def progress(self, number: int, steps: int) -> None:
        """Attempt `number` took its `steps`th step (the job list and page show it while the job runs)."""
        with self.lock:
            if not self.started:
                return
            self.document["steps"] = steps
            for attempt in self.document["attempts"]:
                if attempt["number"] == number:
                    attempt["steps"] = steps
            self.save()

    def finish(self, outcome: dict[str, Any], attempts: list[dict[str, Any]]) -> None:
        """The run's end: `outcome` is `fix --json`'s object, `attempts` each attempt's record entry (none when
        the run stopped before its attempts were judged: those begun then end with the job's status)."""
        with self.lock:
            self._finish(outcome, attempts)
        self.event("finished", f"ended {self.document.get('status')}")

    def _finish(self, outcome: dict[str, Any], attempts: list[dict[str, Any]]) -> None:
        if not self.started:
            return
        d = self.document
        status = outcome.get("status") if outcome.get("status") in FINAL else FixStatus.failed.value
        if not attempts:
            ended = "cancelled" if outcome.get("exit_reason") == "cancelled" else "failed"
            attempts = [{**a, "status": ended if a.get("status") == RUNNING else a.get("status")}
                        for a in d["attempts"]]
        d.update(
            status=status,
            exit_reason=outcome.get("exit_reason"),
            error=outcome.get("error"),
            ending=outcome.get("ending"),
            steps=outcome.get("steps") or d.get("steps") or 0,
            finished_at=now_iso(),
            attempts=attempts,
            selection=outcome.get("selection"),
            usage=outcome.get("usage"),
            environment=outcome.get("environment"),
            flags=outcome.get("flags") or [],
            summary=outcome.get("summary") or "",
            tests=outcome.get("tests"),
            evidence=outcome.get("evidence"),
        )

    def save(self) -> None:
        """Under `lock`: the whole record, scrubbed, replacing the file at once."""
        text = json.dumps(self.scrub(self.document), ensure_ascii=False, separators=(",", ":"))
        write_atomic(self.file, text.encode("utf-8"), fsync=False)


# -- reading ------------------------------------------------------------------------------------


def parse_when(value: Any) -> datetime | None:
    """An ISO time as the record (or a forge job's JSON) writes it, made UTC when it has no offset."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return as_utc(parsed)


@dataclass(frozen=True)
class LocalEvent:
    id: int
    at: datetime | None
    kind: str
    message: str
    data: dict[str, Any] | None = None


@dataclass(frozen=True)
class LocalAttempt:
    """One attempt, with the names a forge job's attempt row has (its id is its number)."""

    number: int
    status: str
    exit_reason: str | None
    steps: int
    trajectory_path: str | None
    patch: str
    summary: str
    tests: dict[str, Any] | None
    flags: list[str]
    error: str | None
    chosen: bool
    usage: dict[str, Any] | None
    run: int = 1

    @property
    def id(self) -> int:
        return self.number


@dataclass(frozen=True)
class LocalJob:
    """A local job as the job list and the job page read it: a forge job's names, no forge."""

    id: str
    kind: str
    status: str
    title: str
    body: str
    repository: str
    base_commit: str | None
    model: str
    exit_reason: str | None
    error: str | None
    steps: int
    created_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    events: list[LocalEvent]
    attempt_list: list[LocalAttempt]
    selection: dict[str, Any] | None
    usage_figures: dict[str, Any] | None
    environment: dict[str, Any] | None
    flags: list[str] = field(default_factory=list)
    summary: str = ""
    tests: dict[str, Any] | None = None  # fix --json's `tests` of the chosen attempt
    evidence: dict[str, Any] | None = None
    model_url: str | None = None
    ending_data: dict[str, Any] | None = None  # the record's `ending` (fix --json's), None in one made before
    file: Path | None = None
    # The forge job's names that a local job answers with nothing.
    forge: str = FORGE
    issue: str = ""
    issue_url: None = None
    mr_url: None = None
    mr_number: None = None
    cancel_requested: bool = False
    run: int = 1
    round: int = 0
    round_kind: None = None
    branch: None = None
    delivery_id: None = None
    hold_reason: None = None
    queue_wait_seconds: None = None
    queue_wait_total_seconds: None = None

    @property
    def local(self) -> bool:
        return True

    @property
    def ending(self) -> Ending | None:
        """How the run ended, typed (app/endings.py); None while it runs or once it fixed something."""
        if self.status in (RUNNING, FixStatus.fixed, FixStatus.unproven):
            return None
        return Ending.kept(self.ending_data, self.error, status=self.status, exit_reason=self.exit_reason)

    @property
    def project(self) -> str:
        """The checkout's folder name: what the job list's project column shows."""
        return Path(self.repository).name or self.repository

    @property
    def trigger_user(self) -> str:
        return f"./manage.py {self.kind}"

    @property
    def attempts(self) -> int:
        """How many attempts ran (the job list's column); `attempt_list` has them."""
        return len(self.attempt_list)

    @property
    def running(self) -> bool:
        return self.status == RUNNING

    def listing(self) -> JobAnswer:
        """The job as `jobs --json` lists it (app/answers.py `JobAnswer`): a forge job's fields (null where a
        local job has none), with `kind` local, `local_kind` and `repository`; `answer` has the whole record."""
        return JobAnswer.model_validate({
            "id": self.id, "kind": "local", "local_kind": self.kind, "forge": FORGE, "project": self.project,
            "repository": self.repository, "issue": None, "title": self.title, "status": self.status,
            "trigger_user": self.trigger_user, "attempt": 1, "run": 1, "base_commit": self.base_commit,
            "error": self.error, "steps": self.steps,
            "ending": e.to_dict() if (e := self.ending) is not None else None,
            "exit_reason": self.exit_reason, "flags": self.flags,
            "created_at": self.created_at, "updated_at": self.finished_at, "started_at": self.started_at,
            "finished_at": self.finished_at, "usage": self.usage_figures, "selection": self.selection,
        })

    def answer(self) -> JobDetailAnswer:
        """The whole record as `show --json` prints it: the one job answer (app/answers.py `JobDetailAnswer`)."""
        return JobDetailAnswer.of_parts(
            self.listing(),
            [EventAnswer.model_validate(e) for e in self.events],
            [AttemptAnswer.model_validate(a) for a in self.attempt_list],
            body=self.body, tests=self.tests, evidence=self.evidence, summary=self.summary, model=self.model,
            model_url=self.model_url, environment=self.environment,
        )


def _text(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


MAX_ATTEMPT: Final = 1000


def _attempt(local_id: str, entry: dict[str, Any]) -> LocalAttempt:
    number = int(entry.get("number") or 1)
    if not 1 <= number <= MAX_ATTEMPT:
        raise ValueError(f"attempt number {number} is out of range")
    return LocalAttempt(
        number=number,
        status=_text(entry.get("status"), "failed"),
        exit_reason=entry.get("exit_reason") if isinstance(entry.get("exit_reason"), str) else None,
        steps=int(entry.get("steps") or 0),
        # Never the path the file names: a planted record must not lead a reader to another file.
        trajectory_path=local_path(local_id, number) if entry.get("trajectory_path") else None,
        patch=_text(entry.get("patch")),
        summary=_text(entry.get("summary")),
        tests=entry.get("tests") if isinstance(entry.get("tests"), dict) else None,
        flags=[f for f in entry.get("flags") or [] if isinstance(f, str)],
        error=entry.get("error") if isinstance(entry.get("error"), str) else None,
        chosen=bool(entry.get("chosen")),
        usage=entry.get("usage") if isinstance(entry.get("usage"), dict) else None,
    )


def _ending_data(document: dict[str, Any], stopped: str | None) -> dict[str, Any] | None:
    """The record's typed ending; a run whose process is gone ended as a lost worker's does."""
    if stopped:
        return Ending(EndingKind.worker_lost, stopped).to_dict()
    ending = document.get("ending")
    return ending if isinstance(ending, dict) else None


def _stopped(document: dict[str, Any]) -> str | None:
    """Why a record that says `running` is not: its process on this host is gone (killed, the terminal
    closed) without writing its end. None while it runs, or when it runs elsewhere (nothing to check)."""
    pid, host = document.get("pid"), document.get("host")
    if document.get("status") != RUNNING or not isinstance(pid, int) or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"the run stopped without finishing: its process ({pid}) is gone"
    except (PermissionError, OverflowError, ValueError):
        return None  # someone else's process, still there
    return None


def parse(document: Any, where: Path) -> LocalJob:
    """The record as a LocalJob; TrajectoryError (an operator's message) when it is not one.

    The job's id is the file's name, never what the file says, and its attempts' trajectories are where
    `fix` writes them: a record planted in the data folder names no other job and no other file."""
    if not isinstance(document, dict) or document.get("record_format") != RECORD_FORMAT:
        raise TrajectoryError(f"{where.name} is not a FrogFix local job record")
    local_id = where.stem
    try:
        events = [
            LocalEvent(int(e["id"]), parse_when(e.get("at")), str(e["kind"]), _text(e.get("message")),
                       e.get("data") if isinstance(e.get("data"), dict) else None)
            for e in document.get("events") or []
        ]
        attempts = [_attempt(local_id, a) for a in document.get("attempts") or [] if isinstance(a, dict)]
        stopped = _stopped(document)
        job = LocalJob(
            id=local_id,
            kind=_text(document.get("kind"), "fix"),
            status=FixStatus.failed.value if stopped else _text(document.get("status"), RUNNING),
            title=_text(document.get("title")),
            body=_text(document.get("body")),
            repository=_text(document.get("repository")),
            base_commit=document.get("base_commit") if isinstance(document.get("base_commit"), str) else None,
            model=_text(document.get("model")),
            exit_reason=document.get("exit_reason") if isinstance(document.get("exit_reason"), str) else None,
            error=stopped or (document.get("error") if isinstance(document.get("error"), str) else None),
            ending_data=_ending_data(document, stopped),
            steps=int(document.get("steps") or 0),
            created_at=parse_when(document.get("created_at")),
            started_at=parse_when(document.get("started_at")),
            finished_at=parse_when(document.get("finished_at")),
            events=events,
            attempt_list=attempts,
            selection=document.get("selection") if isinstance(document.get("selection"), dict) else None,
            usage_figures=document.get("usage") if isinstance(document.get("usage"), dict) else None,
            environment=document.get("environment") if isinstance(document.get("environment"), dict) else None,
            flags=[f for f in document.get("flags") or [] if isinstance(f, str)],
            summary=_text(document.get("summary")),
            tests=document.get("tests") if isinstance(document.get("tests"), dict) else None,
            evidence=document.get("evidence") if isinstance(document.get("evidence"), dict) else None,
            model_url=document.get("model_url") if isinstance(document.get("model_url"), str) else None,
            file=where,
        )
        job.answer()  # readable as the one job answer (a ValueError when not), so `show` and the API never fail on it
        return job
    except (KeyError, TypeError, ValueError, OverflowError, TrajectoryError) as exc:
        raise TrajectoryError(f"{where.name} is not a complete local job record: {exc}") from exc


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:20]} is not a finite number")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _decode(raw: bytes) -> Any:
    """JSON as `fix` writes it: finite numbers only (an Infinity or 1e999 in a planted file is refused)."""
    return json.loads(raw, parse_float=_finite, parse_constant=_no_constant)


# The parsed records by file, while the file stays the same: the job list and overview poll every few seconds.
_cache: dict[Path, tuple[tuple[int, int], LocalJob]] = {}
_cache_lock = threading.Lock()
CACHE_SIZE: Final = 2048


def load(data_dir: Path, local_id: str) -> LocalJob:
    file = path(data_dir, local_id)
    try:
        stat = file.stat()
        key = (stat.st_mtime_ns, stat.st_size)
        with _cache_lock:
            cached = _cache.get(file)
        if cached is not None and cached[0] == key and cached[1].status != RUNNING:
            return cached[1]  # a running job's record is read again: its process may have gone since
        document = _decode(file.read_bytes())
    except FileNotFoundError as exc:
        raise UnknownLocalJob(f"no local job {local_id!r} in this data folder") from exc
    except (OSError, ValueError, RecursionError) as exc:
        raise TrajectoryError(f"the record of local job {local_id} could not be read: {exc}") from exc
    try:
        job = parse(document, file)
    except RecursionError as exc:
        raise TrajectoryError(f"the record of local job {local_id} is nested too deep") from exc
    with _cache_lock:
        if len(_cache) >= CACHE_SIZE:
            _cache.clear()
        _cache[file] = (key, job)
    return job


def _records(data_dir: Path) -> Iterator[LocalJob]:
    folder = Path(data_dir) / DIRECTORY
    try:
        files = [f for f in folder.iterdir() if f.suffix == ".json" and LOCAL_ID.fullmatch(f.stem)]
    except OSError:  # no local job yet
        return
    for file in files:
        try:
            yield load(data_dir, file.stem)
        except (TrajectoryError, UnknownLocalJob):
            continue  # a half-written or foreign file is not a job; `show <id>` says what is wrong with it


def newest(
    data_dir: Path, *, status: str | None = None, project: str | None = None, q: str | None = None,
) -> list[LocalJob]:
    """Every local job of the data folder that the filters match, newest first (callers take a page)."""
    wanted = (q or "").strip().lower()
    jobs = [
        j for j in _records(data_dir)
        if (status is None or j.status == status)
        and (project is None or j.project == project)
        and (not wanted or wanted in f"{j.id} {j.title} {j.repository} {j.kind}".lower())
    ]
    oldest = datetime.min.replace(tzinfo=UTC)
    jobs.sort(key=lambda j: (j.created_at or oldest, j.id), reverse=True)
    return jobs
