"""The local sandbox backend: bubblewrap around one long-lived `runner.py`.

Why it is built this way:
- One runner process per sandbox, spoken to over its stdin/stdout, so a tool call is one pipe
  round trip rather than a fresh bwrap+python start (which is what Leaf pays per call).
- Isolation comes from the kernel, not from the runner's checks: new user, pid, net, ipc, uts
  and cgroup namespaces; no network at all (`--unshare-net`: only a private loopback); the host
  system folders read-only; only the workspace (plus a small private /tmp and /dev/shm)
  writable; an environment built from nothing (bwrap is started with PATH only and `--clearenv`
  drops that too, so nothing of the worker's environment, its FROGFIX_* secrets included, reaches
  the runner or what it starts: they see only the `--setenv` values the job allows).
- Storage: the workspace and /tmp are tmpfs of fixed sizes (bwrap's `--size`, which works
  unprivileged inside the user namespace), so a write past them fails with ENOSPC and nothing the
  sandbox writes lands on the host's disk. The checkout is copied in at start from a read-only
  bind of the host's workspace; the host needs nothing back, the runner takes the patch inside.
  Every writable tmpfs also has an inode bound (`bytes_per_inode`): empty files take no space,
  but each is about 1-2 KiB of kernel memory, and a tmpfs's default allows millions of them.
- Limits bwrap cannot set (`_limit_namespaces`): before anything of the job runs, while the
  sandbox's first process waits for a line on its stdin (SEED_SCRIPT), the worker's launcher
  (sandbox/launcher.py) forks a helper as the sandbox's host uid (or root, for a root worker).
  That uid owns the user namespace bwrap made first, which owns the sandbox's mount and IPC
  namespaces (the sandbox's processes run one user namespace further down, without a single
  capability, and cannot make another). The helper enters them, sets the inode bounds (tmpfs
  reconfigured) and the IPC namespace's System V limits (`ipc_sysctls()`: a fresh IPC namespace
  allows unbounded shared memory, ~35 GiB of message queues and more of semaphores), and makes
  /proc/sys read-only (the sandbox's uid is its namespaces' root for sysctls on Linux 6.9+). The
  sandbox's processes cannot undo any of it: they have no capability and cannot gain one.
  Linux lets a non-root worker set IPC sysctls only from 6.9 on; before that (root workers can on
  any kernel) the sandbox runs without them (`ipc_limited` False). On every kernel the runner
  removes all System V objects between commands, after killing the leftovers (`--clear-ipc`).
- Cgroups (sandbox/cgroups.py), where the host allows: one per sandbox bounding the memory, tasks
  and CPU of all its processes; bwrap is started by the launcher's fork of the exec wrapper
  (sandbox/cgroup_enter.py), which joins it first, so no process of the sandbox is ever outside.
  The memory bound is `limits.memory_bytes` itself (FROGFIX_SANDBOX_MEMORY), one total for the
  processes *and* the tmpfs pages (workspace, /tmp, /dev/shm are RAM charged to the cgroup);
  settings refuse sizes that leave processes less than `quantity.PROCESS_FLOOR_BYTES` of it, so a
  full workspace is ENOSPC, not an OOM kill.
- Limits: the runner sets RLIMIT_NPROC/AS/FSIZE/CPU/CORE on itself *inside* the sandbox's user
  namespace, where the kernel counts processes per namespace, so a fork bomb is stopped by the
  sandbox's own budget. RLIMIT_NPROC never binds a uid that maps to host root, so when FrogFix
  runs as root, bwrap is started as an unprivileged host uid (`host_uid`, default 65534) and the
  workspace is handed to that uid while the sandbox is open and handed back on `close()`.
  Wall time is enforced here by a timer that kills the whole sandbox.
- The channel: the runner is the sandbox's pid 1 (`--as-pid-1`: no bubblewrap init inside, which
  would hold the protocol pipes as a plain process of the sandbox's uid) and makes itself
  non-dumpable before its first reply, so no sandboxed process can open its /proc/1/fd/*
  (stdin, stdout, stderr), its memory, ptrace it or take its descriptors with pidfd_getfd.
  Commands it starts inherit none of them. As init it also reaps orphans, and no signal sent
  from inside reaches it; the host kills it, and with it the whole pid namespace, by pidfd.
- Nothing on the host side reads or writes inside the workspace while the sandbox lives; the
  patch is taken by the runner, inside. `close()` waits until every sandboxed process is gone
  before handing the workspace back, and does so without following symlinks.

- Start-up: a sandbox starts and closes in about 55 ms (bench/harness_sandbox.py; 128 ms before).
  The worker's launcher pays Python's start-up once per worker process instead of twice per
  sandbox, the runner goes in compiled (`runner_client.compiled_runner`) and imports little, and
  close() waits for the cgroup to empty instead of sleeping.

bwrap's `--die-with-parent` ties a sandbox to its launcher, a single-threaded process that lives
as long as the worker process that started it: any thread of the worker may open, use and close
a sandbox.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any

from sandbox import cgroups
from sandbox.base import (
    DEFAULT_PATH,
    ENV_DIR,
    PROJECT_DIR,
    RELAY_DIR,
    SETUP_FILES_DIR,
    TOOLS_DIR,
    SandboxError,
    SandboxOptions,
    SandboxSpec,
    SandboxUnavailable,
)
from sandbox.environment_stream import PACK, receive_environment
from sandbox.launcher import LaunchedProcess, launcher
from sandbox.namespace_limits import BYTES_PER_INODE, LIMIT_NAMESPACES, ipc_sysctls, tmpfs_inodes
from sandbox.quantity import SHM_SIZE_BYTES
from sandbox.runner_client import (
    RunnerBroken,
    RunnerClient,
    StderrTail,
    compiled_runner,
    decode_reply,
    encode_request,
    read_runner_source,
)

SANDBOX_UID = 1000
SANDBOX_GID = 1000
DEFAULT_HOST_UID = 65534
DEFAULT_HOST_GID = 65534
MOUNT_POINT = "/workspace"
RUNNER_IN_SANDBOX = "/frogfix/runner.py"  # its source, or its bytecode (runner_client.compiled_runner)
SEED_IN_SANDBOX = "/frogfix/seed"  # the host workspace, read-only: copied into the sandbox's own at start
# Says it is ready (SEED_READY on the protocol's stdout), waits until the worker has set the limits
# bwrap cannot (SEED_GO on stdin, which `read` takes byte by byte, leaving the requests to the runner;
# EOF or anything else: stop), copies the checkout into the size-limited workspace $0, then becomes the
# runner (same pid).
# Only builtins and /bin/cp by its full path: the job's PATH leads into its environment, which a
# setup phase wrote, and nothing of that may run while the protocol pipes are open.
SEED_READY = b"frogfix-seed-ready\n"
SEED_GO = b"go\n"
SEED_SCRIPT = (
    'echo frogfix-seed-ready && read -r go && [ "$go" = go ] && '
    f'/bin/cp -a {SEED_IN_SANDBOX}/. "$0"/ && exec "$@"'
)
HOME_IN_SANDBOX = "/tmp/home"
SCRATCH_SIZE_BYTES = 256 * 1024**2  # each runner cache inside a read-only environment (checkout_scratch)
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What programs need from /etc, and nothing else: no host users, keys or service configs, and no
# /etc/gitconfig (CI hosts put `insteadOf` URLs with tokens there).
ETC_ENTRIES = (
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/ca-certificates.conf",
    "/etc/debian_version",
    "/etc/host.conf",
    "/etc/hosts",
    "/etc/inputrc",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/locale.alias",
    "/etc/localtime",
    "/etc/mime.types",
    "/etc/nsswitch.conf",
    "/etc/os-release",
    "/etc/pki",
    "/etc/python3",
    "/etc/python3.11",
    "/etc/python3.12",
    "/etc/python3.13",
    "/etc/ssl/certs",
    "/etc/ssl/openssl.cnf",
    "/etc/timezone",
)
PASSWD = (
    "root:x:0:0:root:/root:/usr/sbin/nologin\n"
    f"frogfix:x:{SANDBOX_UID}:{SANDBOX_GID}:FrogFix sandbox:{HOME_IN_SANDBOX}:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = f"root:x:0:\nfrogfix:x:{SANDBOX_GID}:\nnogroup:x:65534:\n"
# `bash -l` reads /etc/profile; the host's would reset PATH and drop what the job set.
PROFILE = "# FrogFix sandbox: a login shell keeps the environment the sandbox was started with.\numask 022\n"
# The cgroup's pids bound sits a little above RLIMIT_NPROC: the rlimit binds first inside (the
# runner's fork-bomb reclaim counts against it), the cgroup also counts bwrap outside the namespace
# and is the wall that holds if the rlimit does not.
PIDS_HEADROOM = 8
MAX_REPLY_BYTES = 512 * 1024**2
STDERR_TAIL_BYTES = 16 * 1024
_EOF = object()


@dataclass(frozen=True)
class LocalOptions:
    """What only the bubblewrap backend has, beside `base.SandboxOptions` (which both backends share).

    `python` runs the runner (None: python3 under /usr) and `bwrap` is bubblewrap (None: found on
    PATH). `ro_binds` adds read-only host paths (a path, or (host path, sandbox path)), e.g. a Python
    prefix the target's tests need. `host_uid`/`host_gid` apply only when FrogFix runs as root (None:
    DEFAULT_HOST_UID/GID). `use_cgroups`: one cgroup per sandbox where the host allows it (see
    sandbox/cgroups.py). Each writable tmpfs gets one inode per `bytes_per_inode` of its size (at
    least MIN_TMPFS_INODES): creating a file past that fails with ENOSPC too.
    """

    python: str | None = None
    bwrap: str | None = None
    ro_binds: Sequence[str | tuple[str, str]] = ()
    host_uid: int | None = None
    host_gid: int | None = None
    use_cgroups: bool = True
    bytes_per_inode: int = BYTES_PER_INODE


class LocalSandbox(RunnerClient):
    """A bubblewrap sandbox over one prepared workspace; implements `sandbox.base.Sandbox`.

    The runner protocol itself (requests, replies, tool calls, the patch) is `RunnerClient`'s;
    this class owns the sandbox's life: starting bwrap, its limits, killing it, the workspace.
    """

    def __init__(
        self, spec: SandboxSpec, options: SandboxOptions | None = None, local: LocalOptions | None = None
    ) -> None:
        """Start the sandbox and its runner; raises SandboxUnavailable if that cannot work here.

        The workspace and /tmp are tmpfs of `options.workspace_size_bytes` and `tmp_size_bytes` (a
        write past them fails with ENOSPC); with `local.use_cgroups` (where the host allows) all
        processes together get `options.cpus`, max_processes tasks and `limits.memory_bytes` of
        memory, which the tmpfs pages share (callers check the sizes fit: `quantity.check_local_memory`).
        """
        self.options = options = options or SandboxOptions()
        self.local = local = local or LocalOptions()
        super().__init__(spec.limits, options)
        self.spec = spec
        # Whether the sandbox's IPC namespace got `ipc_sysctls()` (see `_limit_namespaces`), and if not, why.
        self.ipc_limited = False
        self.ipc_problem = ""
        self.cgroup_limits = cgroups.CgroupLimits(
            memory_bytes=self.limits.memory_bytes,  # the one total: processes and in-RAM files together
            max_processes=self.limits.max_processes + PIDS_HEADROOM,
            cpus=options.cpus,
        )
        self._expired = False
        self._replies: queue.Queue[object] = queue.Queue()
        self._stderr = StderrTail(STDERR_TAIL_BYTES)
        self._res = _Resources()
        self._channel = _PipeChannel(self._res, self._replies)

        self.bwrap = _find_bwrap(local.bwrap)
        self.workspace = os.path.realpath(spec.workspace)
        if not os.path.isdir(self.workspace):
            raise SandboxError(f"workspace {spec.workspace} is not a directory")
        env = _sandbox_env(spec.env)
        self.python = _find_python(local.python)
        binds = _binds_with_python(env, spec.env, self.python, local.ro_binds)
        self.host_ids = _host_ids(self.workspace, local.host_uid, local.host_gid)
        runner_source = compiled_runner(self.python, read_runner_source(options.runner_script), RUNNER_IN_SANDBOX)

        # Runs once: on close(), or at interpreter exit if the caller never closed the sandbox.
        self._finalizer = weakref.finalize(self, _release, self._res)
        self._launch(env, binds + _environment_binds(spec), runner_source)
        self._start_wall_timer()

    def collect_environment(self) -> None:
        """The setup's `target`, read on the host through the sandbox's own root (/proc/<pid>/root) by
        the same stream and receiver as a pod's (sandbox/environment_stream.py): walked by descriptors,
        links kept and never followed, and the host stops at the setup's size. The runner first kills
        every other process of the sandbox (`settle`), so no leftover of the build changes the tree
        while it is read."""
        setup = self.spec.setup
        if setup is None:
            raise SandboxError("only a setup sandbox has an environment to collect")
        settled = self._request({"op": "settle"}, 60.0)
        if settled.get("left"):
            raise SandboxError(f"{settled['left']} processes of the build outlived the settle: nothing is read")
        with self._lock:
            self._check_usable()
            pid = self._res.child
            if pid is None or self._res.pidfd is None:
                raise SandboxError("the sandbox is not running")
            root = f"/proc/{pid}/root{setup.target}"
            argv = [sys.executable, "-I", "-S", "-B", "-c", PACK, root]
            with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as pack:
                assert pack.stdout is not None and pack.stderr is not None
                try:
                    signal.pidfd_send_signal(self._res.pidfd, 0)  # still the sandbox's process: the path is its root
                    receive_environment(pack.stdout, setup.out, setup.env_size_bytes)
                except BaseException:
                    pack.kill()
                    raise
                finally:
                    error = pack.stderr.read(4000).decode("utf-8", "replace").strip()
                    code = pack.wait()
            if code != 0:
                raise SandboxError(f"copying the built environment out of the sandbox failed (exit {code}): {error}")

    def __repr__(self) -> str:
        return f"<LocalSandbox {self.workspace} {self._state()}>"

    # ------------------------------------------------------------------------- internals

    def _release(self) -> None:
        """Kill every process of the sandbox and hand the workspace back."""
        self._finalizer()

    def _start_wall_timer(self) -> None:
        if math.isfinite(self.limits.wall_seconds) and self.limits.wall_seconds > 0:
            timer = threading.Timer(self.limits.wall_seconds, _on_wall_limit, args=(weakref.ref(self),))
            timer.daemon = True
            self._res.timer = timer
            timer.start()

    def _launch(self, env: dict[str, str], binds: list[tuple[str, str]], runner_source: bytes) -> None:
        """Hand the workspace to the sandbox's host uid (when running as root), then start; whatever
        fails on the way, what was taken is given back before the error goes on."""
        try:
            if self.host_ids is not None:
                st = os.lstat(self.workspace)
                self._res.workspace, self._res.owner = self.workspace, (st.st_uid, st.st_gid)
                _chown_tree(self.workspace, *self.host_ids)
                for src, _ in binds:
                    _check_reachable(src, *self.host_ids)
            self._start(env, binds, runner_source)
        except BaseException:
            self._closed = True
            self._finalizer()
            raise

    def _start(self, env: dict[str, str], binds: list[tuple[str, str]], runner_source: bytes) -> None:
        """Spawn bwrap with the runner inside (as its pid 1), set the limits bwrap cannot while the
        sandbox waits for them (SEED_SCRIPT), then wait for the runner's first ping."""
        start_timeout_s = self.options.start_timeout_s
        deadline = time.monotonic() + start_timeout_s
        fds: list[int] = []
        info_r, info_w = os.pipe()
        try:
            passwd, group, profile, runner = (
                _memfd("passwd", PASSWD.encode()),
                _memfd("group", GROUP.encode()),
                _memfd("profile", PROFILE.encode()),
                _memfd("runner", runner_source),
            )
            fds += [passwd, group, profile, runner, info_w]
            argv = self._bwrap_argv(env, binds, (passwd, group, profile, runner), info_w)
            self._res.proc = proc = launcher().spawn(self._in_cgroup(argv), pass_fds=fds)
        finally:
            for fd in fds:
                os.close(fd)
        assert proc.stdout is not None and proc.stderr is not None
        self._res.threads = [
            threading.Thread(target=_read_lines, args=(proc.stdout, self._replies), daemon=True),
            threading.Thread(target=self._stderr.drain, args=(proc.stderr,), daemon=True),
        ]
        for thread in self._res.threads:
            thread.start()
        try:
            child = _read_info(info_r, start_timeout_s)
        finally:
            os.close(info_r)
        if child is None:
            raise self._unavailable("bwrap did not start the sandbox")
        with contextlib.suppress(ProcessLookupError):
            self._res.pidfd = os.pidfd_open(child)
            self._res.child = child
        try:
            ready = self._replies.get(timeout=max(deadline - time.monotonic(), 0.1))
        except queue.Empty:
            ready = None
        if self._res.pidfd is None or ready != SEED_READY:
            raise self._unavailable("the sandbox did not start")
        self._limit_namespaces(child, self._tmpfs(), deadline - time.monotonic())
        channel = self._channel
        assert isinstance(channel, _PipeChannel)
        try:
            channel.send_raw(SEED_GO)  # the sandbox goes on: the seed copy, then the runner
            self.runner_info = self._request({"op": "ping"}, start_timeout_s)
        except SandboxError as exc:
            raise SandboxUnavailable(f"the sandbox runner did not start: {exc}") from None

    def _tmpfs(self) -> list[tuple[str, int]]:
        """The sandbox's writable tmpfs and their sizes (all made by `_bwrap_argv`)."""
        workspace, tmp = self.options.workspace_size_bytes, self.options.tmp_size_bytes
        mounts = [(MOUNT_POINT, workspace), ("/tmp", tmp), ("/dev/shm", SHM_SIZE_BYTES)]
        if self.spec.setup is not None:
            mounts.append((self.spec.setup.target, self.spec.setup.env_size_bytes))
        return mounts

    def _limit_namespaces(self, child: int, tmpfs: list[tuple[str, int]], timeout: float) -> None:
        """Run LIMIT_NAMESPACES (see the module docstring) while the sandbox's first process waits.

        The inode bounds and the read-only /proc/sys must hold, or the sandbox does not start. The
        System V limits are set where the kernel allows it (root: any kernel; the host uid: Linux
        6.9+); otherwise `ipc_limited` stays False and `ipc_problem` says why (the runner's removal
        between commands is then the only wall).
        """
        assert self._res.pidfd is not None
        config = {
            "pid": child,
            "pidfd": self._res.pidfd,
            "ids": list(self.host_ids) if self.host_ids is not None else None,
            "inodes": [[path, tmpfs_inodes(size, self.local.bytes_per_inode)] for path, size in tmpfs],
            "sysctls": [[name, value] for name, value in ipc_sysctls().items()],
        }
        returncode, stdout, stderr = launcher().limit_namespaces(
            LIMIT_NAMESPACES, config, self._res.pidfd, max(timeout, 1.0)
        )
        if returncode != 0:
            needs = " (Linux 5.2 or later needed)" if returncode > 0 else ""  # not when it was killed
            raise SandboxUnavailable(f"cannot set the sandbox's inode bounds{needs}: {stderr.strip()}")
        result = json.loads(stdout)
        self.ipc_limited = result["ipc"] is True
        if not self.ipc_limited:
            self.ipc_problem = (
                f"the sandbox's System V limits are not set ({result.get('problem')}): a non-root worker "
                "needs Linux 6.9 or later for them"
            )

    def _in_cgroup(self, argv: list[str]) -> list[str]:
        """bwrap's argv behind the wrapper's options: the launcher's fork joins the sandbox's cgroups
        where the host gives them, drops to `host_ids` and leaves a watchdog for the worker's death
        (see sandbox/cgroup_enter.py)."""
        cgroup = cgroups.create(self.cgroup_limits, cgroups.host_support()) if self.local.use_cgroups else None
        self._res.cgroup = cgroup
        return cgroups.wrapper_options(argv, self.host_ids, cgroup.procs_files() if cgroup is not None else [])

    def _bwrap_argv(
        self,
        env: dict[str, str],
        binds: list[tuple[str, str]],
        memfds: tuple[int, int, int, int],
        info_fd: int,
    ) -> list[str]:
        """bwrap's command line: the namespaces, the read-only host view, the writable workspace
        and the runner (see the module docstring for why each part is there)."""
        passwd, group, profile, runner = memfds
        argv = [self.bwrap]
        argv += ["--unshare-user", "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
        argv += ["--unshare-cgroup-try", "--disable-userns", "--as-pid-1"]
        argv += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID), "--hostname", "frogfix-sandbox"]
        argv += ["--die-with-parent", "--new-session", "--clearenv"]
        for key, value in env.items():
            argv += ["--setenv", key, value]
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        for path in ETC_ENTRIES:
            if os.path.exists(path):
                argv += ["--ro-bind", path, path]
        for fd, dest in ((passwd, "/etc/passwd"), (group, "/etc/group"), (profile, "/etc/profile")):
            argv += ["--perms", "0644", "--ro-bind-data", str(fd), dest]
        for src, dest in binds:
            argv += ["--ro-bind", src, dest]
        setup = self.spec.setup
        if setup is not None:  # an empty, size-bounded folder to fill (read by collect_environment)
            argv += ["--size", str(setup.env_size_bytes), "--tmpfs", setup.target]
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--size", str(SHM_SIZE_BYTES), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        argv += ["--size", str(self.options.tmp_size_bytes), "--tmpfs", "/tmp", "--dir", HOME_IN_SANDBOX]
        argv += ["--size", str(self.options.workspace_size_bytes), "--tmpfs", MOUNT_POINT]
        for src, relative in _checkout_binds(self.spec):
            argv += ["--ro-bind", src, f"{MOUNT_POINT}/{relative}"]
        for relative in self.spec.checkout_scratch:  # checked with the binds
            argv += ["--size", str(SCRATCH_SIZE_BYTES), "--tmpfs", f"{MOUNT_POINT}/{relative}"]
        argv += ["--ro-bind", self.workspace, SEED_IN_SANDBOX]
        argv += ["--perms", "0644", "--ro-bind-data", str(runner), RUNNER_IN_SANDBOX]
        argv += ["--remount-ro", "/", "--chdir", MOUNT_POINT, "--info-fd", str(info_fd)]
        argv += ["--", "/bin/sh", "-c", SEED_SCRIPT, MOUNT_POINT]
        argv += [self.python, "-I", "-S", "-B", RUNNER_IN_SANDBOX, "--root", MOUNT_POINT]
        argv += ["--limits", json.dumps(self._rlimits()), "--reclaim", "--clear-ipc"]
        argv += ["--default-timeout", repr(float(self.limits.default_tool_timeout))]
        return argv

    def _rlimits(self) -> dict[str, int]:
        limits = self.limits
        rlimits = {
            "nproc": int(limits.max_processes),
            "as": int(limits.memory_bytes),
            "fsize": int(limits.file_size_bytes),
            "core": 0,
        }
        if math.isfinite(limits.wall_seconds):  # no process may burn more CPU than the wall limit
            rlimits["cpu"] = max(1, math.ceil(limits.wall_seconds))
        return rlimits

    def _broken(self, message: str) -> SandboxError:
        """Mark the sandbox unusable, kill it, and build the error for the caller to raise. The
        stderr tail is read once the processes are gone and their stderr drained: read earlier, it
        could end mid-line (a runner that exits leaves the rest of its last words in the pipe)."""
        if self._expired:
            message = f"the sandbox reached its wall-clock limit of {self.limits.wall_seconds:g}s"
        self._dead = message
        self._kill()
        if not self._expired:
            for thread in self._res.threads[1:]:  # the stderr drain ends at EOF, now that all are gone
                thread.join(timeout=2)
            tail = self._stderr.text()
            if tail:
                message = self._dead = f"{message}; stderr: {tail}"
        return SandboxError(message)

    def _unavailable(self, message: str) -> SandboxUnavailable:
        proc = self._res.proc
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
        for thread in self._res.threads[1:]:
            thread.join(timeout=2)
        tail = self._stderr.text()
        return SandboxUnavailable(f"{message}: {tail}" if tail else message)

    def _kill(self) -> None:
        _kill(self._res)


class _PipeChannel:
    """The runner channel over bwrap's stdin/stdout: a request line out, the next reply line in
    (read by a thread into `replies`, so a wait can time out)."""

    def __init__(self, res: _Resources, replies: queue.Queue[object]) -> None:
        self._res = res
        self._replies = replies

    def send_raw(self, data: bytes) -> None:
        proc = self._res.proc
        assert proc is not None and proc.stdin is not None
        try:
            proc.stdin.write(data)
            proc.stdin.flush()
        except (OSError, ValueError) as exc:
            raise RunnerBroken(f"cannot write to the sandbox runner ({exc})") from None

    def exchange(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.send_raw(encode_request(request))
        try:
            item = self._replies.get(timeout=timeout)
        except queue.Empty:
            raise RunnerBroken(f"the sandbox runner did not answer within {timeout:.0f}s") from None
        if item is _EOF:
            raise RunnerBroken("the sandbox runner exited")
        if isinstance(item, BaseException):
            raise RunnerBroken(f"cannot read from the sandbox runner ({item})")
        assert isinstance(item, bytes)
        return decode_reply(item, request["id"])


def _on_wall_limit(ref: weakref.ReferenceType[LocalSandbox]) -> None:
    sandbox = ref()
    if sandbox is not None:
        sandbox._expired = True
        sandbox._dead = f"the sandbox reached its wall-clock limit of {sandbox.limits.wall_seconds:g}s"
        sandbox._kill()


class _Resources:
    """What a sandbox holds on the host; kept apart from LocalSandbox so a finalizer can free it."""

    def __init__(self) -> None:
        self.proc: LaunchedProcess | None = None
        self.pidfd: int | None = None
        self.child: int | None = None  # the sandbox's first process (its pid 1), on the host
        self.threads: list[threading.Thread] = []
        self.timer: threading.Timer | None = None
        self.cgroup: cgroups.SandboxCgroup | None = None
        self.workspace = ""
        self.owner: tuple[int, int] | None = None
        self.lock = threading.Lock()  # the wall-clock timer may kill while close() releases


def _kill(res: _Resources) -> None:
    """SIGKILL bwrap's process group and the sandbox's init (the runner), then wait until all are gone."""
    with res.lock:
        _kill_locked(res)


def _kill_locked(res: _Resources) -> None:
    proc = res.proc
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if res.pidfd is not None:
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(res.pidfd, signal.SIGKILL)
        # The pid namespace's init exits only after every process in it has: once its pidfd is
        # readable, nothing sandboxed is left running.
        select.select([res.pidfd], [], [], 10.0)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
    if res.cgroup is not None:  # catches anything the above missed, then the cgroup goes
        res.cgroup.kill_and_remove()


def _release(res: _Resources) -> None:
    """Stop the timer, kill everything, close our ends, hand the workspace back."""
    if res.timer is not None:
        res.timer.cancel()
    _kill(res)
    for thread in res.threads:
        thread.join(timeout=5)
    proc = res.proc
    if proc is not None:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        with res.lock:
            proc.close()
    with res.lock:
        if res.pidfd is not None:
            os.close(res.pidfd)
            res.pidfd = None
    if res.owner is not None:
        owner, res.owner = res.owner, None
        _chown_tree(res.workspace, *owner, strip_setid=True)


# ----------------------------------------------------------------------------- helpers


def _read_lines(stream: IO[bytes], replies: queue.Queue[object]) -> None:
    """Reader thread: one reply line at a time, bounded, so a runner gone wrong cannot flood us."""
    try:
        while True:
            line = stream.readline(MAX_REPLY_BYTES + 1)
            if not line:
                replies.put(_EOF)
                return
            if len(line) > MAX_REPLY_BYTES:
                replies.put(ValueError(f"reply line longer than {MAX_REPLY_BYTES} bytes"))
                return
            replies.put(line)
    except (OSError, ValueError) as exc:
        replies.put(exc)


def _read_info(fd: int, timeout: float) -> int | None:
    """The host pid of the sandbox's init (the runner), from bwrap's --info-fd JSON; None if bwrap failed."""
    data = b""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
        with contextlib.suppress(ValueError):
            info = json.loads(data)
            if isinstance(info, dict) and isinstance(info.get("child-pid"), int):
                return int(info["child-pid"])
    return None


def _find_bwrap(explicit: str | None) -> str:
    path = explicit or shutil.which("bwrap") or shutil.which("bwrap", path="/usr/bin:/usr/local/bin:/bin")
    if not path or not os.access(path, os.X_OK):
        where = f" at {explicit}" if explicit else ""
        raise SandboxUnavailable(
            f"bubblewrap (bwrap) is not installed{where}; the local sandbox needs it: "
            "apt-get install bubblewrap (FrogFix never runs a job unsandboxed)"
        )
    return path


def _find_python(explicit: str | None) -> str:
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise SandboxUnavailable(f"python {explicit} is not an executable")
        return os.path.abspath(explicit)
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise SandboxUnavailable("no python3 under /usr for the sandbox runner; pass python= and ro_binds=")


def _python_prefix(python: str) -> str | None:
    """The folder to bind read-only when the runner's python lives outside the system dirs."""
    real = os.path.realpath(python)
    if _under_system_dirs(python) and _under_system_dirs(real):
        return None
    return os.path.dirname(os.path.dirname(real))


def _under_system_dirs(path: str) -> bool:
    return any(path.startswith(folder + "/") for folder in SYSTEM_DIRS)


def _binds_with_python(
    env: dict[str, str], extra: dict[str, str], python: str, ro_binds: Iterable[str | tuple[str, str]]
) -> list[tuple[str, str]]:
    """The extra read-only binds plus the runner's Python prefix when it lives outside the system
    folders (then also first on PATH in `env`, unless the job set PATH itself)."""
    binds = [_bind_pair(item) for item in ro_binds]
    prefix = _python_prefix(python)
    if prefix is not None:
        binds.append((prefix, prefix))
        env["PATH"] = env["PATH"] if "PATH" in extra else f"{os.path.dirname(python)}:{env['PATH']}"
    return binds


def _environment_binds(spec: SandboxSpec) -> list[tuple[str, str]]:
    """The read-only binds of a built environment and the job's project layer, and of a setup phase's
    files, relay and tools."""
    binds = []
    if spec.environment is not None:
        binds.append(_bind_pair((os.path.realpath(spec.environment), ENV_DIR)))
    if spec.project is not None:
        binds.append(_bind_pair((os.path.realpath(spec.project), PROJECT_DIR)))
    setup = spec.setup
    if setup is None:
        return binds
    if (setup.target == ENV_DIR and spec.environment is not None) or (setup.target == PROJECT_DIR and spec.project):
        raise SandboxError(f"the setup phase fills {setup.target}: it cannot also be bound there")
    binds.append(_bind_pair((setup.files, SETUP_FILES_DIR)))
    if setup.relay is not None:
        binds.append(_bind_pair((setup.relay, RELAY_DIR)))
    return binds + [_bind_pair((src, f"{TOOLS_DIR}/{name}")) for name, src in setup.tools]


def _checkout_binds(spec: SandboxSpec) -> list[tuple[str, str]]:
    """The environment's folders laid over the workspace (real folders) and scratch folders: plain relative paths."""
    for relative in [rel for _, rel in spec.checkout_binds] + list(spec.checkout_scratch):
        if relative.startswith("/") or any(part in ("", ".", "..") for part in relative.split("/")):
            raise SandboxError(f"a folder laid over the checkout must be a plain relative path, got {relative!r}")
    if any(not os.path.isdir(src) or os.path.islink(src) for src, _ in spec.checkout_binds):
        raise SandboxError("a folder laid over the checkout is missing from the environment")
    return [(os.path.realpath(src), relative) for src, relative in spec.checkout_binds]


def _host_ids(workspace: str, host_uid: int | None, host_gid: int | None) -> tuple[int, int] | None:
    """The unprivileged host uid/gid bwrap runs as when FrogFix runs as root (None otherwise)."""
    if os.geteuid() != 0:
        return None
    uid = DEFAULT_HOST_UID if host_uid is None else host_uid
    gid = DEFAULT_HOST_GID if host_gid is None else host_gid
    if uid == 0:
        raise SandboxError("host_uid 0 would let the sandbox escape its process limit")
    _check_reachable(workspace, uid, gid)
    return uid, gid


def _bind_pair(item: str | tuple[str, str]) -> tuple[str, str]:
    src, dest = (item, item) if isinstance(item, str) else item
    if not os.path.isabs(src) or not os.path.isabs(dest):
        raise ValueError(f"read-only binds need absolute paths, got {item!r}")
    if not os.path.exists(src):
        raise SandboxError(f"read-only bind {src} does not exist")
    return src, dest


def _sandbox_env(extra: dict[str, str]) -> dict[str, str]:
    """A minimal PATH/HOME/LANG plus what the job allows, and never a FrogFix setting."""
    env = {"PATH": DEFAULT_PATH, "HOME": HOME_IN_SANDBOX, "LANG": "C.UTF-8"}
    for key, value in extra.items():
        if not key or "=" in key or "\0" in key or "\0" in str(value):
            raise ValueError(f"invalid environment variable for the sandbox: {key!r}")
        if key.upper().startswith("FROGFIX_"):
            raise ValueError(f"{key}: FrogFix settings (tokens, secrets) never enter a sandbox")
        env[key] = str(value)
    return env


def _memfd(name: str, data: bytes) -> int:
    """An anonymous file bwrap copies into the sandbox, so the sandbox uid needs no host path."""
    fd = os.memfd_create(f"frogfix-{name}", os.MFD_CLOEXEC)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _check_reachable(workspace: str, uid: int, gid: int) -> None:
    """bwrap runs as `uid` and opens the workspace by path: every folder above must let it pass."""
    folder = os.path.dirname(workspace)
    while True:
        st = os.stat(folder)
        if st.st_uid == uid:
            bit = stat.S_IXUSR
        elif st.st_gid == gid:
            bit = stat.S_IXGRP
        else:
            bit = stat.S_IXOTH
        if not st.st_mode & bit:
            raise SandboxError(
                f"the sandbox's host uid {uid} cannot reach the workspace: {folder} is not searchable "
                f"(chmod o+x {folder}, or keep workspaces under a folder with mode 0711)"
            )
        if folder == "/":
            return
        folder = os.path.dirname(folder)


def _chown_tree(root: str, uid: int, gid: int, strip_setid: bool = False) -> None:
    """Give every entry under `root` to uid:gid without following a single symlink."""

    def visit(path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.lchown(path, uid, gid)
            if strip_setid:
                mode = os.lstat(path).st_mode
                if stat.S_ISREG(mode) and mode & (stat.S_ISUID | stat.S_ISGID):
                    os.chmod(path, stat.S_IMODE(mode) & ~(stat.S_ISUID | stat.S_ISGID))

    visit(root)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            visit(os.path.join(folder, name))
