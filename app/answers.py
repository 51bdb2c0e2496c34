"""The answers FrogFix gives about a job, as typed models: one schema per answer, whoever asks.

The API declares these as its `response_model`s (so `/openapi.json` lists the real fields), `fix --json`,
`jobs --json` and `show --json` print them, the dashboard and a local job's record read them. A job
(`JobAnswer`, `JobDetailAnswer`), an attempt (`AttemptAnswer`), its test runs (`TestsAnswer`, the one
`tests` shape: `after` is the list of patched runs), its evidence (`EvidenceAnswer`), its usage
(`UsageAnswer`, app/usage.py's `UsageFigures.to_dict`), how it ended (`EndingAnswer`) and `fix`'s whole
answer (`FixAnswer`).

Reading is lenient and writing is exact: stored rows and records written by older versions (a `tests`
dict with `after` as one run plus `after_runs`, an attempt whose `tests` holds its `evidence`, keys
added since) are read into the one shape by the validators here, nowhere else; what is dumped has
exactly the fields declared. Built from ORM rows and app/'s dataclasses by attribute (`of`), so this
module imports nothing of ours but the standard-library ones: app/models.py may use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, model_validator

from app.endings import EndingKind
from app.moments import iso
from app.usage import UsageFigures

# A moment as FrogFix writes one (app/moments.py `iso`: ISO 8601 in UTC with its offset); an ISO string read back.
Moment = Annotated[datetime | None, PlainSerializer(iso, return_type=str | None)]
# Seconds to the millisecond, as every answer has written them.
Seconds = Annotated[float, AfterValidator(lambda value: round(value, 3))]


class Answer(BaseModel):
    """What every answer shares: unknown keys of a stored dict are dropped, fields read from attributes too."""

    model_config = ConfigDict(extra="ignore", from_attributes=True)

    def as_json(self) -> dict[str, Any]:
        """The answer as JSON values (the shape `json.dumps` prints and the API sends)."""
        return self.model_dump(mode="json")


def _fields_of(model: type[BaseModel], source: Any) -> dict[str, Any]:
    """The attributes of `source` that `model` declares (an ORM row or a dataclass read by name); a None
    (a row not yet flushed has no column defaults) leaves the field's default."""
    values = {name: getattr(source, name, None) for name in model.model_fields}
    return {name: value for name, value in values.items() if value is not None}


# -- tests and evidence -----------------------------------------------------------------------------


class TestRunAnswer(Answer):
    """One run of the test command (worker/attempts/verifier.py `TestRun`)."""

    __test__ = False  # not a pytest test class, whatever its name

    exit_code: int | None = Field(description="None: the command did not run to an exit")
    log: str = ""
    timed_out: bool = False
    seconds: Seconds = 0.0
    counts: dict[str, int] | None = Field(
        default=None, description="tests per outcome (passed, failed, error, skipped) when the runner's report was read"
    )
    tampered: str = Field(default="", description="how the run's own reports disagreed; empty when they agree")
    checks: list[str] = Field(default_factory=list, description="the forgery checks that could not be made, and why")


class ReproductionAnswer(Answer):
    """The patch's own test changes, run on the base source."""

    tests: list[str] = Field(default_factory=list, description="fail there, pass with the whole patch")
    failed_on_base: bool = False
    ran: bool = False
    files: list[str] = Field(default_factory=list, description="the test files the patch adds or changes")


class EvidenceAnswer(Answer):
    """The verdict on a patch and what it rests on (worker/attempts/evidence.py `Evidence`; docs/EVIDENCE.md)."""

    level: str = Field(description="tampered, unrunnable, regressed, reproduced, failed_before or unproven")
    fail_to_pass: list[str] = Field(default_factory=list)
    pass_to_fail: list[str] = Field(default_factory=list)
    still_failing: list[str] = Field(default_factory=list)
    flaky: list[str] = Field(default_factory=list)
    reproduction: ReproductionAnswer = Field(default_factory=ReproductionAnswer)
    per_test: bool = Field(default=False, description="False: judged by exit codes (the runner's report was not read)")
    reason: str = ""
    passing: bool = False
    checks: list[str] = Field(default_factory=list)


class TestsAnswer(Answer):
    """The one `tests` shape: the base run, every patched run, and the reproduction run."""

    __test__ = False

    command: str | None = None
    before: TestRunAnswer | None = None
    after: list[TestRunAnswer] = Field(
        default_factory=list, description="every patched run (FROGFIX_VERIFY_RUNS of them); empty: none ran"
    )
    flaky: bool = Field(default=False, description="whether the patched runs differed")
    reproduction: TestRunAnswer | None = Field(
        default=None, description="the patch's test changes alone on the base source"
    )

    @model_validator(mode="before")
    @classmethod
    def _one_after(cls, data: Any) -> Any:
        """The shape `fix --json` wrote before the one shape (`after`: the first run, `after_runs`: every one)
        read as the list; an attempt's `evidence` kept beside its runs is left to AttemptAnswer."""
        if not isinstance(data, Mapping):
            return data
        values = {key: value for key, value in data.items() if key != "after_runs"}
        after, runs = data.get("after"), data.get("after_runs")
        if isinstance(after, list):
            return values
        if isinstance(runs, list) and runs:
            values["after"] = runs
        else:
            values["after"] = [after] if isinstance(after, Mapping) else []
        return values

    @classmethod
    def read(cls, stored: Any) -> TestsAnswer | None:
        """A stored `tests` dict of any version in the one shape; None for none (or not a dict)."""
        return cls.model_validate(stored) if isinstance(stored, Mapping) and stored else None


def stored_evidence(tests: Any) -> EvidenceAnswer | None:
    """The verdict a forge attempt stores inside its `tests` (worker/texts/mr_text.py `TestEvidence`), if any."""
    verdict = tests.get("evidence") if isinstance(tests, Mapping) else None
    return EvidenceAnswer.model_validate(verdict) if isinstance(verdict, Mapping) and verdict.get("level") else None


# -- usage, endings, selection, environment ----------------------------------------------------------


class UsageAnswer(Answer):
    """What a run cost (app/usage.py `UsageFigures.to_dict`, the one computation of these figures)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cached_share: float | None = Field(default=None, description="cached / prompt tokens; None before any prompt")
    calls: int = Field(default=0, description="model calls")
    steps: int = 0
    model_seconds: Seconds = 0.0
    sandbox_seconds: Seconds = 0.0

    @classmethod
    def of(cls, figures: UsageFigures) -> UsageAnswer:
        return cls.model_validate(figures.to_dict())


class EndingAnswer(Answer):
    """How a job ended (app/endings.py `Ending.to_dict`): its kind, the text shown, and the typed facts
    that were known (a model failure's own words, a forge's answer); app/outcome_words.py words it."""

    kind: EndingKind
    detail: str | None = None
    cause: str = Field(default="", description="a model failure's own words")
    forge: str = Field(default="", description="the forge that answered, when a forge call ended the job")
    call: str = Field(default="", description="what FrogFix asked the forge")
    http_status: int | None = None
    said: str = Field(default="", description="the forge's own words")
    gave_up: str = Field(default="", description="the retries' tail: how many tries in how long")
    transient: bool = Field(default=False, description="worth retrying later")
    redirected: bool = False


class RankedAnswer(Answer):
    """One attempt as the selection rule ranked it (app/selection.py)."""

    attempt: int
    level: str | None = None
    fail_to_pass: int = 0
    regressions: int = 0
    agrees_with: list[int] = Field(default_factory=list)
    checked: list[int] = Field(default_factory=list)
    changed_lines: int = 0


class SelectionAnswer(Answer):
    """How the published attempt was chosen (app/selection.py `Choice`)."""

    chosen: int | None = None
    attempts: int = 0
    why: str = ""
    ranked: list[RankedAnswer] = Field(default_factory=list)


class EnvironmentAnswer(Answer):
    """The test environment a local job built or reused (worker/environment/builder.py `EnvironmentReport`)."""

    ok: bool
    built: bool = False
    cached: bool = False
    seconds: Seconds = 0.0
    project_seconds: Seconds | None = None
    detected: list[str] | None = None
    key: str | None = None
    note: str | None = Field(default=None, description="JavaScript: the sandbox's Node, and any mismatch")
    reason: str | None = None
    log_tail: str | None = None


# -- attempts, events, the MR's thread ---------------------------------------------------------------


class AttemptAnswer(Answer):
    """One attempt at a job: a forge job's attempt row, a local job's attempt, an entry of `fix --json`."""

    id: int | None = Field(default=None, description="a forge attempt's row id; a local attempt's number")
    run: int = Field(default=1, description="the job's run it belongs to")
    number: int
    status: str | None = Field(default=None, description="an attempt status; None in `fix --json`, which has `outcome`")
    outcome: str | None = Field(default=None, description="how `fix` judged it: fixed, unproven, no_fix, tampered, ...")
    reason: str | None = None
    chosen: bool = False
    exit_reason: str | None = None
    steps: int = 0
    changed_lines: int | None = None
    trajectory_path: str | None = None
    patch: str | None = None
    summary: str | None = None
    tests: TestsAnswer | None = None
    evidence: EvidenceAnswer | None = None
    flags: list[str] = Field(default_factory=list)
    error: str | None = None
    started_at: Moment = None
    finished_at: Moment = None
    usage: UsageAnswer | None = None

    @model_validator(mode="before")
    @classmethod
    def _evidence_beside_tests(cls, data: Any) -> Any:
        """A stored attempt keeps its verdict inside `tests`; the answer has it beside them, as `fix` does."""
        if not isinstance(data, Mapping | BaseModel):
            data = _fields_of(cls, data)  # an attempt row (app/models.py `JobAttempt`), read by name
        if isinstance(data, Mapping) and not data.get("evidence"):
            verdict = stored_evidence(data.get("tests"))
            if verdict is not None:
                return {**data, "evidence": verdict}
        return data

    @classmethod
    def of(cls, row: Any) -> AttemptAnswer:
        """A forge job's attempt row (app/models.py `JobAttempt`): its usage is its own columns."""
        values = _fields_of(cls, row)
        values.update(flags=row.flags or [], usage=UsageAnswer.of(UsageFigures.of(row)))
        return cls.model_validate(values)


class EventAnswer(Answer):
    """One entry of a job's timeline."""

    id: int
    at: Moment = None
    kind: str
    message: str = ""
    data: dict[str, Any] | None = None


class ThreadJobAnswer(Answer):
    """One job of an MR's thread: round 0 (the job that opened the MR) or a round on it (app/jobs/read_model.py
    `thread_jobs`): `round_kind` a RoundKind (None for round 0), `start_commit` the branch head it built on,
    `ci_status` the forge's CI on `pushed_commit`."""

    id: int
    round: int
    round_kind: str | None = None
    trigger_user: str | None = None
    status: str
    cancel_requested: bool = False
    start_commit: str | None = None
    pushed_commit: str | None = None
    ci_status: str | None = None
    mr_url: str | None = None
    mr_number: int | None = None
    created_at: Moment = None
    finished_at: Moment = None


class RequestAnswer(Answer):
    """A comment, review or CI result on the MR (app/jobs/read_model.py `request_answer`): `kind` review, stop or
    ci; `status` a RequestStatus; `job_id` the round that took it; `ci_jobs` the failing CI jobs' names."""

    id: int
    kind: str
    status: str
    reason: str | None = None
    author: str | None = None
    job_id: int | None = None
    created_at: Moment = None
    comment_kind: str | None = None
    path: str | None = None
    line: int | None = None
    text: str = ""
    text_cut: bool = False
    url: str | None = None
    ci_status: str | None = None
    ci_jobs: list[str] = Field(default_factory=list)

    @property
    def location(self) -> str | None:
        """`path:line` of a line comment, the path alone when the forge gave no line (the job page shows it)."""
        if not self.path:
            return None
        return f"{self.path}:{self.line}" if self.line is not None else self.path


class ThreadAnswer(Answer):
    """The MR a job belongs to: its jobs, the requests this job took, those waiting and those turned down."""

    current: int
    mr_number: int | None = None
    jobs: list[ThreadJobAnswer] = Field(default_factory=list)
    requests: list[RequestAnswer] = Field(default_factory=list)
    waiting: list[RequestAnswer] = Field(default_factory=list)
    turned_down: list[RequestAnswer] = Field(default_factory=list)


# -- jobs ---------------------------------------------------------------------------------------------


class JobAnswer(Answer):
    """A job as `/api/jobs` and `jobs --json` list it (../shared/DESIGN.md's `/api/jobs` contract)."""

    id: int = Field(description="the job's number")
    forge: str = Field(description="gitlab, gitea, or local for a run of fix or demo")
    project: str = Field(description="path with namespace; a local job's repository folder (absolute)")
    issue: int | None = Field(description="the issue's number in its project; a local job numbers its folder's runs")
    issue_url: str | None = None
    title: str | None = None
    status: str
    trigger_user: str | None = None
    attempt: int = Field(default=0, description="`run` under its first name, for clients written before `run`")
    run: int = 0
    base_commit: str | None = None
    branch: str | None = None
    mr_url: str | None = None
    error: str | None = None
    cancel_requested: bool = False
    hold_reason: str | None = Field(default=None, description="why a queued job waits for its project's budget")
    steps: int = 0
    exit_reason: str | None = None
    ending: EndingAnswer | None = None
    flags: list[str] = Field(default_factory=list)
    created_at: Moment = None
    updated_at: Moment = None
    started_at: Moment = None
    finished_at: Moment = None
    usage: UsageAnswer | None = Field(default=None, description="the sums over its attempts")
    thread_id: int | None = None
    round: int = 0
    round_kind: str | None = None
    mr_number: int | None = None
    start_commit: str | None = None
    pushed_commit: str | None = None
    ci_status: str | None = None
    selection: SelectionAnswer | None = None
    asked_at: Moment = None
    queue_wait_seconds: Seconds | None = Field(default=None, description="enqueue to claim, latest run")
    queue_wait_total_seconds: Seconds | None = Field(default=None, description="enqueue to claim, all runs added up")

    @classmethod
    def of(cls, job: Any) -> JobAnswer:
        """A job's row (app/models.py `Job`), a forge's or a local one's alike."""
        values = _fields_of(cls, job)
        values.update(attempt=job.run, flags=job.flags or [], usage=UsageAnswer.of(job.usage),
                      ending=ending.to_dict() if (ending := job.ending) is not None else None)
        values["selection"] = job.selection if isinstance(job.selection, Mapping) else None
        return cls.model_validate(values)


class JobDetailAnswer(JobAnswer):
    """One job as `/api/jobs/{id}` and `show --json` answer: its timeline, attempts, thread, and the
    chosen attempt's (else the latest's) tests, evidence and patch, as `fix --json` has them."""

    body: str | None = None
    events: list[EventAnswer] = Field(default_factory=list)
    attempts: list[AttemptAnswer] = Field(default_factory=list)
    thread: ThreadAnswer | None = Field(default=None, description="null for a job that opened no MR")
    tests: TestsAnswer | None = None
    evidence: EvidenceAnswer | None = None
    patch: str | None = None
    summary: str | None = None
    trajectory: str | None = None
    model: str | None = None
    model_url: str | None = None
    environment: EnvironmentAnswer | None = None

    @classmethod
    def of_parts(
        cls, job: JobAnswer, events: list[EventAnswer], attempts: list[AttemptAnswer], **more: Any
    ) -> JobDetailAnswer:
        """The job with its timeline and attempts; what `more` leaves out is the shown attempt's."""
        shown = next((a for a in attempts if a.chosen), attempts[-1] if attempts else None)
        values: dict[str, Any] = {**dict(job), "events": events, "attempts": attempts}
        if shown is not None:
            values.update(tests=shown.tests, evidence=shown.evidence, patch=shown.patch, summary=shown.summary,
                          trajectory=shown.trajectory_path)
        values.update(more)
        return cls.model_validate(values)


class JobListAnswer(Answer):
    """A page of jobs, newest first, and how many match."""

    items: list[JobAnswer]
    total: int


class FixAnswer(Answer):
    """`fix --json`'s object: the chosen attempt's outcome (the last one's when none is chosen)."""

    status: str = Field(description="fixed, unproven, no_fix, environment_error, failed or tampered")
    exit_reason: str | None = None
    ending: EndingAnswer | None = None
    steps: int = 0
    patch: str = ""
    tests: TestsAnswer = Field(default_factory=TestsAnswer)
    evidence: EvidenceAnswer | None = None
    trajectory: str = Field(default="", description="the saved trajectory file; empty when the agent did not run")
    job_id: int | None = Field(description="the job's row (a local job is a job: `show`, `retry`, `cancel` take it); "
                               "null when fix stopped before making one (the model server did not answer)")
    error: str | None = None
    flags: list[str] = Field(default_factory=list)
    summary: str = ""
    usage: UsageAnswer = Field(default_factory=UsageAnswer)
    environment: EnvironmentAnswer | None = None
    attempts: list[AttemptAnswer] = Field(default_factory=list)
    selection: SelectionAnswer | None = None
    attestation_bundle: str | None = Field(default=None, description="demo: the bundle file of its signed change")
    verify: str | None = Field(default=None, description="demo: the command that verifies and replays that bundle")


class AttestationAnswer(Answer):
    """One signed statement of a job (app/attestations): its DSSE envelope, and what verify and replay need
    beside it: the patch as pushed and the trajectory its digest chain covers (null when gone)."""

    kind: str
    envelope: dict[str, Any]
    patch: str = ""
    trajectory: dict[str, Any] | None = None


class AttestationLogAnswer(Answer):
    """The stretch of the append-only log from the job's first statement to its last: `previous` is the
    digest of the entry before it, each entry names the one before it (`prev`)."""

    previous: str
    entries: list[dict[str, Any]] = Field(default_factory=list)


class AttestationBundleAnswer(Answer):
    """`/api/jobs/{id}/attestations`: what `manage.py verify BUNDLE` checks."""

    format: str
    job: int
    attestations: list[AttestationAnswer] = Field(default_factory=list)
    log: AttestationLogAnswer
