"""Tool calls that arrive as text in the qwen3_coder form, and inline `<think>` reasoning.

The one reader of text calls: the agent loop (worker/leaf) runs what it reads, and the dashboard
shows the same calls (and the reply's prose without them), so what a trajectory page shows is
what ran. Standard library only, so both may import it.

SGLang's `qwen3_coder` parser normally turns these into `message.tool_calls`; when it is not
running the call stays in `content`, and this module reads it back. Only the visible content is
read: never `reasoning_content` and never inline `<think>` text, because SGLang never runs a
call the model merely thought about (a call quoted while thinking is not a call). It never
raises: a call it cannot read becomes a `TextCall` with an `error`, which the loop answers as a
tool error so the model can write it again. Parameter values are kept raw (strings);
`tools.coerce_arguments` types them by schema.

Where this reader and SGLang's `qwen3_coder` detector differ, on purpose: a value may contain
`</parameter>`, `</function>` or `</tool_call>` text when its own `</parameter>` follows (SGLang
cuts the value at the first one); a value never contains `<parameter=`: a parameter left open
ends where the next `<parameter=` or `</function>` starts a line (SGLang's rule), and anywhere
else the call is a format error; the JSON (Hermes) form is read; names are stripped. As in
SGLang, a `<tool_call>` block that holds no `<function=` (and no JSON) yields no call: beside a
real call it is prose (`Use <tool_call>...</tool_call> blocks.`) and is dropped; alone it is
answered as a format error, where SGLang would return empty content, so the model hears that its
call was not understood either way.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Final

OPEN_CALL: Final = "<tool_call>"
CLOSE_CALL: Final = "</tool_call>"
OPEN_FUNCTION: Final = "<function="
CLOSE_FUNCTION: Final = "</function>"
OPEN_PARAM: Final = "<parameter="
CLOSE_PARAM: Final = "</parameter>"
OPEN_THINK: Final = "<think>"
CLOSE_THINK: Final = "</think>"

ERROR_NAME: Final = "ToolCallFormatError"
FORM_HINT: Final = (
    "Write each call as <tool_call>, <function=NAME>, one <parameter=NAME>value</parameter> per "
    "argument, </function>, </tool_call>, each tag on its own line."
)
# The answer to a reply with no readable call and no answer text (SGLang strips a <tool_call>
# it cannot read and returns content "\n\n"): not a final answer, the model is told to try again.
UNREAD_REPLY: Final = (
    f"{ERROR_NAME}: your last reply held no tool call that could be read, and no answer. {FORM_HINT} "
    "When the task is done, reply with a brief final answer instead."
)
TEXT_CALL_ID_PREFIX: Final = "call_text_"


def text_call_id(step: int, index: int) -> str:
    """The id the loop gives a step's `index`-th text call (both 0-based); its tool answer carries it."""
    return f"{TEXT_CALL_ID_PREFIX}{step}_{index}"


_FUNCTION_TAG = re.compile(r"<function=([^<>\n]*)>")
_PARAM_TAG = re.compile(r"<parameter=([^<>\n]*)>")
_START = re.compile(re.escape(OPEN_CALL) + "|" + re.escape(OPEN_FUNCTION))
_AFTER_VALUE: Final = (OPEN_PARAM, CLOSE_FUNCTION, CLOSE_CALL)
_NEXT_CALL = re.compile(re.escape(CLOSE_CALL) + r"\s*(?:" + re.escape(OPEN_CALL) + "|" + re.escape(OPEN_FUNCTION) + ")")
_SNIPPET = 60


@dataclass(frozen=True)
class TextCall:
    """One call read from text. `error` set means: do not run it, answer with the error."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    typed: bool = False  # arguments already carry JSON types (the JSON form of a call)


@dataclass(frozen=True)
class TextParse:
    """What a reply's text holds: calls in order, and the visible text without the thinking.

    `spans` are where each call's block lies in `visible` (start, end), one per call.
    """

    calls: list[TextCall]
    visible: str
    inline_reasoning: str | None
    spans: list[tuple[int, int]] = field(default_factory=list)

    @property
    def prose(self) -> str:
        """The visible text without the blocks of the calls read from it: what the reply said
        beside its calls (a mere mention of a tag, which is no call, stays)."""
        return _prose_without(self.visible, self.spans)


class _Malformed(Exception):
    """Internal: a call block that cannot be read; carries where scanning may resume.

    `prose` marks a `<tool_call>` block with no `<function=` and no JSON in it: SGLang drops
    such a block, so it is a mention, not a call, when the reply holds a call as well.
    """

    def __init__(self, message: str, resume: int | None = None, *, prose: bool = False) -> None:
        super().__init__(message)
        self.resume = resume
        self.prose = prose


def split_think(text: str) -> tuple[str | None, str]:
    """Split inline reasoning from the rest: `(reasoning, visible)`.

    The qwen3 chat template opens `<think>` inside the prompt, so a reply may hold only the
    closing tag: everything before a lone `</think>` is reasoning. An unclosed `<think>` runs to
    the first `<tool_call>` (where SGLang's qwen3 reasoning parser ends it too) or to the end.
    """
    close = text.find(CLOSE_THINK)
    if close >= 0:
        before = text[:close]
        after = text[close + len(CLOSE_THINK):]
        opened = before.find(OPEN_THINK)
        if opened >= 0:
            return before[opened + len(OPEN_THINK):], before[:opened] + after
        return before, after
    opened = text.find(OPEN_THINK)
    if opened >= 0:
        call = text.find(OPEN_CALL, opened)
        if call >= 0:
            return text[opened + len(OPEN_THINK):call], text[:opened] + text[call:]
        return text[opened + len(OPEN_THINK):], text[:opened]
    return None, text


def extract_text_calls(content: str | None) -> TextParse:
    """Read the text calls of one assistant reply's content, outside its inline thinking.

    `reasoning_content` is deliberately not an argument: a call the model wrote while thinking
    is never run (SGLang leaves it there as text, and so do we).
    """
    inline, visible = split_think(content or "")
    found = _scan(visible)
    return TextParse(
        calls=[call for call, _ in found], visible=visible, inline_reasoning=inline, spans=[span for _, span in found]
    )


def parse_tool_calls(text: str) -> list[TextCall]:
    """Every call block of `text`, in order; never raises.

    A broken `<tool_call>` block becomes an error call (the model meant a call). A bare
    `<function=...>` without the wrapper counts only when it reads as a whole call: prose that
    mentions the tag is not a call, as it is not for SGLang. A block with no `<function=` in it
    is an error only when nothing else in the text is call-like (see `_Malformed.prose`).
    """
    return [call for call, _ in _scan(text)]


def _prose_without(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` without the given spans, trimmed; where a span was cut out, one blank line."""
    if not spans:
        return text.strip()
    pieces: list[str] = []
    pos = 0
    for start, end in sorted(spans):
        pieces.append(text[pos:start] if start > pos else "")
        pos = max(pos, end)
    pieces.append(text[pos:])
    return "\n\n".join(kept for piece in pieces if (kept := piece.strip()))


def _scan(text: str) -> list[tuple[TextCall, tuple[int, int]]]:
    """`parse_tool_calls` with where each call's block lies in `text`."""
    calls: list[tuple[TextCall, tuple[int, int]]] = []
    prose: list[tuple[TextCall, tuple[int, int]]] = []  # errors for blocks SGLang drops; kept if all there is
    pos = 0
    while True:
        match = _START.search(text, pos)
        if match is None:
            return calls or prose
        start = match.start()
        wrapped = match.group() == OPEN_CALL
        try:
            call, pos = _read_block(text, start, wrapped)
        except _Malformed as exc:
            resume = exc.resume if exc.resume is not None else _resume_after(text, start, wrapped)
            pos = max(resume, start + 1)
            if wrapped:
                error = TextCall(name="", error=f"{ERROR_NAME}: {exc} {FORM_HINT}")
                (prose if exc.prose else calls).append((error, (start, pos)))
            continue
        except Exception as exc:  # pragma: no cover - a parser bug must not end the run
            pos = start + 1
            error = TextCall(name="", error=f"{ERROR_NAME}: could not read a tool call ({exc!r}).")
            calls.append((error, (start, pos)))
            continue
        if call is not None:
            calls.append((call, (start, pos)))


def _read_block(text: str, start: int, wrapped: bool) -> tuple[TextCall | None, int]:
    """Read one block at `start`; returns the call (None for a mere mention) and the end."""
    if not wrapped:
        return _read_function(text, start)
    body = _skip_ws(text, start + len(OPEN_CALL))
    if text.startswith(OPEN_FUNCTION, body):
        call, end = _read_function(text, body)
        after = _skip_ws(text, end)
        if text.startswith(CLOSE_CALL, after):
            end = after + len(CLOSE_CALL)
        return call, end
    close = text.find(CLOSE_CALL, body)
    if close < 0:
        return None, body  # `<tool_call>` with nothing call-like after it: prose, not a call
    again = text.find(OPEN_CALL, body, close)
    if again >= 0:
        return None, again  # prose that mentions the tag, then a real block: read that one
    inner = text[body:close].strip()
    if inner.startswith("{"):
        return _read_json_call(inner), close + len(CLOSE_CALL)
    raise _Malformed(
        f"a <tool_call> block must start with <function=NAME>; found {_snippet(inner)}.",
        close + len(CLOSE_CALL),
        prose=OPEN_FUNCTION not in inner,
    )


def _read_function(text: str, start: int) -> tuple[TextCall, int]:
    tag = _FUNCTION_TAG.match(text, start)
    if tag is None:
        raise _Malformed(f"unreadable function tag {_snippet(text[start:])}; expected <function=NAME>.")
    name = tag.group(1).strip()
    if not name:
        raise _Malformed("a <function=...> tag without a tool name.")
    arguments: dict[str, Any] = {}
    pos = tag.end()
    while True:
        pos = _skip_ws(text, pos)
        if text.startswith(CLOSE_FUNCTION, pos):
            return TextCall(name=name, arguments=arguments), pos + len(CLOSE_FUNCTION)
        if text.startswith(CLOSE_CALL, pos):  # </function> forgotten, the block closed: SGLang reads it too
            return TextCall(name=name, arguments=arguments), pos
        if text.startswith(OPEN_PARAM, pos):
            key, value, pos = _read_parameter(text, pos, name)
            if key in arguments:
                raise _Malformed(f"parameter '{key}' of {name} is given twice.")
            arguments[key] = value
            continue
        if pos >= len(text):
            raise _Malformed(f"<function={name}> is not closed with {CLOSE_FUNCTION}.")
        raise _Malformed(
            f"unexpected text inside <function={name}>: {_snippet(text[pos:])}; "
            f"expected <parameter=NAME> or {CLOSE_FUNCTION}."
        )


def _read_parameter(text: str, start: int, function: str) -> tuple[str, str, int]:
    """One `<parameter=NAME>value</parameter>`; returns the name, the raw value and the end.

    A value never runs past the next `<parameter=`, nor across the end of a call into the next
    one. Within that stretch it ends at the first `</parameter>` followed by the next tag, so a
    value may itself contain closing-tag text (source code of a parser, say). A parameter left
    open ends where the next `<parameter=` or `</function>` starts a line (SGLang's rule); one
    that is open anywhere else makes the call a format error, so tag text never folds into a
    command, a path or file content.
    """
    tag = _PARAM_TAG.match(text, start)
    if tag is None:
        raise _Malformed(f"unreadable parameter tag in <function={function}>: {_snippet(text[start:])}.")
    key = tag.group(1).strip()
    if not key:
        raise _Malformed(f"a <parameter=...> tag without a name in <function={function}>.")
    value_start = tag.end()
    crossing = _NEXT_CALL.search(text, value_start)
    stretch_end = crossing.start() if crossing else len(text)
    next_param = text.find(OPEN_PARAM, value_start, stretch_end)
    if next_param >= 0:
        stretch_end = next_param
    search = value_start
    while (close := text.find(CLOSE_PARAM, search, stretch_end)) >= 0:
        after = _skip_ws(text, close + len(CLOSE_PARAM))
        if text.startswith(_AFTER_VALUE, after) or after >= len(text):
            return key, _raw_value(text[value_start:close]), close + len(CLOSE_PARAM)
        search = close + 1
    end = text.find(CLOSE_FUNCTION, value_start, stretch_end)
    if end < 0 and next_param >= 0:
        end = next_param
    if end >= 0 and _starts_line(text, value_start, end):
        return key, _raw_value(text[value_start:end]), end
    raise _Malformed(f"parameter '{key}' of {function} is not closed with {CLOSE_PARAM}.")


def _raw_value(value: str) -> str:
    """LEAF.md: one leading and one trailing newline are not part of the value."""
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


def _starts_line(text: str, value_start: int, tag: int) -> bool:
    """Whether the tag at `tag` opens a line of the value (only blanks before it on its line)."""
    line_start = text.rfind("\n", value_start, tag) + 1 or value_start
    return not text[line_start:tag].strip()


def _read_json_call(inner: str) -> TextCall:
    """The Hermes JSON form (`{"name": ..., "arguments": {...}}`), which Qwen models also write."""
    try:
        data = json.loads(inner)
    except (ValueError, RecursionError) as exc:  # RecursionError: nesting deeper than the stack
        return TextCall(name="", error=f"{ERROR_NAME}: the JSON in a <tool_call> block is invalid ({exc}).")
    if not isinstance(data, dict) or not isinstance(data.get("name"), str) or not data["name"].strip():
        return TextCall(name="", error=f"{ERROR_NAME}: a JSON tool call needs a \"name\". {FORM_HINT}")
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError, RecursionError):
            arguments = json.loads(arguments)
    if not isinstance(arguments, dict):
        return TextCall(name=data["name"], error=f"{ERROR_NAME}: tool arguments must be a JSON object.")
    return TextCall(name=data["name"], arguments=arguments, typed=True)


def _resume_after(text: str, start: int, wrapped: bool) -> int:
    """Where scanning goes on after a broken block: its `</tool_call>` or the next block."""
    found = [text.find(CLOSE_CALL, start), text.find(OPEN_CALL, start + 1)]
    if not wrapped:
        found.append(text.find(OPEN_FUNCTION, start + 1))
    ends = [i for i in found if i >= 0]
    if not ends:
        return len(text)
    end = min(ends)
    return end + len(CLOSE_CALL) if text.startswith(CLOSE_CALL, end) else end


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _snippet(text: str) -> str:
    shown = text[:_SNIPPET].replace("\n", "\\n")
    return repr(shown + ("..." if len(text) > _SNIPPET else ""))
