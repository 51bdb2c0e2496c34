"""The Kubernetes backend's transport: one exec's WebSocket, and the runner channel over it.

Why it is its own module: the sandbox's life (policy, pod, copy-in, recovery) and the bytes on one
exec stream are separate concerns; this one knows the channel protocol (v4/v5.channel.k8s.io:
stdin, stdout, stderr and an exit Status, each frame tagged with its channel) and nothing of pods.
`StreamChannel` is the `RunnerChannel` the backend hands to its journal and recovery
(sandbox/kubernetes_recovery.py), which hands it to the `RunnerClient`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

from websocket import ABNF, WebSocketTimeoutException

from sandbox.base import SandboxError
from sandbox.runner_client import RunnerBroken, StderrTail, decode_reply, encode_request

STDIN, STDOUT, STDERR, STATUS = 0, 1, 2, 3
V5_PROTOCOL = "v5.channel.k8s.io"
FRAME_BYTES = 256 * 1024
MAX_REPLY_BYTES = 512 * 1024**2
STDERR_TAIL_BYTES = 16 * 1024
POLL_SLICE_S = 0.5


class StreamBroken(Exception):
    """The exec stream to the runner is gone (transport failure or the runner exited)."""


class ExecStream:
    """One exec's WebSocket: stdin frames out; stdout, stderr and the exit Status in.

    Frames are read straight off the client's socket with short timeouts (a partial frame is
    kept and resumed), so a reply of any size is assembled in one buffer and a reader can notice
    `close()` from another thread.
    """

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.sock = ws.sock
        self.v5 = getattr(ws, "subprotocol", None) == V5_PROTOCOL
        self.out = bytearray()
        self.err = StderrTail(STDERR_TAIL_BYTES)
        self.status: dict[str, Any] | None = None
        self._scan = 0
        self._gone: str | None = None

    def send(self, data: bytes) -> None:
        if self._gone is not None:
            raise StreamBroken(self._gone)
        try:
            for start in range(0, len(data), FRAME_BYTES):
                self.ws.write_channel(STDIN, data[start : start + FRAME_BYTES])
        except Exception as exc:
            self._gone = f"writing to the exec stream failed: {describe_api_error(exc)}"
            raise StreamBroken(self._gone) from None

    def close_stdin(self) -> None:
        """End of input (v5 only; over v4 the extractor stops at the tar's end marker)."""
        if self.v5 and self._gone is None:
            with contextlib.suppress(Exception):
                self.ws.close_channel(STDIN)

    def read_line(self, deadline: float, cancelled: Callable[[], bool]) -> bytes | None:
        """The next stdout line; None at the deadline; StreamBroken when the stream ends."""
        while True:
            index = self.out.find(b"\n", self._scan)
            if index >= 0:
                line = bytes(self.out[:index])
                del self.out[: index + 1]
                self._scan = 0
                return line
            self._scan = len(self.out)
            if len(self.out) > MAX_REPLY_BYTES:
                raise StreamBroken(f"the runner sent a reply line longer than {MAX_REPLY_BYTES} bytes")
            if self.status is not None:
                raise StreamBroken(f"the runner exited ({status_text(self.status)})")
            if cancelled():
                raise SandboxError("the sandbox is closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._pump(min(remaining, POLL_SLICE_S))

    def wait_exit(self, deadline: float) -> int:
        """Read until the exit Status arrives; returns the exit code."""
        while self.status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StreamBroken("the command did not finish in time")
            self._pump(min(remaining, POLL_SLICE_S))
        return exit_code(self.status)

    def pump(self, timeout: float | None) -> None:
        """Take one frame off the socket, or return after `timeout` (None: block until one comes,
        so that sends from other threads never run under a short socket timeout)."""
        self._pump(timeout)

    def _pump(self, timeout: float | None) -> None:
        """Take one frame off the socket, or return after `timeout`."""
        if self._gone is not None:
            raise StreamBroken(self._gone)
        try:
            self.sock.settimeout(None if timeout is None else max(timeout, 0.001))
            opcode, frame = self.sock.recv_data_frame(True)
        except WebSocketTimeoutException:
            return
        except Exception as exc:
            self._gone = f"the exec stream broke: {describe_api_error(exc)}"
            raise StreamBroken(self._gone) from None
        if opcode == ABNF.OPCODE_CLOSE:
            self._gone = "the API server closed the exec stream"
            if self.status is not None:
                return
            raise StreamBroken(self._gone)
        if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT):
            return
        data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode("utf-8")
        if not data:
            return
        channel, payload = data[0], data[1:]
        if channel == STDOUT:
            self.out += payload
        elif channel == STDERR:
            self.err.add(payload)
        elif channel == STATUS and payload:
            try:
                status = json.loads(payload)
            except ValueError:
                status = {"status": "Failure", "message": payload.decode("utf-8", "replace")}
            self.status = status if isinstance(status, dict) else {"status": "Failure", "message": str(status)}

    def abort(self) -> None:
        """Cut the connection from any thread; a blocked reader wakes up with StreamBroken."""
        self._gone = self._gone or "the exec stream was closed"
        raw = getattr(self.sock, "sock", None)
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._gone = self._gone or "the exec stream was closed"
        with contextlib.suppress(Exception):
            self.ws.close(timeout=1)


class ExecReader:
    """A file-like source over an exec's stdout for tarfile's stream mode: reads until the
    command's exit Status, then gives EOF; StreamBroken past `deadline` or when cancelled."""

    def __init__(self, stream: ExecStream, deadline: float, cancelled: Callable[[], bool]) -> None:
        self.stream = stream
        self.deadline = deadline
        self.cancelled = cancelled

    def read(self, size: int = -1) -> bytes:
        out = self.stream.out
        while (size < 0 or len(out) < size) and self.stream.status is None:
            if self.cancelled():
                raise StreamBroken("the sandbox is closed")
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise StreamBroken("the copy did not finish in time")
            self.stream.pump(min(remaining, POLL_SLICE_S))
        take = len(out) if size < 0 else min(size, len(out))
        data = bytes(out[:take])
        del out[:take]
        return data


class StdinWriter:
    """A file-like sink for tarfile that sends big stdin frames (tarfile writes 10 KiB records)."""

    def __init__(self, stream: ExecStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    def write(self, data: bytes) -> int:
        self.buffer += data
        if len(self.buffer) >= FRAME_BYTES:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self.buffer:
            data, self.buffer = bytes(self.buffer), bytearray()
            self.stream.send(data)


class StreamChannel:
    """The runner channel over the pod's current exec stream, without recovery: a broken stream
    raises StreamBroken for the caller (the recovering channel) to handle."""

    def __init__(
        self,
        current: Callable[[], ExecStream | None],
        cancelled: Callable[[], bool],
        *,
        wall_deadline: float,
        reply_grace_s: float,
        wall_message: str,
    ) -> None:
        self._current = current
        self._cancelled = cancelled
        self._wall_deadline = wall_deadline
        self._reply_grace_s = reply_grace_s
        self._wall_message = wall_message

    def exchange(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request line out, one reply line in, on the current stream."""
        stream = self._current()
        if stream is None:
            raise StreamBroken("no runner stream")
        stream.send(encode_request(request))
        limit = min(time.monotonic() + timeout, self._wall_deadline + self._reply_grace_s)
        raw = stream.read_line(limit, self._cancelled)
        if raw is None:
            if time.monotonic() >= self._wall_deadline:
                raise RunnerBroken(self._wall_message)
            raise RunnerBroken(f"the sandbox runner did not answer within {timeout:.0f}s")
        return decode_reply(raw, request["id"])


def exit_code(status: Mapping[str, Any]) -> int:
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(cause.get("message"))
    return -1


def status_text(status: Mapping[str, Any]) -> str:
    if status.get("status") == "Success":
        return "exit code 0"
    return str(status.get("message") or status.get("reason") or "failed")


def describe_api_error(exc: BaseException) -> str:
    """An API error without its response headers and body noise."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None and reason is not None:
        body = getattr(exc, "body", None)
        message = ""
        if body:
            with contextlib.suppress(ValueError, TypeError):
                message = json.loads(body).get("message", "")
        return f"{status} {reason}{': ' + message if message else ''}"
    return f"{type(exc).__name__}: {exc}"
