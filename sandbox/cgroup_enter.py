"""Exec wrapper: join a sandbox's cgroups, drop to the sandbox's host uid, then exec bwrap.

    python -I -S cgroup_enter.py [--parent P] [--uid U --gid G] CGROUP_PROCS_FILE... -- BWRAP_ARGV...

Why a wrapper: Python 3.11's subprocess cannot start a child inside a cgroup (no clone3 with
CLONE_INTO_CGROUP), a preexec_fn is unsafe in a threaded worker, and moving bwrap after it
started would leave a window in which it has already forked. This process writes its own pid
into each cgroup.procs while it is still the only process, then becomes bwrap (same pid), so
everything bwrap starts is inside from its first instruction. The uid is dropped after the
move, because joining a cgroup needs the rights of the worker, not of the sandbox's uid.
With `--parent P` (the worker's pid) it asks the kernel for SIGKILL when the worker dies
(PR_SET_PDEATHSIG, kept across the exec, after the uid drop that would clear it) and then checks
that P is still its parent: a worker killed while this wrapper started would otherwise leave bwrap
running with nobody to kill it, since bwrap's own --die-with-parent only begins once bwrap runs.
Stdlib only; on any failure it exits 127 with one line on stderr and bwrap never runs.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    try:
        split = argv.index("--")
    except ValueError:
        return _fail("usage: cgroup_enter.py [--uid U --gid G] PROCS_FILE... -- ARGV...")
    options, command = argv[:split], argv[split + 1 :]
    parent = None
    if options[:1] == ["--parent"] and len(options) > 1:
        parent, options = int(options[1]), options[2:]
    ids = None
    if options[:1] == ["--uid"]:
        if len(options) < 4 or options[2] != "--gid":
            return _fail("--uid needs --gid")
        ids, options = (int(options[1]), int(options[3])), options[4:]
    if not command:
        return _fail("nothing to run")
    try:
        pid = str(os.getpid()).encode()
        for procs in options:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        if ids is not None:
            os.setgroups([])
            os.setgid(ids[1])
            os.setuid(ids[0])
        if parent is not None and not _dies_with(parent):
            return _fail(f"the worker (pid {parent}) is gone; not starting the sandbox")
        os.execv(command[0], command)
    except OSError as exc:
        return _fail(f"cannot start the sandbox in its cgroup: {exc}")
    return 127  # not reached: execv replaced this process


def _dies_with(parent: int) -> bool:
    """SIGKILL this process (bwrap, once exec'd) when its parent dies; False if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return os.getppid() == parent


def _fail(message: str) -> int:
    os.write(2, f"frogfix cgroup_enter: {message}\n".encode())
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
