"""The worker side of the review-rule tests: build a repository, make a hostile patch, judge it.

Runnable in-process (`judge_case`) or as `python worker_side.py CASE FOLDER`, which prints one JSON
object: tests/nonroot.py runs it so as an unprivileged worker, as the shipped image does. Every
verdict is taken as the attempt takes it: `take_evidence` from what git stores, then
`refusal_reasons` and `review_flags`.
"""

from __future__ import annotations

import json
import os
import posixpath
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.doubles.git_http import git, git_env, make_worktree
from worker.attempts.repo_config import load_repo_config, refusal_reasons, review_flags
from worker.attempts.stored_patch import EvidenceLimits, take_evidence

CHAIN = 12
FAKE_PASS = 'print("3 passed")\n'
CALC = "def add(a, b):\n    return a - b\n"
TEST_CALC = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
PYPROJECT = '[project]\nname = "calc"\nversion = "0"\n\n[tool.pytest.ini_options]\ntestpaths = ["tests"]\n'


def chain_links() -> dict[str, str]:
    """Links that each stay inside, alone and through each other, and that a target chains out of the checkout.

    `L -> ../..` nested CHAIN times, every other folder down `.links/a/a/...`: each leads two
    folders up, still inside. `passwd` walks down 2 * CHAIN folders, then through one L after the
    other (each a single component as text, two folders up when followed) back up to `.links`,
    then up 30 more: as text it never leaves; followed, it is /etc/passwd on any checkout fewer than
    30 folders deep.
    """
    links = {".links/" + "a/" * (2 * k) + "L": "../.." for k in range(1, CHAIN + 1)}
    links["passwd"] = ".links/" + "a/" * (2 * CHAIN) + "L/" * CHAIN + "../" * 30 + "etc/passwd"
    return links


def literally_inside(link: str, target: str) -> bool:
    """The check FrogFix made before: the target read alone, as text, stays in the checkout."""
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(link), target))
    return not target.startswith("/") and resolved.split("/")[0] not in ("..", ".git")


def add_links(repo: Path, links: dict[str, str]) -> None:
    for path, target in links.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, repo / path)


def staged_patch(repo: Path) -> str:
    """What the sandbox hands over: `git add -A` and `git diff --cached --binary`, every byte kept."""
    assert git("add", "-A", cwd=repo).returncode == 0
    done = subprocess.run(
        ["git", "diff", "--cached", "--binary", "HEAD"], cwd=repo, env=git_env(), capture_output=True, check=True
    )
    return done.stdout.decode("utf-8", "surrogateescape")


def judge(repo: Path) -> dict[str, Any]:
    """The attempt's verdicts on the staged changes; `refused_if_flagged` as FROGFIX_REFUSE_PROTECTED_CHANGES
    makes them (worker/attempts/attempt.py adds every flag that is not already a reason)."""
    patch = staged_patch(repo)
    base = git("rev-parse", "HEAD", cwd=repo).stdout.strip()
    changes = take_evidence(repo, base, patch, repo.parent / "scratch", limits=EvidenceLimits())
    config = load_repo_config(repo)  # the base commit's: the patch is only staged
    refused, flags = refusal_reasons(changes, config), review_flags(changes, config)
    return {
        "uid": os.geteuid(),
        "paths": changes.paths,
        "test_command": config.test_command,
        "refused": refused,
        "flags": flags,
        "refused_if_flagged": refused + [flag for flag in flags if flag not in refused],
    }


def link_chain(folder: Path, *, in_base: bool = False) -> dict[str, Any]:
    """The patch adds the chain (or only `passwd`, the base already holding the L links); the
    worktree shows where the kernel takes `passwd`."""
    repo = make_worktree(folder / "repo", {"README.md": "calc\n"})
    links = chain_links()
    if in_base:
        add_links(repo, {path: target for path, target in links.items() if path != "passwd"})
        assert git("add", "-A", cwd=repo).returncode == 0
        assert git("commit", "-qm", "links", cwd=repo).returncode == 0
    add_links(repo, {"passwd": links["passwd"]} if in_base else links)
    outcome = judge(repo)
    outcome["literally_inside"] = all(literally_inside(path, target) for path, target in links.items())
    outcome["kernel"] = os.path.realpath(repo / "passwd")
    return outcome


def python_repo(folder: Path, extra: dict[str, str] | None = None) -> Path:
    files = {"calc.py": CALC, "tests/test_calc.py": TEST_CALC, "pyproject.toml": PYPROJECT}
    return make_worktree(folder / "repo", files | (extra or {}))


def pytest_py(folder: Path) -> dict[str, Any]:
    """The patch's only change: a root pytest.py, which `python3 -m pytest` would import instead of pytest."""
    repo = python_repo(folder)
    (repo / "pytest.py").write_text(FAKE_PASS)
    return judge(repo)


def makefile(folder: Path) -> dict[str, Any]:
    """The test command is `make test`; the patch rewrites that target to print a pass."""
    make = {"Makefile": "test:\n\tpython3 -m pytest -q\n", ".frogfix.yml": "test_command: make test\n"}
    repo = python_repo(folder, make)
    (repo / "Makefile").write_text('test:\n\t@echo "3 passed"\n')
    return judge(repo)


CASES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "link-chain": link_chain,
    "link-chain-in-base": lambda folder: link_chain(folder, in_base=True),
    "pytest-py": pytest_py,
    "makefile": makefile,
}


if __name__ == "__main__":
    print(json.dumps(CASES[sys.argv[1]](Path(sys.argv[2]))))
