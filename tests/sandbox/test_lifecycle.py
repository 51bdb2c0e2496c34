"""Starting, failing and stopping a LocalSandbox; infrastructure failures raise SandboxError."""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import open_sandbox
from sandbox.base import CommandResult, SandboxError, SandboxLimits, SandboxOptions, SandboxSpec, SandboxUnavailable
from sandbox.kubernetes_manifests import KubernetesOptions
from sandbox.local import LocalOptions, LocalSandbox
from tests.sandbox.conftest import TEST_LIMITS
from tests.sandbox.support import bash, leaf_bash, skip_unless_root

bwrap = pytest.mark.bwrap

FAKE_RUNNER = r"""
import json, sys, time
for line in sys.stdin:
    request = json.loads(line)
    name = request.get("name")
    if request["op"] == "ping":
        reply = {"id": request["id"], "ok": True, "pong": True}
    elif name == "Read":
        print("this is not json", flush=True)
        continue
    elif name == "Write":
        reply = {"id": 999, "ok": True, "output": "x"}
    elif name == "Glob":
        reply = {"id": request["id"], "ok": True, "output": 5}
    elif name == "Edit":
        time.sleep(60)
        continue
    else:
        sys.exit(3)
    print(json.dumps(reply), flush=True)
"""


def host_processes(marker: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmdline:
                pids.append(int(entry))
    return pids


# ------------------------------------------------------------------------------ no sandbox


def test_missing_bwrap_is_unavailable_not_unsandboxed(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = SandboxSpec(workspace=str(workspace))
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        LocalSandbox(spec, local=LocalOptions(bwrap="/nonexistent/bwrap"))
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        open_sandbox(spec)


def test_factory(workspace: Path) -> None:
    spec = SandboxSpec(workspace=str(workspace))
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        open_sandbox(spec, backend="chroot")
    with pytest.raises(SandboxUnavailable, match="kubernetes"):
        open_sandbox(spec, backend="kubernetes")
    with pytest.raises(TypeError, match="the local backend takes LocalOptions"):
        open_sandbox(spec, "local", SandboxOptions(), KubernetesOptions())
    with pytest.raises(TypeError, match="the kubernetes backend takes KubernetesOptions"):
        open_sandbox(spec, "kubernetes", SandboxOptions(), LocalOptions())


@bwrap
def test_factory_opens_a_local_sandbox(workspace: Path) -> None:
    with open_sandbox(SandboxSpec(workspace=str(workspace), limits=TEST_LIMITS)) as sb:
        assert isinstance(sb, LocalSandbox)
        assert sb.runner_info["uid"] == 1000
        assert bash(sb, "hostname") == leaf_bash(0, "frogfix-sandbox\n", "")


# ------------------------------------------------------------------------------ lifecycle


@bwrap
def test_close_is_idempotent_and_final(workspace: Path) -> None:
    with LocalSandbox(SandboxSpec(workspace=str(workspace), limits=TEST_LIMITS)) as sb:
        assert sb.ping()["pong"] is True
    sb.close()
    sb.close()
    with pytest.raises(SandboxError, match="closed"):
        sb.call_tool("Read", {"file_path": "x"})


@bwrap
def test_close_kills_background_processes(sb: LocalSandbox) -> None:
    marker = f"sleep {1000 + uuid.uuid4().int % 1000}.5"
    bash(sb, f"{marker} >/dev/null 2>&1 &")
    pids = host_processes(marker)
    assert len(pids) == 1
    if os.geteuid() == 0:  # the sandbox runs as an unprivileged host uid, never as root
        uid_line = next(x for x in Path(f"/proc/{pids[0]}/status").read_text().splitlines() if x.startswith("Uid:"))
        assert uid_line.split()[1:] == ["65534"] * 4
    sb.close()
    assert host_processes(marker) == []


def runner_host_pid(sandbox: LocalSandbox) -> int:
    """The runner's pid on the host: the one child of the bwrap that binds this workspace."""
    assert sandbox._res.proc is not None
    monitor = sandbox._res.proc.pid  # bwrap (the cgroup wrapper execs it)
    children = [
        int(entry) for entry in os.listdir("/proc") if entry.isdigit() and f"PPid:\t{monitor}\n" in _status(entry)
    ]
    assert len(children) == 1, children
    return children[0]


def _status(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return ""


@bwrap
def test_runner_death_is_an_infrastructure_error(sb: LocalSandbox) -> None:
    # Nothing inside can kill the runner (the sandbox's init, see test_channel.py): the host does.
    killer = threading.Timer(0.5, os.kill, (runner_host_pid(sb), signal.SIGKILL))
    killer.start()
    with pytest.raises(SandboxError, match="runner exited"):
        bash(sb, "sleep 5")
    killer.join()
    with pytest.raises(SandboxError, match="runner exited"):
        sb.call_tool("Read", {"file_path": "x"})


@bwrap
@pytest.mark.parametrize(
    ("tool", "message"),
    [("Read", "not JSON"), ("Write", "unexpected reply"), ("Glob", "without a valid 'output'"), ("Bash", "exited")],
)
def test_bad_runner_replies_raise_sandbox_error(
    workspace: Path, ws_base: Path, make_sandbox: Callable[..., LocalSandbox], tool: str, message: str
) -> None:
    fake = ws_base / f"fake-runner-{uuid.uuid4().hex}.py"
    fake.write_text(FAKE_RUNNER)
    sb = make_sandbox(workspace, runner_script=str(fake))
    with pytest.raises(SandboxError, match=message):
        sb.call_tool(tool, {"file_path": "a", "content": "b", "pattern": "*", "command": "true"})
    with pytest.raises(SandboxError):
        sb.ping()


@bwrap
def test_silent_runner_times_out(workspace: Path, ws_base: Path, make_sandbox: Callable[..., LocalSandbox]) -> None:
    fake = ws_base / f"fake-runner-{uuid.uuid4().hex}.py"
    fake.write_text(FAKE_RUNNER)
    sb = make_sandbox(workspace, runner_script=str(fake), tool_timeout_s=0.5)
    with pytest.raises(SandboxError, match="did not answer within"):
        sb.call_tool("Edit", {})


@bwrap
def test_wall_clock_limit_kills_the_sandbox(workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> None:
    limits = SandboxLimits(wall_seconds=1.5, max_processes=64, default_tool_timeout=20)
    sb = make_sandbox(workspace, limits=limits)
    started = time.monotonic()
    with pytest.raises(SandboxError, match=r"wall-clock limit of 1\.5s"):
        bash(sb, "sleep 30")
    assert time.monotonic() - started < 10
    with pytest.raises(SandboxError, match="wall-clock"):
        sb.ping()


@bwrap
def test_run_command_reports_exit_code_log_and_timeout(sb: LocalSandbox) -> None:
    result = sb.run_command("echo out; echo err >&2; exit 5", timeout=30)
    assert isinstance(result, CommandResult)
    assert (result.command, result.exit_code, result.log, result.timed_out) == (
        "echo out; echo err >&2; exit 5",
        5,
        "out\nerr\n",
        False,
    )
    long = sb.run_command("seq 1 200000", timeout=30)
    assert long.exit_code == 0 and long.log.startswith("1\n2\n") and long.log.endswith("199999\n200000\n")
    assert len(long.log) <= TEST_LIMITS.output_bytes + 100
    slow = sb.run_command("echo started; sleep 30", timeout=3)  # 3 s: room for a loaded runner to print first
    assert slow.timed_out and slow.log == "started\n" and slow.duration_s < 15


@bwrap
def test_job_environment_and_extra_read_only_binds(
    workspace: Path, outside: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    outside.chmod(0o755)
    if os.geteuid() == 0:  # writable for the sandbox's host uid: only the read-only mount stops it
        os.chown(outside, 65534, 65534)
    sb = make_sandbox(workspace, env={"PYTHONDONTWRITEBYTECODE": "1"}, ro_binds=[(str(outside), "/opt/tools")])
    assert bash(sb, "echo $PYTHONDONTWRITEBYTECODE; cat /opt/tools/host.txt") == leaf_bash(0, "1\nHOST-SECRET\n", "")
    assert "Read-only file system" in bash(sb, "echo x > /opt/tools/new.txt")


# --------------------------------------------------------------------- running as root


@bwrap
def test_workspace_is_handed_over_and_back(workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> None:
    skip_unless_root()
    (workspace / "a.txt").write_text("a\n")
    sb = make_sandbox(workspace)
    assert os.stat(workspace / "a.txt").st_uid == 65534
    bash(sb, "cp /bin/true setuid-bin && chmod u+s,g+s setuid-bin && mkdir -p made/here && echo x > made/here/f")
    sb.close()
    for path in (workspace, workspace / "a.txt"):
        assert (os.lstat(path).st_uid, os.lstat(path).st_gid) == (0, 0), path
    # The sandbox wrote its own copy (a tmpfs): no setuid file or folder of its making is on the host.
    assert sorted(p.name for p in workspace.iterdir()) == ["a.txt"]


@bwrap
def test_unreachable_workspace_is_a_clear_error(ws_base: Path) -> None:
    skip_unless_root()
    hidden = ws_base / f"private-{uuid.uuid4().hex}"
    (hidden / "ws").mkdir(parents=True)
    hidden.chmod(0o700)
    with pytest.raises(SandboxError, match="chmod o\\+x"):
        LocalSandbox(SandboxSpec(workspace=str(hidden / "ws")))
    assert os.stat(hidden / "ws").st_uid == 0


@bwrap
def test_bwrap_failures_are_reported(workspace: Path, ws_base: Path) -> None:
    skip_unless_root()
    private = ws_base / f"private-{uuid.uuid4().hex}"
    (private / "tools").mkdir(parents=True)
    private.chmod(0o700)
    # FrogFix's checks see a reachable link; bwrap, as the sandbox uid, cannot follow it.
    link = ws_base / f"tools-{uuid.uuid4().hex}"
    link.symlink_to(private / "tools")
    with pytest.raises(SandboxUnavailable, match="Can't find source path"):
        LocalSandbox(SandboxSpec(workspace=str(workspace)), local=LocalOptions(ro_binds=[(str(link), "/opt/tools")]))
    assert os.stat(workspace).st_uid == 0  # handed back after the failed start


@bwrap
def test_unreachable_bind_is_a_clear_error_before_bwrap(workspace: Path, ws_base: Path) -> None:
    skip_unless_root()
    private = ws_base / f"private-{uuid.uuid4().hex}"
    (private / "tools").mkdir(parents=True)
    private.chmod(0o700)
    with pytest.raises(SandboxError, match="chmod o\\+x"):
        LocalSandbox(SandboxSpec(workspace=str(workspace)), local=LocalOptions(ro_binds=[str(private / "tools")]))
    assert os.stat(workspace).st_uid == 0  # handed back after the refused start
