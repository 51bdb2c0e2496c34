"""The evidence's cost does not grow with the patch's files (issue 23, finding 3).

A patch of 4,000 symlinks cost 37 s of worker CPU in `take_evidence`: two `git cat-file` per link.
Link targets are read in one batch now, so the number of git processes is the same for three links
as for three thousand, and a patch of more than 5,000 files is refused before anything per file.
Counted, not timed: a count does not depend on the machine.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox.base import SandboxLimits
from tests.doubles.git_http import git, make_worktree
from tests.review.worker_side import staged_patch
from worker.attempts.stored_patch import MAX_PATCH_FILES, EvidenceLimits, PatchEvidence, PatchRefused, take_evidence

ODD_TARGETS = {"odd/cr": "d\r/../calc.py", "odd/newline": "a\nb", "odd/space": " calc.py "}


def counted(monkeypatch: pytest.MonkeyPatch, repo: Path) -> tuple[PatchEvidence, int]:
    """The evidence of the staged changes, and how many git processes taking it started."""
    patch, base = staged_patch(repo), git("rev-parse", "HEAD", cwd=repo).stdout.strip()
    started: list[list[str]] = []

    class Counting(subprocess.Popen[bytes]):
        def __init__(self, args: Any, *rest: Any, **options: Any) -> None:
            started.append([str(a) for a in args])
            super().__init__(args, *rest, **options)

    with monkeypatch.context() as patched:
        patched.setattr(subprocess, "Popen", Counting)
        changes = take_evidence(repo, base, patch, repo.parent / "scratch", limits=EvidenceLimits())
    return changes, sum("git" in argv for argv in started)


def linked_repo(root: Path, links: int) -> Path:
    repo = make_worktree(root, {"calc.py": "x = 1\n", "kept": "k\n"})
    os.symlink("calc.py", repo / "base-link")
    assert git("add", "-A", cwd=repo).returncode == 0 and git("commit", "-qm", "link", cwd=repo).returncode == 0
    (repo / "links").mkdir()
    for n in range(links):
        os.symlink(f"../calc.py{'/' * (n % 3)}", repo / "links" / f"l{n}")
    (repo / "odd").mkdir()
    for path, target in ODD_TARGETS.items():
        os.symlink(target, repo / path)
    return repo


def test_thousands_of_symlinks_cost_the_same_git_processes_as_three(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    few, few_processes = counted(monkeypatch, linked_repo(tmp_path / "few", 3))
    many, many_processes = counted(monkeypatch, linked_repo(tmp_path / "many", 3000))
    assert len(many.files) == 3003 and len(few.files) == 6
    assert many_processes == few_processes <= 20, (few_processes, many_processes)  # was two per link
    targets = {f.path: f.link_target for f in many.files}
    assert targets["links/l0"] == "../calc.py" and targets["links/l2998"] == "../calc.py/"
    assert {path: targets[path] for path in ODD_TARGETS} == ODD_TARGETS  # every byte, `\r` and `\n` kept
    assert dict(many.base_links) == {"base-link": "calc.py"}
    assert len(many.links) == 3004 and dict(many.links)["odd/newline"] == "a\nb"


def test_a_patch_without_symlinks_reads_no_link_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = make_worktree(tmp_path / "repo", {"calc.py": "x = 1\n"})
    (repo / "calc.py").write_text("x = 2\n")
    changes, _ = counted(monkeypatch, repo)
    assert changes.paths == ["calc.py"] and changes.links == changes.base_links == ()


def test_a_patch_of_more_files_than_the_cap_is_refused_by_its_count(tmp_path: Path) -> None:
    repo = make_worktree(tmp_path / "repo", {"calc.py": "x = 1\n"})
    (repo / "many").mkdir()
    for n in range(MAX_PATCH_FILES):
        (repo / "many" / f"f{n}").write_text("x\n")
    base, limits = git("rev-parse", "HEAD", cwd=repo).stdout.strip(), EvidenceLimits()
    assert len(take_evidence(repo, base, staged_patch(repo), tmp_path / "s", limits=limits).files) == 5_000
    (repo / "calc.py").write_text("x = 2\n")  # one more
    with pytest.raises(PatchRefused, match=r"^the patch changes 5001 files, more than 5000: too many to review"):
        take_evidence(repo, base, staged_patch(repo), tmp_path / "s", limits=limits)
    assert EvidenceLimits.for_job(1 << 20, SandboxLimits()).max_files == MAX_PATCH_FILES == 5_000
