"""The cgroup exec wrapper ties what it execs to the worker's life before bwrap's own
--die-with-parent begins, and never starts a sandbox for a worker that is already gone."""

from __future__ import annotations

import os
import subprocess
import sys

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
