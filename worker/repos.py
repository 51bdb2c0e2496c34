"""Repositories on the worker: bare mirrors, per-job workspaces, the fix commit and its push.

Only the worker holds forge credentials. Every git call here runs with an environment built
from scratch (no system or global config, HOME an empty folder, prompts off, only the http,
https and file transports), and the Authorization header reaches git through
`git_auth_env` for the one network call that needs it: it is never written to a mirror's or a
workspace's config, never on a command line, never in a URL.

Layout under `RepoCache.root`: `<key>.git` (the bare mirror: branch heads only, no remote, no
URL) and `<key>.lock` (an flock: exclusive while fetching, shared while reading or writing
objects, so two workers never fetch one mirror at once and nobody reads a half-updated one).

Workspaces are shallow, one-commit clones of the mirror made by `git fetch --depth=1
file://<mirror> <sha>`: their own objects (no hardlinks, no alternates, so the tree can be
chowned to the sandbox's uid and bind-mounted alone), HEAD detached at the base commit itself,
so `git diff --cached <base>` works inside the sandbox. `WorkspacePool` keeps a few of them made
ahead of time under `<workspaces>/.pool`, so that a job's workspace is usually one `rename`.

The fix commit is built in the mirror with a private index (`git apply --cached`), never in a
work tree, and pushed from the mirror to `refs/heads/frogfix/...` only: force on that one ref by
default (the branch is ours and a new attempt replaces the old), or `--force-with-lease` when
the caller passes what it last pushed.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from app.forge.api import OutboundText, git_auth_env
from app.logs import get_logger

BRANCH_PREFIX = "frogfix/"
HEADS_REFSPEC = "+refs/heads/*:refs/heads/*"  # heads only: no MR/PR refs from strangers, no tags
NETWORK_TIMEOUT = 900.0  # seconds for one clone, fetch or push (a big first mirror takes a while)
LOCAL_TIMEOUT = 300.0  # seconds for one local git command (workspace, commit)
LOCK_WAIT = NETWORK_TIMEOUT + 60.0  # a lock holder's own calls are bounded, so waiting is too
IDENTITY = ("FrogFix", "frogfix@localhost")

log = get_logger("frogfix.repos")
T = TypeVar("T")

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_ALLOWED_SCHEMES = ("http", "https", "file")
_FETCH_FLAGS = ("--quiet", "--no-tags", "--no-write-fetch-head")
# Environment a git call may inherit: proxies and CA bundles an on-prem network needs, nothing else.
_PASSTHROUGH = (
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "all_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "TMPDIR",
    "TZ",
)
# Config every call gets (through GIT_CONFIG_*, so nothing is written): no hooks, no credential
# helpers, no fsmonitor, and a stalled transfer fails instead of hanging until the hard timeout.
_BASE_CONFIG = (
    ("core.hooksPath", os.devnull),
    ("core.fsmonitor", "false"),
    ("credential.helper", ""),
    ("protocol.version", "2"),
    ("http.lowSpeedLimit", "1000"),
    ("http.lowSpeedTime", "60"),
    ("advice.detachedHead", "false"),
    ("init.defaultBranch", "frogfix"),
)
# Written once into each new mirror: auto-gc runs inside our fetch (under the lock) rather than
# as a detached process that outlives it.
# `uploadpack.*` must live here: git clears GIT_CONFIG_* for the upload-pack it runs for file://.
_MIRROR_CONFIG = (
    ("gc.autoDetach", "false"),
    ("core.logAllRefUpdates", "false"),
    ("uploadpack.allowAnySHA1InWant", "true"),
)
_WORKSPACE_CONFIG = f"[user]\n\tname = {IDENTITY[0]}\n\temail = {IDENTITY[1]}\n[gc]\n\tauto = 0\n"

_PERMANENT_HINTS = re.compile(
    r"authentication failed|could not read (username|password)|returned error: (401|403|404)|"
    r"repository .* not found|not found|terminal prompts disabled|invalid credentials|access denied",
    re.I,
)
_TRANSIENT_HINTS = re.compile(
    r"could not resolve host|failed to connect|couldn.t connect|connection refused|connection timed out|timed out|"
    r"connection reset|empty reply from server|rpc failed|early eof|unexpected disconnect|"
    r"remote end hung up|recv failure|send failure|transfer closed|http/2 stream|gnutls|ssl_read|"
    r"returned error: (5\d\d|408|425|429)|temporarily unavailable|service unavailable|"
    r"too many requests|network is unreachable|no route to host|broken pipe",
    re.I,
)


class RepoError(Exception):
    """A git operation failed for good. `str(exc)` is safe to show: no token, no header."""


class RepoTransient(RepoError):
    """Network trouble (refused, timed out, 5xx): the same call may well work later."""


class RepoBranchMoved(RepoError):
    """A push was refused because the branch is no longer where we built on (someone else pushed)."""


def retry_transient(
    what: str,
    fn: Callable[[], T],
    *,
    delays: Sequence[float] = (1.0, 4.0),
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run a network git operation, again after each delay while it fails with RepoTransient.

    Fetches and our force-pushes of one ref are idempotent, so a blip of the git server (a 502
    from its proxy, a dropped connection) costs seconds instead of the whole job.
    """
    for delay in delays:
        try:
            return fn()
        except RepoTransient as exc:
            log.warning("git_retry", what=what, error=str(exc)[:300], wait_s=delay)
            sleep(delay)
    return fn()


# ---------------------------------------------------------------------------------------------
# Running git
# ---------------------------------------------------------------------------------------------


_home_lock = threading.Lock()
_home: str | None = None


def _empty_home() -> str:
    """An empty, read-only folder for HOME, so no ~/.gitconfig or credential store is found."""
    global _home
    with _home_lock:
        if _home is None or not os.path.isdir(_home):
            _home = tempfile.mkdtemp(prefix="frogfix-git-home-")
            os.chmod(_home, 0o500)
            atexit.register(_drop_home, _home, os.getpid())
        return _home


def _drop_home(path: str, owner: int) -> None:
    if os.getpid() == owner:  # a forked child (Celery prefork) must not remove its parent's folder
        shutil.rmtree(path, ignore_errors=True)


def git_environment(extra_config: Iterable[tuple[str, str]] = ()) -> dict[str, str]:
    """The whole environment of one git call: isolated from the machine's config and identity."""
    home = _empty_home()
    env = {key: os.environ[key] for key in _PASSTHROUGH if key in os.environ}
    env.update(
        PATH=os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        HOME=home,
        XDG_CONFIG_HOME=home,
        LC_ALL="C",  # git's messages in English: errors are classified from them
        LANG="C",
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_TERMINAL_PROMPT="0",
        GIT_ALLOW_PROTOCOL=":".join(_ALLOWED_SCHEMES),
        GIT_NO_REPLACE_OBJECTS="1",
    )
    config = [*_BASE_CONFIG, *extra_config]
    for index, (key, value) in enumerate(config):
        env[f"GIT_CONFIG_KEY_{index}"] = key
        env[f"GIT_CONFIG_VALUE_{index}"] = value
    env["GIT_CONFIG_COUNT"] = str(len(config))
    return env


def _secret_forms(auth_header: str | None) -> list[str]:
    """Every form of the header's secret that could show up in git's output."""
    if not auth_header:
        return []
    forms = {auth_header}
    scheme, _, credentials = auth_header.strip().partition(" ")
    credentials = credentials.strip()
    if credentials:
        forms.add(credentials)
        if scheme.lower() == "basic":
            with contextlib.suppress(binascii.Error, ValueError):
                decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
                forms.add(decoded)
                forms.add(decoded.partition(":")[2])
    return [form for form in forms if len(form) >= 6]


def _summary(text: str, secrets: Iterable[str]) -> str:
    """git's few telling lines (fatal/error/remote/rejected), scrubbed and short."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    telling = [line for line in lines if re.match(r"(fatal|error|remote|!|hint: Updates were rejected)", line)]
    picked = (telling or lines)[-4:]
    return OutboundText(secrets).error(" | ".join(picked)) or "no message from git"


def _classify(what: str, stderr: str, secrets: Iterable[str]) -> RepoError:
    message = f"{what} failed: {_summary(stderr, secrets)}"
    if _PERMANENT_HINTS.search(stderr):
        return RepoError(message)
    if _TRANSIENT_HINTS.search(stderr):
        return RepoTransient(message)
    return RepoError(message)


def run_git(
    args: list[str],
    *,
    env: Mapping[str, str],
    what: str,
    timeout: float,
    cwd: Path | None = None,
    stdin: bytes | None = None,
    secrets: Iterable[str] = (),
    check: bool = True,
    network: bool = False,
    max_memory: int | None = None,
) -> subprocess.CompletedProcess[bytes]:
    """One git command, killed with its whole process group when it runs past `timeout`.

    A failure raises RepoError; with `network`, RepoTransient when git's message says the
    network or the server was at fault. A timeout is always RepoTransient. `max_memory` bounds
    git's address space (see `git_argv`).
    """
    proc = subprocess.Popen(
        git_argv(args, max_memory),
        cwd=cwd,
        env=dict(env),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group: helpers (remote-http, upload-pack) die with it
    )
    try:
        out, err = proc.communicate(stdin, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RepoTransient(f"{what} timed out after {timeout:.0f}s") from None
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    if check and done.returncode != 0:
        if network:
            raise _classify(what, err.decode("utf-8", "replace"), secrets)
        raise RepoError(f"{what} failed: {_summary(err.decode('utf-8', 'replace'), secrets)}")
    return done


def git_argv(args: list[str], max_memory: int | None = None) -> list[str]:
    """`git ARGS`, under `prlimit --as=MAX_MEMORY` when a bound is asked for.

    Why: git reading hostile input (a patch's binary literal inflates ~1000-fold) runs in the
    worker, outside every sandbox wall; with the bound git fails with "out of memory" instead of
    taking the host's. prlimit (util-linux) sets the limit and execs git, so no `preexec_fn` runs
    in this threaded process and git keeps the pid we wait on. Without prlimit, git runs unbounded
    and a warning says so once.
    """
    if max_memory is None:
        return ["git", *args]
    prlimit = prlimit_path()
    if prlimit is None:
        _warn_once("prlimit (util-linux) is missing: git's memory in the worker is not bounded")
        return ["git", *args]
    return [prlimit, f"--as={int(max_memory)}", "--", "git", *args]


def prlimit_path() -> str | None:
    """Where `git_argv` finds prlimit (None: git runs without its memory bound); doctor asks the same."""
    return shutil.which("prlimit")


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning("git_unbounded", detail=message)


def git_dir_args(repo: Path) -> list[str]:
    """Address a repository (bare or not) explicitly, so no parent folder's repo is ever used."""
    git_dir = repo / ".git" if (repo / ".git").exists() else repo
    return [f"--git-dir={git_dir}"]


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def mirror_key(forge: str, project: str) -> str:
    """A safe, collision-free folder name for one forge project (`gitlab`, `group/sub/app`)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{forge}_{project}")
    slug = re.sub(r"\.{2,}", ".", slug).strip("._-")[:120] or "repo"
    digest = hashlib.sha256(f"{forge}\0{project}".encode()).hexdigest()[:12]
    return f"{slug}-{digest}"


def _check_key(key: str) -> str:
    if not _KEY.fullmatch(key) or ".." in key or key.endswith((".lock", ".git", ".new")):
        raise RepoError(f"not a safe mirror key: {key!r}")
    return key


def _check_url(url: str) -> str:
    """Plain http(s) (or file, for local use) URLs only, never with credentials in them."""
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise RepoError("the clone URL contains whitespace or control characters")
    parts = urlsplit(url)
    if parts.scheme not in _ALLOWED_SCHEMES:
        raise RepoError(f"unsupported clone URL scheme: {parts.scheme or '(none)'}")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise RepoError("the clone URL must not carry credentials; pass an Authorization header instead")
    if parts.scheme != "file" and not parts.hostname:
        raise RepoError("the clone URL has no host")
    return url


def check_sha(commit: str) -> str:
    if not _SHA.fullmatch(commit):
        raise RepoError(f"not a full commit id: {commit[:80]!r}")
    return commit


def check_branch(branch: str) -> str:
    """`branch` if it is a valid branch name under `frogfix/`; RepoError otherwise (no network)."""
    if not isinstance(branch, str) or not branch.startswith(BRANCH_PREFIX) or len(branch) > 200:
        raise RepoError(f"refusing to push to {branch!r}: FrogFix pushes only to branches under {BRANCH_PREFIX}")
    rest = branch[len(BRANCH_PREFIX) :]
    if not rest or any(ch.isspace() or ord(ch) < 32 or ch in "~^:?*[\\" for ch in branch) or ".." in branch:
        raise RepoError(f"refusing to push to {branch!r}: not a valid branch name")
    done = run_git(
        ["check-ref-format", f"refs/heads/{branch}"],
        env=git_environment(),
        what="check-ref-format",
        timeout=LOCAL_TIMEOUT,
        check=False,
    )
    if done.returncode != 0:
        raise RepoError(f"refusing to push to {branch!r}: not a valid branch name")
    return branch


def branch_for_issue(number: int) -> str:
    return f"{BRANCH_PREFIX}issue-{int(number)}"


# ---------------------------------------------------------------------------------------------
# Locks
# ---------------------------------------------------------------------------------------------


def _lock_path(mirror: Path) -> Path:
    return mirror.with_name(mirror.name.removesuffix(".git") + ".lock")


@contextlib.contextmanager
def _flock(path: Path, *, exclusive: bool, wait: float = LOCK_WAIT) -> Iterator[None]:
    """flock on `path` (created if missing), polled so a stuck holder cannot block us forever."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        deadline = time.monotonic() + wait
        delay = 0.01
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RepoTransient(f"the mirror lock {path.name} is still held after {wait:.0f}s") from None
                time.sleep(delay)
                delay = min(delay * 2, 0.2)
        yield
    finally:
        os.close(fd)  # closing drops the lock


@contextlib.contextmanager
def reading_lock(mirror: Path) -> Iterator[None]:
    """A shared lock on one of our mirrors (no-op for any other repository)."""
    lock = _lock_path(mirror)
    if mirror.name.endswith(".git") and lock.exists():
        with _flock(lock, exclusive=False):
            yield
    else:
        yield


# ---------------------------------------------------------------------------------------------
# Mirrors
# ---------------------------------------------------------------------------------------------


class RepoCache:
    """Bare mirrors of forge repositories under `root`, one per key, updated in place."""

    def __init__(self, root: Path, *, timeout: float = NETWORK_TIMEOUT) -> None:
        self.root = Path(root)
        self.timeout = timeout

    def path_for(self, key: str) -> Path:
        return self.root / f"{_check_key(key)}.git"

    def mirror(self, key: str, clone_url: str, auth_header: str | None) -> Path:
        """The mirror for `key`, created or brought up to date (heads only, pruned); its path.

        Holds the mirror's exclusive lock throughout, so concurrent callers fetch one at a time
        (the second one's fetch is then a cheap no-op).
        """
        path = self.path_for(key)
        _check_url(clone_url)
        self.root.mkdir(parents=True, exist_ok=True)
        with _flock(_lock_path(path), exclusive=True):
            if (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir():
                self._update(path, clone_url, auth_header)
            else:
                self._create(path, clone_url, auth_header)
        return path

    def _network_env(self, clone_url: str, auth_header: str | None) -> dict[str, str]:
        env = git_environment()
        return git_auth_env(auth_header, url=clone_url, base_env=env) if auth_header else env

    def _fetch(self, path: Path, clone_url: str, auth_header: str | None) -> None:
        run_git(
            [*git_dir_args(path), "fetch", *_FETCH_FLAGS, "--prune", "--", clone_url, HEADS_REFSPEC],
            env=self._network_env(clone_url, auth_header),
            what="git fetch",
            timeout=self.timeout,
            secrets=_secret_forms(auth_header),
            network=True,
        )

    def _set_head(self, path: Path, clone_url: str, auth_header: str | None) -> None:
        """Point the mirror's HEAD at the remote's default branch (one ls-remote)."""
        done = run_git(
            ["ls-remote", "--symref", "--", clone_url, "HEAD"],
            env=self._network_env(clone_url, auth_header),
            what="git ls-remote",
            timeout=self.timeout,
            secrets=_secret_forms(auth_header),
            network=True,
            cwd=path,
        )
        match = re.search(rb"^ref: (refs/heads/\S+)\tHEAD$", done.stdout, re.M)
        if match is not None:
            run_git(
                [*git_dir_args(path), "symbolic-ref", "HEAD", match.group(1).decode()],
                env=git_environment(),
                what="git symbolic-ref",
                timeout=LOCAL_TIMEOUT,
            )

    def _create(self, path: Path, clone_url: str, auth_header: str | None) -> None:
        """init --bare + fetch in a side folder, renamed into place only once it worked."""
        staging = path.with_name(path.name + ".new")
        for leftover in (staging, path):
            if leftover.exists():
                remove_workspace(leftover)
        env = git_environment()
        run_git(
            ["init", "--quiet", "--bare", "--template=", str(staging)], env=env, what="git init", timeout=LOCAL_TIMEOUT
        )
        try:
            with (staging / "config").open("a", encoding="utf-8") as config:
                for key, value in _MIRROR_CONFIG:
                    section, name = key.split(".")
                    config.write(f"[{section}]\n\t{name} = {value}\n")
            self._fetch(staging, clone_url, auth_header)
            self._set_head(staging, clone_url, auth_header)
            staging.rename(path)
        except BaseException:
            remove_workspace(staging)
            raise

    def _update(self, path: Path, clone_url: str, auth_header: str | None) -> None:
        _clear_stale_locks(path)
        self._fetch(path, clone_url, auth_header)
        head = run_git(
            [*git_dir_args(path), "rev-parse", "--verify", "--quiet", "HEAD"],
            env=git_environment(),
            what="git rev-parse",
            timeout=LOCAL_TIMEOUT,
            check=False,
        )
        if head.returncode != 0:  # the default branch was renamed or deleted upstream
            self._set_head(path, clone_url, auth_header)


def _clear_stale_locks(mirror: Path) -> None:
    """Remove ref lock files a killed fetch (timeout) left behind; they would fail every later fetch.

    Safe only under the mirror's exclusive flock: nothing else updates refs in our mirrors.
    """
    candidates = [mirror / name for name in ("packed-refs.lock", "HEAD.lock", "config.lock", "shallow.lock")]
    candidates += list((mirror / "refs").rglob("*.lock"))
    for lock in candidates:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()


def resolve(mirror: Path, ref: str) -> str:
    """The full commit id `ref` (a branch, `HEAD`, `refs/heads/x` or a sha) names in `mirror`."""
    if not ref or ref.startswith("-") or any(ch.isspace() or ord(ch) < 32 for ch in ref):
        raise RepoError(f"not a valid ref: {ref[:80]!r}")
    with reading_lock(mirror):
        done = run_git(
            [*git_dir_args(mirror), "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
            env=git_environment(),
            what="git rev-parse",
            timeout=LOCAL_TIMEOUT,
            check=False,
        )
    if done.returncode != 0:
        raise RepoError(f"{ref[:80]!r} names no commit in the mirror")
    return done.stdout.decode().strip()


def describe(mirror: Path, commit: str) -> tuple[str, int] | None:
    """The last tag reachable from `commit` and how many commits lie past it, or None (no tag, a shallow
    history, or anything git will not say): what setuptools-scm and hatch-vcs would read from a full clone."""
    check_sha(commit)
    with reading_lock(mirror):
        done = run_git(
            [*git_dir_args(mirror), "describe", "--tags", "--long", "--end-of-options", commit],
            env=git_environment(),
            what="git describe",
            timeout=LOCAL_TIMEOUT,
            check=False,
        )
    match = re.fullmatch(r"(.+)-(\d+)-g[0-9a-f]+", done.stdout.decode("utf-8", "replace").strip())
    if done.returncode != 0 or match is None:
        return None
    return match.group(1), int(match.group(2))


def has_uncommitted_changes(checkout: Path) -> bool:
    """Whether a user's checkout differs from its HEAD (for a note only): isolated, and writes nothing there."""
    done = run_git(
        ["--no-optional-locks", "-C", str(checkout), "status", "--porcelain", "-z"],
        env=git_environment(),
        what="git status",
        timeout=LOCAL_TIMEOUT,
        check=False,
    )
    return done.returncode == 0 and bool(done.stdout.strip(b"\0"))


# ---------------------------------------------------------------------------------------------
# Workspaces
# ---------------------------------------------------------------------------------------------


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
            config.write(_WORKSPACE_CONFIG)
        source = Path(mirror).resolve().as_uri()
        with reading_lock(Path(mirror)):
            present = run_git(
                [*git_dir_args(Path(mirror)), "cat-file", "-e", f"{commit}^{{commit}}"],
                env=env,
                what="git cat-file",
                timeout=timeout,
                check=False,
            )
            if present.returncode != 0:
                raise RepoError(f"commit {commit[:12]} is not in the mirror {Path(mirror).name}")
            run_git(
                ["-C", str(dest), "fetch", *_FETCH_FLAGS, "--depth=1", "--no-auto-maintenance", "--", source, commit],
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
        with _flock(folder / "fill.lock", exclusive=True):
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
                with _flock(folder / "fill.lock", exclusive=True, wait=0):
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
        present = run_git(
            [*git_dir_args(mirror), "cat-file", "-e", f"{commit}^{{commit}}"],
            env=git_environment(),
            what="git cat-file",
            timeout=timeout,
            check=False,
        )
    if present.returncode != 0:
        raise RepoError(f"commit {commit[:12]} is not in the mirror {mirror.name}")


def _detached_head(workspace: Path) -> str:
    """What a workspace's `.git/HEAD` holds (a sha when detached), or "" when unreadable."""
    try:
        return (workspace / ".git" / "HEAD").read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# The fix commit and its push
# ---------------------------------------------------------------------------------------------


def _check_person(who: tuple[str, str], role: str) -> tuple[str, str]:
    name, email = who
    for part in (name, email):
        if not part or any(ord(ch) < 32 or ch in "<>" for ch in part):
            raise RepoError(f"bad {role} identity: {who!r}")
    return name, email


def commit_patch(
    mirror: Path,
    base: str,
    patch: str | bytes,
    message: str,
    author: tuple[str, str],
    scratch: Path,
    *,
    committer: tuple[str, str] | None = None,
    timeout: float = LOCAL_TIMEOUT,
    expect_tree: str | None = None,
) -> str:
    """Commit `patch` on top of `base` and return the new commit id.

    With `expect_tree` (the tree the review judged, worker/patch_evidence.py) any other result is
    refused, so what is pushed is exactly what was judged and tested.

    The patch is applied with `git apply --cached --binary` to a private index under
    `scratch` (read from `base`), never to a work tree: binary files, modes and symlinks are
    kept, paths outside the tree or inside `.git` are refused by git apply, and nothing on
    disk outside the index can be touched. The commit (a single parent, never a merge) is
    written straight into `mirror`, so `push_branch(mirror, ...)` can push it; it is
    unreferenced there until the next fetch brings our pushed branch back.
    """
    check_sha(base)
    author = _check_person(author, "author")
    committer = _check_person(committer or author, "committer")
    data = patch.encode("utf-8", "surrogateescape") if isinstance(patch, str) else bytes(patch)
    if not data.strip():
        raise RepoError("the patch is empty")
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    index = scratch / "frogfix-commit.index"
    env = git_environment()
    env.update(
        GIT_INDEX_FILE=str(index),
        GIT_AUTHOR_NAME=author[0],
        GIT_AUTHOR_EMAIL=author[1],
        GIT_COMMITTER_NAME=committer[0],
        GIT_COMMITTER_EMAIL=committer[1],
    )
    repo = git_dir_args(Path(mirror))
    try:
        with reading_lock(Path(mirror)):
            run_git([*repo, "read-tree", base], env=env, what="git read-tree", timeout=timeout)
            base_tree = run_git(
                [*repo, "rev-parse", f"{base}^{{tree}}"], env=env, what="git rev-parse", timeout=timeout
            )
            run_git(
                [*repo, "apply", "--cached", "--binary", "--whitespace=nowarn", "-"],
                env=env,
                what="applying the patch",
                timeout=timeout,
                stdin=data,
            )
            tree = run_git([*repo, "write-tree"], env=env, what="git write-tree", timeout=timeout).stdout.strip()
            if tree == base_tree.stdout.strip():
                raise RepoError("the patch changes nothing")
            if expect_tree is not None and tree.decode() != expect_tree:
                raise RepoError(f"the patch made tree {tree.decode()[:12]}, not the reviewed {expect_tree[:12]}")
            text = message.strip() + "\n"
            done = run_git(
                [*repo, "commit-tree", tree.decode(), "-p", base, "-F", "-"],
                env=env,
                what="git commit-tree",
                timeout=timeout,
                stdin=text.encode("utf-8"),
            )
    finally:
        index.unlink(missing_ok=True)
    return done.stdout.decode().strip()


PUSH_OPTION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:=[\x20-\x7e]*)?")  # ci.skip, ci.variable=K=V


def push_branch(
    source_repo: Path,
    clone_url: str,
    auth_header: str | None,
    branch: str,
    commit: str,
    *,
    expect_old: str | None = None,
    push_options: Sequence[str] = (),
    fast_forward: bool = False,
    timeout: float = NETWORK_TIMEOUT,
) -> None:
    """Push `commit` to `refs/heads/<branch>` and to nothing else; `branch` must be `frogfix/...`.

    Force policy: the branch is ours, and a new attempt for the same issue replaces the old
    one, so by default that one ref is force-updated (`+<sha>:refs/heads/<branch>`; no other
    ref, no tags, no merge). A caller that recorded what it last pushed can pass `expect_old`
    (a sha, or "" for "must not exist yet") to get `--force-with-lease` instead: then a commit
    someone else added to our branch is never overwritten (RepoBranchMoved "stale info").
    With `fast_forward` (a review round, which builds on the branch's head) nothing is ever forced:
    the refspec has no `+`, and `expect_old` must be an ancestor of `commit` (checked here), so the
    lease can only let a fast-forward from it through; a branch that moved meanwhile is
    RepoBranchMoved, never overwritten.
    `push_options` go to the server as `git push -o` (GitLab's `ci.skip`); a server that does not
    advertise push options refuses the push.
    All validation happens before any network call.
    """
    check_branch(branch)
    check_sha(commit)
    _check_url(clone_url)
    for option in push_options:
        if not PUSH_OPTION.fullmatch(option):
            raise RepoError(f"invalid push option {option!r}")
    options = [arg for option in push_options for arg in ("-o", option)]
    if expect_old not in (None, ""):
        check_sha(str(expect_old))
    ref = f"refs/heads/{branch}"
    source = Path(source_repo)
    repo = git_dir_args(source)
    with reading_lock(source):
        exists = run_git(
            [*repo, "cat-file", "-e", f"{commit}^{{commit}}"],
            env=git_environment(),
            what="git cat-file",
            timeout=LOCAL_TIMEOUT,
            check=False,
        )
        if exists.returncode != 0:
            raise RepoError(f"commit {commit[:12]} is not in {source.name}")
        if fast_forward and expect_old:
            _check_ancestor(repo, str(expect_old), commit)
        args = ["push", "--porcelain", "--no-verify", *options]
        if expect_old is not None:
            args.append(f"--force-with-lease={ref}:{expect_old}")
        plus = "" if fast_forward or expect_old is not None else "+"
        args += ["--", clone_url, f"{plus}{commit}:{ref}"]
        env = git_environment()
        if auth_header:
            env = git_auth_env(auth_header, url=clone_url, base_env=env)
        done = run_git([*repo, *args], env=env, what="git push", timeout=timeout, check=False)
    if done.returncode != 0:
        output = done.stdout.decode("utf-8", "replace") + "\n" + done.stderr.decode("utf-8", "replace")
        secrets = _secret_forms(auth_header)
        if "stale info" in output or "[rejected]" in output:  # a lease or fast-forward refusal
            raise RepoBranchMoved(f"git push to {branch} was rejected (the branch moved): {_summary(output, secrets)}")
        if "[remote rejected]" in output:
            raise RepoError(f"git push to {branch} was rejected: {_summary(output, secrets)}")
        raise _classify(f"git push to {branch}", output, secrets)


def _check_ancestor(repo: list[str], old: str, commit: str) -> None:
    """RepoBranchMoved unless `commit` descends from `old`: a fast-forward push from `old` only."""
    done = run_git(
        [*repo, "merge-base", "--is-ancestor", old, commit],
        env=git_environment(),
        what="git merge-base",
        timeout=LOCAL_TIMEOUT,
        check=False,
    )
    if done.returncode == 1:
        raise RepoBranchMoved(f"{commit[:12]} does not build on {old[:12]}: FrogFix pushes only fast-forwards here")
    if done.returncode != 0:
        raise RepoError(f"git merge-base failed: {_summary(done.stderr.decode('utf-8', 'replace'), [])}")


def merge_base(mirror: Path, one: str, other: str) -> str:
    """The best common ancestor of two commits (a round's base: where the bot's branch left the default branch)."""
    for commit in (one, other):
        check_sha(commit)
    with reading_lock(mirror):
        done = run_git(
            [*git_dir_args(mirror), "merge-base", one, other],
            env=git_environment(),
            what="git merge-base",
            timeout=LOCAL_TIMEOUT,
            check=False,
        )
    found = done.stdout.decode().strip()
    if done.returncode != 0 or not _SHA.fullmatch(found):
        raise RepoError(f"{one[:12]} and {other[:12]} have no common ancestor in the mirror")
    return found


def diff_text(mirror: Path, base: str, head: str, *, limit: int = 40_000) -> str:
    """`git diff base head` as text (binary files named, not shown), cut to `limit` characters with a note."""
    for commit in (base, head):
        check_sha(commit)
    args = ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", base, head, "--"]
    with reading_lock(mirror):
        done = run_git(
            [*git_dir_args(mirror), *args], env=git_environment(), what="git diff", timeout=LOCAL_TIMEOUT,
            max_memory=1024**3,
        )
    text = done.stdout.decode("utf-8", "replace")
    if len(text) > limit:
        text = text[:limit] + f"\n[diff cut: {len(text) - limit} more characters]"
    return text
