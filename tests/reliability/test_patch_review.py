"""What a patch may not do, judged from what git stores for patches real git made: symlinks out, binary files,
FrogFix's config.

Also: the sandbox cuts the diff at FROGFIX_MAX_PATCH_BYTES, and the pipeline recognises that cut.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from app.settings import Settings
from sandbox.base import PatchTooLarge, SandboxError
from tests.doubles.git_http import git, git_env, make_worktree
from worker.attempts.repo_config import RepoConfig, refusal_reasons, review_flags
from worker.attempts.stored_patch import EvidenceLimits, PatchEvidence, take_evidence
from worker.wiring import open_job_sandbox


def staged_patch(repo: Path) -> str:
    """The patch exactly as the sandbox takes it: `git add -A` then `git diff --cached --binary`, every byte kept."""
    assert git("add", "-A", cwd=repo).returncode == 0
    done = subprocess.run(
        ["git", "diff", "--cached", "--binary", "HEAD"], cwd=repo, env=git_env(), capture_output=True, check=True
    )
    return done.stdout.decode("utf-8", "surrogateescape")


def reviewed(repo: Path, patch: str | None = None) -> PatchEvidence:
    """What git stores for the staged changes (or `patch`) on HEAD, as the attempt takes it."""
    patch = staged_patch(repo) if patch is None else patch
    base = git("rev-parse", "HEAD", cwd=repo).stdout.strip()
    return take_evidence(repo, base, patch, repo.parent / "scratch", limits=EvidenceLimits())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_worktree(
        tmp_path / "repo",
        {"calc.py": "x = 1\n", "tests/test_calc.py": "def test(): pass\n", "docs/guide.md": "guide\n"},
    )


def test_symlinks_out_of_the_checkout_are_refused_and_inward_ones_are_not(repo: Path) -> None:
    os.symlink("/etc/passwd", repo / "abs")
    os.symlink("../../outside", repo / "docs" / "up")
    os.symlink("../.git/config", repo / "docs" / "gitconfig")
    os.symlink("../calc.py", repo / "docs" / "calc_link")  # stays inside: fine
    os.symlink("guide.md", repo / "docs" / "same_dir")  # fine
    reasons = refusal_reasons(reviewed(repo), RepoConfig())
    assert reasons == [
        "adds symlink abs pointing outside the repository ('/etc/passwd')",
        "adds symlink docs/gitconfig pointing outside the repository ('../.git/config')",
        "adds symlink docs/up pointing outside the repository ('../../outside')",
    ]


def test_retargeting_an_existing_symlink_outwards_is_refused(repo: Path) -> None:
    os.symlink("calc.py", repo / "link")
    assert git("add", "-A", cwd=repo).returncode == 0 and git("commit", "-qm", "link", cwd=repo).returncode == 0
    (repo / "link").unlink()
    os.symlink("/root/.ssh/id_rsa", repo / "link")
    assert refusal_reasons(reviewed(repo), RepoConfig()) == [
        "adds symlink link pointing outside the repository ('/root/.ssh/id_rsa')"
    ]


def test_binary_files_are_refused_unless_allowed(repo: Path) -> None:
    (repo / "blob.bin").write_bytes(b"\x00\x01\x02" * 100)
    (repo / "calc.py").write_bytes(b"x = 1\x00\n")  # a text file turned binary
    changes = reviewed(repo)
    assert refusal_reasons(changes, RepoConfig()) == ["adds binary file blob.bin", "changes binary file calc.py"]
    assert refusal_reasons(changes, RepoConfig(), allow_binary=True) == []
    assert git("add", "-A", cwd=repo).returncode == 0 and git("commit", "-qm", "bin", cwd=repo).returncode == 0
    (repo / "blob.bin").unlink()  # removing a binary file is reviewable: nothing to refuse
    assert refusal_reasons(reviewed(repo), RepoConfig()) == []


def test_frogfix_yml_and_protected_paths_are_refused_even_with_quoted_names(repo: Path) -> None:
    (repo / ".frogfix.yml").write_text('test_command: "true"\n')
    (repo / "tests" / "tést ü.py").write_text("x\n")  # git C-quotes this name in the patch
    patch = staged_patch(repo)
    assert '"b/tests/t\\303\\251st \\303\\274.py"' in patch
    changes = reviewed(repo, patch)
    assert changes.paths == [".frogfix.yml", "tests/tést ü.py"]
    config = RepoConfig(protected_paths=("tests/**",))
    assert refusal_reasons(changes, config) == [
        "changes FrogFix's own configuration .frogfix.yml (only people may change it)",
        "changes protected path tests/tést ü.py",
    ]
    assert review_flags(changes, RepoConfig()) == [
        "changes test file or test-runner configuration .frogfix.yml",
        "changes test file or test-runner configuration tests/tést ü.py",
    ]


def test_renames_name_both_sides(repo: Path) -> None:
    assert git("mv", "docs/guide.md", "tests/guide.md", cwd=repo).returncode == 0
    changes = reviewed(repo)  # git stores no renames: a delete and an add
    assert changes.paths == ["docs/guide.md", "tests/guide.md"]
    assert [f.status for f in changes.files] == ["deleted", "added"]
    refused = refusal_reasons(changes, RepoConfig(protected_paths=("docs/**",)))
    assert refused == ["changes protected path docs/guide.md"]


@pytest.fixture
def workspace() -> Iterator[Path]:
    """A git checkout under a 0711 folder, as the sandbox's unprivileged uid needs."""
    parent = Path(tempfile.mkdtemp(prefix="frogfix-patch-limit-"))
    parent.chmod(0o711)
    yield make_worktree(parent / "ws", {"a.txt": "a\n"})
    shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.bwrap
def test_the_sandbox_stops_reading_a_diff_at_max_patch_bytes(workspace: Path) -> None:
    base = git("rev-parse", "HEAD", cwd=workspace).stdout.strip()
    settings = Settings(max_patch_bytes=4096)
    with closing(open_job_sandbox(workspace, settings)) as box:
        box.call_tool("Write", {"file_path": "small.txt", "content": "x\n" * 100})
        assert "small.txt" in box.patch(base)
        box.call_tool("Write", {"file_path": "big.txt", "content": "line\n" * 2000})
        with pytest.raises(PatchTooLarge) as caught:  # a typed refusal: no caller reads the runner's error text
            box.patch(base)
        assert caught.value.limit == 4096 and isinstance(caught.value, SandboxError), str(caught.value)
        assert "small.txt" in box.call_tool("Glob", {"pattern": "*.txt"})  # the sandbox is still usable


@pytest.mark.bwrap
def test_a_symlink_moved_so_that_it_points_out_is_refused(workspace: Path) -> None:
    """The sandbox's diff has no renames, so a moved link shows as an added link with its target."""
    (workspace / "docs" / "inner").mkdir(parents=True)
    (workspace / "docs" / "guide.md").write_text("guide\n")
    os.symlink("../guide.md", workspace / "docs" / "inner" / "link")  # inside the checkout: fine
    git("add", "-A", cwd=workspace)
    git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "link", cwd=workspace)
    base = git("rev-parse", "HEAD", cwd=workspace).stdout.strip()
    with closing(open_job_sandbox(workspace, Settings())) as box:
        box.call_tool("Bash", {"command": "git mv docs/inner/link link"})  # now ../guide.md leaves the checkout
        patch = box.patch(base)
    assert "rename from" not in patch
    reasons = refusal_reasons(reviewed(workspace, patch), RepoConfig())
    assert any(r.startswith("adds symlink link pointing outside the repository") for r in reasons), reasons
