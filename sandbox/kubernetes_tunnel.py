"""The worker's end of a setup pod's index tunnel: frames on an exec stream <-> the relay's unix socket.

Why a tunnel and not an egress rule: the setup pod stays under the same deny-all NetworkPolicy
as every sandbox pod, so it reaches nothing at all, whatever the cluster's network plugin
enforces and wherever the mirror lives. Its package traffic goes through the API server's exec
stream (like the workspace copy) to the worker, which opens the relay (worker/environment/
relay.py: GET and HEAD to the mirror's origin, credentials added there). The pod's end is
`sandbox/index_pump.py --tunnel`; the frame format is that module's, used here unchanged.

The pod's end is untrusted (the build runs the repository's code as the same uid), so
everything it sends is bounded: a malformed frame ends the tunnel, and a connection beyond
`max_connections` answers still being sent (a pod that stops reading holds them) is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time

from sandbox import index_pump as frames
from sandbox.kubernetes_stream import ExecStream, StreamBroken

log = logging.getLogger(__name__)


class IndexTunnel:
    """Serves one exec stream's tunnel until the stream ends or `close()`."""

    def __init__(self, stream: ExecStream, socket_path: str, *, max_connections: int = 64) -> None:
        self.stream = stream
        self.socket_path = socket_path
        # A unix socket's path has at most 107 bytes; its folder, reached through a descriptor, has any length.
        self._folder = os.open(os.path.dirname(socket_path) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._address = f"/proc/self/fd/{self._folder}/{os.path.basename(socket_path)}"
        self.max_connections = max_connections
        self.ready = threading.Event()
        self.ended = threading.Event()
        self.error = ""
        self.connections = 0  # opened over the tunnel's life (tests and logs)
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._upstream: dict[int, socket.socket] = {}
        self._copying = 0  # threads still sending a relay's answer: the bound on what the pod can hold open
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="index-tunnel", daemon=True)
        self._thread.start()

    @property
    def active(self) -> int:
        """Connections whose answer is still being copied back (what `max_connections` bounds)."""
        with self._lock:
            return self._copying

    def wait_ready(self, timeout: float) -> None:
        """Until the pod's end listens; raises StreamBroken if it never does."""
        deadline = time.monotonic() + timeout
        while not self.ready.wait(min(0.1, max(deadline - time.monotonic(), 0.001))):
            if self.ended.is_set() or time.monotonic() >= deadline:
                detail = self.error or self.stream.err.text() or "no answer"
                raise StreamBroken(f"the setup pod's index tunnel did not start: {detail}")

    def close(self) -> None:
        self._closed = True
        self.stream.abort()
        self._thread.join(timeout=5)
        self.stream.close()
        self._drop_all()
        if not self._thread.is_alive():  # a reader still running could yet connect through the descriptor
            with contextlib.suppress(OSError):
                os.close(self._folder)

    # ------------------------------------------------------------------------- internals

    def _run(self) -> None:
        buffer = self.stream.out
        try:
            while not self._closed:
                while not self._closed and (item := frames.parse(buffer)) is not None:
                    self._dispatch(*item)
                if self.stream.status is not None:
                    self.error = "the pod's end of the tunnel exited"
                    return
                self.stream.pump(None)  # close() aborts the socket to wake it
        except (StreamBroken, ValueError) as exc:
            if not self._closed:
                self.error = str(exc)
                log.warning("setup sandbox: index tunnel ended: %s", exc)
        finally:
            self.ended.set()
            self._drop_all()

    def _send(self, conn: int, kind: int, payload: bytes = b"") -> None:
        with self._send_lock:
            self.stream.send(frames.frame(conn, kind, payload))

    def _dispatch(self, conn: int, kind: int, payload: bytes) -> None:
        if kind == frames.READY:
            self.ready.set()
            return
        if kind == frames.OPEN:
            self._open(conn)
            return
        with self._lock:
            upstream = self._upstream.get(conn)
        if upstream is None:
            return
        if kind == frames.DATA:
            try:
                upstream.sendall(payload)
            except OSError:
                self._drop(conn, tell=True)
        elif kind == frames.EOF:
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_WR)
        elif kind == frames.CLOSE:
            self._drop(conn, tell=False)

    def _open(self, conn: int) -> None:
        with self._lock:
            full = self._copying >= self.max_connections or conn in self._upstream
        if full or self._closed:
            self._send(conn, frames.CLOSE)
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(self._address)
        except OSError as exc:
            upstream.close()
            log.warning("setup sandbox: the index relay refused a connection: %s", exc)
            self._send(conn, frames.CLOSE)
            return
        with self._lock:
            self._upstream[conn] = upstream
            self.connections += 1
            self._copying += 1
        threading.Thread(target=self._copy_back, args=(conn, upstream), daemon=True).start()

    def _copy_back(self, conn: int, upstream: socket.socket) -> None:
        """The relay's answer, as DATA frames, then EOF."""
        try:
            while True:
                chunk = upstream.recv(frames.CHUNK)
                if not chunk:
                    break
                self._send(conn, frames.DATA, chunk)
            self._send(conn, frames.EOF)
        except (OSError, StreamBroken):
            pass
        finally:
            with self._lock:
                if self._upstream.get(conn) is upstream:
                    del self._upstream[conn]
                self._copying -= 1
            upstream.close()

    def _drop(self, conn: int, *, tell: bool) -> None:
        with self._lock:
            upstream = self._upstream.pop(conn, None)
        if upstream is not None:
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_RDWR)
            upstream.close()
        if tell:
            with contextlib.suppress(StreamBroken):
                self._send(conn, frames.CLOSE)

    def _drop_all(self) -> None:
        with self._lock:
            conns = list(self._upstream)
        for conn in conns:
            self._drop(conn, tell=False)
