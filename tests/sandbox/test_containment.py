"""What the sandbox must keep in: network, host files, host secrets, and runaway processes.

Each test is written so that it fails if the protection it covers is taken away.
"""

from __future__ import annotations

import dataclasses
import os
import pwd
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox.local import LocalSandbox
from tests.sandbox.conftest import TEST_LIMITS
from tests.sandbox.support import bash, leaf_bash, sandbox_host_pids, skip_unless_root, wait_for

pytestmark = pytest.mark.bwrap

# Forks sleeping children until fork fails (or 200 are running), prints how many it got, then
# cleans up. Harmless without a limit, so it can vouch for the limit before a real fork bomb.
FORK_PROBE = r"""
import os, signal, time
kids = []
try:
    while len(kids) < 200:
        pid = os.fork()
        if pid == 0:
            time.sleep(30)
            os._exit(0)
        kids.append(pid)
except OSError:
    pass
print("forked", len(kids))
for pid in kids:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
"""


def forked(sandbox: LocalSandbox) -> int:
    out = bash(sandbox, f"python3 -c '{FORK_PROBE}'")
    match = re.search(r"forked (\d+)", out)
    assert match, out
    return int(match.group(1))


# ----------------------------------------------------------------------------------- network


def test_no_network_not_even_the_hosts_loopback(sb: LocalSandbox) -> None:
    probe = "import socket; socket.create_connection(('127.0.0.1', {port}), timeout=3); print('CONNECTED')"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        code = probe.format(port=listener.getsockname()[1])

        out = bash(sb, f'python3 -c "{code}"')
        assert "CONNECTED" not in out
        assert out.startswith("Exit code: 1\n")
        assert "ConnectionRefusedError" in out or "unreachable" in out
        listener.settimeout(0.3)
        with pytest.raises(TimeoutError):
            listener.accept()

        # Control: the same probe, unsandboxed, does reach the listener.
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
        assert done.stdout.strip() == "CONNECTED"
        connection, _ = listener.accept()
        connection.close()


def test_only_a_private_loopback_interface(sb: LocalSandbox) -> None:
    out = bash(sb, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert out == leaf_bash(0, "lo\n", "")


# ----------------------------------------------------------------------------- host files


def test_system_folders_and_host_home_are_out_of_reach(sb: LocalSandbox) -> None:
    name = f"frogfix-canary-{uuid.uuid4().hex}"
    host_home = pwd.getpwuid(os.getuid()).pw_dir
    targets = ["/etc", "/usr", "/usr/lib", "/", "/tmp/..", host_home]
    script = "; ".join(f"(echo x > {t}/{name}) 2>/dev/null && echo WROTE {t}" for t in targets)
    assert "WROTE" not in bash(sb, script)
    for tool_target in (f"/etc/{name}", f"/usr/{name}", f"{host_home}/{name}", f"/tmp/{name}"):
        out = sb.call_tool("Write", {"file_path": tool_target, "content": "x"})
        assert out.startswith("PermissionError: "), out
    for target in [*targets, "/tmp"]:
        assert not os.path.exists(os.path.join(target, name))
    # EROFS comes before any permission check: the mounts themselves are read-only.
    folders = ["/usr", "/usr/lib", "/usr/bin", "/etc/ssl", "/etc", "/dev", "/"]
    out = bash(sb, "; ".join(f"touch {folder}/{name}" for folder in folders))
    assert out.count("Read-only file system") == len(folders), out


def test_symlinks_to_host_files_through_every_tool(
    workspace: Path, outside: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    secret = outside / "host.txt"
    (workspace / "link.txt").symlink_to(secret)
    (workspace / "linkdir").symlink_to(outside)
    sb = make_sandbox(workspace)
    outputs = [
        sb.call_tool("Read", {"file_path": "link.txt"}),
        sb.call_tool("Read", {"file_path": "linkdir/host.txt"}),
        sb.call_tool("Read", {"file_path": str(secret)}),
        sb.call_tool("Edit", {"file_path": "link.txt", "old_string": "HOST", "new_string": "PWNED"}),
        sb.call_tool("Write", {"file_path": "link.txt", "content": "PWNED"}),
        sb.call_tool("Write", {"file_path": "linkdir/new.txt", "content": "PWNED"}),
        sb.call_tool("Write", {"file_path": "linkdir/../escape.txt", "content": "PWNED"}),
        sb.call_tool("Glob", {"pattern": "**/*"}),
        sb.call_tool("Glob", {"pattern": "*", "path": "linkdir"}),
        sb.call_tool("Glob", {"pattern": "*.txt", "path": str(outside)}),
        bash(sb, "cat link.txt linkdir/host.txt; echo PWNED > link.txt; echo PWNED > linkdir/new.txt"),
        bash(sb, f"ln -s {secret} mine.txt; cat mine.txt; echo PWNED >> mine.txt"),
    ]
    assert outputs[0].startswith("FileNotFoundError: ")
    assert outputs[1].startswith("FileNotFoundError: ")
    assert outputs[2].startswith("FileNotFoundError: ")
    for out in outputs[3:7]:
        assert out.startswith("PermissionError: "), out
    assert outputs[7] == outputs[8] == outputs[9] == "No files matched."
    for out in outputs:
        assert "HOST-SECRET" not in out
    sb.close()
    assert secret.read_text() == "HOST-SECRET\n"
    assert sorted(p.name for p in outside.iterdir()) == ["host.txt"]
    assert not (workspace.parent / "escape.txt").exists()


def test_handing_the_workspace_over_never_follows_symlinks(
    workspace: Path, outside: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    skip_unless_root()
    secret = outside / "host.txt"
    os.chown(secret, 12345, 12345)
    (workspace / "link.txt").symlink_to(secret)
    sb = make_sandbox(workspace)
    assert os.stat(secret).st_uid == 12345
    bash(sb, f"ln -s {secret} agent-link; ln -s {outside} agent-dir")
    sb.close()
    assert os.stat(secret).st_uid == 12345
    assert os.stat(outside).st_uid == 0
    # What the sandbox makes lives in its own tmpfs: nothing of it reaches the host's workspace.
    assert not os.path.lexists(workspace / "agent-link") and not os.path.lexists(workspace / "agent-dir")
    assert os.lstat(workspace / "link.txt").st_uid == os.lstat(workspace).st_uid


# --------------------------------------------------------------------------- host secrets


def test_host_environment_never_enters(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox], monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("FROGFIX_GITLAB_TOKEN", canary)
    monkeypatch.setenv("GITLAB_TOKEN", canary)
    sb = make_sandbox(workspace, env={"JOB_SETTING": "visible"})
    env = bash(sb, "env")
    assert "JOB_SETTING=visible" in env
    outputs = [
        env,
        bash(sb, "cat /proc/[0-9]*/environ | tr '\\0' '\\n'; cat /proc/[0-9]*/cmdline | tr '\\0' ' '"),
        bash(sb, "grep -rl canary- /tmp /etc /frogfix /proc/1/environ 2>/dev/null; echo done"),
        sb.call_tool("Read", {"file_path": "/proc/1/environ"}),
        sb.call_tool("Read", {"file_path": "/proc/self/environ"}),
        sb.run_command("env; cat /proc/1/environ", 20).log,
    ]
    for out in outputs:
        assert canary not in out
    assert "FROGFIX_" not in outputs[0]


def test_frogfix_settings_cannot_be_passed_in(workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> None:
    with pytest.raises(ValueError, match="never enter a sandbox"):
        make_sandbox(workspace, env={"FROGFIX_GITLAB_TOKEN": "secret"})


# ------------------------------------------------------------------------ runaway processes


def test_process_limit_binds(sb: LocalSandbox) -> None:
    count = forked(sb)
    assert 0 < count < TEST_LIMITS.max_processes


def test_fork_bomb_is_stopped_and_the_sandbox_answers_after(sb: LocalSandbox) -> None:
    if forked(sb) >= TEST_LIMITS.max_processes:
        pytest.fail("the process limit does not bind; refusing to run a real fork bomb")
    out = bash(sb, ":(){ :|:& };:", timeout=3)
    assert out.startswith("Timed out after 3.0s\n")
    assert bash(sb, "echo alive") == leaf_bash(0, "alive\n", "")
    assert forked(sb) > 0


def test_detached_fork_bomb_is_reclaimed(sb: LocalSandbox) -> None:
    if forked(sb) >= TEST_LIMITS.max_processes:
        pytest.fail("the process limit does not bind; refusing to run a real fork bomb")
    assert bash(sb, "(:(){ :|:& };:) >/dev/null 2>&1 &") == leaf_bash(0, "", "")
    # Until the bomb fills three quarters of the slots; in its own CPU cgroup it grows at the pace
    # of one fair share of the host, not of as many shares as it has processes.
    crowded = 3 * TEST_LIMITS.max_processes // 4
    wait_for(lambda: len(sandbox_host_pids(sb)) >= crowded + 1, 30, "the fork bomb to fill the sandbox")
    started = time.monotonic()
    out = bash(sb, "echo alive $(ps -e | wc -l)")  # needs forks: the bomb must be gone
    match = re.fullmatch(r"Exit code: 0\nSTDOUT:\nalive (\d+)\n\nSTDERR:\n", out)
    assert match and int(match.group(1)) < 10, out
    assert time.monotonic() - started < 15  # reclaimed at once, not after the tool's timeout


def test_file_size_limit_stops_a_disk_filler(sb: LocalSandbox, workspace: Path) -> None:
    out = bash(sb, "head -c 100M /dev/zero > big.bin; echo rc=$?")
    assert "rc=153" in out  # 128 + SIGXFSZ
    assert int(sb.run_command("stat -c %s big.bin", 20).log) <= TEST_LIMITS.file_size_bytes
    out = sb.call_tool("Write", {"file_path": "big.txt", "content": "x" * (TEST_LIMITS.file_size_bytes + 1)})
    assert out == "OSError: [Errno 27] File too large: 'big.txt'"
    assert bash(sb, "echo alive") == leaf_bash(0, "alive\n", "")


def test_private_tmp_is_bounded(workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> None:
    sb = make_sandbox(workspace, tmp_size_bytes=16 * 1024**2)
    out = bash(sb, "for i in 1 2 3; do head -c 7M /dev/zero > /tmp/f$i || exit 9; done")
    assert out.startswith("Exit code: 9\n") and "No space left on device" in out


def test_endless_printer_is_cut_and_costs_no_memory(workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> None:
    # 192 MiB of address space for the runner: `yes` prints far more than that in four seconds (at
    # 48 MiB/s, a fraction of its speed on a loaded runner), so a runner that held the output would
    # fail with MemoryError.
    memory = 192 * 1024**2
    sb = make_sandbox(workspace, limits=dataclasses.replace(TEST_LIMITS, memory_bytes=memory))
    out = bash(sb, "yes", timeout=4)
    assert out.startswith("Timed out after 4.0s\nSTDOUT:\ny\ny\n")
    head, trailer = out.rsplit("\n", 1)
    assert len(head) == 30_000
    match = re.fullmatch(r"\[truncated (\d+) chars\]", trailer)
    assert match and int(match.group(1)) > memory  # more than the runner could have held
    assert bash(sb, "echo alive") == leaf_bash(0, "alive\n", "")
    # The pipeline's commands too: a test run that prints forever keeps only a head and a tail.
    result = sb.run_command("yes", timeout=2)
    assert result.timed_out and result.log.startswith("y\ny\n") and result.log.endswith("y\ny\n")
    assert "chars omitted ...]" in result.log and len(result.log) < TEST_LIMITS.output_bytes + 100


def test_timeout_kills_the_whole_process_group(sb: LocalSandbox) -> None:
    out = bash(sb, "sleep 1234 & sleep 1235 & wait", timeout=1)
    assert out.startswith("Timed out after 1.0s\n")
    assert bash(sb, "pgrep -f 'sleep 123[45]' || echo none") == leaf_bash(0, "none\n", "")
