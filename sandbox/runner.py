"""FrogFix sandbox runner: the one long-lived process that executes Leaf tool calls inside a sandbox.

It stays one file, longer than the 800 lines every other module keeps to: it is copied into each
sandbox as one file and run there alone, importing nothing but the standard library.

Stdlib only, and kept runnable on Python 3.8+, because it runs under whatever `python3` the
sandbox has (Debian's /usr/bin/python3 locally, the target image's in a Kubernetes pod). Both
backends start it once and then talk JSON lines over its stdin/stdout, so a tool call costs one
pipe round trip instead of a fresh process (Leaf's way).

Protocol: one JSON object per line each way; every reply echoes the request's `id` (null when
the line could not be parsed) and carries `ok`.

    {"id": 1, "op": "ping"}                                  -> {"id": 1, "ok": true, "pong": true, ...}
    {"id": 2, "op": "tool", "name": "Read", "arguments": {}} -> {"id": 2, "ok": true, "output": "..."}
    {"id": 3, "op": "exec", "command": "pytest -q", "timeout": 600, "log_limit": 30000}
        -> {"id": 3, "ok": true, "exit_code": 0, "log": "...", "timed_out": false, "duration_s": 1.2}
    with "results_limit": N the command also gets the results channel: a pipe whose write end it
    inherits, named by FROGFIX_RESULTS_FD; the reply adds "results" (what arrived while the command
    ran, read once more when it ended and never after) and "results_overflow" (more than N bytes)
    {"id": 4, "op": "patch", "base": "<sha>"}                -> {"id": 4, "ok": true, "patch_b64": "..."}
    {"id": 5, "op": "settle"}                                -> {"id": 5, "ok": true, "left": 0}
    (with --reclaim: every other process of the sandbox killed and reaped, so what the worker then reads
    of the sandbox's files no process changes; `left` counts any that remain)
    {"id": 6, "op": "shutdown"}                              -> {"id": 6, "ok": true}, then exit 0
    anything malformed or failing in the runner itself
        -> {"id": ..., "ok": false, "code": "bad_request", "error": "ValueError: bad request: ..."}

An error reply's `code` says what failed, for callers to act on (its `error` text is for people
and may change; no caller reads it):
    bad_request      the line is not a JSON object, the op is unknown, or a field is missing,
                     ill-typed or invalid (e.g. a patch base that is not a commit name)
    patch_too_large  the diff exceeds the request's `max_bytes` (nothing is returned)
    timeout          a git step of the patch ran past its time limit
    git_failed       git add or git diff failed (e.g. the base commit does not exist)
    internal         anything else that went wrong in the runner itself
The text is `<ExceptionKind>: <message>` (the builtin kind, e.g. `ValueError`), except for lines
that are not JSON objects.

A tool's own failure is not a protocol error: it is the tool's output text
(`<ExceptionName>: <message>`), exactly as Leaf returns it to the model.

Details LEAF.md leaves open, decided here (and relied on by tests/sandbox):
- Paths: relative paths are relative to the workspace root; `~` is expanded; `path` is
  accepted as an alias of `file_path`. Every path shown (Read's first line, Wrote/Edited,
  Glob lines, error messages) is the lexically normalised path relative to the workspace
  root, or the absolute path when it lies outside the root. Symlinks are not resolved for
  display; the file operations themselves use the path as given, so `link/..` follows the
  kernel's rules, not the display's.
- Write and Edit refuse (PermissionError) any target whose fully resolved path (symlinks and
  `..` followed) is outside the workspace root. Read and Glob may look at the rest of the
  sandbox's read-only view (e.g. installed library sources), which holds no host secrets.
- Integer and boolean arguments given as strings are converted ("12", "12.0", "true", "yes",
  "1"); a value that cannot be converted is an error text naming the argument.
- Required arguments (Read/Write/Edit `file_path`; Write `content`; Edit `old_string`,
  `new_string`; Glob `pattern`; Bash `command`) missing -> `ValueError: <name> is required`.
  Empty `content` and empty `new_string` are allowed; an empty `old_string` is an error.
- Non-string `content`/`old_string`/`new_string` values are converted (numbers with str(),
  objects and lists as JSON); `arguments` itself may arrive as a JSON string.
- Read: lines split like `str.splitlines()`, text decoded as UTF-8 with replacement; an empty
  selection still prints the path line followed by a newline; `limit` <= 0 means no limit;
  `offset` below 1 means 1. Read, Write and Edit refuse FIFOs, devices and sockets
  (`OSError: [Errno 22] Not a regular file: ...`) instead of blocking forever on them.
- Edit: keeps the file's bytes outside the replaced text (undecodable bytes survive); when the
  text is not found as given but the file uses CRLF line ends, the CRLF form of old/new is
  used, so editing a CRLF file does not rewrite every line end.
- Glob: Python glob syntax (`*`, `?`, `[..]`, `**` = any depth), applied from `path` (default
  the root; a missing folder just matches nothing); results are still shown relative to the
  workspace root. Names starting with `.` only match pattern parts that start with `.`; `**`
  does not descend into symlinked folders (no loops); symlinks to files count as files.
- Bash: stdin is /dev/null; the command runs in its own session/process group; on timeout the
  whole group is killed. Output is read until both pipes close or the timeout passes (Leaf
  waits the same way), with only a bounded prefix kept and the rest counted, so the
  `[truncated <k> chars]` count stays exact without holding the output. Normal output gets
  universal newlines (as Leaf's text-mode subprocess), timed-out output is raw, as in Leaf.
  Undecodable bytes become U+FFFD instead of failing the call.
- Background processes a Bash call leaves behind keep running (servers started with `&` work
  as under Leaf) until the sandbox closes. But when such leftovers hold three quarters of the
  sandbox's process slots (e.g. a fork bomb still running in the background), or a fork fails
  for lack of slots, a runner started with `--reclaim` (alone in its own pid namespace) kills
  every other process in it before starting the next command, so the run can go on.
- With `--clear-ipc` as well (the local backend: the sandbox has its own IPC namespace), the
  System V objects (shared memory, message queues, semaphores) left in the namespace are removed
  before each command, after the leftovers are killed: no process holds them, and they would
  keep their memory until the sandbox closes.
- The channel is out of reach of everything the runner starts: the runner makes itself
  non-dumpable before it reads its first request (and refuses to serve if it cannot), and
  commands inherit only /dev/null and their own output pipes. Started as a pid namespace's
  init (the local backend), it also reaps the orphans commands leave behind.
"""

from __future__ import annotations

import base64
import codecs
import collections
import contextlib
import errno
import fnmatch
import io
import json
import math
import os
import re
import resource
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

# typing is only for the type checker: importing it is a tenth of the runner's start-up.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import IO, Any

READ_LIMIT = 20_000
BASH_LIMIT = 30_000
# The results channel of a pipeline command (worker/attempts/run_checks.py reads it): the variable naming its
# descriptor, and the most it keeps; past that it says so ("overflow") instead of cutting a line.
RESULTS_FD_VARIABLE = "FROGFIX_RESULTS_FD"
MAX_RESULTS_BYTES = 64 * 1024 * 1024
GLOB_LIMIT = 1_000
DEFAULT_BASH_TIMEOUT = 120.0
MIN_TIMEOUT = 0.1
PIPE_CHUNK = 65_536
KILL_DRAIN_S = 2.0
MAX_PATCH_BYTES = 256 * 1024 * 1024
LINE_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
_MAGIC = re.compile(r"[*?[]")
_TRUE = frozenset({"1", "true", "yes", "on", "y", "t"})
_FALSE = frozenset({"0", "false", "no", "off", "n", "f", ""})

# --------------------------------------------------------------------------- protocol errors


class BadRequest(ValueError):
    """A request the runner cannot serve as sent: reported with code `bad_request`."""

    code = "bad_request"


class PatchTooLarge(ValueError):
    """The diff is over the request's byte limit: reported with code `patch_too_large`."""

    code = "patch_too_large"


class GitFailed(RuntimeError):
    """git add or git diff failed: reported with code `git_failed`."""

    code = "git_failed"


def error_code(exc: BaseException) -> str:
    """The protocol code for an exception raised while serving a request."""
    if isinstance(exc, TimeoutError):
        return "timeout"
    return str(getattr(exc, "code", "internal"))


def error_text(exc: BaseException) -> str:
    """`<kind>: <message>`, the kind being the builtin exception class (our subclasses are
    details of the runner, and the text stays what it was before codes existed)."""
    kind = next(cls for cls in type(exc).__mro__ if cls.__module__ == "builtins")
    return f"{kind.__name__}: {exc}"


# --------------------------------------------------------------------------- argument parsing


def _required_text(args: dict[str, Any], key: str, *aliases: str) -> str:
    """A required string argument; scalars are stringified, containers JSON-encoded."""
    for name in (key, *aliases):
        if args.get(name) is not None:
            return _as_text(args[name])
    raise ValueError(f"{key} is required")


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value)


def _int_arg(args: dict[str, Any], key: str, default: int) -> int:
    """An optional integer that a text-parsed call may deliver as a string ("12", "12.0")."""
    value = args.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        return default
    try:
        if isinstance(value, bool):
            return int(value)
        if isinstance(value, (int, float)):
            return int(value)
        text = str(value).strip()
        try:
            return int(text)
        except ValueError:
            return int(float(text))
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{key} must be an integer, got {value!r}") from None


def _bool_arg(args: dict[str, Any], key: str) -> bool:
    value = args.get(key)
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, (int, float)):
        return value != 0
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{key} must be a boolean, got {value!r}")


def _number(value: Any, key: str) -> float:
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a number, got {value!r}") from None
    if not math.isfinite(number):  # NaN and the infinities: no deadline can be set from them
        raise ValueError(f"{key} must be a finite number, got {value!r}")
    return number


def bash_timeout(args: dict[str, Any], default: float = DEFAULT_BASH_TIMEOUT) -> float:
    """Leaf's rule: `timeout_ms` wins; a `timeout` over 1000 is milliseconds; never under 0.1 s."""
    if args.get("timeout_ms") is not None:
        return max(MIN_TIMEOUT, _number(args["timeout_ms"], "timeout_ms") / 1000.0)
    raw = args.get("timeout")
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return max(MIN_TIMEOUT, default)
    value = _number(raw, "timeout")
    return max(MIN_TIMEOUT, value / 1000.0 if value > 1000 else value)


def truncate(text: str, limit: int) -> str:
    """Leaf's cut: the first `limit` characters, then a line saying how many were dropped."""
    if limit <= 0 or len(text) <= limit:
        return text
    return f"{text[:limit]}\n[truncated {len(text) - limit} chars]"


# --------------------------------------------------------------------------- bounded capture


class Prefix:
    """Keeps the first `keep` characters of a byte stream and only counts the rest.

    This is what lets a command print gigabytes without the runner holding them, while the
    `[truncated <k> chars]` count stays exact. CRLF pairs are counted so that the length after
    universal-newline translation is known too.
    """

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.chars = 0
        self.crlf = 0
        self._parts: list[str] = []
        self._kept = 0
        self._last = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final)
        if not text:
            return
        self.chars += len(text)
        self.crlf += text.count("\r\n") + (1 if self._last == "\r" and text[0] == "\n" else 0)
        self._last = text[-1]
        if self._kept < self.keep:
            part = text[: self.keep - self._kept]
            self._parts.append(part)
            self._kept += len(part)

    def result(self, translate: bool) -> tuple[str, int]:
        """(kept prefix, full length), with \\r\\n and \\r turned into \\n when `translate`."""
        kept = "".join(self._parts)
        if translate:
            return kept.replace("\r\n", "\n").replace("\r", "\n"), self.chars - self.crlf
        return kept, self.chars


class HeadTail:
    """Keeps the head and the tail of a log (a failing test run ends with its summary)."""

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 64)
        self.head_keep = self.limit // 3
        self.tail_keep = self.limit - self.head_keep
        self.chars = 0
        self._head: list[str] = []
        self._head_len = 0
        self._tail: collections.deque[str] = collections.deque()
        self._tail_len = 0
        self._decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")("replace"), translate=True)

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self._decoder.decode(data, final)
        if not text:
            return
        self.chars += len(text)
        if self._head_len < self.head_keep:
            part = text[: self.head_keep - self._head_len]
            self._head.append(part)
            self._head_len += len(part)
            text = text[len(part) :]
        if text:
            self._tail.append(text)
            self._tail_len += len(text)
            while self._tail and self._tail_len - len(self._tail[0]) >= self.tail_keep:
                self._tail_len -= len(self._tail.popleft())

    def result(self) -> str:
        head = "".join(self._head)
        tail = "".join(self._tail)
        if self.chars <= self.limit:
            return head + tail
        tail = tail[-self.tail_keep :]
        omitted = self.chars - len(head) - len(tail)
        return f"{head}\n[... {omitted} chars omitted ...]\n{tail}"


class _Spawner:
    """Starts shell commands; with `reclaim` (the runner alone in its pid namespace), each one
    starts in a sandbox that holds no process left over from an earlier call.

    A leftover runs as the sandbox's one uid and is dumpable, so it could open
    /proc/<pid>/fd/1 of the next command and write lines into its output: a test log that
    claims what never ran, or text in the model's next tool result. Killing the leftovers
    before each start leaves no other process in the sandbox while a command runs but that
    command's own. (It also clears what a fork bomb left.) Background processes therefore do
    not outlive the call that started them, as under the Leaf protocol's one-shot `bash -lc`.
    """

    def __init__(self, reclaim: bool = False, clear_ipc: bool = False) -> None:
        self.reclaim = reclaim
        self.clear_ipc = clear_ipc and reclaim  # only once no other process can be using them

    def popen(self, argv: list[str], cwd: str, merge_stderr: bool, side: int | None = None) -> subprocess.Popen[bytes]:
        if self.reclaim and any_leftover():
            reclaim_processes()
        if self.clear_ipc:
            clear_ipc_objects()
        try:
            return self._popen(argv, cwd, merge_stderr, side)
        except BlockingIOError:
            if not self.reclaim:
                raise
            reclaim_processes()
            return self._popen(argv, cwd, merge_stderr, side)

    @staticmethod
    def _popen(argv: list[str], cwd: str, merge_stderr: bool, side: int | None) -> subprocess.Popen[bytes]:
        """`side`: a pipe's write end the command inherits, named in RESULTS_FD_VARIABLE (the results channel)."""
        env = None if side is None else {**os.environ, RESULTS_FD_VARIABLE: str(side)}
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            start_new_session=True,
            close_fds=True,
            pass_fds=() if side is None else (side,),
            restore_signals=True,
        )


def any_leftover() -> bool:
    """Whether `leftovers()` has any, asked cheaply before every command: as the pid namespace's
    init the runner has every other process of it below itself, so its children's lists (a small
    read per thread) say; elsewhere, or without /proc/<pid>/task/<tid>/children, it scans."""
    if os.getpid() == 1:
        try:
            for task in os.listdir("/proc/self/task"):
                fd = os.open(f"/proc/self/task/{task}/children", os.O_RDONLY | os.O_CLOEXEC)
                try:
                    if os.read(fd, 64).strip():
                        return True
                finally:
                    os.close(fd)
            return False
        except OSError:
            pass
    return bool(leftovers())


def leftovers() -> list[int]:
    """Processes of this pid namespace other than init and the runner.

    Calls run one at a time, so between calls every such process is a leftover of an earlier one.
    """
    me = os.getpid()
    return [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) not in (1, me)]


def reclaim_processes(wait_s: float = 5.0) -> None:
    """Kill every process of this pid namespace but init and ourselves, then wait for reaping.

    Only for a runner that is alone in its own pid namespace (the `--reclaim` flag): there,
    kill(-1) reaches exactly the sandbox's other processes, atomically, so even a fork bomb
    cannot outrun it.
    """
    with contextlib.suppress(OSError):
        os.kill(-1, signal.SIGKILL)
    _reap_children()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not leftovers():
            return
        _reap_children()
        time.sleep(0.02)


IPC_RMID = 0
_SYSV_KINDS = ("shm", "msg", "sem")


def sysv_ipc_ids() -> dict[str, list[int]]:
    """The System V objects of this IPC namespace by kind (/proc/sysvipc: the id is the 2nd column)."""
    found: dict[str, list[int]] = {}
    for kind in _SYSV_KINDS:
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="ascii", errors="replace") as handle:
                rows = [line.split() for line in handle.readlines()[1:]]
        except OSError:
            rows = []
        found[kind] = [int(row[1]) for row in rows if len(row) > 1 and row[1].isdigit()]
    return found


# The *_INFO commands answer how many objects of each kind this IPC namespace holds, in one call
# each: the first int of struct shm_info (used_ids) and of struct msginfo (msgpool), the eighth of
# struct seminfo (semusz). A buffer of 16 ints holds any of the three.
SHM_INFO, MSG_INFO, SEM_INFO = 14, 12, 19
_INFO_INTS = 16


def any_ipc_object() -> bool:
    """Whether this IPC namespace holds any System V object, asked before every command: three
    system calls instead of reading /proc/sysvipc (where they fail, it is read)."""
    import ctypes  # loaded already: make_undumpable needs it

    libc = _libc()
    counts = []
    for ask in (
        lambda info: libc.shmctl(0, SHM_INFO, info),
        lambda info: libc.msgctl(0, MSG_INFO, info),
        lambda info: libc.semctl(0, 0, SEM_INFO, info),
    ):
        info = (ctypes.c_int * _INFO_INTS)()
        if ask(info) < 0:
            return any(sysv_ipc_ids().values())
        counts.append(info)
    return counts[0][0] > 0 or counts[1][0] > 0 or counts[2][7] > 0


_LIBC: list[Any] = []


def _libc() -> Any:
    if not _LIBC:
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def clear_ipc_objects() -> None:
    """Remove every System V object of this IPC namespace (IPC_RMID; all are the sandbox uid's)."""
    if not any_ipc_object():
        return
    found = sysv_ipc_ids()
    libc = _libc()
    for ident in found["shm"]:
        libc.shmctl(ident, IPC_RMID, None)
    for ident in found["msg"]:
        libc.msgctl(ident, IPC_RMID, None)
    for ident in found["sem"]:
        libc.semctl(ident, 0, IPC_RMID)


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def reap_orphans(running: subprocess.Popen[bytes] | None = None) -> None:
    """As the sandbox's init (pid 1), reap the exited processes that commands left behind.

    Orphans re-parent to init, and an unreaped one still counts against RLIMIT_NPROC. The
    command being run (`running`) is reaped through its Popen, never by a bare waitpid: that
    would leave Popen no status, and it reports 0 for a command that failed.
    """
    if os.getpid() != 1:
        return  # not init: orphans are not ours, and children may belong to a caller's Popen
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        if running is not None and info.si_pid == running.pid:
            if running.poll() is None:  # it is waitable, so poll() reaps it; never spin on it
                return
            continue
        with contextlib.suppress(ChildProcessError):
            os.waitpid(info.si_pid, os.WNOHANG)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _wait_group_gone(pgid: int, wait_s: float) -> None:
    """Wait until every member of the group is reaped, so its processes no longer count."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        reap_orphans()
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.01)


def run_captured(
    spawner: _Spawner,
    argv: list[str],
    cwd: str,
    timeout: float,
    out: Callable[[bytes, bool], None],
    err: Callable[[bytes, bool], None] | None,
    side: Callable[[bytes, bool], None] | None = None,
) -> tuple[int, bool, float]:
    """Run `argv` in its own process group, streaming its output into bounded sinks.

    Returns (exit code, timed out, seconds). Output is read until both pipes close (so
    a background child that keeps them open runs into the timeout, as under Leaf); on timeout
    the whole process group is killed, not just the shell.

    `side`: the results channel, a pipe the command inherits (RESULTS_FD_VARIABLE names its
    descriptor). It is read while the output is, and once more, without waiting, when the command
    has ended: what a leftover writes there later is never read.
    """
    start = time.monotonic()
    channel = os.pipe() if side is not None else None
    try:
        proc = spawner.popen(argv, cwd, merge_stderr=err is None, side=channel[1] if channel else None)
    finally:
        if channel is not None:
            os.close(channel[1])
    deadline = start + timeout
    sinks: dict[int, Callable[[bytes, bool], None]] = {}
    poller = select.poll()  # (no epoll descriptor to make and close for each command)
    streams = [(proc.stdout, out)] if err is None else [(proc.stdout, out), (proc.stderr, err)]
    for stream, sink in streams:
        assert stream is not None
        os.set_blocking(stream.fileno(), False)
        poller.register(stream.fileno(), select.POLLIN)
        sinks[stream.fileno()] = sink
    outputs = set(sinks)  # the command's own output: read until it closes (the channel is not waited for)
    if channel is not None and side is not None:
        os.set_blocking(channel[0], False)
        poller.register(channel[0], select.POLLIN)
        sinks[channel[0]] = side
    timed_out = False
    drain_until = 0.0
    try:
        while outputs & sinks.keys():
            now = time.monotonic()
            if not timed_out and now >= deadline:
                timed_out = True
                _kill_group(proc.pid)
                drain_until = now + KILL_DRAIN_S
            if timed_out and now >= drain_until:
                break
            wait = (drain_until if timed_out else deadline) - now
            reap_orphans(proc)
            for fd, _ in poller.poll(math.ceil(max(0.0, min(wait, 1.0)) * 1000)):
                _pump(poller, sinks, fd)
        if not timed_out and not _exited_within(proc, max(0.0, deadline - time.monotonic())):
            timed_out = True
            _kill_group(proc.pid)
        if channel is not None and channel[0] in sinks:
            _pump(poller, sinks, channel[0], until_empty=True)
    finally:
        for stream, sink in streams:
            sink(b"", True)
            if stream is not None:
                stream.close()
        if channel is not None:
            if side is not None:
                side(b"", True)
            os.close(channel[0])
        if proc.poll() is None:
            _kill_group(proc.pid)
        proc.wait()
    if timed_out and spawner.reclaim:
        # In our own pid namespace init reaps at once; waiting frees the group's process slots
        # before the next call needs them.
        _wait_group_gone(proc.pid, KILL_DRAIN_S)
    return proc.returncode, timed_out, time.monotonic() - start


def _pump(
    poller: select.poll, sinks: dict[int, Callable[[bytes, bool], None]], fd: int, until_empty: bool = False
) -> None:
    """Read what `fd` holds into its sink; at EOF the descriptor leaves the poll. `until_empty`: read
    until nothing is waiting (the results channel's last look), never waiting for more."""
    while True:
        try:
            data = os.read(fd, PIPE_CHUNK)
        except BlockingIOError:
            return
        if data:
            sinks[fd](data, False)
            if not until_empty:
                return
        else:
            poller.unregister(fd)
            del sinks[fd]
            return


def _exited_within(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait for `proc` to exit, woken by its pidfd: Popen.wait(timeout) sleeps in steps from 0.5 ms,
    a third of an `echo`'s whole call."""
    if proc.poll() is not None:
        return True
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # before Linux 5.3 / Python 3.9: Popen's own wait
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + timeout
    try:
        while not select.select([pidfd], [], [], min(max(deadline - time.monotonic(), 0.0), 3600.0))[0]:
            if time.monotonic() >= deadline:  # (a timeout past any clock is waited an hour at a time)
                return False
    finally:
        os.close(pidfd)
    proc.wait()
    return True


# --------------------------------------------------------------------------- the five tools


class Tools:
    """Leaf's five tools over one workspace root, returning Leaf's exact result texts."""

    def __init__(
        self,
        root: str,
        *,
        default_timeout: float = DEFAULT_BASH_TIMEOUT,
        read_limit: int = READ_LIMIT,
        bash_limit: int = BASH_LIMIT,
        glob_limit: int = GLOB_LIMIT,
        spawner: _Spawner | None = None,
    ) -> None:
        self.root = os.path.abspath(root)
        self.real_root = os.path.realpath(self.root)
        self.default_timeout = default_timeout
        self.read_limit = read_limit
        self.bash_limit = bash_limit
        self.glob_limit = glob_limit
        self.spawner = spawner or _Spawner()
        self._handlers: dict[str, Callable[[dict[str, Any]], str]] = {
            "Read": self.read,
            "Write": self.write,
            "Edit": self.edit,
            "Glob": self.glob,
            "Bash": self.bash,
        }

    def call(self, name: str, arguments: Any) -> str:
        """Run one tool; every failure becomes `<ExceptionName>: <message>` text."""
        handler = self._handlers.get(name)
        if handler is None:
            return f"Unknown tool: {name}"
        try:
            if isinstance(arguments, str):
                arguments = json.loads(arguments) if arguments.strip() else {}
            if arguments is None:
                arguments = {}
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
            return handler(arguments)
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    # paths -------------------------------------------------------------------------------

    def resolve(self, value: str) -> str:
        """The absolute path the OS will open: not normalised, so `link/..` means what the kernel
        says it means (the display, not the operation, is normalised)."""
        path = os.path.expanduser(value)
        return path if os.path.isabs(path) else os.path.join(self.root, path)

    def display(self, path: str) -> str:
        """Relative to the workspace root when inside it, else absolute."""
        path = os.path.normpath(path)
        if path == self.root:
            return "."
        if path.startswith(self.root.rstrip("/") + "/"):
            return os.path.relpath(path, self.root)
        return path

    def _path(self, args: dict[str, Any]) -> str:
        return self.resolve(_required_text(args, "file_path", "path"))

    def check_writable(self, path: str) -> None:
        """Refuse a write whose target, after following symlinks and `..`, leaves the workspace."""
        real = os.path.realpath(path)
        if real != self.real_root and not real.startswith(self.real_root.rstrip("/") + "/"):
            shown = self.display(path)
            where = "" if real == os.path.normpath(path) else f" (it resolves to {real})"
            raise PermissionError(f"{shown} is outside the workspace{where}; only files in it can be written")

    def check_plain_file(self, path: str, must_exist: bool) -> None:
        """Refuse FIFOs, devices and sockets: reading /dev/zero or an unopened FIFO never ends."""
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            if must_exist:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), self.display(path)) from None
            return
        except OSError as exc:
            raise self._os_error(exc, path) from None
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), self.display(path))
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "Not a regular file", self.display(path))

    def _os_error(self, exc: OSError, path: str) -> OSError:
        """The same error, naming the path as the model sees it rather than the mount point."""
        if exc.errno is None:
            return exc
        return type(exc)(exc.errno, exc.strerror, self.display(path))

    # Read --------------------------------------------------------------------------------

    def read(self, args: dict[str, Any]) -> str:
        path = self._path(args)
        offset = max(1, _int_arg(args, "offset", 1))
        limit = _int_arg(args, "limit", 0)
        self.check_plain_file(path, must_exist=True)
        header = self.display(path)
        parts = [header, "\n"]
        kept = len(header) + 1
        total = kept
        budget = self.read_limit + 1
        number = 0
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                for line in _lines(handle):
                    number += 1
                    if number < offset:
                        continue
                    if limit > 0 and number >= offset + limit:
                        break
                    entry = f"{number}. {line}" if number == offset else f"\n{number}. {line}"
                    total += len(entry)
                    if kept < budget:
                        parts.append(entry)
                        kept += len(entry)
        except OSError as exc:
            raise self._os_error(exc, path) from None
        text = "".join(parts)
        if total <= self.read_limit:
            return text
        return f"{text[: self.read_limit]}\n[truncated {total - self.read_limit} chars]"

    # Write -------------------------------------------------------------------------------

    def write(self, args: dict[str, Any]) -> str:
        path = self._path(args)
        content = _required_text(args, "content")
        self.check_writable(path)
        self.check_plain_file(path, must_exist=False)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8", newline="") as handle:
                handle.write(content)
        except OSError as exc:
            raise self._os_error(exc, path) from None
        return f"Wrote {self.display(path)} ({len(content)} bytes)."

    # Edit --------------------------------------------------------------------------------

    def edit(self, args: dict[str, Any]) -> str:
        path = self._path(args)
        old = _required_text(args, "old_string")
        new = _required_text(args, "new_string")
        replace_all = _bool_arg(args, "replace_all")
        if not old:
            raise ValueError("old_string must be non-empty")
        self.check_writable(path)
        self.check_plain_file(path, must_exist=True)
        try:
            with open(path, encoding="utf-8", errors="surrogateescape", newline="") as handle:
                text = handle.read()
        except OSError as exc:
            raise self._os_error(exc, path) from None
        count = text.count(old)
        if count == 0 and "\n" in old and "\r\n" in text:
            crlf_old = old.replace("\r\n", "\n").replace("\n", "\r\n")
            if text.count(crlf_old):
                old, new = crlf_old, new.replace("\r\n", "\n").replace("\n", "\r\n")
                count = text.count(old)
        if count == 0:
            raise ValueError("old_string was not found")
        if count > 1 and not replace_all:
            raise ValueError(
                f"old_string matched {count} times; set replace_all=true or use a more specific old_string"
            )
        updated = text.replace(old, new) if replace_all else text.replace(old, new, 1)
        try:
            with open(path, "w", encoding="utf-8", errors="surrogateescape", newline="") as handle:
                handle.write(updated)
        except OSError as exc:
            raise self._os_error(exc, path) from None
        changed = count if replace_all else 1
        return f"Edited {self.display(path)} ({changed} replacement{'' if changed == 1 else 's'})."

    # Glob --------------------------------------------------------------------------------

    def glob(self, args: dict[str, Any]) -> str:
        pattern = _required_text(args, "pattern")
        if not pattern:
            raise ValueError("pattern is required")
        base = self.resolve(_as_text(args.get("path") or "."))
        pattern = os.path.expanduser(pattern)
        # Only the pattern is a pattern: a `[` in the workspace's own path must stay literal.
        start = "/" if os.path.isabs(pattern) else base
        parts = [part for part in pattern.split("/") if part]
        found = {self.display(p) for p in _expand(start, parts) if os.path.isfile(p)}
        matches = sorted(found)
        if not matches:
            return "No files matched."
        shown = "\n".join(matches[: self.glob_limit])
        if len(matches) > self.glob_limit:
            shown += f"\n... {len(matches) - self.glob_limit} more files"
        return shown

    # Bash --------------------------------------------------------------------------------

    def bash(self, args: dict[str, Any]) -> str:
        command = _as_text(args.get("command") or "")
        if not command:
            raise ValueError("command is required")
        timeout = bash_timeout(args, self.default_timeout)
        keep = 2 * self.bash_limit + 2  # enough for the cut even after \r\n -> \n halves it
        out, err = Prefix(keep), Prefix(keep)
        code, timed_out, _ = run_captured(
            self.spawner, ["/bin/bash", "-lc", command], self.root, timeout, out.feed, err.feed
        )
        head = f"Timed out after {timeout:.1f}s" if timed_out else f"Exit code: {code}"
        out_text, out_len = out.result(translate=not timed_out)
        err_text, err_len = err.result(translate=not timed_out)
        text = f"{head}\nSTDOUT:\n{out_text}\nSTDERR:\n{err_text}"
        total = len(head) + len("\nSTDOUT:\n") + out_len + len("\nSTDERR:\n") + err_len
        if total <= self.bash_limit:
            return text
        return f"{text[: self.bash_limit]}\n[truncated {total - self.bash_limit} chars]"


def _lines(handle: IO[str]) -> Iterator[str]:
    """Lines exactly as `str.splitlines()` would cut the whole text, without holding it.

    Text mode already turned \\r\\n and \\r into \\n, so every break left is one character and
    a chunk boundary can only fall between a line and its break, never inside the break.
    """
    carry = ""
    while True:
        chunk = handle.read(1 << 20)
        if not chunk:
            break
        pieces = (carry + chunk).splitlines(True)
        carry = ""
        if pieces and pieces[-1][-1] not in LINE_BREAKS:
            carry = pieces.pop()
        for piece in pieces:
            yield piece[:-1]
    if carry:
        yield carry


def _hidden(name: str) -> bool:
    return name.startswith(".")


def _scandir(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as entries:
            return list(entries)
    except OSError:
        return []


def _is_dir(entry: os.DirEntry[str], follow: bool) -> bool:
    try:
        return entry.is_dir(follow_symlinks=follow)
    except OSError:
        return False


def _expand(base: str, parts: list[str]) -> Iterator[str]:
    """Paths matching `parts` under `base`, with glob's semantics (see the module docstring)."""
    if not parts:
        yield base
        return
    head, rest = parts[0], parts[1:]
    if head == "**":
        while rest and rest[0] == "**":
            rest = rest[1:]
        for folder in _walk_dirs(base):
            if rest:
                yield from _expand(folder, rest)
            else:
                yield folder
                for entry in _scandir(folder):
                    if not _hidden(entry.name) and not _is_dir(entry, follow=False):
                        yield os.path.join(folder, entry.name)
        return
    if not _MAGIC.search(head):
        path = os.path.join(base, head)
        if rest:
            if os.path.isdir(path):
                yield from _expand(path, rest)
        elif os.path.lexists(path):
            yield path
        return
    hidden_ok = _hidden(head)
    for entry in _scandir(base):
        if _hidden(entry.name) and not hidden_ok:
            continue
        if not fnmatch.fnmatchcase(entry.name, head):
            continue
        path = os.path.join(base, entry.name)
        if rest:
            if _is_dir(entry, follow=True):
                yield from _expand(path, rest)
        else:
            yield path


def _walk_dirs(base: str) -> Iterator[str]:
    """`base` and every non-hidden folder below it, not following symlinked folders."""
    if not os.path.isdir(base):
        return
    stack = [base]
    while stack:
        folder = stack.pop()
        yield folder
        children = [
            os.path.join(folder, entry.name)
            for entry in _scandir(folder)
            if not _hidden(entry.name) and _is_dir(entry, follow=False)
        ]
        stack.extend(reversed(children))


# --------------------------------------------------------------------------- pipeline helpers


def run_command(
    spawner: _Spawner, root: str, command: str, timeout: float, log_limit: int, results_limit: int = 0
) -> dict[str, Any]:
    """A pipeline command (tests, setup): stdout and stderr merged into one head+tail log.

    With `results_limit`, the command also gets the results channel, and the reply carries what
    arrived on it while the command ran (`results`, at most that many bytes; `results_overflow`
    when more came)."""
    log = HeadTail(log_limit)
    results = bytearray()
    overflow = [False]

    def collect(data: bytes, final: bool) -> None:
        if len(results) + len(data) > results_limit:
            overflow[0] = True
        elif not overflow[0]:
            results.extend(data)

    code, timed_out, duration = run_captured(
        spawner, ["/bin/bash", "-lc", command], root, max(MIN_TIMEOUT, timeout), log.feed, None,
        side=collect if results_limit > 0 else None,
    )
    reply = {"exit_code": code, "log": log.result(), "timed_out": timed_out, "duration_s": round(duration, 3)}
    if results_limit > 0:
        reply["results"] = "" if overflow[0] else results.decode("utf-8", "replace")
        reply["results_overflow"] = overflow[0]
    return reply


def take_patch(
    root: str, base: str, timeout: float = 600.0, max_bytes: int = MAX_PATCH_BYTES, spawner: _Spawner | None = None
) -> bytes:
    """`git add -A` then `git diff --cached --binary <base>`, with config that could change the
    patch's shape (prefixes, external diff drivers, textconv, fsmonitor) pinned."""
    if not base or base.startswith("-") or any(ch.isspace() or ord(ch) < 32 for ch in base):
        raise BadRequest(f"bad base commit: {base!r}")
    git = [_system_git(), "-c", "safe.directory=*", "-c", "core.fsmonitor=false", "-c", "diff.noprefix=false"]
    spawner = spawner or _Spawner()
    _git(spawner, [*git, "add", "-A"], "add", root, timeout, 1 << 20)
    # --no-renames: a moved file is a deletion and an addition, so a reviewer (and our refusal rules) see
    # the mode and content of what lands, e.g. a symlink whose relative target escapes after a move.
    diff = [*git, "diff", "--cached", "--binary", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames"]
    diff += ["--src-prefix=a/", "--dst-prefix=b/", base, "--"]
    return _git(spawner, diff, "diff", root, timeout, max_bytes)


def _system_git() -> str:
    """git from the system's folders, never through the job's PATH, whose first folder is the job's
    environment: a `git` there (put by a build or by the code under test) would write the patch."""
    for folder in ("/usr/bin", "/usr/local/bin", "/bin"):
        if os.access(folder + "/git", os.X_OK):
            return folder + "/git"
    return "git"


def _git(spawner: _Spawner, argv: list[str], label: str, root: str, timeout: float, max_bytes: int) -> bytes:
    out = bytearray()
    err = Prefix(4000)
    overflow = []

    def collect(data: bytes, final: bool) -> None:
        if len(out) + len(data) > max_bytes:
            overflow.append(len(data))
        else:
            out.extend(data)

    code, timed_out, _ = run_captured(spawner, argv, root, timeout, collect, err.feed)
    if timed_out:
        raise TimeoutError(f"git {label} took longer than {timeout:.0f}s")
    if overflow:
        raise PatchTooLarge(f"the patch is larger than {max_bytes} bytes")
    if code != 0:
        raise GitFailed(f"git {label} failed with exit code {code}: {err.result(False)[0].strip()}")
    return bytes(out)


# --------------------------------------------------------------------------- the protocol


def _request_number(request: dict[str, Any], key: str, default: float) -> float:
    """A numeric request field; a bad one is the caller's error (`bad_request`)."""
    try:
        return _number(request.get(key, default), key)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


class Server:
    """Turns request lines into reply objects; never raises for a bad request."""

    def __init__(
        self,
        root: str,
        *,
        default_timeout: float = DEFAULT_BASH_TIMEOUT,
        reclaim: bool = False,
        clear_ipc: bool = False,
    ) -> None:
        self.root = os.path.abspath(root)
        self.spawner = _Spawner(reclaim=reclaim, clear_ipc=clear_ipc)
        self.tools = Tools(self.root, default_timeout=default_timeout, spawner=self.spawner)
        self.stopping = False

    def handle_line(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
        except ValueError as exc:
            return {"id": None, "ok": False, "code": BadRequest.code, "error": f"bad request: not JSON ({exc})"}
        if not isinstance(request, dict):
            return {"id": None, "ok": False, "code": BadRequest.code, "error": "bad request: not a JSON object"}
        rid = request.get("id")
        try:
            reply = self._dispatch(request)
        except Exception as exc:
            return {"id": rid, "ok": False, "code": error_code(exc), "error": error_text(exc)}
        return {"id": rid, "ok": True, **reply}

    def _dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "tool":
            name = request.get("name")
            if not isinstance(name, str):
                raise BadRequest("bad request: tool needs a string 'name'")
            return {"output": self.tools.call(name, request.get("arguments"))}
        if op == "exec":
            command = request.get("command")
            if not isinstance(command, str) or not command:
                raise BadRequest("bad request: exec needs a non-empty string 'command'")
            timeout = _request_number(request, "timeout", self.tools.default_timeout)
            log_limit = int(_request_number(request, "log_limit", BASH_LIMIT))
            results_limit = min(int(_request_number(request, "results_limit", 0)), MAX_RESULTS_BYTES)
            return run_command(self.spawner, self.root, command, timeout, log_limit, results_limit)
        if op == "patch":
            base = request.get("base")
            if not isinstance(base, str):
                raise BadRequest("bad request: patch needs a string 'base'")
            max_bytes = int(_request_number(request, "max_bytes", MAX_PATCH_BYTES))
            patch = take_patch(self.root, base, max_bytes=max_bytes, spawner=self.spawner)
            return {"patch_b64": base64.b64encode(patch).decode("ascii"), "size": len(patch)}
        if op == "settle":
            if not self.spawner.reclaim:
                raise BadRequest("bad request: settle needs a runner started with --reclaim")
            reclaim_processes()
            return {"left": len(leftovers())}
        if op == "ping":
            python = ".".join(map(str, sys.version_info[:3]))
            return {"pong": True, "pid": os.getpid(), "uid": os.getuid(), "python": python}
        if op == "shutdown":
            self.stopping = True
            return {}
        raise BadRequest(f"bad request: unknown op {op!r}")

    def serve(self, reader: IO[bytes], writer: IO[bytes]) -> None:
        """One request line in, one reply line out, until EOF or shutdown."""
        while not self.stopping:
            line = reader.readline()
            if not line:
                return
            if not line.strip():
                continue
            reply = self.handle_line(line)
            writer.write(json.dumps(reply, ensure_ascii=True).encode("ascii") + b"\n")
            writer.flush()
            reap_orphans()


# --------------------------------------------------------------------------- process setup

_RLIMITS = {
    "nproc": "RLIMIT_NPROC",
    "as": "RLIMIT_AS",
    "fsize": "RLIMIT_FSIZE",
    "cpu": "RLIMIT_CPU",
    "core": "RLIMIT_CORE",
    "nofile": "RLIMIT_NOFILE",
}


def apply_limits(limits: dict[str, int]) -> None:
    """Set hard and soft limits for the runner and everything it starts.

    Set here, after the sandbox's user namespace exists, RLIMIT_NPROC counts this sandbox's
    processes only (per-namespace accounting), so parallel sandboxes do not share one budget.
    """
    for key, value in limits.items():
        which = getattr(resource, _RLIMITS[key])
        _, hard = resource.getrlimit(which)
        value = int(value)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        resource.setrlimit(which, (value, value))


PR_GET_DUMPABLE = 3
PR_SET_DUMPABLE = 4


def make_undumpable() -> None:
    """Put the runner's descriptors and memory out of reach of every other sandboxed process.

    Sandboxed code runs as the runner's own uid, so a dumpable runner would let it open
    /proc/<runner>/fd/* (the protocol stream: forged replies, stolen requests), /proc/<runner>/mem,
    ptrace it or copy its descriptors with pidfd_getfd. A non-dumpable process needs
    CAP_SYS_PTRACE for all of those, which nothing in the sandbox has. The flag survives fork
    (a command's child is covered until its exec drops every protocol descriptor) and is only
    reset by exec or a change of credentials, neither of which the runner does.
    Raises (ImportError, OSError) when it cannot be done: the runner must then not serve.
    """
    import ctypes

    libc = _libc()
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    if libc.prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(errno.EPERM, "the runner is still dumpable after prctl(PR_SET_DUMPABLE, 0)")


USAGE = """usage: runner.py [--root DIR] [--limits JSON] [--default-timeout SECONDS] [--reclaim] [--clear-ipc]

FrogFix sandbox runner (JSON lines on stdin/stdout).
  --root DIR                 the workspace root (default: the current folder)
  --limits JSON              rlimits, e.g. {"nproc": 256, "fsize": 536870912}
  --default-timeout SECONDS  a Bash call's timeout when it names none
  --reclaim                  alone in a pid namespace: may kill(-1)
  --clear-ipc                with --reclaim, in its own IPC namespace
"""


class Options:
    """The runner's command line (read by hand: argparse and what it imports would be a fifth of
    the runner's start-up, paid by every sandbox)."""

    def __init__(self, argv: list[str]) -> None:
        self.root = os.getcwd()
        self.limits = "{}"
        self.default_timeout = DEFAULT_BASH_TIMEOUT
        self.reclaim = self.clear_ipc = False
        rest = list(argv)
        while rest:
            option = rest.pop(0)
            name, has_value, value = option.partition("=")
            if name in ("--reclaim", "--clear-ipc") and not has_value:
                setattr(self, name[2:].replace("-", "_"), True)
                continue
            if name not in ("--root", "--limits", "--default-timeout"):
                raise ValueError(f"unknown option {option!r}")
            if not has_value:
                if not rest:
                    raise ValueError(f"{name} needs a value")
                value = rest.pop(0)
            if name == "--default-timeout":
                self.default_timeout = float(value)
            else:
                setattr(self, name[2:], value)


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if "-h" in arguments or "--help" in arguments:
        sys.stdout.write(USAGE)
        return 0
    try:
        options = Options(arguments)
        limits = json.loads(options.limits)
    except ValueError as exc:
        sys.stderr.write(f"{USAGE}runner.py: error: {exc}\n")
        return 2

    apply_limits(limits)
    try:
        make_undumpable()
    except (ImportError, OSError) as exc:
        sys.stderr.write(f"runner: refusing to serve: cannot make itself non-dumpable ({exc})\n")
        return 2
    # As the sandbox's init (local backend) the runner takes no signal without a handler from
    # inside; Python's SIGINT handler would let any sandboxed process interrupt it mid-reply.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # A file-size overrun must fail the runner's own write with EFBIG, not kill it; children get
    # the default action back (Popen's restore_signals).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    os.umask(0o022)
    os.chdir(options.root)
    # The protocol owns the original stdout; anything else printing to fd 1 lands on stderr.
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    server = Server(
        options.root, default_timeout=options.default_timeout, reclaim=options.reclaim, clear_ipc=options.clear_ipc
    )
    try:
        server.serve(sys.stdin.buffer, protocol)
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
