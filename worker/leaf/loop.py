"""The Leaf agent loop, as FrogNano was trained on it (LEAF.md, "The loop").

Messages start as [system, user]; each step sends the whole list with the five tool schemas,
appends the assistant message as the server returned it, and answers every tool call, in
order, with one `tool` message. The history is append-only: nothing sent is ever rewritten, and
each tool output is trimmed once, when it is appended, so every request extends the previous
one byte for byte and SGLang's radix cache keeps its state between steps. The one value changed
on the way in: a tool call's arguments string that is not strict JSON (SGLang writes `Infinity`
bare and then refuses it in the history), rewritten once, when appended.

The loop knows only a Model (`model.ModelClient`) and a sandbox's `call_tool`; it imports no
database, queue or web code. The worker persists each step through `on_step`.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from app.endings import Ending, EndingKind
from app.logs import get_logger
from app.statuses import LEAF_EXITS, ExitReason
from app.textcalls import UNREAD_REPLY, extract_text_calls, text_call_id
from app.usage import UsageFigures
from sandbox.base import SandboxError
from worker.leaf.model import (
    ABORT_FINISH_REASON,
    ContextOverflow,
    ModelClient,
    ModelQueryError,
    ModelReply,
    Usage,
)
from worker.leaf.tools import TOOL_NAMES, TOOL_SCHEMAS, coerce_arguments

log = get_logger("frogfix.leaf")  # structlog, as model.py: one logging style in worker/leaf

EXIT_REASONS: Final = LEAF_EXITS  # their one home is app/statuses.py
LENGTH_FINISH_REASONS: Final = frozenset({"length", "max_tokens", "max_new_tokens"})


class ToolSandbox(Protocol):
    """The one thing the loop asks of a sandbox (sandbox.base.Sandbox has it)."""

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one Leaf tool; its own failures come back as text, infrastructure failures raise."""
        ...


@dataclass(frozen=True)
class LeafLimits:
    """The evaluated setup's bounds (LEAF.md); the worker maps settings onto these."""

    max_steps: int = 150
    max_context_tokens: int = 131_072
    max_completion_tokens: int = 8_192
    max_seconds: float = 10_800.0
    # A backstop only: the runner already cuts Read at 20,000 and Bash at 30,000 characters.
    max_tool_output_chars: int = 100_000


@dataclass
class ToolCallRecord:
    """One answered tool call: what was asked, what came back, how long it took."""

    call_id: str
    name: str
    arguments: dict[str, Any] | None
    output: str
    seconds: float
    source: str  # "native" (server-parsed) or "text" (read back from the reply's text)
    rejected: bool = False  # answered by the loop itself (bad arguments, unknown tool)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.call_id,
            "name": self.name,
            "source": self.source,
            "seconds": round(self.seconds, 6),
            "rejected": self.rejected,
            "output_chars": len(self.output),
        }


@dataclass
class StepRecord:
    """What one step did; handed to `on_step` after every step, then kept in the result.

    `history` is the live message list (append-only), so a writer can save what is new
    without the loop copying anything.
    """

    step: int  # 0-based, as in Leaf's trajectories
    assistant: dict[str, Any]
    tool_messages: list[dict[str, Any]]
    calls: list[ToolCallRecord]
    finish_reason: str | None
    usage: Usage | None
    model_seconds: float
    tool_seconds: float
    text_calls: bool
    context_tokens: int
    history: list[dict[str, Any]] = field(repr=False)

    @property
    def new_messages(self) -> list[dict[str, Any]]:
        return [self.assistant, *self.tool_messages]

    def to_dict(self) -> dict[str, Any]:
        """A compact summary (the messages themselves live in the history)."""
        return {
            "step": self.step,
            "finish_reason": self.finish_reason,
            "usage": None if self.usage is None else {
                "prompt_tokens": self.usage.prompt_tokens,
                "completion_tokens": self.usage.completion_tokens,
                "total_tokens": self.usage.total_tokens,
                "cached_tokens": self.usage.cached_tokens or 0,  # none reported (no --enable-cache-report): 0
            },
            "model_seconds": round(self.model_seconds, 6),
            "tool_seconds": round(self.tool_seconds, 6),
            "text_calls": self.text_calls,
            "context_tokens": self.context_tokens,
            "tool_calls": [call.to_dict() for call in self.calls],
        }


def step_usage(record: StepRecord) -> UsageFigures:
    """One step's share of the usage, for callers that keep figures up to date as steps come."""
    u = record.usage
    return UsageFigures(
        prompt_tokens=u.prompt_tokens if u else 0, completion_tokens=u.completion_tokens if u else 0,
        cached_tokens=(u.cached_tokens or 0) if u else 0, model_calls=1, steps=1,
        model_seconds=record.model_seconds, sandbox_seconds=record.tool_seconds,
    )


@dataclass
class UsageTotals:
    """Token totals over the run's replies, from the server's usage reports.

    `cached_unreported` counts replies without `prompt_tokens_details.cached_tokens` (a server
    started without `--enable-cache-report`): their cached tokens are unknown and count as 0.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    last_prompt_tokens: int = 0
    context_tokens: int = 0
    cached_tokens: int = 0
    cached_unreported: int = 0

    def add(self, usage: Usage | None) -> None:
        self.calls += 1
        if usage is None or usage.cached_tokens is None:
            self.cached_unreported += 1
        if usage is not None:
            self.prompt_tokens += usage.prompt_tokens
            self.completion_tokens += usage.completion_tokens
            self.cached_tokens += usage.cached_tokens or 0
            self.last_prompt_tokens = usage.prompt_tokens

    def to_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "cached_unreported": self.cached_unreported,
            "calls": self.calls,
            "last_prompt_tokens": self.last_prompt_tokens,
            "context_tokens": self.context_tokens,
        }


@dataclass
class LeafResult:
    """How a run ended. The patch is taken by the caller from the sandbox (LEAF.md step 6).

    `steps` is the replies the run answered (one trajectory step, one usage step each): the one
    meaning of "steps" on the job page, in trajectories and in `fix --json`. Model calls that got
    no reply (failed, aborted) are in `model_calls_made`.
    """

    exit_reason: str
    steps: int
    messages: list[dict[str, Any]]
    final_answer: str
    usage: UsageTotals
    error: str | None
    elapsed_s: float
    model_seconds: float
    tool_seconds: float
    records: list[StepRecord]
    model_calls_made: int = 0
    # What failed, typed, when the model server or the sandbox ended the run (app/endings.py).
    failure: Ending | None = None

    def figures(self) -> UsageFigures:
        """The run's usage: one step per reply; model seconds include calls that failed."""
        u = self.usage
        return UsageFigures(
            prompt_tokens=u.prompt_tokens, completion_tokens=u.completion_tokens, cached_tokens=u.cached_tokens,
            model_calls=u.calls, steps=self.steps, model_seconds=self.model_seconds,
            sandbox_seconds=self.tool_seconds,
        )


@dataclass
class _Planned:
    call_id: str
    name: str
    arguments: dict[str, Any] | None
    error: str | None
    source: str


def initial_messages(system_prompt: str, task: str) -> list[dict[str, Any]]:
    """The two messages every run starts with."""
    return [{"role": "system", "content": system_prompt}, {"role": "user", "content": task}]


def history_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """The assistant message to append: the server's own content, reasoning and tool calls.

    Values are kept exactly as returned (no stripping of thinking); only the fields the chat
    template reads are kept, as Leaf does. The one exception: a tool call's `arguments` string
    that is not strict JSON for an object (SGLang writes `Infinity` and `NaN` bare) is rewritten
    here, once, because SGLang refuses every later request whose history holds one.
    """
    appended: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning_content"):
        appended["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        appended["tool_calls"] = strict_tool_calls(message["tool_calls"])
    return appended


def strict_tool_calls(calls: Any) -> Any:
    """`calls` itself when every arguments string is strict JSON for an object, else a copy with
    those strings rewritten by `strict_arguments` (nothing else in a call changes)."""
    if not isinstance(calls, list):
        return calls
    rewritten: list[Any] = []
    changed = False
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping) and not _is_strict_object(function.get("arguments")):
            function = {**function, "arguments": strict_arguments(function.get("arguments"))}
            call = {**call, "function": function}
            changed = True
        rewritten.append(call)
    return rewritten if changed else calls


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _is_strict_object(raw: Any) -> bool:
    if not isinstance(raw, str):
        return False
    try:
        return isinstance(json.loads(raw, parse_constant=_reject_constant), dict)
    except (ValueError, RecursionError):  # nesting deeper than the stack: not kept as returned
        return False


def strict_arguments(raw: Any) -> str:
    """Arguments as strict JSON for an object: a non-finite number becomes its token as a string
    (`"Infinity"`), so the history still says what was asked; what is no object, or is nested
    deeper than Python's stack can walk, becomes `{}`."""
    value: Any = raw
    try:
        if isinstance(raw, str | bytes):
            value = json.loads(raw)
        if isinstance(value, Mapping):
            return json.dumps(_finite(value), ensure_ascii=False)
    except (ValueError, RecursionError):
        pass
    return "{}"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


def non_finite_argument(value: Any, where: str = "") -> str | None:
    """Where a tool call's arguments hold NaN or an infinity (`timeout=Infinity`), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return f"{where or 'arguments'}={_finite(value)}"
    items = value.items() if isinstance(value, Mapping) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite_argument(item, f"{where}.{key}" if where else str(key))
        if found:
            return found
    return None


def trim_output(output: str, limit: int) -> str:
    """Cut a tool output once, with Leaf's trailer, so the model knows something is missing."""
    if limit <= 0 or len(output) <= limit:
        return output
    return f"{output[:limit]}\n[truncated {len(output) - limit} chars]"


def estimate_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Leaf's tokenizer-free estimate: a quarter of the UTF-8 bytes of the compact JSON."""
    if not messages:
        return 0
    encoded = json.dumps(list(messages), ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return math.ceil(len(encoded) / 4)


def plan_calls(message: Mapping[str, Any], step: int) -> tuple[list[_Planned], bool]:
    """The calls to answer for one reply, and whether they came from text.

    Native calls win; text calls are read only when the server returned none, and only from
    the visible content (never from reasoning). A call whose arguments cannot be used is still
    planned, carrying the error text to answer it with. A reply with neither a call nor answer
    text (SGLang strips a `<tool_call>` it cannot read and returns "\n\n") is not a final
    answer: it is planned as one format error, so the model hears its call was not understood.
    Without calls and with answer text, nothing is planned: that text is the final answer.
    """
    native = message.get("tool_calls")
    if isinstance(native, list) and native:
        return [_plan_native(call, step, index) for index, call in enumerate(native)], False
    content = message.get("content")
    parsed = extract_text_calls(content if isinstance(content, str) else None)
    planned = []
    for index, call in enumerate(parsed.calls):
        arguments = None
        error = call.error
        if error is None:
            arguments = dict(call.arguments) if call.typed else coerce_arguments(call.name, call.arguments)
            error = _non_finite_error(call.name, arguments)
        call_id = text_call_id(step, index)
        planned.append(_Planned(call_id, call.name, None if error else arguments, error, "text"))
    if not planned and not parsed.visible.strip():
        planned.append(_Planned(text_call_id(step, 0), "", None, UNREAD_REPLY, "text"))
    return planned, bool(planned)


def _non_finite_error(name: str, arguments: Mapping[str, Any]) -> str | None:
    """The answer to a call whose arguments hold NaN or an infinity, or nest deeper than the
    stack can walk: it is not run."""
    try:
        found = non_finite_argument(arguments)
    except RecursionError:
        return f"ValueError: the arguments of this {name or 'tool'} call nest too deeply; send a flat JSON object."
    if found is None:
        return None
    return (
        f"ValueError: the arguments of this {name or 'tool'} call hold a number that is not finite "
        f"({found}); send a finite number."
    )


def _plan_native(call: Any, step: int, index: int) -> _Planned:
    fallback_id = f"call_{step}_{index}"
    if not isinstance(call, Mapping):
        return _Planned(fallback_id, "", None, "TypeError: a tool call must be an object.", "native")
    function = call.get("function")
    if not isinstance(function, Mapping):
        function = {}
    found_name = function.get("name")
    name: str = found_name if isinstance(found_name, str) else ""
    found_id = call.get("id")
    call_id: str = found_id if isinstance(found_id, str) and found_id else fallback_id
    raw = function.get("arguments")
    if raw is None or raw == "":
        return _Planned(call_id, name, {}, None, "native")
    try:
        value = json.loads(raw) if isinstance(raw, str | bytes) else raw
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the stack
        error = (
            f"JSONDecodeError: the arguments of this {name or 'tool'} call are not valid JSON "
            f"({str(exc)[:200]}). Send the arguments as one flat JSON object."
        )
        return _Planned(call_id, name, None, error, "native")
    if not isinstance(value, Mapping):
        wrong = f"TypeError: tool arguments must be a JSON object, not {type(value).__name__}."
        return _Planned(call_id, name, None, wrong, "native")
    found = _non_finite_error(name, value)  # a RecursionError there is its own answer
    return _Planned(call_id, name, None if found else dict(value), found, "native")


def _length_exit(reply: ModelReply, limits: LeafLimits) -> str:
    """Why a reply was cut: its own token cap, or the context running out (Leaf's rule)."""
    usage = reply.usage
    if usage is None:
        return ExitReason.max_tokens_per_turn
    if usage.prompt_tokens + usage.completion_tokens >= limits.max_context_tokens:
        return ExitReason.max_context_len
    if usage.completion_tokens and usage.completion_tokens < limits.max_completion_tokens:
        return ExitReason.max_context_len  # the server shortened the turn to fit its context
    return ExitReason.max_tokens_per_turn


def _asked(cancel: Callable[[], bool] | None) -> bool:
    if cancel is None:
        return False
    try:
        return bool(cancel())
    except Exception:
        log.warning("leaf_cancel_check_failed", hint="carrying on", exc_info=True)
        return False


def run_leaf(
    model: ModelClient,
    sandbox: ToolSandbox,
    task: str,
    *,
    system_prompt: str,
    limits: LeafLimits | None = None,
    tools: Sequence[Mapping[str, Any]] = TOOL_SCHEMAS,
    on_step: Callable[[StepRecord], None] | None = None,
    cancel: Callable[[], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> LeafResult:
    """Run one task to an exit reason. Never raises for model, tool or sandbox failures.

    `cancel` is polled before every model call and before every tool call. `on_step` runs
    after every step that got a reply; its exceptions are logged, not fatal (persistence
    hiccups should not throw away a long run).
    """
    messages = initial_messages(system_prompt, task)
    return LeafRun(
        model, sandbox, messages, limits or LeafLimits(), tools, on_step=on_step, cancel=cancel, clock=clock
    ).run()


class _Exit(Exception):
    """Ends the run from wherever the reason is found; `LeafRun.run` turns it into the result."""

    def __init__(self, reason: str, error: str | None = None, failure: Ending | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.error = error
        self.failure = failure


@dataclass
class _Answers:
    """One step's tool answers, kept for its record even when the step ends the run."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    calls: list[ToolCallRecord] = field(default_factory=list)
    ending: _Exit | None = None


@dataclass(eq=False)
class LeafRun:
    """One run's state: the append-only history, the step records, the totals and the clock.

    `run` → `step` → `query` (the model) → `answer` → `execute` (each tool call). An exit is
    an `_Exit` raised by whichever of them meets it, so no step carries a break flag. A
    LeafRun is meant to be run once, from `messages` as `initial_messages` makes them
    (`run_leaf` makes one per task, with the defaults).
    """

    model: ModelClient
    sandbox: ToolSandbox
    messages: list[dict[str, Any]] = field(repr=False)  # the history: appended to, never rewritten
    limits: LeafLimits
    tools: Sequence[Mapping[str, Any]]
    on_step: Callable[[StepRecord], None] | None = field(kw_only=True)
    cancel: Callable[[], bool] | None = field(kw_only=True)
    clock: Callable[[], float] = field(kw_only=True)
    records: list[StepRecord] = field(default_factory=list, init=False, repr=False)
    totals: UsageTotals = field(default_factory=UsageTotals, init=False)
    final_answer: str = field(default="", init=False)
    model_seconds: float = field(default=0.0, init=False)
    tool_seconds: float = field(default=0.0, init=False)
    estimated: int = field(default=0, init=False)  # tokens, when the server reports none
    model_calls_made: int = field(default=0, init=False)  # including one that failed or was aborted
    started: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.estimated = estimate_tokens(self.messages)

    def run(self) -> LeafResult:
        """Step until something ends the run; every way of ending becomes a LeafResult."""
        self.started = self.clock()
        reason: str = ExitReason.max_turns
        error: str | None = None
        failure: Ending | None = None
        try:
            for index in range(self.limits.max_steps):
                self.step(index)
        except _Exit as ending:
            reason, error, failure = ending.reason, ending.error, ending.failure
        return LeafResult(
            exit_reason=reason,
            steps=len(self.records),
            model_calls_made=self.model_calls_made,
            messages=self.messages,
            final_answer=self.final_answer,
            usage=self.totals,
            error=error,
            failure=failure,
            elapsed_s=self.clock() - self.started,
            model_seconds=self.model_seconds,
            tool_seconds=self.tool_seconds,
            records=self.records,
        )

    def step(self, index: int) -> None:
        """One model call and its tool calls, reported through `on_step` even when it ends the run."""
        if _asked(self.cancel):
            raise _Exit(ExitReason.cancelled)
        remaining = self.limits.max_seconds - (self.clock() - self.started)
        if remaining <= 0:
            raise _Exit(ExitReason.max_time)
        self.model_calls_made += 1
        model_started = time.perf_counter()
        try:
            reply = self.query(remaining)
        finally:  # a call that failed still took the model's time (its retries included)
            model_seconds = time.perf_counter() - model_started
            self.model_seconds += model_seconds
        if (reply.finish_reason or "").lower() == ABORT_FINISH_REASON:  # not appended: nobody said it
            self._count_unanswered([reply.usage])
            aborted = "the model server aborted the request (finish_reason abort)"
            raise _Exit(ExitReason.llm_query_error, aborted, Ending(EndingKind.model_aborted, aborted))
        assistant = self._append_reply(reply)
        planned, from_text = plan_calls(reply.message, index)
        tools_started = time.perf_counter()
        answers = self.answer(reply, assistant, planned)
        tool_seconds = time.perf_counter() - tools_started
        self.tool_seconds += tool_seconds
        context_tokens = self._count_context(reply, answers.messages)
        self._report(StepRecord(
            step=index, assistant=assistant, tool_messages=answers.messages, calls=answers.calls,
            finish_reason=reply.finish_reason, usage=reply.usage, model_seconds=model_seconds,
            tool_seconds=tool_seconds, text_calls=from_text, context_tokens=context_tokens,
            history=self.messages,
        ))
        if answers.ending is not None:
            raise answers.ending
        if context_tokens >= self.limits.max_context_tokens:
            raise _Exit(ExitReason.max_context_len)

    def query(self, remaining: float) -> ModelReply:
        """One model call with the whole history; its failures become exits."""
        try:
            reply = self.model.complete(
                self.messages, self.tools, timeout=remaining,
                max_completion_tokens=self.limits.max_completion_tokens,
            )
        except ContextOverflow as exc:
            self._count_unanswered(exc.spent)
            raise _Exit(ExitReason.max_context_len, str(exc)) from exc
        except ModelQueryError as exc:
            self._count_unanswered(exc.spent)
            # A call cut short by the run's own deadline is the time limit, not a model failure.
            timed_out = self.clock() - self.started >= self.limits.max_seconds
            if timed_out:
                raise _Exit(ExitReason.max_time, str(exc)) from exc
            raise _Exit(ExitReason.llm_query_error, str(exc), exc.ending) from exc
        except Exception as exc:  # a bug in a model client must still end the run cleanly
            log.exception("leaf_model_client_failed")
            bug = f"{type(exc).__name__}: {exc}"
            raise _Exit(ExitReason.llm_query_error, bug, Ending(EndingKind.model_error, bug, cause=bug)) from exc
        self._count_unanswered(reply.aborted)
        return reply

    def _count_unanswered(self, spent: Sequence[Usage | None]) -> None:
        """Replies the server aborted: calls without a step, whose reported tokens were still spent."""
        for usage in spent:
            self.totals.add(usage)

    def answer(self, reply: ModelReply, assistant: Mapping[str, Any], planned: Sequence[_Planned]) -> _Answers:
        """Answer a reply's calls in order, appending each answer to the history as it comes.

        A reply cut at its length, or holding no calls but answer text, is the end; its visible
        text is the final answer (a reply with neither was planned as a format error by
        `plan_calls`, so it is answered and the run goes on). Cancelling, or a sandbox failure,
        stops before the call concerned, whose answer is never appended; the answers so far are
        still the step's.
        """
        answers = _Answers()
        truncated = (reply.finish_reason or "").lower() in LENGTH_FINISH_REASONS
        if truncated or not planned:
            self.final_answer = extract_text_calls(assistant.get("content") or "").visible.strip()
            answers.ending = _Exit(_length_exit(reply, self.limits) if truncated else ExitReason.agent)
            return answers
        for call in planned:
            if _asked(self.cancel):
                answers.ending = _Exit(ExitReason.cancelled)
                return answers
            try:
                record = self.execute(call)
            except _Exit as ending:
                answers.ending = ending
                return answers
            message = {"role": "tool", "tool_call_id": call.call_id, "content": record.output}
            self.messages.append(message)
            answers.messages.append(message)
            answers.calls.append(record)
        return answers

    def execute(self, call: _Planned) -> ToolCallRecord:
        """One tool call's answer, trimmed once; a call the loop cannot make is answered by it."""
        started = time.perf_counter()
        rejected = True
        if call.error is not None:
            output = call.error
        elif call.name not in TOOL_NAMES:
            output = f"Unknown tool: {call.name}"
        else:
            rejected = False
            output = self._call_sandbox(call)
        output = trim_output(output, self.limits.max_tool_output_chars)
        return ToolCallRecord(
            call.call_id, call.name, call.arguments, output,
            time.perf_counter() - started, call.source, rejected,
        )

    def _call_sandbox(self, call: _Planned) -> str:
        """The sandbox's answer as text; a failure of the sandbox itself ends the run as tool_error."""
        try:
            output = self.sandbox.call_tool(call.name, call.arguments or {})
        except Exception as exc:  # the sandbox failed, or broke in a way it did not foresee
            if not isinstance(exc, SandboxError):
                log.exception("leaf_sandbox_call_failed", tool=call.name)
            broke = f"{type(exc).__name__}: {exc}"
            raise _Exit(ExitReason.tool_error, broke, Ending(EndingKind.sandbox_failure, broke, cause=broke)) from exc
        return output if isinstance(output, str) else str(output)

    def _append_reply(self, reply: ModelReply) -> dict[str, Any]:
        """Append the assistant message as returned and count its usage."""
        assistant = history_message(reply.message)
        self.messages.append(assistant)
        self.totals.add(reply.usage)
        self.estimated += estimate_tokens([assistant])
        return assistant

    def _count_context(self, reply: ModelReply, tool_messages: Sequence[Mapping[str, Any]]) -> int:
        """The context after this step: the server's count plus the new answers, else the estimate."""
        added = estimate_tokens(tool_messages)
        self.estimated += added
        usage = reply.usage
        if usage is not None and usage.prompt_tokens:
            context_tokens = usage.prompt_tokens + usage.completion_tokens + added
        else:
            context_tokens = self.estimated
        self.totals.context_tokens = context_tokens
        return context_tokens

    def _report(self, record: StepRecord) -> None:
        """Keep the record and hand it to `on_step`, whose failures must not end the run."""
        self.records.append(record)
        if self.on_step is None:
            return
        try:
            self.on_step(record)
        except Exception:
            log.warning("leaf_on_step_failed", step=record.step, exc_info=True)
