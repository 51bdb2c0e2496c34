"""A real npm registry for the tests: Verdaccio (its npm package), playing the company's mirror.

- Verdaccio itself is installed once with the machine's npm into a cache folder outside the repo
  (`~/.cache/frogfix-tests/verdaccio-6.8.0`, or under FROGFIX_TEST_CACHE), under a file lock so
  several xdist workers install it once.
- Its storage is one persistent cache folder (`.../npm-storage`) shared by every server: it proxies
  https://registry.npmjs.org/ and keeps what it fetched for ten years (maxage), so once a package is
  in it, the tests need nothing outside (`uplink=` points a server at a dead uplink to prove it).
  Servers of several workers share it (tests/test_npm_registry.py proves two publishing at once);
  private packages are published with the same bytes every time (see `tarball`), so a second
  publish of a version is the same package (checked by its integrity), not a conflict: publish a
  different content under another name or version.
- Every package needs a login (`$authenticated`), by htpasswd with a user and password each server
  makes (`{SHA}` hashes: Verdaccio 6 also takes bcrypt, apr1 MD5, crypt and `{PLAIN}`);
  registration is off (`max_users: -1`). Verdaccio takes `Authorization: Basic` (as FrogFix's relay
  sends it); no client builds it from a registry URL's userinfo for every request (npm and Yarn
  Berry only for package documents, not tarballs; pnpm never; Yarn classic fails): a client outside
  the relay gets the credentials as `//host:port/:_auth` (`npmrc()`), Berry as `npmAuthIdent`.
- Requests are logged as JSON lines to a file: `requests()` and `served_tarballs()` read it.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import fcntl
import gzip
import hashlib
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any, NamedTuple
from urllib.parse import quote, unquote

import httpx
import pytest

from tests.servers import free_port

VERDACCIO_VERSION = "6.8.0"
PUBLIC_REGISTRY = "https://registry.npmjs.org/"
CACHE = Path(os.environ.get("FROGFIX_TEST_CACHE") or Path.home() / ".cache" / "frogfix-tests")
# What FrogFix installs from the mirror (the package managers themselves), kept in the storage.
PACKAGE_MANAGERS = (("pnpm", "10.28.0"), ("yarn", "1.22.22"), ("@yarnpkg/cli-dist", "4.5.3"))
READY_S = 120.0  # a cold start on a busy machine; polled, never slept
PUBLISH_S = 60.0  # how long a publish retries while another server creates the same package
DUPLICATE_S = 0.05  # Verdaccio may log one request twice, this far apart (see `requests`)
LOG_S = 60.0  # how long `requests` waits for the log to show its marker request
MARK = "/-/frogfix-log-mark/"


class Request(NamedTuple):
    """One request the registry answered, from its log."""

    method: str
    path: str  # as sent, e.g. /is-number/-/is-number-7.0.0.tgz or /@company%2fleft-pad-lite
    status: int
    user: str | None  # who it authenticated, None when no (valid) credentials came
    bytes_out: int


def verdaccio_script(cache: Path = CACHE) -> Path:
    """Verdaccio's entry point, installed on first use (once for all workers: a file lock)."""
    folder = cache / f"verdaccio-{VERDACCIO_VERSION}"
    script = folder / "node_modules" / "verdaccio" / "bin" / "verdaccio"
    if (folder / ".complete").exists():
        return script
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / f"verdaccio-{VERDACCIO_VERSION}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / ".complete").exists():
            return script
        npm = shutil.which("npm")
        if npm is None:
            raise FileNotFoundError("npm not found: the npm registry tests need node and npm (./install.sh)")
        staging = cache / f"verdaccio-{VERDACCIO_VERSION}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        done = subprocess.run(
            [npm, "install", "--prefix", str(staging), "--registry", PUBLIC_REGISTRY, "--no-audit", "--no-fund",
             "--ignore-scripts", f"verdaccio@{VERDACCIO_VERSION}"],
            capture_output=True, text=True, timeout=900,
        )
        if done.returncode != 0:
            raise RuntimeError(f"npm install verdaccio@{VERDACCIO_VERSION} failed:\n{done.stderr[-3000:]}")
        (staging / ".complete").write_text(VERDACCIO_VERSION)
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    return script


def config_text(storage: Path, htpasswd: Path, log: Path, uplink: str) -> str:
    """Verdaccio's config.yaml (JSON is YAML): every package behind a login, the public registry proxied."""
    everyone = {"access": "$authenticated", "publish": "$authenticated", "unpublish": "$authenticated"}
    config = {
        "storage": str(storage),
        "auth": {"htpasswd": {"file": str(htpasswd), "max_users": -1}},
        "uplinks": {"npmjs": {"url": uplink, "maxage": "3650d", "cache": True, "timeout": "60s",
                              "max_fails": 2, "fail_timeout": "5m"}},
        "packages": {"@company/*": everyone, "**": {**everyone, "proxy": "npmjs"}},
        "web": {"enable": False},
        "log": {"type": "file", "path": str(log), "format": "json", "level": "http"},
        "max_body_size": "50mb",
    }
    return json.dumps(config, indent=2)


class Verdaccio:
    """One running registry server on 127.0.0.1: `url` carries the credentials, `plain_url` does not."""

    def __init__(self, folder: Path, *, uplink: str = PUBLIC_REGISTRY, storage: Path | None = None) -> None:
        self.folder = folder
        self.user = "frogfix-tests"
        self.password = "npm-" + secrets.token_urlsafe(18)
        self.port, self.plain_url, self.url = 0, "", ""
        self._at(free_port())
        self.storage = storage or CACHE / "npm-storage"
        self.log = folder / "verdaccio.log.jsonl"
        self.uplink = uplink
        self._process: subprocess.Popen[bytes] | None = None
        self._output: IO[bytes] | None = None

    def start(self) -> Verdaccio:
        """Start it and wait (polling /-/ping) until it answers; its output goes to `folder`/output.txt.
        A port taken between choosing and binding it is chosen again (twice at most)."""
        script = verdaccio_script()
        self.storage.mkdir(parents=True, exist_ok=True)
        htpasswd = self.folder / "htpasswd"
        digest = base64.b64encode(hashlib.sha1(self.password.encode()).digest()).decode()
        htpasswd.write_text(f"{self.user}:{{SHA}}{digest}\n")
        config = self.folder / "config.yaml"
        config.write_text(config_text(self.storage, htpasswd, self.log, self.uplink))
        atexit.register(self.stop)  # also when the session ends without its teardown
        for _ in range(3):
            if self._launch(script, config):
                return self
            self._at(free_port())
        raise RuntimeError(f"Verdaccio found no free port:\n{self._output_tail()}")

    def _launch(self, script: Path, config: Path) -> bool:
        """Whether it answers; False when its port was taken meanwhile; raises on any other end."""
        self._output = (self.folder / "output.txt").open("wb")
        node = shutil.which("node") or "node"
        self._process = subprocess.Popen(
            [node, str(script), "--config", str(config), "--listen", f"127.0.0.1:{self.port}"],
            stdout=self._output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.folder,
        )
        deadline = time.monotonic() + READY_S
        while not self._answers():
            if self._process.poll() is not None or time.monotonic() > deadline:
                exited = self._process.poll() is not None
                self.stop()
                if exited and _listening(self.port):  # it dies without a word when its port is taken
                    return False
                raise RuntimeError(f"Verdaccio did not answer on {self.plain_url}-/ping:\n{self._output_tail()}")
            time.sleep(0.1)
        return True

    def _output_tail(self) -> str:
        return (self.folder / "output.txt").read_text(errors="replace")[-3000:]

    def _at(self, port: int) -> None:
        self.port = port
        self.plain_url = f"http://127.0.0.1:{port}/"
        self.url = f"http://{self.user}:{quote(self.password, safe='')}@127.0.0.1:{port}/"

    def _answers(self) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{self.plain_url}-/ping", timeout=2).status_code == 200
        return False

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait(timeout=30)
        if self._output is not None:
            self._output.close()

    def auth(self) -> httpx.BasicAuth:
        return httpx.BasicAuth(self.user, self.password)

    def npmrc(self, password: str | None = None) -> str:
        """An .npmrc that sends this registry's credentials (npm, pnpm and Yarn classic read it);
        `password` replaces the right one (to be refused)."""
        token = base64.b64encode(f"{self.user}:{self.password if password is None else password}".encode()).decode()
        return f"registry={self.plain_url}\n//127.0.0.1:{self.port}/:_auth={token}\nalways-auth=true\n"

    def requests(self) -> list[Request]:
        """Every request answered so far, in order, from the JSON log.

        Verdaccio writes its log behind the responses: a request to a marker path (MARK, its own
        lines left out) is awaited in the log first, so every request answered before this call is
        in. Verdaccio logs each request twice, when its response ends and when the request stream
        closes: that second line either comes first (status still 200, nothing sent, maybe no user
        yet) or repeats the first within milliseconds. A GET or PUT always sends a body, so a 200
        that sent nothing is such a line (dropped) and a repeat is collapsed; a HEAD sends nothing,
        so its two lines are taken as a pair, the answer being the one that differs from that."""
        found: list[Request] = []
        last: dict[Request, float] = {}
        heads: dict[str, Request] = {}  # a HEAD's first line, until its second
        for entry in self._log_entries():
            sent = int((entry.get("bytes") or {}).get("out", 0))
            request = Request(str(entry["request"].get("method")), str(entry["request"].get("url")),
                              int(entry["status"]), entry.get("user") or None, sent)
            if request.path.startswith(MARK):
                continue
            if request.method == "HEAD":
                first = heads.pop(request.path, None)
                if first is None:
                    heads[request.path] = request
                else:
                    early = first.status == 200 and (request.status != 200 or first.user is None)
                    found.append(request if early else first)
                continue
            at = float(entry.get("time", 0)) / 1000
            if (request.status == 200 and request.bytes_out == 0) or at - last.get(request, -1e9) <= DUPLICATE_S:
                continue
            last[request] = at
            found.append(request)
        return found + list(heads.values())

    def _log_entries(self) -> list[dict[str, Any]]:
        """The log's answered-request entries, once a marker request (while it runs) has reached it."""
        mark = f"{MARK}{secrets.token_hex(8)}"
        running = self._process is not None and self._process.poll() is None
        if running:
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(f"{self.plain_url}{mark.lstrip('/')}", timeout=30)
        deadline = time.monotonic() + LOG_S
        while True:
            text = self.log.read_text(errors="replace") if self.log.exists() else ""
            entries = [e for e in map(_json_line, text.splitlines())
                       if e.get("sub") == "in" and "status" in e and isinstance(e.get("request"), dict)]
            if not running or any(e["request"].get("url") == mark for e in entries):
                return entries
            if time.monotonic() > deadline:
                raise TimeoutError(f"Verdaccio's log ({self.log}) did not show a request after {LOG_S}s")
            time.sleep(0.05)

    def served_tarballs(self, since: int = 0) -> list[tuple[str, str]]:
        """(name, version) of every tarball it sent (200), each once, in the order first sent; `since`:
        only after the first that many requests (`before = len(registry.requests())`, then an install)."""
        served: list[tuple[str, str]] = []
        for request in self.requests()[since:]:
            parsed = tarball_of(request.path) if request.method == "GET" and request.status == 200 else None
            if parsed and parsed not in served:
                served.append(parsed)
        return served


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        return True
    return False


def _json_line(line: str) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        value = json.loads(line)
        return value if isinstance(value, dict) else {}
    return {}


def tarball_of(path: str) -> tuple[str, str] | None:
    """(name, version) from a tarball path: /is-number/-/is-number-7.0.0.tgz, /@scope%2fname/-/name-1.0.0.tgz."""
    name, separator, file = unquote(path.split("?")[0]).lstrip("/").partition("/-/")
    base = name.rsplit("/", 1)[-1]
    if not separator or not file.startswith(f"{base}-") or not file.endswith(".tgz") or "/" in file:
        return None
    return name, file[len(base) + 1 : -len(".tgz")]


def tarball(name: str, version: str, files: Mapping[str, str]) -> bytes:
    """A package tarball, the same bytes every time for the same input (fixed mtimes, gzip without a date)."""
    manifest = {"name": name, "version": version, "main": "index.js", "license": "MIT"}
    contents = {"package.json": json.dumps(manifest, indent=2) + "\n", **files}
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for path, text in sorted(contents.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"package/{path}")
            info.size, info.mtime, info.mode = len(data), 499162500, 0o644
            archive.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(fileobj=packed, mode="wb", mtime=0) as stream:
        stream.write(raw.getvalue())
    return packed.getvalue()


def publish(registry: Verdaccio, name: str, version: str, files: Mapping[str, str]) -> str:
    """Publish a private package (e.g. `@company/left-pad-lite`) as `npm publish` does; its integrity.

    Publishing the same version again (another worker, an earlier session: the storage persists) is
    fine when it is the same tarball; a different one fails."""
    data = tarball(name, version, files)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    filename = f"{name.rsplit('/', 1)[-1]}-{version}.tgz"
    document = {
        "_id": name, "name": name, "dist-tags": {"latest": version},
        "versions": {version: {
            "_id": f"{name}@{version}", "name": name, "version": version, "main": "index.js", "license": "MIT",
            "dist": {"integrity": integrity, "shasum": hashlib.sha1(data).hexdigest(),
                     "tarball": f"{registry.plain_url}{name}/-/{filename}"},
        }},
        "_attachments": {filename: {"content_type": "application/octet-stream",
                                    "data": base64.b64encode(data).decode(), "length": len(data)}},
    }
    escaped = quote(name, safe="@")
    deadline = time.monotonic() + PUBLISH_S
    while True:
        response = httpx.put(f"{registry.plain_url}{escaped}", json=document, auth=registry.auth(), timeout=60)
        if response.status_code in (200, 201):
            return integrity
        existing = httpx.get(f"{registry.plain_url}{escaped}", auth=registry.auth(), timeout=60)
        found = existing.json().get("versions", {}).get(version) if existing.status_code == 200 else None
        if found is not None and found.get("dist", {}).get("integrity") == integrity:
            return integrity
        # 409 while another server creates the same package: its version may not be written yet.
        if found is not None or response.status_code != 409 or time.monotonic() > deadline:
            raise RuntimeError(f"publishing {name}@{version} failed: HTTP {response.status_code} {response.text[:300]}")
        time.sleep(0.2)


@pytest.fixture(scope="session")
def npm_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Verdaccio]:
    """The company's npm mirror for this test process (one per xdist worker, one shared storage)."""
    registry = Verdaccio(tmp_path_factory.mktemp("verdaccio")).start()
    try:
        yield registry
    finally:
        registry.stop()
