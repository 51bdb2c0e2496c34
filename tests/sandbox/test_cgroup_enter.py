"""The cgroup exec wrapper ties what it execs to the worker's life before bwrap's own
--die-with-parent begins, and never starts a sandbox for a worker that is already gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sandbox import cgroups
from sandbox.cgroups import ENTER_SCRIPT

READ_PDEATHSIG = (
    "import ctypes; v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value)"
)


def _enter(*options: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-I", "-S", ENTER_SCRIPT, *options, "--", sys.executable, "-I", "-S", "-c", READ_PDEATHSIG]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def test_what_the_wrapper_execs_is_killed_with_the_worker() -> None:
    done = _enter("--parent", str(os.getpid()))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "9"  # PR_GET_PDEATHSIG: SIGKILL, kept across the exec


def test_a_worker_already_gone_starts_no_sandbox() -> None:
    done = _enter("--parent", "1")  # not our parent: as if the worker died and we were re-parented
    assert done.returncode == 127 and done.stdout == ""
    assert "is gone; not starting the sandbox" in done.stderr


# A stand-in for the worker: it starts the wrapper as LocalSandbox does (its own session), prints
# what the exec'd command prints, and sleeps until the test kills it.
FAKE_WORKER = """
import subprocess, sys, time
procs = sys.argv[1:]
subprocess.Popen([sys.executable, "-I", "-S", {script!r}, "--parent", str(__import__("os").getpid()), *procs,
                  "--", "/bin/sh", "-c", {command!r}], start_new_session=True)
time.sleep(300)
"""


def _orphan_survives_the_worker(command: str, procs: list[str]) -> int:
    """Kill a fake worker whose wrapped command left a child behind; the child's pid."""
    script = FAKE_WORKER.format(script=ENTER_SCRIPT, command=command)
    worker = subprocess.Popen([sys.executable, "-c", script, *procs], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        orphan = int(worker.stdout.readline())
        assert _alive(orphan)
    finally:
        worker.kill()
        worker.wait()
    return orphan


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_child_the_death_signal_misses_is_killed_when_the_worker_dies() -> None:
    """bwrap's cloned child asks for its own death signal only just before it execs; killed in that
    window, the worker used to leave it waiting for ever (the shell's child here has no death signal
    either). The wrapper's watchdog kills the process group when the worker dies."""
    orphan = _orphan_survives_the_worker("sleep 300 >/dev/null 2>&1 & echo $!; wait", [])
    assert _gone_within(orphan, 10), f"pid {orphan} outlived the worker"


def test_a_child_that_left_the_group_is_killed_through_the_cgroup() -> None:
    """A child in its own session escapes the process group, not the sandbox's cgroup."""
    from tests.sandbox.test_cgroups import need

    need("pids")
    limits = cgroups.CgroupLimits(memory_bytes=256 << 20, max_processes=64, cpus=1.0)
    cgroup = cgroups.create(limits, cgroups.host_support())
    assert cgroup is not None
    try:
        command = "setsid sh -c 'echo $$; exec sleep 300' </dev/null & wait"
        orphan = _orphan_survives_the_worker(command, cgroup.procs_files())
        assert _gone_within(orphan, 10), f"pid {orphan} outlived the worker"
    finally:
        assert cgroup.kill_and_remove() == []


def test_the_watchdog_leaves_when_the_sandbox_ends() -> None:
    """A sandbox that ends on its own leaves no watchdog behind (nor any descriptor of its pipes)."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", ENTER_SCRIPT, "--parent", str(os.getpid()), "--", "/bin/sh", "-c", "echo $$"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr  # and run() returned: no watchdog held stdout open
    sandbox = int(done.stdout)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        watchers = subprocess.run(
            ["pgrep", "-f", f"{ENTER_SCRIPT} --parent {os.getpid()}"], capture_output=True, text=True
        )
        if not watchers.stdout.strip():
            break
        time.sleep(0.05)
    assert not watchers.stdout.strip(), f"a watchdog of sandbox {sandbox} stayed: {watchers.stdout}"
