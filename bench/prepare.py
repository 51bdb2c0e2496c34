#!/usr/bin/env python3
"""bench/prepare: preparing a job's workspace from a warm mirror vs a fresh full clone over HTTP.

Generates a repository (default 3,000 commits over a tree of 400 files, via git fast-import),
serves it with the real git smart-HTTP double (tests/doubles/git_http.py, Authorization header
required), and measures in the same run:
  - fresh: `git clone` of the whole repository over HTTP into a new folder (with checkout);
  - warm, made: what a job did before the pool, with worker/git/mirrors.py: RepoCache.mirror() (a
    `git fetch --prune` that finds nothing, or one new upstream commit with --churn) + resolve()
    + make_workspace();
  - warm, pooled: RepoCache.mirror() + resolve() + WorkspacePool.prepare(): a rename of a ready
    workspace out of the pool (or make_workspace when none is ready at that commit), and the
    start of the background refill. The refill after each job (what the previous job's
    prepare() started) is waited for OUTSIDE the timed region, as a real job, which runs for
    minutes, never waits for it; the pool is filled once before the first run the same way.
    Its cost is printed separately. With --churn every job has a new base commit, so the pool
    never has a match and the pooled path is the made path plus a miss.
Prints the medians, both ratios against the fresh clone (target >= 10x), and breakdowns.
Usage: python bench/prepare.py [--commits 3000] [--files 400] [--runs 15] [--clones 5] [--pool 3] [--churn]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from app.forge.api import basic_auth_header, git_auth_env  # noqa: E402
from tests.doubles.git_http import GitHttpDouble, git_env  # noqa: E402
from worker.git.gitcalls import mirror_key  # noqa: E402
from worker.git.mirrors import RepoCache, resolve  # noqa: E402
from worker.git.workspace_pool import WorkspacePool, make_workspace, remove_workspace  # noqa: E402

HEADER = basic_auth_header("oauth2", "bench-token-not-secret")
WORDS = [
    "frog",
    "pond",
    "lily",
    "leaf",
    "jump",
    "croak",
    "fly",
    "water",
    "reed",
    "mud",
    "tadpole",
    "swim",
    "green",
    "night",
    "song",
]


def source_text(rng: random.Random, lines: int) -> str:
    return "".join(
        f"def {rng.choice(WORDS)}_{i}(x):\n    return x * {rng.randint(1, 99)}  # {' '.join(rng.sample(WORDS, 4))}\n"
        for i in range(lines // 2)
    )


def fast_import_stream(commits: int, files: int, seed: int = 7) -> bytes:
    """A fast-import stream: one commit with the whole tree, then edits like real code churn.

    Each later commit rewrites a block of 5-40 lines in 1-5 files, and one in twenty adds a file,
    so the history grows the way a project's does rather than by one line a commit.
    """
    rng = random.Random(seed)
    dirs = [f"src/{a}/{b}" for a in WORDS[:8] for b in ("core", "util", "io")] + ["tests", "docs"]
    paths = [f"{rng.choice(dirs)}/{rng.choice(WORDS)}_{i}.py" for i in range(files)]
    contents = {path: source_text(rng, rng.randint(20, 120)) for path in paths}
    out: list[bytes] = []

    def data(text: str) -> None:
        raw = text.encode()
        out.append(f"data {len(raw)}\n".encode() + raw + b"\n")

    when = 1_600_000_000
    for n in range(commits):
        when += rng.randint(60, 7200)
        out.append(b"commit refs/heads/main\n")
        out.append(f"committer Bench <bench@example.invalid> {when} +0000\n".encode())
        data(f"change {n}\n")
        edit = n > 0
        if edit and rng.random() < 0.05:
            new = f"{rng.choice(dirs)}/{rng.choice(WORDS)}_{len(paths)}.py"
            paths.append(new)
            contents[new] = source_text(rng, rng.randint(20, 120))
            changed, edit = [new], False
        else:
            changed = rng.sample(paths, rng.randint(1, 5)) if edit else paths
        for path in changed:
            if edit:
                lines = contents[path].splitlines(keepends=True)
                at, size = rng.randrange(len(lines)), rng.randint(5, 40)
                lines[at : at + size] = source_text(rng, size).splitlines(keepends=True)
                contents[path] = "".join(lines)
            out.append(f"M 100644 inline {path}\n".encode())
            data(contents[path])
        out.append(b"\n")
    return b"".join(out)


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, stdin: bytes | None = None) -> None:
    done = subprocess.run(["git", *args], cwd=cwd, env=env or git_env(), input=stdin, capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"git {args[0]} failed: {done.stderr.decode(errors='replace')}")


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def churn(bare: Path, args: argparse.Namespace, n: int) -> None:
    """One new upstream commit on main (with --churn), so the next fetch has something to get."""
    if args.churn:
        stream = (
            b"commit refs/heads/main\ncommitter Bench <b@e.invalid> 1700000000 +0000\n"
            + f"data 7\nchurn{n:02d}\nfrom refs/heads/main^0\nM 100644 inline churn.txt\n".encode()
            + f"data 3\n{n % 100:02d}\n\n".encode()
        )
        run("fast-import", "--quiet", cwd=bare, stdin=stream)


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.1f} ms"


def measure(server_class: type[GitHttpDouble], served: Path, bare: Path, work: Path, args: argparse.Namespace) -> float:
    """Print fresh-clone and both warm-preparation medians for one server; return the pooled ratio."""
    with server_class(served, authorization=HEADER) as server:
        url = server.url_for("bench/repo.git")
        env = git_env(git_auth_env(HEADER, url=url))

        fresh = []
        for i in range(args.clones):
            dest = work / f"clone-{i}"
            fresh.append(timed(lambda dest=dest: run("clone", "-q", url, str(dest), env=env)))
            shutil.rmtree(dest)

        cache = RepoCache(work / "mirrors")
        key = mirror_key("gitea", "bench/repo")
        first_mirror = timed(lambda: cache.mirror(key, url, HEADER))
        workspaces = work / "workspaces"  # the pool lives in workspaces/.pool: same file system
        workspaces.mkdir()

        # warm, made: mirror update + make_workspace (no pool)
        update, workspace, warm = [], [], []
        for i in range(args.runs):
            churn(bare, args, i)
            dest = workspaces / f"job-m{i}" / "attempt-1"
            t0 = time.perf_counter()
            mirror = cache.mirror(key, url, HEADER)
            t1 = time.perf_counter()
            make_workspace(mirror, dest, resolve(mirror, "main"))
            t2 = time.perf_counter()
            update.append(t1 - t0)
            workspace.append(t2 - t1)
            warm.append(t2 - t0)
            remove_workspace(dest.parent)

        # warm, pooled: mirror update + WorkspacePool.prepare (take, else make; then start a refill)
        pool = WorkspacePool(workspaces, size=args.pool)
        mirror = cache.mirror(key, url, HEADER)
        first_fill = timed(lambda: pool.fill(mirror, resolve(mirror, "main")))  # untimed for the jobs
        p_update, p_take, pooled, refill = [], [], [], []
        hits = 0
        for i in range(args.runs):
            churn(bare, args, args.runs + i)
            refill.append(timed(pool.wait))  # the previous job's background refill: NOT in the job's time
            ready = {p.stat().st_ino for p in pool.folder_for(mirror).glob("ready/*")}
            dest = workspaces / f"job-p{i}" / "attempt-1"
            t0 = time.perf_counter()
            mirror = cache.mirror(key, url, HEADER)
            t1 = time.perf_counter()
            pool.prepare(mirror, resolve(mirror, "main"), dest)
            t2 = time.perf_counter()
            hits += dest.stat().st_ino in ready
            p_update.append(t1 - t0)
            p_take.append(t2 - t1)
            pooled.append(t2 - t0)
            remove_workspace(dest.parent)
        refill.append(timed(pool.wait))
        remove_workspace(workspaces)
        remove_workspace(work / "mirrors")

    fresh_s = statistics.median(fresh)
    made_ratio = fresh_s / statistics.median(warm)
    pooled_ratio = fresh_s / statistics.median(pooled)
    changes = "one new upstream commit each" if args.churn else "no upstream change"
    print("  (medians, except where marked once)")
    rows = [
        ("fresh full clone over HTTP", ms(fresh), f"{args.clones} runs"),
        ("first mirror (once)", f"{first_mirror * 1000:8.1f} ms", ""),
        ("warm, made: mirror + make_workspace", ms(warm), f"{args.runs} runs, {changes}"),
        ("  of which mirror update", ms(update), ""),
        ("  of which resolve + make_workspace", ms(workspace), ""),
        ("warm, pooled: mirror + pool", ms(pooled), f"{args.runs} runs, {changes}; {hits} taken from the pool"),
        ("  of which mirror update", ms(p_update), ""),
        ("  of which resolve + WorkspacePool.prepare", ms(p_take), "take (or make on a miss), start the refill"),
    ]
    for label, value, note in rows:
        print(f"  {label:42} {value}" + (f"  ({note})" if note else ""))
    print("  not counted in a job's time (a job never waits for them):")
    print(f"  {f'  first pool fill, {args.pool} workspaces (once)':42} {first_fill * 1000:8.1f} ms")
    print(f"  {'  background refill after each job':42} {ms(refill[1:])}  (waited for between jobs, untimed)")
    for name, ratio in (("made", made_ratio), ("pooled", pooled_ratio)):
        verdict = "met" if ratio >= 10 else "NOT met"
        print(f"  ratio fresh clone / warm, {name + ':':7} {ratio:5.1f}x  (target >= 10x: {verdict})")
    return pooled_ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--commits", type=int, default=3000)
    parser.add_argument("--files", type=int, default=400)
    parser.add_argument("--runs", type=int, default=15, help="warm workspace preparations")
    parser.add_argument("--clones", type=int, default=5, help="fresh clones over HTTP")
    parser.add_argument("--pool", type=int, default=3, help="ready workspaces kept per mirror")
    parser.add_argument("--churn", action="store_true", help="one new upstream commit before each warm run")
    parser.add_argument("--tmp", default=None, help="where clones, mirrors and workspaces go (default: $TMPDIR)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="frogfix-bench-prepare-", dir=args.tmp) as tmp:
        tmpdir = Path(tmp)
        served = tmpdir / "served"
        bare = served / "bench" / "repo.git"
        started = time.perf_counter()
        run("init", "-q", "--bare", str(bare))
        run("fast-import", "--quiet", cwd=bare, stdin=fast_import_stream(args.commits, args.files))
        run("symbolic-ref", "HEAD", "refs/heads/main", cwd=bare)
        run("gc", "-q", "--aggressive", cwd=bare)  # served like a forge would: one packed repo
        size = sum(p.stat().st_size for p in (bare / "objects").rglob("*") if p.is_file())
        print(f"folder: {tmpdir}")
        print(
            f"repository: {args.commits} commits, {args.files} files, {size / 1e6:.1f} MB packed "
            f"(generated in {time.perf_counter() - started:.1f}s)"
        )
        measure(GitHttpDouble, served, bare, tmpdir, args)


if __name__ == "__main__":
    main()
