"""A job's ending in plain words: why it failed or found nothing, how its agent ended, what its tests said.

One home for what `fix` prints, what `show` prints and what the dashboard's job page says, so the three
never word the same ending differently. The inputs are what every job already stores: its status, exit
reason and error text (a forge job's row, a local job's record, `fix --json`), and a `tests` dict.

- `why(status, exit_reason, error, model_url=...)`: one line, or None for a job that did not fail.
  The error texts it reads are those the worker writes: worker/leaf/model.py's model errors, worker/
  repo_config.py's `.frogfix.yml` errors, the environment builder's reasons, app/forge's ForgeError
  messages (as worker/job/pipeline.py ends a job with them), the sandbox's and git's. An error it does not
  recognise is shown as it is, on one line.
- `ending(exit_reason, steps)`: how the agent ended ("the agent finished after 4 steps").
- `tests_line(tests, evidence)`: "before: 1 failed, 1 passed; after: 2 passed (2 runs)", for `fix --json`'s
  `tests` and a forge attempt's `tests` (worker/texts/mr_text.py TestEvidence) alike.

Standard library and app/statuses.py only (a pure vocabulary module, like statuses.py).
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

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
    words = set(re.findall(r"\w+", (because or "").lower()))
    return any(word not in words for word in re.findall(r"\w+", error.lower()))


# -- how the agent ended ----------------------------------------------------------------------------


def ending(exit_reason: str | None, steps: int | None) -> str:
    """How the agent ended, e.g. "the agent finished after 4 steps", "the agent did not run"."""
    n = steps or 0
    if not exit_reason or (exit_reason in BEFORE_AGENT and n == 0):
        return "the agent did not run"
    return f"{exit_label(exit_reason)} after {plural(n, 'step')}"


# -- why --------------------------------------------------------------------------------------------


def why(status: str, exit_reason: str | None, error: str | None, *, model_url: str | None = None) -> str | None:
    """One plain line saying why a job failed or found nothing; None for a job that did not fail.

    `status`: a job's, an attempt's or `fix`'s; `exit_reason`: the agent's (None when it never ran);
    `error`: the job's stored error text; `model_url`: the model server the job used, named when the
    model is why (settings.model_base_url)."""
    if status in NO_WHY:
        return None
    text = one_line(error)
    reason = exit_reason or ""
    if status == JobStatus.cancelled or reason == ExitReason.cancelled:
        return _cancelled(text)
    if status == JobStatus.rejected:
        return f"the trigger was refused: {text}" if text else "the trigger was refused"
    if status == JobStatus.no_fix and reason in _LIMITS:
        return _LIMITS[reason]
    forge = _forge(text)
    if _MODEL.search(text) or (reason == ExitReason.llm_query_error and forge is None):
        return _model(text, shown_url(model_url))
    if reason == ExitReason.config_error or text.startswith(CONFIG_FILE):
        return _config(text)
    if reason == ExitReason.environment_error or status == FixStatus.environment_error or _ENVIRONMENT.match(text):
        return _environment(text)
    if reason == ExitReason.tool_error or _SANDBOX.match(text):
        detail = _SANDBOX.sub("", text, count=1)
        return f"the sandbox failed: {detail}" if detail else "the sandbox failed"
    if forge is not None:
        return forge
    if reason == ExitReason.git_error or _GIT.match(text):
        return f"git failed: {text}" if text else "git failed"
    if _JOB_TIME.match(text):
        return f"{text}; FROGFIX_JOB_TIMEOUT_SECONDS sets it"
    if text.startswith("internal error:"):
        bug = text.removeprefix("internal error:").strip()
        return f"FrogFix hit an internal error ({bug}); the worker's log has more"
    limit = _LIMITS.get(reason)
    if limit is not None:
        return limit
    if text:
        refusals = reason == ExitReason.agent and status == JobStatus.no_fix and "refused" not in text
        if refusals and not text.startswith("attempt "):
            return f"the patch was refused: {text}"  # `fix`'s error for a no_fix the agent finished: the refusals
        return text
    if status == JobStatus.no_fix:
        return "the agent ended without a fix the tests prove"
    return "it failed without a recorded reason; the timeline and the worker's log may say more"


CONFIG_FILE: Final = ".frogfix.yml"
_MODEL = re.compile(r"^(?:\w+: )?(?:model call|model answered|the model (?:could not be used|server aborted))")
_ENVIRONMENT = re.compile(r"^environment error:")
_SANDBOX = re.compile(r"^(?:sandbox failure|the setup sandbox failed)\s*:?\s*")
_GIT = re.compile(
    r"^(?:git \S+ |the clone URL|commit [0-9a-f]+ is not in|workspace folder |not a (?:full commit id|valid ref))"
)
_JOB_TIME = re.compile(r"^the job ran past its time limit")
_LIMITS: Final[dict[str, str]] = {
    ExitReason.max_turns: "the agent used every step it may take (FROGFIX_LEAF_MAX_STEPS) without a fix",
    ExitReason.max_time: "the agent ran out of time (FROGFIX_JOB_TIMEOUT_SECONDS) before a fix",
    ExitReason.max_context_len: (
        "the conversation outgrew the context the agent may use (FROGFIX_LEAF_MAX_CONTEXT_TOKENS) before a fix"
    ),
    ExitReason.max_tokens_per_turn: "a model reply ran past FROGFIX_LEAF_MAX_COMPLETION_TOKENS",
}


def _cancelled(text: str) -> str:
    if text.startswith("the run stopped:"):  # `fix` interrupted (Ctrl-C) or stopped by a bug
        return f"the run was stopped before it ended ({text.removeprefix('the run stopped:').strip()})"
    if not text or text == "cancelled on request":
        return "it was cancelled on request"
    return f"it was cancelled: {text}"


# What follows "connection error: " in the model client's error: "ConnectError: [Errno 111] Connection refused".
_EXCEPTION_NAME = re.compile(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception|Timeout|Refused|Failure)\w*: )+")
_ERRNO = re.compile(r"^\[Errno -?\d+\] ")


def _cause(text: str) -> str:
    cause = _ERRNO.sub("", _EXCEPTION_NAME.sub("", text.strip()))
    return cause or text.strip()


def _model(text: str, url: str | None) -> str:
    where = f"the model server at {url}" if url else "the model server"
    if m := re.search(r"connection error: (.*)$", text):
        return f"{where} could not be reached ({_cause(m.group(1))}); {DOCTOR}"
    if m := re.search(r"model call refused: (.*)$", text):
        return f"{where} refused the call ({m.group(1)}); {DOCTOR}"
    if m := re.search(r"(?:attempt\(s\)|retry): (HTTP \d+.*)$", text):
        return f"{where} kept failing ({m.group(1)}); {DOCTOR}"
    if m := re.search(r"(?:attempt\(s\)|retry): (timed out.*)$", text):
        return f"{where} did not answer in time ({m.group(1)}); {DOCTOR}"
    if "ran out of time" in text:
        return f"{where} did not answer before the job's time ran out; {DOCTOR}"
    if "aborted the request" in text:
        return f"{where} aborted the request; {DOCTOR}"
    if text:
        return f"{where} could not be used ({text}); {DOCTOR}"
    return f"{where} could not be used; {DOCTOR}"


def _config(text: str) -> str:
    """`.frogfix.yml: unknown key x; did you mean y?` as "the repository's .frogfix.yml is not usable: ..."."""
    detail = text.removeprefix(CONFIG_FILE).lstrip(":").strip()
    if detail.startswith(("is ", "must ")):
        detail = "it " + detail
    return f"the repository's {CONFIG_FILE} is not usable: {detail}" if detail else (
        f"the repository's {CONFIG_FILE} is not usable"
    )


def _environment(text: str) -> str:
    detail = _ENVIRONMENT.sub("", text, count=1).strip()
    if not detail:
        return "the test environment could not be built"
    if detail.startswith("the tests could not start"):  # built (or none needed), yet the tests cannot run
        return f"the test environment is not usable: {detail}"
    return f"the test environment could not be built: {detail}"


# app/forge's ForgeError messages: "GitLab get issue: HTTP 401 401 Unauthorized (the forge token was rejected)",
# "Gitea get issue: ConnectError talking to the server (gave up after 4 attempts in 12.0s)", "no GitLab
# token is configured (set FROGFIX_GITLAB_TOKEN)"; worker/job/pipeline.py prefixes a transient one with
# "the forge or git server kept failing: ".
_KEPT_FAILING = "the forge or git server kept failing:"
_FORGE_CALL = re.compile(r"^(?P<forge>GitLab|Gitea) (?P<what>[^:]{1,120}): (?P<rest>.*)$")
_FORGE_HTTP = re.compile(r"^HTTP (?P<code>\d{3})\s*(?P<detail>.*)$")
_FORGE_NAMED = re.compile(r"\b(?:GitLab|Gitea)\b")
_UNREACHED = re.compile(r"talking to the server|timed out|Connect|Timeout|gave up after", re.I)
_GAVE_UP = re.compile(r"\s*\((gave up after [^()]*)\)\s*$")


def _forge(text: str) -> str | None:
    transient = text.startswith(_KEPT_FAILING)
    body = text.removeprefix(_KEPT_FAILING).strip() if transient else text
    m = _FORGE_CALL.match(body)
    if m is None:
        if transient:
            return f"the forge or the git server could not be reached reliably ({body}); an operator can retry"
        if _FORGE_NAMED.search(body) and ("configured" in body or "redirected" in body or "FROGFIX_GIT" in body):
            return f"the forge is not set up right: {body}; {DOCTOR}"
        return None
    forge, what, rest = m["forge"], m["what"], m["rest"]
    setting = f"FROGFIX_{forge.upper()}"
    gave_up = _GAVE_UP.search(rest)
    if gave_up is not None:  # app/forge/api.py's forge_call tail: said once, at the end
        rest = rest[: gave_up.start()]
    tried = f", {gave_up[1]}" if gave_up is not None else ""  # after what failed: "(ConnectError, gave up ...)"
    http = _FORGE_HTTP.match(rest)
    if http is None:
        if "redirected" in rest:
            return f"the forge ({forge}) answered {what} with a redirect ({rest}); check {setting}_URL"
        if transient or _UNREACHED.search(rest):
            failure = rest.replace(" talking to the server", "")
            return f"the forge ({forge}) could not be reached for {what} ({failure}{tried}); {DOCTOR}"
        return f"the forge ({forge}) failed on {what}: {rest}{tried}"
    code, detail = int(http["code"]), _forge_detail(http["detail"], http["code"])
    said = ", ".join(part for part in (detail, gave_up[1] if gave_up is not None else "") if part)
    said = f" ({said})" if said else ""
    if code == 401:
        return f"the forge ({forge}) answered 401 to {what}: the FrogFix token was rejected; check {setting}_TOKEN"
    if code == 403:
        return (f"the forge ({forge}) answered 403 to {what}: the FrogFix token lacks a permission it needs"
                f"{said}; check {setting}_TOKEN")
    if code == 404:
        return (f"the forge ({forge}) answered 404 to {what}: it does not exist, or the FrogFix token may not"
                f" see it{said}")
    tail = "; an operator can retry" if transient or code >= 500 or code == 429 else ""
    return f"the forge ({forge}) answered {code} to {what}{said}{tail}"


def _forge_detail(detail: str, code: str) -> str:
    """The forge's words after the status, without what the status already says."""
    words = re.sub(r"\s*\(the forge token (?:was rejected|lacks permission)\)", "", detail).strip()
    words = words.removeprefix(code).strip()  # python-gitlab repeats the code: "401 Unauthorized"
    return words


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


def _after_runs(tests: dict[str, Any]) -> list[Any]:
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
    runs = _after_runs(tests)
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
