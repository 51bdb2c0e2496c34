"""A scripted OpenAI chat-completions server on 127.0.0.1, for tests and the bench.

It is a real HTTP/1.1 server (stdlib, one thread per connection, keep-alive) so the model
client is exercised end to end: serialisation, status codes, timeouts, retries. It answers
`POST /v1/chat/completions` from a script of replies and records every request body it
received, byte for byte, so tests can check the byte-prefix property of the history.

It speaks SGLang 0.5.23's shapes (../shared/fixtures/sglang): content `""` or `"\n\n"`, never
null; `reasoning_content` null when absent; `usage.prompt_tokens_details.cached_tokens` (the
prefix shared with the previous request, counted as this double counts tokens: a quarter of the
bytes); flat errors `{object: "error", message, type, param, code}`; and, like SGLang, a 400
`BadRequest` for a history whose tool-call arguments are not strict JSON for an object.
"""

from __future__ import annotations

import itertools
import json
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_ids = itertools.count(1)
CREATED = 1764547200  # SGLang writes int(time.time()); fixed, as in the fixtures
STOP_TOKEN = 151645  # matched_stop of a natural stop (<|im_end|> in Qwen3 vocabularies)
BYTES_PER_TOKEN = 4  # how this double counts tokens: a quarter of the request's bytes


def sglang_error(code: int, message: str, kind: str | None = None) -> dict[str, Any]:
    """SGLang's flat error body; `kind` defaults as its create_error_response does."""
    return {"object": "error", "message": message, "type": kind or "BadRequestError", "param": None, "code": code}


def context_too_long(prompt_tokens: int = 140_000, context: int = 131_072) -> Status:
    """SGLang's 400 when the prompt alone does not fit (errors.jsonl context_input_longer_than_context)."""
    message = f"The input ({prompt_tokens} tokens) is longer than the model's context length ({context} tokens)."
    return Status(400, sglang_error(400, message))


def overloaded(message: str = "The request queue is full.") -> Status:
    """SGLang's 503 (errors.jsonl queue_full): `type` is the status code as a string."""
    return Status(503, sglang_error(503, message, "503"))


HISTORY_ARGS_INVALID = sglang_error(400, "Assistant tool call function.arguments must be valid JSON.", "BadRequest")
HISTORY_ARGS_NOT_OBJECT = sglang_error(
    400, "Assistant tool call function.arguments must be a JSON object.", "BadRequest"
)


@dataclass
class Reply:
    """A 200 chat completion carrying one assistant message."""

    message: dict[str, Any]
    finish_reason: str = "stop"
    usage: dict[str, Any] | None = None


@dataclass
class Status:
    """An error answer: any status code with a JSON (or raw) body."""

    code: int
    body: Any = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Hang:
    """Never answer (until the server stops or `seconds` pass): the client must time out."""

    seconds: float = 3600.0


@dataclass
class Drop:
    """Close the connection without answering: the client sees a connection error."""


@dataclass
class Cut:
    """Start a 200 answer (head and part of the body), then close: the connection dies mid-reply."""

    reply: Reply


ScriptItem = Reply | Status | Hang | Drop | Cut
Responder = Callable[[int, bytes], ScriptItem]


def tool_call(name: str, arguments: dict[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    """A native tool call as SGLang returns it (arguments as a JSON string)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": call_id or f"call_{next(_ids)}",
        "type": "function",
        "function": {"name": name, "arguments": args},
    }


def text_call(name: str, **params: Any) -> str:
    """A qwen3_coder text tool call, as the model writes it when no parser catches it."""
    parts = ["<tool_call>", f"<function={name}>"]
    for key, value in params.items():
        shown = json.dumps(value) if isinstance(value, bool) else str(value)
        parts += [f"<parameter={key}>", shown, "</parameter>"]
    parts += ["</function>", "</tool_call>"]
    return "\n".join(parts)


def assistant(
    content: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    reasoning: str | None = None,
    finish_reason: str | None = None,
    usage: dict[str, Any] | None = None,
) -> Reply:
    """Shorthand for a reply as SGLang shapes it; the finish reason follows from tool calls unless given.

    Content None becomes what SGLang sends: `"\n\n"` (the text before `<tool_call>`, after
    `</think>`) next to tool calls, `""` otherwise; reasoning_content is null when absent.
    """
    if content is None:
        content = "\n\n" if tool_calls else ""
    message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
    if tool_calls:
        message["tool_calls"] = [dict(call, index=i) for i, call in enumerate(tool_calls)]
    reason = finish_reason or ("tool_calls" if tool_calls else "stop")
    return Reply(message=message, finish_reason=reason, usage=usage)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read the recorded requests instead."""

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        owner = self.server.owner
        started = time.perf_counter()
        baseline = self.path.rstrip("/").endswith("/baseline")
        item, counted = (owner._baseline_reply, Counted(0, 0)) if baseline else owner._next(
            body, dict(self.headers.items())
        )
        if isinstance(item, Hang):
            owner._stopping.wait(item.seconds)
            self.close_connection = True
            return
        if isinstance(item, Drop):
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if isinstance(item, Cut):
            whole = owner._completion(item.reply, counted)
            head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(whole)}\r\n\r\n"
            self.wfile.write(head.encode() + whole[: len(whole) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if isinstance(item, Reply):
            payload = owner._completion(item, counted)
            status = 200
            extra: dict[str, str] = {}
        else:
            payload = item.body if isinstance(item.body, bytes) else json.dumps(item.body).encode()
            status, extra = item.code, item.headers
        self._answer(status, payload, extra)
        (owner.baseline_seconds if baseline else owner.server_seconds).append(time.perf_counter() - started)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/stats"):
            payload = json.dumps(self.server.owner.stats()).encode()
        else:
            payload = self.server.owner.models_payload()
        self._answer(200, payload, {})

    def _answer(self, status: int, payload: bytes, extra: dict[str, str]) -> None:
        head = [f"HTTP/1.1 {status} {'OK' if status == 200 else 'Error'}",
                "Content-Type: application/json", f"Content-Length: {len(payload)}"]
        head += [f"{k}: {v}" for k, v in extra.items()]
        # One write for head and body: no Nagle/delayed-ACK stall on loopback.
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)


@dataclass(frozen=True)
class Counted:
    """One request's tokens as the double counts them, and how many the previous one shares."""

    prompt_tokens: int
    cached_tokens: int


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    owner: ScriptedOpenAIServer


class ScriptedOpenAIServer:
    """Serve a script of replies (or a responder function) and record every request.

    Use as a context manager. `base_url` ends in `/v1` like SGLang's. `requests` holds the raw
    bodies in arrival order (unless `record=False`, for long bench runs), `headers` their
    headers; `server_seconds` the handler's own time from having read a body to having written
    the answer. Whether each request's messages extend the previous one's byte for byte is
    counted as requests arrive (`prefix_ok` of `prefix_pairs`). `POST .../baseline` answers
    `baseline_reply` without touching the script or the counts: the bench's transport baseline.
    """

    def __init__(
        self,
        script: Iterable[ScriptItem] | Responder = (),
        *,
        model: str = "scripted",
        record: bool = True,
        baseline_reply: Reply | None = None,
        port: int = 0,
    ) -> None:
        self._responder: Responder | None = script if callable(script) else None
        self._script: list[ScriptItem] = [] if callable(script) else list(script)
        self.model = model
        self.record = record
        self.requests: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.server_seconds: list[float] = []
        self.baseline_seconds: list[float] = []
        self.count = 0
        self.prefix_ok = 0
        self.prefix_pairs = 0
        self._last_span: bytes | None = None
        self._last_body = b""
        self._last_head: bytes | None = None
        self._baseline_reply = baseline_reply or assistant("baseline")
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.owner = self
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def add(self, *items: ScriptItem) -> None:
        """Append replies to the script while the server runs."""
        with self._lock:
            self._script.extend(items)

    def request_json(self, index: int) -> dict[str, Any]:
        """Decode one recorded request body."""
        decoded: dict[str, Any] = json.loads(self.requests[index])
        return decoded

    def start(self) -> ScriptedOpenAIServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> ScriptedOpenAIServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stats(self) -> dict[str, Any]:
        """Counts and timings, for the bench (served at GET /v1/stats)."""
        return {
            "requests": self.count,
            "prefix_ok": self.prefix_ok,
            "prefix_pairs": self.prefix_pairs,
            "server_seconds": list(self.server_seconds),
            "baseline_seconds": list(self.baseline_seconds),
        }

    def models_payload(self) -> bytes:
        """`GET /v1/models` as SGLang answers it: the one served model, under `model`."""
        entry = {"id": self.model, "object": "model", "created": 1764547200, "owned_by": "sglang", "root": self.model}
        return json.dumps({"object": "list", "data": [entry]}).encode()

    def _next(self, body: bytes, headers: dict[str, str]) -> tuple[ScriptItem, Counted]:
        with self._lock:
            index = self.count
            self.count += 1
            if self.record:
                self.requests.append(body)
                self.headers.append(headers)
            previous = self._last_body
            shared = self._track_prefix(body)
            counted = Counted(math.ceil(len(body) / BYTES_PER_TOKEN), shared // BYTES_PER_TOKEN)
            appended = bool(previous) and shared == len(previous) - 2  # only new messages to check
            refused = _history_refusal(body[shared:] if appended else body, partial=appended)
            if refused is not None:
                return Status(400, refused), counted
            responder = self._responder
            if responder is None:
                if not self._script:
                    exhausted = sglang_error(500, "scripted server: script exhausted", "InternalServerError")
                    return Status(500, exhausted), counted
                return self._script.pop(0), counted
        return responder(index, body), counted  # outside the lock: a responder that holds one answer holds no other

    def _track_prefix(self, body: bytes) -> int:
        """Count byte-prefix extensions; return how many bytes this body shares with the last.

        The usual case costs one comparison of the messages (the fields before them, a few KB,
        are compared apart), so a 700 KB history adds nothing to the bench's figures.
        """
        try:
            span = messages_span(body)
        except (ValueError, UnicodeDecodeError):
            span = b""
        head = body[: len(body) - len(span) - 1] if span and body.endswith(b"]}") else None
        extends = False
        if self._last_span is not None:
            self.prefix_pairs += 1
            if span.startswith(self._last_span[:-1]) and len(span) > len(self._last_span):
                self.prefix_ok += 1
                extends = True
        if extends and head is not None and head == self._last_head:
            shared = len(head) + len(self._last_span or b"") - 1
        else:
            shared = _shared_prefix(self._last_body, body)
        self._last_span, self._last_head, self._last_body = span, head, body
        return shared

    def _completion(self, reply: Reply, counted: Counted) -> bytes:
        """The chat.completion JSON as SGLang 0.5.23 writes it (fixtures: responses.jsonl)."""
        usage = dict(reply.usage or {})
        prompt = usage.get("prompt_tokens", counted.prompt_tokens)
        completion = usage.get("completion_tokens", 10)
        usage.setdefault("prompt_tokens_details", {"cached_tokens": min(counted.cached_tokens, prompt)})
        usage.setdefault("reasoning_tokens", 0)
        usage.setdefault("completion_tokens_details", None)
        usage.update(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)
        matched = STOP_TOKEN if reply.finish_reason == "stop" else None
        payload = {
            "id": f"{len(self.requests):032x}",
            "object": "chat.completion",
            "created": CREATED,
            "model": self.model,
            "choices": [{"index": 0, "message": reply.message, "logprobs": None,
                         "finish_reason": reply.finish_reason, "matched_stop": matched}],
            "usage": usage,
            "metadata": {"weight_version": "default"},
        }
        return json.dumps(payload).encode()


def _shared_prefix(before: bytes, after: bytes) -> int:
    """Length of the common prefix: the whole earlier body but its closing `]}` when the history
    was only appended to (the usual case, one comparison), else found by halving."""
    if not before:
        return 0
    if after.startswith(before[:-2]):
        return len(before) - 2
    low, high = 0, min(len(before), len(after))
    while low < high:
        middle = (low + high + 1) // 2
        if after.startswith(before[:middle]):
            low = middle
        else:
            high = middle - 1
    return low


def _history_refusal(tail: bytes, *, partial: bool) -> dict[str, Any] | None:
    """SGLang's 400 for a history tool call whose arguments are not strict JSON for an object.

    When the body only appends to the last one, only the new messages are read (`partial`:
    `tail` is `,{...},{...}]}`), so a long history costs this double no more than a short one.
    """
    try:
        if partial:
            start = tail.find(b"{")
            messages = json.loads(b"[" + tail[start:-1]) if start >= 0 and tail.endswith(b"]}") else []
        else:
            messages = json.loads(tail).get("messages") or []
    except (ValueError, AttributeError):
        return None  # not this double's business: the test sent something else on purpose
    for message in messages:
        if not isinstance(message, dict) or message.get("role") != "assistant":
            continue
        for call in message.get("tool_calls") or []:
            arguments = (call.get("function") or {}).get("arguments") if isinstance(call, dict) else None
            if not isinstance(arguments, str):
                continue
            try:
                value = json.loads(arguments, parse_constant=_not_json)
            except ValueError:
                return HISTORY_ARGS_INVALID
            if not isinstance(value, dict):
                return HISTORY_ARGS_NOT_OBJECT
    return None


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def sglang_responder(
    *, reasoning_parser: bool = True, tool_call_parser: bool = True, cache_report: bool = True
) -> Responder:
    """Answer every request as SGLang 0.5.23 serving FrogNano does, with or without its launch flags.

    The model "writes" a short thought, `</think>` (FrogNano's template opens the thinking, so the
    text holds only the closing tag), then one qwen3_coder call of the request's first tool. The
    shapes follow ../shared/fixtures/sglang/responses.jsonl: `call_read` (both parsers),
    `no_tool_parser_text_call` (no --tool-call-parser: the call stays in content, finish `stop`),
    `cache_report_on_first_turn` / `cache_report_off` (prompt_tokens_details present or null).
    Without --reasoning-parser the whole text, `</think>` included, is content and
    reasoning_content is null.
    """

    def respond(index: int, body: bytes) -> ScriptItem:
        request = json.loads(body)
        tools = request.get("tools") or [{"function": {"name": "Bash"}}]
        name = tools[0]["function"]["name"]
        thought, after = "Run the command.\n", "\n\n"
        parsed = tool_call_parser and "tools" in request
        # The tool-call parser keeps only the text before <tool_call> in content.
        rest = after if parsed else after + text_call(name, command="true")
        message: dict[str, Any] = {
            "role": "assistant",
            "content": rest if reasoning_parser else thought + "</think>" + rest,
            "reasoning_content": thought if reasoning_parser else None,
        }
        if parsed:
            call = tool_call(name, {"command": "true"}, f"call_{index:024x}")
            message["tool_calls"] = [dict(call, index=0)]
        usage = {
            "prompt_tokens": 300,
            "completion_tokens": 30,
            "prompt_tokens_details": {"cached_tokens": 0} if cache_report else None,
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }
        return Reply(message=message, finish_reason="tool_calls" if parsed else "stop", usage=usage)

    return respond


def messages_span(body: bytes) -> bytes:
    """The raw bytes of a request's `messages` array, exactly as sent."""
    key_bytes = b'"messages":['
    start_bytes = body.rfind(key_bytes)
    if start_bytes >= 0 and body.endswith(b"]}") and body.count(key_bytes) == 1:
        return body[start_bytes + len(key_bytes) - 1:-1]  # messages is the last field: no parse
    text = body.decode("utf-8")
    key = '"messages":'
    start = text.index(key) + len(key)
    while text[start].isspace():
        start += 1
    _, end = json.JSONDecoder().raw_decode(text, start)
    return text[start:end].encode("utf-8")


def prefix_extensions(bodies: list[bytes]) -> tuple[int, int]:
    """(how many requests extend the previous one's messages byte for byte, how many pairs)."""
    spans = [messages_span(body) for body in bodies]
    good = 0
    for before, after in itertools.pairwise(spans):
        # Drop the closing bracket: the next array must continue exactly where this one stopped.
        if after.startswith(before[:-1]) and len(after) > len(before):
            good += 1
    return good, max(0, len(spans) - 1)


def main() -> None:
    """Serve endless tool-calling replies in a process of its own (the bench's model).

    Prints `PORT <n>` once listening; stops on SIGTERM or when stdin closes.
    """
    import argparse
    import signal
    import sys

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--reasoning-chars", type=int, default=400)
    args = parser.parse_args()
    reasoning = ("Reading the output and deciding the next command. " * 50)[: args.reasoning_chars]
    counter = itertools.count()

    def respond(index: int, body: bytes) -> ScriptItem:
        call = tool_call("Bash", {"command": "cat output.txt"}, f"call_{next(counter)}")
        usage = {"prompt_tokens": 1000, "completion_tokens": 60}
        return assistant(None, reasoning=reasoning, tool_calls=[call], usage=usage)

    server = ScriptedOpenAIServer(respond, record=False)
    signal.signal(signal.SIGTERM, lambda *_: server._stopping.set())
    server.start()
    print(f"PORT {server._server.server_address[1]}", flush=True)
    def stop_when_stdin_closes() -> None:
        sys.stdin.read()
        server._stopping.set()

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    server._stopping.wait()
    server.stop()


if __name__ == "__main__":
    main()
