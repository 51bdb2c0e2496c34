"""The Leaf agent loop, as FrogNano was trained on it (LEAF.md, "The loop").

Messages start as [system, user]; each step sends the whole list with the five tool schemas,
appends the assistant message as the server returned it, and answers every tool call, in
order, with one `tool` message. The history is append-only: nothing sent is ever rewritten, and
each tool output is trimmed once, when it is appended, so every request extends the previous
one byte for byte and SGLang's radix cache keeps its state between steps.

The loop knows only a Model (`model.ModelClient`) and a sandbox's `call_tool`; it imports no
database, queue or web code. The worker persists each step through `on_step`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from sandbox.base import SandboxError
from worker.leaf.model import ContextOverflow, ModelClient, ModelQueryError, ModelReply, Usage
from worker.leaf.textcalls import extract_text_calls
from worker.leaf.tools import TOOL_NAMES, TOOL_SCHEMAS, coerce_arguments

log = logging.getLogger(__name__)

EXIT_REASONS: Final = (
    "agent",
    "max_turns",
    "max_time",
    "max_context_len",
    "max_tokens_per_turn",
    "llm_query_error",
    "tool_error",
    "cancelled",
)
LENGTH_FINISH_REASONS: Final = frozenset({"length", "max_tokens", "max_new_tokens"})
TEXT_CALL_ID_PREFIX: Final = "call_text_"


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
            },
            "model_seconds": round(self.model_seconds, 6),
            "tool_seconds": round(self.tool_seconds, 6),
            "text_calls": self.text_calls,
            "context_tokens": self.context_tokens,
            "tool_calls": [call.to_dict() for call in self.calls],
        }


@dataclass
class UsageTotals:
    """Token totals over the run, from the server's usage reports."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0
    last_prompt_tokens: int = 0
    context_tokens: int = 0

    def add(self, usage: Usage | None) -> None:
        self.calls += 1
        if usage is not None:
            self.prompt_tokens += usage.prompt_tokens
            self.completion_tokens += usage.completion_tokens
            self.last_prompt_tokens = usage.prompt_tokens

    def to_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "calls": self.calls,
            "last_prompt_tokens": self.last_prompt_tokens,
            "context_tokens": self.context_tokens,
        }


@dataclass
class LeafResult:
    """How a run ended. The patch is taken by the caller from the sandbox (LEAF.md step 6)."""

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

    Values are kept exactly as returned (no re-serialising of arguments, no stripping of
    thinking); only the fields the chat template reads are kept, as Leaf does.
    """
    appended: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("reasoning_content"):
        appended["reasoning_content"] = message["reasoning_content"]
    if message.get("tool_calls"):
        appended["tool_calls"] = message["tool_calls"]
    return appended


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

    Native calls win; text calls are read only when the server returned none. A call whose
    arguments cannot be used is still planned, carrying the error text to answer it with.
    """
    native = message.get("tool_calls")
    if isinstance(native, list) and native:
        return [_plan_native(call, step, index) for index, call in enumerate(native)], False
    content = message.get("content")
    reasoning = message.get("reasoning_content")
    parsed = extract_text_calls(
        content if isinstance(content, str) else None,
        reasoning if isinstance(reasoning, str) else None,
    )
    planned = []
    for index, call in enumerate(parsed.calls):
        arguments = None
        if call.error is None:
            arguments = dict(call.arguments) if call.typed else coerce_arguments(call.name, call.arguments)
        call_id = f"{TEXT_CALL_ID_PREFIX}{step}_{index}"
        planned.append(_Planned(call_id, call.name, arguments, call.error, "text"))
    return planned, bool(planned)


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
    if isinstance(raw, Mapping):
        return _Planned(call_id, name, dict(raw), None, "native")
    try:
        value = json.loads(raw) if isinstance(raw, str | bytes) else raw
    except ValueError as exc:
        error = (
            f"JSONDecodeError: the arguments of this {name or 'tool'} call are not valid JSON ({exc}). "
            "Send the arguments as one JSON object."
        )
        return _Planned(call_id, name, None, error, "native")
    if not isinstance(value, dict):
        error = f"TypeError: tool arguments must be a JSON object, not {type(value).__name__}."
        return _Planned(call_id, name, None, error, "native")
    return _Planned(call_id, name, value, None, "native")


def _length_exit(reply: ModelReply, limits: LeafLimits) -> str:
    """Why a reply was cut: its own token cap, or the context running out (Leaf's rule)."""
    usage = reply.usage
    if usage is None:
        return "max_tokens_per_turn"
    if usage.prompt_tokens + usage.completion_tokens >= limits.max_context_tokens:
        return "max_context_len"
    if usage.completion_tokens and usage.completion_tokens < limits.max_completion_tokens:
        return "max_context_len"  # the server shortened the turn to fit its context
    return "max_tokens_per_turn"


def _asked(cancel: Callable[[], bool] | None) -> bool:
    if cancel is None:
        return False
    try:
        return bool(cancel())
    except Exception:
        log.warning("cancel check failed; carrying on", exc_info=True)
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
    limits = limits or LeafLimits()
    messages = initial_messages(system_prompt, task)
    records: list[StepRecord] = []
    totals = UsageTotals()
    started = clock()
    exit_reason: str | None = None
    error: str | None = None
    final_answer = ""
    model_total = tool_total = 0.0
    estimated = estimate_tokens(messages)
    steps = 0

    for step in range(limits.max_steps):
        if _asked(cancel):
            exit_reason = "cancelled"
            break
        remaining = limits.max_seconds - (clock() - started)
        if remaining <= 0:
            exit_reason = "max_time"
            break
        steps += 1
        model_started = time.perf_counter()
        try:
            reply = model.complete(
                messages, tools, timeout=remaining, max_completion_tokens=limits.max_completion_tokens
            )
        except ContextOverflow as exc:
            exit_reason, error = "max_context_len", str(exc)
            break
        except ModelQueryError as exc:
            # A call cut short by the run's own deadline is the time limit, not a model failure.
            timed_out = clock() - started >= limits.max_seconds
            exit_reason, error = ("max_time" if timed_out else "llm_query_error"), str(exc)
            break
        except Exception as exc:  # a bug in a model client must still end the run cleanly
            log.exception("model client failed")
            exit_reason, error = "llm_query_error", f"{type(exc).__name__}: {exc}"
            break
        model_seconds = time.perf_counter() - model_started
        model_total += model_seconds

        assistant = history_message(reply.message)
        messages.append(assistant)
        totals.add(reply.usage)
        estimated += estimate_tokens([assistant])
        planned, from_text = plan_calls(reply.message, step)
        truncated = (reply.finish_reason or "").lower() in LENGTH_FINISH_REASONS

        tool_messages: list[dict[str, Any]] = []
        calls: list[ToolCallRecord] = []
        tools_started = time.perf_counter()
        if truncated or not planned:
            visible = extract_text_calls(assistant.get("content") or "").visible
            final_answer = visible.strip()
            exit_reason = _length_exit(reply, limits) if truncated else "agent"
        else:
            for call in planned:
                if _asked(cancel):
                    exit_reason = "cancelled"
                    break
                call_started = time.perf_counter()
                rejected = True
                if call.error is not None:
                    output = call.error
                elif call.name not in TOOL_NAMES:
                    output = f"Unknown tool: {call.name}"
                else:
                    rejected = False
                    try:
                        output = sandbox.call_tool(call.name, call.arguments or {})
                    except SandboxError as exc:
                        exit_reason, error = "tool_error", f"{type(exc).__name__}: {exc}"
                        break
                    except Exception as exc:  # the sandbox broke in a way it did not foresee
                        log.exception("sandbox call_tool failed")
                        exit_reason, error = "tool_error", f"{type(exc).__name__}: {exc}"
                        break
                    if not isinstance(output, str):
                        output = str(output)
                output = trim_output(output, limits.max_tool_output_chars)
                tool_message = {"role": "tool", "tool_call_id": call.call_id, "content": output}
                messages.append(tool_message)
                tool_messages.append(tool_message)
                calls.append(ToolCallRecord(
                    call.call_id, call.name, call.arguments, output,
                    time.perf_counter() - call_started, call.source, rejected,
                ))
        tool_seconds = time.perf_counter() - tools_started
        tool_total += tool_seconds

        added = estimate_tokens(tool_messages)
        estimated += added
        if reply.usage is not None and reply.usage.prompt_tokens:
            context_tokens = reply.usage.prompt_tokens + reply.usage.completion_tokens + added
        else:
            context_tokens = estimated
        totals.context_tokens = context_tokens

        record = StepRecord(
            step=step, assistant=assistant, tool_messages=tool_messages, calls=calls,
            finish_reason=reply.finish_reason, usage=reply.usage, model_seconds=model_seconds,
            tool_seconds=tool_seconds, text_calls=from_text, context_tokens=context_tokens,
            history=messages,
        )
        records.append(record)
        if on_step is not None:
            try:
                on_step(record)
            except Exception:
                log.warning("on_step callback failed at step %d", step, exc_info=True)
        if exit_reason is not None:
            break
        if context_tokens >= limits.max_context_tokens:
            exit_reason = "max_context_len"
            break
    else:
        exit_reason = "max_turns"

    return LeafResult(
        exit_reason=exit_reason or "max_turns",
        steps=steps,
        messages=messages,
        final_answer=final_answer,
        usage=totals,
        error=error,
        elapsed_s=clock() - started,
        model_seconds=model_total,
        tool_seconds=tool_total,
        records=records,
    )
