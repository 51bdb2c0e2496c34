"""Runs inside a setup sandbox (stdlib only): 127.0.0.1:PORT -> the package index relay's unix socket.

The setup sandbox has its own empty network namespace, so pip and uv can reach nothing. The
worker binds one unix socket into it (worker/environment/relay.py), which forwards to the
company's mirror and nothing else. Package tools speak TCP, so this pump gives them a loopback
address and copies bytes both ways; it adds nothing and knows no credentials.

Usage: python3 -I -S index_pump.py PORT SOCKET_PATH READY_FILE
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading


def _copy(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            chunk = source.recv(65536)
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


def main() -> None:
    port, path, ready = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    with open(ready, "w") as marker:  # the build script waits for this before it installs anything
        marker.write("ready\n")
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve, args=(client, path), daemon=True).start()


if __name__ == "__main__":
    main()
