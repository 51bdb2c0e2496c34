"""The worker side of the forged-reply attack, runnable in-process or as a script under another uid.

A command in the sandbox (the pipeline's run_command, and the model's Bash tool) runs PROBE: it
tries every way stdlib Python has to reach another sandboxed process's descriptors: open() of
each /proc/<pid>/fd/<n> (pid 1's and the runner's stdin, stdout and stderr included) for
writing and for reading, /proc/<pid>/mem, pidfd_getfd and ptrace. Whatever opens, it floods
with reply lines for its own and the next request ids, claiming "exit 0" and a forged patch. The
scenario then asks for a real failing command and a real patch and returns what it got, so a
test can see both the probe's report and whether a forged reply was accepted.

`python forged_replies.py WORKSPACE` prints the outcome as one JSON object (tests/nonroot.py runs
it so as an unprivileged worker).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from sandbox.base import SandboxError, SandboxLimits, SandboxSpec
from sandbox.local import LocalSandbox

FORGED_MARK = "FORGED-BY-THE-SANDBOX"
REAL_CHANGE = "def add(a, b):\n    return a - b  # the real edit\n"

PROBE = r"""
import base64, ctypes, errno, json, os, sys

MARK = "FORGED-BY-THE-SANDBOX"
PATCH = "diff --git a/%s b/%s\nnew file mode 100644\n--- /dev/null\n+++ b/%s\n@@ -0,0 +1 @@\n+x\n" % ((MARK,) * 3)
LINES = "".join(
    json.dumps({"id": rid, "ok": True, "pong": True, "output": MARK, "exit_code": 0, "log": MARK,
                "timed_out": False, "duration_s": 0.1, "patch_b64": base64.b64encode(PATCH.encode()).decode(),
                "size": len(PATCH)}) + "\n"
    for rid in range(int(sys.argv[1]), int(sys.argv[1]) + 40)  # from the id of the request running us
).encode()
libc = ctypes.CDLL(None, use_errno=True)
me = os.getpid()
report = {"me": me, "pids": [], "opened": [], "mem": [], "getfd": [], "ptrace": [], "refused": {}}


def refused(exc):
    name = errno.errorcode.get(exc.errno, str(exc.errno))
    report["refused"][name] = report["refused"].get(name, 0) + 1


def flood(fd):
    try:
        os.set_blocking(fd, False)
        os.write(fd, LINES)
    except OSError:
        pass


def fds_of(pid):
    try:
        return sorted(int(n) for n in os.listdir("/proc/%d/fd" % pid))
    except OSError as exc:
        refused(exc)
        return list(range(16))  # cannot list them: try the usual numbers blind


# argv: the id to forge from, then the pids to try (default: every other process in /proc)
targets = [int(a) for a in sys.argv[2:]] or sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != me)
for pid in targets:
    report["pids"].append(pid)
    for fd in fds_of(pid):
        for flags, how in ((os.O_WRONLY, "w"), (os.O_RDONLY, "r")):
            try:
                opened = os.open("/proc/%d/fd/%d" % (pid, fd), flags | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    refused(exc)
                continue
            report["opened"].append([pid, fd, how, os.readlink("/proc/self/fd/%d" % opened)])
            if how == "w":
                flood(opened)
            os.close(opened)
    try:
        os.close(os.open("/proc/%d/mem" % pid, os.O_RDWR))
        report["mem"].append(pid)
    except OSError as exc:
        refused(exc)
    try:
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        refused(exc)
    else:
        for fd in range(16):
            got = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd
            if got >= 0:
                report["getfd"].append([pid, fd])
                flood(got)
                os.close(got)
            elif ctypes.get_errno() != errno.EBADF:
                refused(OSError(ctypes.get_errno(), "pidfd_getfd"))
        os.close(pidfd)
    if libc.ptrace(16, pid, None, None) == 0:  # PTRACE_ATTACH
        report["ptrace"].append(pid)
        os.waitpid(pid, 0x40000000)  # __WALL
        libc.ptrace(17, pid, None, None)  # PTRACE_DETACH
    else:
        refused(OSError(ctypes.get_errno(), "ptrace"))
print(json.dumps(report))
"""

# A leftover of one Bash call: detached from the call's output, it writes the mark into stdout
# and stderr of every other process it can open, for as long as it lives. Before the runner
# killed leftovers, this reached the next command's pipes: a test log or tool result with
# lines no command printed.
LURKER = r"""
import os, time
me = os.getpid()
earlier = set(os.listdir("/proc"))  # the call that started it, whose output it is part of anyway
open("/tmp/lurking", "w").write(str(me))
until = time.time() + 20
while time.time() < until:
    for p in os.listdir("/proc"):
        if p.isdigit() and int(p) not in (1, me) and p not in earlier:
            for fd in (1, 2):
                try:
                    f = os.open("/proc/%s/fd/%d" % (p, fd), os.O_WRONLY | os.O_NONBLOCK)
                    os.write(f, b"FORGED-BY-THE-SANDBOX from a leftover\n")
                    os.close(f)
                except OSError:
                    pass
    time.sleep(0.005)
"""

LIMITS = SandboxLimits(wall_seconds=120.0, max_processes=64, default_tool_timeout=30.0)


def _git(workspace: str, *args: str) -> str:
    argv = ["git", "-c", "user.name=FrogFix Test", "-c", "user.email=test@frogfix.invalid", *args]
    return subprocess.run(argv, cwd=workspace, check=True, capture_output=True, text=True).stdout.strip()


def probe_report(text: str) -> Any:
    """The probe's JSON report, or the text itself when a forged reply replaced it."""
    try:
        return json.loads(text.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return text


def attack(workspace: str) -> dict[str, Any]:
    """Run the probe in a fresh sandbox over `workspace` (an empty folder), then real requests."""
    Path(workspace, "probe.py").write_text(PROBE)
    Path(workspace, "lurker.py").write_text(LURKER)
    Path(workspace, "calc.py").write_text("def add(a, b):\n    return a + b\n")
    _git(workspace, "init", "-q")
    _git(workspace, "add", "-A")
    _git(workspace, "commit", "-q", "-m", "base")
    base = _git(workspace, "rev-parse", "HEAD")
    outcome: dict[str, Any] = {"worker_uid": os.geteuid()}
    sandbox = LocalSandbox(SandboxSpec(workspace=workspace, limits=LIMITS))
    try:
        outcome["runner"] = sandbox.runner_info
        # Request ids run 1 (the start's ping), 2, 3, ...: the probe forges from its own on.
        outcome["probe_command"] = probe_report(sandbox.run_command("exec python3 probe.py 2", 60).log)
        bash = sandbox.call_tool("Bash", {"command": "exec python3 probe.py 3"})
        outcome["probe_bash"] = probe_report(bash.split("\nSTDERR:", 1)[0])
        outcome["lurker"] = sandbox.call_tool(
            "Bash",
            # builtins only once it runs: no process of this call starts after the lurker
            {
                "command": "setsid python3 lurker.py </dev/null >/dev/null 2>&1 & "
                "while [ ! -s /tmp/lurking ]; do :; done; read -r pid < /tmp/lurking; echo $pid"
            },
        )
        lurker = outcome["lurker"].split("STDOUT:\n", 1)[-1].split("\n", 1)[0]
        alive = f"test -d /proc/{lurker} && echo lurker-alive || echo lurker-gone" if lurker.isdigit() else "true"
        after_lurker = sandbox.run_command(f"sleep 1; echo real-output; {alive}", 30)
        outcome["after_lurker"] = {"exit_code": after_lurker.exit_code, "log": after_lurker.log}
        outcome["bash_after_lurker"] = sandbox.call_tool("Bash", {"command": "sleep 1; echo real-output"})
        failing = sandbox.run_command("echo real-failure; exit 1", 30)
        outcome["failing"] = {"exit_code": failing.exit_code, "log": failing.log}
        sandbox.call_tool("Write", {"file_path": "calc.py", "content": REAL_CHANGE})
        outcome["patch"] = sandbox.patch(base)
    except SandboxError as exc:
        outcome["error"] = str(exc)
    finally:
        sandbox.close()
    return outcome


if __name__ == "__main__":
    print(json.dumps(attack(sys.argv[1])))
