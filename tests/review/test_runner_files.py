"""A runner the patch cannot swap (issue 23, finding 2).

The files that decide what the tests run were half listed, beside the tests, and a root `pytest.py`
that prints "3 passed" went unflagged: `python3 -m pytest` imports it first. Now one tuple,
`RUNNER_FILES`, plus whatever file the test command names, is flagged ("changes the test runner")
and refused with FROGFIX_REFUSE_PROTECTED_CHANGES; README lists exactly that tuple.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import configure
from tests.doubles.openai_server import assistant
from tests.nonroot import NonRoot
from tests.pipeline import conftest as pipeline_conftest
from tests.pipeline.conftest import PROJECT, World
from tests.reliability.test_hostile_jobs import call, load, start_job
from tests.review import worker_side
from worker.attempts.repo_config import DEPENDENCY_NOTE, RUNNER_FILES, RepoConfig, command_paths, review_flags
from worker.attempts.stored_patch import ChangedFile, PatchEvidence
from worker.environment.declared import is_dependency_file
from worker.tasks import run_job

README = Path(__file__).resolve().parents[2] / "README.md"
world = pipeline_conftest.world  # the pipeline's fixture (doubles, git server, scripted model)
PYTEST_PY = "changes the test runner pytest.py (the test command runs it)"
MAKEFILE = "changes the test runner or its configuration Makefile"


def flags(*paths: str, command: str | None = None) -> list[str]:
    changes = PatchEvidence("0" * 40, "1" * 40, "", tuple(ChangedFile(p) for p in paths))
    return review_flags(changes, RepoConfig(test_command=command))


def readme_runner_files() -> list[str]:
    """Every file pattern in the runner table of README's "What a job does" (its second column)."""
    section = README.read_text(encoding="utf-8").split("\n## What a job does\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("| What | Files |\n", 1)[1]
    rows = itertools.takewhile(lambda line: line.lstrip().startswith("|"), table.splitlines())
    return [name for row in rows for name in re.findall(r"`([^`]+)`", row.split("|")[2])]


def test_readme_lists_exactly_the_runner_files() -> None:
    """One list in one home: the review rule's tuple is README's table, entry for entry."""
    listed = readme_runner_files()
    assert len(set(RUNNER_FILES)) == len(RUNNER_FILES) and len(set(listed)) == len(listed)
    assert [entry for entry in RUNNER_FILES if entry not in listed] == []
    assert [entry for entry in listed if entry not in RUNNER_FILES] == []
    for required in ("**/Makefile", "**/justfile", "**/Taskfile.yml", "**/package.json", "**/tox.ini",
                     "**/noxfile.py", "**/conftest.py", "**/.coveragerc", "pytest.py", "_pytest/**",
                     "pluggy/**", "unittest/**", "**/sitecustomize.py", "**/*.pth"):  # fmt: skip
        assert required in RUNNER_FILES


def example(pattern: str) -> list[str]:
    """Paths a pattern stands for: in a subfolder and at the root for `**/`, a file inside for `/**`."""
    if pattern.startswith("**/"):
        name = pattern[3:].replace("*", "evil")
        return [name, f"deep/sub/{name}"]
    return [pattern.replace("/**", "/__init__.py")]


@pytest.mark.parametrize("pattern", RUNNER_FILES)
def test_every_runner_file_is_flagged_as_the_test_runner(pattern: str) -> None:
    for path in example(pattern):
        note = f" ({DEPENDENCY_NOTE})" if is_dependency_file(path) else ""
        assert flags(path) == [f"changes the test runner or its configuration {path}{note}"]


def test_ordinary_files_and_tests_keep_their_flags() -> None:
    assert flags("src/pytest.py", "docs/Makefile.md", "lib/py.py", "calc.py") == []
    assert flags("tests/test_calc.py", ".frogfix.yml") == [
        "changes test file or test-runner configuration tests/test_calc.py",
        "changes test file or test-runner configuration .frogfix.yml",
    ]
    assert flags("tests/conftest.py") == ["changes the test runner or its configuration tests/conftest.py"]


def test_files_the_test_command_names_are_flagged() -> None:
    assert flags("run_tests.sh", "calc.py", command="./run_tests.sh -x") == [
        "changes the test runner run_tests.sh (the test command runs it)"
    ]
    assert flags("runtests.py", command="python runtests.py --fast") == [
        "changes the test runner runtests.py (the test command runs it)"
    ]
    named = command_paths("bash -c 'PYTHONPATH=src python -m tools.check --rcfile=ci/cov.rc' && ../up.sh /usr/x")
    assert {"tools/__init__.py", "tools/check.py", "tools/check/__main__.py", "ci/cov.rc", "src"} <= named
    assert not {"../up.sh", "/usr/x", "up.sh", "usr/x"} & named
    assert command_paths(None) == command_paths("") == frozenset()
    assert command_paths("python -m 'unclosed") >= {"python"}  # a word the shell would refuse still reads


def as_worker(nonroot: NonRoot, case: str) -> dict[str, Any]:
    return nonroot.run_json(Path(worker_side.__file__), case, str(nonroot.folder(f"{case}-")), timeout=120)


@pytest.mark.bwrap  # the nonroot fixture checks that bubblewrap runs for that user
def test_a_root_pytest_py_printing_a_pass_is_flagged_and_refused_for_a_non_root_worker(nonroot: NonRoot) -> None:
    outcome = as_worker(nonroot, "pytest-py")
    assert outcome["paths"] == ["pytest.py"] and outcome["test_command"] == "python3 -m pytest -q"
    assert outcome["flags"] == [PYTEST_PY]
    assert outcome["refused"] == [] and outcome["refused_if_flagged"] == [PYTEST_PY]


@pytest.mark.bwrap  # the nonroot fixture checks that bubblewrap runs for that user
def test_a_rewritten_makefile_test_target_is_flagged_and_refused_for_a_non_root_worker(nonroot: NonRoot) -> None:
    outcome = as_worker(nonroot, "makefile")
    assert outcome["paths"] == ["Makefile"] and outcome["test_command"] == "make test"
    assert outcome["flags"] == [MAKEFILE]
    assert outcome["refused"] == [] and outcome["refused_if_flagged"] == [MAKEFILE]


@pytest.mark.bwrap
@pytest.mark.timeout(120)
def test_the_attempt_refuses_a_swapped_runner_with_refuse_protected_changes(client: Any, world: World) -> None:
    """The whole job: the model's only change is a root pytest.py; nothing is tested or pushed."""
    configure(world.env["monkeypatch"], refuse_protected_changes="true")
    world.model._script[:] = [
        call("Write", file_path="pytest.py", content=worker_side.FAKE_PASS),
        assistant("The tests pass now."),
    ]
    job_id, _ = start_job(client, world, title="test_add fails")

    assert run_job(job_id) == "no_fix"

    _, _, [attempt] = load(job_id)
    assert attempt.status == "rejected" and attempt.tests is None
    assert attempt.error == f"attempt 1's patch was refused: {PYTEST_PY}"
    assert attempt.flags == [PYTEST_PY]
    assert world.gitlab.open_mrs(PROJECT) == [] and world.git_gitlab.pushes == []
