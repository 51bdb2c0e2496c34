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

With `--parent`, it also leaves a watchdog behind (a grandchild, holding none of the sandbox's
descriptors) that waits on pidfds of the worker and of bwrap. PR_SET_PDEATHSIG kills bwrap's
launcher, but bwrap's child, cloned into the new namespaces, only asks for its own death signal
just before it execs; if the launcher dies first (the worker killed while a sandbox starts), the
child waits for ever on an eventfd the launcher was to write. So when the worker dies while
bwrap still runs, the watchdog kills bwrap's process group (the child is still in it until its
late setsid) and every process in the sandbox's cgroups, then exits; when bwrap ends, it just exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time

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
        if parent is not None:
            if not _dies_with(parent):
                return _fail(f"the worker (pid {parent}) is gone; not starting the sandbox")
            _leave_watchdog(parent, options)
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


def _leave_watchdog(worker: int, procs_files: list[str]) -> None:
    """Fork the watchdog (see the module docstring) as a grandchild, so bwrap never reaps it."""
    sandbox = os.getpid()  # this process, bwrap once exec'd: the leader of its own process group
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    try:
        if os.fork():
            os._exit(0)
        _watch(worker, sandbox, procs_files)
    finally:
        os._exit(0)


def _watch(worker: int, sandbox: int, procs_files: list[str]) -> None:
    os.setsid()  # out of bwrap's process group, which it kills
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # never hold the sandbox's pipes: the worker reads EOF when bwrap ends
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    try:
        bwrap = os.pidfd_open(sandbox)
    except OSError:
        return  # bwrap is already gone
    try:
        worker_fd = os.pidfd_open(worker)
    except OSError:
        worker_fd = -1  # the worker is already gone
    if worker_fd >= 0:
        poller = select.poll()
        poller.register(bwrap, select.POLLIN)
        poller.register(worker_fd, select.POLLIN)
        poller.poll()
        # The worker's death also kills bwrap's launcher (its death signal), so both may be ready at
        # once: only a sandbox that ended while its worker lives needs nothing more.
        alone = select.poll()
        alone.register(worker_fd, select.POLLIN)
        if not alone.poll(200):
            return
    _kill_sandbox(sandbox, procs_files)


def _kill_sandbox(sandbox: int, procs_files: list[str], wait_s: float = 10.0) -> None:
    """SIGKILL bwrap's process group and, until they are empty, its cgroups' processes but ours."""
    with contextlib.suppress(OSError):
        os.killpg(sandbox, signal.SIGKILL)
    me, deadline = os.getpid(), time.monotonic() + wait_s
    while procs_files and time.monotonic() < deadline:
        left = set()
        for procs in procs_files:
            try:
                with open(procs) as handle:
                    left |= {int(line) for line in handle if line.strip() and int(line) != me}
            except (OSError, ValueError):
                continue
        if not left:
            return
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _fail(message: str) -> int:
    os.write(2, f"frogfix cgroup_enter: {message}\n".encode())
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
