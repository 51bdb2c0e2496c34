"""The runner client, written once for both backends: FrogFix's side of `runner.py`'s protocol.

Why it is its own module: the local and the Kubernetes backends differ only in how bytes reach
the runner (bwrap's pipes, or an exec stream that may break and be recovered) and in how a
sandbox starts and ends. What a request looks like, which reply answers it, what `ok: false`
and its `code` mean and which fields a reply must carry is the same for both, so it lives here:

- `RunnerChannel` is the one thing a backend supplies: send one request object, return the
  reply object that answers it (framed with `encode_request`/`decode_reply` from here).
- `RunnerClient` implements the runner-facing half of `sandbox.base.Sandbox` over a channel:
  `call_tool`, `run_command`, `patch`, `patch_bytes`, `ping`, the closed/dead state and
  `close()`; a backend subclasses it and adds its lifecycle (start, limits, release).
- A channel raises `RunnerBroken` when the runner can no longer be trusted (no answer, exited,
  garbage); the client then marks the sandbox dead through the backend's `_broken` hook, which
  adds what the backend knows (stderr, the wall-clock limit) and stops it. Other
  `SandboxError`s (e.g. "the sandbox is closed") pass through unchanged.
- Error replies are told apart by their machine-readable `code` (see runner.py), never by their
  text: `patch_too_large` becomes `PatchTooLarge`; the others a plain `SandboxError`.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import math
import os
import subprocess
import threading
from types import TracebackType
from typing import IO, Any, Protocol, Self

from sandbox.base import CommandResult, PatchTooLarge, SandboxError, SandboxLimits, SandboxOptions
from sandbox.runner import bash_timeout

# How long the runner may take to write a patch (git add -A + git diff), before the reply grace.
PATCH_TIMEOUT_S = 600.0
RUNNER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")


class RunnerBroken(Exception):
    """Raised by a channel when the runner stream can no longer be trusted; the sandbox must die.

    Not a SandboxError on purpose: only the client turns it into one, through the backend's
    `_broken`, so every such failure marks the sandbox dead the same way.
    """


class RunnerChannel(Protocol):
    """How a backend reaches its runner: one request out, its reply back.

    `request` already carries its `id`; the reply returned is the decoded object that echoes it
    (use `decode_reply`). Raise `RunnerBroken` when the runner failed or answered garbage, and
    `SandboxError` for the sandbox's own state (e.g. closed while waiting).
    """

    def exchange(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send `request` as one line and return the reply object that answers it."""
        ...


def encode_request(request: dict[str, Any]) -> bytes:
    """One request as the JSON line the runner reads (ASCII, so no encoding can differ)."""
    return json.dumps(request, ensure_ascii=True, default=str).encode("ascii") + b"\n"


def decode_reply(raw: bytes, rid: Any) -> dict[str, Any]:
    """The reply object in `raw`, checked to answer request `rid`; RunnerBroken otherwise."""
    try:
        reply = json.loads(raw)
    except ValueError:
        raise RunnerBroken(f"the sandbox runner sent a line that is not JSON: {raw[:200]!r}") from None
    if not isinstance(reply, dict) or reply.get("id") != rid:
        raise RunnerBroken(f"the sandbox runner sent an unexpected reply: {raw[:200]!r}")
    return reply


def read_runner_source(runner_script: str | None) -> bytes:
    """The runner program a backend puts into its sandbox (tests pass a fake one)."""
    with open(runner_script or RUNNER_SCRIPT, "rb") as handle:
        return handle.read()


def compiled_runner(python: str, source: bytes, filename: str) -> bytes:
    """The runner as `python` itself compiles it (a .pyc's bytes), else `source` where that fails.

    A sandbox runs the runner with -B from a file it cannot write, so from source every start
    compiled it again (about 12 ms, a tenth of a local sandbox's start). Python runs a file that
    begins with its own bytecode magic as bytecode, whatever the file's name (`filename` is the
    one tracebacks show). The bytecode is made by the same interpreter binary the sandbox runs (the
    host's, never a job's), once per worker process and binary.
    """
    real = os.path.realpath(python)
    try:
        st = os.stat(real)
    except OSError:
        return source
    return _compiled_by(real, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns), source, filename)


# Reads the source on stdin, writes a .pyc's bytes (magic, 12 header bytes a script run ignores, the code).
COMPILE_RUNNER = (
    "import importlib.util, marshal, sys; "
    "code = compile(sys.stdin.buffer.read(), sys.argv[1], 'exec', dont_inherit=True, optimize=0); "
    "sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code))"
)


@functools.lru_cache(maxsize=8)
def _compiled_by(python: str, binary: tuple[int, int, int, int], source: bytes, filename: str) -> bytes:
    try:
        done = subprocess.run(
            [python, "-I", "-S", "-B", "-c", COMPILE_RUNNER, filename],
            input=source,
            capture_output=True,
            timeout=60,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return source
    return done.stdout if done.returncode == 0 and len(done.stdout) > 16 else source


class StderrTail:
    """The last bytes of the runner's (or bwrap's) stderr, kept for error messages."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data = bytearray()
        self._lock = threading.Lock()

    def add(self, chunk: bytes) -> None:
        with self._lock:
            self._data += chunk
            del self._data[: -self.size]

    def drain(self, stream: IO[bytes]) -> None:
        """Reader thread body: keep the tail of `stream` until it closes."""
        with contextlib.suppress(OSError, ValueError):
            while chunk := os.read(stream.fileno(), 4096):
                self.add(chunk)

    def data(self) -> bytes:
        with self._lock:
            return bytes(self._data)

    def text(self) -> str:
        return self.data().decode("utf-8", "replace").strip()


class RunnerClient:
    """The runner-facing half of the Sandbox protocol, over one `RunnerChannel`.

    Requests are serialised by one lock (the runner answers one at a time). A backend sets
    `_channel` before its first request, overrides `_broken` to stop itself and `_release` to
    free what it holds; `close()` is then idempotent for every backend.
    """

    _channel: RunnerChannel

    def __init__(self, limits: SandboxLimits, options: SandboxOptions) -> None:
        self.limits = limits
        self.tool_timeout_s = options.tool_timeout_s
        self.reply_grace_s = options.reply_grace_s
        self.max_patch_bytes = options.max_patch_bytes
        self.runner_info: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._closed = False
        self._dead: str | None = None
        self._seq = 0

    # ------------------------------------------------------------------------- the protocol

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one Leaf tool call; returns Leaf's exact text (a tool's own errors included)."""
        payload = {"op": "tool", "name": name, "arguments": arguments}
        reply = self._request(payload, self._tool_deadline(name, arguments))
        return str(self._field(reply, "output", str))

    def run_command(
        self, command: str, timeout: float, log_limit: int | None = None, results_limit: int = 0
    ) -> CommandResult:
        """Run a pipeline command (tests, setup) with its own timeout; the log is head+tail bounded.
        With `results_limit`, also what the command wrote on the results channel (None if over it)."""
        limit = self.limits.output_bytes if log_limit is None else log_limit
        payload: dict[str, Any] = {"op": "exec", "command": command, "timeout": timeout, "log_limit": limit}
        if results_limit > 0:
            payload["results_limit"] = results_limit
        reply = self._request(payload, timeout + self.reply_grace_s)
        results = None
        if results_limit > 0 and not self._field(reply, "results_overflow", bool):
            results = self._field(reply, "results", str)
        return CommandResult(
            command=command,
            exit_code=self._field(reply, "exit_code", int),
            log=self._field(reply, "log", str),
            timed_out=self._field(reply, "timed_out", bool),
            duration_s=float(self._field(reply, "duration_s", (int, float))),
            results=results,
        )

    def patch(self, base_commit: str) -> str:
        """The patch as text; undecodable bytes are kept as surrogates (encode with
        'surrogateescape' to get the exact bytes back), or use `patch_bytes`."""
        return self.patch_bytes(base_commit).decode("utf-8", "surrogateescape")

    def patch_bytes(self, base_commit: str) -> bytes:
        """`git add -A` then `git diff --cached --binary <base_commit>`, taken inside the sandbox.

        Raises PatchTooLarge (the sandbox stays usable) when the diff exceeds `max_patch_bytes`.
        """
        payload = {"op": "patch", "base": base_commit, "max_bytes": self.max_patch_bytes}
        reply = self._request(payload, PATCH_TIMEOUT_S + self.reply_grace_s)
        try:
            return base64.b64decode(self._field(reply, "patch_b64", str), validate=True)
        except ValueError:
            raise self._broken("the runner sent a patch that is not base64") from None

    def ping(self) -> dict[str, Any]:
        """Round-trip a no-op; returns the runner's pid, uid and Python version."""
        return self._request({"op": "ping"}, self.tool_timeout_s)

    def close(self) -> None:
        """Stop every process of the sandbox and free what it holds; idempotent."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self._release()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------------- for backends

    def _release(self) -> None:
        """Free what the backend holds; called once, by the first `close()`."""

    def _broken(self, message: str) -> SandboxError:
        """Mark the sandbox unusable and build the error for the caller to raise (backends add
        their own context and stop the sandbox)."""
        self._dead = message
        return SandboxError(message)

    def _state(self) -> str:
        """`closed`, the reason the sandbox died, or `open` (for `__repr__`)."""
        return "closed" if self._closed else (self._dead or "open")

    def _check_usable(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if self._dead is not None:
            raise SandboxError(self._dead)

    def _usable(self) -> bool:
        return not self._closed and self._dead is None

    def _tool_deadline(self, name: str, arguments: Any) -> float:
        """A Bash call may run as long as its own timeout (plus grace); other tools are quick.

        The model chooses that timeout, so it is bounded here: a value the runner refuses (NaN,
        Infinity) waits the default, and none waits past the sandbox's own wall clock. An
        unbounded wait (`queue.get(timeout=inf)` raises OverflowError after the request went
        out) would leave its reply unread and every later reply one request behind.
        """
        if name != "Bash" or not isinstance(arguments, dict):
            return self.tool_timeout_s
        try:
            timeout = bash_timeout(arguments, self.limits.default_tool_timeout)
        except (ValueError, OverflowError):
            timeout = self.limits.default_tool_timeout
        if not math.isfinite(timeout):
            timeout = self.limits.default_tool_timeout
        return min(timeout, self.limits.wall_seconds) + self.reply_grace_s

    def _request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request through the channel; its reply if `ok`, else the error its code names."""
        with self._lock:
            self._check_usable()
            self._seq += 1
            try:
                reply = self._channel.exchange({"id": self._seq, **payload}, timeout)
            except RunnerBroken as exc:
                raise self._broken(str(exc)) from None
            if reply.get("ok") is not True:
                raise self._runner_error(reply)
            return reply

    def _runner_error(self, reply: dict[str, Any]) -> SandboxError:
        """An error reply as an exception, chosen by its `code`; the sandbox stays usable."""
        message = f"sandbox runner: {reply.get('error', 'unknown error')}"
        if reply.get("code") == "patch_too_large":
            return PatchTooLarge(message, limit=self.max_patch_bytes)
        return SandboxError(message)

    def _field(self, reply: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
        value = reply.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self._broken(f"the sandbox runner sent a reply without a valid {key!r}")
        return value
