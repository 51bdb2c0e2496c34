"""Real servers for tests, on 127.0.0.1 only: PostgreSQL, Redis and the app under uvicorn."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout}s")


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for candidate in sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"), reverse=True):
        return str(candidate)
    raise FileNotFoundError(f"{name} not found: install PostgreSQL (apt-get install postgresql)")


@dataclass
class Postgres:
    port: int
    datadir: Path
    proc_user: str

    def url(self, db: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{self.port}/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _as_owner(self, *args: str) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", self.proc_user, "--", *args]
        return list(args)

    def start(self) -> None:
        subprocess.run(
            self._as_owner(
                _pg_bin("pg_ctl"),
                "-D",
                str(self.datadir),
                "-l",
                str(self.datadir / "log.txt"),
                "-o",
                f"-p {self.port} -k {self.datadir} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
                "-c max_connections=300",
                "-w",
                "start",
            ),
            check=True,
            capture_output=True,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            self._as_owner(_pg_bin("pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop"),
            capture_output=True,
        )


@contextmanager
def postgres_server() -> Iterator[Postgres]:
    """A throwaway cluster (initdb + pg_ctl), owned by the postgres user when we are root."""
    user = "postgres" if os.geteuid() == 0 else os.environ.get("USER", "")
    base = Path(tempfile.mkdtemp(prefix="frogfix-pg-"))
    datadir = base / "data"
    if os.geteuid() == 0:
        shutil.chown(base, user)
    pg = Postgres(free_port(), datadir, user)
    subprocess.run(
        pg._as_owner(_pg_bin("initdb"), "-D", str(datadir), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"),
        check=True,
        capture_output=True,
    )
    pg.start()
    try:
        yield pg
    finally:
        pg.stop("immediate")
        shutil.rmtree(base, ignore_errors=True)


@dataclass
class Redis:
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise FileNotFoundError("redis-server not found: apt-get install redis-server")
        self.proc = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None


@contextmanager
def redis_server() -> Iterator[Redis]:
    r = Redis(free_port())
    r.start()
    try:
        yield r
    finally:
        r.stop()


@contextmanager
def uvicorn_app(app: Any) -> Iterator[str]:
    """Serve an ASGI app on 127.0.0.1 in a thread; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host="127.0.0.1",
            port=port,
            log_config=None,
            access_log=False,
            lifespan="on",
            limit_concurrency=1000,
            backlog=2048,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for_port(port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def wait_until(predicate: Any, timeout: float = 20.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"condition not met within {timeout}s")


def get_json(url: str, token: str) -> Any:
    return httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10).json()
