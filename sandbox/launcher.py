"""The worker's side of the sandbox launcher: one long-lived helper per worker process.

Every local sandbox used to pay two Python start-ups before its own runner's: the exec wrapper
that joins the cgroups (`cgroup_enter.py`), and the helper that sets the namespace limits
(`namespace_limits.LIMIT_NAMESPACES`), each ~10 ms of a ~120 ms start. Neither can be a thread or
a `preexec_fn` of the worker (joining before bwrap's first instruction, and `setns` into a user
namespace, need a single-threaded process). So the worker starts `cgroup_enter.py --serve` once,
and that process forks for each request (see its docstring): same walls, same code, a fork
instead of an interpreter.

The launcher belongs to the process that started it: after a fork (a prefork pool's child) the
child forgets it (`os.register_at_fork`) and starts its own. It watches that process with a
pidfd and exits with it; bwrap dies with the launcher (its death signal), and each sandbox's
watchdog (which watches both the launcher and the worker) kills what that misses. A launcher that
died is started again at the next request, and took the sandboxes it started with it; a request
it cannot answer is `SandboxUnavailable`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import select
import socket
import subprocess
import sys
import threading
from typing import IO, Any

from sandbox.base import SandboxUnavailable
from sandbox.cgroups import ENTER_SCRIPT

MAX_REPLY = 1 << 20
REPLY_TIMEOUT_S = 60.0


class LaunchedProcess:
    """What the launcher started (bwrap behind the wrapper), as much of `subprocess.Popen` as a
    sandbox uses: its pid (the leader of its own process group), its pipes, and its end, read
    from a pidfd (it is the launcher's child, not ours, so there is no exit status to read)."""

    def __init__(self, pid: int, pidfd: int, stdin: IO[bytes], stdout: IO[bytes], stderr: IO[bytes]) -> None:
        self.pid = pid
        self.pidfd = pidfd
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self._ended = False

    def poll(self) -> bool | None:
        """True once it has ended, None while it runs (Popen's None-while-running shape)."""
        return True if self._wait(0) else None

    def wait(self, timeout: float) -> None:
        """Wait until it ends; `subprocess.TimeoutExpired` if it runs on past `timeout`."""
        if not self._wait(timeout):
            raise subprocess.TimeoutExpired(f"sandbox process {self.pid}", timeout)

    def close(self) -> None:
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1

    def _wait(self, timeout: float) -> bool:
        if self._ended or self.pidfd < 0:
            return True
        self._ended = _readable(self.pidfd, timeout)
        return self._ended


def _readable(fd: int, timeout: float) -> bool:
    """Whether `fd` becomes readable within `timeout` seconds (poll: any descriptor number)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0, math.ceil(timeout * 1000))))


class Launcher:
    """A connection to this process's launcher (started at the first request)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._next_id = 0
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a fork's child: the parent's launcher is not ours (a lock another thread held at the
        fork would never be released here, and the socket is the parent's)."""
        self._lock = threading.Lock()
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.close()  # our copy only: the parent's connection stays open
        self._sock = self._proc = None

    def spawn(self, argv: list[str], pass_fds: list[int]) -> LaunchedProcess:
        """Start `argv` (the wrapper's options, then `--`, then bwrap's argv) in a new session with
        fresh pipes on 0, 1 and 2 and `pass_fds` at their own numbers (the memfds and the info
        pipe bwrap's argv names)."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        ours = [stdin_w, stdout_r, stderr_r]
        try:
            reply, fds = self._ask({"op": "spawn", "argv": argv, "fds": [0, 1, 2, *pass_fds]},
                                   [stdin_r, stdout_w, stderr_w, *pass_fds])
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        if len(fds) != 1 or not isinstance(reply.get("pid"), int):
            for fd in [*fds, *ours]:
                os.close(fd)
            raise SandboxUnavailable(f"the sandbox launcher could not start bwrap: {reply.get('error', reply)}")
        return LaunchedProcess(
            reply["pid"], fds[0], os.fdopen(stdin_w, "wb"), os.fdopen(stdout_r, "rb"), os.fdopen(stderr_r, "rb")
        )

    def limit_namespaces(self, script: str, config: dict[str, Any], pidfd: int, timeout: float) -> tuple[int, str, str]:
        """Run `script` (LIMIT_NAMESPACES) with `config` against the sandbox whose pidfd is `pidfd`;
        its exit status, stdout and stderr."""
        reply, fds = self._ask({"op": "limit", "script": script, "config": config, "timeout": timeout}, [pidfd],
                               timeout + REPLY_TIMEOUT_S)
        for fd in fds:
            os.close(fd)
        if "returncode" not in reply:
            raise SandboxUnavailable(f"the sandbox launcher could not set the namespace limits: {reply.get('error')}")
        return int(reply["returncode"]), str(reply["stdout"]), str(reply["stderr"])

    def close(self) -> None:
        """Stop the launcher (every sandbox it started dies with it)."""
        with self._lock:
            self._stop()

    # ------------------------------------------------------------------------- internals

    def _ask(
        self, request: dict[str, Any], fds: list[int], timeout: float = REPLY_TIMEOUT_S
    ) -> tuple[dict[str, Any], list[int]]:
        """One request and its reply. Anything that interrupts the exchange (a timeout, a soft
        time limit's exception, Ctrl-C) ends this launcher: a reply left unread would answer the
        next request."""
        with self._lock:
            sock = self._connected()
            self._next_id += 1
            request = {**request, "id": self._next_id}
            got: list[int] = []
            try:
                socket.send_fds(sock, [json.dumps(request).encode()], fds)
                if not _readable(sock.fileno(), timeout):
                    raise OSError(f"no answer within {timeout:.0f}s")
                reply, got, _, _ = socket.recv_fds(sock, MAX_REPLY, 4)
                for fd in got:
                    os.set_inheritable(fd, False)  # SCM_RIGHTS gives them without close-on-exec
                if not reply:
                    raise OSError("it exited")
                answer = json.loads(reply)
                if not isinstance(answer, dict) or answer.get("id") != request["id"]:
                    raise OSError(f"it answered {reply[:200]!r} to request {request['id']}")
            except BaseException as exc:
                for fd in got:
                    os.close(fd)
                why = self._stop()
                if isinstance(exc, (OSError, ValueError)):
                    raise SandboxUnavailable(f"the sandbox launcher failed ({exc}){why}") from None
                raise
        return answer, got

    def _connected(self) -> socket.socket:
        if self._sock is not None and self._proc is not None and self._proc.poll() is None:
            return self._sock
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", ENTER_SCRIPT, "--serve", str(os.getpid()), str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,  # (its own failures go to the worker's stderr)
                env={"PATH": "/usr/bin:/bin"},
                cwd="/",
                start_new_session=True,  # a terminal's or a process group's signal is the worker's
            )
        except OSError as exc:
            ours.close()
            raise SandboxUnavailable(f"cannot start the sandbox launcher: {exc}") from exc
        finally:
            theirs.close()
        self._sock = ours
        return ours

    def _stop(self) -> str:
        """Close our end and wait for the launcher to go; what its exit says, for an error."""
        sock, proc = self._sock, self._proc
        self._sock = self._proc = None
        if sock is not None:
            sock.close()
        if proc is None:
            return ""
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        return f"; it exited with {proc.returncode}" if proc.returncode else ""


_launcher = Launcher()


def launcher() -> Launcher:
    """This process's launcher."""
    return _launcher
