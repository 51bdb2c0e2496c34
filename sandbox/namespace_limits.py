"""The limits of a local sandbox that bubblewrap cannot set, and the helper that sets them.

An inode bound on each writable tmpfs, and System V limits in the sandbox's own IPC namespace, set
by `LIMIT_NAMESPACES` (a stdlib-only script local.py runs as the owner of the sandbox's first user
namespace, before anything of the job starts); see local.py's docstring for why and how. Imports
only the standard library and `sandbox.quantity`.
"""

from __future__ import annotations

import os

from sandbox.quantity import SHM_SIZE_BYTES

# Inodes of each writable tmpfs: one per BYTES_PER_INODE of its size, never fewer than MIN_TMPFS_INODES.
# (The kernel's default is half the host's RAM pages, millions; each inode is about 1 KiB of slab
# plus a dentry that no tmpfs size counts, so at 16 KiB an inode they cost at most ~1/8 of the size.)
BYTES_PER_INODE = 16 * 1024
MIN_TMPFS_INODES = 4096
# System V limits of the sandbox's own IPC namespace (a fresh one starts with the kernel's defaults:
# shared memory unbounded, 32000 message queues of up to 16384 messages, ~1.1 MiB of kernel memory
# each, 32000 semaphore arrays). With these: shared memory at most /dev/shm's size in all, in at most
# 128 segments; 32 queues (~36 MiB); 32000 semaphores in 128 arrays (~2.3 MiB).
SYSV_SEGMENTS = 128
SYSV_MESSAGE_QUEUES = 32
SYSV_SEMAPHORES = "32000 32000 500 128"  # kernel.sem: per array, in all, per semop call, arrays
# The helper `_limit_namespaces` has the worker's launcher run in a fork of itself (stdlib only,
# single-threaded as setns needs; cgroup_enter.py `_limit`):
# argv[1] is its JSON config; it prints {"ipc": true} or {"ipc": false, "problem": ...}, and exits 1
# with one line on stderr when the inode bounds cannot be set. Not root: as the owner of the sandbox's
# first user namespace it enters it (every capability there, none outside), then the IPC and mount
# namespaces. Root: it has those rights already, and on Linux 6.9+ acts as the host uid for the sysctls
# (they belong to the namespace's root, that uid). The sysctls are written through a private clone of
# the sandbox's /proc mount without its submounts (never attached anywhere), so a read-only cover on
# /proc/sys (which bwrap 0.8 does not add, as /proc/sys is mode 0555) would not stop them. Then it
# covers /proc/sys with a read-only bind: from 6.9 on the sandbox's own uid is its namespaces' root
# for sysctls and could otherwise undo the limits. Syscall numbers are the same on x86_64 and arm64.
LIMIT_NAMESPACES = r"""
import ctypes, fcntl, json, os, select, sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
NS_GET_USERNS = 0xB701
SYS_OPEN_TREE, SYS_FSCONFIG, SYS_FSPICK = 428, 431, 433
AT_FDCWD, OPEN_TREE_CLONE = -100, 1
FSPICK_FLAGS = 1 | 2 | 4  # FSPICK_CLOEXEC | FSPICK_SYMLINK_NOFOLLOW | FSPICK_NO_AUTOMOUNT
FSCONFIG_SET_STRING, FSCONFIG_CMD_RECONFIGURE = 1, 7
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def checked(what, result):
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return result


def call(what, number, *args):
    args = [ctypes.c_long(a) if isinstance(a, int) else a for a in args]
    return checked(what, libc.syscall(ctypes.c_long(number), *args))


def enter(pid, pidfd):
    ipc = os.open(f"/proc/{pid}/ns/ipc", os.O_RDONLY | os.O_CLOEXEC)
    mnt = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    if select.select([pidfd], [], [], 0)[0]:  # it ended, and its pid may be another process's now
        raise OSError("the sandbox ended while it was being set up")
    if os.geteuid() != 0:
        checked("setns(user)", libc.setns(fcntl.ioctl(ipc, NS_GET_USERNS), CLONE_NEWUSER))
    checked("setns(ipc)", libc.setns(ipc, CLONE_NEWIPC))
    checked("setns(mnt)", libc.setns(mnt, CLONE_NEWNS))


def limit_inodes(path, count):
    fd = call(f"fspick({path})", SYS_FSPICK, AT_FDCWD, path.encode(), FSPICK_FLAGS)
    try:
        value = str(count).encode()
        call(f"nr_inodes={count} on {path}", SYS_FSCONFIG, fd, FSCONFIG_SET_STRING, b"nr_inodes", value, 0)
        call(f"reconfiguring {path}", SYS_FSCONFIG, fd, FSCONFIG_CMD_RECONFIGURE, None, None, 0)
    finally:
        os.close(fd)
    if os.statvfs(path).f_files != count:
        raise OSError(f"{path} has {os.statvfs(path).f_files} inodes, not {count}")


def write_sysctls(proc, sysctls):
    for name, value in sysctls:
        fd = os.open(f"sys/{name}", os.O_WRONLY | os.O_CLOEXEC, dir_fd=proc)
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)
        fd = os.open(f"sys/{name}", os.O_RDONLY | os.O_CLOEXEC, dir_fd=proc)
        try:
            now = os.read(fd, 4096).decode()
        finally:
            os.close(fd)
        if now.split() != value.split():
            raise OSError(f"{name} is {now.strip()!r} after writing {value!r}")


def limit_ipc(sysctls, ids):
    proc = call("open_tree(/proc)", SYS_OPEN_TREE, AT_FDCWD, b"/proc", OPEN_TREE_CLONE | os.O_CLOEXEC)
    try:
        write_sysctls(proc, sysctls)
    except PermissionError:  # Linux 6.9+: they are the namespace's root's, the sandbox's host uid
        if os.geteuid() != 0 or ids is None:
            raise
        os.setegid(ids[1])
        os.seteuid(ids[0])
        try:
            write_sysctls(proc, sysctls)
        finally:
            os.seteuid(0)
            os.setegid(0)


def cover_proc_sys():
    ro = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    checked("bind /proc/sys", libc.mount(b"/proc/sys", b"/proc/sys", None, ctypes.c_ulong(MS_BIND | MS_REC), None))
    checked("remount /proc/sys read-only", libc.mount(None, b"/proc/sys", None, ctypes.c_ulong(ro), None))
    if not os.statvfs("/proc/sys").f_flag & os.ST_RDONLY:
        raise OSError("/proc/sys is still writable")


def main(config):
    enter(config["pid"], config["pidfd"])
    for path, count in config["inodes"]:
        limit_inodes(path, count)
    try:
        limit_ipc(config["sysctls"], config["ids"])
        result = {"ipc": True}
    except OSError as exc:
        result = {"ipc": False, "problem": str(exc)}
    cover_proc_sys()
    return result


try:
    result = main(json.loads(sys.argv[1]))
except Exception as exc:
    sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
    sys.exit(1)
sys.stdout.write(json.dumps(result) + "\n")
"""


def tmpfs_inodes(size_bytes: int, bytes_per_inode: int = BYTES_PER_INODE) -> int:
    """The inode bound of a sandbox tmpfs of `size_bytes`."""
    return max(MIN_TMPFS_INODES, size_bytes // max(1, bytes_per_inode))


def ipc_sysctls() -> dict[str, str]:
    """The System V limits of a sandbox's IPC namespace, as /proc/sys names and values: shared memory
    at most /dev/shm's size in all (shmall counts pages), in at most SYSV_SEGMENTS segments."""
    return {
        "kernel/shmmax": str(SHM_SIZE_BYTES),
        "kernel/shmall": str(SHM_SIZE_BYTES // os.sysconf("SC_PAGE_SIZE")),
        "kernel/shmmni": str(SYSV_SEGMENTS),
        "kernel/msgmni": str(SYSV_MESSAGE_QUEUES),
        "kernel/sem": SYSV_SEMAPHORES,
    }
