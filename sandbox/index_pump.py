"""Runs inside a setup sandbox (stdlib only): 127.0.0.1:PORT -> the package index relay.

The setup sandbox has no network (locally its own empty network namespace; on Kubernetes a pod
under a deny-all NetworkPolicy), so pip and uv can reach nothing. The worker's relay
(worker/environment/relay.py) forwards to the company's mirror and nothing else. Package tools
speak TCP, so this pump gives them a loopback address and copies bytes; it adds nothing and
knows no credentials. Two ways to reach the relay:

- `PORT SOCKET_PATH READY_FILE` (local): the relay's unix socket is bound into the sandbox;
  each accepted connection gets its own connection to it.
- `--tunnel PORT READY_FILE` (Kubernetes): every connection is multiplexed over this process's
  stdin and stdout, which are an exec stream to the worker (sandbox/kubernetes_tunnel.py opens
  the relay's socket there). Frames are `Frame` below, the same module on both ends.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import threading
from typing import BinaryIO

# One frame: connection id (u32), kind (u8), payload length (u32), payload.
HEADER = struct.Struct(">IBI")
READY, OPEN, DATA, EOF, CLOSE = 0, 1, 2, 3, 4  # EOF: the sender's direction ended; CLOSE: drop it
MAX_PAYLOAD = 256 * 1024
CHUNK = 64 * 1024


def frame(conn: int, kind: int, payload: bytes = b"") -> bytes:
    if len(payload) > MAX_PAYLOAD:
        raise ValueError("frame payload too large")
    return HEADER.pack(conn, kind, len(payload)) + payload


def parse(buffer: bytearray) -> tuple[int, int, bytes] | None:
    """Take one whole frame off the front of `buffer` (None until one is complete)."""
    if len(buffer) < HEADER.size:
        return None
    conn, kind, length = HEADER.unpack_from(buffer)
    if length > MAX_PAYLOAD or kind > CLOSE:
        raise ValueError(f"not a tunnel frame (kind {kind}, length {length})")
    end = HEADER.size + length
    if len(buffer) < end:
        return None
    payload = bytes(buffer[HEADER.size : end])
    del buffer[:end]
    return conn, kind, payload


def _copy(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            chunk = source.recv(CHUNK)
            if not chunk:
                break
            sink.sendall(chunk)
    except OSError:
        pass
    finally:
        for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
            with contextlib.suppress(OSError):
                sock.shutdown(how)


def _serve(client: socket.socket, path: str) -> None:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        upstream.close()
        return
    back = threading.Thread(target=_copy, args=(upstream, client), daemon=True)
    back.start()
    _copy(client, upstream)
    back.join()
    client.close()
    upstream.close()


def _listen(port: int, ready: str) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    with open(ready, "w") as marker:  # the build script waits for this before it installs anything
        marker.write("ready\n")
    return listener


class _Tunnel:
    """The sandbox's end of the multiplexed tunnel: local connections <-> frames on stdio."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.out_lock = threading.Lock()
        self.lock = threading.Lock()
        self.conns: dict[int, socket.socket] = {}
        self.halves: dict[int, int] = {}  # directions still open; closed at 0
        self.next_id = 1

    def send(self, conn: int, kind: int, payload: bytes = b"") -> None:
        with self.out_lock:
            self.out.write(frame(conn, kind, payload))
            self.out.flush()

    def accept(self, listener: socket.socket) -> None:
        while True:
            client, _ = listener.accept()
            with self.lock:
                conn, self.next_id = self.next_id, self.next_id + 1
                self.conns[conn], self.halves[conn] = client, 2
            self.send(conn, OPEN)
            threading.Thread(target=self._read, args=(conn, client), daemon=True).start()

    def _read(self, conn: int, client: socket.socket) -> None:
        try:
            while True:
                chunk = client.recv(CHUNK)
                if not chunk:
                    break
                self.send(conn, DATA, chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError, ValueError):
            self.send(conn, EOF)
        self._half_done(conn)

    def _half_done(self, conn: int) -> None:
        with self.lock:
            self.halves[conn] = self.halves.get(conn, 1) - 1
            if self.halves[conn] > 0:
                return
            client = self.conns.pop(conn, None)
            self.halves.pop(conn, None)
        if client is not None:
            client.close()

    def dispatch(self, conn: int, kind: int, payload: bytes) -> None:
        with self.lock:
            client = self.conns.get(conn)
        if client is None:
            return
        if kind == DATA:
            try:
                client.sendall(payload)
            except OSError:
                self.dispatch(conn, CLOSE, b"")
        elif kind == EOF:
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_WR)
            self._half_done(conn)
        elif kind == CLOSE:
            with self.lock:
                self.conns.pop(conn, None)
                self.halves.pop(conn, None)
            with contextlib.suppress(OSError):
                client.shutdown(socket.SHUT_RDWR)
            client.close()


def tunnel(port: int, ready: str, stdin: BinaryIO, stdout: BinaryIO) -> None:
    """Serve 127.0.0.1:`port` over frames on stdin/stdout until stdin ends."""
    ends = _Tunnel(stdout)
    listener = _listen(port, ready)
    ends.send(0, READY)
    threading.Thread(target=ends.accept, args=(listener,), daemon=True).start()
    buffer = bytearray()
    while True:
        chunk = stdin.read1(CHUNK) if hasattr(stdin, "read1") else stdin.read(CHUNK)
        if not chunk:
            return
        buffer += chunk
        while (item := parse(buffer)) is not None:
            ends.dispatch(*item)


def main() -> None:
    if sys.argv[1] == "--tunnel":
        port, ready = int(sys.argv[2]), sys.argv[3]
        try:
            tunnel(port, ready, sys.stdin.buffer, sys.stdout.buffer)
        finally:
            sys.stdout.flush()
        return
    port, path, ready = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    listener = _listen(port, ready)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve, args=(client, path), daemon=True).start()


if __name__ == "__main__":
    main()
