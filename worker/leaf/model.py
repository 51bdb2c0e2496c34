"""The Model seam: one chat-completion call with tools, against SGLang or a recording.

`OpenAIChatModel` uses the `openai` package for the HTTP client, configuration and error
types, but writes the request body itself: the SDK's pydantic path costs tens of milliseconds
per call on long histories (measured: about 54 ms at 300 KB and 123 ms at 700 KB, against 2.5
and 5 ms for raw JSON), and the loop's budget is a few milliseconds. Because the history is
append-only, each message is encoded once and reused, so a request costs O(new messages) of
encoding, and the bytes sent for earlier messages never change (SGLang's radix cache wants
exactly that). Retries are ours (the SDK's are off), so the time budget is one number.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Protocol

import openai

from app import trajectory
from app.endings import Ending, EndingKind
from app.logs import get_logger
from app.outcome_words import shown_url
from app.retrying import GaveUp, RetryPolicy
from app.textcalls import OPEN_CALL, extract_text_calls

# SGLang answers HTTP 200 with finish_reason "abort" when a request was aborted (an operator's
# /abort_request, a weight update, a pause): not an answer. The client retries it; the loop
# ends a run as llm_query_error on one that reaches it anyway (another client, a replay).
ABORT_FINISH_REASON: Final = "abort"

log = get_logger("frogfix.model")
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def warn_once_per_server(kind: str, server: str, **fields: Any) -> bool:
    """Log warning `kind` for `server` once per process (a server's launch flags do not change
    between calls, and a warning on every reply would drown the log); True when it was logged."""
    return _warn_once(kind, server, server=server, **fields)


def _warn_once(kind: str, key: str, **fields: Any) -> bool:
    """The one registry of once-per-process warnings: `kind` is logged the first time for `key`."""
    with _warned_lock:
        if (kind, key) in _warned:
            return False
        _warned.add((kind, key))
    log.warning(kind, **fields)
    return True


class ModelError(Exception):
    """Base of the two ways a model call can end a run.

    `spent` holds the usage of replies the server aborted on the way (SGLang reports it): the
    GPU did that work, so totals and budgets count each as a call without a step.
    """

    spent: tuple[Usage, ...] = ()


class ModelQueryError(ModelError):
    """The model endpoint failed after our retries, or answered nonsense: exit `llm_query_error`.

    `kind` (app/endings.py: unreachable, timed out, refused, kept failing, aborted, out of time, or another
    model error) and `cause` (the failure's own words) are what the job's ending says, typed."""

    def __init__(self, message: str, kind: EndingKind = EndingKind.model_error, cause: str = "") -> None:
        super().__init__(message)
        self.kind, self.cause = kind, cause

    @property
    def ending(self) -> Ending:
        return Ending(self.kind, str(self), cause=self.cause)


class ContextOverflow(ModelError):
    """The server refused the prompt as longer than its context: exit `max_context_len`."""


class AbortedReply(ModelQueryError):
    """A 200 with finish_reason `abort`: no answer, but the tokens it reports were spent."""

    def __init__(self, message: str, usage: Usage | None) -> None:
        super().__init__(message, EndingKind.model_aborted)
        self.usage = usage


@dataclass(frozen=True)
class Usage:
    """Token counts the server reported for one call."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    cached_tokens: int | None = None

    @classmethod
    def from_dict(cls, data: Any) -> Usage | None:
        """Read an OpenAI `usage` object; None when the server sent none."""
        if not isinstance(data, Mapping):
            return None
        prompt = _as_int(data.get("prompt_tokens"))
        completion = _as_int(data.get("completion_tokens"))
        total = _as_int(data.get("total_tokens")) or prompt + completion
        details = data.get("prompt_tokens_details")
        cached = _as_int(details.get("cached_tokens")) if isinstance(details, Mapping) else None
        if cached is None and "cached_tokens" in data:  # a trajectory step's flat record of it
            cached = _as_int(data.get("cached_tokens"))
        return cls(prompt, completion, total, cached)


# No reply of a model FrogFix serves comes near a billion tokens; a figure past it is a server's
# bug, and summed into int columns it would break the attempt's final write.
MAX_TOKENS_PER_CALL: Final = 10**9


def _as_int(value: Any) -> int:
    """A token count as reported; anything but an int in 0..MAX_TOKENS_PER_CALL (a bool, a
    string, -1, 10**20) is 0, and the first absurdly large one is logged once per process."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return 0
    if value > MAX_TOKENS_PER_CALL:
        _warn_once("model_usage_out_of_range", "", limit=MAX_TOKENS_PER_CALL, digits=len(str(value)))
        return 0
    return value


def warn_without_cache_report(server: str, usage: Usage | None) -> None:
    """Log once per process and server that its replies carry no cached-token figures.

    SGLang reports `usage.prompt_tokens_details.cached_tokens` only when started with
    `--enable-cache-report`; without it nobody can see whether the prefix cache works.
    """
    if usage is not None and usage.cached_tokens is not None:
        return
    warn_once_per_server(
        "model_no_cached_tokens",
        server,
        hint="start SGLang with --enable-cache-report to see whether its prefix cache works "
        "(usage.prompt_tokens_details.cached_tokens)",
    )


@dataclass(frozen=True)
class ModelReply:
    """One completion: the assistant message exactly as the server returned it, and its facts."""

    message: dict[str, Any]
    finish_reason: str | None
    usage: Usage | None = None
    model: str | None = None
    response_id: str | None = None
    elapsed_s: float = 0.0
    attempts: int = 1
    aborted: tuple[Usage, ...] = ()  # the usage of replies aborted before this one (sent again)


class ModelClient(Protocol):
    """What the loop needs of a model: one chat-completion call with tools."""

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
        max_completion_tokens: int | None = None,
    ) -> ModelReply:
        """Send the whole history; `timeout` bounds this call including retries (None: own default)."""
        ...


def _thinking_on() -> dict[str, Any]:
    return {"enable_thinking": True}


@dataclass(frozen=True)
class SamplingParams:
    """Leaf's published evaluation sampling; override a field with `dataclasses.replace`.

    `top_k`, `min_p`, `repetition_penalty` and `chat_template_kwargs` are SGLang extensions
    (the SDK's `extra_body`); they go to the top level of the JSON body. `extra_body` adds or
    overrides any further field.
    """

    temperature: float = 0.6
    top_p: float = 0.95
    top_k: int = 20
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_completion_tokens: int = 8192
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=_thinking_on)
    extra_body: Mapping[str, Any] = field(default_factory=dict)

    def body_fields(self, max_completion_tokens: int | None = None) -> dict[str, Any]:
        """The request fields these parameters contribute, in a fixed order."""
        fields: dict[str, Any] = {
            "tool_choice": self.tool_choice,
            "parallel_tool_calls": self.parallel_tool_calls,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "max_completion_tokens": max_completion_tokens or self.max_completion_tokens,
            "chat_template_kwargs": dict(self.chat_template_kwargs),
        }
        fields.update(self.extra_body)
        return fields

    def as_dict(self) -> dict[str, Any]:
        """For the trajectory file."""
        data = asdict(self)
        data["chat_template_kwargs"] = dict(self.chat_template_kwargs)
        data["extra_body"] = dict(self.extra_body)
        return data


_OVERFLOW_MARKERS = (
    "maximum context length",
    "context length",
    "context_length_exceeded",
    "context window",
    "too many tokens",
    "reduce the length",
    "prompt is too long",
    "longer than the model",
    "exceeds the max",
    "max_model_len",
)
_OVERFLOW_STATUSES = frozenset({400, 413, 422})


def is_context_overflow(status: int | None, text: str) -> bool:
    """Whether an error answer says the prompt does not fit (SGLang, vLLM and OpenAI wordings)."""
    if status is not None and status not in _OVERFLOW_STATUSES:
        return False
    lowered = text.lower()
    return any(marker in lowered for marker in _OVERFLOW_MARKERS)


def _encode(value: Any) -> bytes:
    """Compact strict JSON: a NaN or an infinity raises ValueError rather than reach the server."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


class OpenAIChatModel:
    """Chat completions over HTTP against an OpenAI-compatible server (SGLang serving FrogNano).

    `timeout` bounds one attempt's wait for the answer; `max_retries` more attempts follow a
    connection error, a timeout, a 429 or a 5xx, after `backoff_base * 2**n` seconds (with
    jitter, capped by `backoff_max`, stretched to a server's Retry-After, in seconds or as an
    HTTP-date, up to that cap): `retry`, app/retrying.py's policy. `sleep` and `now` (the wall
    clock a Retry-After date is read on) are injectable so tests are instant and exact.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str = "EMPTY",
        sampling: SamplingParams | None = None,
        timeout: float = 600.0,
        connect_timeout: float = 10.0,
        max_retries: int = 4,
        backoff_base: float = 1.0,
        backoff_max: float = 30.0,
        client: openai.OpenAI | None = None,
        sleep: Callable[[float], None] = time.sleep,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.model = model
        self.sampling = sampling or SamplingParams()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.retry = RetryPolicy(
            attempts=max(0, max_retries) + 1, budget_s=None, base_delay_s=backoff_base, max_delay_s=backoff_max,
            retry_after_cap_s=backoff_max, sleep=sleep, now=now,
        )
        self.server = shown_url(base_url) or ""
        self._owns_client = client is None
        self._client = client or openai.OpenAI(
            base_url=base_url, api_key=api_key or "EMPTY", max_retries=0, timeout=timeout
        )
        # Encoded messages, by identity: the history is append-only, so the common prefix of
        # two calls is found by comparing object identities and only new messages are encoded.
        self._encoded: list[tuple[Mapping[str, Any], bytes]] = []
        self._pieces: list[bytes] = []
        self._head_key: tuple[int, int | None] | None = None
        self.last_request_bytes = 0

    def close(self) -> None:
        """Close the HTTP connections (only when this object created the client)."""
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> OpenAIChatModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def encode_request(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        max_completion_tokens: int | None = None,
    ) -> bytes:
        """The exact request body; `messages` is the last field so every body extends the last."""
        key = (id(tools), max_completion_tokens)
        if key != self._head_key:
            head = {"model": self.model, "tools": list(tools)}
            head.update(self.sampling.body_fields(max_completion_tokens))
            head.pop("messages", None)
            self._head_key = key
            self._pieces = [_encode(head)[:-1] + b',"messages":[']
            self._encoded = []
        cache, pieces = self._encoded, self._pieces
        same = 0
        limit = min(len(cache), len(messages))
        while same < limit and cache[same][0] is messages[same]:
            same += 1
        if same < len(cache):
            del cache[same:]
            del pieces[max(1, 2 * same):]  # pieces: head, m0, ",", m1, ",", m2 ...
        for message in messages[same:]:
            encoded = _encode(message)
            cache.append((message, encoded))
            if len(pieces) > 1:
                pieces.append(b",")
            pieces.append(encoded)
        # One join, one allocation: concatenating a 700 KB body piecewise costs page faults.
        pieces.append(b"]}")
        body = b"".join(pieces)
        pieces.pop()
        self.last_request_bytes = len(body)
        return body

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
        max_completion_tokens: int | None = None,
    ) -> ModelReply:
        """One completion, with our bounded retries; raises ModelQueryError or ContextOverflow.

        A 200 whose finish reason is `abort` (SGLang's answer to an aborted request) is no
        answer: the same body is sent again, within the same retry budget and deadline. The
        aborted replies' usage rides on the reply (`aborted`) or on the error (`spent`).
        """
        try:
            body = self.encode_request(messages, tools, max_completion_tokens)
        except ValueError as exc:  # a NaN somewhere in the history: SGLang would refuse it
            raise ModelQueryError(f"the history cannot be sent as strict JSON: {exc}") from exc
        aborted: list[Usage] = []
        try:
            reply = self._send(body, timeout, aborted)
        except ModelError as exc:
            exc.spent = tuple(aborted)
            raise
        return replace(reply, aborted=tuple(aborted)) if aborted else reply

    def _send(self, body: bytes, timeout: float | None, aborted: list[Usage]) -> ModelReply:
        """`complete`'s tries under the retry policy (`timeout`, when given, bounds them all);
        each aborted reply's usage is added to `aborted`."""
        retry = self.retry if timeout is None else replace(self.retry, budget_s=timeout)
        started = retry.clock()
        tries = 0

        def once() -> ModelReply:
            nonlocal tries
            tries += 1
            return self._try(body, retry, started, timeout, tries, aborted)

        return retry.call("model call", once, transient=lambda exc: isinstance(exc, _TryAgain), gave_up=_gave_up)

    def _try(
        self, body: bytes, retry: RetryPolicy, started: float, timeout: float | None, attempt: int,
        aborted: list[Usage],
    ) -> ModelReply:
        """One POST: the reply, a final ModelError, or _TryAgain (a connection error, a timeout, a
        429 or a 5xx, a garbled or aborted 200) with the server's Retry-After."""
        wait = self.timeout if timeout is None else min(self.timeout, started + timeout - retry.clock())
        if wait <= 0:
            ran_out = f"model call ran out of time after {attempt - 1} attempt(s)"
            raise ModelQueryError(ran_out, EndingKind.model_out_of_time)
        try:
            data = self._client.post(
                "/chat/completions",
                cast_to=object,
                content=body,
                options={
                    "max_retries": 0,
                    "timeout": openai.Timeout(wait, connect=min(self.connect_timeout, wait)),
                    "headers": {"Content-Type": "application/json"},
                },
            )
        except openai.APIStatusError as exc:
            text = error_text(exc.body) or exc.message
            if is_context_overflow(exc.status_code, text):
                raise ContextOverflow(f"HTTP {exc.status_code}: {text[:500]}") from exc
            if exc.status_code != 429 and exc.status_code < 500:
                said = f"HTTP {exc.status_code}: {text[:500]}"
                raise ModelQueryError(f"model call refused: {said}", EndingKind.model_refused, said) from exc
            asked = retry.retry_after(exc.response.headers.get("retry-after"))
            raise _TryAgain(f"HTTP {exc.status_code}: {text[:300]}", EndingKind.model_failing, asked) from exc
        except openai.APITimeoutError as exc:
            raise _TryAgain(f"timed out after {wait:.1f}s", EndingKind.model_timeout) from exc
        except openai.APIConnectionError as exc:
            raise _TryAgain(f"connection error: {_cause(exc)}", EndingKind.model_unreachable) from exc
        except openai.OpenAIError as exc:
            raise ModelQueryError(f"model call failed: {type(exc).__name__}: {exc}") from exc
        except ValueError as exc:  # a 200 whose body is not JSON: a cut or garbled answer, worth another try
            raise _TryAgain(f"answered with invalid JSON: {exc}", EndingKind.model_error) from exc
        try:
            reply = self._reply(data, started, retry.clock(), attempt)
        except ModelQueryError as exc:  # a 200 without a usable message or aborted: the same
            if isinstance(exc, AbortedReply) and exc.usage is not None:
                aborted.append(exc.usage)
            raise _TryAgain(str(exc), exc.kind) from exc
        self._note_text_calls(reply)
        return reply

    def _note_text_calls(self, reply: ModelReply) -> None:
        """Warn (once per server) when a call came as text: the server runs without
        `--tool-call-parser qwen3_coder`, and the loop is reading calls from content instead."""
        content = reply.message.get("content")
        # With the parser on, SGLang never leaves a <tool_call> in content (it keeps only the text
        # before one): a wrapped call there is the sign. A bare <function=...> is the model's slip.
        if reply.message.get("tool_calls") or not isinstance(content, str) or OPEN_CALL not in content:
            return
        if extract_text_calls(content).calls:
            warn_once_per_server(
                "model_tool_calls_as_text", self.server,
                hint="start SGLang with --tool-call-parser qwen3_coder; calls are read from the text meanwhile",
            )

    def _reply(self, data: Any, started: float, now: float, attempts: int) -> ModelReply:
        if isinstance(data, str | bytes):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise ModelQueryError(f"model answered with non-JSON: {str(data)[:200]!r}") from exc
        choices = data.get("choices") if isinstance(data, dict) else None
        if not choices or not isinstance(choices[0], dict) or not isinstance(choices[0].get("message"), dict):
            raise ModelQueryError(f"model answered without a message: {json.dumps(data)[:300]}")
        choice = choices[0]
        usage = Usage.from_dict(data.get("usage"))
        if choice.get("finish_reason") == ABORT_FINISH_REASON:
            raise AbortedReply("the model server aborted the request (finish_reason abort)", usage)
        warn_without_cache_report(self.server, usage)
        return ModelReply(
            message=choice["message"],
            finish_reason=choice.get("finish_reason"),
            usage=usage,
            model=data.get("model"),
            response_id=data.get("id"),
            elapsed_s=now - started,
            attempts=attempts,
        )


def error_text(body: object) -> str:
    """An error answer's words: SGLang's flat `{object: "error", message, type, param, code}`,
    OpenAI's nested `{error: {message, type, ...}}`, FastAPI's `{detail}`, or the raw body."""
    if body is None:
        return ""
    if isinstance(body, Mapping):
        inner = body.get("error")
        found = inner if isinstance(inner, Mapping) else body
        message = found.get("message", found.get("detail"))
        if isinstance(message, str):
            kind = found.get("type")
            return f"{kind}: {message}" if isinstance(kind, str) and kind else message
    if isinstance(body, str):
        return body
    try:
        return json.dumps(body, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(body)


def _cause(exc: BaseException) -> str:
    cause = exc.__cause__ or exc.__context__
    return f"{type(cause).__name__}: {cause}" if cause is not None else str(exc)


class _TryAgain(Exception):
    """A try that failed in a way another try may not: `kind` is what it is should it be the last
    (app/endings.py), `retry_after` the server's ask in seconds."""

    def __init__(self, error: str, kind: EndingKind, retry_after: float | None = None) -> None:
        super().__init__(error)
        self.kind, self.retry_after = kind, retry_after


def _gave_up(ending: GaveUp) -> ModelQueryError:
    """The ModelQueryError a spent retry budget ends in (out of attempts, or out of time first), with the
    last failure's words for the job's ending (the system's own for an unreachable server)."""
    last = ending.error
    assert isinstance(last, _TryAgain)
    words = _plain_cause(last) if last.kind == EndingKind.model_unreachable else str(last)
    if ending.out_of_time:
        return ModelQueryError(f"model call failed, no time left to retry: {last}", last.kind, words)
    return ModelQueryError(f"model call failed after {ending.attempts} attempt(s): {last}", last.kind, words)


def _plain_cause(exc: BaseException) -> str:
    """A connection failure in the operating system's words ("Connection refused"), from the first OSError
    behind it; else the exception behind it as it reads."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.strerror:
            return str(seen.strerror)
        seen = seen.__cause__ or seen.__context__
    behind = exc.__cause__ or exc.__context__
    return str(behind or exc)


class ReplayModel:
    """Answers with recorded assistant messages, in order (for `manage.py replay` and tests).

    The messages it was sent are kept in `received` (lengths only, to stay cheap); running out
    of recording is a ModelQueryError, like a model that stopped answering.
    """

    def __init__(self, replies: Iterable[ModelReply | Mapping[str, Any]], *, label: str = "") -> None:
        # What a job's provenance calls it, when it answers a job in place of the model (the demo's replies).
        self.label = label or "recorded replies, replayed (no model ran)"
        self._replies: list[ModelReply] = [
            r if isinstance(r, ModelReply) else ModelReply(message=dict(r), finish_reason=None)
            for r in replies
        ]
        self._next = 0
        self.received: list[int] = []

    @classmethod
    def from_trajectory(cls, source: str | Path | Mapping[str, Any]) -> ReplayModel:
        """Replay the assistant turns of a saved trajectory (a path or the decoded JSON).

        A path is read with app/trajectory.py's `load` (TrajectoryError when it cannot be).
        """
        data: Mapping[str, Any] = source if isinstance(source, Mapping) else trajectory.load(Path(source))
        steps = [s for s in data.get("steps", []) if isinstance(s, Mapping)]
        messages = [m for m in data.get("messages", []) if isinstance(m, Mapping)]
        assistants = [m for m in messages if m.get("role") == "assistant"]
        replies = []
        for index, message in enumerate(assistants):
            step = steps[index] if index < len(steps) else {}
            replies.append(
                ModelReply(
                    message=dict(message),
                    finish_reason=step.get("finish_reason"),
                    usage=Usage.from_dict(step.get("usage")),
                )
            )
        return cls(replies)

    @property
    def remaining(self) -> int:
        return len(self._replies) - self._next

    def complete(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = None,
        max_completion_tokens: int | None = None,
    ) -> ModelReply:
        """The next recorded reply."""
        self.received.append(len(messages))
        if self._next >= len(self._replies):
            raise ModelQueryError(f"replay: no recorded reply left for call {self._next + 1}")
        reply = self._replies[self._next]
        self._next += 1
        return reply
