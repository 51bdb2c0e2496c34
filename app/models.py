"""ORM models: jobs, webhook deliveries, each job's event timeline, and dashboard operators."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    column,
    false,
    func,
    select,
    table,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, column_property, mapped_column, relationship

from app.endings import Ending
from app.moments import as_utc, iso, utcnow
from app.statuses import ACTIVE_STATUSES, FINAL_STATUSES, AttemptStatus, JobStatus
from app.usage import UsageFigures

__all__ = [
    "ACTIVE_PREDICATE",
    "ACTIVE_STATUSES",
    "FINAL_STATUSES",
    "AnswerRefusal",
    "Base",
    "Evaluation",
    "EvaluationResult",
    "Job",
    "JobAttempt",
    "JobEvent",
    "JobStatus",
    "Operator",
    "RoundRequest",
    "UtcDateTime",
    "WebhookDelivery",
    "iso",
    "utcnow",
]


class UtcDateTime(TypeDecorator[datetime]):
    """A moment in UTC, stored and read back aware on every database.

    PostgreSQL's timestamptz keeps the offset; SQLite keeps none and hands back naive datetimes. Every
    datetime column is this type, so a value read from either is aware and in UTC, and no caller
    converts it again; one written with any offset is stored as UTC."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else as_utc(value)  # a naive one is taken as UTC

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else as_utc(value)


# The attempts table as the job's summed step count reads it (JobAttempt is defined below Job).
_ATTEMPT_STEPS = table("job_attempts", column("job_id", Integer), column("steps", Integer))

# SQL text of the partial-index predicate; shared by the model, the migration and the upsert.
ACTIVE_PREDICATE = "status IN (" + ", ".join(f"'{s}'" for s in ACTIVE_STATUSES) + ")"


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[str]: JSON}


class UsageColumns:
    """The usage columns (migration 0005) that jobs and attempts share, read as `UsageFigures.of(row)`.

    An attempt's are its own figures; a job's are the sums over its attempts.
    """

    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    completion_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    model_calls: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    model_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    sandbox_seconds: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class Job(UsageColumns, Base):
    __tablename__ = "jobs"
    __table_args__ = (
        # At most one active job per issue, enforced by the database itself.
        Index(
            "uq_jobs_active_issue",
            "forge",
            "project",
            "issue",
            unique=True,
            sqlite_where=text(ACTIVE_PREDICATE),
            postgresql_where=text(ACTIVE_PREDICATE),
        ),
        Index("ix_jobs_status_created", "status", "created_at"),
        Index("ix_jobs_created", "created_at"),
        Index("ix_jobs_project", "project"),
        # The scheduler's round-robin reads each waiting project's latest claim (migration 0006).
        Index("ix_jobs_project_started", "forge", "project", "started_at"),
        # Review rounds (migration 0008): an MR's thread of jobs, and the MR a delivery names.
        Index("ix_jobs_thread", "thread_id"),
        Index("ix_jobs_mr", "forge", "project", "mr_number"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    forge: Mapped[str] = mapped_column(String(16))
    project: Mapped[str] = mapped_column(String(255))
    project_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    issue: Mapped[int] = mapped_column(Integer)
    issue_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    clone_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    title: Mapped[str | None] = mapped_column(Text, nullable=True)
    body: Mapped[str | None] = mapped_column(Text, nullable=True)
    trigger_user: Mapped[str | None] = mapped_column(String(255), nullable=True)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.queued.value)
    run: Mapped[int] = mapped_column(Integer, default=0)  # how many times a worker claimed the job
    base_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)
    branch: Mapped[str | None] = mapped_column(String(255), nullable=True)
    mr_url: Mapped[str | None] = mapped_column(Text, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # How it ended (migration 0013, app/endings.py): the kind and its typed facts beside `error`; NULL while active.
    ending_kind: Mapped[str | None] = mapped_column(String(32), nullable=True)
    ending_facts: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    delivery_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    # Why a queued job waits although workers are free: its project is over a budget (app/jobs/scheduler.py).
    hold_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    enqueue_count: Mapped[int] = mapped_column(Integer, default=0)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    exit_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    flags: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    # Seconds from the enqueue to the worker's claim of the latest run, and summed over every
    # run (retries, review rounds, budget holds); None until first claimed.
    queue_wait_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    queue_wait_total_seconds: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Review rounds (migration 0008). An MR's thread: the job that opened the MR (`thread_id` NULL,
    # `round` 0) and its rounds (`thread_id` = that job's id, `round` 1, 2, ...).
    thread_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True)
    round: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    round_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)  # a RoundKind; NULL for round 0
    mr_number: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the MR's iid / index, once opened
    start_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the branch head a round built on
    pushed_commit: Mapped[str | None] = mapped_column(String(64), nullable=True)  # what this job pushed
    # What the round was asked: the requests it took, the review thread and the diff it was shown.
    round_input: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    ci_status: Mapped[str | None] = mapped_column(String(32), nullable=True)  # forge CI on pushed_commit
    # Update rounds (migration 0011), on a thread's round-0 job: its MR as FROGFIX_AUTO_UPDATE's last
    # check saw it (open, closed, merged; NULL: never checked), and when that was.
    mr_state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    update_checked_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    # k attempts ranked (migration 0009): how the published attempt was chosen (app/selection.py
    # `Choice.to_dict`), and when FrogFix asked the reporter a question instead of publishing.
    selection: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    asked_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    # A member's `/frogfix` answer that arrived while a run was queued or active (migration 0012): it runs when
    # that run ends (app/jobs/transitions.py `run_waited_answers`). NULL: none waits.
    answer_waiting: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # Model slots the job holds beyond its own while its attempts run side by side (app/jobs/job_slots.py).
    extra_slots: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    last_enqueued_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)

    events: Mapped[list[JobEvent]] = relationship(back_populates="job", order_by="JobEvent.id")
    # Steps summed over every attempt, for the job's usage (`steps` above is the current attempt's).
    attempt_steps: Mapped[int] = column_property(
        select(func.coalesce(func.sum(_ATTEMPT_STEPS.c.steps), 0))
        .where(_ATTEMPT_STEPS.c.job_id == id)
        .correlate_except(_ATTEMPT_STEPS)
        .scalar_subquery()
    )

    @property
    def usage(self) -> UsageFigures:
        """The job's figures: the sums over its attempts, steps included."""
        return replace(UsageFigures.of(self), steps=int(self.attempt_steps or 0))

    @property
    def ending(self) -> Ending | None:
        """How the job ended, typed (app/outcome_words.py words it); None while it runs or once done."""
        if self.status in ACTIVE_STATUSES or self.status == JobStatus.done:
            return None
        return Ending.stored(self.ending_kind, self.error, self.ending_facts, status=self.status,
                             exit_reason=self.exit_reason)


class JobAttempt(UsageColumns, Base):
    """One independent try at a job: its own sandbox, trajectory, patch and test evidence."""

    __tablename__ = "job_attempts"
    __table_args__ = (
        UniqueConstraint("job_id", "run", "number", name="uq_attempts_job_run_number"),
        # The token budget sums the attempts started today (migration 0006).
        Index("ix_attempts_started", "started_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    run: Mapped[int] = mapped_column(Integer, default=1)  # the job's claim count when it ran
    number: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=AttemptStatus.running.value)  # an AttemptStatus
    exit_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    trajectory_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    patch: Mapped[str | None] = mapped_column(Text, nullable=True)
    summary: Mapped[str | None] = mapped_column(Text, nullable=True)
    tests: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    flags: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    chosen: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())  # the one published
    started_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)


class WebhookDelivery(Base):
    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        UniqueConstraint("forge", "delivery_id", name="uq_deliveries_forge_delivery"),
        Index("ix_deliveries_received", "received_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    forge: Mapped[str] = mapped_column(String(16))
    delivery_id: Mapped[str] = mapped_column(String(255))
    event: Mapped[str] = mapped_column(String(64))
    action: Mapped[str | None] = mapped_column(String(64), nullable=True)
    project: Mapped[str | None] = mapped_column(String(255), nullable=True)
    issue: Mapped[int | None] = mapped_column(Integer, nullable=True)
    outcome: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True)
    received_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class RoundRequest(Base):
    """One comment, review or CI result on an MR FrogFix opened: judged once, then taken by one round.

    The webhook records it `pending`; the worker's triage accepts or ignores it (with the reason);
    the next round of the thread takes every accepted one (so comments made during a round are
    batched into the next). See app/jobs/rounds.py.
    """

    __tablename__ = "round_requests"
    __table_args__ = (
        Index("ix_round_requests_thread", "thread_id", "status"),
        # A CI result asks once per commit and pipeline (or status context): redeliveries are one request.
        UniqueConstraint("thread_id", "kind", "dedupe_key", name="uq_round_requests_dedupe"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    thread_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    forge: Mapped[str] = mapped_column(String(16))
    project: Mapped[str] = mapped_column(String(255))
    mr_number: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(16))  # review, stop, update, ci
    status: Mapped[str] = mapped_column(String(16), default="pending")  # a RequestStatus
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    delivery_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    dedupe_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    author: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # The ReviewComment or CiReport as a dict (app/forge/reviews.py); a CI request gains `failed_jobs` logs.
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, onupdate=utcnow)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "thread_id": self.thread_id, "mr_number": self.mr_number, "kind": self.kind,
            "status": self.status, "reason": self.reason, "author": self.author, "data": self.data,
            "job_id": self.job_id, "created_at": iso(self.created_at),
        }


class AnswerRefusal(Base):
    """Someone told on an issue that their `/frogfix` answer starts nothing (migration 0012): told once per
    person and issue, however often they comment it (app/jobs/intake.py)."""

    __tablename__ = "answer_refusals"
    __table_args__ = (UniqueConstraint("forge", "project", "issue", "author", name="uq_answer_refusals_issue_author"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    forge: Mapped[str] = mapped_column(String(16))
    project: Mapped[str] = mapped_column(String(255))
    issue: Mapped[int] = mapped_column(Integer)
    author: Mapped[str] = mapped_column(String(255))  # casefolded
    comment_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class JobEvent(Base):
    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job", "job_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    kind: Mapped[str] = mapped_column(String(64))
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    job: Mapped[Job] = relationship(back_populates="events")


class Operator(Base):
    """A dashboard account: a username and an scrypt hash (see app/auth.py); never the password itself."""

    __tablename__ = "operators"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    last_login_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)


class Evaluation(Base):
    """One `manage.py eval` run: the candidate model, its frozen task list, and how far it got.

    The task list is fixed when the evaluation starts, so a resumed run measures the same tasks.
    """

    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    model: Mapped[str] = mapped_column(String(255))
    base_url: Mapped[str] = mapped_column(Text, default="")
    selector: Mapped[str] = mapped_column(Text, default="")
    attempts: Mapped[int] = mapped_column(Integer, default=1)  # K: attempts per task
    status: Mapped[str] = mapped_column(String(16), default="running")  # running, finished, stopped
    who: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # [{"key", "project", "title", "recorded_solved", "human"}], in the order they run.
    tasks: Mapped[list[Any]] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    # The process running it now (app/jobs/evaluations.py `claim`); all NULL when no process holds it.
    runner_host: Mapped[str | None] = mapped_column(String(255), nullable=True)
    runner_pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    runner_started: Mapped[str | None] = mapped_column(String(32), nullable=True)  # the pid's start time
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime(), nullable=True)
    # Model slots its attempts hold now (`take_slot`, `give_slot`); counted only while the claim is live.
    slots_held: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class EvaluationResult(Base):
    """One finished attempt of one task in an evaluation; its presence is what `--resume` skips."""

    __tablename__ = "evaluation_results"
    __table_args__ = (UniqueConstraint("evaluation_id", "task", "attempt", name="uq_eval_results_task_attempt"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    evaluation_id: Mapped[int] = mapped_column(ForeignKey("evaluations.id", ondelete="CASCADE"))
    task: Mapped[str] = mapped_column(String(160))  # the job's id: a number, or a local job's `local-...`
    attempt: Mapped[int] = mapped_column(Integer)
    solved: Mapped[bool] = mapped_column(Boolean, default=False)
    outcome: Mapped[str] = mapped_column(String(32))  # an AttemptOutcome, or `error` when it could not run
    exit_reason: Mapped[str | None] = mapped_column(String(32), nullable=True)
    steps: Mapped[int] = mapped_column(Integer, default=0)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    model_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    wall_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    trajectory: Mapped[str | None] = mapped_column(Text, nullable=True)  # relative to the data folder
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # {"source": "recorded" | "settings", "max_steps", ...}: the Leaf limits the attempt ran under.
    limits: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    # The attempt's evidence as the selection rule reads it (app/evaluation_report.py `attempt_evidence`), for
    # chosen@k (migration 0010); NULL for results recorded before it.
    evidence: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    finished_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)



