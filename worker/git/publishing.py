"""Publishing: the fix commit built in the mirror and its push to FrogFix's own branch.

The fix commit is built in the mirror with a private index (`git apply --cached`), never in a
work tree, and pushed from the mirror to `refs/heads/frogfix/...` only: force on that one ref by
default (the branch is ours and a new attempt replaces the old), or `--force-with-lease` when the
caller passes what it last pushed, and only a fast-forward for a round.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from app.forge.api import git_auth_env

# ---------------------------------------------------------------------------------------------
# The fix commit and its push
# ---------------------------------------------------------------------------------------------
from worker.git.gitcalls import (
    LOCAL_TIMEOUT,
    NETWORK_TIMEOUT,
    RepoBranchMoved,
    RepoError,
    check_branch,
    check_sha,
    check_url,
    classify_failure,
    error_summary,
    git_dir_args,
    git_environment,
    has_commit,
    is_ancestor,
    reading_lock,
    run_git,
    secret_forms,
)


def _check_person(who: tuple[str, str], role: str) -> tuple[str, str]:
    name, email = who
    for part in (name, email):
        if not part or any(ord(ch) < 32 or ch in "<>" for ch in part):
            raise RepoError(f"bad {role} identity: {who!r}")
    return name, email


def commit_patch(
    mirror: Path,
    base: str,
    patch: str | bytes,
    message: str,
    author: tuple[str, str],
    scratch: Path,
    *,
    committer: tuple[str, str] | None = None,
    timeout: float = LOCAL_TIMEOUT,
    expect_tree: str | None = None,
) -> str:
    """Commit `patch` on top of `base` and return the new commit id.

    With `expect_tree` (the tree the review judged, worker/attempts/stored_patch.py) any other result is
    refused, so what is pushed is exactly what was judged and tested.

    The patch is applied with `git apply --cached --binary` to a private index under
    `scratch` (read from `base`), never to a work tree: binary files, modes and symlinks are
    kept, paths outside the tree or inside `.git` are refused by git apply, and nothing on
    disk outside the index can be touched. The commit (a single parent, never a merge) is
    written straight into `mirror`, so `push_branch(mirror, ...)` can push it; it is
    unreferenced there until the next fetch brings our pushed branch back.
    """
    check_sha(base)
    author = _check_person(author, "author")
    committer = _check_person(committer or author, "committer")
    data = patch.encode("utf-8", "surrogateescape") if isinstance(patch, str) else bytes(patch)
    if not data.strip():
        raise RepoError("the patch is empty")
    scratch = Path(scratch)
    scratch.mkdir(parents=True, exist_ok=True)
    index = scratch / "frogfix-commit.index"
    env = git_environment()
    env.update(
        GIT_INDEX_FILE=str(index),
        GIT_AUTHOR_NAME=author[0],
        GIT_AUTHOR_EMAIL=author[1],
        GIT_COMMITTER_NAME=committer[0],
        GIT_COMMITTER_EMAIL=committer[1],
    )
    repo = git_dir_args(Path(mirror))
    try:
        with reading_lock(Path(mirror)):
            tree = _patched_tree(repo, env, base, data, timeout, expect_tree)
            text = message.strip() + "\n"
            done = run_git(
                [*repo, "commit-tree", tree, "-p", base, "-F", "-"],
                env=env,
                what="git commit-tree",
                timeout=timeout,
                stdin=text.encode("utf-8"),
            )
    finally:
        index.unlink(missing_ok=True)
    return done.stdout.decode().strip()


def _patched_tree(
    repo: list[str], env: dict[str, str], base: str, data: bytes, timeout: float, expect_tree: str | None
) -> str:
    """The tree `data` makes of `base`'s, applied in the private index `env` names; RepoError when it
    changes nothing or is not `expect_tree`."""
    run_git([*repo, "read-tree", base], env=env, what="git read-tree", timeout=timeout)
    base_tree = run_git([*repo, "rev-parse", f"{base}^{{tree}}"], env=env, what="git rev-parse", timeout=timeout)
    run_git(
        [*repo, "apply", "--cached", "--binary", "--whitespace=nowarn", "-"],
        env=env,
        what="applying the patch",
        timeout=timeout,
        stdin=data,
    )
    tree = run_git([*repo, "write-tree"], env=env, what="git write-tree", timeout=timeout).stdout.strip()
    if tree == base_tree.stdout.strip():
        raise RepoError("the patch changes nothing")
    if expect_tree is not None and tree.decode() != expect_tree:
        raise RepoError(f"the patch made tree {tree.decode()[:12]}, not the reviewed {expect_tree[:12]}")
    return tree.decode()


PUSH_OPTION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(?:=[\x20-\x7e]*)?")  # ci.skip, ci.variable=K=V


def push_branch(
    source_repo: Path,
    clone_url: str,
    auth_header: str | None,
    branch: str,
    commit: str,
    *,
    expect_old: str | None = None,
    push_options: Sequence[str] = (),
    fast_forward: bool = False,
    timeout: float = NETWORK_TIMEOUT,
) -> None:
    """Push `commit` to `refs/heads/<branch>` and to nothing else; `branch` must be `frogfix/...`.

    Force policy: the branch is ours, and a new attempt for the same issue replaces the old
    one, so by default that one ref is force-updated (`+<sha>:refs/heads/<branch>`; no other
    ref, no tags, no merge). A caller that recorded what it last pushed can pass `expect_old`
    (a sha, or "" for "must not exist yet") to get `--force-with-lease` instead: then a commit
    someone else added to our branch is never overwritten (RepoBranchMoved "stale info").
    With `fast_forward` (a review round, which builds on the branch's head) nothing is ever forced:
    the refspec has no `+`, and `expect_old` must be an ancestor of `commit` (checked here), so the
    lease can only let a fast-forward from it through; a branch that moved meanwhile is
    RepoBranchMoved, never overwritten.
    `push_options` go to the server as `git push -o` (GitLab's `ci.skip`); a server that does not
    advertise push options refuses the push.
    All validation happens before any network call.
    """
    check_branch(branch)
    check_sha(commit)
    check_url(clone_url)
    for option in push_options:
        if not PUSH_OPTION.fullmatch(option):
            raise RepoError(f"invalid push option {option!r}")
    if expect_old not in (None, ""):
        check_sha(str(expect_old))
    source = Path(source_repo)
    with reading_lock(source):
        if not has_commit(source, commit):
            raise RepoError(f"commit {commit[:12]} is not in {source.name}")
        if fast_forward and expect_old and not is_ancestor(source, str(expect_old), commit):
            raise RepoBranchMoved(
                f"{commit[:12]} does not build on {str(expect_old)[:12]}: FrogFix pushes only fast-forwards here"
            )
        args = _push_args(clone_url, branch, commit, expect_old, push_options, fast_forward)
        env = git_environment()
        if auth_header:
            env = git_auth_env(auth_header, url=clone_url, base_env=env)
        done = run_git([*git_dir_args(source), *args], env=env, what="git push", timeout=timeout, check=False)
    if done.returncode != 0:
        output = done.stdout.decode("utf-8", "replace") + "\n" + done.stderr.decode("utf-8", "replace")
        raise _push_refused(branch, output, secret_forms(auth_header))


def _push_args(
    clone_url: str,
    branch: str,
    commit: str,
    expect_old: str | None,
    push_options: Sequence[str],
    fast_forward: bool,
) -> list[str]:
    """`git push`'s arguments: the one refspec to `refs/heads/<branch>`, forced (`+`) only when neither a
    lease nor a fast-forward is asked for."""
    ref = f"refs/heads/{branch}"
    args = ["push", "--porcelain", "--no-verify", *[arg for option in push_options for arg in ("-o", option)]]
    if expect_old is not None:
        args.append(f"--force-with-lease={ref}:{expect_old}")
    plus = "" if fast_forward or expect_old is not None else "+"
    return [*args, "--", clone_url, f"{plus}{commit}:{ref}"]


def _push_refused(branch: str, output: str, secrets: Sequence[str]) -> RepoError:
    """The error for a failed push: RepoBranchMoved for a lease or fast-forward refusal, RepoError for the
    server's refusal, else what `classify_failure` makes of it (network, auth, ...)."""
    if "stale info" in output or "[rejected]" in output:  # a lease or fast-forward refusal
        why = error_summary(output, secrets)
        return RepoBranchMoved(f"git push to {branch} was rejected (the branch moved): {why}")
    if "[remote rejected]" in output:
        return RepoError(f"git push to {branch} was rejected: {error_summary(output, secrets)}")
    return classify_failure(f"git push to {branch}", output, secrets)
