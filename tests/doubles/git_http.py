"""A real git smart-HTTP server on 127.0.0.1 (a test double for a forge's git endpoint).

Requests go to `git http-backend` as CGI, so clone, fetch and push speak the real protocol
(v0/v1 and v2). Every request must carry the expected Authorization header, as a forge demands
for private repositories; otherwise the answer is 401 with a Basic challenge. Receive-pack is
enabled (REMOTE_USER is set), and every push is recorded with the ref updates it asked for and
its push options (`git push -o ci.skip`): the served repositories advertise push options, as
GitLab's and Gitea's do, so a test can see what a push asked of the forge.
"""

from __future__ import annotations

import gzip
import hmac
import os
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

GIT_TEST_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,  # no credential helper or insteadOf from the machine
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_AUTHOR_NAME": "FrogFix Test",
    "GIT_AUTHOR_EMAIL": "frogfix@example.invalid",
    "GIT_COMMITTER_NAME": "FrogFix Test",
    "GIT_COMMITTER_EMAIL": "frogfix@example.invalid",
}


def git_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The process environment for a test git command: isolated from the machine's git config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_TEST_ENV)
    env.update(extra or {})
    return env


def git(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run git with the test environment; never raises, the caller checks returncode."""
    return subprocess.run(
        ["git", *args], cwd=cwd, env=dict(env) if env is not None else git_env(), capture_output=True, text=True
    )


def make_worktree(path: Path, files: Mapping[str, str], *, branch: str = "main", message: str = "initial") -> Path:
    """A fresh working tree at `path` with `files` committed on `branch`."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    for args in (("init", "-q", "-b", branch), ("add", "-A"), ("commit", "-q", "-m", message)):
        done = git(*args, cwd=path)
        if done.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr}")
    return path


def bare_repo_from(worktree: Path, root: Path, name: str) -> Path:
    """A bare copy of `worktree` at `root/name` (e.g. `group/project.git`), served by GitHttpDouble."""
    target = root / name
    target.parent.mkdir(parents=True, exist_ok=True)
    done = git("clone", "-q", "--bare", str(worktree), str(target))
    if done.returncode != 0:
        raise RuntimeError(f"git clone --bare failed: {done.stderr}")
    return target


@dataclass
class Push:
    """One receive-pack request: the repository, the (old, new, ref) updates it asked for, its push options."""

    repo: str
    updates: list[tuple[str, str, str]]
    status: int
    options: list[str] = field(default_factory=list)


@dataclass
class GitRequest:
    method: str
    path: str
    authorization: str | None
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)


def _pkt_lines(data: bytes, pos: int = 0) -> tuple[list[bytes], int]:
    """The pkt-lines from `pos` to the next flush packet, and the position just past that flush."""
    lines = []
    while pos + 4 <= len(data):
        try:
            size = int(data[pos : pos + 4], 16)
        except ValueError:
            break
        if size == 0:
            return lines, pos + 4
        lines.append(data[pos + 4 : pos + size])
        pos += size
    return lines, pos


def parse_push_commands(body: bytes) -> list[tuple[str, str, str]]:
    updates = []
    for line in _pkt_lines(body)[0]:
        command = line.split(b"\0", 1)[0].strip().decode("utf-8", "replace")
        parts = command.split(" ")
        if len(parts) == 3:
            updates.append((parts[0], parts[1], parts[2]))
    return updates


def parse_push_options(body: bytes) -> list[str]:
    """The push options: a second pkt-line list after the commands, sent only when the first
    command's capabilities name `push-options` (git's pack-protocol, "push-options")."""
    commands, end = _pkt_lines(body)
    if not commands or b"push-options" not in commands[0].partition(b"\0")[2].split():
        return []
    return [line.rstrip(b"\n").decode("utf-8", "replace") for line in _pkt_lines(body, end)[0]]


@dataclass
class GitFault:
    """One scripted misbehaviour of the git server for a matching request, consumed when used."""

    status: int = 503
    hang_s: float = 0.0
    after: bool = False  # serve the request first (a push lands), then hang or answer the fault
    path_contains: str | None = None


class GitHttpDouble:
    """Serves the bare repositories under `root` at `base_url/<path>` through git http-backend.

    `authorization` is the exact Authorization header value required (None: no check).
    State: `pushes` (list of Push), `requests` (list of GitRequest).
    """

    def __init__(self, root: Path, *, authorization: str | None = None) -> None:
        self.root = root
        self.authorization = authorization
        self.pushes: list[Push] = []
        self.requests: list[GitRequest] = []
        self.lock = threading.Lock()
        self.faults: list[GitFault] = []
        self.first_fault: GitFault | None = None
        self._first_seen: set[tuple[str, str, str]] = set()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="GitHttpDouble", daemon=True
        )
        self._thread.start()

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def url_for(self, name: str) -> str:
        return f"{self.base_url}/{name}"

    def fail_next(self, count: int = 1, status: int = 503, *, path_contains: str | None = None) -> None:
        """The next `count` matching requests answer `status` without touching the repository."""
        with self.lock:
            self.faults.extend(GitFault(status=status, path_contains=path_contains) for _ in range(count))

    def hang_next(self, seconds: float, *, path_contains: str | None = None, after: bool = False) -> None:
        """The next matching request gets no answer for `seconds` (after serving it, with `after`)."""
        with self.lock:
            self.faults.append(GitFault(status=504, hang_s=seconds, after=after, path_contains=path_contains))

    def fail_each_first(self, fault: GitFault | None) -> None:
        """Every distinct request (method, path, query) gets `fault` the first time it is made."""
        with self.lock:
            self.first_fault = fault
            self._first_seen.clear()

    def _take_fault(self, method: str, path: str, query: str) -> GitFault | None:
        with self.lock:
            for i, fault in enumerate(self.faults):
                if fault.path_contains is None or fault.path_contains in path:
                    return self.faults.pop(i)
            key = (method, path, query)
            if self.first_fault is not None and key not in self._first_seen:
                self._first_seen.add(key)
                return self.first_fault
        return None

    def close(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> GitHttpDouble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the HTTP side ---------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(handler.path)
        path = unquote(split.path)
        given = handler.headers.get("Authorization")
        record = GitRequest(method, path, given, headers={k.lower(): v for k, v in handler.headers.items()})
        with self.lock:
            self.requests.append(record)
        body = self._read_body(handler)
        if self.authorization is not None and not (
            given is not None and hmac.compare_digest(given.encode(), self.authorization.encode())
        ):
            record.status = 401
            self._send(handler, 401, {"WWW-Authenticate": 'Basic realm="GitHttpDouble"'}, b"authentication required\n")
            return
        fault = self._take_fault(method, path, split.query)
        if fault is not None and not fault.after:
            self._stopping.wait(fault.hang_s)
            record.status = fault.status
            self._send(handler, fault.status, {"Content-Type": "text/plain"}, b"injected by the double\n")
            return

        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.root),
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_PROJECT_ROOT": str(self.root),
            "GIT_HTTP_EXPORT_ALL": "1",
            # Served repositories accept `git push -o`, as GitLab's and Gitea's do.
            "GIT_CONFIG_COUNT": "1",
            "GIT_CONFIG_KEY_0": "receive.advertisePushOptions",
            "GIT_CONFIG_VALUE_0": "true",
            "REMOTE_USER": "frogfix",  # enables receive-pack (pushes)
            "REMOTE_ADDR": "127.0.0.1",
            "REQUEST_METHOD": method,
            "PATH_INFO": path,
            "QUERY_STRING": split.query,
            "CONTENT_TYPE": handler.headers.get("Content-Type", ""),
            "CONTENT_LENGTH": str(len(body)),
        }
        protocol = handler.headers.get("Git-Protocol")
        if protocol:
            env["HTTP_GIT_PROTOCOL"] = protocol
        done = subprocess.run(
            ["git", "http-backend"], input=body, env=env, capture_output=True, timeout=60, check=False
        )
        status, headers, payload = self._parse_cgi(done.stdout)
        if done.returncode != 0 and status == 200 and not payload:
            status = 500
        record.status = status
        if method == "POST" and path.endswith("/git-receive-pack"):
            repo = path[: -len("/git-receive-pack")].lstrip("/")
            with self.lock:
                self.pushes.append(Push(repo, parse_push_commands(body), status, parse_push_options(body)))
        if fault is not None:  # served; now the answer is lost
            self._stopping.wait(fault.hang_s)
            record.status = fault.status
            self._send(handler, fault.status, {"Content-Type": "text/plain"}, b"injected by the double\n")
            return
        self._send(handler, status, headers, payload)

    @staticmethod
    def _read_body(handler: BaseHTTPRequestHandler) -> bytes:
        if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    handler.rfile.readline()
                    break
                chunks.append(handler.rfile.read(size))
                handler.rfile.readline()
            data = b"".join(chunks)
        else:
            length = int(handler.headers.get("Content-Length") or 0)
            data = handler.rfile.read(length) if length else b""
        if handler.headers.get("Content-Encoding", "").lower() in ("gzip", "x-gzip"):
            data = gzip.decompress(data)
        return data

    @staticmethod
    def _parse_cgi(output: bytes) -> tuple[int, dict[str, str], bytes]:
        for separator in (b"\r\n\r\n", b"\n\n"):
            head, found, payload = output.partition(separator)
            if found:
                break
        else:
            return 500, {}, output
        status, headers = 200, {}
        for line in head.decode("latin-1").splitlines():
            key, _, value = line.partition(":")
            if key.lower() == "status":
                status = int(value.strip().split(" ")[0])
            elif key:
                headers[key.strip()] = value.strip()
        return status, headers, payload

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str], payload: bytes) -> None:
        try:
            handler.send_response(status)
            for key, value in headers.items():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    handler.send_header(key, value)
            handler.send_header("Content-Length", str(len(payload)))
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; without this, Nagle waits for a delayed ACK
            # (~40 ms a POST) that no real forge front end adds.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                double._handle(self, "GET")

            def do_POST(self) -> None:
                double._handle(self, "POST")

        return Handler
