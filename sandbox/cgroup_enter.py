"""Exec wrapper: join a sandbox's cgroups, drop to the sandbox's host uid, then exec bwrap.

    python -I -S cgroup_enter.py [--parent P [--worker W]] [--uid U --gid G] CGROUP_PROCS_FILE... -- BWRAP_ARGV...

Why a wrapper: Python 3.11's subprocess cannot start a child inside a cgroup (no clone3 with
CLONE_INTO_CGROUP), a preexec_fn is unsafe in a threaded worker, and moving bwrap after it
started would leave a window in which it has already forked. This process writes its own pid
into each cgroup.procs while it is still the only process, then becomes bwrap (same pid), so
everything bwrap starts is inside from its first instruction. The uid is dropped after the
move, because joining a cgroup needs the rights of the worker, not of the sandbox's uid.
With `--parent P` (the process that started this one: the worker, or the launcher below) it asks
the kernel for SIGKILL when P dies (PR_SET_PDEATHSIG, kept across the exec, after the uid drop
that would clear it) and then checks that P is still its parent: a P killed while this wrapper
started would otherwise leave bwrap running with nobody to kill it, since bwrap's own
--die-with-parent only begins once bwrap runs. Stdlib only; on any failure it exits 127 with one
line on stderr and bwrap never runs.

With `--parent`, it also leaves a watchdog behind (a grandchild, holding none of the sandbox's
descriptors, forked before the cgroups are joined) that waits on pidfds of bwrap, of P and of
the worker (`--worker W`, when P is not the worker). PR_SET_PDEATHSIG kills bwrap when P dies,
but bwrap's child, cloned into the new namespaces, only asks for its own death signal just before
it execs; if bwrap dies first (P killed while a sandbox starts), the child waits for ever on an
eventfd bwrap was to write. So when P or the worker dies while bwrap still runs, the watchdog
kills bwrap's process group (the child is still in it until its late setsid) and every process in
the sandbox's cgroups, then exits; when bwrap ends while both live, it just exits.

    python -I -S cgroup_enter.py --serve WORKER_PID CHANNEL_FD

The launcher (sandbox/launcher.py starts one per worker process): a Python start-up costs more than
all the rest of a sandbox's start, so the worker pays it once. This process, single-threaded, reads
requests from the worker on a SOCK_SEQPACKET socketpair only the worker holds the other end of (a
JSON message, its descriptors by SCM_RIGHTS) and forks for each: `spawn` is the wrapper above in a
fork (a new session, exactly the given descriptors at the given numbers, then `main` with this
process as P and the worker as W), answered with the pid and a pidfd of what became bwrap; `limit`
runs namespace_limits.LIMIT_NAMESPACES in a fork holding only its pipes and the sandbox's pidfd
(setns needs a single-threaded process, which a worker never is), answered with its exit status
and output. Every reply echoes its request's id. It exits when the worker does (a pidfd on it) or
closes the socket, which kills each bwrap it started (their death signal) and, through the
watchdogs, what that misses. It ignores the signals a terminal or a service manager sends a whole
group (SIGINT, SIGTERM, SIGHUP): its life is the worker's, and what it forks gets them back.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import select
import signal
import socket
import sys
import time
import types
from typing import NoReturn

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    try:
        split = argv.index("--")
    except ValueError:
        return _fail("usage: cgroup_enter.py [--uid U --gid G] PROCS_FILE... -- ARGV...")
    options, command = argv[:split], argv[split + 1 :]
    parent = worker = None
    if options[:1] == ["--parent"] and len(options) > 1:
        parent, options = int(options[1]), options[2:]
        worker = parent
    if options[:1] == ["--worker"] and len(options) > 1:  # the launcher: the parent is not the worker
        worker, options = int(options[1]), options[2:]
    ids = None
    if options[:1] == ["--uid"]:
        if len(options) < 4 or options[2] != "--gid":
            return _fail("--uid needs --gid")
        ids, options = (int(options[1]), int(options[3])), options[4:]
    if not command:
        return _fail("nothing to run")
    try:
        if parent is not None:  # before joining: the watchdog is no member of the cgroups it watches
            _leave_watchdog(sorted({parent, worker if worker is not None else parent}), options, ids)
        pid = str(os.getpid()).encode()
        for procs in options:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, pid)
            finally:
                os.close(fd)
        if ids is not None:
            _drop_to(ids)
        if parent is not None and not _dies_with(parent):
            return _fail(f"the worker (pid {parent}) is gone; not starting the sandbox")
        for number in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; what it execs must not
            signal.signal(number, signal.SIG_DFL)
        os.execv(command[0], command)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in an argument
        return _fail(f"cannot start the sandbox in its cgroup: {exc}")
    return 127  # not reached: execv replaced this process


def _dies_with(parent: int) -> bool:
    """SIGKILL this process (bwrap, once exec'd) when its parent dies; False if it already has."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return os.getppid() == parent


def _drop_to(ids: tuple[int, int]) -> None:
    os.setgroups([])
    os.setgid(ids[1])
    os.setuid(ids[0])


def _leave_watchdog(owners: list[int], procs_files: list[str], ids: tuple[int, int] | None) -> None:
    """Fork the watchdog (see the module docstring) as a grandchild, so bwrap never reaps it. It is
    forked before this process joins the sandbox's cgroups, so it never keeps them from emptying
    (a cgroup is removed at close only once no member is left), and drops to `ids` itself. The
    pidfds of `owners` are opened here, while this process's parent is known to live."""
    sandbox = os.getpid()  # this process, bwrap once exec'd: the leader of its own process group
    watched: list[int] = []
    for owner in owners:
        try:
            watched.append(os.pidfd_open(owner))
        except OSError:
            watched.append(-1)  # already gone
    child = os.fork()
    if child:
        for fd in watched:
            if fd >= 0:
                os.close(fd)
        os.waitpid(child, 0)
        return
    try:
        if os.fork():
            os._exit(0)
        if ids is not None:
            _drop_to(ids)
        _watch(sandbox, watched, procs_files)
    finally:
        os._exit(0)


def _watch(sandbox: int, owners: list[int], procs_files: list[str]) -> None:
    os.setsid()  # out of bwrap's process group, which it kills
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)  # never hold the sandbox's pipes: the worker reads EOF when bwrap ends
    kept = [fd for fd in owners if fd >= 0]
    for fd in range(3, os.sysconf("SC_OPEN_MAX") if not kept else max(kept) + 1):
        if fd not in kept:
            with contextlib.suppress(OSError):
                os.close(fd)
    if kept:
        os.closerange(max(kept) + 1, os.sysconf("SC_OPEN_MAX"))
    try:
        bwrap = os.pidfd_open(sandbox)
    except OSError:
        return  # bwrap is already gone
    if len(kept) == len(owners):  # every owner still lived when the wrapper started
        poller = select.poll()
        for fd in (bwrap, *kept):
            poller.register(fd, select.POLLIN)
        poller.poll()
        # An owner's death also kills bwrap (its death signal), so both may be ready at once: only a
        # sandbox that ended while its owners live needs nothing more.
        alone = select.poll()
        for fd in kept:
            alone.register(fd, select.POLLIN)
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


# ----------------------------------------------------------------------------- the launcher

MAX_MESSAGE = 1 << 20
MAX_FDS = 32


def serve(worker: int, channel: int) -> int:
    """The launcher's loop (see the module docstring); returns when the worker is gone."""
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the worker's to handle, not ours
        signal.signal(number, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])  # not the mask of whichever worker thread started us
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the poll: children are reaped below
    sock = socket.socket(fileno=channel)
    try:
        worker_fd = os.pidfd_open(worker)
    except OSError:
        return 0
    poller = select.poll()
    for fd in (sock.fileno(), worker_fd, wake_r):
        poller.register(fd, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll()}
        _reap()
        if worker_fd in ready:
            return 0
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        if sock.fileno() not in ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
        except OSError:
            return 0
        if not data:
            return 0  # the worker closed its end
        reply_fds: list[int] = []
        request: dict = {}
        try:
            request = json.loads(data)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
            if request.get("op") == "spawn":
                reply = _spawn(request, fds, worker)
                reply_fds = [reply.pop("pidfd")]
            elif request.get("op") == "limit":
                reply = _limit(request, fds, worker_fd)
            else:
                reply = {"error": f"unknown request {request.get('op')!r}"}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        reply["id"] = request.get("id") if isinstance(request, dict) else None
        try:
            socket.send_fds(sock, [json.dumps(reply).encode()], reply_fds)
        except OSError:
            return 0
        finally:
            for fd in reply_fds:
                os.close(fd)


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def _as_launched() -> None:
    """In a fork: the signal dispositions a freshly started process has (an ignored SIGINT would
    survive the exec into bwrap and the sandbox)."""
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(number, signal.SIG_DFL)


def _spawn(request: dict, fds: list[int], worker: int) -> dict:
    """Fork the wrapper: `fds` land at the numbers `request["fds"]` gives, then `main` runs."""
    targets = [int(n) for n in request["fds"]]
    argv = [str(a) for a in request["argv"]]
    if len(targets) != len(fds):
        raise ValueError(f"{len(fds)} descriptors came for {len(targets)} places")
    me = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: only os calls until main's execv
        code = 127
        try:
            _as_launched()
            os.setsid()
            _place(fds, targets)
            code = main(["--parent", str(me), "--worker", str(worker), *argv])
        finally:
            os._exit(code)
    return {"pid": pid, "pidfd": os.pidfd_open(pid)}


def _place(fds: list[int], targets: list[int]) -> None:
    """Put each of `fds` at its target number (inheritable), and close every other descriptor."""
    above = max([*targets, *fds, 2]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, above) for fd in fds]
    for fd, target in zip(moved, targets, strict=True):
        os.dup2(fd, target)  # dup2 leaves the new one inheritable
    keep = sorted(set(targets))
    low = 0
    for fd in keep:
        if fd > low:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


_compiled: dict[str, types.CodeType] = {}


def _limit(request: dict, fds: list[int], worker_fd: int) -> dict:
    """Run the namespace-limits script (its source in the request) in a fork against the pidfd sent.

    The fork holds nothing but its pipes on 1 and 2 and that pidfd on 3 before it enters the
    sandbox's namespaces. A fork that outlives its timeout (or the worker) is killed and left to
    `_reap`: the launcher never blocks on it.
    """
    if len(fds) != 1:
        raise ValueError("a limit request carries the sandbox's pidfd and nothing else")
    source = str(request["script"])
    code = _compiled.get(source)
    if code is None:
        code = _compiled[source] = compile(source, "<LIMIT_NAMESPACES>", "exec")
    config = dict(request["config"])
    config["pidfd"] = 3
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _run_limit_script(code, config, [out_w, err_w, fds[0]])  # never returns
    os.close(out_w)
    os.close(err_w)
    deadline = time.monotonic() + float(request.get("timeout", 30.0))
    output, why = _read_until_closed([out_r, err_r], worker_fd, deadline)
    for fd in (out_r, err_r):
        os.close(fd)
    if why:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        return {"returncode": -int(signal.SIGKILL), "stdout": "", "stderr": why}
    _, status = os.waitpid(pid, 0)  # both its pipes closed: it is exiting
    return {
        "returncode": os.waitstatus_to_exitcode(status),
        "stdout": output[out_r].decode(errors="replace"),
        "stderr": output[err_r].decode(errors="replace"),
    }


def _run_limit_script(code: types.CodeType, config: dict, fds: list[int]) -> NoReturn:
    """The limit fork: stdout, stderr and the pidfd (`fds`) on 1, 2 and 3, stdin /dev/null, then the
    script with its config as argv[1]; its exit status is the script's (1 for anything it raised)."""
    status = 1
    try:
        _as_launched()
        null = os.open(os.devnull, os.O_RDONLY)
        _place([null, *fds], [0, 1, 2, 3])
        sys.argv = ["limit", json.dumps(config)]
        try:
            exec(code, {"__name__": "__main__"})
            status = 0
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else 1
        except BaseException as exc:  # anything is the script's failure, told on stderr
            sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(status)


def _read_until_closed(fds: list[int], worker_fd: int, deadline: float) -> tuple[dict[int, bytes], str]:
    """Everything written on `fds` until each is closed; with why it stopped early ("timed out", or
    "the worker is gone" when `worker_fd` reads as closed), else ""."""
    output = {fd: b"" for fd in fds}
    open_fds = list(fds)
    why = ""
    while open_fds and not why:
        left = deadline - time.monotonic()
        readable = select.select([*open_fds, worker_fd], [], [], max(left, 0.0))[0] if left > 0 else []
        if worker_fd in readable:
            why = "the worker is gone"
        elif not readable:
            why = "timed out"
        for fd in readable:
            if fd == worker_fd:
                continue
            chunk = os.read(fd, 65536)
            if chunk:
                output[fd] += chunk
            else:
                open_fds.remove(fd)
    return output, why


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"] and len(sys.argv) == 4:
        sys.exit(serve(int(sys.argv[2]), int(sys.argv[3])))
    sys.exit(main(sys.argv[1:]))
