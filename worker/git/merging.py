"""git's side of an update round (issue 25): the MR's target branch merged into FrogFix's branch.

FrogFix never rebases and never force-pushes a branch a reviewer has seen: an update round adds
one merge commit (first parent the branch's head, second the target's head) on top. Everything
here is plumbing on the mirror, never on a work tree: `git merge-tree --write-tree` (git 2.38 or
later) merges two commits into a tree, with conflict markers in the files it could not merge, and
`git commit-tree` makes commits of trees. Nothing here touches the network.

When git merges cleanly, the merge commit is made at once. When it conflicts, the conflicted tree
becomes a private commit on the branch's head (never pushed: the agent's checkout starts there),
and once the agent resolved it, `merge_commit` makes the real merge of the resolved tree. The
rules a resolution must meet (`Resolution.refusals`) and its one-line account per file
(`Resolution.summaries`) live here too, so the attempt's judge and the reply say the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from worker.git import gitcalls
from worker.git.gitcalls import (
    LOCAL_TIMEOUT,
    RepoError,
    check_sha,
    git_dir_args,
    git_environment,
    reading_lock,
    run_git,
)

# A line git writes around a conflict: `<<<<<<< ours`, `=======`, `>>>>>>> theirs` (and `|||||||` for diff3).
_OPENING = re.compile(rb"^<{7,}(?: |$)", re.M)  # 7 unless `conflict-marker-size` says more
_CLOSING = re.compile(rb"^>{7,}(?: |$)", re.M)
# git reads no attributes here: a repository's `.gitattributes` could otherwise pick a merge driver
# (`merge=union` drops the markers), the marker size, or a text conversion. `attr.tree` (git 2.42+;
# older gits read none in a bare repository) and GIT_ATTR_SOURCE (2.40+) point them at the empty tree.
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
_NO_ATTRIBUTES = ["-c", f"attr.tree={EMPTY_TREE}"]
MAX_MARKER_READ = 8 * 1024 * 1024  # a conflicted file bigger than this is read only this far for markers
# Who makes the private conflicted commit: fixed, with its date, so the same merge always makes the same commit.
CONFLICT_AUTHOR = ("FrogFix", "frogfix@localhost")


def _environment() -> dict[str, str]:
    return {**git_environment(), "GIT_ATTR_SOURCE": EMPTY_TREE}


def _git(repo: Path, args: list[str], what: str, *, check: bool = True, stdin: bytes | None = None,
         env: dict[str, str] | None = None) -> bytes:
    done = run_git(
        [*_NO_ATTRIBUTES, *git_dir_args(repo), *args], env=env or _environment(), what=what, timeout=LOCAL_TIMEOUT,
        check=check, stdin=stdin, max_memory=1024**3,
    )
    return done.stdout


@dataclass(frozen=True)
class Merge:
    """The target's head merged into the branch's head, as git left it."""

    head: str  # the MR branch's head: the merge's first parent
    target: str  # the target branch's head: its second parent
    tree: str  # git's merged tree; the conflicted files hold conflict markers
    conflicted: tuple[str, ...]  # the paths git could not merge (empty: a clean merge)

    @property
    def clean(self) -> bool:
        return not self.conflicted


def is_ancestor(repo: Path, ancestor: str, commit: str) -> bool:
    """Whether `commit` already contains `ancestor` (then there is nothing to merge), read under the mirror's lock."""
    with reading_lock(repo):
        return gitcalls.is_ancestor(repo, ancestor, commit)


def merge_trees(repo: Path, head: str, target: str) -> Merge:
    """`target` merged into `head` as a tree, with the paths that conflicted (markers labelled with the shas)."""
    check_sha(head)
    check_sha(target)
    with reading_lock(repo):
        done = run_git(
            [*_NO_ATTRIBUTES, *git_dir_args(repo), "merge-tree", "--write-tree", "-z", "--name-only", "--no-messages",
             head, target],
            env=_environment(), what="git merge-tree", timeout=LOCAL_TIMEOUT, check=False, max_memory=1024**3,
        )  # fmt: skip
    if done.returncode not in (0, 1):
        raise RepoError(
            f"git merge-tree failed (git 2.38 or later is needed): {done.stderr.decode('utf-8', 'replace')[:300]}"
        )
    fields = [f.decode("utf-8", "surrogateescape") for f in done.stdout.split(b"\0") if f]
    if not fields:
        raise RepoError("git merge-tree wrote no tree")
    tree, paths = fields[0], list(dict.fromkeys(fields[1:]))
    if done.returncode == 1 and not paths:
        raise RepoError("git merge-tree reported conflicts without naming a file")
    return Merge(head, target, tree, tuple(paths) if done.returncode == 1 else ())


def _commit_env(author: tuple[str, str], date: str | None) -> dict[str, str]:
    env = _environment()
    env.update(GIT_AUTHOR_NAME=author[0], GIT_AUTHOR_EMAIL=author[1])
    env.update(GIT_COMMITTER_NAME=author[0], GIT_COMMITTER_EMAIL=author[1])
    if date is not None:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return env


def _commit_tree(repo: Path, tree: str, parents: list[str], message: str, author: tuple[str, str],
                 date: str | None = None) -> str:
    args = ["commit-tree", tree]
    for parent in parents:
        args += ["-p", check_sha(parent)]
    with reading_lock(repo):
        out = _git(repo, [*args, "-F", "-"], "git commit-tree", stdin=(message.strip() + "\n").encode(),
                   env=_commit_env(author, date))
    return out.decode().strip()


def conflicted_commit(repo: Path, merge: Merge) -> str:
    """The conflicted tree as a private commit on the branch's head: where the agent's checkout starts.

    Never pushed. Its date is the target's, so the same merge always makes the same commit, and a
    replay that no longer finds it in the mirror makes it again (`ensure_conflicted_commit`)."""
    date = _git(repo, ["show", "-s", "--format=%ct", check_sha(merge.target)], "git show").decode().strip()
    message = (
        f"FrogFix: {merge.target[:12]} merged into {merge.head[:12]} with conflicts in {len(merge.conflicted)} file(s)"
        "\n\nNever pushed: the agent resolves the conflict markers from here."
    )
    return _commit_tree(repo, merge.tree, [merge.head], message, CONFLICT_AUTHOR, f"@{date} +0000")


def ensure_conflicted_commit(repo: Path, head: str, target: str, expected: str) -> bool:
    """Whether `expected` (an update round's conflicted start) is in `repo`, made again from its merge if not."""
    if gitcalls.has_commit(repo, expected):
        return True
    if not (gitcalls.has_commit(repo, head) and gitcalls.has_commit(repo, target)):
        return False
    merge = merge_trees(repo, head, target)
    return not merge.clean and conflicted_commit(repo, merge) == expected


def merge_commit(repo: Path, merge: Merge, tree: str, message: str, author: tuple[str, str]) -> str:
    """The merge FrogFix pushes: `tree` (git's, or the agent's resolution) with the branch's head as first
    parent and the target's head as second, so every commit on the branch, a human's included, is kept."""
    return _commit_tree(repo, tree, [merge.head, merge.target], message, author)


def tree_of(repo: Path, commit: str) -> str:
    return _git(repo, ["rev-parse", f"{check_sha(commit)}^{{tree}}"], "git rev-parse").decode().strip()


def _blob(repo: Path, treeish: str, path: str) -> str | None:
    """The object id of `path` in `treeish`; None when it has no such file."""
    done = run_git(
        [*git_dir_args(repo), "rev-parse", "--verify", "--quiet", f"{treeish}:{path}"], env=git_environment(),
        what="git rev-parse", timeout=LOCAL_TIMEOUT, check=False,
    )
    found = done.stdout.decode().strip()
    return found if done.returncode == 0 and found else None


def has_markers(text: bytes) -> bool:
    """Whether `text` still holds a conflict git marked: an opening `<<<<<<<` line and a closing `>>>>>>>` after it."""
    opening = _OPENING.search(text)
    return opening is not None and _CLOSING.search(text, opening.end()) is not None


def changed_paths(repo: Path, old: str, new: str) -> list[str]:
    """The paths that differ between two commits or trees (renames as a deletion and an addition)."""
    out = _git(repo, ["diff", "--no-renames", "--name-only", "-z", old, new, "--"], "git diff --name-only")
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def full_patch(repo: Path, base: str, tree: str) -> str:
    """`git diff --binary` from `base` to `tree`: the whole change a merged branch makes on its new target."""
    out = _git(repo, ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "--binary", "--full-index",
                      "--no-renames", base, tree, "--"], "git diff")
    return out.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Resolution:
    """What an agent's resolution of a conflicted merge must keep, and how to say what it did.

    `fork` is where the branch left the target (their merge base), so `fork..head` is the fix's
    own change: a resolution that makes a file the fix changed identical to the target's again
    drops the fix there."""

    merge: Merge
    fork: str
    target_branch: str

    def refusals(self, repo: Path, tree: str) -> list[str]:
        """Why the resolved `tree` may not be pushed: conflict markers left, a file that did not conflict
        changed (a resolution resolves; more is a review round's), or the fix's own change dropped."""
        reasons = []
        left = [p for p in self.merge.conflicted if self._marked(repo, tree, p)]
        if left:
            reasons.append(f"conflict markers are left in {', '.join(left[:10])}")
        outside = sorted(set(changed_paths(repo, self.merge.tree, tree)) - set(self.merge.conflicted))
        if outside:
            reasons.append(
                f"the resolution changes files that did not conflict: {', '.join(outside[:10])}"
                + (f" and {len(outside) - 10} more" if len(outside) > 10 else "")
            )
        dropped = self.dropped(repo, tree)
        if dropped:
            reasons.append(
                f"the resolution drops the fix's own change to {', '.join(dropped[:10])} (it is {self.target_branch}'s"
                " version again)"
            )
        return reasons

    def _marked(self, repo: Path, tree: str, path: str) -> bool:
        blob = _blob(repo, tree, path)
        if blob is None:
            return False
        done = run_git(
            [*git_dir_args(repo), "cat-file", "blob", blob], env=git_environment(), what="git cat-file",
            timeout=LOCAL_TIMEOUT, max_memory=1024**3,
        )
        return has_markers(done.stdout[:MAX_MARKER_READ])

    def dropped(self, repo: Path, tree: str) -> list[str]:
        """The files the fix changed (and the target does not hold as the fix has them) that `tree` gives
        back exactly as the target has them."""
        head, target = self.merge.head, self.merge.target
        dropped = []
        for path in changed_paths(repo, self.fork, head):
            mine, theirs = _blob(repo, head, path), _blob(repo, target, path)
            if mine != theirs and _blob(repo, tree, path) == theirs:
                dropped.append(path)
        return dropped

    def summaries(self, repo: Path, tree: str) -> list[tuple[str, str]]:
        """Each conflicted file and a one-line account of how `tree` resolved it."""
        head, target = self.merge.head, self.merge.target
        lines = []
        for path in self.merge.conflicted:
            resolved = _blob(repo, tree, path)
            if resolved is None:
                said = "deleted"
            elif resolved == _blob(repo, head, path):
                said = "kept the merge request's version"
            elif resolved == _blob(repo, target, path):
                said = f"took {self.target_branch}'s version"
            else:
                said = "combined both sides" + _numstat(repo, target, tree, path, self.target_branch)
            lines.append((path, said))
        return lines


def _numstat(repo: Path, old: str, new: str, path: str, old_name: str) -> str:
    out = _git(repo, ["diff", "--numstat", "--no-renames", old, new, "--", path], "git diff --numstat").decode()
    parts = out.split("\t")
    if len(parts) >= 2 and parts[0].isdigit() and parts[1].isdigit():
        return f" (+{parts[0]} -{parts[1]} lines against {old_name})"
    return ""


def target_log(repo: Path, fork: str, target: str, paths: list[str], limit: int = 30_000) -> str:
    """The target's commits since `fork` that touch `paths`, newest first, each with its diff of those paths
    (what the agent needs to know what the other side meant); bounded to about `limit` characters."""
    if not paths:
        return ""
    args = ["log", "-p", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--max-count=50",
            "--format=commit %H%nAuthor: %an%nDate: %cI%n%n    %s%n", f"{check_sha(fork)}..{check_sha(target)}",
            "--", *paths]  # fmt: skip
    text = _git(repo, args, "git log").decode("utf-8", "replace")
    if len(text) > limit:
        text = text[:limit] + f"\n[log cut: {len(text) - limit} more characters]"
    return text
