"""What a merge did to the attested change, by git's stable patch id (which ignores line numbers and
whitespace, so the same change squashed, rebased or merged over a moved target has the same id): the
change between two commits, a commit's parents, and the commits a branch added on its first-parent line."""

from __future__ import annotations

from pathlib import Path

from worker.git.gitcalls import LOCAL_TIMEOUT, check_sha, git_dir_args, git_environment, run_git


def patch_id(repo: Path, diff: bytes) -> str | None:
    """git's stable patch id of a diff; None for a diff git finds no change in."""
    done = run_git([*git_dir_args(repo), "patch-id", "--stable"], env=git_environment(), what="git patch-id",
                   timeout=LOCAL_TIMEOUT, stdin=diff, check=False)  # fmt: skip
    words = done.stdout.decode("ascii", "replace").split()
    return words[0] if done.returncode == 0 and words else None


def change_between(repo: Path, old: str, new: str) -> bytes:
    """The diff from `old` to `new`, as bytes (binary files included)."""
    return run_git([*git_dir_args(repo), "diff", "--binary", "--no-color", "--no-ext-diff", check_sha(old),
                    check_sha(new)], env=git_environment(), what="git diff", timeout=LOCAL_TIMEOUT).stdout  # fmt: skip


def parents(repo: Path, commit: str) -> list[str]:
    done = run_git([*git_dir_args(repo), "rev-list", "--parents", "-n", "1", check_sha(commit)],
                   env=git_environment(), what="git rev-list", timeout=LOCAL_TIMEOUT)  # fmt: skip
    return done.stdout.decode("ascii").split()[1:]


def first_parent_commits(repo: Path, base: str, head: str) -> list[str]:
    """The commits `head`'s first-parent line adds to `base`, oldest first (a merge of the target into
    the branch is one of them; the target's own commits are not)."""
    span = f"{check_sha(base)}..{check_sha(head)}"
    done = run_git([*git_dir_args(repo), "rev-list", "--reverse", "--first-parent", span],
                   env=git_environment(), what="git rev-list", timeout=LOCAL_TIMEOUT)  # fmt: skip
    return done.stdout.decode("ascii").split()
