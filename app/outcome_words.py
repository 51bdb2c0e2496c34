"""A job's ending in plain words: why it failed or found nothing, how its agent ended, what its tests said.

One home for what `fix` prints, what `show` prints and what the dashboard's job page says, so the three
never word the same ending differently. The inputs are what every job stores: its status, exit reason and
typed ending (app/endings.py: a forge job's row, a local job's record, `fix --json`), and a `tests` dict.

- `why(status, exit_reason, ending, model_url=...)`: one line, or None for a job that did not fail, from
  the ending's kind (a table of kinds to sentences) and its typed facts (the model failure's words, the
  forge, its call and HTTP status): no message is parsed. An ending whose kind has no sentence of its
  own is shown as its text, on one line.
- `ending(exit_reason, steps)`: how the agent ended ("the agent finished after 4 steps").
- `tests_line(tests, evidence)`: "before: 1 failed, 1 passed; after: 2 passed (2 runs)", for `fix --json`'s
  `tests` and a forge attempt's `tests` (worker/texts/mr_text.py TestEvidence) alike.

Standard library, app/statuses.py and app/endings.py only (a pure vocabulary module, like statuses.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from app.endings import CANCELLED_ON_REQUEST, MODEL_KINDS, Ending, EndingKind, ending_for_status
from app.statuses import (
    ACTIVE_STATUSES,
    EVIDENCE_LABELS,
    AttemptStatus,
    ExitReason,
    FixStatus,
    JobStatus,
    exit_label,
)

DOCTOR: Final = "run ./manage.py doctor"
MAX_CHARS: Final = 500  # of the error text quoted in a why line
# Statuses that need no why: a success, a patch that passes (its evidence line says what it proves), a
# job that has not ended yet.
NO_WHY: Final[frozenset[str]] = frozenset(
    {JobStatus.done, FixStatus.fixed, FixStatus.unproven, AttemptStatus.verified, *ACTIVE_STATUSES}
)
# Exits that end a local job before its agent runs.
BEFORE_AGENT: Final[frozenset[str]] = frozenset(
    {ExitReason.config_error, ExitReason.environment_error, ExitReason.git_error}
)


def one_line(text: str | None, limit: int = MAX_CHARS) -> str:
    """`text` on one line (whitespace folded), cut to `limit` characters."""
    folded = " ".join((text or "").split())
    return folded if len(folded) <= limit else folded[: limit - 1].rstrip() + "…"


def shown_url(url: str | None) -> str | None:
    """A server's URL as a log, a record or a why line may name it: scheme, host, port and path, never a
    user name, password, query or fragment (any may carry a credential). None for none, or an unreadable one.

    The one home: the model client names its server with it (worker/leaf/model.py), `fix` records it."""
    if not url:
        return None
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:
        return None
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def says_more(error: str | None, because: str | None) -> bool:
    """Whether the raw error text tells more than the why line made of it (then both are worth showing)."""
    if not error:
        return False
    words = set(_words(because or ""))
    return any(word not in words for word in _words(error))


def _words(text: str) -> list[str]:
    """The text's words (letters, digits, underscores), lowercased."""
    return "".join(c if c.isalnum() or c == "_" else " " for c in text.lower()).split()


# -- how the agent ended ----------------------------------------------------------------------------


def ending(exit_reason: str | None, steps: int | None) -> str:
    """How the agent ended, e.g. "the agent finished after 4 steps", "the agent did not run"."""
    n = steps or 0
    if not exit_reason or (exit_reason in BEFORE_AGENT and n == 0):
        return "the agent did not run"
    return f"{exit_label(exit_reason)} after {plural(n, 'step')}"


# -- why --------------------------------------------------------------------------------------------


def why(status: str, exit_reason: str | None, end: Ending | None, *, model_url: str | None = None) -> str | None:
    """One plain line saying why a job failed or found nothing; None for a job that did not fail.

    `status`: a job's, an attempt's or `fix`'s; `exit_reason`: the agent's (None when it never ran);
    `end`: how it ended, typed (app/endings.py; the job's `ending`), worded from its kind and facts, never
    parsed from its text; `model_url`: the model server the job used, named when the model is why."""
    if status in NO_WHY:
        return None
    end = end or ending_for_status(status)
    if status == JobStatus.no_fix and (exit_reason or "") in _LIMITS:
        return _LIMITS[exit_reason or ""]
    if end.kind in MODEL_KINDS:
        return _model(end, shown_url(model_url))
    if end.kind in _FORGE_KINDS:
        return _forge(end)
    return _WORDS.get(end.kind, _as_stored)(end, exit_reason, status)


_LIMITS: Final[dict[str, str]] = {
    ExitReason.max_turns: "the agent used every step it may take (FROGFIX_LEAF_MAX_STEPS) without a fix",
    ExitReason.max_time: "the agent ran out of time (FROGFIX_JOB_TIMEOUT_SECONDS) before a fix",
    ExitReason.max_context_len: (
        "the conversation outgrew the context the agent may use (FROGFIX_LEAF_MAX_CONTEXT_TOKENS) before a fix"
    ),
    ExitReason.max_tokens_per_turn: "a model reply ran past FROGFIX_LEAF_MAX_COMPLETION_TOKENS",
}
CONFIG_FILE: Final = ".frogfix.yml"
ENVIRONMENT_REMEDY: Final = (
    "add what is missing to the company's package mirror, or declare what to install in the repository's "
    f"{CONFIG_FILE} (environment:, setup_command; docs/ENVIRONMENTS.md)"
)
Worder = Callable[[Ending, "str | None", str], str]


def _said(end: Ending) -> str:
    """The ending's own words: its cause when the worker gave one, else its detail, on one line."""
    return one_line(end.cause or end.detail)


def _with(lead: str, end: Ending) -> str:
    """`lead: the ending's words`, or `lead` alone when it has none."""
    said = _said(end)
    return f"{lead}: {said}" if said else lead


def _cancelled(end: Ending, _exit: str | None, _status: str) -> str:
    text = one_line(end.detail)
    if not text or text == CANCELLED_ON_REQUEST:
        return "it was cancelled on request"
    return f"it was cancelled: {text}"


def _stopped(end: Ending, _exit: str | None, _status: str) -> str:
    """`fix` interrupted (Ctrl-C, a signal) or stopped by a bug."""
    said = _said(end)
    return f"the run was stopped before it ended ({said})" if said else "the run was stopped before it ended"


def _limits(end: Ending, exit_reason: str | None, status: str) -> str:
    return _LIMITS.get(exit_reason or "") or _with("the agent reached one of its limits before a fix", end)


def _as_stored(end: Ending, _exit: str | None, status: str) -> str:
    """An ending whose words are its own text (a branch that moved, forged results, a lost worker)."""
    text = one_line(end.detail)
    if text:
        return text
    if status == JobStatus.no_fix or end.kind == EndingKind.no_fix:
        return "the agent ended without a fix the tests prove"
    return "it failed without a recorded reason; the timeline and the worker's log may say more"


_WORDS: Final[dict[EndingKind, Worder]] = {
    EndingKind.cancelled: _cancelled,
    EndingKind.stopped: _stopped,
    EndingKind.rejected: lambda end, _e, _s: _with("the trigger was refused", end),
    EndingKind.config_error: lambda end, _e, _s: _with(f"the repository's {CONFIG_FILE} is not usable", end),
    EndingKind.environment_error: lambda end, _e, _s: (
        f"{_with('the test environment could not be built', end).rstrip('.')}; {ENVIRONMENT_REMEDY}"
    ),
    EndingKind.tests_unstartable: lambda end, _e, _s: _with("the test environment is not usable", end),
    EndingKind.sandbox_failure: lambda end, _e, _s: _with("the sandbox failed", end),
    EndingKind.git_error: lambda end, _e, _s: f"git failed: {one_line(end.detail)}" if end.detail else "git failed",
    EndingKind.job_timeout: lambda end, _e, _s: f"{one_line(end.detail)}; FROGFIX_JOB_TIMEOUT_SECONDS sets it",
    EndingKind.internal_error: lambda end, _e, _s: (
        f"FrogFix hit an internal error ({_said(end)}); the worker's log has more"
    ),
    EndingKind.limits: _limits,
    EndingKind.refused: lambda end, _e, _s: _with("the patch was refused", end),
    EndingKind.attestation_missing: lambda end, _e, _s: _with(
        "FROGFIX_REQUIRE_ATTESTATION is on and no attestation key could sign, so nothing was published", end
    ),
}


# How the model server failed, after "the model server (at URL)"; {said} is the failure's own words.
_MODEL_WORDS: Final[dict[EndingKind, str]] = {
    EndingKind.model_unreachable: "could not be reached ({said})",
    EndingKind.model_refused: "refused the call ({said})",
    EndingKind.model_failing: "kept failing ({said})",
    EndingKind.model_timeout: "did not answer in time ({said})",
    EndingKind.model_out_of_time: "did not answer before the job's time ran out",
    EndingKind.model_aborted: "aborted the request",
}


def _model(end: Ending, url: str | None) -> str:
    where = f"the model server at {url}" if url else "the model server"
    said = _said(end)
    how = _MODEL_WORDS.get(end.kind) or ("could not be used ({said})" if said else "could not be used")
    return f"{where} {how.format(said=said)}; {DOCTOR}"


_FORGE_KINDS: Final = frozenset({EndingKind.forge_error, EndingKind.forge_unreachable, EndingKind.forge_setup})


def _forge(end: Ending) -> str:
    """A forge's failure from its typed facts: which forge, what FrogFix asked, the HTTP status, its words."""
    if end.kind == EndingKind.forge_setup:
        return f"the forge is not set up right: {one_line(end.detail)}; {DOCTOR}"
    forge, call, said = end.forge, end.call, one_line(end.said)
    if not forge or not call:  # a git server's, or a forge answer with no call named
        if end.transient:
            body = one_line(end.cause or end.detail)
            return f"the forge or the git server could not be reached reliably ({body}); an operator can retry"
        return one_line(end.detail) or "the forge failed"
    setting = f"FROGFIX_{forge.upper()}"
    tried = f", {end.gave_up}" if end.gave_up else ""
    if end.http_status is None:
        if end.redirected:
            return f"the forge ({forge}) answered {call} with a redirect ({said}); check {setting}_URL"
        if end.kind == EndingKind.forge_unreachable:
            return f"the forge ({forge}) could not be reached for {call} ({said}{tried}); {DOCTOR}"
        return f"the forge ({forge}) failed on {call}: {said}{tried}"
    code = end.http_status
    told = ", ".join(part for part in (said, end.gave_up) if part)
    told = f" ({told})" if told else ""
    if code == 401:
        return f"the forge ({forge}) answered 401 to {call}: the FrogFix token was rejected; check {setting}_TOKEN"
    if code == 403:
        return (f"the forge ({forge}) answered 403 to {call}: the FrogFix token lacks a permission it needs"
                f"{told}; check {setting}_TOKEN")
    if code == 404:
        return (f"the forge ({forge}) answered 404 to {call}: it does not exist, or the FrogFix token may not"
                f" see it{told}")
    tail = "; an operator can retry" if end.transient or code >= 500 or code == 429 else ""
    return f"the forge ({forge}) answered {code} to {call}{told}{tail}"


# -- tests ------------------------------------------------------------------------------------------

_OUTCOME_ORDER: Final = ("failed", "error", "passed", "skipped")


def _counts_words(counts: dict[str, Any]) -> str:
    known = [o for o in _OUTCOME_ORDER if o in counts] + sorted(o for o in counts if o not in _OUTCOME_ORDER)
    parts = []
    for outcome in known:
        n = counts[outcome]
        if not isinstance(n, int) or n <= 0:
            continue
        parts.append(plural(n, "error") if outcome == "error" else f"{n} {outcome}")
    return ", ".join(parts)


def run_words(run: Any) -> str:
    """One test run (verifier.py TestRun.to_dict) in words: "1 failed, 1 passed", "passed", "timed out"."""
    if not isinstance(run, dict):
        return "did not run"
    if run.get("timed_out"):
        return "timed out"
    code = run.get("exit_code")
    counts = run.get("counts")
    if isinstance(counts, dict):
        words = _counts_words(counts)
        if words:
            return words
    if code is None:
        return "did not run"
    if code == 0:
        return "passed"
    if code == 1:
        return "failed"
    if code == 5:
        return "found no tests (exit 5)"
    return f"failed (exit {code})"


def _patched_runs(tests: dict[str, Any]) -> list[Any]:
    """The patched runs of the one `tests` shape (app/answers.py `TestsAnswer`: `after` is their list; a
    stored dict of an older shape is read into it there, before it reaches these words)."""
    after = tests.get("after")
    return after if isinstance(after, list) else []


def tests_line(tests: dict[str, Any] | None, evidence: dict[str, Any] | None = None) -> str:
    """The tests in plain words: "before: 1 failed, 1 passed; after: 2 passed (2 runs)".

    `tests`: the one `tests` shape (app/answers.py `TestsAnswer`: before, after: a list of runs, flaky,
    reproduction), `fix --json`'s and an attempt's alike; per-test counts when the runner's report was read,
    else the exit codes in words. `evidence` (fix's `evidence`, a forge attempt's `tests["evidence"]`):
    when given, what it proves is added; `fix` and `show` print worker/attempts/evidence.py's evidence line
    instead, which names the tests."""
    if not isinstance(tests, dict) or not tests:
        return "no tests run"
    runs = _patched_runs(tests)
    if not runs:
        after = "did not run"
    else:
        words = [run_words(run) for run in runs]
        if len(set(words)) == 1:
            after = words[0] + (f" ({len(words)} runs)" if len(words) > 1 else "")
        else:
            after = ", then ".join(words)
    if tests.get("flaky"):
        after += " (flaky: the runs differ)"
    line = f"before: {run_words(tests.get('before'))}; after: {after}"
    reproduction = tests.get("reproduction")
    if isinstance(reproduction, dict):
        line += f"; the patch's own tests on the old code: {run_words(reproduction)}"
    if isinstance(evidence, dict) and evidence.get("level"):
        level = str(evidence["level"])
        label = EVIDENCE_LABELS.get(level, level)
        said = one_line(str(evidence.get("reason") or ""), 300)
        line += f"; {label}" + (f": {said}" if said else "")
    return line
