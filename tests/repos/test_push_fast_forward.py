"""A review round's push: fast-forward only, over real git smart HTTP (tests/doubles/git_http.py).

A round commits on the branch's head and must never overwrite a commit someone else pushed
meanwhile: `push_branch(..., fast_forward=True, expect_old=start)` is refused with
RepoBranchMoved instead, and the branch keeps the other commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doubles.git_http import git, git_env
from tests.repos.conftest import HEADER, TOKEN, Upstream
from worker.git import gitcalls
from worker.git.gitcalls import RepoBranchMoved, RepoError
from worker.git.mirrors import RepoCache, diff_text, merge_base, resolve
from worker.git.publishing import commit_patch, push_branch

KEY = gitcalls.mirror_key("gitlab", "acme/widgets")
BOT = ("FrogFix", "frogfix@localhost")
BRANCH = "frogfix/issue-7"


@pytest.fixture
def cache(tmp_path: Path) -> RepoCache:
    return RepoCache(tmp_path / "mirrors")


def patch_of(mirror: Path, base: str, path: str, old: str, new: str) -> str:
    """A one-line change of `path` at `base`, as git writes it (what a sandbox hands back)."""
    text = git("--git-dir", str(mirror), "show", f"{base}:{path}").stdout
    assert old in text
    changed = text.replace(old, new)
    lines_old, lines_new = text.splitlines(keepends=True), changed.splitlines(keepends=True)
    body = "".join(f"-{line}" for line in lines_old) + "".join(f"+{line}" for line in lines_new)
    return (
        f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n"
        f"@@ -1,{len(lines_old)} +1,{len(lines_new)} @@\n{body}"
    )


def human_push(upstream: Upstream, parent: str, message: str) -> str:
    """A commit someone else pushed to our branch (straight into the served repository)."""
    bare = str(upstream.bare)
    person = {"GIT_AUTHOR_NAME": "Rev", "GIT_AUTHOR_EMAIL": "rev@example.com"}
    person |= {"GIT_COMMITTER_NAME": "Rev", "GIT_COMMITTER_EMAIL": "rev@example.com"}
    done = git("--git-dir", bare, "commit-tree", f"{parent}^{{tree}}", "-p", parent, "-m", message, env=git_env(person))
    assert done.returncode == 0, done.stderr
    sha = done.stdout.strip()
    assert git("--git-dir", bare, "update-ref", f"refs/heads/{BRANCH}", sha).returncode == 0
    return sha


def test_a_round_pushes_a_fast_forward_and_never_overwrites_a_moved_branch(
    upstream: Upstream, cache: RepoCache, tmp_path: Path
) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    main = resolve(mirror, "main")
    first = commit_patch(
        mirror, main, patch_of(mirror, main, "app/calc.py", "a + b - 0", "a + b"), "Fix add()", BOT, tmp_path / "s"
    )
    push_branch(mirror, upstream.url, HEADER, BRANCH, first)  # round 0: our branch, force allowed

    # round 1 starts from the branch head, its base is where the branch left main
    cache.mirror(KEY, upstream.url, HEADER)
    start = resolve(mirror, BRANCH)
    assert start == first and merge_base(mirror, start, main) == main
    shown = diff_text(mirror, main, start)
    assert "-    return a + b - 0" in shown and "+    return a + b" in shown
    assert diff_text(mirror, main, start, limit=20).endswith("more characters]")

    second = commit_patch(
        mirror, start, patch_of(mirror, start, "README.md", "hello", "hello, round 1"), "Round 1", BOT, tmp_path / "s"
    )
    push_branch(mirror, upstream.url, HEADER, BRANCH, second, expect_old=start, fast_forward=True)
    assert upstream.rev(f"refs/heads/{BRANCH}") == second
    ((old, new, ref),) = upstream.server.pushes[-1].updates
    assert (old, new, ref) == (start, second, f"refs/heads/{BRANCH}")
    assert git("--git-dir", str(upstream.bare), "rev-parse", f"{second}^@").stdout.split() == [start]

    # a human pushed on top while round 2 ran on `second`: round 2's push is refused, theirs stays
    theirs = human_push(upstream, second, "reviewer's own tweak")
    stale = commit_patch(
        mirror, second, patch_of(mirror, second, "README.md", "round 1", "round 2"), "Round 2", BOT, tmp_path / "s"
    )
    pushes = len(upstream.server.pushes)
    with pytest.raises(RepoBranchMoved, match="rejected") as caught:
        push_branch(mirror, upstream.url, HEADER, BRANCH, stale, expect_old=second, fast_forward=True)
    assert TOKEN not in str(caught.value) and isinstance(caught.value, RepoError)
    assert upstream.rev(f"refs/heads/{BRANCH}") == theirs
    # without a lease too: git refuses the non-fast-forward itself
    with pytest.raises(RepoBranchMoved):
        push_branch(mirror, upstream.url, HEADER, BRANCH, stale, fast_forward=True)
    assert upstream.rev(f"refs/heads/{BRANCH}") == theirs
    assert all(p.updates == [] or p.status != 200 for p in upstream.server.pushes[pushes:])

    # the next round builds on their head and goes through
    cache.mirror(KEY, upstream.url, HEADER)
    assert resolve(mirror, BRANCH) == theirs
    on_theirs = commit_patch(
        mirror, theirs, patch_of(mirror, theirs, "README.md", "round 1", "round 2"), "Round 2", BOT, tmp_path / "s"
    )
    push_branch(mirror, upstream.url, HEADER, BRANCH, on_theirs, expect_old=theirs, fast_forward=True)
    assert upstream.rev(f"refs/heads/{BRANCH}") == on_theirs


def test_a_commit_that_does_not_build_on_the_expected_head_is_refused_before_the_network(
    upstream: Upstream, cache: RepoCache, tmp_path: Path
) -> None:
    mirror = cache.mirror(KEY, upstream.url, HEADER)
    main = resolve(mirror, "main")
    first = upstream.first
    change = patch_of(mirror, first, "README.md", "hello", "aside")
    aside = commit_patch(mirror, first, change, "x", BOT, tmp_path / "s")
    requests = len(upstream.server.requests)
    with pytest.raises(RepoBranchMoved, match="fast-forward"):
        push_branch(mirror, upstream.url, HEADER, BRANCH, aside, expect_old=main, fast_forward=True)
    assert len(upstream.server.requests) == requests and not upstream.server.pushes
    with pytest.raises(RepoError, match="no common ancestor"):
        merge_base(mirror, main, "0" * 40)
