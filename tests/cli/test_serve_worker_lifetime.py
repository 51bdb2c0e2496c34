"""`manage.py serve`'s embedded worker ends when serve ends, whatever ends serve.

Real processes: serve with the embedded defaults (SQLite, filesystem broker) on a free port of
127.0.0.1 and a temp data folder, its worker child found through /proc, then one signal to serve
alone (never its process group, which a service manager's SIGKILL of the main pid does not reach
either). An orphaned worker would go on consuming the broker with old settings and old code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
STARTUP_S = 120.0  # two CPUs shared with other suites: migrations, uvicorn and Celery take a while
GONE_WITHIN_S = 30.0  # an idle worker's warm shutdown takes a second or two


def _stat(pid: int) -> tuple[str, str] | None:
    """(state, start time) of `pid` from /proc, or None when there is no such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return fields[0], fields[19]


def _running(pid: int, started: str) -> bool:
    """The same process (not a reused pid) still there and not a zombie waiting to be reaped."""
    found = _stat(pid)
    return found is not None and found[1] == started and found[0] not in ("Z", "X")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env.update(FROGFIX_DATA_DIR=str(tmp_path / "data"), FROGFIX_SWEEP_INTERVAL_SECONDS="0")
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "serve", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group, so the cleanup below can reach whatever is left
        )
    try:
        wait_for_port(port, STARTUP_S)
        yield proc, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def _ready_worker(serve: subprocess.Popen[bytes], log: Path) -> tuple[int, str]:
    """serve's worker child, once Celery says it consumes (pid, start time)."""
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        children = _children(serve.pid)
        if children and " ready." in log.read_text("utf-8", "replace"):
            [worker] = children
            found = _stat(worker)
            assert found is not None
            return worker, found[1]
        assert serve.poll() is None, log.read_text("utf-8", "replace")
        time.sleep(0.2)
    raise AssertionError("serve's worker never became ready:\n" + log.read_text("utf-8", "replace")[-3000:])


def _gone_within(pid: int, started: str, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _running(pid, started):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_serve_stopped_by_a_signal_stops_its_worker_before_it_exits(
    serve: tuple[subprocess.Popen[bytes], Path], sig: signal.Signals
) -> None:
    proc, log = serve
    worker, started = _ready_worker(proc, log)

    os.kill(proc.pid, sig)

    proc.wait(GONE_WITHIN_S)
    assert not _running(worker, started), "serve exited and left its worker running"
    # It ends the way the signal ends a process, so a service manager reads the stop as clean.
    assert proc.returncode == -sig, (proc.returncode, log.read_text("utf-8", "replace")[-3000:])


def test_serve_killed_outright_still_takes_its_worker_along(serve: tuple[subprocess.Popen[bytes], Path]) -> None:
    proc, log = serve
    worker, started = _ready_worker(proc, log)

    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)

    assert _gone_within(worker, started, GONE_WITHIN_S), "the worker outlived serve's SIGKILL"


def test_a_worker_that_will_not_stop_is_killed_after_the_grace(tmp_path: Path) -> None:
    """A job that outlasts the warm shutdown is cut short: the worker never outlives serve for long."""
    read_end, write_end = os.pipe()
    busy = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a warm shutdown that waits on a long job\n"
        "from worker.embedded import watch_lifeline\n"
        "watch_lifeline(int(sys.argv[1]), grace_s=1.0)\n"
        "print('watching', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", busy, str(read_end)], pass_fds=(read_end,), cwd=ROOT, stdout=subprocess.PIPE
    )
    os.close(read_end)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"watching\n"
        time.sleep(1.5)
        assert proc.poll() is None  # the lifeline is open: nothing happens
        os.close(write_end)
        assert proc.wait(15) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
