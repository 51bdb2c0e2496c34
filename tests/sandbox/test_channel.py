"""The runner channel: nothing inside the sandbox can open, write or steal it (issue 12, finding 1).

The attack (tests/sandbox/forged_replies.py): a sandboxed command opens /proc/<pid>/fd/<n> of
every other process in the sandbox (pid 1's and the runner's stdin, stdout and stderr), their
/proc/<pid>/mem, takes their descriptors with pidfd_getfd or attaches with ptrace, and writes
reply lines claiming "exit 0" and a forged patch. It only worked for a non-root worker (as root,
the worker's pipes belong to root and the sandbox uid cannot reopen them), so it runs both ways:
in-process as the suite's user, and as an unprivileged worker through tests/nonroot.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sandbox.local import LocalSandbox
from sandbox.runner_client import RUNNER_SCRIPT
from tests.nonroot import NonRoot
from tests.sandbox import forged_replies
from tests.sandbox.support import bash, leaf_bash

bwrap = pytest.mark.bwrap


def assert_channel_held(outcome: dict[str, Any]) -> None:
    """The probe reached no descriptor of another process, and every reply was the runner's own."""
    assert "error" not in outcome, outcome.get("error")
    for key in ("probe_command", "probe_bash"):
        report = outcome[key]
        assert isinstance(report, dict), f"{key}: a forged reply replaced the probe's output: {report!r}"
        assert 1 in report["pids"], f"{key}: the probe never tried pid 1: {report}"
        assert report["opened"] == [], f"{key}: opened another process's descriptors: {report['opened']}"
        assert (report["mem"], report["getfd"], report["ptrace"]) == ([], [], []), f"{key}: {report}"
    # A leftover of an earlier call (a detached lurker) reached no later command's output: the
    # runner killed it before the next command started.
    assert outcome["lurker"].startswith("Exit code: 0\nSTDOUT:\n"), outcome["lurker"]
    lurker_pid = outcome["lurker"].split("STDOUT:\n", 1)[1].split("\n", 1)[0]
    assert lurker_pid.isdigit(), outcome["lurker"]
    log = outcome["after_lurker"]["log"]
    assert (outcome["after_lurker"]["exit_code"], log) == (0, "real-output\nlurker-gone\n"), log
    assert forged_replies.FORGED_MARK not in log
    assert outcome["bash_after_lurker"] == leaf_bash(0, "real-output\n", ""), outcome["bash_after_lurker"]
    assert outcome["failing"]["exit_code"] == 1, outcome["failing"]
    assert "real-failure" in outcome["failing"]["log"]
    assert "the real edit" in outcome["patch"]
    assert forged_replies.FORGED_MARK not in outcome["patch"]


@bwrap
def test_forged_replies_never_reach_a_non_root_worker(nonroot: NonRoot) -> None:
    """The shipped image's case: the worker (the process that opens the sandbox) is not root."""
    workspace = nonroot.folder("forged-replies-")
    done = nonroot.run_python(Path(forged_replies.__file__), str(workspace), timeout=240)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["worker_uid"] == nonroot.uid != 0
    assert_channel_held(outcome)


@bwrap
def test_forged_replies_never_reach_the_worker(workspace: Path) -> None:
    """The same attack with the worker as the suite's own user (root in CI)."""
    assert_channel_held(forged_replies.attack(str(workspace)))


@bwrap
def test_the_runner_is_the_sandbox_init(sb: LocalSandbox) -> None:
    """No bubblewrap init in the sandbox: nothing but the runner could hold the channel."""
    assert sb.runner_info["pid"] == 1
    assert bash(sb, "cat /proc/1/comm") == leaf_bash(0, "python3\n", "")


@bwrap
def test_sandboxed_code_cannot_signal_the_runner(sb: LocalSandbox) -> None:
    """As the pid namespace's init the runner takes no signal it has no handler for from inside."""
    out = bash(sb, "for s in KILL TERM INT HUP QUIT USR1 USR2 PIPE ALRM; do kill -s $s 1; done; echo sent")
    assert out == leaf_bash(0, "sent\n", "")
    assert sb.ping()["pong"] is True
    assert sb.run_command("exit 4", 10).exit_code == 4


LIST_FDS = (
    "import os\n"
    "for fd in range(1024):\n"
    "    try:\n"
    "        os.fstat(fd)\n"
    "    except OSError:\n"
    "        continue\n"
    "    print(fd, os.readlink('/proc/self/fd/%d' % fd))\n"
)


@bwrap
def test_tool_processes_inherit_no_channel_descriptor(sb: LocalSandbox) -> None:
    """A command holds only its stdin (/dev/null) and its own stdout and stderr, never the channel."""
    sb.call_tool("Write", {"file_path": "fds.py", "content": LIST_FDS})
    for listing in (sb.run_command("exec python3 fds.py", 10).log, bash(sb, "exec python3 fds.py")):
        fds = dict(line.split(" ", 1) for line in listing.splitlines() if line[:1].isdigit())
        assert sorted(fds) == ["0", "1", "2"], listing
        assert fds["0"] == "/dev/null"


@bwrap
def test_orphans_are_reaped_and_exit_codes_stay_true(sb: LocalSandbox) -> None:
    """The runner as init reaps what commands leave behind, without taking a command's own status.
    (Few enough orphans that the fork-bomb reclaim, which kills and reaps everything, stays out.)"""
    spawn = "for i in $(seq 10); do (sh -c 'exit 7' &); done; sleep 0.5"
    assert sb.run_command(f"{spawn}; exit 3", 20).exit_code == 3
    assert bash(sb, f"{spawn}; exit 5").startswith("Exit code: 5\n")
    # The shell exits first while a child it left holds the output open: its status must survive.
    assert sb.run_command("sleep 1 & exit 6", 20).exit_code == 6
    zombies = "grep -h '^[0-9]* ([^)]*) Z' /proc/[0-9]*/stat | wc -l"
    assert bash(sb, zombies) == leaf_bash(0, "0\n", "")


@bwrap
def test_a_leftover_cannot_write_into_a_later_commands_output(sb: LocalSandbox) -> None:
    """A detached process left by one Bash call (dumpable, the sandbox's one uid) would open
    /proc/<pid>/fd/1 and 2 of every later command: the runner kills it before the next one starts."""
    sb.call_tool("Write", {"file_path": "lurker.py", "content": forged_replies.LURKER})
    start = "setsid python3 lurker.py </dev/null >/dev/null 2>&1 & while [ ! -s /tmp/lurking ]; do :; done; echo up"
    assert bash(sb, start) == leaf_bash(0, "up\n", "")
    for _ in range(3):  # each a second long: time enough for a live lurker to find and flood them
        test_run = sb.run_command("sleep 1; echo tests ran; echo to-stderr >&2; exit 1", 30)
        assert (test_run.exit_code, test_run.log) == (1, "tests ran\nto-stderr\n")
        assert bash(sb, "sleep 1; echo model output") == leaf_bash(0, "model output\n", "")
        assert bash(sb, "read -r pid < /tmp/lurking; test -d /proc/$pid && echo alive || echo gone") == leaf_bash(
            0, "gone\n", ""
        )
    # a process started within a call still runs for the rest of that call, as under Leaf
    assert bash(sb, "sleep 30 >/dev/null 2>&1 & sleep 0.2; kill -0 $! && echo running") == leaf_bash(0, "running\n", "")


def test_a_runner_that_cannot_hide_its_channel_refuses_to_serve(tmp_path: Path) -> None:
    """Without ctypes (some slim images) the runner cannot make itself non-dumpable: it says so
    and exits instead of answering over a channel the sandbox could reach."""
    start = (
        f"import runpy, sys\nsys.modules['ctypes'] = None\nsys.argv[0] = {RUNNER_SCRIPT!r}\n"
        f"runpy.run_path({RUNNER_SCRIPT!r}, run_name='__main__')\n"
    )
    argv = [sys.executable, "-I", "-S", "-B", "-c", start, "--root", str(tmp_path)]
    done = subprocess.run(argv, input=b'{"id": 1, "op": "ping"}\n', capture_output=True, timeout=30, check=False)
    assert done.returncode == 2
    assert done.stdout == b""
    assert b"refusing to serve: cannot make itself non-dumpable" in done.stderr
