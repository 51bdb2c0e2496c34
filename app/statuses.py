"""The one list of job statuses, attempt statuses, exit reasons and `fix` outcomes, with their groups.

Every other module names these through this one, so a status added here reaches the database
guards, the dashboard and the CLI at once. The enums are StrEnums: a member compares equal to
the string stored in the database or written in a trajectory. The groups are tuples of plain
strings, so they bind as SQL parameters on any driver.

Standard library only: worker/leaf (which imports no database or web code) uses it too.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final


class JobStatus(StrEnum):
    """A job's place in its life: the `jobs.status` column."""

    queued = "queued"
    running = "running"
    verifying = "verifying"
    publishing = "publishing"
    done = "done"
    no_fix = "no_fix"
    failed = "failed"
    cancelled = "cancelled"
    rejected = "rejected"


class AttemptStatus(StrEnum):
    """How one attempt ended: the `job_attempts.status` column."""

    running = "running"
    verified = "verified"
    unproven = "unproven"  # passed, but nothing reproduces the bug or failed before (publishable, marked)
    tampered = "tampered"  # its test results were forged (evidence level tampered): never published
    no_fix = "no_fix"
    failed = "failed"
    rejected = "rejected"
    cancelled = "cancelled"


class ExitReason(StrEnum):
    """Why an agent run stopped: the Leaf loop's reasons, then those only `manage.py fix` reports."""

    agent = "agent"
    max_turns = "max_turns"
    max_time = "max_time"
    max_context_len = "max_context_len"
    max_tokens_per_turn = "max_tokens_per_turn"
    llm_query_error = "llm_query_error"
    tool_error = "tool_error"
    cancelled = "cancelled"
    git_error = "git_error"
    config_error = "config_error"
    environment_error = "environment_error"  # the environment or the base commit's tests (no model call)


class EvidenceLevel(StrEnum):
    """What the tests prove about a patch (worker/attempts/evidence.py decides it; everything else reads it).

    tampered: a run with the patch reported what did not happen (its sentinels, summary line, exit code
    or results disagree; worker/attempts/run_checks.py), ranked above every other level: never fixed, never
    chosen, never published; unrunnable: the tests could not run with the patch; regressed: a test
    that did not fail on the base fails with it; reproduced: the patch's own tests fail on the base
    source and pass with the fix; failed_before: tests that failed on the base pass with it;
    unproven: none of these.
    """

    tampered = "tampered"
    unrunnable = "unrunnable"
    regressed = "regressed"
    reproduced = "reproduced"
    failed_before = "failed_before"
    unproven = "unproven"


class AttemptOutcome(StrEnum):
    """How an attempt ended (worker/attempts/attempt.py decides it; `AttemptResult.status` maps it to the attempt row's
    status); replay's report, `fix --json`'s attempts and an evaluation's result rows say it too."""

    verified = "verified"  # the evidence proves the fix (worker/attempts/evidence.py: reproduced or failed_before)
    tampered = "tampered"  # a run with the patch reported what did not happen: never chosen, never published
    unproven = "unproven"  # the tests pass, but nothing failed before and nothing reproduces the bug
    not_verified = "not_verified"  # tests failed, timed out or were flaky
    refused = "refused"  # a review rule (or the patch size) refused the patch: never tested, never pushed
    no_patch = "no_patch"
    no_test_command = "no_test_command"
    cancelled = "cancelled"
    unreviewed = "unreviewed"  # a plain replay: the agent's run and patch only


class ReplayStatus(StrEnum):
    """How `manage.py replay` (and eval's live attempt) ended: worker/commands/replay.py's report, its CLI exit code."""

    reproduced = "reproduced"  # every tool result matched and the patch is the same
    diverged = "diverged"  # a tool result differed: the report names the first
    patch_differs = "patch_differs"  # the same steps, another patch
    live = "live"  # a live run (the current model), judged like the pipeline's attempts
    queued = "queued"  # handed to a worker (the dashboard's request)


class FixStatus(StrEnum):
    """The outcome `manage.py fix` prints (DESIGN: `fixed`, `no_fix` or `failed`).

    `fixed` only for the evidence levels reproduced and failed_before; `unproven` for a patch that
    passes but proves nothing."""

    fixed = "fixed"
    unproven = "unproven"
    tampered = "tampered"  # every attempt that changed code forged its test results: nothing is proposed
    no_fix = "no_fix"
    failed = "failed"
    environment_error = "environment_error"  # the tests could not run: no model call was made


class RoundKind(StrEnum):
    """Why a job is a round on an MR FrogFix opened (`jobs.round_kind`; NULL for the job that opened it)."""

    review = "review"  # a member's comment, line comment or change request
    ci = "ci"  # a failed pipeline or commit status on the bot's branch
    update = "update"  # the target branch merged in: `/frogfix rebase`, or a conflict FROGFIX_AUTO_UPDATE saw


class RequestStatus(StrEnum):
    """A round request's place (`round_requests.status`): each comment or CI result is judged once.

    pending: recorded by the webhook, not yet judged by the worker's triage; accepted: it asks
    for a round, waiting for one; taken: a round took it (`job_id`); ignored: triage said no
    (`reason`); dropped: `/frogfix stop`, a removed label or a closed MR let it go.
    """

    pending = "pending"
    accepted = "accepted"
    taken = "taken"
    ignored = "ignored"
    dropped = "dropped"


def _values(*members: StrEnum) -> tuple[str, ...]:
    return tuple(m.value for m in members)


ACTIVE_STATUSES: Final[tuple[str, ...]] = _values(
    JobStatus.queued, JobStatus.running, JobStatus.verifying, JobStatus.publishing
)
FINAL_STATUSES: Final[tuple[str, ...]] = _values(
    JobStatus.done, JobStatus.no_fix, JobStatus.failed, JobStatus.cancelled, JobStatus.rejected
)
# A claimed job's statuses while the run that claimed it owns it.
RUN_STATUSES: Final[tuple[str, ...]] = _values(JobStatus.running, JobStatus.verifying, JobStatus.publishing)
# A claimed job's statuses a cancel can still stop: once `publishing`, the push goes ahead (the move to
# publishing is guarded on no cancel having been asked, so a cancel lands on one side of it).
CANCELLABLE_RUN_STATUSES: Final[tuple[str, ...]] = _values(JobStatus.running, JobStatus.verifying)
# Finished jobs whose recorded run is a model's verdict (its tests ran; with or without a fix): what
# `manage.py eval` takes by default. failed / cancelled / rejected have none (crash, outage, operator).
VERDICT_STATUSES: Final[tuple[str, ...]] = _values(JobStatus.done, JobStatus.no_fix)
LOCAL_VERDICT_STATUSES: Final[tuple[str, ...]] = _values(FixStatus.fixed, FixStatus.no_fix)
# Finished jobs an operator may queue again as a new run.
RETRYABLE_STATUSES: Final[tuple[str, ...]] = _values(
    JobStatus.failed, JobStatus.no_fix, JobStatus.cancelled, JobStatus.rejected
)
SUCCESS_STATUSES: Final[tuple[str, ...]] = _values(JobStatus.done)
# Jobs that ran to a verdict (the dashboard's success rate and durations count these).
OUTCOME_STATUSES: Final[tuple[str, ...]] = _values(JobStatus.done, JobStatus.no_fix, JobStatus.failed)

# Every reason the Leaf loop can stop for, in the order the loop documents them.
LEAF_EXITS: Final[tuple[str, ...]] = _values(
    ExitReason.agent,
    ExitReason.max_turns,
    ExitReason.max_time,
    ExitReason.max_context_len,
    ExitReason.max_tokens_per_turn,
    ExitReason.llm_query_error,
    ExitReason.tool_error,
    ExitReason.cancelled,
)
# Exits that mean the infrastructure (model server, sandbox) failed, not that the agent found no fix.
INFRA_EXITS: Final[tuple[str, ...]] = _values(ExitReason.llm_query_error, ExitReason.tool_error)

# The evidence levels that prove a fix, the strongest first (worker/attempts/evidence.py `proves_fix`, an update round's
# proof to keep).
PROVEN_LEVELS: Final[tuple[str, ...]] = _values(EvidenceLevel.reproduced, EvidenceLevel.failed_before)

# -- what the dashboard shows -------------------------------------------------------------------

STATUS_ORDER: Final[tuple[str, ...]] = tuple(s.value for s in JobStatus)
# A job's status, and `fix`'s outcomes (a local job's status): `no fix`, `environment error`.
STATUS_LABELS: Final[dict[str, str]] = {s.value: s.value.replace("_", " ") for s in (*JobStatus, *FixStatus)}
EXIT_LABELS: Final[dict[str, str]] = {
    ExitReason.agent.value: "the agent finished",
    ExitReason.max_turns.value: "step limit reached",
    ExitReason.max_time.value: "time limit reached",
    ExitReason.max_context_len.value: "context full",
    ExitReason.max_tokens_per_turn.value: "reply too long",
    ExitReason.llm_query_error.value: "model unreachable",
    ExitReason.tool_error.value: "sandbox failure",
    ExitReason.cancelled.value: "cancelled",
    ExitReason.git_error.value: "git failed",
    ExitReason.config_error.value: ".frogfix.yml not usable",
    ExitReason.environment_error.value: "test environment not usable",
}
# What an evidence level proves, as a clause (app/outcome_words.py `tests_line`).
EVIDENCE_LABELS: Final[dict[str, str]] = {
    EvidenceLevel.reproduced.value: "proves the fix",
    EvidenceLevel.failed_before.value: "proves the fix",
    EvidenceLevel.unproven.value: "proves nothing",
    EvidenceLevel.regressed.value: "breaks a test",
    EvidenceLevel.unrunnable.value: "the tests could not run with the patch",
    EvidenceLevel.tampered.value: "its test results were forged",
}


def fix_status(job_status: str, attempt_status: str | None) -> FixStatus:
    """`fix`'s word for a local job: a view of the job's status and its reported attempt's (the chosen one,
    else the first tampered, else the last): `fixed` only when the patch was kept and its evidence proves it."""
    if attempt_status == AttemptStatus.verified and job_status == JobStatus.done:
        return FixStatus.fixed
    if attempt_status == AttemptStatus.unproven and job_status in VERDICT_STATUSES:
        return FixStatus.unproven  # kept, or held back by FROGFIX_REQUIRE_REPRODUCTION
    if attempt_status == AttemptStatus.tampered and job_status == JobStatus.no_fix:
        return FixStatus.tampered
    return FixStatus.no_fix if job_status == JobStatus.no_fix else FixStatus.failed


def status_label(status: str) -> str:
    """A status as people read it (`no fix`); an unknown one as it is stored."""
    return STATUS_LABELS.get(status, status)


def exit_label(reason: str | None) -> str:
    """An exit reason as people read it; an unknown one as it is stored, none as a dash."""
    return EXIT_LABELS.get(reason or "", reason or "—")
