"""worker/git/workspace_pool.py's WorkspacePool against a mirror of a real git smart-HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.doubles.git_http import git
from tests.repos.conftest import HEADER, Upstream
from worker.git import workspace_pool
from worker.git.gitcalls import RepoError, mirror_key
from worker.git.mirrors import RepoCache, resolve
from worker.git.workspace_pool import WorkspacePool, make_workspace

KEY = mirror_key("gitea", "acme/widgets")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def mirror(upstream: Upstream, tmp_path: Path) -> Path:
    return RepoCache(tmp_path / "mirrors", timeout=20).mirror(KEY, upstream.url, HEADER)


@pytest.fixture
def workspaces(tmp_path: Path) -> Path:
    return tmp_path / "workspaces"


@pytest.fixture
def pool(workspaces: Path) -> WorkspacePool:
    return WorkspacePool(workspaces, size=2, timeout=20)


def snapshot(ws: Path) -> dict[str, object]:
    """Everything make_workspace decides: every path, its mode and bytes; the index by content."""
    found: dict[str, object] = {}
    for path in sorted(ws.rglob("*")):
        rel = str(path.relative_to(ws))
        info = path.lstat()
        if rel == ".git/index":  # holds stat data (inodes, times): compared through ls-files
            found[rel] = git("ls-files", "--stage", cwd=ws).stdout
        elif rel == ".git/logs/HEAD":  # holds the time of the checkout
            found[rel] = re.sub(rb"> \d+ [+-]\d{4}\t", b"> T\t", path.read_bytes())
        elif path.is_file():
            found[rel] = (oct(info.st_mode), path.read_bytes())
        else:
            found[rel] = oct(info.st_mode)
    return found


def inodes(*roots: Path) -> set[int]:
    return {p.lstat().st_ino for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def head(ws: Path) -> str:
    return git("rev-parse", "HEAD", cwd=ws).stdout.strip()


def test_take_after_fill_is_make_workspace_s_result(
    upstream: Upstream, mirror: Path, pool: WorkspacePool, workspaces: Path, tmp_path: Path
) -> None:
    base = resolve(mirror, "main")
    pool.fill(mirror, base)
    assert pool.ready(mirror, base) == 2

    ws = workspaces / "job-1-run-1" / "attempt-1"
    assert pool.take(mirror, base, ws)
    assert pool.ready(mirror, base) == 1
    reference = tmp_path / "reference"
    make_workspace(mirror, reference, base)

    assert snapshot(ws) == snapshot(reference)
    assert head(ws) == upstream.second
    assert git("status", "--porcelain", cwd=ws).stdout == ""
    assert git("remote", cwd=ws).stdout == ""
    assert git("fsck", "--no-progress", cwd=ws).returncode == 0
    assert (ws / "app/calc.py").read_text() == "def add(a, b):\n    return a + b - 0\n"
    # its own files: no hardlink, nothing in common with the mirror or what is still in the pool
    files = [p for p in ws.rglob("*") if p.is_file()]
    assert files and all(p.lstat().st_nlink == 1 for p in files)
    assert not inodes(ws) & inodes(mirror, pool.root)
    # taken once: the pool no longer holds it, the job may change it freely
    (ws / "README.md").write_text("changed\n")
    assert pool.take(mirror, base, workspaces / "job-2-run-1" / "attempt-1")
    assert (workspaces / "job-2-run-1" / "attempt-1" / "README.md").read_text() == "hello\n"
    assert not pool.take(mirror, base, workspaces / "job-3-run-1" / "attempt-1")
    assert not (workspaces / "job-3-run-1" / "attempt-1").exists()


def test_take_needs_the_exact_commit(upstream: Upstream, mirror: Path, pool: WorkspacePool, workspaces: Path) -> None:
    pool.fill(mirror, upstream.second)
    assert not pool.take(mirror, upstream.first, workspaces / "a")
    assert not (workspaces / "a").exists()
    assert pool.ready(mirror, upstream.second) == 2  # untouched
    with pytest.raises(RepoError, match="not in the mirror"):
        pool.fill(mirror, "0" * 40)
    assert pool.ready(mirror, upstream.second) == 2  # a bad fill discards nothing
    other = WorkspacePool(workspaces, size=2)
    assert not other.take(mirror.parent / "other.git", upstream.second, workspaces / "b")  # another mirror's pool
    with pytest.raises(RepoError):
        pool.take(mirror, "main", workspaces / "c")  # a full sha only
    (workspaces / "d").mkdir()
    (workspaces / "d" / "x").write_text("x")
    with pytest.raises(RepoError, match="not empty"):
        pool.take(mirror, upstream.second, workspaces / "d")
    assert pool.ready(mirror, upstream.second) == 2
    (workspaces / "e").mkdir()  # an empty folder is fine, as with make_workspace
    assert pool.take(mirror, upstream.second, workspaces / "e")
    assert head(workspaces / "e") == upstream.second


def test_concurrent_takers_never_get_the_same_workspace(
    upstream: Upstream, mirror: Path, workspaces: Path, tmp_path: Path
) -> None:
    pool = WorkspacePool(workspaces, size=3)
    base = upstream.second
    pool.fill(mirror, base)
    made = {
        name: os.stat(pool.folder_for(mirror) / "ready" / name).st_ino
        for name in os.listdir(pool.folder_for(mirror) / "ready")
    }
    assert len(made) == 3

    # threads: 8 takers, released together, for 3 ready workspaces
    start = threading.Barrier(8)
    results: dict[int, bool | BaseException] = {}

    def take(n: int) -> None:
        start.wait()
        try:
            results[n] = pool.take(mirror, base, workspaces / f"t{n}")
        except BaseException as exc:
            results[n] = exc

    threads = [threading.Thread(target=take, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    winners = [n for n, got in results.items() if got is True]
    assert len(results) == 8 and all(isinstance(got, bool) for got in results.values())
    assert len(winners) == 3
    assert {(workspaces / f"t{n}").stat().st_ino for n in winners} == set(made.values())
    assert all(head(workspaces / f"t{n}") == base for n in winners)
    assert all(not (workspaces / f"t{n}").exists() for n in results if n not in winners)

    # processes: 4 takers in separate interpreters for 2 ready workspaces
    pool2 = WorkspacePool(workspaces, size=2)
    pool2.fill(mirror, base)
    script = (
        "import json, sys\nfrom pathlib import Path\nfrom worker.git.workspace_pool import WorkspacePool\n"
        "root, mirror, base, dest = sys.argv[1:]\n"
        "sys.stdin.readline()\n"  # wait for the go, so the takes overlap
        "print(json.dumps(WorkspacePool(Path(root), size=2).take(Path(mirror), base, Path(dest))))\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(workspaces), str(mirror), base, str(workspaces / f"p{n}")],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outcomes = [json.loads(proc.communicate(timeout=60)[0]) for proc in procs]
    assert sorted(outcomes) == [False, False, True, True]
    assert all(head(workspaces / f"p{n}") == base for n, got in enumerate(outcomes) if got)
    assert pool2.ready(mirror) == 0


def test_fill_after_the_head_moved_discards_the_stale_ones(
    upstream: Upstream, mirror: Path, pool: WorkspacePool, workspaces: Path, tmp_path: Path
) -> None:
    old = resolve(mirror, "main")
    pool.fill(mirror, old)
    stale = set(os.listdir(pool.folder_for(mirror) / "ready"))
    third = upstream.commit({"new.txt": "new\n"}, "third")
    RepoCache(tmp_path / "mirrors", timeout=20).mirror(KEY, upstream.url, HEADER)
    new = resolve(mirror, "main")
    assert new == third != old

    pool.fill(mirror, new)
    assert pool.ready(mirror, old) == 0 and pool.ready(mirror, new) == pool.ready(mirror) == 2
    assert not set(os.listdir(pool.folder_for(mirror) / "ready")) & stale
    assert not pool.take(mirror, old, workspaces / "old")
    assert pool.take(mirror, new, workspaces / "new")
    assert (workspaces / "new" / "new.txt").read_text() == "new\n"
    assert (
        sorted(os.listdir(pool.folder_for(mirror) / "tmp"))
        == sorted(os.listdir(pool.folder_for(mirror) / "trash"))
        == []
    )


def test_fill_is_bounded_and_concurrent_fills_do_not_overfill(
    upstream: Upstream, mirror: Path, pool: WorkspacePool, workspaces: Path
) -> None:
    base = upstream.second
    errors: list[BaseException] = []

    def fill() -> None:
        try:
            WorkspacePool(workspaces, size=2).fill(mirror, base)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=fill) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert pool.ready(mirror) == 2 and len(os.listdir(pool.folder_for(mirror) / "ready")) == 2
    WorkspacePool(workspaces, size=1).fill(mirror, base)  # a smaller pool drops the extra one
    assert pool.ready(mirror) == 1
    WorkspacePool(workspaces, size=0).fill(mirror, base)
    assert pool.ready(mirror) == 0


def test_old_and_half_made_workspaces_are_never_taken(
    upstream: Upstream, mirror: Path, pool: WorkspacePool, workspaces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = upstream.second
    folder = pool.folder_for(mirror)
    # a filler that died midway left a workspace in tmp/: not takeable, and cleaned by the next fill
    (folder / "tmp").mkdir(parents=True)
    make_workspace(mirror, folder / "tmp" / "0123456789abcdef", base)
    assert not pool.take(mirror, base, workspaces / "a")

    pool.fill(mirror, base)
    assert os.listdir(folder / "tmp") == []
    assert pool.ready(mirror, base) == 2

    # an hour later they are too old: skipped by take, replaced by the next fill
    now = workspace_pool._now()
    monkeypatch.setattr(workspace_pool, "_now", lambda: now + 3601)
    before = set(os.listdir(folder / "ready"))
    assert pool.ready(mirror) == 0
    assert not pool.take(mirror, base, workspaces / "b")
    pool.fill(mirror, base)
    after = set(os.listdir(folder / "ready"))
    assert len(after) == 2 and not after & before
    # ... and a fill for another mirror deletes an expired one it finds, too
    monkeypatch.setattr(workspace_pool, "_now", lambda: now + 7300)
    other = mirror.parent / "copy.git"
    assert git("clone", "-q", "--bare", str(mirror), str(other)).returncode == 0
    pool.fill(other, base)
    assert os.listdir(folder / "ready") == [] and pool.ready(other) == 2


def test_prepare_falls_back_then_refills_in_the_background(
    upstream: Upstream, mirror: Path, pool: WorkspacePool, workspaces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = upstream.second
    made: list[Path] = []
    real_make = workspace_pool.make_workspace

    def counting_make(mirror: Path, dest: Path, commit: str, **kwargs: object) -> None:
        made.append(Path(dest))
        real_make(mirror, dest, commit, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(workspace_pool, "make_workspace", counting_make)

    first = workspaces / "job-1-run-1" / "attempt-1"
    pool.prepare(mirror, base, first)  # the pool is empty: made right here
    assert made[0] == first and head(first) == base
    assert pool.wait(timeout=60)
    assert pool.ready(mirror, base) == 2 and len(made) == 3  # the refill made two, elsewhere
    assert all(p.parent == pool.folder_for(mirror) / "tmp" for p in made[1:])

    ready_inodes = {
        os.stat(pool.folder_for(mirror) / "ready" / n).st_ino for n in os.listdir(pool.folder_for(mirror) / "ready")
    }
    second = workspaces / "job-2-run-1" / "attempt-1"
    pool.prepare(mirror, base, second)  # taken from the pool
    assert second.stat().st_ino in ready_inodes and head(second) == base
    assert git("status", "--porcelain", cwd=second).stdout == ""
    assert pool.wait(timeout=60)
    assert pool.ready(mirror, base) == 2 and len(made) == 4  # topped up by one

    # a refill that fails (the commit is not in the mirror) is logged, not raised, and ends
    pool.refill(mirror, "0" * 40)
    assert pool.wait(timeout=60)
    assert pool.ready(mirror, base) == 2


def test_refills_are_coalesced_one_thread_per_mirror(
    upstream: Upstream, mirror: Path, pool: WorkspacePool, workspaces: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, started = threading.Event(), threading.Event()
    calls: list[str] = []
    real_fill = WorkspacePool.fill

    def slow_fill(self: WorkspacePool, mirror: Path, commit: str) -> None:
        calls.append(commit)
        started.set()
        gate.wait(30)
        real_fill(self, mirror, commit)

    monkeypatch.setattr(WorkspacePool, "fill", slow_fill)
    pool.refill(mirror, upstream.first)
    assert started.wait(30)
    pool.refill(mirror, upstream.second)  # while the first runs: remembered
    pool.refill(mirror, upstream.second)
    assert not pool.wait(timeout=0.05)  # still running, held by the gate
    assert len([t for t in threading.enumerate() if t.name.startswith("frogfix-pool-refill-")]) == 1
    gate.set()
    assert pool.wait(timeout=60)
    assert calls == [upstream.first, upstream.second]  # the latest request, once
    assert pool.ready(mirror, upstream.second) == 2 and pool.ready(mirror, upstream.first) == 0
