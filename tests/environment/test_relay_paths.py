"""The index relay serves the index and the files its pages linked, and nothing else on the mirror.

A real HTTP server on 127.0.0.1 stands in for the mirror (Basic auth, an index, files, and an
`/admin/secret` canary the mirror's credentials would reach); the sandbox's side is raw HTTP/1.1
bytes on the relay's unix socket, so traversal targets reach the relay exactly as written.
"""

from __future__ import annotations

import base64
import json
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from worker.environment import relay as relay_module
from worker.environment.relay import IndexRelay, MirrorURL, malformed

CANARY = "CANARY-SECRET"
AUTH = "Basic " + base64.b64encode(b"u:p").decode()
WHEEL = "demo-1.0-py3-none-any.whl"


class FakeMirror(ThreadingHTTPServer):
    """The mirror: records each request line's target and its Authorization header."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _MirrorHandler)
        self.port = self.server_address[1]
        self.seen: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def targets(self) -> list[str]:
        with self.lock:
            return [target for target, _ in self.seen]


class _MirrorHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FakeMirror

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        target = self.requestline.split()[1]
        with self.server.lock:
            self.server.seen.append((target, self.headers.get("Authorization", "")))
        if self.headers.get("Authorization") != AUTH:
            return self._send(401, b"who are you\n")
        origin = f"http://127.0.0.1:{self.server.port}"
        pages = {
            "/simple/": ("text/html", b'<a href="demo/">demo</a> <a href="json/">json</a> <a href="/packages/r.whl">'),
            "/simple/demo/": ("text/html", (
                f'<a href="../../packages/{WHEEL}#sha256=00ff">{WHEEL}</a>\n'
                f'<a href="{origin}/packages/demo-1.0.tar.gz#sha256=11ee">demo-1.0.tar.gz</a>\n'
                '<a href="/root/pypi/+f/ab/demo-1.0.zip">demo-1.0.zip</a>\n'
                '<a href="/packages/moving-1.0.whl">moving-1.0.whl</a>\n'
                '<a href="http://elsewhere.example/packages/far-1.0.whl">far</a>\n'
            ).encode()),
            "/simple/json/": ("application/vnd.pypi.simple.v1+json", json.dumps({"files": [
                {"filename": "j-1.0.whl", "url": "../../files/j-1.0.whl#sha256=22dd"},
                {"filename": "j-1.0.tar.gz", "url": f"{origin}/files/j-1.0.tar.gz"},
            ]}).encode()),
            "/simple/many/": ("text/html", b"".join(
                f'<a href="/packages/many-{n}.whl">x</a>'.encode() for n in range(3)
            )),
            "/admin/secret": ("text/plain", CANARY.encode()),
            # an npm registry under /npm/: a scoped package's abbreviated document, its tarball URL absolute
            "/npm/@company%2fleft": ("application/vnd.npm.install-v1+json", json.dumps({
                "name": "@company/left", "versions": {"1.0.0": {"dist": {
                    "tarball": f"{origin}/npm/@company/left/-/left-1.0.0.tgz", "integrity": "sha512-x"}}},
            }).encode()),
        }
        moves = {"/simple/moved": "/simple/moved/", "/simple/escape/": "/admin/secret",
                 "/packages/moving-1.0.whl": f"{origin}/storage/moving-1.0.whl"}
        if target in moves:
            return self._send(302, b"", {"Location": moves[target]})
        if target in pages:
            kind, body = pages[target]
            return self._send(200, body, {"Content-Type": kind})
        if target.startswith(("/packages/", "/files/", "/root/pypi/", "/storage/", "/npm/")):
            return self._send(200, f"FILE {target}".encode(), {"Content-Type": "application/octet-stream"})
        return self._send(404, b"not here\n")

    def _send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


@pytest.fixture
def mirror() -> Iterator[FakeMirror]:
    server = FakeMirror()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
    assert all(auth == AUTH for _, auth in server.seen)  # the relay added the credentials to every request
    assert "/admin/secret" not in server.targets()


@pytest.fixture
def folder() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="relay-"))  # short: a unix socket's path has 107 bytes at most
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def open_relay(mirror: FakeMirror, folder: Path, name: str = "relay.sock") -> IndexRelay:
    relay = IndexRelay(MirrorURL(f"http://u:p@127.0.0.1:{mirror.port}/simple/"), folder / name)
    relay.inside_origin = "http://127.0.0.1:3141"
    return relay


def ask(relay: IndexRelay, target: str, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP/1.1 request on the relay's socket, the target sent byte for byte."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(20)
        sock.connect(str(relay.socket_path))
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode("latin-1"))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:] if ": " in line)
    assert CANARY.encode() not in data
    return int(lines[0].split()[1]), headers, body


def test_the_index_and_the_files_its_pages_link_are_served(mirror: FakeMirror, folder: Path) -> None:
    with open_relay(mirror, folder) as relay:
        assert ask(relay, "/simple/")[0] == 200
        status, _, page = ask(relay, "/simple/demo/")
        assert status == 200 and b"http://127.0.0.1:3141/packages/demo-1.0.tar.gz" in page  # rewritten
        status, _, body = ask(relay, f"/packages/{WHEEL}")  # linked relatively, #sha256= dropped
        assert (status, body) == (200, f"FILE /packages/{WHEEL}".encode())
        assert ask(relay, "/packages/demo-1.0.tar.gz")[2] == b"FILE /packages/demo-1.0.tar.gz"
        assert ask(relay, "/packages/demo-1.0.tar.gz", "HEAD")[0] == 200
        # devpi's files, linked as /root/pypi/+f/..., requested as pip re-quotes them (%2B)
        assert ask(relay, "/root/pypi/%2Bf/ab/demo-1.0.zip")[0] == 200
        assert ask(relay, "/root/pypi/+f/ab/demo-1.0.zip")[0] == 200
        assert ask(relay, "/simple/json/")[0] == 200  # PEP 691 JSON: files[].url, relative and absolute
        assert ask(relay, "/files/j-1.0.whl")[0] == 200 and ask(relay, "/files/j-1.0.tar.gz")[0] == 200
        assert relay.refused == 0 and not relay.errors
    assert f"/packages/{WHEEL}" in mirror.targets() and "/root/pypi/%2Bf/ab/demo-1.0.zip" in mirror.targets()


def test_a_file_no_page_of_this_relay_linked_is_refused(mirror: FakeMirror, folder: Path) -> None:
    with open_relay(mirror, folder) as relay:
        assert ask(relay, f"/packages/{WHEEL}")[0] == 403  # linked, but no page has been relayed yet
        assert ask(relay, "/simple/demo/")[0] == 200 and ask(relay, "/simple/")[0] == 200
        for target in ("/packages/r.whl", "/packages/other-1.0.whl", f"/packages/{WHEEL}x", f"/packages/{WHEEL}?x=1",
                       "/root/pypi/%252Bf/ab/demo-1.0.zip", "/packages/far-1.0.whl", "/packages/"):
            status, _, body = ask(relay, target)
            assert status in (400, 403) and b"refused" in body, target
        assert relay.refused == 8 and any("/packages/other-1.0.whl" in error for error in relay.errors)
    assert set(mirror.targets()) == {"/simple/demo/", "/simple/"}  # the root page lists projects, not files


TRAVERSALS = [
    "/admin/secret", "/simple/../admin/secret", "/simple/%2e%2e/admin/secret", "/simple/%2E%2E/admin/secret",
    "/simple/.%2e/admin/secret", "/simple/%252e%252e/admin/secret", "/simple/%25252e%25252e/admin/secret",
    "/simple/..%2fadmin/secret", "/simple/%2e%2e%2fadmin%2fsecret", "/simple/%2e%2e%5cadmin/secret",
    "/simple/..\\admin/secret", "/simple\\..\\admin\\secret", "//127.0.0.1:{port}/admin/secret",
    "http://127.0.0.1:{port}/admin/secret", "/simple/./../admin/secret", "/simple/./demo/",
    "/simple/demo/?x=../../admin", "/simple/demo/#frag", "/simple/..;/admin/secret", "/simple/%2e%2e;/admin/secret",
    "/simple//admin/secret",
    "/simple/%00/", "/simple/\x7f/", "/simple/%0a/", "/simple/%zz/", "/simple/%c0%ae%c0%ae/admin/secret",
    "simple/demo/", "*", "/simple/...", "/simple/demo/%3fx",
]


def test_paths_outside_the_index_or_ambiguous_are_refused_before_the_mirror_sees_them(
    mirror: FakeMirror, folder: Path
) -> None:
    with open_relay(mirror, folder) as relay:
        for target in TRAVERSALS:
            status, _, body = ask(relay, target.format(port=mirror.port))
            assert status in (400, 403) and body.startswith(b"FrogFix's mirror relay refused"), (target, status)
        assert ask(relay, "/simple/", "POST")[0] == 405
        assert relay.refused == len(TRAVERSALS) + 1
        assert any("/simple/%2e%2e/admin/secret" in error for error in relay.errors)
    assert mirror.targets() == []  # none reached the mirror, not even a refused-there 404


@pytest.mark.parametrize("path", [
    "/simple/", "/simple", "/simple/demo/", "/root/pypi/+simple/demo/", f"/packages/{WHEEL}",
    "/packages/demo-1!1.0+local.tar.gz", "/root/pypi/%2Bf/ab/demo-1.0.zip", "/packages/sub/a_b~c-1.0.whl",
])
def test_the_paths_pip_and_uv_send_are_well_formed(path: str) -> None:
    assert malformed(path) is None


def test_a_file_linked_from_another_relays_page_is_refused(mirror: FakeMirror, folder: Path) -> None:
    with open_relay(mirror, folder, "one.sock") as one:
        assert ask(one, "/simple/demo/")[0] == 200 and ask(one, f"/packages/{WHEEL}")[0] == 200
        with open_relay(mirror, folder, "two.sock") as two:
            assert ask(two, f"/packages/{WHEEL}")[0] == 403 and two.refused == 1
    assert mirror.targets().count(f"/packages/{WHEEL}") == 1


def test_redirects_within_the_mirror_are_checked_like_any_request(mirror: FakeMirror, folder: Path) -> None:
    with open_relay(mirror, folder) as relay:
        status, headers, _ = ask(relay, "/simple/moved")  # pypiserver's trailing-slash redirect
        assert status == 302 and headers["Location"] == "http://127.0.0.1:3141/simple/moved/"
        assert ask(relay, "/simple/demo/")[0] == 200
        status, headers, _ = ask(relay, "/packages/moving-1.0.whl")  # a linked file the mirror moved
        assert status == 302 and headers["Location"] == "http://127.0.0.1:3141/storage/moving-1.0.whl"
        assert ask(relay, "/storage/moving-1.0.whl")[2] == b"FILE /storage/moving-1.0.whl"
        status, headers, _ = ask(relay, "/simple/escape/")  # an index path sent off the index: not recorded
        assert status == 302 and headers["Location"] == "http://127.0.0.1:3141/admin/secret"
        assert ask(relay, "/admin/secret")[0] == 403
        assert relay.refused == 1 and any("/simple/escape/" in error for error in relay.errors)


def test_the_linked_files_kept_are_bounded(
    mirror: FakeMirror, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(relay_module, "MAX_LINKED", 2)
    with open_relay(mirror, folder) as relay:
        assert ask(relay, "/simple/many/")[0] == 200
        assert [ask(relay, f"/packages/many-{n}.whl")[0] for n in range(3)] == [200, 200, 403]
        assert any("2 linked files at most" in error for error in relay.errors)


def test_an_npm_registry_is_relayed_under_its_path_scoped_names_included(mirror: FakeMirror, folder: Path) -> None:
    relay = IndexRelay(MirrorURL(f"http://u:p@127.0.0.1:{mirror.port}/npm/", setting="FROGFIX_NPM_REGISTRY_URL"),
                       folder / "npm.sock", npm=True)
    relay.inside_origin = "http://127.0.0.1:3141"
    with relay:
        status, headers, body = ask(relay, "/npm/@company%2fleft")
        assert status == 200, body
        tarball = json.loads(body)["versions"]["1.0.0"]["dist"]["tarball"]
        assert tarball == "http://127.0.0.1:3141/npm/@company/left/-/left-1.0.0.tgz"  # the sandbox's address
        assert int(headers["Content-Length"]) == len(body)
        assert ask(relay, "/npm/@company/left/-/left-1.0.0.tgz")[0] == 200
        for refused in ("/admin/secret", "/npm/a%2fb", "/npm/@company%2f..", "/npm/@company%2f%2e%2e",
                        "/npm/@Company%2fleft", "/npm/%40company%2fleft", "/npm/../admin/secret"):
            assert ask(relay, refused)[0] in (400, 403), refused
        assert ask(relay, "/npm/@company%2fleft", method="POST")[0] == 405  # audits and publishes go nowhere
    assert "/npm/@company%2fleft" in mirror.targets()


def test_a_pypi_relay_keeps_refusing_an_encoded_slash(mirror: FakeMirror, folder: Path) -> None:
    with open_relay(mirror, folder) as relay:
        assert ask(relay, "/simple/@company%2fleft")[0] == 400
