"""Walls that hold for the sandbox as a whole: memory, pids and CPU per cgroup, size-limited workspace and /tmp.

Real bubblewrap, real processes, the host's real cgroups (v2, or v1 where the host still mounts
the controller there). Tests that need a controller skip, with the reason doctor would give, on a
host that does not let this process use it; with FROGFIX_TEST_REQUIRE_CGROUPS=1 (CI: .ci/run)
they fail instead, so a CI runner without cgroup rights cannot pass them silently.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox import cgroups
from sandbox.base import SandboxError
from sandbox.local import PIDS_HEADROOM, LocalSandbox
from tests.nonroot import NonRoot
from tests.sandbox.conftest import TEST_LIMITS
from tests.sandbox.support import bash, leaf_bash, sandbox_host_pids

pytestmark = pytest.mark.bwrap

MiB = 1024**2


REQUIRE_CGROUPS = "FROGFIX_TEST_REQUIRE_CGROUPS"


def need(*controllers: str) -> None:
    """Skip where this process gets no such cgroup; fail instead where REQUIRE_CGROUPS=1 (CI)."""
    support = cgroups.host_support()
    missing = [c for c in controllers if c not in support.controllers]
    if missing:
        why = f"this host gives this process no {', '.join(missing)} cgroup: {support.describe()}"
        if os.environ.get(REQUIRE_CGROUPS) == "1":
            pytest.fail(f"{REQUIRE_CGROUPS}=1 but {why}; fix: {cgroups.DELEGATION_FIX}", pytrace=False)
        pytest.skip(why)


def test_ci_fails_where_a_cgroup_test_would_skip(monkeypatch: pytest.MonkeyPatch) -> None:
    """FROGFIX_TEST_REQUIRE_CGROUPS=1 (exported by .ci/run) turns need()'s skip into a failure naming the gap."""
    monkeypatch.setenv(REQUIRE_CGROUPS, "1")
    with pytest.raises(pytest.fail.Exception, match="no no-such-controller cgroup"):
        need("no-such-controller")
    monkeypatch.delenv(REQUIRE_CGROUPS)
    with pytest.raises(pytest.skip.Exception, match="no no-such-controller cgroup"):
        need("no-such-controller")


def cgroup_file(sb: LocalSandbox, controller: str, v1_name: str, v2_name: str) -> str:
    cgroup = sb._res.cgroup
    assert cgroup is not None, "the sandbox has no cgroup"
    version, path = cgroup.dirs[controller]
    return (Path(path) / (v1_name if version == 1 else v2_name)).read_text().strip()


def cgroup_paths(sb: LocalSandbox) -> list[str]:
    cgroup = sb._res.cgroup
    assert cgroup is not None, "the sandbox has no cgroup"
    return [path for _, path in cgroup.paths()]


def used_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


# ------------------------------------------------------------------------------- memory

HOG = textwrap.dedent(
    """
    import sys, time
    size = int(sys.argv[1])
    block = bytearray(size)
    block[::4096] = b"\\x01" * len(range(0, size, 4096))  # touch every page: resident, not just reserved
    print("held", sys.argv[2], flush=True)
    time.sleep(4)
    print("kept", sys.argv[2], flush=True)  # held the whole time, together with the others still alive
    """
)


def test_three_processes_together_stay_under_the_memory_cgroup(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    """Each hog is within RLIMIT_AS (more than half of it), so only a bound on the sum stops them."""
    need("memory")
    limits = dataclasses.replace(TEST_LIMITS, memory_bytes=256 * MiB)
    sizes = {"workspace_size_bytes": 16 * MiB, "tmp_size_bytes": 16 * MiB}
    (workspace / "hog.py").write_text(HOG)
    sb = make_sandbox(workspace, limits=limits, **sizes)
    budget = 256 * MiB  # memory_bytes is the total: processes, and tmpfs pages count in it too
    assert int(cgroup_file(sb, "memory", "memory.limit_in_bytes", "memory.max")) == budget
    hog = 180 * MiB  # > half of memory_bytes; three of them are far over the whole budget
    out = bash(sb, f"for i in 1 2 3; do python3 hog.py {hog} $i & done; wait; echo done", timeout=60)
    kept = len(re.findall(r"^kept \d$", out, re.M))
    assert "done" in out, out
    assert kept * hog < budget and kept < 3, out  # the others were stopped (OOM kill or MemoryError)
    assert "Killed" in out or "MemoryError" in out, out
    peak = int(cgroup_file(sb, "memory", "memory.max_usage_in_bytes", "memory.peak"))
    assert peak <= budget, (peak, budget)
    assert bash(sb, "echo alive") == leaf_bash(0, "alive\n", "")
    assert bash(sb, f"python3 hog.py {hog} again").startswith("Exit code: 0\nSTDOUT:\nheld again\nkept again\n")


DEFAULT_PROPORTIONS_SCALED = {  # the defaults (4Gi, 2Gi, 512Mi) at 3/8: the files leave processes the floor
    "FROGFIX_SANDBOX": "local",
    "FROGFIX_SANDBOX_MEMORY": "1536Mi",
    "FROGFIX_SANDBOX_WORKSPACE_SIZE": "768Mi",
    "FROGFIX_SANDBOX_TMP_SIZE": "192Mi",
}


@pytest.fixture
def settings_sandbox(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalSandbox]:
    """A sandbox built the way a job's is (settings -> worker.wiring), from DEFAULT_PROPORTIONS_SCALED."""
    from app.settings import Settings
    from worker.wiring import open_job_sandbox

    for key, value in DEFAULT_PROPORTIONS_SCALED.items():
        monkeypatch.setenv(key, value)
    sb = open_job_sandbox(workspace, Settings())
    assert isinstance(sb, LocalSandbox)
    try:
        yield sb
    finally:
        sb.close()


def test_sandbox_memory_is_the_total_of_its_processes(settings_sandbox: LocalSandbox) -> None:
    """Finding 5 at the default proportions: three processes each holding 40% of FROGFIX_SANDBOX_MEMORY
    (each within its RLIMIT_AS) are not all kept, and the sandbox still answers after."""
    need("memory")
    sb, memory = settings_sandbox, 1536 * MiB
    assert int(cgroup_file(sb, "memory", "memory.limit_in_bytes", "memory.max")) == memory
    bash(sb, f"cat > hog.py <<'EOF'\n{HOG}\nEOF")
    hog = memory * 2 // 5
    out = bash(sb, f"for i in 1 2 3; do python3 hog.py {hog} $i & done; wait; echo done", timeout=90)
    kept = len(re.findall(r"^kept \d$", out, re.M))
    assert "done" in out and kept < 3, out  # one was OOM-killed or could not allocate
    assert "Killed" in out or "MemoryError" in out, out
    assert int(cgroup_file(sb, "memory", "memory.max_usage_in_bytes", "memory.peak")) <= memory
    assert bash(sb, "echo alive") == leaf_bash(0, "alive\n", "")


def test_full_workspace_and_tmp_at_the_default_proportions_are_enospc_not_an_oom_kill(
    settings_sandbox: LocalSandbox,
) -> None:
    """The tmpfs sizes fit in the memory with room for processes: filling both fails the writes, kills nothing."""
    need("memory")
    sb = settings_sandbox
    fill = "head -c 400M /dev/zero > a && { head -c 400M /dev/zero > b || echo FULL ws; }"  # each under RLIMIT_FSIZE
    fill += "; head -c 200M /dev/zero > /tmp/big || echo FULL tmp"
    out = bash(sb, fill + "; python3 -c 'b = bytearray(256 << 20); b[::4096] = bytes(65536); print(\"held\", len(b))'",
               timeout=90)  # fmt: skip
    assert out.count("No space left on device") == 2 and "FULL ws" in out and "FULL tmp" in out, out
    assert f"held {256 * MiB}" in out, out  # with both tmpfs full, processes still have their floor
    assert bash(sb, "echo alive") == leaf_bash(0, "alive\n", "")


# --------------------------------------------------------------------------------- pids

BOMB_SECONDS = 2


def test_pids_cgroup_counts_every_process_of_a_fork_bomb(sb: LocalSandbox) -> None:
    need("pids")
    pids_max = int(cgroup_file(sb, "pids", "pids.max", "pids.max"))
    assert pids_max == TEST_LIMITS.max_processes + PIDS_HEADROOM
    assert bash(sb, "(:(){ :|:& };:) >/dev/null 2>&1 &") == leaf_bash(0, "", "")
    seen, many = [0], TEST_LIMITS.max_processes // 2
    # Watch for BOMB_SECONDS, and on until the bomb has grown (a loaded runner forks slowly), up to 30 s.
    started = time.monotonic()
    while (elapsed := time.monotonic() - started) < BOMB_SECONDS or (max(seen) < many and elapsed < 30):
        seen.append(int(cgroup_file(sb, "pids", "pids.current", "pids.current")))
        time.sleep(0.05)
    assert max(seen) <= pids_max, seen
    assert max(seen) >= many, seen  # the bomb's many processes, all counted
    assert bash(sb, "echo alive") == leaf_bash(0, "alive\n", "")


FORK_TREE = textwrap.dedent(
    """
    import os, sys, time
    # Every process forks two children that do the same: a tree, so the count is across processes.
    for depth in range(8):
        kids = 0
        for _ in range(2):
            try:
                if os.fork() == 0:
                    break
                kids += 1
            except OSError:
                print("fork refused", flush=True)
                break
        else:
            time.sleep(3)
            os._exit(0)
    time.sleep(3)
    """
)


def test_pids_cgroup_alone_stops_a_fork_tree_across_processes() -> None:
    """Without the runner's RLIMIT_NPROC: the cgroup made by `create` and joined by the wrapper is the wall."""
    need("pids")
    cgroup = cgroups.create(cgroups.CgroupLimits(512 * MiB, 24, 1.0), cgroups.host_support())
    assert cgroup is not None
    try:
        drop = (65534, 65534) if os.geteuid() == 0 else None
        argv = cgroup.enter_argv(["/usr/bin/python3", "-I", "-S", "-c", FORK_TREE], drop)
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, env={"PATH": "/usr/bin:/bin"})
        assert "fork refused" in done.stdout, (done.stdout, done.stderr)  # 2**8 processes wanted, 24 allowed
        events = (Path(str(cgroup.path_for("pids"))) / "pids.events").read_text()
        assert int(re.search(r"max (\d+)", events).group(1)) > 0, events  # type: ignore[union-attr]
    finally:
        assert cgroup.kill_and_remove() == []
    assert not any(os.path.exists(p) for _, p in cgroup.paths())


# ---------------------------------------------------------------------------------- cpu


def test_cpu_limit_is_set_on_the_sandbox_cgroup(workspace: Path, make_sandbox: Callable[..., LocalSandbox]) -> None:
    need("cpu")
    sb = make_sandbox(workspace, cpus=0.5)
    assert sb._res.cgroup is not None
    version, path = sb._res.cgroup.dirs["cpu"]
    if version == 1:
        quota, period = (int((Path(path) / name).read_text()) for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
    else:
        quota, period = map(int, (Path(path) / "cpu.max").read_text().split())
    assert (quota, period) == (50_000, 100_000)  # half a CPU for all its processes together


# ----------------------------------------------------------------- every process, from the start


def test_every_sandbox_process_is_in_its_cgroups(sb: LocalSandbox) -> None:
    need("pids")
    bash(sb, "sleep 30 >/dev/null 2>&1 &")
    pids = sandbox_host_pids(sb)
    assert len(pids) >= 3  # bwrap, the runner (the namespace's init, --as-pid-1), the sleep
    for path in cgroup_paths(sb):
        members = {int(p) for p in (Path(path) / "cgroup.procs").read_text().split()}
        assert pids <= members, (path, pids - members)


def test_wrapper_joins_before_bwrap_runs() -> None:
    """The wrapper refuses to run bwrap at all when it cannot join the cgroup (no silent fallback)."""
    done = subprocess.run(
        [sys.executable, "-I", "-S", cgroups.ENTER_SCRIPT, "/nonexistent/cgroup.procs", "--", "/bin/echo", "ran"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 127 and done.stdout == ""
    assert "cannot start the sandbox in its cgroup" in done.stderr


# ------------------------------------------------------------------------------ cleanup


def test_no_cgroup_left_after_close(sb: LocalSandbox) -> None:
    need("pids")
    paths = cgroup_paths(sb)
    assert all(os.path.isdir(p) for p in paths)
    bash(sb, "sleep 60 >/dev/null 2>&1 &")
    sb.close()
    assert not any(os.path.exists(p) for p in paths)


def test_no_cgroup_left_after_the_sandbox_is_killed(sb: LocalSandbox) -> None:
    need("pids")
    paths = cgroup_paths(sb)
    assert sb._res.proc is not None
    os.kill(sb._res.proc.pid, signal.SIGKILL)
    with pytest.raises(SandboxError):
        for _ in range(50):
            bash(sb, "echo hi")
            time.sleep(0.1)
    assert not any(os.path.exists(p) for p in paths)  # gone once the sandbox is known dead, before close
    sb.close()


KILLED_WORKER = textwrap.dedent(
    """
    import sys, time
    sys.path.insert(0, {repo!r})
    from sandbox.base import SandboxSpec
    from sandbox.local import LocalSandbox
    sb = LocalSandbox(SandboxSpec(workspace={workspace!r}))
    sb.call_tool("Bash", {{"command": "sleep 300 >/dev/null 2>&1 &"}})
    print("\\n".join(p for _, p in sb._res.cgroup.paths()), flush=True)
    time.sleep(300)
    """
)


@pytest.mark.serial  # any other process's sandbox start would reap them first
@pytest.mark.parametrize("reaper", ["next sandbox", "manage.py reap-sandboxes"])
def test_cgroups_of_a_killed_worker_are_reaped(
    reaper: str, workspace: Path, make_sandbox: Callable[..., LocalSandbox], tmp_path: Path
) -> None:
    need("pids")
    repo = str(Path(__file__).resolve().parents[2])
    script = KILLED_WORKER.format(repo=repo, workspace=str(workspace))
    worker = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout is not None
        paths = [worker.stdout.readline().strip() for _ in cgroups.host_support().placements]
        paths = sorted(set(paths))
        assert paths and all(os.path.isdir(p) for p in paths), paths
    finally:
        worker.kill()
        worker.wait()
    assert all(os.path.isdir(p) for p in paths)  # the worker died without closing: left behind
    if reaper == "next sandbox":
        make_sandbox(workspace)
    else:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "FROGFIX_SANDBOX": "local",
               "FROGFIX_DATA_DIR": str(tmp_path / "data")}  # fmt: skip
        done = subprocess.run([sys.executable, f"{repo}/manage.py", "reap-sandboxes"], capture_output=True,
                              text=True, timeout=120, env=env, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert set(paths) <= set(done.stdout.split()), done.stdout
    assert not any(os.path.exists(p) for p in paths)


OTHER_NAMESPACE_WORKER = textwrap.dedent(
    """
    import os, sys, time
    sys.path.insert(0, {repo!r})
    from sandbox import cgroups
    limits = cgroups.CgroupLimits(memory_bytes=256 << 20, max_processes=64, cpus=1.0)
    cgroup = cgroups.create(limits, cgroups.host_support())
    assert cgroup is not None
    print(os.getpid(), flush=True)
    print("\\n".join(p for _, p in cgroup.paths()), flush=True)
    time.sleep(300)
    """
)


def test_a_cgroup_of_another_pid_namespace_is_left_alone() -> None:
    """A live worker in another pid namespace (a container sharing the cgroup parent) names its
    cgroups with pids that mean nothing here: they are not taken for a dead worker's and reaped."""
    need("pids")
    if os.geteuid() != 0:
        pytest.skip("making a worker in its own pid namespace (unshare --pid) needs root here; CI runs as root")
    repo = str(Path(__file__).resolve().parents[2])
    script = OTHER_NAMESPACE_WORKER.format(repo=repo)
    argv = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", sys.executable, "-c", script]
    worker = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    paths: list[str] = []
    try:
        assert worker.stdout is not None
        its_pid = int(worker.stdout.readline())
        paths = sorted({worker.stdout.readline().strip() for _ in cgroups.host_support().placements})
        assert its_pid < 10 and paths and all(os.path.isdir(p) for p in paths), (its_pid, paths)
        cgroups.reap_stale()  # pid `its_pid` here is another process (or none): still not ours to judge
        assert all(os.path.isdir(p) for p in paths), "a live worker's cgroups in another pid namespace were reaped"
    finally:
        worker.kill()
        worker.wait()
        assert cgroups._kill_and_remove(paths, wait_s=5.0) == []


# ------------------------------------------------------------------------------ storage


@pytest.mark.parametrize("where", ["workspace", "/tmp"])
def test_four_files_under_the_file_limit_cannot_fill_the_host(
    where: str, workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    """Each file is under RLIMIT_FSIZE; together they are over the folder's size: ENOSPC inside."""
    limits = dataclasses.replace(TEST_LIMITS, file_size_bytes=40 * MiB)
    sb = make_sandbox(workspace, limits=limits, workspace_size_bytes=48 * MiB, tmp_size_bytes=48 * MiB)
    folder = "." if where == "workspace" else "/tmp"
    before = used_bytes(workspace)
    out = bash(sb, f"for i in 1 2 3 4; do head -c 30M /dev/zero > {folder}/f$i || echo FAILED $i; done; echo next")
    grown = used_bytes(workspace) - before
    assert "No space left on device" in out and "FAILED 2" in out and "next" in out, out
    assert grown < 48 * MiB, grown  # 120 MiB were attempted; the host's disk did not take them
    assert sorted(p.name for p in workspace.iterdir()) == []
    assert bash(sb, f"rm {folder}/f1 {folder}/f2 && head -c 30M /dev/zero > {folder}/f5 && echo ok").startswith(
        "Exit code: 0\nSTDOUT:\nok\n"
    )


def test_a_checkout_larger_than_the_workspace_is_a_clear_error(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    (workspace / "big.bin").write_bytes(b"\0" * (6 * MiB))
    with pytest.raises(SandboxError, match="No space left on device"):
        make_sandbox(workspace, workspace_size_bytes=4 * MiB)
    assert (workspace / "big.bin").stat().st_size == 6 * MiB  # the host's copy is untouched


# ----------------------------------------------------------------------------- fallback


def test_worker_start_warns_when_sandboxes_would_have_rlimits_only() -> None:
    from structlog.testing import capture_logs

    from worker.tasks import warn_about_cgroups

    bare = cgroups.CgroupSupport(problems=("memory: no cgroup hierarchy carries it",))
    with capture_logs() as logs:
        assert warn_about_cgroups(bare) is True
        assert warn_about_cgroups(cgroups.host_support()) is bool(cgroups.host_support().missing)
    [warning] = [e for e in logs if e["log_level"] == "warning"][:1] or [None]
    assert warning is not None and warning["event"] == "sandbox_cgroups_missing"
    assert "no per-sandbox cgroup limits" in warning["detail"] and "rlimits only" in warning["fix"]


def test_without_cgroups_the_sandbox_still_runs_on_its_rlimits(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    sb = make_sandbox(workspace, use_cgroups=False)
    assert sb._res.cgroup is None
    assert bash(sb, "echo alive") == leaf_bash(0, "alive\n", "")


UNPRIVILEGED_WORKER = textwrap.dedent(
    """
    import json, os, sys
    from sandbox.base import SandboxOptions, SandboxSpec
    from sandbox.local import LocalSandbox
    sizes = SandboxOptions(workspace_size_bytes=16 << 20, tmp_size_bytes=16 << 20)
    sb = LocalSandbox(SandboxSpec(workspace=sys.argv[1]), sizes)
    fill = "for i in 1 2 3 4; do head -c 7M /dev/zero > {0}/f$i || echo FAILED $i; done"
    out = [sb.call_tool("Bash", {"command": fill.format(d)}) for d in (".", "/tmp")]
    out.append(sb.call_tool("Bash", {"command": "echo alive"}))
    print(json.dumps({"uid": os.geteuid(), "out": out}))
    sb.close()
    """
)


def test_storage_limits_hold_for_an_unprivileged_worker(nonroot: NonRoot) -> None:
    """The shipped worker is not root: bwrap's sized tmpfs works inside its user namespace."""
    workspace = nonroot.folder("unprivileged-")
    result = nonroot.run_json(nonroot.script(UNPRIVILEGED_WORKER), str(workspace), timeout=120)
    for out in result["out"][:2]:
        assert "No space left on device" in out and "FAILED 3" in out, out
    assert result["out"][2] == leaf_bash(0, "alive\n", "")
    assert list(workspace.iterdir()) == []
