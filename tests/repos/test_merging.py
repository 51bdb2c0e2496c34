"""worker/git/merging.py on real repositories: git's merge of a moved target, the private conflicted commit,
and the rules a resolution must meet (no marker left, the fix's own change kept)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from worker.git import merging
from worker.git.gitcalls import RepoError

BASE = "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n"
FIXED = BASE.replace("a - b", "a + b")
RENAMED = BASE.replace("add(a, b)", "add(x, y)").replace("a - b", "x - y")
RESOLVED = RENAMED.replace("x - y", "x + y")


def run(repo: Path, *args: str, stdin: str | None = None) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(repo), "GIT_CONFIG_NOSYSTEM": "1"}
    for who in ("AUTHOR", "COMMITTER"):
        env.update({f"GIT_{who}_NAME": "T", f"GIT_{who}_EMAIL": "t@example.test"})
    done = subprocess.run(["git", "-C", str(repo), *args], input=stdin, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def commit(repo: Path, parent: str | None, files: dict[str, str], message: str) -> str:
    """A commit of `files` on `parent` (plumbing: no branch moves, no work tree)."""
    tree_entries = []
    current = {}
    if parent is not None:
        for line in run(repo, "ls-tree", "-r", parent).splitlines():
            meta, path = line.split("\t", 1)
            current[path] = meta.split()[2]
    for path, text in files.items():
        current[path] = run(repo, "hash-object", "-w", "--stdin", stdin=text)
    for path, blob in sorted(current.items()):
        tree_entries.append(f"100644 blob {blob}\t{path}")
    tree = run(repo, "mktree", stdin="\n".join(tree_entries) + "\n")
    return run(repo, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", message)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "repo.git"
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    return path


def history(repo: Path, target_files: dict[str, str]) -> tuple[str, str, str]:
    """(fork, the fix's head, the target's new head) with the target writing `target_files`."""
    fork = commit(repo, None, {"calc.py": BASE, "README": "calc\n"}, "base")
    head = commit(repo, fork, {"calc.py": FIXED}, "the fix")
    target = commit(repo, fork, target_files, "main moves on")
    return fork, head, target


def blob_text(repo: Path, treeish: str, path: str) -> str:
    return run(repo, "show", f"{treeish}:{path}") + "\n"


def test_a_clean_merge_keeps_both_sides(repo: Path) -> None:
    fork, head, target = history(repo, {"README": "calc, now documented\n"})
    merge = merging.merge_trees(repo, head, target)
    assert merge.clean and merge.conflicted == ()
    assert blob_text(repo, merge.tree, "calc.py") == FIXED
    assert blob_text(repo, merge.tree, "README") == "calc, now documented\n"
    made = merging.merge_commit(repo, merge, merge.tree, "Merge main", ("FrogFix", "frogfix@localhost"))
    assert run(repo, "rev-list", "--parents", "-n", "1", made).split()[1:] == [head, target]
    assert not merging.is_ancestor(repo, target, head) and merging.is_ancestor(repo, target, made)
    assert merging.Resolution(merge, fork, "main").refusals(repo, merge.tree) == []


def test_a_conflict_names_its_files_and_leaves_markers(repo: Path) -> None:
    fork, head, target = history(repo, {"calc.py": RENAMED})
    merge = merging.merge_trees(repo, head, target)
    assert merge.conflicted == ("calc.py",)
    text = blob_text(repo, merge.tree, "calc.py")
    assert f"<<<<<<< {head}" in text and f">>>>>>> {target}" in text and merging.has_markers(text.encode())
    start = merging.conflicted_commit(repo, merge)
    assert run(repo, "rev-list", "--parents", "-n", "1", start).split()[1:] == [head]  # private: one parent
    assert merging.conflicted_commit(repo, merge) == start  # the same merge makes the same commit
    rules = merging.Resolution(merge, fork, "main")
    assert rules.refusals(repo, merge.tree) == ["conflict markers are left in calc.py"]


def test_a_resolution_is_judged_and_told(repo: Path) -> None:
    fork, head, target = history(repo, {"calc.py": RENAMED})
    merge = merging.merge_trees(repo, head, target)
    rules = merging.Resolution(merge, fork, "main")
    good = run(repo, "rev-parse", f"{commit(repo, target, {'calc.py': RESOLVED}, 'resolved')}^{{tree}}")
    assert rules.refusals(repo, good) == []
    [(path, said)] = rules.summaries(repo, good)
    assert path == "calc.py" and said == "combined both sides (+1 -1 lines against main)"
    theirs = merging.tree_of(repo, target)  # main's side taken whole: the fix is gone
    assert rules.refusals(repo, theirs) == [
        "the resolution drops the fix's own change to calc.py (it is main's version again)"
    ]
    assert rules.summaries(repo, theirs) == [("calc.py", "took main's version")]
    ours = merging.tree_of(repo, head)
    assert rules.summaries(repo, ours) == [("calc.py", "kept the merge request's version")]


def test_the_whole_change_on_the_new_target_applies_there(repo: Path, tmp_path: Path) -> None:
    fork, head, target = history(repo, {"README": "moved\n"})
    merge = merging.merge_trees(repo, head, target)
    patch = merging.full_patch(repo, target, merge.tree)
    assert "+    return a + b" in patch and "README" not in patch
    assert merging.changed_paths(repo, target, merge.tree) == ["calc.py"]
    log = merging.target_log(repo, fork, target, ["README"])
    assert "main moves on" in log and "+moved" in log
    assert merging.target_log(repo, fork, target, []) == ""


def test_markers_need_an_opening_and_a_closing_line() -> None:
    assert merging.has_markers(b"a\n<<<<<<< ours\nx\n=======\ny\n>>>>>>> theirs\n")
    assert not merging.has_markers(b"Title\n=======\n\ntext\n")  # an RST heading is no conflict
    assert not merging.has_markers(b"x <<<<<<< y >>>>>>> z\n")  # not at the start of a line
    assert not merging.has_markers(b">>>>>>> closing first\n<<<<<<< then opening\n")


def test_a_lost_conflicted_start_is_made_again(repo: Path, tmp_path: Path) -> None:
    _, head, target = history(repo, {"calc.py": RENAMED})
    start = merging.conflicted_commit(repo, merging.merge_trees(repo, head, target))
    other = tmp_path / "fresh.git"
    subprocess.run(["git", "init", "-q", "--bare", str(other)], check=True)  # a fresh mirror: fetched refs only
    for ref, sha in (("refs/heads/h", head), ("refs/heads/t", target)):
        run(repo, "update-ref", ref, sha)
    subprocess.run(["git", "-C", str(other), "fetch", "-q", str(repo), "refs/heads/*:refs/heads/*"], check=True)
    assert subprocess.run(["git", "-C", str(other), "cat-file", "-e", f"{start}^{{commit}}"]).returncode != 0
    assert merging.ensure_conflicted_commit(other, head, target, start)
    assert merging.ensure_conflicted_commit(other, head, target, start)  # there now
    assert not merging.ensure_conflicted_commit(other, head, target, "0" * 40)  # another commit is not made up


def test_bad_input_is_refused_before_git_runs(repo: Path) -> None:
    with pytest.raises(RepoError):
        merging.merge_trees(repo, "--upload-pack=evil", "0" * 40)
    with pytest.raises(RepoError):
        merging.is_ancestor(repo, "HEAD", "0" * 40)
