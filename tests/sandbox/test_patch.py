"""The patch is taken inside the sandbox, is exact (binary, deletions, odd bytes) and follows no symlink."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import PatchTooLarge
from sandbox.base import SandboxError
from sandbox.local import LocalSandbox
from tests.sandbox.support import bash, git, init_repo, inside_tree

pytestmark = pytest.mark.bwrap


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def test_patch_round_trips_new_binary_deleted_and_undecodable_files(
    workspace: Path, ws_base: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    base = init_repo(
        workspace,
        {"src/calc.py": "def add(a, b):\n    return a - b\n", "old.txt": "bye\n", "img.bin": b"\x00\x01\x02"},
    )
    (workspace / "latin.txt").write_bytes(b"caf\xe9 1\n")
    sb = make_sandbox(workspace)
    sb.call_tool("Edit", {"file_path": "src/calc.py", "old_string": "a - b", "new_string": "a + b"})
    sb.call_tool("Write", {"file_path": "tests/test_calc.py", "content": "def test():\n    assert True\n"})
    assert bash(sb, r"rm old.txt && printf '\x89PNG\x00\xff' > new.bin && printf '\x07' >> img.bin").startswith(
        "Exit code: 0"
    )
    patch = sb.patch_bytes(base)
    assert sb.patch(base).encode("utf-8", "surrogateescape") == patch
    assert b"new file mode 100644" in patch and b"deleted file mode 100644" in patch
    assert patch.count(b"GIT binary patch") == 2
    assert b"+caf\xe9 1" in patch
    sandbox_tree = inside_tree(sb)
    sb.close()

    clone = ws_base / f"clone-{uuid.uuid4().hex}"
    git(ws_base, "clone", "-q", str(workspace), str(clone))
    git(clone, "checkout", "-q", base)
    subprocess.run(["git", "apply", "--binary", "-"], input=patch, cwd=clone, check=True, capture_output=True)
    assert tree(clone) == sandbox_tree
    assert (clone / "new.bin").read_bytes() == b"\x89PNG\x00\xff"


def test_patch_records_symlinks_without_following_them(
    workspace: Path, outside: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    base = init_repo(workspace, {"a.txt": "a\n"})
    (workspace / "leak.txt").symlink_to(outside / "host.txt")
    (workspace / "leakdir").symlink_to(outside)
    sb = make_sandbox(workspace)
    bash(sb, "ln -s /etc/os-release release-link")
    patch = sb.patch(base)
    assert patch.count("new file mode 120000") == 3
    assert f"+{outside / 'host.txt'}" in patch
    assert "HOST-SECRET" not in patch
    assert "PRETTY_NAME" not in patch


def test_agent_git_config_cannot_change_the_patch_shape(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    base = init_repo(workspace, {"a.txt": "a\n"})
    sb = make_sandbox(workspace)
    bash(sb, "git config diff.noprefix true && git config diff.external /bin/false && echo b > a.txt")
    patch = sb.patch(base)
    assert patch.startswith("diff --git a/a.txt b/a.txt\n")
    assert "--- a/a.txt\n+++ b/a.txt\n" in patch and "+b\n" in patch


def test_patch_failures_raise_but_leave_the_sandbox_usable(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    init_repo(workspace, {"a.txt": "a\n"})
    sb = make_sandbox(workspace)
    with pytest.raises(SandboxError, match="git diff failed"):
        sb.patch("0" * 40)
    with pytest.raises(SandboxError, match="bad base commit"):
        sb.patch("--output=/tmp/x")
    assert sb.call_tool("Read", {"file_path": "a.txt"}) == "a.txt\n1. a"


def test_a_patch_over_the_limit_is_patch_too_large_and_the_sandbox_stays_usable(
    workspace: Path, make_sandbox: Callable[..., LocalSandbox]
) -> None:
    base = init_repo(workspace, {"a.txt": "a\n"})
    sb = make_sandbox(workspace, max_patch_bytes=2000)
    bash(sb, "head -c 5000 /dev/zero | tr '\\0' x > big.txt")
    with pytest.raises(PatchTooLarge) as caught:
        sb.patch(base)
    assert caught.value.limit == 2000
    assert str(caught.value) == "sandbox runner: ValueError: the patch is larger than 2000 bytes"
    with pytest.raises(PatchTooLarge):
        sb.patch_bytes(base)
    bash(sb, "rm big.txt")
    assert sb.patch(base) == ""
