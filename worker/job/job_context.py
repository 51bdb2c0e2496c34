"""What one run of a job holds beside its stages: its seams (`Deps`), the flags it polls (a cancel,
a production job waiting), where its repository stands (`Prepared`), and the two ways a stage ends
it early (`JobEnded` with a status, `Superseded` when another run owns it).

worker/job/pipeline.py and worker/job/mr_rounds.py run jobs with these; nothing here runs a stage.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from app.db import session_scope
from app.endings import CANCELLED_ON_REQUEST, Ending, ending_for_status
from app.forge.api import Forge
from app.jobs import records
from app.jobs.scheduler import production_load
from app.logs import get_logger
from app.redaction import SecretRedactor
from app.settings import Settings, get_settings
from app.statuses import FINAL_STATUSES, JobStatus
from worker.git import workspace_pool
from worker.git.mirrors import RepoCache
from worker.git.workspace_pool import WorkspacePool
from worker.leaf.model import ModelClient
from worker.wiring import make_forge, model_from

log = get_logger("frogfix.pipeline")
BOT_AUTHOR = ("FrogFix", "frogfix@localhost")


BRANCH_MOVED = "the branch moved while the job ran"


class Superseded(Exception):
    """The job was re-queued or finished elsewhere while this run went on: touch nothing more."""


class JobEnded(Exception):
    """A stage decided the job's final status (rejected, cancelled, failed, no_fix) and how it ended.

    `ending`: the typed ending (app/endings.py); without one, the kind the status alone says (rejected,
    cancelled, no fix), with `reason` as its detail."""

    def __init__(
        self, status: JobStatus, reason: str, comment: str | None = None, notify: str | None = None, log: str = "",
        *, asks: bool = False, ending: Ending | None = None,
    ) -> None:
        super().__init__(reason)
        self.status, self.reason, self.comment, self.notify = status, reason, comment, notify
        self.log = log  # a log tail the issue comment shows fenced (an environment error's)
        self.asks = asks  # `comment` is FrogFix's question to the reporter, posted as it is (worker/job/question.py)
        self.ending = ending.but(reason) if ending is not None else ending_for_status(status, reason)


@dataclass
class Deps:
    """What the pipeline reaches outside itself; the defaults come from settings."""

    settings: Settings
    forge_for: Callable[[str], Forge]
    model_for: Callable[[], ModelClient]
    repos: RepoCache
    pool: WorkspacePool
    redactor: SecretRedactor = field(default_factory=SecretRedactor)
    # What the runner raises when the job's time is up (Celery's soft limit); the pipeline stays Celery-free.
    time_limit_errors: tuple[type[BaseException], ...] = ()
    # What answers in place of the configured model (the demo's scripted replies): named so in the attempt's
    # provenance (trajectory, timeline, job page), with no sampling, since no model was sampled. None: the
    # configured model ran, FROGFIX_MODEL_NAME with its sampling.
    model_label: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Deps:
        s = settings or get_settings()
        redactor = SecretRedactor(s.secret_values())
        return cls(
            settings=s,
            forge_for=lambda kind: make_forge(kind, s, redactor.redact),
            model_for=lambda: model_from(s),
            repos=RepoCache.in_data_dir(s.data_dir),
            pool=_pool_for(s.resolved_workspace_dir()),
            redactor=redactor,
        )


_pools: dict[Path, WorkspacePool] = {}


def _pool_for(workspaces: Path) -> WorkspacePool:
    """One warm-workspace pool per folder and process, so its background refills are shared."""
    if workspaces not in _pools:
        _pools[workspaces] = WorkspacePool(workspaces)
    return _pools[workspaces]


def job_url(settings: Settings, job_id: int) -> str | None:
    return f"{settings.public_url.rstrip('/')}/jobs/{job_id}" if settings.public_url else None


def project_allowed(settings: Settings, project: str) -> bool:
    patterns = [p.strip() for p in settings.allowed_projects.split(",") if p.strip()]
    return not patterns or any(fnmatch.fnmatchcase(project, p) for p in patterns)


WORKSPACE_NAME = re.compile(r"job-(\d+)-run-(\d+)")


def remove_finished_workspaces(root: Path) -> list[str]:
    """Remove workspaces of runs that are over: a job the sweep failed after its worker died leaves one.

    A folder is removed when its job is final or a later run owns the job; folders of jobs this
    database does not know are left alone (another FrogFix may share the folder).
    """
    found = {p: (int(m[1]), int(m[2])) for p in root.glob("job-*-run-*") if (m := WORKSPACE_NAME.fullmatch(p.name))}
    if not found:
        return []
    with session_scope() as session:
        states = records.run_states(session, {job_id for job_id, _ in found.values()})
    removed = []
    for path, (job_id, run) in found.items():
        state = states.get(job_id)
        if state is not None and (state[0] in FINAL_STATUSES or run < state[1]):
            workspace_pool.remove_workspace(path)
            removed.append(path.name)
    if removed:
        log.info("removed_finished_workspaces", folders=removed)
    return removed


def cancelled_on_request() -> JobEnded:
    """The end of a job a cancel stopped (the dashboard, `manage.py cancel`, a removed label, `/frogfix stop`)."""
    return JobEnded(JobStatus.cancelled, CANCELLED_ON_REQUEST, "The job was cancelled.")


class PolledFlag:
    """A flag read from the database at most once every `every` seconds (it is asked between tool
    calls); once True it stays True. A database hiccup leaves it as it was until the next read."""

    def __init__(self, read: Callable[[Session], bool], what: str, every: float = 2.0) -> None:
        self.read, self.what, self.every = read, what, every
        self._last = 0.0
        self._value = False

    def __call__(self) -> bool:
        now = time.monotonic()
        if not self._value and now - self._last >= self.every:
            self._last = now
            try:
                with session_scope() as session:
                    self._value = self.read(session)
            except SQLAlchemyError as exc:  # the database away for a moment: ask again at the next check
                log.warning(f"{self.what}_failed", error=str(exc)[:300])
        return self._value


class CancelCheck(PolledFlag):
    """Reads the job's cancel flag, at most once every `every` seconds."""

    def __init__(self, job_id: int, every: float = 2.0) -> None:
        self.job_id = job_id
        super().__init__(lambda session: records.cancel_requested(session, job_id), "cancel_check", every)


PREEMPT_POLL_S = 0.5  # an extra attempt looks for waiting production jobs this often, between its calls


def production_waits(session: Session) -> bool:
    """Whether a runnable production job is queued: an extra attempt then stops or does not start."""
    return production_load(session)[0] > 0


@dataclass(frozen=True)
class Prepared:
    """The repository as `prepare` left it: the mirror, the base commit, and where the MR goes.

    `start` is a review round's starting point (the head of the bot's branch); None for round 0,
    which starts from the base. `replaces` is the head of the bot's branch that round 0 found and
    may replace ("" when there was none): its push is leased on it, so it never overwrites a commit
    pushed meanwhile.
    """

    mirror: Path
    base: str
    default_branch: str
    clone_url: str
    start: str | None = None
    replaces: str = ""


