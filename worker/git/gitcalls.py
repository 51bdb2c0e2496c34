"""Every git call the worker makes: its environment built from scratch, run bounded, its errors, the
validation of what reaches it, and the mirror locks.

Only the worker holds forge credentials. Every git call runs with an environment built from scratch
(no system or global config, HOME an empty folder, prompts off, only the http, https and file
transports), and the Authorization header reaches git through `git_auth_env` for the one network
call that needs it: it is never written to a mirror's or a workspace's config, never on a command
line, never in a URL. Each mirror has a lock beside it (`<key>.lock`, an flock): exclusive while
fetching, shared while reading or writing objects, so two workers never fetch one mirror at once
and nobody reads a half-updated one. mirrors.py, workspace_pool.py, publishing.py and merging.py
run their git through here.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

from app.forge.api import OutboundText
from app.logs import get_logger
from app.retrying import RetryPolicy
from sandbox.polling import poll_until

BRANCH_PREFIX = "frogfix/"
HEADS_REFSPEC = "+refs/heads/*:refs/heads/*"  # heads only: no MR/PR refs from strangers, no tags
NETWORK_TIMEOUT = 900.0  # seconds for one clone, fetch or push (a big first mirror takes a while)
LOCAL_TIMEOUT = 300.0  # seconds for one local git command (workspace, commit)
LOCK_WAIT = NETWORK_TIMEOUT + 60.0  # a lock holder's own calls are bounded, so waiting is too
IDENTITY = ("FrogFix", "frogfix@localhost")

log = get_logger("frogfix.repos")
T = TypeVar("T")

_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_ALLOWED_SCHEMES = ("http", "https", "file")
FETCH_FLAGS = ("--quiet", "--no-tags", "--no-write-fetch-head")
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
MIRROR_CONFIG = (
    ("gc.autoDetach", "false"),
    ("core.logAllRefUpdates", "false"),
    ("uploadpack.allowAnySHA1InWant", "true"),
)
WORKSPACE_CONFIG = f"[user]\n\tname = {IDENTITY[0]}\n\temail = {IDENTITY[1]}\n[gc]\n\tauto = 0\n"

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


# Two more tries of a network git call, the first after 1-2 s, the second after 2-4 s. No bound in
# seconds beside that: each try is bounded by NETWORK_TIMEOUT, and a fetch that broke after minutes
# of transfer deserves its next try as much as one refused at once.
GIT_RETRY = RetryPolicy(attempts=3, budget_s=None, base_delay_s=2.0, max_delay_s=4.0)


def retry_transient(what: str, fn: Callable[[], T], *, retry: RetryPolicy = GIT_RETRY) -> T:
    """Run a network git operation under `retry`, again while it fails with RepoTransient.

    Fetches and our force-pushes of one ref are idempotent, so a blip of the git server (a 502
    from its proxy, a dropped connection) costs seconds instead of the whole job.
    """
    return retry.call(what, fn, transient=lambda exc: isinstance(exc, RepoTransient))


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


def secret_forms(auth_header: str | None) -> list[str]:
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


def error_summary(text: str, secrets: Iterable[str]) -> str:
    """git's few telling lines (fatal/error/remote/rejected), scrubbed and short."""
    lines = [line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip()]
    telling = [line for line in lines if re.match(r"(fatal|error|remote|!|hint: Updates were rejected)", line)]
    picked = (telling or lines)[-4:]
    return OutboundText(secrets).error(" | ".join(picked)) or "no message from git"


def classify_failure(what: str, stderr: str, secrets: Iterable[str]) -> RepoError:
    message = f"{what} failed: {error_summary(stderr, secrets)}"
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
            raise classify_failure(what, err.decode("utf-8", "replace"), secrets)
        raise RepoError(f"{what} failed: {error_summary(err.decode('utf-8', 'replace'), secrets)}")
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


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key) or ".." in key or key.endswith((".lock", ".git", ".new")):
        raise RepoError(f"not a safe mirror key: {key!r}")
    return key


def check_url(url: str) -> str:
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
    if not SHA.fullmatch(commit):
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


def lock_path(mirror: Path) -> Path:
    return mirror.with_name(mirror.name.removesuffix(".git") + ".lock")


@contextlib.contextmanager
def flock(path: Path, *, exclusive: bool, wait: float = LOCK_WAIT) -> Iterator[None]:
    """flock on `path` (created if missing), polled so a stuck holder cannot block us forever."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH

        def taken() -> bool:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        if not poll_until(taken, within_s=wait, first_pause_s=0.01, max_pause_s=0.2):
            raise RepoTransient(f"the mirror lock {path.name} is still held after {wait:.0f}s")
        yield
    finally:
        os.close(fd)  # closing drops the lock


@contextlib.contextmanager
def reading_lock(mirror: Path) -> Iterator[None]:
    """A shared lock on one of our mirrors (no-op for any other repository)."""
    lock = lock_path(mirror)
    if mirror.name.endswith(".git") and lock.exists():
        with flock(lock, exclusive=False):
            yield
    else:
        yield


def has_commit(repo: Path, commit: str, *, timeout: float = LOCAL_TIMEOUT) -> bool:
    """Whether `repo` holds commit `commit` (the caller holds the mirror's reading lock where it needs one)."""
    done = run_git(
        [*git_dir_args(repo), "cat-file", "-e", f"{check_sha(commit)}^{{commit}}"], env=git_environment(),
        what="git cat-file", timeout=timeout, check=False,
    )
    return done.returncode == 0


def is_ancestor(repo: Path, ancestor: str, commit: str) -> bool:
    """Whether `commit` descends from (or is) `ancestor`; RepoError when git cannot tell."""
    done = run_git(
        [*git_dir_args(repo), "merge-base", "--is-ancestor", check_sha(ancestor), check_sha(commit)],
        env=git_environment(), what="git merge-base --is-ancestor", timeout=LOCAL_TIMEOUT, check=False,
    )
    if done.returncode not in (0, 1):
        raise RepoError(f"git merge-base failed: {error_summary(done.stderr.decode('utf-8', 'replace'), [])}")
    return done.returncode == 0
