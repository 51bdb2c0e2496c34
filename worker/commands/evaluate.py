"""`manage.py eval`: a candidate model on the team's own past tasks, verified like the pipeline, never published.

A task is a finished job whose tests failed before its patch (a recorded `before` run with a
non-zero exit and a test command): a forge job, or a local `fix`/`demo` job. Each attempt re-runs
the recorded task live through replay's `run_live_attempt` (one attempt runner for everything): a
fresh sandbox at the recorded base commit, the recorded task text with the guidance read again
from the base commit, `.frogfix.yml` from the base commit, the recorded job's Leaf limits
(`task_limits`), the pipeline's review policy and verification. Nothing is pushed or posted.

Restart-safe: the evaluation's row freezes its task list, and each attempt's result is committed as
it finishes; resuming (`--resume ID`, or the same command again while it is unfinished) runs only
the pairs with no result. Once it finished, the same command starts a new evaluation over the
tasks selected then, and `--resume ID` reports the finished one again without running anything.

Production first: before each attempt the evaluation waits for a model slot (`SlotGate`): it takes
one only when no runnable production job is queued (the scheduler's `production_load`) and the
busy production jobs plus the attempts in flight of every live evaluation (counted on their rows,
whatever process or host runs them) leave one free. So no evaluation starts an attempt while a
production job waits, and a production job queued meanwhile shares the model only with eval
attempts that had started before it, within the slots production was not using.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from app import trajectory
from app.db import in_transaction, session_scope
from app.evaluation_report import UNRUNNABLE, attempt_evidence, counted
from app.forge.api import Forge, ForgeError, ForgeNotFound, mr_number_from_url
from app.jobs import evaluations as ev_records
from app.jobs import local, records
from app.jobs.evaluations import TaskSelector, parse_selector
from app.logs import get_logger
from app.moments import as_utc
from app.patches import file_diffs
from app.redaction import SecretRedactor
from app.settings import Settings, get_settings
from app.statuses import INFRA_EXITS, LOCAL_VERDICT_STATUSES, FixStatus, JobStatus
from sandbox.base import SandboxError
from worker.attempts.attempt import AttemptOutcome
from worker.commands.recorded import ReplayError, RepoSource, find_recording, repo_source
from worker.commands.replay import run_live_attempt
from worker.leaf.model import ModelClient
from worker.wiring import make_forge, model_from

log = get_logger("frogfix.eval")
Progress = Callable[[str], None]
ModelFactory = Callable[[str, int], ModelClient]  # (task, attempt) -> a fresh client for that attempt


class EvalError(Exception):
    """The evaluation cannot run (bad options, unknown id, no tasks); the message says why."""


# -- which tasks --------------------------------------------------------------------------------


def _failed_before(tests: Any) -> bool:
    """A test command ran on the base commit and failed: the task can tell a fix from no fix."""
    if not isinstance(tests, dict) or not tests.get("command"):
        return False
    before = tests.get("before")
    code = before.get("exit_code") if isinstance(before, dict) else None
    return isinstance(code, int) and code != 0


def local_job_time(key: str, data: dict[str, Any]) -> datetime | None:
    """When a local job ran: the UTC stamp in its id (`local-YYYYMMDD-HHMMSS-...`), else the trajectory's
    `started_at`. Never the file's mtime: a copy, a restore or a later write to the file moves that."""
    stamped = trajectory.local_id_time(key)
    if stamped is not None:
        return stamped
    started = data.get("started_at")
    try:
        when = datetime.fromisoformat(started) if isinstance(started, str) else None
    except ValueError:
        return None
    return as_utc(when) if when is not None else None


def _local_tasks(settings: Settings, selector: TaskSelector) -> list[dict[str, Any]]:
    """Local (`fix`, `demo`) jobs older than their rows (made before their records, so never imported):
    their one trajectory holds the verdict `fix` added to it."""
    folder = settings.data_dir / trajectory.DIRECTORY
    with session_scope() as session:
        imported = local.imported_ids(session)
    found = []
    for path in sorted(folder.glob("local-*.json")) if folder.is_dir() else []:
        key = path.stem
        if key in imported:  # a job row now (app/jobs/local.py), selected with the others
            continue
        try:
            data = trajectory.read(path)
        except trajectory.TrajectoryError:
            continue
        fix = data.get("fix")
        if not isinstance(fix, dict) or not _failed_before(fix.get("tests")):
            continue
        repository = str(data.get("repository") or "")
        project = Path(repository).name
        when = local_job_time(key, data)
        status = str(fix.get("status") or "")
        if not selector.statuses and status not in LOCAL_VERDICT_STATUSES:
            continue  # `failed`: no model verdict; only through `status=failed`
        if not selector.takes(key, project, status, when):
            continue
        issue = data.get("issue")
        title = str(issue.get("title") or "") if isinstance(issue, dict) else ""
        found.append(
            {"key": key, "project": project, "title": title, "recorded_solved": status == FixStatus.fixed,
             "recorded_attempts": 1, "human": "unknown"}
        )
    return found


class HumanVerdicts:
    """What a human did with each forge job's MR, read from the forge once, when the evaluation starts.

    The verdict is frozen in the evaluation's task list, so a resume never asks again. A forge that
    fails (down, token refused) gives `unknown` for that MR and for the rest of its MRs, so an
    outage costs one failed read, never the evaluation.
    """

    def __init__(self, settings: Settings, progress: Progress) -> None:
        self.settings, self.progress = settings, progress
        self.redactor = SecretRedactor(settings.secret_values())
        self._forges: dict[str, Forge | None] = {}

    def _forge(self, kind: str) -> Forge | None:
        if kind not in self._forges:
            try:
                self._forges[kind] = make_forge(kind, self.settings, self.redactor.redact)
            except ForgeError as exc:
                self.progress(f"human verdicts from {kind[:20]} are unknown: {exc}")
                self._forges[kind] = None
        return self._forges[kind]

    def of(self, candidate: ev_records.JobCandidate) -> str:
        """`merged`, `closed` (unmerged), `open`, or `unknown` (no MR, or the forge did not answer)."""
        number = mr_number_from_url(candidate.mr_url)
        forge = self._forge(candidate.forge) if number is not None else None
        if forge is None or number is None:
            return "unknown"
        try:
            return forge.mr_verdict(candidate.project, number)
        except ForgeNotFound:
            return "unknown"  # the MR (or the project) is gone: this one only
        except ForgeError as exc:
            self.progress(f"human verdicts from {candidate.forge} are unknown: {exc}")
            self._forges[candidate.forge] = None
            forge.close()
            return "unknown"

    def close(self) -> None:
        for forge in self._forges.values():
            if forge is not None:
                forge.close()


def unknown_ids(selector: TaskSelector, settings: Settings) -> list[str]:
    """The ids `--jobs` names that are no job's, in the order given: a forge job's id not in the database,
    a local id with neither record nor trajectory (a job that exists but is not executable is not listed)."""
    forge_ids = [int(key) for key in selector.ids if key.isdigit()]
    with session_scope() as session:
        known = ev_records.existing_job_ids(session, forge_ids)
    folder = settings.data_dir
    return [
        key for key in selector.ids
        if (int(key) not in known if key.isdigit() else not _local_job_exists(folder, key))
    ]


def _local_job_exists(folder: Path, key: str) -> bool:
    """An old local id names an imported job (app/jobs/local.py) or, if made before records, a trajectory."""
    try:
        with session_scope() as session:
            local.by_local_id(session, key)
        return True
    except records.UnknownJob:
        pass
    try:
        return (folder / trajectory.local_path(key)).is_file()
    except trajectory.TrajectoryError:
        return False


def select_tasks(selector: TaskSelector, settings: Settings, progress: Progress | None = None) -> list[dict[str, Any]]:
    """The executable tasks `selector` picks: forge jobs oldest first (each with its MR's human verdict),
    then local jobs."""
    with session_scope() as session:
        local.import_records(session, settings.data_dir)
    with session_scope() as session:
        candidates = ev_records.finished_jobs_with_tests(session, selector)
    verdicts = HumanVerdicts(settings, progress or (lambda _m: None))
    try:
        tasks = [
            {"key": c.key, "project": c.project, "title": c.title, "recorded_solved": c.status == JobStatus.done,
             "recorded_attempts": max(1, c.attempts), "human": verdicts.of(c)}
            for c in candidates
            if any(_failed_before(t) for t in c.tests)
        ]
    finally:
        verdicts.close()
    return tasks + _local_tasks(settings, selector)


# -- production first ---------------------------------------------------------------------------


class SlotGate:
    """Model slots shared with production and with every other evaluation, counted in the database.

    An attempt takes a slot only when no runnable production job waits (the scheduler's
    `production_load`: a job held by its project's budget cannot start whatever eval does) and the
    busy production jobs plus the attempts in flight of every live evaluation, in any process on
    any host, leave one free (app/jobs/evaluations.py `take_slot`, under one lock).
    """

    def __init__(self, evaluation_id: int, runner: ev_records.Runner, slots: int, *, stale_seconds: float,
                 poll_seconds: float = 1.0, stop: Callable[[], bool] | None = None,
                 progress: Progress | None = None) -> None:
        if slots < 1:
            raise EvalError("there must be at least one model slot (FROGFIX_MODEL_SLOTS)")
        self.evaluation_id, self.runner, self.slots = evaluation_id, runner, slots
        self.stale_seconds, self.poll_seconds = stale_seconds, poll_seconds
        self.stop = stop or (lambda: False)
        self.progress: Progress = progress or (lambda _m: None)
        self.last: ev_records.SlotAnswer | None = None  # what the last look saw
        self.claim_lost = False  # the evaluation's claim went to another process: take nothing more

    def try_acquire(self) -> bool:
        """Take a slot now if production and the other evaluations leave one."""
        with session_scope() as session:
            answer = ev_records.take_slot(session, self.evaluation_id, self.runner, self.slots, self.stale_seconds)
        self.last = answer
        self.claim_lost = self.claim_lost or answer.lost
        return answer.taken

    def acquire(self) -> bool:
        """Wait for a slot, saying so once; False when `stop` says to give up first or the claim was lost."""
        said = False
        while not (self.stop() or self.claim_lost):
            if self.try_acquire():
                return True
            if not said and self.last is not None and not self.last.lost:
                self.progress(self._waiting(self.last))
                said = True
            time.sleep(self.poll_seconds)
        return False

    def _waiting(self, seen: ev_records.SlotAnswer) -> str:
        if seen.queued:
            return f"waiting for a model slot ({counted(seen.queued, 'production job')} queued)"
        return (f"waiting for a model slot ({counted(seen.busy, 'production job')} and "
                f"{counted(seen.evaluations, 'evaluation attempt')} hold all {self.slots})")

    def release(self) -> None:
        """Give the slot back; retried while the database is unreachable, so a blip cannot leak it."""
        in_transaction(lambda session: ev_records.give_slot(session, self.evaluation_id, self.runner))


# -- running ------------------------------------------------------------------------------------


@dataclass
class EvalOptions:
    """What `manage.py eval` was asked; the same options again resume the same unfinished evaluation."""

    model: str
    base_url: str
    selector: str = ""
    attempts: int = 1
    concurrency: int = 1
    who: str = "manage.py"
    api_key: str | None = None  # `--api-key`; never stored (see `candidate_api_key`)


def checked_selector(options: EvalOptions) -> TaskSelector:
    """The options' own mistakes (counts, the task selector), refused before anything is asked or recorded."""
    if options.attempts < 1 or options.concurrency < 1:
        raise EvalError("--attempts and --concurrency must be at least 1")
    try:
        return parse_selector(options.selector)
    except ev_records.SelectorError as exc:
        raise EvalError(str(exc)) from exc


def start_or_resume(options: EvalOptions, settings: Settings, resume: int | None, progress: Progress) -> int:
    """The evaluation to run: `resume`, else an unfinished one of the same command, else a new one."""
    selector = checked_selector(options)
    with session_scope() as session:
        if resume is not None:
            ev_records.get_evaluation(session, resume)
            return resume
        latest = ev_records.latest_of_command(
            session, model=options.model, base_url=options.base_url, selector=options.selector,
            attempts=options.attempts,
        )
    if latest is not None and latest[1] != "finished":
        progress(f"resuming evaluation {latest[0]} (the same command did not finish)")
        return latest[0]
    if latest is not None:
        progress(f"evaluation {latest[0]} of the same command finished; starting a new one over the tasks "
                 f"selected now (`--resume {latest[0]}` reports it again)")
    missing = unknown_ids(selector, settings)
    if missing:
        raise EvalError(f"no job {missing[0]}" if len(missing) == 1 else f"no jobs {', '.join(missing)}")
    tasks = select_tasks(selector, settings, progress)
    if not tasks:
        raise EvalError("no executable task: no finished job recorded tests that failed before its patch")
    with session_scope() as session:
        evaluation_id = ev_records.create_evaluation(
            session, model=options.model, base_url=options.base_url, selector=options.selector,
            attempts=options.attempts, tasks=tasks, who=options.who,
        )
    progress(f"evaluation {evaluation_id}: {counted(len(tasks), 'task')} x {counted(options.attempts, 'attempt')}")
    return evaluation_id


# Leaf limits a trajectory records (worker/attempts/attempt.py writes `limits`) that an eval attempt takes over.
RECORDED_LIMITS = {
    "max_steps": "leaf_max_steps",
    "max_context_tokens": "leaf_max_context_tokens",
    "max_completion_tokens": "leaf_max_completion_tokens",
}


def task_limits(recording: dict[str, Any], settings: Settings) -> tuple[Settings, dict[str, Any]]:
    """The settings a task's attempts run under, and the limits to report beside each result.

    The same limits as the recorded job: its trajectory's steps and context and completion tokens.
    A trajectory written before FrogFix recorded them gets today's settings, and the result says
    `settings`. The time limit is always today's FROGFIX_JOB_TIMEOUT_SECONDS: a recorded attempt's
    time bound is only what was left of its job when it began.
    """
    recorded = recording.get("limits")
    taken = {
        name: recorded[name] for name in RECORDED_LIMITS
        if isinstance(recorded, dict) and isinstance(recorded.get(name), int) and recorded[name] > 0
    }
    source = "recorded" if len(taken) == len(RECORDED_LIMITS) else "settings"
    if source == "settings":
        taken = {}
    chosen = settings.model_copy(update={RECORDED_LIMITS[name]: value for name, value in taken.items()})
    limits = {name: getattr(chosen, setting) for name, setting in RECORDED_LIMITS.items()}
    return chosen, {"source": source, **limits, "max_seconds": chosen.job_timeout_seconds}


@dataclass
class _Task:
    """One task's recording, repository and limits, prepared once and shared by its attempts."""

    recording: Any
    source: RepoSource
    settings: Settings
    limits: dict[str, Any]


class _Sources:
    """Each task's `_Task`, found on its first attempt."""

    def __init__(self, settings: Settings, redactor: SecretRedactor, progress: Progress) -> None:
        self.settings, self.redactor, self.progress = settings, redactor, progress
        self._lock = threading.Lock()
        self._found: dict[str, _Task] = {}

    def get(self, key: str) -> _Task:
        with self._lock:
            if key not in self._found:
                rec = find_recording(int(key) if key.isdigit() else key, None, self.settings)
                source = repo_source(rec, self.settings, self.redactor.redact, self.progress)
                self._found[key] = _Task(rec, source, *task_limits(rec.data, self.settings))
            return self._found[key]

    def cleanup(self) -> None:
        for task in self._found.values():
            task.source.cleanup()


def _result_values(key: str, attempt: int, report: Any, wall: float, data_dir: Path,
                   limits: dict[str, Any]) -> dict[str, Any]:
    usage = report.usage or {}
    stored = report.trajectory
    if stored and Path(stored).is_relative_to(data_dir):
        stored = str(Path(stored).relative_to(data_dir))
    return {
        "task": key,
        "attempt": attempt,
        "solved": report.outcome == AttemptOutcome.verified,  # evidence reproduced or failed_before
        "outcome": report.outcome or "unknown",
        "exit_reason": report.exit_reason,
        "steps": report.steps_replayed,
        "prompt_tokens": int(usage.get("prompt_tokens", 0)),
        "completion_tokens": int(usage.get("completion_tokens", 0)),
        "cached_tokens": int(usage.get("cached_tokens", 0)),
        "model_seconds": float(usage.get("model_seconds", 0.0)),
        "wall_seconds": wall,
        "trajectory": stored,
        "reason": (report.message or "")[:2000],
        "limits": limits,
        "evidence": _evidence(report),
    }


def _evidence(report: Any) -> dict[str, Any]:
    """The attempt's evidence as the selection rule reads it (worker/attempts/attempt.py `AttemptResult.candidate`):
    the verdict of its verification, whether it may be published, and its changed lines."""
    tests = report.tests_after or {}
    verdict = tests.get("evidence") or {}
    publishable = report.outcome in (AttemptOutcome.verified, AttemptOutcome.unproven)
    lines = sum(len(f.added) + f.removed for f in file_diffs(report.patch)) if report.patch else 0
    return attempt_evidence(
        verdict.get("level"), publishable, verdict.get("fail_to_pass") or [], verdict.get("pass_to_fail") or [],
        (verdict.get("reproduction") or {}).get("tests") or [], lines,
    )


def _never_runs(exc: Exception) -> bool:
    """The task itself is gone (project, commit, recording, a usable `.frogfix.yml`): retrying cannot help.
    A sandbox that failed or a forge or git that did not answer is infrastructure: left for a resume."""
    if isinstance(exc, ReplayError):
        return not isinstance(exc.__cause__, SandboxError)
    return isinstance(exc, ForgeNotFound | LookupError) and not isinstance(exc, ev_records.UnknownEvaluation)


class ClaimLost(EvalError):
    """Another process took this evaluation over (this one was paused past FROGFIX_STALE_JOB_SECONDS)."""


class Evaluator:
    """Runs an evaluation's unfinished (task, attempt) pairs through the slot gate, committing each result."""

    def __init__(self, evaluation_id: int, settings: Settings, models: ModelFactory, gate: SlotGate,
                 progress: Progress, concurrency: int = 1, should_stop: Callable[[], bool] | None = None,
                 runner: ev_records.Runner | None = None) -> None:
        self.evaluation_id, self.settings, self.models, self.gate = evaluation_id, settings, models, gate
        self.progress, self.concurrency = progress, concurrency
        self.asked_to_stop = should_stop or (lambda: False)
        self.runner = runner or ev_records.Runner.of(os.getpid())
        self.claim_lost = False  # set by the heartbeat or a refused result: stop, record nothing more
        self.redactor = SecretRedactor(settings.secret_values())
        self.errors: list[str] = []

    def should_stop(self) -> bool:
        return self.claim_lost or self.gate.claim_lost or self.asked_to_stop()

    def pending(self) -> list[tuple[str, int]]:
        with session_scope() as session:
            row = ev_records.get_evaluation(session, self.evaluation_id)
            done = ev_records.finished_pairs(session, self.evaluation_id)
            keys, k = [t["key"] for t in row.tasks], row.attempts
        return [(key, n) for key in keys for n in range(1, k + 1) if (key, n) not in done]

    def run(self) -> str:
        """Every pending pair (or until `should_stop`); the evaluation's status afterwards.

        Whatever ends the run (an unexpected error included) leaves the status `stopped` unless every
        pair finished; a run that lost its claim writes nothing (the new holder owns the row) and
        raises ClaimLost.
        """
        pending = self.pending()
        self.progress(f"evaluation {self.evaluation_id}: {counted(len(pending), 'attempt')} to run")
        sources = _Sources(self.settings, self.redactor, self.progress)
        status = "stopped"
        try:
            with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="frogfix-eval") as pool:
                list(pool.map(lambda pair: self._one(sources, *pair), pending))
            status = "finished" if not self.pending() else "stopped"
        finally:
            sources.cleanup()
            if not self.claim_lost:
                with session_scope() as session:
                    ev_records.set_evaluation_status(session, self.evaluation_id, status)
        if self.claim_lost:
            raise ClaimLost(f"evaluation {self.evaluation_id} was taken over by another process; this one "
                            "stopped without recording more (see `manage.py eval --resume` on the other)")
        return status

    def _one(self, sources: _Sources, key: str, attempt: int) -> None:
        if self.should_stop() or not self.gate.acquire():
            self.claim_lost = self.claim_lost or self.gate.claim_lost
            return
        started = time.monotonic()
        try:
            task = sources.get(key)
            report = self._attempt(task, key, attempt)
        except Exception as exc:  # one attempt's failure must not end the others unrecorded
            self._could_not_run(key, attempt, exc)
            return
        finally:
            self.gate.release()
        if report.outcome == AttemptOutcome.no_patch and report.exit_reason in INFRA_EXITS:
            # The model server or the sandbox failed, not the candidate: no result, so a resume tries it again.
            self.errors.append(f"task {key}, attempt {attempt}: {report.exit_reason}: {report.error or report.message}")
            self.progress(f"task {key}, attempt {attempt} failed on infrastructure (left for a resume): "
                          f"{report.exit_reason}")
            return
        values = _result_values(key, attempt, report, time.monotonic() - started, self.settings.data_dir,
                                task.limits)
        if self._record(values):
            verdict = "solved" if values["solved"] else f"not solved ({values['outcome']})"
            self.progress(f"task {key}, attempt {attempt}: {verdict}, {values['steps']} steps")

    def _could_not_run(self, key: str, attempt: int, exc: Exception) -> None:
        """A task that can never run is recorded `unrunnable` (out of every rate); anything else waits for a resume."""
        reason = self.redactor.redact(f"{type(exc).__name__}: {exc}")[:2000]
        if _never_runs(exc):
            values = {"task": key, "attempt": attempt, "solved": False, "outcome": UNRUNNABLE, "reason": reason}
            if self._record(values):
                self.progress(f"task {key}, attempt {attempt} cannot run (recorded as unrunnable): {exc}")
            return
        self.errors.append(f"task {key}, attempt {attempt}: {reason}")
        self.progress(f"task {key}, attempt {attempt} could not run (left for a resume): {reason}")

    def _record(self, values: dict[str, Any]) -> bool:
        """Commit one result while this process holds the claim; a lost claim stops the run instead."""
        with session_scope() as session:
            kept = ev_records.record_result(session, self.evaluation_id, values, self.runner)
        if not kept:
            self.claim_lost = True
        return kept

    def _attempt(self, task: _Task, key: str, attempt: int) -> Any:
        model = self.models(key, attempt)
        try:
            return run_live_attempt(
                task.recording, task.source, task.settings, self.redactor, lambda _m: None, model=model, mode="eval",
                fields={"evaluation": self.evaluation_id, "eval_task": key, "eval_attempt": attempt},
            )
        finally:
            close = getattr(model, "close", None)
            if callable(close):
                close()


class Heartbeat:
    """Beats the evaluation's claim while it runs, so another host sees a live run even in a long attempt."""

    def __init__(self, evaluation_id: int, runner: ev_records.Runner, stale_seconds: float,
                 on_lost: Callable[[], None] = lambda: None) -> None:
        self.evaluation_id, self.runner, self.on_lost = evaluation_id, runner, on_lost
        self.interval = max(1.0, stale_seconds / 4)
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="frogfix-eval-heartbeat", daemon=True)

    def _loop(self) -> None:
        while not self._done.wait(self.interval):
            try:
                with session_scope() as session:
                    if not ev_records.beat(session, self.evaluation_id, self.runner):
                        self.on_lost()  # taken over: the evaluator stops and records nothing more
                        return
            except Exception as exc:  # a database blip must not end the evaluation; the next beat tries again
                log.warning("eval heartbeat failed: %s", type(exc).__name__)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(timeout=10)


def load_report(evaluation_id: int) -> dict[str, Any]:
    """The report of an evaluation as it stands (finished or not), from its rows."""
    with session_scope() as session:
        return ev_records.report_of(session, evaluation_id)


def gate_failures(report: dict[str, Any], fail_below: float | None, fail_if_lost: int | None) -> list[str]:
    """Why a rollout gate says no: the solve rate under `fail_below`, or `fail_if_lost` or more tasks lost."""
    reasons = []
    rate = report["candidate"]["solve_rate"]["value"]
    if fail_below is not None and (rate is None or rate < fail_below):
        reasons.append(f"solve rate {rate if rate is not None else 'n/a'} is below {fail_below}")
    if fail_if_lost is not None and len(report["lost"]) >= fail_if_lost:
        reasons.append(f"{len(report['lost'])} task(s) lost (limit: fewer than {fail_if_lost})")
    return reasons


def candidate_api_key(base_url: str, explicit: str | None, settings: Settings) -> SecretStr:
    """The key for the candidate server: `--api-key`, else the production key only for the production URL,
    else FROGFIX_EVAL_API_KEY (default none: sends `EMPTY`). A candidate elsewhere never receives
    FROGFIX_MODEL_API_KEY."""
    if explicit is not None:
        return SecretStr(explicit)
    if base_url.rstrip("/") == settings.model_base_url.rstrip("/"):
        return settings.model_api_key
    return settings.eval_api_key


def candidate_models(settings: Settings) -> ModelFactory:
    """A fresh client per attempt for the candidate named in `settings` (model name and base URL)."""
    return lambda _key, _attempt: model_from(settings)


def evaluate(options: EvalOptions, *, resume: int | None = None, models: ModelFactory | None = None,
             progress: Progress | None = None, settings: Settings | None = None,
             should_stop: Callable[[], bool] | None = None, poll_seconds: float = 1.0,
             check_model: bool = False) -> tuple[int, str, list[str]]:
    """Start or resume an evaluation and run it: (its id, its status, attempts that could not run).

    `check_model`: first ask the candidate's server for its model list (doctor's check), and refuse
    before any evaluation row or attempt when it cannot answer."""
    base = settings or get_settings()
    finished = False  # a finished evaluation resumed is only reported again: no model is asked
    if resume is not None:  # a resumed evaluation keeps its own model, server and K
        with session_scope() as session:
            row = ev_records.get_evaluation(session, resume)
            finished = row.status == "finished"
            options = EvalOptions(row.model, row.base_url, row.selector, row.attempts, options.concurrency,
                                  options.who, options.api_key)
    key = candidate_api_key(options.base_url, options.api_key or None, base)
    s = base.model_copy(update={"model_name": options.model, "model_base_url": options.base_url, "model_api_key": key})
    say: Progress = progress or (lambda _m: None)
    if check_model and models is None and not finished:
        checked_selector(options)  # a mistyped option is said before the model server is asked
        ask_model(s)
    evaluation_id = start_or_resume(options, s, resume, say)
    runner = ev_records.Runner.of(os.getpid())
    try:
        with session_scope() as session:
            ev_records.claim(session, evaluation_id, runner, s.stale_job_seconds)
    except ev_records.EvaluationBusy as exc:
        raise EvalError(str(exc)) from None
    try:
        gate = SlotGate(evaluation_id, runner, s.model_slots, stale_seconds=s.stale_job_seconds,
                        poll_seconds=poll_seconds, stop=should_stop, progress=say)
        evaluator = Evaluator(evaluation_id, s, models or candidate_models(s), gate, say, options.concurrency,
                              should_stop, runner)
        gate.stop = evaluator.should_stop
        evaluator.redactor = SecretRedactor([*base.secret_values(), *s.secret_values()])  # production's and ours

        def lost() -> None:
            evaluator.claim_lost = True

        with Heartbeat(evaluation_id, runner, s.stale_job_seconds, lost):
            status = evaluator.run()
        return evaluation_id, status, evaluator.errors
    finally:
        with session_scope() as session:
            ev_records.release(session, evaluation_id, runner)


# -- the command --------------------------------------------------------------------------------


def ask_model(settings: Settings) -> None:
    """The candidate's server answers its model list and serves the model (doctor's `model.listed`), else
    EvalError in doctor's words, before anything is recorded or run."""
    from worker.commands.doctor.model import model_listed

    line = model_listed(settings).line
    if line.outcome != "pass":
        raise EvalError(f"the model server cannot be used: {line.detail}; fix: {line.fix} "
                        "(nothing was run; --skip-model-check skips this check)")


def ensure_schema(settings: Settings) -> None:
    """The database at the code's schema (app/migrate.py `ensure_schema`: only the embedded one is upgraded)."""
    from app import migrate as migrations

    try:
        migrations.ensure_schema(settings.resolved_database_url(), configured=bool(settings.database_url))
    except migrations.SchemaBehind as exc:
        raise EvalError(str(exc)) from exc


EXIT_OK, EXIT_GATE, EXIT_ERROR, EXIT_INCOMPLETE = 0, 1, 2, 3
SCRIPTED_MODELS = ("demo",)


def scripted_models(name: str) -> ModelFactory:
    """`--scripted-model demo`: the demo's recorded replies for every attempt (no model server)."""
    if name != "demo":
        raise EvalError(f"no scripted model {name[:40]!r}; known: {', '.join(SCRIPTED_MODELS)}")
    from worker.commands.demo import demo_model

    return lambda _key, _attempt: demo_model()


def write_outputs(report: dict[str, Any], out: Path) -> list[Path]:
    """`--out DIR`: report.md, report.json and report.html (the dashboard's renderer), written atomically."""
    import json

    from app.evaluation_report import to_markdown
    from app.web.dashboard import evaluation_report_html

    out.mkdir(parents=True, exist_ok=True)
    written = []
    outputs = (("report.md", to_markdown(report)), ("report.json", json.dumps(report, indent=2)),
               ("report.html", evaluation_report_html(report)))
    for name, text in outputs:
        trajectory.write_atomic(out / name, text.encode("utf-8"), fsync=False)
        written.append(out / name)
    return written


@dataclass
class CommandOptions:
    """`manage.py eval`'s switches beyond what the evaluation itself records."""

    as_json: bool = False
    out: Path | None = None
    fail_below: float | None = None
    fail_if_lost: int | None = None
    resume: int | None = None
    scripted: str | None = None
    model: str | None = None  # `--model` / `--base-url` as typed: a resumed evaluation must not get others
    base_url: str | None = None
    check_model: bool = True  # ask a live candidate's server for its model list first (`--skip-model-check`)


def resumed_models(command: CommandOptions, models: ModelFactory | None) -> ModelFactory | None:
    """The candidate for `--resume N`: the evaluation's own. Another model, server or scripted model is refused,
    so one evaluation's results always come from the model its row names."""
    if command.resume is None:
        return scripted_models(command.scripted) if command.scripted else models
    with session_scope() as session:
        row = ev_records.get_evaluation(session, command.resume)
        model, base_url = row.model, row.base_url
    scripted = model.removeprefix("scripted:") if model.startswith("scripted:") else None
    if command.scripted and command.scripted != scripted:
        raise EvalError(f"evaluation {command.resume} ran model {model[:80]!r}; --scripted-model "
                        f"{command.scripted[:40]!r} would write scripted replies into it")
    if command.model is not None and command.model != model:
        raise EvalError(f"evaluation {command.resume} ran model {model[:80]!r}, not {command.model[:80]!r}; "
                        "leave out --model to resume it, or start a new evaluation")
    if command.base_url is not None and command.base_url != base_url:
        raise EvalError(f"evaluation {command.resume} ran against {base_url[:200]!r}; "
                        "leave out --base-url to resume it")
    return scripted_models(scripted) if scripted else models


def run_eval_command(options: EvalOptions, command: CommandOptions, progress: Progress,
                     should_stop: Callable[[], bool] | None = None,
                     models: ModelFactory | None = None) -> tuple[int, str]:
    """Run (or resume) and report: (exit code, what to print on stdout).

    Exit 0: finished and every gate passed; 1: a gate failed (`--fail-below`, `--fail-if-lost`);
    2: it could not run; 3: it stopped before every attempt finished (resume it with `--resume ID`).
    """
    import json

    from app.evaluation_report import to_markdown

    if command.fail_below is not None and not 0.0 <= command.fail_below <= 1.0:
        raise EvalError("--fail-below takes a rate between 0 and 1")
    if command.fail_if_lost is not None and command.fail_if_lost < 1:
        raise EvalError("--fail-if-lost takes a count of 1 or more (1: fail when any task is lost)")
    try:
        models = resumed_models(command, models)
    except ev_records.UnknownEvaluation as exc:
        raise EvalError(str(exc)) from None
    try:
        evaluation_id, status, errors = evaluate(
            options, resume=command.resume, models=models, progress=progress, should_stop=should_stop,
            check_model=command.check_model,
        )
    except ClaimLost as exc:
        progress(str(exc))
        return EXIT_INCOMPLETE, ""
    report = load_report(evaluation_id)
    for path in write_outputs(report, command.out) if command.out else []:
        progress(f"wrote {path}")
    failures = gate_failures(report, command.fail_below, command.fail_if_lost)
    report["gate_failures"] = failures
    report["errors"] = errors
    text = json.dumps(report, ensure_ascii=False) if command.as_json else to_markdown(report)
    for reason in failures:
        progress(f"gate failed: {reason}")
    if failures:
        return EXIT_GATE, text
    if status != "finished":
        progress(f"evaluation {evaluation_id} is {status}; run again with --resume {evaluation_id}")
        return EXIT_INCOMPLETE, text
    return EXIT_OK, text
