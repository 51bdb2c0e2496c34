"""Limits bwrap cannot set, set by the worker before anything of the job runs (sandbox/local.py,
`_limit_namespaces`): an inode bound on every writable tmpfs, the System V limits of the sandbox's
IPC namespace, a read-only /proc/sys; and what holds memory outside them (memfd).

They hold with or without cgroups (most tests force the rlimits-only path, where they matter most),
for a root worker (bwrap as an unprivileged host uid) and for a non-root one, and no process of the
sandbox has a capability at any time.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import local
from sandbox import namespace_limits as limits
from sandbox.base import ENV_DIR, SandboxLimits, SandboxSpec, SetupMounts
from sandbox.local import LocalOptions, LocalSandbox
from sandbox.namespace_limits import MIN_TMPFS_INODES, tmpfs_inodes
from sandbox.quantity import SHM_SIZE_BYTES
from tests.nonroot import NonRoot
from tests.sandbox.support import bash

pytestmark = pytest.mark.bwrap

MiB = 1024**2
CAP_LINES = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")


def kernel_allows_ipc_sysctls_for_non_root() -> bool:
    """Linux 6.9+ lets the root of an IPC namespace's user namespace (the sandbox's host uid) set them."""
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    return (major, minor) >= (6, 9)


def need_ipc_limits(sb: LocalSandbox) -> None:
    if sb.ipc_limited:
        return
    if os.geteuid() == 0 or kernel_allows_ipc_sysctls_for_non_root():
        pytest.fail(f"the sandbox's IPC limits should be set here: {sb.ipc_problem}")
    pytest.skip(sb.ipc_problem)


def capabilities(sb: LocalSandbox, pid: str) -> dict[str, str]:
    out = sb.run_command(f"grep -E '^Cap' /proc/{pid}/status", 30).log
    return dict(line.split(":\t") for line in out.splitlines())


# ------------------------------------------------------------------------------ capabilities


def test_no_sandbox_process_has_a_capability(sb: LocalSandbox) -> None:
    """The helper holds capabilities in the sandbox's namespaces, the sandbox's processes never do:
    neither the runner (pid 1, which ran the seed script) nor a command."""
    for pid in ("1", "self"):
        caps = capabilities(sb, pid)
        assert {name: caps[name] for name in CAP_LINES} == dict.fromkeys(CAP_LINES, "0000000000000000"), (pid, caps)


# ------------------------------------------------------------------------------ inodes


FILL = (
    'cd {folder} && set -- $(stat -f -c "%c %d" .) && n=0 && while : > "f$n"; do n=$((n+1)); done; '
    'echo "total=$1 free=$2 created=$n"'
)


@pytest.mark.parametrize("folder", ["/workspace", "/tmp", "/dev/shm"])
def test_creating_files_past_a_tmpfs_inode_bound_is_enospc(
    folder: str, workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    """Empty files take no space, so only the inode bound stops them (the kernel's default is
    millions, ~2 KiB of kernel memory each). Counted, not timed: a loop creates files until one fails."""
    sizes = {"/workspace": 64 * MiB, "/tmp": 48 * MiB, "/dev/shm": SHM_SIZE_BYTES}
    sb = make_sandbox(
        workspace, use_cgroups=False, workspace_size_bytes=64 * MiB, tmp_size_bytes=48 * MiB, bytes_per_inode=8192
    )
    expected = tmpfs_inodes(sizes[folder], 8192)
    assert expected == sizes[folder] // 8192 > MIN_TMPFS_INODES
    out = bash(sb, FILL.format(folder=folder), timeout=120)
    assert "No space left on device" in out, out
    numbers = dict(item.split("=") for item in out.split("STDOUT:\n")[1].split("\n")[0].split())
    assert int(numbers["total"]) == expected, out
    assert int(numbers["free"]) - 2 <= int(numbers["created"]) <= int(numbers["free"]), out
    assert bash(sb, f"cd {folder} && rm -f f* && : > again && echo ok").startswith("Exit code: 0\nSTDOUT:\nok\n")


def test_default_inode_bounds_follow_the_sizes(workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> None:
    sb = make_sandbox(workspace, use_cgroups=False, workspace_size_bytes=256 * MiB, tmp_size_bytes=32 * MiB)
    out = sb.run_command('for d in /workspace /tmp /dev/shm; do stat -f -c "$d %c" $d; done', 30).log
    totals = dict(line.split() for line in out.splitlines())
    assert totals == {
        "/workspace": str(256 * MiB // limits.BYTES_PER_INODE),
        "/tmp": str(MIN_TMPFS_INODES),  # 32 MiB / 16 KiB = 2048, under the floor
        "/dev/shm": str(max(MIN_TMPFS_INODES, SHM_SIZE_BYTES // limits.BYTES_PER_INODE)),
    }


def test_a_setup_sandboxs_environment_folder_has_an_inode_bound(ws_base: Path, workspace: Path) -> None:
    folders = {name: Path(tempfile.mkdtemp(prefix=f"setup-{name}-", dir=ws_base)) for name in ("files", "relay", "out")}
    for folder in folders.values():
        folder.chmod(0o755)
    setup = SetupMounts(
        env_size_bytes=96 * MiB, files=str(folders["files"]), relay=str(folders["relay"]), out=str(folders["out"])
    )
    sb = LocalSandbox(SandboxSpec(workspace=str(workspace), setup=setup), local=LocalOptions(use_cgroups=False))
    try:
        assert sb.run_command(f"stat -f -c %c {ENV_DIR}", 30).log.strip() == str(96 * MiB // limits.BYTES_PER_INODE)
    finally:
        sb.close()


def test_no_leftover_of_the_build_runs_while_the_host_reads_what_it_built(ws_base: Path, workspace: Path) -> None:
    """A build's background process could swap a folder for a link while the worker reads the sandbox's
    files over /proc/<pid>/root (issue 34 review): the runner kills every leftover first (`settle`)."""
    folders = {name: Path(tempfile.mkdtemp(prefix=f"setup-{name}-", dir=ws_base)) for name in ("files", "out")}
    for folder in folders.values():
        folder.chmod(0o755)
    setup = SetupMounts(env_size_bytes=32 * MiB, files=str(folders["files"]), relay=None, out=str(folders["out"]))
    sb = LocalSandbox(SandboxSpec(workspace=str(workspace), setup=setup), local=LocalOptions(use_cgroups=False))
    try:
        loop = f"while :; do mkdir -p {ENV_DIR}/z; rm -rf {ENV_DIR}/z; ln -sfn / {ENV_DIR}/z; sleep 0.01; done"
        started = sb.run_command(f"setsid sh -c {shlex.quote(loop)} >/dev/null 2>&1 < /dev/null & echo started",
                                 30)
        assert "started" in started.log
        child = sb._res.child
        assert child is not None

        def children() -> str:
            return "".join(Path(f"/proc/{child}/task/{task}/children").read_text()
                           for task in os.listdir(f"/proc/{child}/task"))

        assert children().strip(), "the leftover runs before the read"
        sb.collect_environment()
        assert children().strip() == "", "a leftover outlived the settle"
        got = folders["out"] / "z"
        assert not got.exists() or got.is_symlink(), "a link is kept as a link, never followed"
    finally:
        sb.close()


# ------------------------------------------------------------------------------ System V IPC


IPC_PROBE = textwrap.dedent(
    """
    import ctypes, errno, json
    libc = ctypes.CDLL(None, use_errno=True)
    IPC_PRIVATE, IPC_CREAT, MiB = 0, 0o1000, 1 << 20

    def until_refused(make):
        made = 0
        while make() >= 0:
            made += 1
            if made > 100000:
                return made, "none"
        return made, errno.errorcode[ctypes.get_errno()]

    names = ("shmmax", "shmall", "shmmni", "msgmni", "sem")
    sysctls = {name: open("/proc/sys/kernel/" + name).read().split() for name in names}
    try:
        open("/proc/sys/kernel/shmmax", "w").write("1")
        rewrite = "written"
    except OSError as exc:
        rewrite = errno.errorcode[exc.errno]
    over = libc.shmget(IPC_PRIVATE, ctypes.c_size_t(int(sysctls["shmmax"][0]) + 1), IPC_CREAT | 0o600)
    over = "made" if over >= 0 else errno.errorcode[ctypes.get_errno()]
    shm = until_refused(lambda: libc.shmget(IPC_PRIVATE, ctypes.c_size_t(8 * MiB), IPC_CREAT | 0o600))
    msg = until_refused(lambda: libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600))
    sem = until_refused(lambda: libc.semget(IPC_PRIVATE, 250, IPC_CREAT | 0o600))
    print(json.dumps({"sysctls": sysctls, "rewrite": rewrite, "over_shmmax": over, "shm": shm, "msg": msg, "sem": sem}))
    """
)


@pytest.mark.parametrize("use_cgroups", [False, True], ids=["rlimits-only", "cgroups"])
def test_system_v_ipc_is_bounded(use_cgroups: bool, workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> None:
    """A fresh IPC namespace allows unbounded shared memory and ~35 GiB of message queues; the
    sandbox's is bounded (shared memory to /dev/shm's size) and the sandbox cannot raise it."""
    sb = make_sandbox(workspace, use_cgroups=use_cgroups)
    need_ipc_limits(sb)
    result = sb.run_command(f"python3 -c {shlex.quote(IPC_PROBE)}", 60)
    assert result.exit_code == 0, result.log
    probe = json.loads(result.log)
    page = os.sysconf("SC_PAGE_SIZE")
    assert probe["sysctls"] == {
        "shmmax": [str(SHM_SIZE_BYTES)],
        "shmall": [str(SHM_SIZE_BYTES // page)],
        "shmmni": [str(limits.SYSV_SEGMENTS)],
        "msgmni": [str(limits.SYSV_MESSAGE_QUEUES)],
        "sem": limits.SYSV_SEMAPHORES.split(),
    }
    assert probe["rewrite"] == "EROFS"  # /proc/sys is read-only in the sandbox
    assert probe["over_shmmax"] == "EINVAL"
    assert probe["shm"] == [SHM_SIZE_BYTES // (8 * MiB), "ENOSPC"]  # 64 MiB in all
    assert probe["msg"] == [limits.SYSV_MESSAGE_QUEUES, "ENOSPC"]
    assert probe["sem"] == [128, "ENOSPC"]  # 32000 semaphores in all, 128 arrays


MAKE_IPC = textwrap.dedent(
    """
    import ctypes, sys, time
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    IPC_PRIVATE, IPC_CREAT, MiB = 0, 0o1000, 1 << 20
    shm = libc.shmget(IPC_PRIVATE, ctypes.c_size_t(8 * MiB), IPC_CREAT | 0o600)
    address = libc.shmat(shm, None, 0)
    ctypes.memset(address, 1, 8 * MiB)  # pages in memory, not just reserved
    if sys.argv[1] == "detach":
        libc.shmdt(ctypes.c_void_p(address))
    queue = libc.msgget(IPC_PRIVATE, IPC_CREAT | 0o600)
    message = (ctypes.c_long * 2)(1, 0x41)
    libc.msgsnd(queue, message, 1, 0)
    libc.semget(IPC_PRIVATE, 10, IPC_CREAT | 0o600)
    print("made", shm >= 0 and queue >= 0, flush=True)
    if sys.argv[1] == "stay":
        time.sleep(600)
    """
)
COUNT_IPC = "for k in shm msg sem; do echo $k $(($(wc -l < /proc/sysvipc/$k) - 1)); done"


@pytest.mark.parametrize("ipc_limited", [True, False], ids=["sysctls", "without-sysctls"])
def test_system_v_objects_do_not_outlive_the_call_that_made_them(
    ipc_limited: bool, workspace: Path, make_sandbox: Callable[..., LocalSandbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shared memory no process holds, message queues and semaphores stay until removed; before each
    command the runner removes them all (after killing the leftovers, so nothing uses them). This is
    the wall on kernels where a non-root worker cannot set the IPC sysctls (forced here)."""
    if not ipc_limited:
        monkeypatch.setattr(local, "ipc_sysctls", lambda: {"kernel/frogfix-no-such-sysctl": "1"})
    (workspace / "make_ipc.py").write_text(MAKE_IPC)
    sb = make_sandbox(workspace, use_cgroups=False)
    if ipc_limited:
        need_ipc_limits(sb)
    else:
        assert not sb.ipc_limited and "frogfix-no-such-sysctl" in sb.ipc_problem, sb.ipc_problem
    none = "shm 0\nmsg 0\nsem 0\n"
    for how in ("detach", "exit"):
        out = bash(sb, f"python3 make_ipc.py {how} && {COUNT_IPC}")
        assert "made True\nshm 1\nmsg 1\nsem 1\n" in out, out  # a detached segment survives its maker
        assert bash(sb, COUNT_IPC) == f"Exit code: 0\nSTDOUT:\n{none}\nSTDERR:\n"
    # A leftover still attached: killed before the next command, then its segment goes too.
    out = bash(sb, "nohup python3 make_ipc.py stay > made.txt 2>&1 & while ! grep -q made made.txt; do sleep 0.1; done")
    assert out.startswith("Exit code: 0"), out
    assert bash(sb, COUNT_IPC) == f"Exit code: 0\nSTDOUT:\n{none}\nSTDERR:\n"


# ------------------------------------------------------------------------------ memfd


MEMFD_HOLD = textwrap.dedent(
    """
    import errno, mmap, os, resource, signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    MiB = 1 << 20
    fsize = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    probe = os.memfd_create("probe")
    for grow in (lambda: os.ftruncate(probe, fsize + 1), lambda: os.pwrite(probe, b"x", fsize)):
        try:
            grow()
            print("past RLIMIT_FSIZE: allowed")
        except OSError as exc:
            print("past RLIMIT_FSIZE:", errno.errorcode[exc.errno])
    held = []
    for _ in range(int(os.environ["COUNT"])):
        fd = os.memfd_create("held")
        for _ in range(fsize // MiB):
            os.write(fd, b"\\1" * MiB)
        held.append(fd)
    print("held MiB", len(held) * fsize // MiB, flush=True)
    try:
        maps = [mmap.mmap(fd, fsize) for fd in held]
        print("mapped all")
    except OSError as exc:
        print("mapping them:", errno.errorcode[exc.errno])
    """
)


def test_without_cgroups_a_memfd_is_bounded_only_per_file(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    """Documents the real bound (docs/SECURITY.md): without a memory cgroup, memfd pages count in no
    limit of their holder. Each memfd stops at RLIMIT_FSIZE and a mapping of one counts in RLIMIT_AS,
    but one process holds as many as RLIMIT_NOFILE allows, unmapped: here 384 MiB against a 256 MiB
    RLIMIT_AS. With a memory cgroup, they are charged to it like every tmpfs page."""
    limits = SandboxLimits(memory_bytes=256 * MiB, file_size_bytes=32 * MiB, max_processes=64)
    sizes = {"workspace_size_bytes": 16 * MiB, "tmp_size_bytes": 16 * MiB}
    sb = make_sandbox(workspace, limits=limits, use_cgroups=False, **sizes)
    out = bash(sb, f"COUNT=12 python3 -c {shlex.quote(MEMFD_HOLD)}", timeout=120)
    assert out.count("past RLIMIT_FSIZE: EFBIG") == 2, out
    assert "held MiB 384" in out, out
    assert "mapping them: ENOMEM" in out, out


# ------------------------------------------------------------------------------ before the runner


def test_the_jobs_path_runs_nothing_before_the_runner(
    ws_base: Path, workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    """The job's PATH leads into its environment, which a setup phase wrote: a `cp` there must not
    run while the sandbox starts (it would hold the protocol pipes), only when a command calls it."""
    fake = Path(tempfile.mkdtemp(prefix="fakebin-", dir=ws_base))
    fake.chmod(0o755)
    (fake / "cp").write_text('#!/bin/sh\necho \'{"id": null, "ok": true, "forged": true}\'\nexit 1\n')
    (fake / "cp").chmod(0o755)
    (workspace / "kept.txt").write_text("copied by /bin/cp\n")
    sb = make_sandbox(workspace, ro_binds=[(str(fake), "/fakebin")], env={"PATH": "/fakebin:/usr/bin:/bin"})
    assert sb.run_command("cat kept.txt", 30).log == "copied by /bin/cp\n"
    assert "forged" in sb.run_command("cp kept.txt other.txt", 30).log  # the job's PATH is in effect for commands


# ------------------------------------------------------------------------------ non-root worker


UNPRIVILEGED_WORKER = textwrap.dedent(
    """
    import json, os, sys
    from sandbox.base import SandboxOptions, SandboxSpec
    from sandbox.local import LocalOptions, LocalSandbox
    options = SandboxOptions(workspace_size_bytes=64 << 20)
    sb = LocalSandbox(SandboxSpec(workspace=sys.argv[1]), options, LocalOptions(use_cgroups=False))
    probe = "stat -f -c %c /workspace; grep -hE '^Cap' /proc/1/status /proc/self/status; cat /proc/sys/kernel/shmmax"
    probe += "; echo 1 > /proc/sys/kernel/shmmax"
    out = sb.call_tool("Bash", {"command": probe})
    print(json.dumps({"uid": os.geteuid(), "ipc_limited": sb.ipc_limited, "problem": sb.ipc_problem, "out": out}))
    sb.close()
    """
)


def test_the_limits_hold_for_an_unprivileged_worker(nonroot: NonRoot) -> None:
    """The shipped worker is not root: it enters the namespaces it owns and sets the same limits."""
    workspace = nonroot.folder("kernel-limits-")
    result = nonroot.run_json(nonroot.script(UNPRIVILEGED_WORKER), str(workspace), timeout=120)
    out = result["out"]
    assert out.startswith(f"Exit code: 1\nSTDOUT:\n{64 * MiB // limits.BYTES_PER_INODE}\n"), out
    assert out.count("\t0000000000000000\n") == 2 * len(CAP_LINES), out
    assert "/proc/sys/kernel/shmmax: Read-only file system" in out, out
    if kernel_allows_ipc_sysctls_for_non_root():
        assert result["ipc_limited"] is True, result
        assert f"\n{SHM_SIZE_BYTES}\n" in out, out
    else:
        assert result["ipc_limited"] is False and "6.9" in result["problem"], result
