"""Symlink chains out of the checkout (issue 23, finding 1).

The review rule read each symlink target alone, as text. Links that each stay inside can chain out:
`L -> ../..` nested twelve times, and `passwd` walking through them is /etc/passwd on the
reviewer's checkout (tests/review/worker_side.py `chain_links`). A link is now judged by where the
kernel would take it through every other symlink of the patched tree, the base tree's included.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.git_http import git, make_worktree
from tests.nonroot import NonRoot
from tests.review import worker_side
from tests.review.worker_side import add_links, staged_patch
from worker.attempts.repo_config import MAX_LINK_HOPS, LinkResolver, RepoConfig, refusal_reasons
from worker.attempts.stored_patch import ChangedFile, EvidenceLimits, PatchEvidence, take_evidence

CHAIN_OUT = "it leaves the checkout through symlink .links/a/a/L"


def as_worker(nonroot: NonRoot, case: str) -> dict[str, Any]:
    return nonroot.run_json(Path(worker_side.__file__), case, str(nonroot.folder(f"{case}-")), timeout=120)


def refused(repo: Path) -> list[str]:
    base = git("rev-parse", "HEAD", cwd=repo).stdout.strip()
    changes = take_evidence(repo, base, staged_patch(repo), repo.parent / "scratch", limits=EvidenceLimits())
    return refusal_reasons(changes, RepoConfig())


def commit(repo: Path) -> None:
    assert git("add", "-A", cwd=repo).returncode == 0
    assert git("commit", "-qm", "base", cwd=repo).returncode == 0


@pytest.mark.bwrap  # the nonroot fixture checks that bubblewrap runs for that user
@pytest.mark.parametrize("case", ["link-chain", "link-chain-in-base"])
def test_a_chain_of_inward_links_to_etc_passwd_is_refused_for_a_non_root_worker(nonroot: NonRoot, case: str) -> None:
    """As text every target stays inside; the kernel takes `passwd` to /etc/passwd. Refused, whether the
    patch adds the whole chain or the L links are the base's and the patch adds only `passwd`."""
    outcome = as_worker(nonroot, case)
    assert outcome["literally_inside"] is True  # what the old rule read: nothing to refuse
    assert outcome["kernel"] == "/etc/passwd"  # what a checkout of the patched tree is
    target = worker_side.chain_links()["passwd"]
    assert outcome["refused"] == [f"adds symlink passwd pointing outside the repository ({target!r}; {CHAIN_OUT})"]
    assert outcome["paths"][-1] == "passwd" and len(outcome["paths"]) == (1 if case.endswith("base") else 13)


def test_plain_links_inside_the_checkout_stay_allowed(tmp_path: Path) -> None:
    repo = make_worktree(tmp_path / "repo", {"README.md": "r\n", "docs/v2/index.md": "v2\n", "scripts/t.sh": "t\n"})
    add_links(repo, {
        "docs/latest": "v2",
        "docs/stable": "latest",  # a link to a link
        "docs/v2/readme": "../../README.md",
        "bin/tool": "../scripts/t.sh",
        "docs/index": "latest/../v2/./index.md",  # `..` after a link: from where it led, still inside
        "docs/missing": "v3/index.md",  # dangling, inside
        "Docs": "docs",  # a loop only where names fold, and a loop leads nowhere
    })  # fmt: skip
    assert refused(repo) == []


def test_a_link_the_patch_keeps_is_refused_when_the_patch_turns_it_out(tmp_path: Path) -> None:
    """`docs/v2 -> ..` stays inside, but the kept `site/docs -> ../docs/v2/..` now leads above the root."""
    repo = make_worktree(tmp_path / "repo", {"README.md": "r\n", "docs/v2/index.md": "v2\n"})
    add_links(repo, {"site/docs": "../docs/v2/..", "etc": "/etc"})  # `etc`: the repository's own, already out
    commit(repo)
    (repo / "docs" / "v2" / "index.md").unlink()
    (repo / "docs" / "v2").rmdir()
    add_links(repo, {"docs/v2": "..", "docs/readme": "../README.md"})
    assert refused(repo) == [
        "turns symlink site/docs, which the patch keeps, outside the repository"
        " ('../docs/v2/..'; it leaves the checkout through symlink docs/v2)"
    ]


def test_a_link_into_dot_git_through_another_link_is_refused(tmp_path: Path) -> None:
    repo = make_worktree(tmp_path / "repo", {"README.md": "r\n"})
    add_links(repo, {"up": ".", "hooks": "up/.Git/hooks", "sub/cfg": "../docs/.git/config"})
    assert refused(repo) == [
        "adds symlink hooks pointing outside the repository ('up/.Git/hooks'; it enters .git through symlink up)",
        "adds symlink sub/cfg pointing outside the repository ('../docs/.git/config')",
    ]


def test_chains_longer_than_the_kernel_follows_and_loops_are_refused(tmp_path: Path) -> None:
    """41 links in a row is ELOOP for the kernel and refused here; 40 are followed by both."""
    repo = make_worktree(tmp_path / "repo", {"target.txt": "t\n"})
    chain = {f"l{k}": f"l{k + 1}" for k in range(MAX_LINK_HOPS)} | {f"l{MAX_LINK_HOPS}": "target.txt"}
    add_links(repo, chain | {"x": "y", "y": "x"})
    os.stat(repo / "l1")  # 40 links: the kernel follows them
    for name in ("l0", "x"):
        with pytest.raises(OSError) as caught:
            os.stat(repo / name)
        assert caught.value.errno == errno.ELOOP
    assert refused(repo) == [
        "adds symlink l0 pointing outside the repository ('l1'; follows more than 40 symlinks through symlink l1)",
        "adds symlink x pointing outside the repository ('y'; follows more than 40 symlinks through symlink y)",
        "adds symlink y pointing outside the repository ('x'; follows more than 40 symlinks through symlink x)",
    ]


def test_a_case_insensitive_checkout_is_judged_too(tmp_path: Path) -> None:
    """On macOS or Windows `.LINKS/L` is the base's `.links/L -> ..`, so `..` after it leaves the root."""
    repo = make_worktree(tmp_path / "repo", {"README.md": "r\n"})
    add_links(repo, {".links/L": ".."})
    commit(repo)
    add_links(repo, {"passwd": ".LINKS/L/../etc/passwd"})
    assert refused(repo) == [
        "adds symlink passwd pointing outside the repository ('.LINKS/L/../etc/passwd';"
        " it leaves the checkout on a case-insensitive file system through symlink .LINKS/L)"
    ]


def test_evidence_without_the_trees_links_still_judges_the_changed_ones() -> None:
    """A PatchEvidence built by hand (no tree read) resolves its changed links through each other."""
    files = (
        ChangedFile("a/L", "added", "000000", "120000", link_target=".."),
        ChangedFile("out", "added", "000000", "120000", link_target="a/L/../x"),
    )
    assert refusal_reasons(PatchEvidence("0" * 40, "1" * 40, "", files), RepoConfig()) == [
        "adds symlink out pointing outside the repository ('a/L/../x'; it leaves the checkout through symlink a/L)"
    ]


def test_a_chain_of_a_thousand_links_is_judged_without_deep_recursion() -> None:
    """Looked up from its far end first, a long chain nests no deeper than the hop bound, and each link
    still gets the kernel's verdict: within 40 links of the end it is followed, past that refused."""
    links = {"l0": "."} | {f"l{k}": f"l{k - 1}/." for k in range(1, 1000)}
    resolver = LinkResolver(links)
    landings = {k: resolver.link(f"l{k}") for k in reversed(range(1000))}
    assert all(landings[k].parts == () for k in range(MAX_LINK_HOPS))
    assert all(landings[k].parts is None for k in range(MAX_LINK_HOPS, 1000))
    assert landings[MAX_LINK_HOPS - 1].hops == MAX_LINK_HOPS
