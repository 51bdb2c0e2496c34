"""The one way out of a setup sandbox: an HTTP relay on a unix socket to the company's mirror.

The sandbox keeps its own empty network namespace; this relay's socket is bound into it, and a
pump inside (sandbox/index_pump.py) maps a loopback port to it. The relay:
- answers GET and HEAD only, and only for paths on the mirror's own origin (scheme, host,
  port of FROGFIX_PIP_INDEX_URL): a request can name no other host;
- adds the mirror's credentials itself, so they never enter the sandbox; what the sandbox sees
  is `http://127.0.0.1:PORT/<the index path>`;
- serves the index and the files it links, nothing else the credentials reach (an admin page,
  another repository). A path is forwarded when it is (a) under the index URL's own path
  (`MirrorURL.path`: `/simple/`, `/root/pypi/+simple/`), or (b) a file that an index page relayed
  by THIS relay linked to: HTML `href`s (`<base href>` honoured, as pip does) or PEP 691
  `files[].url`, relative or absolute in any of `MirrorURL.spellings`, `#sha256=` dropped. Files
  may live outside the index path (devpi `/root/pypi/+f/`, pypiserver `/packages/`), hence (b);
  paths compare percent-decoded once (pip re-quotes `+` as `%2B`); at most MAX_LINKED are kept.
  The index's root page lists projects, not files (PEP 503; ~30 MB on a PyPI mirror): not read.
  Anything else is refused (400 malformed, 403 not served; counted in `refused`, noted in
  `errors`). Nothing ambiguous is normalised, it is refused: the raw request target must be
  `/`-rooted (no absolute-form, no `//`), RFC 3986 path characters less `;` (Tomcat reads `..;`
  as `..`): no `\\`, query, fragment, empty segment, control or stray `%`; no segment,
  percent-decoded until stable (`%252e` -> `%2e` -> `.`), may be dots only or hold
  `/ \\ ; ? # %`, a space, control or non-ASCII byte on the way. The string checked is the one
  sent, byte for byte (checked again on the built request);
- follows no redirect: one within the mirror's origin is handed back rewritten to the sandbox's
  address (the next request is checked like any), one elsewhere is refused (404). A redirect
  for a linked file records its target as linked (the mirror chose that path); one for an index
  path does not (the sandbox chose it, and a mirror echoing it into a redirect must not open
  the origin); pypiserver's `/simple/foo` -> `/simple/foo/` stays in the index anyway;
- rewrites the mirror's absolute links in index pages (HTML, PEP 691 JSON) to the sandbox's
  address, so mirrors that write absolute file URLs (Nexus, Artifactory) work too.
"""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import socketserver
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, unquote, unquote_to_bytes, urljoin, urlsplit

import httpx

FORWARDED_REQUEST_HEADERS = ("accept", "range", "if-none-match", "if-modified-since", "cache-control", "user-agent")
FORWARDED_RESPONSE_HEADERS = (
    "content-type", "content-range", "accept-ranges", "etag", "last-modified", "cache-control", "date",
)
# Pages read whole to rewrite the mirror's absolute links: PEP 503/691 index pages, and npm packuments
# (full JSON, or the abbreviated `application/vnd.npm.install-v1+json`), whose `dist.tarball` URLs are absolute.
INDEX_TYPES = ("text/html", "application/vnd.pypi.simple", "application/json", "application/vnd.npm.install-v1+json")
MAX_INDEX_PAGE_BYTES = 64 * 1024**2  # an index page is read whole to rewrite its links
CHUNK = 256 * 1024
MAX_LINKED = 200_000  # linked file paths one relay remembers (about 30 MB); a build needs far fewer
MAX_DECODES = 8  # percent-decoding rounds; a segment still changing after them is refused

# "/", or non-empty segments of RFC 3986 path characters less ";", an optional trailing "/".
PATH_SYNTAX = re.compile(r"/|(?:/[A-Za-z0-9._~!$&'()*+,=:@%-]+)+/?")
STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
DOTS_SEGMENT = re.compile(r"/\.+(?=/|$)")
DOTS_SEGMENT_WHY = "a '.' or '..' segment or an encoded '/', '\\' or control, possibly percent-encoded"
HREF = re.compile(r"""(?<![\w-])href\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'<>`]+))""", re.IGNORECASE)
BASE_TAG = re.compile(r"<base\b[^>]*>", re.IGNORECASE)


def malformed(path: str) -> str | None:
    """Why `path` is no plain path on the mirror (see the module docstring); None when it is one."""
    if not path.startswith("/") or path.startswith("//"):
        return "not a path on the mirror (absolute-form, // or relative)"
    if not PATH_SYNTAX.fullmatch(path) or STRAY_PERCENT.search(path):
        return "characters no index path has (query, fragment, backslash, ';', '//', a control or stray '%')"
    if "%" not in path:  # the common case, quick: only a dots-only segment is left to refuse
        return DOTS_SEGMENT_WHY if DOTS_SEGMENT.search(path) else None
    if any(_decoded(segment) is None for segment in path.split("/")[1:]):
        return DOTS_SEGMENT_WHY
    return None


def _decoded(segment: str) -> str | None:
    """`segment` percent-decoded until it stops changing; None if any form on the way is unsafe."""
    text = segment
    for _ in range(MAX_DECODES):
        if (text and not text.strip(".")) or any(c in "/\\;?#" or not "!" <= c <= "~" for c in text):
            return None
        raw = unquote_to_bytes(text)
        if not raw.isascii():
            return None
        decoded = raw.decode("ascii")
        if decoded == text:
            return None if "%" in text else text
        text = decoded
    return None


class MirrorURL:
    """FROGFIX_PIP_INDEX_URL taken apart: the origin, the index path, and the credentials kept apart."""

    def __init__(self, url: str, setting: str = "FROGFIX_PIP_INDEX_URL") -> None:
        parts = urlsplit(url.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            what = "a PEP 503 simple index" if setting == "FROGFIX_PIP_INDEX_URL" else "an npm registry"
            raise ValueError(f"{setting} must be an http:// or https:// URL of {what}")
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


@dataclass(frozen=True)
class RelayedInstall:
    """A setup step of an ecosystem whose mirror is an npm registry: the mirror the relay serves (in npm mode),
    the step's variables, and how the ecosystem words a failure from its installer's log
    (what, log, exit code) -> reason. The PyPI steps need none: they are the builder's own."""

    mirror: MirrorURL
    variables: dict[str, str]
    reason: Callable[[str, str, int], str]


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
        self.server.relay.refuse(self, 405, "it answers GET and HEAD only")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_CONNECT = _refuse


# npm asks for a scoped package's document as one segment with its slash encoded: /@scope%2fname.
SCOPED_SEGMENT = re.compile(r"/@[a-z0-9][a-z0-9._~-]*%2[fF](?=[a-z0-9._~-]+(?:/|$))")


def _scoped_name_joined(path: str) -> str:
    """`path` as `malformed` should judge it in npm mode: `@scope%2fname` read as the two plain segments it
    names (only that exact spelling, with lowercase package characters; anything else is judged as sent)."""
    return SCOPED_SEGMENT.sub(lambda m: m.group(0)[:-3] + "/", path)


def _target(handler: BaseHTTPRequestHandler) -> str:
    """The request target as sent: `handler.path` has had a leading `//` folded into `/`."""
    words = handler.requestline.split()
    return words[1] if len(words) >= 2 else ""


class IndexRelay:
    """Serves the mirror's index on a unix socket for one setup sandbox; `close()` stops it."""

    def __init__(self, mirror: MirrorURL, socket_path: Path, *, timeout: float = 60.0, npm: bool = False) -> None:
        self.mirror = mirror
        self.npm = npm  # an npm registry: a scoped package's name is one segment, `@scope%2fname`
        self.socket_path = socket_path
        self.inside_origin = ""  # set by the builder: http://127.0.0.1:PORT
        self.requests = 0
        self.refused = 0
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._linked: set[str] = set()  # files the index pages relayed here linked, percent-decoded once
        self._full = False
        self._index = unquote(mirror.path)
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

    # -- which paths ----------------------------------------------------------------------------

    def in_index(self, path: str) -> bool:
        """Under the index path; `path` has passed `malformed`, so no segment can climb out."""
        decoded = unquote(path)
        return decoded.startswith(self._index) or decoded == self._index.rstrip("/")

    def refusal(self, path: str) -> tuple[int, str] | None:
        """The status and reason to refuse `path` with; None to forward it."""
        why = malformed(_scoped_name_joined(path) if self.npm else path)
        if why is not None:
            return 400, why
        if self.in_index(path):
            return None
        with self._lock:
            if unquote(path) in self._linked:
                return None
        return 403, f"neither under the index path {self.mirror.path} nor a file its pages linked"

    def _mirror_path(self, url: str) -> str | None:
        """The path of absolute `url` on the mirror's origin, fragment dropped; None for another
        origin or a path `malformed` refuses (a query too: such a file could not be requested)."""
        url = url.split("#", 1)[0]
        for spelling in self.mirror.spellings:
            if url.startswith(spelling + "/"):
                path = url[len(spelling) :]
                return path if malformed(path) is None else None
        return None

    def _links(self, path: str, data: bytes, kind: str) -> list[str]:
        """The mirror paths outside the index path that the index page at `path` links to."""
        page = self.mirror.origin + path
        hrefs: list[str] = []
        if "json" in kind:  # PEP 691: files[].url, relative to the page
            try:
                doc = json.loads(data)
            except (ValueError, RecursionError):
                return []
            files = doc.get("files") if isinstance(doc, dict) else None
            for entry in files if isinstance(files, list) else []:
                if isinstance(entry, dict) and isinstance(entry.get("url"), str):
                    hrefs.append(entry["url"])
        else:  # PEP 503 HTML: href attributes, relative to <base href> when there is one (as pip reads it)
            text = data.decode("utf-8", "replace")
            base = BASE_TAG.search(text)
            found = HREF.search(base.group(0)) if base else None
            if found:
                page = urljoin(page, html.unescape(next(g for g in found.groups() if g is not None)).strip())
            hrefs = [html.unescape(next(g for g in m.groups() if g is not None)) for m in HREF.finditer(text)]
        paths = (self._mirror_path(urljoin(page, href.strip())) for href in hrefs)
        return [p for p in paths if p is not None and not self.in_index(p)]

    def _record(self, paths: Iterable[str]) -> bool:
        """Remember linked file paths; False once the bound is reached (they will be refused)."""
        with self._lock:
            for path in paths:
                key = unquote(path)
                if key in self._linked:
                    continue
                if len(self._linked) >= MAX_LINKED:
                    if not self._full and len(self.errors) < 20:
                        self.errors.append(f"the relay keeps {MAX_LINKED} linked files at most; later ones are refused")
                    self._full = True
                    return False
                self._linked.add(key)
        return True

    # -- per request ----------------------------------------------------------------------------

    def answer(self, handler: BaseHTTPRequestHandler, status: int, text: bytes, head: bool = False) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "text/plain; charset=utf-8")
        handler.send_header("Content-Length", str(len(text)))
        handler.end_headers()
        if not head:
            handler.wfile.write(text)

    def refuse(self, handler: BaseHTTPRequestHandler, status: int, why: str, head: bool = False) -> None:
        """Answer `status` with why, count it, note it; the connection is closed (nothing left to read)."""
        self._note(refused=True, error=f"refused {handler.command} {_target(handler)[:120]!a}: {why}")
        handler.close_connection = True
        self.answer(handler, status, f"FrogFix's mirror relay refused this request: {why}\n".encode(), head)

    def _note(self, refused: bool = False, error: str | None = None) -> None:
        with self._lock:
            self.requests += 1
            self.refused += refused
            if error and len(self.errors) < 20:
                self.errors.append(error)

    def forward(self, handler: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = _target(handler)
        refusal = self.refusal(path)
        if refusal is not None:
            self.refuse(handler, *refusal, head=not body)
            return
        request = self._client.build_request(
            "GET" if body else "HEAD",
            self.mirror.origin + path,
            headers={
                **{k: v for k, v in handler.headers.items() if k.lower() in FORWARDED_REQUEST_HEADERS},
                "Accept-Encoding": "identity",
            },
        )
        sent = (request.url.host, request.url.port or self.mirror.port, request.url.raw_path)
        if sent != (self.mirror.host, self.mirror.port, path.encode()):
            self.refuse(handler, 400, "the path would not reach the mirror as sent", head=not body)
            return
        try:
            response = self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            why = f"the package mirror did not answer: {type(exc).__name__}"
            self._note(error=why)
            self.answer(handler, 502, why.encode() + b"\n", not body)
            return
        try:
            self._relay_response(handler, response, body, path)
        except (OSError, httpx.HTTPError) as exc:  # the sandbox hung up, or the mirror broke off mid-body
            self._note(error=f"transfer broke off: {type(exc).__name__}")
            handler.close_connection = True
        finally:
            response.close()

    def _relay_response(self, handler: BaseHTTPRequestHandler, response: httpx.Response, body: bool, path: str) -> None:
        headers = {k: v for k, v in response.headers.items() if k.lower() in FORWARDED_RESPONSE_HEADERS}
        index = self.in_index(path)
        error = None
        if response.is_redirect:
            target = str(response.url.join(response.headers.get("location", "")))
            local = self._local(target)
            if local is None:  # the mirror does not serve it (pypiserver sends misses to pypi.org): not found
                self._note(refused=True, error=f"the mirror sent {path[:120]!a} elsewhere; not followed")
                self.answer(handler, 404, b"not on the package mirror (it redirected elsewhere)\n", not body)
                return
            headers["Location"] = local
            moved = self._mirror_path(target)
            if moved is None or not (self.in_index(moved) or (not index and self._record([moved]))):
                error = f"the mirror redirected {path[:120]!a} to a path the relay refuses"
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if error is None and response.status_code in (401, 403):
            error = f"the mirror answered HTTP {response.status_code}: it refused FrogFix's credentials"
        self._note(error=error)
        if body and kind.startswith(INDEX_TYPES) and response.status_code == 200:
            data = b""
            for chunk in response.iter_bytes():
                data += chunk
                if len(data) > MAX_INDEX_PAGE_BYTES:
                    self.answer(handler, 502, b"the package mirror's index page is too large\n")
                    return
            # Project pages link files (the root page lists projects); a linked file's links are nothing.
            if index and unquote(path) not in (self._index, self._index.rstrip("/")):
                self._record(self._links(path, data, kind))
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
