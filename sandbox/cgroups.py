"""Per-sandbox cgroups: one memory, pids and CPU bound over every process of a local sandbox.

Why: rlimits bind each process alone (RLIMIT_AS), so N processes may hold N times the memory
limit; a cgroup counts them together, and the tmpfs pages they write (workspace, /tmp) too.

Where: a controller is taken from cgroup v2 when the v2 hierarchy carries it, else from the v1
hierarchy that does (hybrid hosts mount both). A sandbox's cgroups go under the worker's own
cgroup in each hierarchy (root, or a subtree delegated to the worker's user); on v2 also under
its parent when that one already enables the controllers for its children (systemd's
`DelegateSubgroup=`). `detect()` probes this once per process; what it cannot place is reported
(`CgroupSupport.problems`), and the sandbox then has its rlimits only.

How processes enter: the worker's launcher (sandbox/launcher.py) forks `cgroup_enter.py`'s wrapper,
which writes its own pid into each cgroup.procs, drops to the sandbox's host uid and execs bwrap
under the same pid, so every sandboxed process is inside from its first instruction (see that
file for why not preexec_fn). `wrapped_argv` is the same wrapper as a command of its own.

Names are `frogfix-sandbox-<worker pid>.<its start time>.<random>`: a sandbox's cgroup is
removed when it closes, and `reap_stale()` (run before every new sandbox cgroup) removes those
whose worker process is gone, after killing anything still in them.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field

from sandbox.base import SandboxUnavailable
from sandbox.polling import poll_until

CONTROLLERS = ("memory", "pids", "cpu")
# What an operator does when a controller is missing (doctor's fix, the worker's start-up warning).
DELEGATION_FIX = (
    "run the worker as root, or delegate a cgroup subtree with the memory, pids and cpu controllers to "
    "its user (systemd: Delegate=yes, and DelegateSubgroup=worker so the service's own cgroup can have "
    "children; a container on cgroup v2: a private, writable cgroup namespace, and the worker (or the "
    "entrypoint) first moves itself into a leaf such as /worker, since v2 enables no controller for "
    "children of a cgroup that holds processes itself); until then each sandbox has rlimits only, which "
    "bound every process alone, not all of them together"
)
NAME_PREFIX = "frogfix-sandbox-"
CPU_PERIOD_US = 100_000
ENTER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cgroup_enter.py")
# The files a placement needs in a new cgroup, per (version, controller).
LIMIT_FILES = {
    (2, "memory"): "memory.max",
    (2, "pids"): "pids.max",
    (2, "cpu"): "cpu.max",
    (1, "memory"): "memory.limit_in_bytes",
    (1, "pids"): "pids.max",
    (1, "cpu"): "cpu.cfs_quota_us",
}


@dataclass(frozen=True)
class CgroupLimits:
    """What one sandbox's cgroup allows: bytes of memory (processes and tmpfs), tasks, CPUs."""

    memory_bytes: int
    max_processes: int
    cpus: float


@dataclass(frozen=True)
class Placement:
    """Where the sandbox cgroups for one controller are made: `parent` in a v1 or v2 hierarchy."""

    controller: str
    version: int
    parent: str


@dataclass(frozen=True)
class CgroupSupport:
    """What this host lets the worker bound per sandbox, and why the rest cannot be."""

    placements: tuple[Placement, ...] = ()
    problems: tuple[str, ...] = ()

    @property
    def controllers(self) -> frozenset[str]:
        return frozenset(p.controller for p in self.placements)

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(c for c in CONTROLLERS if c not in self.controllers)

    def describe(self) -> str:
        """One line for doctor and the worker's start-up warning."""
        placed = ", ".join(f"{p.controller} (v{p.version} under {p.parent})" for p in self.placements)
        text = f"per-sandbox cgroup limits: {placed}" if placed else "no per-sandbox cgroup limits"
        if self.missing:
            text += f"; missing {', '.join(self.missing)}: {'; '.join(self.problems) or 'no hierarchy carries them'}"
        return text


@dataclass
class SandboxCgroup:
    """One sandbox's cgroup directories (one per hierarchy used); kill and remove them at close."""

    dirs: dict[str, tuple[int, str]] = field(default_factory=dict)  # controller -> (version, path)
    removed: bool = False

    def paths(self) -> list[tuple[int, str]]:
        return sorted(set(self.dirs.values()))

    def path_for(self, controller: str) -> str | None:
        entry = self.dirs.get(controller)
        return entry[1] if entry else None

    def procs_files(self) -> list[str]:
        return [os.path.join(path, "cgroup.procs") for _, path in self.paths()]

    def enter_argv(self, argv: list[str], host_ids: tuple[int, int] | None) -> list[str]:
        """`argv` (bwrap's) behind the exec wrapper that joins these cgroups first."""
        return wrapped_argv(argv, host_ids, self.procs_files())

    def kill_and_remove(self, wait_s: float = 10.0) -> list[str]:
        """SIGKILL whatever is still inside, then remove the directories; returns those left."""
        if self.removed:
            return []
        left = _kill_and_remove([path for _, path in self.paths()], wait_s)
        self.removed = not left
        return left


def wrapped_argv(argv: list[str], host_ids: tuple[int, int] | None, procs_files: list[str]) -> list[str]:
    """`argv` (bwrap's) behind the exec wrapper (cgroup_enter.py): it joins `procs_files` (none
    where the host gives no cgroup), drops to `host_ids`, ties bwrap to this worker's life and
    leaves the watchdog that kills what bwrap's own death signal misses."""
    parent = ["--parent", str(os.getpid())]
    return [sys.executable, "-I", "-S", ENTER_SCRIPT, *parent, *wrapper_options(argv, host_ids, procs_files)]


def wrapper_options(argv: list[str], host_ids: tuple[int, int] | None, procs_files: list[str]) -> list[str]:
    """The wrapper's options and `argv` after them, as `wrapped_argv` and the launcher's `spawn` take them."""
    drop = ["--uid", str(host_ids[0]), "--gid", str(host_ids[1])] if host_ids else []
    return [*drop, *procs_files, "--", *argv]


# ----------------------------------------------------------------------------- detection


@functools.lru_cache(maxsize=1)
def host_support() -> CgroupSupport:
    """`detect()` for this process, once: the answer does not change while the worker runs."""
    return detect()


def detect(mountinfo: str = "/proc/self/mountinfo", proc_cgroup: str = "/proc/self/cgroup") -> CgroupSupport:
    """Find, for each controller, a hierarchy and a parent folder where this process may make,
    limit and join a sandbox cgroup (each proved by making and removing a probe cgroup)."""
    try:
        mounts = _cgroup_mounts(_read(mountinfo))
        own = _own_cgroups(_read(proc_cgroup))
    except OSError as exc:
        return CgroupSupport(problems=(f"cannot read this process's cgroups: {exc}",))
    placements: list[Placement] = []
    problems: list[str] = []
    v2 = next((m for m in mounts if m[0] == 2), None)
    v2_controllers = set(_read_quiet(os.path.join(v2[1], "cgroup.controllers")).split()) if v2 else set()
    for controller in CONTROLLERS:
        if controller in v2_controllers and v2 is not None:
            placement, problem = _place_v2(controller, v2, own.get("", ""))
        else:
            v1 = next((m for m in mounts if m[0] == 1 and controller in m[3]), None)
            if v1 is None:
                problems.append(f"{controller}: no cgroup hierarchy carries it")
                continue
            placement, problem = _place_v1(controller, v1, own.get(controller, ""))
        if placement is not None:
            placements.append(placement)
        else:
            problems.append(problem)
    return CgroupSupport(tuple(placements), tuple(problems))


Mount = tuple[int, str, str, frozenset[str]]  # version, mount point, hierarchy root, v1 controllers


def _cgroup_mounts(text: str) -> list[Mount]:
    mounts: list[Mount] = []
    for line in text.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        fstype, options = fields[sep + 1], fields[sep + 3].split(",") if len(fields) > sep + 3 else []
        point = fields[4].replace("\\040", " ")
        if fstype == "cgroup2":
            mounts.append((2, point, fields[3], frozenset()))
        elif fstype == "cgroup":
            mounts.append((1, point, fields[3], frozenset(options) & set(CONTROLLERS)))
    return mounts


def _own_cgroups(text: str) -> dict[str, str]:
    """This process's cgroup path per v1 controller, and under "" its v2 path."""
    own: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and not parts[1]:
            own[""] = parts[2]
        for name in parts[1].split(","):
            if name:
                own[name] = parts[2]
    return own


def _folder(mount: Mount, path: str) -> str | None:
    """The folder of hierarchy path `path` under the mount, None when the mount does not show it."""
    _, point, root, _ = mount
    root = root.rstrip("/")
    if path != root and not path.startswith(root + "/"):
        return None
    if ".." in path.split("/"):  # outside this cgroup namespace: not ours to use
        return None
    return os.path.join(point, path[len(root) :].lstrip("/")).rstrip("/") or "/"


def _place_v1(controller: str, mount: Mount, own: str) -> tuple[Placement | None, str]:
    folder = _folder(mount, own) if own else None
    if folder is None:
        return None, f"{controller}: this process's v1 cgroup is outside the mounted hierarchy"
    placement = Placement(controller, 1, folder)
    return _probe(placement)


def _place_v2(controller: str, mount: Mount, own: str) -> tuple[Placement | None, str]:
    folder = _folder(mount, own) if own else None
    if folder is None:
        return None, f"{controller}: this process's v2 cgroup is outside the mounted hierarchy"
    candidates = [folder] + ([os.path.dirname(folder)] if folder != mount[1] else [])
    why = ""
    for index, parent in enumerate(candidates):
        enabled = set(_read_quiet(os.path.join(parent, "cgroup.subtree_control")).split())
        if controller not in enabled and index == 0:
            with contextlib.suppress(OSError):  # EBUSY while the folder has processes of its own
                _write(os.path.join(parent, "cgroup.subtree_control"), f"+{controller}")
            enabled = set(_read_quiet(os.path.join(parent, "cgroup.subtree_control")).split())
        if controller not in enabled:
            why = f"{controller}: not enabled for the children of {parent} (cgroup.subtree_control)"
            continue
        placement, problem = _probe(Placement(controller, 2, parent))
        if placement is not None:
            return placement, ""
        why = problem
    return None, why


def _probe(placement: Placement) -> tuple[Placement | None, str]:
    """Make, check and remove a probe cgroup: the placement works for this process, or why not."""
    probe = os.path.join(placement.parent, f"{NAME_PREFIX}probe-{os.getpid()}-{secrets.token_hex(3)}")
    limit_file = LIMIT_FILES[(placement.version, placement.controller)]
    try:
        os.mkdir(probe, 0o755)
    except OSError as exc:
        return None, f"{placement.controller}: cannot create a cgroup under {placement.parent} ({exc.strerror})"
    try:
        if not os.access(os.path.join(probe, limit_file), os.W_OK):
            return None, f"{placement.controller}: {limit_file} is not writable under {placement.parent}"
        if not os.access(os.path.join(probe, "cgroup.procs"), os.W_OK):
            return None, f"{placement.controller}: cannot move processes into a cgroup under {placement.parent}"
        if placement.version == 2 and not os.access(os.path.join(placement.parent, "cgroup.procs"), os.W_OK):
            return None, f"{placement.controller}: {placement.parent}/cgroup.procs is not writable (no delegation)"
        return placement, ""
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(probe)


# ----------------------------------------------------------------------------- one sandbox


def create(limits: CgroupLimits, support: CgroupSupport) -> SandboxCgroup | None:
    """Make and limit one sandbox's cgroups where `support` allows (None where it allows nothing).

    Raises SandboxUnavailable when a placement that worked at detection fails now: a sandbox is
    never started with fewer walls than the worker announced.
    """
    if not support.placements:
        return None
    reap_stale(support)
    name = f"{NAME_PREFIX}{_owner_tag(os.getpid())}.{secrets.token_hex(4)}"
    cgroup = SandboxCgroup()
    try:
        for placement in support.placements:
            path = os.path.join(placement.parent, name)
            if not os.path.isdir(path):
                os.mkdir(path, 0o755)
            cgroup.dirs[placement.controller] = (placement.version, path)
            _set_limit(placement, path, limits)
    except OSError as exc:
        cgroup.kill_and_remove(wait_s=1.0)
        raise SandboxUnavailable(f"cannot set up the sandbox's cgroup {name}: {exc}") from exc
    return cgroup


def _set_limit(placement: Placement, path: str, limits: CgroupLimits) -> None:
    quota = max(1000, int(limits.cpus * CPU_PERIOD_US))
    if placement.version == 2:
        if placement.controller == "memory":
            _write(os.path.join(path, "memory.max"), str(limits.memory_bytes))
            if os.path.exists(os.path.join(path, "memory.swap.max")):  # swapped pages would not count
                _write(os.path.join(path, "memory.swap.max"), "0")
        elif placement.controller == "pids":
            _write(os.path.join(path, "pids.max"), str(limits.max_processes))
        else:
            _write(os.path.join(path, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
        return
    if placement.controller == "memory":
        _write(os.path.join(path, "memory.limit_in_bytes"), str(limits.memory_bytes))
        if os.path.exists(os.path.join(path, "memory.memsw.limit_in_bytes")):  # memory + swap together
            _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(limits.memory_bytes))
    elif placement.controller == "pids":
        _write(os.path.join(path, "pids.max"), str(limits.max_processes))
    else:
        _write(os.path.join(path, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
        _write(os.path.join(path, "cpu.cfs_quota_us"), str(quota))


def _kill_and_remove(paths: Iterable[str], wait_s: float) -> list[str]:
    """Kill every process in `paths` (v2's cgroup.kill where there is one) and rmdir them."""
    left = [p for p in paths if os.path.isdir(p)]

    def removed() -> bool:
        nonlocal left
        for path in left:
            _kill_members(path)
        remaining = []
        for path in left:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:  # EBUSY: members not reaped yet
                remaining.append(path)
        left = remaining
        return not left

    # A killed member leaves within a few ms, or it is one that takes longer.
    poll_until(removed, within_s=wait_s, first_pause_s=0.001, max_pause_s=0.05)
    return left


def _kill_members(path: str) -> None:
    kill_file = os.path.join(path, "cgroup.kill")
    if os.path.exists(kill_file):
        with contextlib.suppress(OSError):
            _write(kill_file, "1")
            return
    for pid in _members(path):
        # A pidfd pins the process: if its pid was reused meanwhile, the check below sees the
        # newcomer is not ours, and the signal cannot reach it either.
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:
            continue
        try:
            if pid in _members(path):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(pidfd)


def _members(path: str) -> list[int]:
    return [int(line) for line in _read_quiet(os.path.join(path, "cgroup.procs")).split() if line.isdigit()]


# ----------------------------------------------------------------------------- leftovers


def reap_stale(support: CgroupSupport | None = None) -> list[str]:
    """Remove sandbox cgroups whose worker process is gone (killed with its sandboxes running).

    Their processes died with the worker (`--die-with-parent`) or are killed here; a cgroup of
    a live worker, this one's included, is never touched.
    """
    support = host_support() if support is None else support
    removed: list[str] = []
    for parent in sorted({p.parent for p in support.placements}):
        try:
            names = [n for n in os.listdir(parent) if n.startswith(NAME_PREFIX)]
        except OSError:
            continue
        for name in names:
            owner = name[len(NAME_PREFIX) :].rsplit(".", 1)[0]
            if owner.startswith("probe-") or _owner_alive(owner):
                continue
            path = os.path.join(parent, name)
            if not _kill_and_remove([path], wait_s=2.0):
                removed.append(path)
    return removed


def _owner_tag(pid: int) -> str:
    """`<pid namespace>.<pid>.<start ticks>`: who made a cgroup, as only that namespace can judge it.

    Workers in other pid namespaces (containers) may share a cgroup parent; a pid of theirs means
    nothing here, so their cgroups are left to them instead of being taken for a dead worker's.
    """
    return f"{_pid_namespace()}.{pid}.{_start_ticks(pid)}"


def _owner_alive(owner: str) -> bool:
    namespace, pid, ticks = [*owner.split("."), "", "", ""][:3]
    if not (namespace.isdigit() and pid.isdigit() and ticks.isdigit()):
        return True  # not a name we make: leave it alone
    if int(namespace) != _pid_namespace():
        return True  # another pid namespace's worker: not ours to judge
    return _start_ticks(int(pid)) == int(ticks)


def _pid_namespace() -> int:
    """This process's pid namespace, by the inode of its /proc/self/ns/pid link (0 where unreadable)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _start_ticks(pid: int) -> int:
    """The process's start time (clock ticks since boot), so a reused pid is not taken for it; -1 if gone."""
    try:
        stat = _read(f"/proc/{pid}/stat")
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[19])


# ----------------------------------------------------------------------------- files


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def _read_quiet(path: str) -> str:
    try:
        return _read(path)
    except OSError:
        return ""


def _write(path: str, text: str) -> None:
    """One write(2): cgroup files take a value per write call."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
