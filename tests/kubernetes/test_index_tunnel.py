"""The worker's end of a setup pod's index tunnel, against a pod end that is scripted (and hostile).

The fake stream stands for the exec WebSocket (`ExecStream`'s few members the tunnel uses); the
relay is a real unix socket server. Both ends' frames are sandbox/index_pump.py's.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

from sandbox import index_pump as frames
from sandbox.kubernetes_stream import StreamBroken
from sandbox.kubernetes_tunnel import IndexTunnel


class ScriptedPod:
    """Frames the pod sends go into `out`; frames the worker sends are parsed into `received`."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.status: dict[str, str] | None = None
        self.received: list[tuple[int, int, bytes]] = []
        self._sent = bytearray()
        self._lock = threading.Condition()
        self._aborted = False

    class _Err:
        @staticmethod
        def text() -> str:
            return ""

    err = _Err()

    def feed(self, conn: int, kind: int, payload: bytes = b"") -> None:
        with self._lock:
            self.out += frames.frame(conn, kind, payload)
            self._lock.notify_all()

    def pump(self, timeout: float | None) -> None:
        with self._lock:
            if self._aborted:
                raise StreamBroken("aborted")
            self._lock.wait(0.05)

    def send(self, data: bytes) -> None:
        with self._lock:
            self._sent += data
            while (item := frames.parse(self._sent)) is not None:
                self.received.append(item)
            self._lock.notify_all()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            self._lock.notify_all()

    def close(self) -> None:
        self.abort()

    def wait_for(self, predicate, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        with self._lock:
            while not predicate(self.received):
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"not seen in time: {self.received}"
                self._lock.wait(remaining)


def relay(path: Path, answer: bytes | None) -> socket.socket:
    """A unix socket server: each connection reads a request, then answers `answer` and closes (or holds)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.recv(65536)
            if answer is None:
                held.append(conn)  # never answers: the pod's connection stays open
                continue
            conn.sendall(answer)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_a_request_goes_through_and_its_answer_comes_back_with_eof(tmp_path: Path) -> None:
    server = relay(tmp_path / "index.sock", b"HTTP/1.0 200 OK\r\n\r\nsimple")
    pod = ScriptedPod()
    tunnel = IndexTunnel(pod, str(tmp_path / "index.sock"))  # type: ignore[arg-type]
    try:
        pod.feed(0, frames.READY)
        tunnel.wait_ready(30)
        pod.feed(7, frames.OPEN)
        pod.feed(7, frames.DATA, b"GET /simple/ HTTP/1.0\r\n\r\n")
        pod.wait_for(lambda got: (7, frames.EOF, b"") in got)
        body = b"".join(payload for conn, kind, payload in pod.received if conn == 7 and kind == frames.DATA)
        assert body == b"HTTP/1.0 200 OK\r\n\r\nsimple"
        assert tunnel.connections == 1
    finally:
        tunnel.close()
        server.close()


def test_a_pod_that_opens_more_than_it_may_hold_is_refused_and_garbage_ends_the_tunnel(tmp_path: Path) -> None:
    server = relay(tmp_path / "index.sock", None)
    pod = ScriptedPod()
    tunnel = IndexTunnel(pod, str(tmp_path / "index.sock"), max_connections=2)  # type: ignore[arg-type]
    try:
        for conn in (1, 2, 3):
            pod.feed(conn, frames.OPEN)
            pod.feed(conn, frames.DATA, b"GET / HTTP/1.0\r\n\r\n")
        pod.wait_for(lambda got: (3, frames.CLOSE, b"") in got)
        assert tunnel.connections == 2
        pod.feed(1, frames.CLOSE)  # its slot is free once the copy of its answer has ended
        deadline = time.monotonic() + 30
        while tunnel.active > 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tunnel.active == 1
        pod.feed(4, frames.OPEN)
        deadline = time.monotonic() + 30
        while tunnel.connections < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tunnel.connections == 3 and (4, frames.CLOSE, b"") not in pod.received
        with pod._lock:
            pod.out += b"\xff" * 16  # not a frame
            pod._lock.notify_all()
        assert tunnel.ended.wait(30) and "not a tunnel frame" in tunnel.error
    finally:
        tunnel.close()
        server.close()
    assert not tunnel._thread.is_alive()
