"""Per-job workspaces made from a mirror, and the warm pool that makes them ahead of time.

Workspaces are shallow, one-commit clones of the mirror made by `git fetch --depth=1
file://<mirror> <sha>`: their own objects (no hardlinks, no alternates, so the tree can be chowned
to the sandbox's uid and bind-mounted alone), HEAD detached at the base commit itself, so
`git diff --cached <base>` works inside the sandbox. `WorkspacePool` keeps a few of them made
ahead of time under `<workspaces>/.pool`, so that a job's workspace is usually one `rename`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import stat
import threading
import time
from pathlib import Path

# ---------------------------------------------------------------------------------------------
# Workspaces
# ---------------------------------------------------------------------------------------------
from app.logs import get_logger
from worker.git.gitcalls import (
    FETCH_FLAGS,
    LOCAL_TIMEOUT,
    WORKSPACE_CONFIG,
    RepoError,
    RepoTransient,
    check_sha,
    flock,
    git_environment,
    has_commit,
    reading_lock,
    run_git,
)

log = get_logger("frogfix.workspaces")


def make_workspace(mirror: Path, dest: Path, commit: str, *, timeout: float = LOCAL_TIMEOUT) -> None:
    """A fresh repository at `dest` whose HEAD is exactly `commit` (detached), checked out.

    Shallow (`.git/shallow` lists `commit`): only the objects of that one commit are copied,
    into new files of the workspace's own, so the cost follows the size of the tree, not of
    the history, and nothing is shared with the mirror. No remote, no FETCH_HEAD, no token;
    `user.name FrogFix` in its own config. On failure `dest` is removed.
    """
    check_sha(commit)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise RepoError(f"workspace folder {dest} exists and is not empty")
    # Workspaces are disposable: skipping fsync is safe and saves time on every job; a parallel
    # checkout cuts the time to write a few hundred files on a slow disk by about a quarter.
    workers = str(max(1, min(8, os.cpu_count() or 1)))
    env = git_environment([("core.fsync", "none"), ("checkout.workers", workers)])
    try:
        run_git(["init", "--quiet", "--template=", str(dest)], env=env, what="git init", timeout=timeout)
        with (dest / ".git" / "config").open("a", encoding="utf-8") as config:
            config.write(WORKSPACE_CONFIG)
        source = Path(mirror).resolve().as_uri()
        with reading_lock(Path(mirror)):
            if not has_commit(Path(mirror), commit, timeout=timeout):
                raise RepoError(f"commit {commit[:12]} is not in the mirror {Path(mirror).name}")
            run_git(
                ["-C", str(dest), "fetch", *FETCH_FLAGS, "--depth=1", "--no-auto-maintenance", "--", source, commit],
                env=env,
                what="preparing the workspace (fetch from the mirror)",
                timeout=timeout,
            )
        run_git(
            ["-C", str(dest), "checkout", "--quiet", "--detach", commit, "--"],
            env=env,
            what="preparing the workspace (checkout)",
            timeout=timeout,
        )
    except BaseException:
        remove_workspace(dest)
        raise


def remove_workspace(path: Path) -> None:
    """Delete `path` completely, even where the sandbox left read-only folders; never follows
    symlinks out of it. Raises RepoError when something could not be removed."""
    path = Path(path)
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    if not path.exists():
        return
    try:
        shutil.rmtree(path)
        return
    except OSError:
        pass
    _make_writable(path)
    try:
        shutil.rmtree(path)
    except OSError as exc:
        raise RepoError(f"could not remove {path}: {exc.strerror or exc}") from None


def _make_writable(top: Path) -> None:
    """Give our user rwx on every folder under `top` (not following symlinks), so rmtree can work."""
    stack = [str(top)]
    while stack:
        folder = stack.pop()
        try:
            info = os.lstat(folder)
            if not stat.S_ISDIR(info.st_mode):
                continue
            # Through an O_PATH|O_NOFOLLOW handle: a folder swapped for a symlink is never chmod-ed.
            fd = os.open(folder, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.chmod(f"/proc/self/fd/{fd}", stat.S_IMODE(info.st_mode) | stat.S_IRWXU)
            finally:
                os.close(fd)
            with os.scandir(folder) as entries:
                stack.extend(entry.path for entry in entries if entry.is_dir(follow_symlinks=False))
        except OSError as exc:
            if exc.errno not in (errno.ENOENT, errno.EPERM, errno.EACCES, errno.ELOOP, errno.ENOTDIR):
                raise


# ---------------------------------------------------------------------------------------------
# The warm workspace pool
# ---------------------------------------------------------------------------------------------

POOL_FOLDER = ".pool"  # under the workspaces root: same file system, so a take is one rename
POOL_SIZE = 3
POOL_MAX_AGE = 3600.0  # seconds a ready workspace may wait before it is discarded

# A ready workspace's folder name: `<commit>.<made, ns since the epoch>.<random tag>`.
_READY_NAME = re.compile(r"(?P<commit>[0-9a-f]{40}|[0-9a-f]{64})\.(?P<made>[0-9]{1,20})\.(?P<tag>[0-9a-f]{16})")


def _now() -> float:
    """Wall-clock seconds (module level, so tests can move time forward)."""
    return time.time()


class _Refill:
    """One mirror's background refill in this process: its thread and the fill it should do next."""

    def __init__(self, wanted: tuple[Path, str]) -> None:
        self.wanted: tuple[Path, str] | None = wanted
        self.thread: threading.Thread | None = None


_refills_lock = threading.Lock()
_refills: dict[Path, _Refill] = {}  # by the mirror's pool folder


def _forget_refills_after_fork() -> None:
    """A forked child (Celery prefork) has none of its parent's threads, and maybe a held lock."""
    global _refills_lock, _refills
    _refills_lock = threading.Lock()
    _refills = {}


os.register_at_fork(after_in_child=_forget_refills_after_fork)


class WorkspacePool:
    """Workspaces made ahead of time, so a job's workspace is one `rename` instead of a checkout.

    Layout under `<workspaces>/.pool/<mirror folder>/`: `ready/<commit>.<made_ns>.<tag>` (finished
    workspaces, each exactly what `make_workspace(mirror, ..., commit)` produced), `tmp/` (being
    made; never taken), `trash/` (being deleted) and `fill.lock` (an flock held by whoever fills
    that mirror's pool). The pool lives under the workspaces root so that a take is an atomic
    `os.rename` within one file system: of several processes (or threads) renaming the same ready
    workspace, exactly one succeeds and the others get ENOENT and move on, so each one is handed
    out once. A renamed folder keeps its inodes, and make_workspace's files are all its own
    (link count 1), so a taken workspace shares nothing with the pool, the mirror or another job.

    Bounded: at most `size` ready workspaces per mirror, all at one commit (a fill at a new commit,
    e.g. after the mirror's head moved, discards the others); one older than `max_age` is never
    handed out and is deleted by the next fill of any mirror.
    """

    def __init__(
        self,
        workspaces: Path,
        *,
        size: int = POOL_SIZE,
        max_age: float = POOL_MAX_AGE,
        timeout: float = LOCAL_TIMEOUT,
    ) -> None:
        if size < 0 or max_age < 0:
            raise ValueError("the pool size and the maximum age cannot be negative")
        self.root = Path(workspaces) / POOL_FOLDER
        self.size = size
        self.max_age = max_age
        self.timeout = timeout

    def folder_for(self, mirror: Path) -> Path:
        """The pool folder of one mirror: its name plus a digest of its resolved path."""
        resolved = Path(mirror).resolve()
        stem = re.sub(r"[^A-Za-z0-9._-]+", "_", resolved.name.removesuffix(".git")).strip("._-")[:120] or "repo"
        return self.root / f"{stem}-{hashlib.sha256(os.fsencode(resolved)).hexdigest()[:12]}"

    # -- taking ---------------------------------------------------------------------------------

    def take(self, mirror: Path, commit: str, dest: Path) -> bool:
        """Move a ready workspace at exactly `commit` to `dest` (absent or an empty folder).

        True when one was taken; False when none is ready (none at that commit, all too old, all
        taken by others meanwhile, or `dest` on another file system): then nothing changed.
        Raises RepoError when `dest` is in the way.
        """
        check_sha(commit)
        dest = Path(dest)
        if dest.is_symlink() or (dest.exists() and (not dest.is_dir() or any(dest.iterdir()))):
            raise RepoError(f"workspace folder {dest} exists and is not empty")
        ready = self.folder_for(mirror) / "ready"
        try:
            names = os.listdir(ready)
        except FileNotFoundError:
            return False
        now = _now()
        candidates = sorted(  # oldest first: they are the nearest to expiring
            (int(match["made"]), name)
            for name in names
            if (match := _READY_NAME.fullmatch(name)) is not None
            and match["commit"] == commit
            and self._young(int(match["made"]), now)
        )
        if not candidates:
            return False
        dest.parent.mkdir(parents=True, exist_ok=True)
        for _, name in candidates:
            try:
                os.rename(ready / name, dest)
            except FileNotFoundError:
                continue  # another worker took it, or a fill discarded it, first
            except OSError as exc:
                if exc.errno == errno.EXDEV:
                    return False
                raise RepoError(f"could not move a ready workspace to {dest}: {exc.strerror or exc}") from None
            if _detached_head(dest) == commit:
                return True
            remove_workspace(dest)  # damaged somehow: never hand it out
        return False

    def ready(self, mirror: Path, commit: str | None = None) -> int:
        """How many workspaces are ready for `mirror` (at `commit`, when given) and young enough."""
        try:
            names = os.listdir(self.folder_for(mirror) / "ready")
        except FileNotFoundError:
            return 0
        now = _now()
        return sum(
            1
            for name in names
            if (match := _READY_NAME.fullmatch(name)) is not None
            and (commit is None or match["commit"] == commit)
            and self._young(int(match["made"]), now)
        )

    # -- filling --------------------------------------------------------------------------------

    def fill(self, mirror: Path, commit: str) -> None:
        """Make ready workspaces at `commit` until `size` are there; discard the mirror's others.

        Holds the mirror's `fill.lock` throughout (waiting for another filler, bounded), and
        counts under it, so two processes never fill one mirror's pool past `size`. Each
        workspace is made by make_workspace in `tmp/` and renamed into `ready/` only once
        complete. Leftovers of a filler that died are removed first. Raises what make_workspace
        raises (e.g. RepoError when `commit` is not in the mirror).
        """
        check_sha(commit)
        _check_in_mirror(Path(mirror), commit, timeout=self.timeout)  # before anything is discarded
        folder = self.folder_for(mirror)
        self._make_folders(folder)
        ready = folder / "ready"
        with flock(folder / "fill.lock", exclusive=True):
            self._clean(folder)
            now = _now()
            have = 0
            for name in sorted(os.listdir(ready), reverse=True):
                match = _READY_NAME.fullmatch(name)
                if match and match["commit"] == commit and self._young(int(match["made"]), now) and have < self.size:
                    have += 1
                else:
                    self._discard(folder, name)
            while have < self.size:
                tag = os.urandom(8).hex()
                staging = folder / "tmp" / tag
                make_workspace(mirror, staging, commit, timeout=self.timeout)
                os.rename(staging, ready / f"{commit}.{int(_now() * 1e9)}.{tag}")
                have += 1
        self._sweep(skip=folder)

    def _young(self, made_ns: int, now: float) -> bool:
        return abs(now - made_ns / 1e9) <= self.max_age

    def _make_folders(self, folder: Path) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        for sub in ("ready", "tmp", "trash"):
            (folder / sub).mkdir(mode=0o700, parents=True, exist_ok=True)

    def _discard(self, folder: Path, name: str) -> None:
        """Move a ready workspace out of reach first (atomic against a take), then delete it."""
        doomed = folder / "trash" / name
        try:
            os.rename(folder / "ready" / name, doomed)
        except FileNotFoundError:
            return  # taken meanwhile
        with contextlib.suppress(RepoError):
            remove_workspace(doomed)

    @staticmethod
    def _clean(folder: Path) -> None:
        """Empty `tmp/` and `trash/`: only a filler (under fill.lock, which we hold) writes there."""
        for sub in ("tmp", "trash"):
            with contextlib.suppress(FileNotFoundError):
                for name in os.listdir(folder / sub):
                    with contextlib.suppress(RepoError):
                        remove_workspace(folder / sub / name)

    def _sweep(self, *, skip: Path) -> None:
        """Delete expired ready workspaces of the other mirrors (each under its fill.lock, if free)."""
        try:
            folders = [entry for entry in os.scandir(self.root) if entry.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return
        now = _now()
        for entry in folders:
            folder = Path(entry.path)
            if folder == skip or not (folder / "ready").is_dir():
                continue
            try:
                with flock(folder / "fill.lock", exclusive=True, wait=0):
                    self._clean(folder)
                    for name in os.listdir(folder / "ready"):
                        match = _READY_NAME.fullmatch(name)
                        if match is None or not self._young(int(match["made"]), now):
                            self._discard(folder, name)
            except (RepoTransient, OSError):
                continue  # being filled right now: that filler discards what is expired

    # -- the job's path: take or make, then refill in the background ----------------------------

    def prepare(self, mirror: Path, commit: str, dest: Path) -> None:
        """A workspace at `commit` in `dest`, from the pool or else made now; then a refill.

        Same result as `make_workspace(mirror, dest, commit)`. The refill runs in a daemon
        thread (see `refill`); `wait()` joins it.
        """
        if not self.take(mirror, commit, dest):
            make_workspace(mirror, dest, commit, timeout=self.timeout)
        self.refill(mirror, commit)

    def refill(self, mirror: Path, commit: str) -> None:
        """Schedule `fill(mirror, commit)` in a background daemon thread; returns at once.

        At most one refill thread per mirror (and pool root) in a process: a request while one
        runs is remembered, and the thread fills again with the latest commit asked for when
        done. Across processes, `fill`'s lock keeps the pool at `size`. A failed fill is logged,
        never raised.
        """
        check_sha(commit)
        if self.size == 0:
            return
        folder = self.folder_for(mirror)
        with _refills_lock:
            state = _refills.get(folder)
            if state is not None and state.thread is not None and state.thread.is_alive():
                state.wanted = (Path(mirror), commit)
                return
            state = _Refill((Path(mirror), commit))
            state.thread = threading.Thread(
                target=self._refill_loop, args=(folder, state), name=f"frogfix-pool-refill-{folder.name}", daemon=True
            )
            _refills[folder] = state
            state.thread.start()

    def _refill_loop(self, folder: Path, state: _Refill) -> None:
        while True:
            with _refills_lock:  # checked and dropped under one lock: a new request is never lost
                wanted, state.wanted = state.wanted, None
                if wanted is None:
                    if _refills.get(folder) is state:
                        del _refills[folder]
                    return
            try:
                self.fill(*wanted)
            except Exception as exc:  # a background thread: report, never raise
                log.warning("workspace_pool_refill_failed", pool=folder.name, error=str(exc))

    def wait(self, timeout: float | None = None) -> bool:
        """Join this pool's background refills (all mirrors); False if some still run at `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with _refills_lock:
                threads = [
                    s.thread
                    for f, s in _refills.items()
                    if f.parent == self.root and s.thread is not None and s.thread.is_alive()
                ]
            if not threads:
                return True
            for thread in threads:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                thread.join(left)
                if thread.is_alive():
                    return False


def _check_in_mirror(mirror: Path, commit: str, *, timeout: float) -> None:
    with reading_lock(mirror):
        present = has_commit(mirror, commit, timeout=timeout)
    if not present:
        raise RepoError(f"commit {commit[:12]} is not in the mirror {mirror.name}")


def _detached_head(workspace: Path) -> str:
    """What a workspace's `.git/HEAD` holds (a sha when detached), or "" when unreadable."""
    try:
        return (workspace / ".git" / "HEAD").read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""
