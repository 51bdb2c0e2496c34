"""The sandbox launcher (sandbox/launcher.py, cgroup_enter.py --serve): one per worker process,
started once, forking each sandbox's wrapper and namespace-limits helper; what it starts gets
exactly the descriptors asked for, the signal dispositions of a fresh process, and dies with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.base import SandboxSpec, SandboxUnavailable
from sandbox.cgroups import wrapper_options
from sandbox.launcher import Launcher, launcher
from sandbox.local import LocalSandbox
from tests.sandbox.conftest import TEST_LIMITS

pytestmark = pytest.mark.bwrap


def _until(check: Callable[[], bool], what: str, bound_s: float = 30.0) -> None:
    deadline = time.monotonic() + bound_s
    while not check():
        assert time.monotonic() < deadline, f"still not {what} after {bound_s:g}s"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _launcher_pid(owner: Launcher) -> int:
    assert owner._proc is not None
    return owner._proc.pid


def _run(owner: Launcher, script: str, pass_fds: tuple[int, ...] = ()) -> tuple[str, str]:
    """Spawn /bin/sh -c `script` through `owner` (no cgroup, no uid drop); its stdout and stderr."""
    proc = owner.spawn(wrapper_options(["/bin/sh", "-c", script], None, []), pass_fds=list(pass_fds))
    proc.stdin.close()
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    proc.wait(timeout=30)
    for stream in (proc.stdout, proc.stderr):
        stream.close()
    proc.close()
    return out, err


def test_one_launcher_serves_every_sandbox_of_a_process(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    first = make_sandbox(workspace)
    pid = _launcher_pid(launcher())
    second = make_sandbox(workspace)
    assert _launcher_pid(launcher()) == pid
    for sandbox in (first, second):
        assert sandbox.call_tool("Bash", {"command": "echo hi"}) == "Exit code: 0\nSTDOUT:\nhi\n\nSTDERR:\n"
        # bwrap is the launcher's child, not the worker's, and leads its own process group
        assert sandbox._res.proc is not None
        with open(f"/proc/{sandbox._res.proc.pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        assert int(fields[1]) == pid and int(fields[2]) == sandbox._res.proc.pid


def test_a_launched_process_gets_exactly_its_descriptors_and_default_signals() -> None:
    owner = Launcher()
    memfd = os.memfd_create("payload")
    target = os.dup(memfd)  # the lowest free number: low numbers are where the launcher's copies collide
    try:
        os.write(memfd, b"payload-bytes")
        os.lseek(memfd, 0, os.SEEK_SET)
        script = f"cat /proc/self/fd/{target}; echo; ls /proc/self/fd; grep -E '^Sig(Ign|Blk)' /proc/self/status"
        out, err = _run(owner, script, (target,))
    finally:
        os.close(memfd)
        os.close(target)
        owner.close()
    lines = out.split("\n")
    assert lines[0] == "payload-bytes", (out, err)
    fds = {int(n) for n in lines[1:] if n.isdigit()}
    # Only 0-2 and the one passed (3 is ls's own directory): nothing of the launcher or the worker.
    assert fds - {3} == {0, 1, 2, target}, out
    # A fresh process's dispositions: the launcher ignores SIGINT, what it starts must not.
    assert "SigIgn:\t0000000000000000" in out and "SigBlk:\t0000000000000000" in out, out


def test_a_killed_launcher_is_started_again_and_took_its_sandboxes_with_it(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    sandbox = make_sandbox(workspace)
    old = _launcher_pid(launcher())
    assert sandbox._res.proc is not None
    bwrap = sandbox._res.proc.pid
    os.kill(old, signal.SIGKILL)
    _until(lambda: not _alive(bwrap), "gone with its launcher")  # bwrap's death signal
    again = make_sandbox(workspace)
    assert _launcher_pid(launcher()) != old
    assert again.call_tool("Bash", {"command": "echo back"}).startswith("Exit code: 0\nSTDOUT:\nback")


def test_a_forked_process_starts_its_own_launcher(workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> None:
    make_sandbox(workspace)
    parents = _launcher_pid(launcher())
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a prefork pool's child: uses the sandbox package without exec
        code = 1
        try:
            with LocalSandbox(_spec(workspace)) as inner:
                answer = inner.call_tool("Bash", {"command": "echo child"})
                os.write(write, json.dumps([_launcher_pid(launcher()), answer]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    with os.fdopen(read) as handle:
        reply = handle.read()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    childs, answer = json.loads(reply)
    assert childs != parents and answer.startswith("Exit code: 0\nSTDOUT:\nchild")
    assert _launcher_pid(launcher()) == parents  # the parent's own is untouched
    _until(lambda: not _alive(childs), "gone after the child exited")


def _spec(workspace: Path) -> SandboxSpec:
    return SandboxSpec(workspace=str(workspace), limits=TEST_LIMITS)


KILLED_WORKER = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {repo!r})
    from sandbox.base import SandboxSpec, SandboxUnavailable
    from sandbox.launcher import launcher
    from sandbox.local import LocalSandbox
    sb = LocalSandbox(SandboxSpec(workspace={workspace!r}))
    sb.call_tool("Bash", {{"command": "sleep 300 >/dev/null 2>&1 &"}})
    print(json.dumps([launcher()._proc.pid, sb._res.proc.pid]), flush=True)
    time.sleep(300)
    """
)


def test_the_launcher_and_its_sandboxes_end_with_a_killed_worker(workspace: Path) -> None:
    repo = str(Path(__file__).resolve().parents[2])
    script = KILLED_WORKER.format(repo=repo, workspace=str(workspace))
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        served_by, bwrap = json.loads(worker.stdout.readline())
        assert _alive(served_by) and _alive(bwrap)
    finally:
        worker.kill()
        worker.wait()
    _until(lambda: not _alive(served_by), "gone with its worker")
    _until(lambda: not _alive(bwrap), "gone with the launcher")


LIMIT_SCRIPT = """
import json, os, sys
config = json.loads(sys.argv[1])
os.fstat(config["pidfd"])  # the pidfd it was sent is open, at the number the config names
if config.get("fail"):
    sys.stderr.write("cannot: " + config["fail"] + "\\n")
    sys.exit(1)
if config.get("hang"):
    import time; time.sleep(60)
print(json.dumps({"ipc": True, "pid": os.getpid(), "threads": len(os.listdir("/proc/self/task"))}))
"""


def test_the_limit_helper_runs_single_threaded_in_a_fork_and_reports_failures() -> None:
    owner = Launcher()
    pidfd = os.pidfd_open(os.getpid())
    try:
        code, out, err = owner.limit_namespaces(LIMIT_SCRIPT, {}, pidfd, 10.0)
        assert code == 0, err
        result = json.loads(out)
        assert result["threads"] == 1 and result["pid"] != _launcher_pid(owner)
        code, out, err = owner.limit_namespaces(LIMIT_SCRIPT, {"fail": "no such thing"}, pidfd, 10.0)
        assert (code, out, err) == (1, "", "cannot: no such thing\n")
        code, out, err = owner.limit_namespaces(LIMIT_SCRIPT, {"hang": True}, pidfd, 0.5)
        assert code == -signal.SIGKILL and err == "timed out"
        # The launcher is still there and still answers.
        assert owner.limit_namespaces(LIMIT_SCRIPT, {}, pidfd, 10.0)[0] == 0
    finally:
        os.close(pidfd)
        owner.close()


def test_a_launcher_that_cannot_spawn_says_why() -> None:
    owner = Launcher()
    try:
        out, err = _run(owner, "exit 0")
        assert (out, err) == ("", "")
        proc = owner.spawn(wrapper_options(["/nonexistent/bwrap"], None, []), pass_fds=[])
        proc.stdin.close()
        assert "cannot start the sandbox in its cgroup" in proc.stderr.read().decode()
        proc.wait(timeout=30)
    finally:
        owner.close()


def test_an_exchange_cut_short_ends_the_launcher_and_the_next_one_starts_clean() -> None:
    """A reply left unread would answer the next request: an interrupted exchange stops the
    launcher, and the next request is answered by a new one, with its own id."""
    owner = Launcher()
    pidfd = os.pidfd_open(os.getpid())
    try:
        owner.limit_namespaces(LIMIT_SCRIPT, {}, pidfd, 10.0)
        first = _launcher_pid(owner)
        with pytest.raises(SandboxUnavailable, match="no answer within"):
            owner._ask({"op": "limit", "script": LIMIT_SCRIPT, "config": {"hang": True}, "timeout": 30}, [pidfd], 0.3)
        _until(lambda: not _alive(first), "gone after the cut exchange")
        code, out, _ = owner.limit_namespaces(LIMIT_SCRIPT, {}, pidfd, 10.0)
        assert code == 0 and json.loads(out)["ipc"] is True
        assert _launcher_pid(owner) != first
    finally:
        os.close(pidfd)
        owner.close()


def test_what_the_launcher_hands_back_is_not_inherited_and_group_signals_pass_it_by() -> None:
    owner = Launcher()
    try:
        proc = owner.spawn(wrapper_options(["/bin/sh", "-c", "read line"], None, []), pass_fds=[])
        assert os.get_inheritable(proc.pidfd) is False  # SCM_RIGHTS gives descriptors inheritable
        served_by = _launcher_pid(owner)
        for number in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # what a stop sends a whole group
            os.kill(served_by, number)
        assert proc.poll() is None and _alive(served_by)
        proc.stdin.close()  # `read` ends, and so does the shell
        proc.wait(timeout=30)
        assert _launcher_pid(owner) == served_by
        assert _run(owner, "echo still here") == ("still here\n", "")
    finally:
        owner.close()


def test_a_sandbox_whose_launcher_dies_leaves_no_process_in_its_cgroups(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    sandbox = make_sandbox(workspace)
    if sandbox._res.cgroup is None:
        pytest.skip("this host gives the sandbox no cgroup")
    sandbox.call_tool("Bash", {"command": "setsid sleep 300 >/dev/null 2>&1 < /dev/null &"})
    procs = sandbox._res.cgroup.procs_files()
    assert any(Path(p).read_text().split() for p in procs)
    os.kill(_launcher_pid(launcher()), signal.SIGKILL)
    _until(lambda: not any(Path(p).read_text().split() for p in procs), "empty once the launcher died")
