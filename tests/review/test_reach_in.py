"""The reach-in flag (worker/attempts/reach_in.py) on real git repositories: what a patch's added lines do, with
the base's own code as the excuse (a project that is itself a pytest plugin imports pytest)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from worker.attempts.reach_in import added_lines, reach_in
from worker.attempts.stored_patch import PatchEvidence


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@x", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout


def change(tmp_path: Path, base: dict[str, str], patched: dict[str, str]) -> tuple[PatchEvidence, Path]:
    """The patch from `base`'s files to `patched`'s, as git stores it, and the repository."""
    repo = tmp_path / "repo"
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for path, text in base.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    commit = git(repo, "rev-parse", "HEAD").strip()
    for path, text in patched.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "add", "-A")
    patch = git(repo, "diff", "--cached", "--src-prefix=a/", "--dst-prefix=b/", commit)
    return PatchEvidence(base=commit, tree="", patch=patch, files=()), repo


def test_a_plugin_projects_own_pytest_imports_are_not_flagged_but_anyone_elses_are(tmp_path: Path) -> None:
    plugin = {"src/plug/__init__.py": "import pytest\n\n\ndef pytest_configure(config):\n    pass\n"}
    new_module = {"src/plug/more.py": "import pytest\n\nMARK = pytest.mark.slow\n"}
    changes, repo = change(tmp_path / "plugin", plugin, new_module)
    assert reach_in(changes, repo) == []
    changes, repo = change(tmp_path / "plain", {"src/plug/__init__.py": "X = 1\n"}, new_module)
    assert reach_in(changes, repo) == ["src/plug/more.py imports pytest outside the tests: `import pytest`"]


def test_tests_may_import_pytest_but_not_reach_its_internals(tmp_path: Path) -> None:
    tests = {"tests/test_x.py": "import pytest\n\n\ndef test_x():\n    assert True\n",
             "tests/conftest.py": "import _pytest.reports\n"}
    changes, repo = change(tmp_path, {"x.py": "X = 1\n"}, tests)
    found = reach_in(changes, repo)
    assert found == ["tests/conftest.py imports the test runner's internals: `import _pytest.reports`"]


def test_only_added_lines_count_and_a_removed_reach_is_no_reach(tmp_path: Path) -> None:
    changes, repo = change(tmp_path, {"m.py": "import atexit\nX = 1\n"}, {"m.py": "X = 2\n"})
    assert added_lines(changes.patch) == {"m.py": ["X = 2"]} and reach_in(changes, repo) == []
