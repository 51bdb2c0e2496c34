"""`manage.py replay`: run a recorded attempt again and say whether it comes out the same.

A plain replay feeds the attempt's recorded assistant replies back to the Leaf loop (a
`ReplayModel`: no model server), in a fresh sandbox over a fresh workspace at the commit the
attempt started from, with the recorded system prompt and task. That is the base commit, except
for a review round on an MR, which started from the branch head (`start_commit`: the
trajectory's field, else the job's column); its patch is against that head too. Every message
the loop appends is compared, in order, with the recorded one; the replay stops at the first
tool result that differs (the loop's `cancel` hook compares before every tool call and model
call, so nothing runs after the divergence). Then the patch is compared with the recorded
`output_patch`. A plain replay never publishes and never changes the job's status; it notes
its outcome on the job's timeline (`replayed`) and writes its own trajectory under
`<data_dir>/trajectories/replays/`. Only what happened to the job is written there: a replay
refused before it starts (no such attempt, nothing to replay, a bad option) changes no job's
history, unless the dashboard put its request on the timeline (`requested`), whose outcome the
refusal then is (`replay_failed`).

`live=True` runs the recorded task again with the live model, in this process, as a new attempt
that is never published (a fresh sandbox, then the tests on its patch in another). Its
trajectory is written under replays/ and it is noted on the timeline, not in the job's attempts.
`live=True, publish=True` instead queues the job again as a new run (`transitions.retry_job`, then the
task once that is committed): the normal pipeline runs it with the live model, verifies it and
updates the job's one draft MR. `publish` without `live` is refused: a replay reproduces a patch
the job already published or refused.

Where a recording ends without a natural exit (`cancelled`, `tool_error`, `max_time`, or a
trajectory cut short by a crash), the replay stops where the recording ends.

Normaliser: outputs that legitimately vary between runs are rewritten the same way on both
sides before comparing, by these rules and no others (`NORMALISE_RULES`):
  1. durations after "in": `in 0.12s`, `in 61.02s (0:01:01)` -> `in <T>s` (pytest, unittest);
  2. names directly under /tmp: `/tmp/pytest-of-x/...` -> `/tmp/<tmp>/...`;
  3. process ids: `pid 4242`, `pid=4242`, `PID: 4242` -> `pid <pid>`;
  4. addresses: `0x7f3a2c1b9e80` (six or more hex digits) -> `0x<addr>` (Python reprs).
The replayed output is also passed through the secret redactor first, as the recorded one was
when it was saved.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app import trajectory
from app.attempt_events import TEST_PROGRESS_EVENTS, AttemptEvent, AttemptEventKind
from app.db import session_scope
from app.endings import Ending
from app.jobs import records
from app.jobs.requeue import requeue_and_send
from app.logs import get_logger
from app.patches import patch_size
from app.redaction import SecretRedactor
from app.settings import Settings, get_settings
from app.statuses import ACTIVE_STATUSES, ExitReason, ReplayStatus
from sandbox.base import SandboxError
from worker.attempts.attempt import (
    AttemptOutcome,
    AttemptResult,
    AttemptRunner,
    AttemptSpec,
    ReviewPolicy,
    attempt_spec,
)
from worker.attempts.repo_config import RepoConfigError
from worker.commands.recorded import (
    Progress,
    Recording,
    ReplayError,
    RepoSource,
    find_recording,
    parse_job_id,
    recording_from_file,
    repo_source,
    resolution_of,
)
from worker.environment.report import EnvironmentUnusable
from worker.git import gitcalls, merging, workspace_pool
from worker.leaf.loop import LeafLimits, StepRecord, plan_calls
from worker.leaf.model import ModelClient, ModelQueryError, ModelReply, ReplayModel
from worker.leaf.prompts import strip_guidance
from worker.wiring import leaf_limits_from, model_from

log = get_logger("frogfix.replay")

# Exits the replay reproduces by itself; for any other the recording just stops, and so does the replay.
NATURAL_EXITS = frozenset(
    {ExitReason.agent, ExitReason.max_turns, ExitReason.max_context_len, ExitReason.max_tokens_per_turn,
     ExitReason.llm_query_error}
)
EXCERPT_CHARS = 200

NORMALISE_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\bin \d+(?:\.\d+)?s\b(?: \(\d+:\d\d:\d\d\))?"), "in <T>s"),
    (re.compile(r"/tmp/[^\s/'\":]+"), "/tmp/<tmp>"),
    (re.compile(r"\bpid\b[ \t]*[=:]?[ \t]*\d+", re.IGNORECASE), "pid <pid>"),
    (re.compile(r"\b0x[0-9a-fA-F]{6,}\b"), "0x<addr>"),
)


def normalise(text: str) -> str:
    """Rewrite what legitimately varies between runs (see the module docstring), nothing else."""
    for pattern, replacement in NORMALISE_RULES:
        text = pattern.sub(replacement, text)
    return text


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------


@dataclass
class Divergence:
    """The first place where the replay and the recording part ways."""

    step_index: int  # 0-based, as in the trajectory's `steps`
    tool: str | None  # None: the run itself ended early, no one tool result differs
    call_id: str | None
    reason: str
    expected: str  # excerpts of the normalised outputs around the first differing character
    actual: str
    line: int | None = None  # line of the first difference in the expected output

    @property
    def step(self) -> int:
        """1-based, as the progress lines count."""
        return self.step_index + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "step_index": self.step_index,
            "tool": self.tool,
            "call_id": self.call_id,
            "reason": self.reason,
            "line": self.line,
            "expected": self.expected,
            "actual": self.actual,
        }


@dataclass
class ReplayReport:
    """What a replay found; `status` is reproduced, diverged, patch_differs, live or queued."""

    job_id: int | str
    mode: str  # replay, live, queued
    status: str
    message: str
    run: int | None = None
    number: int | None = None
    recorded_trajectory: str | None = None
    trajectory: str | None = None
    base_commit: str | None = None
    start_commit: str | None = None  # a review round's: the branch head it built on (None: the base)
    steps_recorded: int = 0
    steps_replayed: int = 0
    tool_results_checked: int = 0
    divergence: Divergence | None = None
    recorded_exit_reason: str | None = None
    exit_reason: str | None = None
    exit_matches: bool | None = None
    reached_recording_end: bool = False
    recorded_patch: str | None = None
    patch: str | None = None
    patch_identical: bool | None = None
    tests_after: dict[str, Any] | None = None
    error: str | None = None
    ending: Ending | None = None  # how the attempt ended when it did not pass, typed (app/endings.py)
    notes: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # live: the review rules' reasons, as the pipeline gives them
    verified: bool | None = None  # live: the patch passed every verification run
    outcome: AttemptOutcome | None = None  # the attempt's (unreviewed for a plain replay)
    usage: dict[str, Any] | None = None  # the attempt's usage figures (tokens, cached, model seconds)

    @property
    def attempt_label(self) -> str:
        if self.run is None or self.number is None:
            return "local job" if isinstance(self.job_id, str) else "new run"
        return f"run {self.run}, attempt {self.number}"

    @property
    def exit_code(self) -> int:
        """For the CLI: 0 reproduced (or queued, or a live run with a patch), 1 otherwise."""
        if self.status in (ReplayStatus.reproduced, ReplayStatus.queued):
            return 0
        if self.status == ReplayStatus.live:
            return 0 if self.patch and not self.refused else 1
        return 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "mode": self.mode,
            "status": self.status,
            "message": self.message,
            "attempt": {"run": self.run, "number": self.number},
            "recorded_trajectory": self.recorded_trajectory,
            "trajectory": self.trajectory,
            "base_commit": self.base_commit,
            "start_commit": self.start_commit,
            "steps_recorded": self.steps_recorded,
            "steps_replayed": self.steps_replayed,
            "tool_results_checked": self.tool_results_checked,
            "divergence": self.divergence.to_dict() if self.divergence else None,
            "recorded_exit_reason": self.recorded_exit_reason,
            "exit_reason": self.exit_reason,
            "exit_matches": self.exit_matches,
            "reached_recording_end": self.reached_recording_end,
            "patch_identical": self.patch_identical,
            "recorded_patch": self.recorded_patch,
            "patch": self.patch,
            "tests_after": self.tests_after,
            "error": self.error,
            "ending": self.ending.to_dict() if self.ending else None,
            "notes": self.notes,
            "refused": self.refused,
            "verified": self.verified,
            "outcome": self.outcome,
            "usage": self.usage,
        }


# ---------------------------------------------------------------------------------------------
# Comparing as the loop goes
# ---------------------------------------------------------------------------------------------


def _excerpts(expected: str, actual: str) -> tuple[str, str, int]:
    """Both texts around their first differing character, and that character's line."""
    first = next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b),
                 min(len(expected), len(actual)))
    # From the start of a line, a third of the excerpt before the difference.
    start = expected.rfind("\n", 0, first - EXCERPT_CHARS // 3) + 1 if first > EXCERPT_CHARS // 3 else 0

    def cut(text: str) -> str:
        piece = text[start:start + EXCERPT_CHARS]
        return ("…" if start else "") + piece + ("…" if start + EXCERPT_CHARS < len(text) else "")

    return cut(expected), cut(actual), expected.count("\n", 0, first) + 1


class Checker:
    """Compares the loop's live history with the recorded one, message by message, as it grows.

    `should_stop` is the loop's cancel hook: it is polled before every model call and every tool
    call, so it sees each tool result right after it was appended and stops the run at the first
    that differs (and, for recordings without a natural end, where the recording ends).
    """

    def __init__(self, recorded: list[dict[str, Any]], redact: Callable[[str], str], *, stop_at_end: bool) -> None:
        self.recorded = recorded
        self.redact = redact
        self.stop_at_end = stop_at_end
        self.live: list[dict[str, Any]] | None = None
        self.position = 2  # the system prompt and the task are the recording's own
        self.checked = 0
        self.divergence: Divergence | None = None
        self.reached_end = False
        self.replies_left: Callable[[], int] = lambda: 0

    def _step_and_tool(self, index: int, call_id: str) -> tuple[int, str]:
        assert self.live is not None
        step, owner = -1, None
        for message in self.live[2:index]:
            if message.get("role") == "assistant":
                step, owner = step + 1, message
        name = "?"
        if owner is not None:
            planned, _ = plan_calls(owner, step)
            name = next((p.name for p in planned if p.call_id == call_id), "?") or "?"
        return max(step, 0), name

    def _diverge(self, index: int, call_id: str, reason: str, expected: str, actual: str) -> Divergence:
        step, tool = self._step_and_tool(index, call_id)
        want, got, line = _excerpts(expected, actual)
        self.divergence = Divergence(step, tool, call_id, reason, want, got, line)
        return self.divergence

    def check(self) -> Divergence | None:
        """Compare every message appended since the last check; the first difference sticks."""
        live = self.live
        if live is None or self.divergence is not None:
            return self.divergence
        while self.position < len(live):
            index = self.position
            got = live[index]
            call_id = str(got.get("tool_call_id") or "")
            if index >= len(self.recorded):
                return self._diverge(index, call_id, "the recording has no such message: it ended before this",
                                     "", str(got.get("content") or ""))
            want = self.recorded[index]
            if got.get("role") != want.get("role"):
                return self._diverge(index, call_id or str(want.get("tool_call_id") or ""),
                                     f"the replay has a {got.get('role')} message where the recording has "
                                     f"a {want.get('role')} message", str(want.get("content") or ""),
                                     str(got.get("content") or ""))
            if got.get("role") == "tool":
                if call_id != want.get("tool_call_id"):
                    return self._diverge(index, call_id, f"call id {call_id!r} where the recording has "
                                         f"{want.get('tool_call_id')!r}", str(want.get("tool_call_id")), call_id)
                expected = normalise(str(want.get("content") or ""))
                actual = normalise(self.redact(str(got.get("content") or "")))
                if expected != actual:
                    return self._diverge(index, call_id, "the tool result differs from the recording",
                                         expected, actual)
                self.checked += 1
            self.position += 1
        return None

    def should_stop(self) -> bool:
        if self.check() is not None:
            return True
        if (
            self.stop_at_end
            and self.live is not None
            and len(self.live) >= len(self.recorded)
            and self.replies_left() == 0
        ):
            self.reached_end = True
            return True
        return False


class _ReplayingModel:
    """The recorded replies, handing the loop's live history to the checker on every call."""

    def __init__(self, inner: ReplayModel, checker: Checker) -> None:
        self.inner, self.checker = inner, checker
        self.ran_out = False
        checker.replies_left = lambda: inner.remaining

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
        max_completion_tokens: int | None = None,
    ) -> ModelReply:
        if isinstance(messages, list):
            self.checker.live = messages
        if self.inner.remaining == 0:
            self.ran_out = True
            raise ModelQueryError("replay: the recording has no further reply")
        return self.inner.complete(messages, tools, timeout=timeout, max_completion_tokens=max_completion_tokens)


# ---------------------------------------------------------------------------------------------
# Running it
# ---------------------------------------------------------------------------------------------


def _safe_label(job_id: int | str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(job_id))[:100]


class ReplayObserver:
    """Progress lines; in a plain replay the checker compares every step and stops the loop at the first difference."""

    def __init__(self, checker: Checker | None, progress: Progress, total: int) -> None:
        self.checker, self.progress, self.total = checker, progress, total

    def on_step(self, record: StepRecord) -> None:
        names = ", ".join(c.name for c in record.calls) or "final answer"
        if self.checker is None:
            self.progress(f"step {record.step + 1}: {names}")
            return
        self.checker.live = record.history
        verdict = "DIFFERS" if self.checker.check() is not None else "ok"
        self.progress(f"step {record.step + 1}/{self.total}: {names}: {verdict}")

    def cancelled(self) -> bool:
        return self.checker.should_stop() if self.checker is not None else False

    def report(self, event: AttemptEvent) -> None:
        if event.kind in TEST_PROGRESS_EVENTS or event.kind == AttemptEventKind.patch_refused:
            self.progress(event.message)


def _replay_model(rec: Recording, settings: Settings, live: bool, model: ModelClient | None,
                  checker: Checker | None) -> tuple[ModelClient, _ReplayingModel | None, LeafLimits]:
    """The live model (or `model`), or the recorded replies with as many steps as were recorded."""
    limits = leaf_limits_from(settings)
    if live or checker is None:
        return (model if model is not None else model_from(settings)), None, limits
    replaying = _ReplayingModel(ReplayModel.from_trajectory(rec.data), checker)
    # One more step where the recording just stops, so the loop reaches the check that ends it
    # there rather than running out of steps first.
    extra = 0 if rec.exit_reason in NATURAL_EXITS else 1
    return replaying, replaying, replace(limits, max_steps=max(rec.n_steps, rec.replies, 1) + extra)


def _spec(
    rec: Recording, settings: Settings, mode: str, limits: LeafLimits, fields: dict[str, Any] | None = None,
    resolution: merging.Resolution | None = None,
) -> AttemptSpec:
    """The recorded system prompt and task, run again under the recorded (or, live, the current) model.

    A plain replay sends the recorded task as it is, guidance included; a live run reads the
    guidance from the base commit again, as the pipeline does, in place of the recorded one.
    The workspace is made at `checkout_commit` (a round's start) and the patch taken against it;
    the replay's trajectory still records the job's base commit, and the round's start beside it.
    An update round's attempt (`resolution`) keeps the target as its base, as it ran: its start is a
    conflicted merge no test can run on.
    """
    messages = rec.messages
    live = mode != "replay"
    task = str(messages[1].get("content") or "")
    recorded = None if live else {
        "model_label": f"replay of {rec.data.get('model')}", "sampling": dict(rec.data.get("sampling") or {}),
    }
    return attempt_spec(
        settings,
        job_id=rec.job_id,
        number=rec.number or 1,
        base_commit=rec.base_commit if resolution is not None else rec.checkout_commit,
        start_commit=rec.start_commit if resolution is not None else None,
        resolution=resolution,
        task=strip_guidance(task) if live else task,
        limits=limits,
        trajectory=trajectory.replay_path(rec.path, mode),
        system=str(messages[0].get("content") or ""),
        recorded=recorded,
        fields={
            "mode": mode, "replay_of": str(rec.path), "run": rec.run, "attempt": rec.number,
            **({"base_commit": rec.base_commit, "start_commit": rec.start_commit} if rec.start_commit else {}),
            **(fields or {}),
        },
        labels={"frogfix/job": _safe_label(rec.job_id), "frogfix/attempt": mode if live else "replay"},
    )


def _run(
    rec: Recording,
    source: RepoSource,
    settings: Settings,
    redactor: SecretRedactor,
    progress: Progress,
    *,
    live: bool,
    model: ModelClient | None,
    mode: str | None = None,
    fields: dict[str, Any] | None = None,
) -> ReplayReport:
    """The recorded attempt again through the shared attempt runner; live, with the pipeline's review and tests.

    `mode` names a live run's trajectory (`live`, or `eval` for `manage.py eval`); `fields` go into it.
    """
    checker = None if live else Checker(rec.messages, redactor.redact, stop_at_end=rec.exit_reason not in NATURAL_EXITS)
    chosen, replaying, limits = _replay_model(rec, settings, live, model, checker)
    spec = _spec(rec, settings, (mode or "live") if live else "replay", limits, fields, resolution_of(rec, source))
    root = settings.resolved_workspace_dir() / f"replay-{_safe_label(rec.job_id)}-{secrets.token_hex(4)}"
    root.mkdir(parents=True, exist_ok=True)
    runner = AttemptRunner(
        settings, redactor.redact, source, root, ReplayObserver(checker, progress, rec.replies), scope=_scope(rec)
    )
    where = (
        f"the round's start commit {rec.start_commit[:12]} (base {rec.base_commit[:12]})"
        if rec.start_commit
        else f"base commit {rec.base_commit[:12]}"
    )
    progress(f"workspace at {where}; opening the sandbox ({settings.sandbox})")
    try:
        result = runner.run(spec, chosen, ReviewPolicy.from_settings(settings) if live else None)
    except RepoConfigError as exc:
        raise ReplayError(f".frogfix.yml at {rec.checkout_commit[:12]} is not usable: {exc}") from exc
    except SandboxError as exc:
        raise ReplayError(f"the sandbox failed: {exc}") from exc
    except EnvironmentUnusable as exc:
        raise ReplayError(f"the tests cannot run: {exc.report.reason}") from exc
    finally:
        close = getattr(chosen, "close", None) if live and model is None else None
        if callable(close):
            close()
        workspace_pool.remove_workspace(root)
    report = _report(rec, spec, result, settings.data_dir)
    if live:
        return _live_verdict(report, result)
    assert checker is not None and replaying is not None
    return _replay_verdict(report, rec, result, checker, replaying)


def replay_recorded(rec: Recording, source: RepoSource, s: Settings, r: SecretRedactor, say: Progress) -> ReplayReport:
    """A plain replay of a recording read elsewhere (`verify --replay`: a bundle's); no timeline note."""
    return _run(rec, source, s, r, say, live=False, model=None)


def _scope(rec: Recording) -> str:
    """The project the recording belongs to, as the pipeline and `fix` scope its environments."""
    if rec.forge and rec.project:
        return f"{rec.forge}:{rec.project}"
    return f"local:{rec.repository}" if rec.repository else "local"


def run_live_attempt(
    rec: Recording, source: RepoSource, settings: Settings, redactor: SecretRedactor, progress: Progress,
    *, model: ModelClient, mode: str, fields: dict[str, Any],
) -> ReplayReport:
    """One live, never-published attempt at a recorded task (one `eval` attempt), verified like the pipeline."""
    return _run(rec, source, settings, redactor, progress, live=True, model=model, mode=mode, fields=fields)


def _report(rec: Recording, spec: AttemptSpec, result: AttemptResult, data_dir: Path) -> ReplayReport:
    leaf = result.leaf
    return ReplayReport(
        outcome=result.outcome,
        usage=result.usage.to_dict(),
        job_id=rec.job_id,
        mode="replay" if result.outcome == AttemptOutcome.unreviewed else "live",
        status="",
        message="",
        run=rec.run,
        number=rec.number,
        recorded_trajectory=str(rec.path),
        trajectory=str(data_dir / spec.trajectory),
        base_commit=rec.base_commit,
        start_commit=rec.start_commit,
        steps_recorded=rec.replies,
        steps_replayed=len(leaf.records),
        recorded_exit_reason=rec.exit_reason,
        exit_reason=leaf.exit_reason,
        recorded_patch=rec.patch,
        patch=result.patch,
        # The recording holds the sandbox's text (output_patch); so does `sandbox_patch`, judged or not.
        patch_identical=None if rec.patch is None else rec.patch == result.sandbox_patch,
        error=leaf.error,
        ending=_ending(result),
    )


def _ending(result: AttemptResult) -> Ending | None:
    """A plain replay's ending is its loop's failure, if any; a live run's, as the pipeline's attempt ends."""
    if result.outcome == AttemptOutcome.unreviewed:
        return result.leaf.failure
    return None if result.outcome in (AttemptOutcome.verified, AttemptOutcome.unproven) else result.ending


def _live_verdict(report: ReplayReport, result: AttemptResult) -> ReplayReport:
    """A live run is judged like the pipeline's attempts: refused, verified or not, never published."""
    report.status = ReplayStatus.live
    report.refused = list(result.refused)
    report.verified = result.outcome == AttemptOutcome.verified
    verification = result.verification
    if verification is not None:
        # The one `tests` shape (app/answers.py), with the verdict beside the runs, as an attempt's row keeps it.
        report.tests_after = verification.evidence().to_dict()
    same = "the same patch as" if report.patch_identical else "a different patch from"
    leaf = result.leaf
    message = f"live run ended {leaf.exit_reason} after {leaf.steps} steps with "
    message += f"{same} the recording" if result.patch else "no patch"
    if result.refused:
        message += f"; {result.reason}"
    elif report.tests_after:
        message += f"; tests after the patch exit {report.tests_after['after'][0]['exit_code']}"
        message += f", evidence {report.tests_after['evidence']['level']}"
        message += "" if report.verified else f" ({result.reason})"
    report.message = message
    return report


def _replay_verdict(
    report: ReplayReport, rec: Recording, result: AttemptResult, checker: Checker, replaying: _ReplayingModel
) -> ReplayReport:
    """Reproduced, diverged (with the first differing tool result), or the same steps with another patch."""
    leaf, patch = result.leaf, result.patch
    checker.live = leaf.messages
    divergence = checker.check()
    reached_end = checker.reached_end or replaying.ran_out
    if divergence is None and not reached_end and len(leaf.messages) < len(rec.messages):
        checker.divergence = divergence = Divergence(
            max(len(leaf.records) - 1, 0), None, None,
            f"the replay ended ({leaf.exit_reason}{': ' + leaf.error if leaf.error else ''}) "
            f"after {len(leaf.records)} of {rec.replies} recorded steps",
            "", "",
        )
    report.divergence = divergence
    report.tool_results_checked = checker.checked
    report.reached_recording_end = reached_end
    report.exit_matches = divergence is None and (leaf.exit_reason == rec.exit_reason or reached_end)
    lines = patch_size(patch)
    if divergence is not None:
        report.status = ReplayStatus.diverged
        report.message = divergence.reason if divergence.call_id is None else (
            f"step {divergence.step} ({divergence.tool}, call {divergence.call_id}): {divergence.reason}; "
            "the replay stopped there"
        )
    elif report.patch_identical is False:
        report.status = ReplayStatus.patch_differs
        recorded_lines = patch_size(rec.patch)
        report.message = (
            f"every tool result matched, but the patch differs (recorded: {recorded_lines}; replayed: {lines})"
        )
    else:
        report.status = ReplayStatus.reproduced
        report.message = (
            f"{all_matched(checker.checked)}; "
            + (f"the same patch, {lines}" if report.patch_identical else "the recording holds no patch to compare")
        )
    return report


def all_matched(n: int) -> str:
    """A reproduction's tool results, as a sentence: `the 1 tool result matched the recording`, `all 3 ...`."""
    if n == 0:
        return "the recording holds no tool result to compare"
    if n == 1:
        return "the 1 tool result matched the recording"
    return f"all {n} tool results matched the recording"


def matched_count(n: int) -> str:
    """How many tool results matched before the replay ended: `1 tool result matched`, `3 tool results matched`."""
    return f"{n} tool result{'' if n == 1 else 's'} matched"


def queue_again(job_id: int, who: str) -> bool:
    """Queue a finished job again as a new run, then send its task once that is committed.

    False when the broker is unreachable: the job stays queued and the sweep sends it later.
    """
    return requeue_and_send(job_id, who)


def _note(job_id: int | str, kind: str, message: str, data: dict[str, Any] | None = None) -> None:
    """Best effort: the timeline note must not turn a finished replay into a failure."""
    if not isinstance(job_id, int):
        return
    try:
        with session_scope() as session:
            records.add_event(session, job_id, kind, message, data)
    except Exception as exc:
        log.warning("replay_note_failed", job_id=job_id, error=f"{type(exc).__name__}: {exc}"[:300])


def _queue_live_run(key: int | str, who: str, say: Progress) -> ReplayReport:
    """`--live --publish`: the job again as a new run of the normal pipeline, which updates its one MR."""
    if isinstance(key, str):
        raise ReplayError("a local job has no merge request to publish to")
    with session_scope() as session:
        records.get_job(session, key)
    sent = queue_again(key, f"{who} (replay --live --publish)")
    message = (
        f"job {key} is queued again as a new run; the worker runs it with the live model and updates its MR"
        if sent
        else f"job {key} is queued again; the broker is unreachable, so the sweep will send it when it is back"
    )
    say(message)
    return ReplayReport(job_id=key, mode="queued", status=ReplayStatus.queued, message=message)


def _replay_recording(
    rec: Recording,
    where: str,
    settings: Settings,
    redactor: SecretRedactor,
    say: Progress,
    *,
    live: bool,
    model: ModelClient | None,
    repo_dir: Path | None,
) -> ReplayReport:
    """Find the repository, run, and note on the job's timeline whatever stopped the replay from running."""
    source: RepoSource | None = None
    try:
        source = repo_source(rec, settings, redactor.redact, say, repo_dir)
        report = _run(rec, source, settings, redactor, say, live=live, model=model)
        if source.note:
            report.notes.append(source.note)
        return report
    except (ReplayError, gitcalls.RepoError) as exc:
        _note(rec.job_id, "replay_failed", f"replay of {where} could not run: {exc}")
        if isinstance(exc, ReplayError):
            raise
        raise ReplayError(str(exc)) from exc
    except Exception as exc:  # a forge or git failure while fetching: one clear line
        _note(rec.job_id, "replay_failed", f"replay of {where} could not run: {type(exc).__name__}: {exc}")
        raise ReplayError(f"{type(exc).__name__}: {redactor.redact(str(exc))}") from exc
    finally:
        if source is not None:
            source.cleanup()


def replay_job(
    job_id: int | str,
    *,
    attempt: int | str | None = None,
    live: bool = False,
    publish: bool = False,
    progress: Progress | None = None,
    who: str = "manage.py",
    repo_dir: Path | None = None,
    model: ModelClient | None = None,
    settings: Settings | None = None,
    recording: str | None = None,
    requested: bool = False,
) -> ReplayReport:
    """Replay a job's attempt (see the module docstring).

    `recording` replays a live or `manage.py eval` attempt's own trajectory file (a path under the
    data folder, as the eval report lists it) instead of one of the job's attempts. `requested`: the
    replay was asked for on the job's timeline (the dashboard's `replay_requested`), so a refusal is
    noted there as its outcome; otherwise a refused call leaves the job's history as it was.

    Raises `records.UnknownJob` for an unknown id, `ReplayError` when the replay cannot run and
    `transitions.InvalidTransition` when `live and publish` cannot queue the job. `model` replaces the
    live model (tests); `repo_dir` is where a local job's checkout lives now.
    """
    s = settings or get_settings()
    say: Progress = progress or (lambda _m: None)
    key = parse_job_id(job_id)
    if publish and not live:
        raise ReplayError(
            "--publish needs --live: a plain replay reproduces a patch the job already published or refused"
        )
    if live and publish:
        return _queue_live_run(key, who, say)

    redactor = SecretRedactor(s.secret_values())
    try:
        rec = recording_from_file(key, recording, s) if recording else find_recording(key, attempt, s)
    except ReplayError as exc:  # refused before anything ran: the job's history is unchanged
        if requested:  # ... unless the request is on its timeline, waiting for an outcome
            _note(key, "replay_failed", f"replay could not run: {exc}")
        raise
    if live and isinstance(key, int):
        with session_scope() as session:
            status = records.get_job(session, key).status
        if status in ACTIVE_STATUSES:
            raise ReplayError(f"job {key} is {status}; a live run waits until it has finished")
    where = f"run {rec.run}, attempt {rec.number}" if rec.run is not None else "the local run"
    if not live and rec.replies == 0:  # a replay of no reply would "reproduce" nothing and say REPRODUCED
        ended = f" ({rec.exit_reason})" if rec.exit_reason else ""
        refused = (f"job {key} has nothing to replay: {where} ended before the model's first reply{ended}; "
                   "`replay --live` runs its task again with the live model")
        if requested:
            _note(key, "replay_failed", f"replay could not run: {refused}")
        raise ReplayError(refused)
    say(f"{'live run of' if live else 'replaying'} {where} from {rec.path} ({rec.replies} recorded steps)")
    report = _replay_recording(rec, where, s, redactor, say, live=live, model=model, repo_dir=repo_dir)
    say(report.message)
    _note(
        key,
        "replayed_live" if live else "replayed",
        f"{'live run' if live else 'replay'} of {where} by {who}: {report.status}: {report.message}",
        {
            "status": report.status,
            "trajectory": report.trajectory,
            "attempt": {"run": rec.run, "number": rec.number},
            "start_commit": rec.start_commit,
            "divergence": report.divergence.to_dict() if report.divergence else None,
            "patch_identical": report.patch_identical,
        },
    )
    return report


# ---------------------------------------------------------------------------------------------
# For the dashboard
# ---------------------------------------------------------------------------------------------

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def start_replay(job_id: int, who: str) -> None:
    """Start a plain replay of `job_id` in the background and return at once (for the dashboard).

    Raises `records.UnknownJob` at once for an unknown job. Records `replay_requested` on the
    timeline, then runs `manage.py replay JOB --json` as a separate process (so a sandbox failure
    cannot touch the web process), which records `replayed` (or `replay_failed`) with the outcome
    when it ends. Its output goes to `<data_dir>/replays/job-<id>-<time>.log`.
    """
    settings = get_settings()
    with session_scope() as session:
        records.get_job(session, job_id)
        records.add_event(session, job_id, "replay_requested", f"replay requested by {who}")
    folder = settings.data_dir / "replays"
    folder.mkdir(parents=True, exist_ok=True)
    logfile = folder / f"job-{job_id}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}.log"
    with logfile.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(MANAGE), "replay", str(int(job_id)), "--json", "--who", who[:200], "--requested"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ),
        )
    # Reap it when it ends, so no zombie is left in a long-lived web process.
    threading.Thread(target=proc.wait, name=f"frogfix-replay-{job_id}", daemon=True).start()
