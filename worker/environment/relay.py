"""The one way out of a setup sandbox: an HTTP relay on a unix socket to the company's mirror.

The sandbox keeps its own empty network namespace; this relay's socket is bound into it, and a
pump inside (sandbox/index_pump.py) maps a loopback port to it. The relay:
- answers GET and HEAD only, and only for paths on the mirror's own origin (scheme, host,
  port of FROGFIX_PIP_INDEX_URL): a request can name no other host;
- adds the mirror's credentials itself, so they never enter the sandbox; what the sandbox sees
  is `http://127.0.0.1:PORT/<the index path>`;
- follows no redirect: a redirect within the mirror's origin is handed back rewritten to the
  sandbox's address, one elsewhere is refused (502);
- rewrites the mirror's absolute links in index pages (HTML, PEP 691 JSON) to the sandbox's
  address, so mirrors that write absolute file URLs (Nexus, Artifactory) work too.
"""

from __future__ import annotations

import contextlib
import os
import socketserver
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

import httpx

FORWARDED_REQUEST_HEADERS = ("accept", "range", "if-none-match", "if-modified-since", "cache-control", "user-agent")
FORWARDED_RESPONSE_HEADERS = (
    "content-type", "content-range", "accept-ranges", "etag", "last-modified", "cache-control", "date",
)
INDEX_TYPES = ("text/html", "application/vnd.pypi.simple", "application/json")
MAX_INDEX_PAGE_BYTES = 64 * 1024**2  # an index page is read whole to rewrite its links
CHUNK = 256 * 1024


class MirrorURL:
    """FROGFIX_PIP_INDEX_URL taken apart: the origin, the index path, and the credentials kept apart."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("FROGFIX_PIP_INDEX_URL must be an http:// or https:// URL of a PEP 503 simple index")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.path = parts.path if parts.path.endswith("/") else parts.path + "/"
        self.username = unquote(parts.username or "")
        self.password = unquote(parts.password or "")
        netloc = self.host if ":" not in self.host else f"[{self.host}]"
        self.origin = f"{self.scheme}://{netloc}:{self.port}"
        # How the mirror may write its own absolute links: with and without the default port.
        plain = f"{self.scheme}://{netloc}"
        self.spellings = [self.origin, plain] if parts.port in (None, 443, 80) else [self.origin]
        if parts.port is not None and f"{plain}:{parts.port}" not in self.spellings:
            self.spellings.insert(0, f"{plain}:{parts.port}")

    def shown(self) -> str:
        """The URL as logs, doctor and the job page may show it: never the password."""
        user = f"{self.username}:***@" if self.password else (f"{self.username}@" if self.username else "")
        netloc = self.host if ":" not in self.host else f"[{self.host}]"
        return SplitResult(self.scheme, f"{user}{netloc}:{self.port}", self.path, "", "").geturl()

    def without_credentials(self) -> str:
        return f"{self.origin}{self.path}"

    def auth(self) -> httpx.BasicAuth | None:
        return httpx.BasicAuth(self.username, self.password) if self.username or self.password else None

    def secrets(self) -> list[str]:
        """What a redactor must never let through: the password (and the URL that carries it)."""
        return [s for s in (self.password,) if len(s) >= 4]


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True
    relay: IndexRelay


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    timeout = 120  # an idle sandbox connection is dropped

    def log_message(self, format: str, *args: Any) -> None:
        return  # paths are counted, never logged with anything of the mirror's

    def address_string(self) -> str:
        return "sandbox"

    def do_GET(self) -> None:
        self.server.relay.forward(self, body=True)

    def do_HEAD(self) -> None:
        self.server.relay.forward(self, body=False)

    def _refuse(self) -> None:
        self.server.relay.answer(self, 405, b"FrogFix's mirror relay answers GET and HEAD only\n")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_CONNECT = _refuse


class IndexRelay:
    """Serves the mirror on a unix socket for one setup sandbox; `close()` stops it."""

    def __init__(self, mirror: MirrorURL, socket_path: Path, *, timeout: float = 60.0) -> None:
        self.mirror = mirror
        self.socket_path = socket_path
        self.inside_origin = ""  # set by the builder: http://127.0.0.1:PORT
        self.requests = 0
        self.refused = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._client = httpx.Client(
            auth=mirror.auth(), timeout=httpx.Timeout(timeout), follow_redirects=False, trust_env=True
        )
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()
        # A unix socket's path has at most 107 bytes; the folder, reached through its descriptor, has any length.
        folder = os.open(socket_path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self._server = _Server(f"/proc/self/fd/{folder}/{socket_path.name}", _Handler)
        finally:
            os.close(folder)
        self._server.relay = self
        os.chmod(socket_path, 0o666)  # the sandbox's uid connects; the folder above decides who reaches it
        self._thread = threading.Thread(target=self._server.serve_forever, name="frogfix-index-relay", daemon=True)
        self._thread.start()

    def inside_index_url(self) -> str:
        return f"{self.inside_origin}{self.mirror.path}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._client.close()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def __enter__(self) -> IndexRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- per request ----------------------------------------------------------------------------

    def answer(self, handler: BaseHTTPRequestHandler, status: int, text: bytes, head: bool = False) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("Content-Length", str(len(text)))
        handler.end_headers()
        if not head:
            handler.wfile.write(text)

    def _note(self, refused: bool = False, error: str | None = None) -> None:
        with self._lock:
            self.requests += 1
            self.refused += refused
            if error and len(self.errors) < 20:
                self.errors.append(error)

    def forward(self, handler: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = handler.path
        if not path.startswith("/") or path.startswith("//") or any(ord(c) < 33 for c in path):
            self._note(refused=True)
            self.answer(handler, 400, b"FrogFix's mirror relay takes paths on the mirror only\n", not body)
            return
        request = self._client.build_request(
            "GET" if body else "HEAD",
            self.mirror.origin + path,
            headers={
                **{k: v for k, v in handler.headers.items() if k.lower() in FORWARDED_REQUEST_HEADERS},
                "Accept-Encoding": "identity",
            },
        )
        if request.url.host != self.mirror.host or (request.url.port or self.mirror.port) != self.mirror.port:
            self._note(refused=True)
            self.answer(handler, 400, b"FrogFix's mirror relay takes paths on the mirror only\n", not body)
            return
        try:
            response = self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            why = f"the package mirror did not answer: {type(exc).__name__}"
            self._note(error=why)
            self.answer(handler, 502, why.encode() + b"\n", not body)
            return
        try:
            self._relay_response(handler, response, body)
        except (OSError, httpx.HTTPError) as exc:  # the sandbox hung up, or the mirror broke off mid-body
            self._note(error=f"transfer broke off: {type(exc).__name__}")
            handler.close_connection = True
        finally:
            response.close()

    def _relay_response(self, handler: BaseHTTPRequestHandler, response: httpx.Response, body: bool) -> None:
        headers = {k: v for k, v in response.headers.items() if k.lower() in FORWARDED_RESPONSE_HEADERS}
        if response.is_redirect:
            location = response.headers.get("location", "")
            local = self._local(str(response.url.join(location)))
            if local is None:  # the mirror does not serve it (pypiserver sends misses to pypi.org): not found
                self._note(refused=True, error=f"the mirror sent {handler.path[:200]} elsewhere; not followed")
                self.answer(handler, 404, b"not on the package mirror (it redirected elsewhere)\n", not body)
                return
            headers["Location"] = local
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        self._note()
        if body and kind.startswith(INDEX_TYPES) and response.status_code == 200:
            data = b""
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > MAX_INDEX_PAGE_BYTES:
                    self.answer(handler, 502, b"the package mirror's index page is too large\n")
                    return
            data = self._rewrite(data)
            handler.send_response(response.status_code)
            for key, value in headers.items():
                handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
            return
        handler.send_response(response.status_code)
        for key, value in headers.items():
            handler.send_header(key, value)
        length = response.headers.get("content-length")
        if length is not None and length.isdigit():
            handler.send_header("Content-Length", length)
        else:
            handler.send_header("Connection", "close")
            handler.close_connection = True
        handler.end_headers()
        if body:
            for chunk in response.iter_raw(CHUNK):
                handler.wfile.write(chunk)

    def _local(self, url: str) -> str | None:
        """A URL on the mirror's origin as the sandbox reaches it; None for any other origin."""
        for spelling in self.mirror.spellings:
            if url == spelling or url.startswith(spelling + "/"):
                return self.inside_origin + url[len(spelling) :]
        return None

    def _rewrite(self, data: bytes) -> bytes:
        for spelling in self.mirror.spellings:
            data = data.replace(spelling.encode() + b"/", self.inside_origin.encode() + b"/")
        return data
