"""What a checkout declares about its test environment: hand-written trees, then the real ones in ../shared."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from worker.attempts.repo_config import RepoConfigError, load_repo_config
from worker.environment.declared import Overrides, is_dependency_file, is_python, plan_for

REALREPOS = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "realrepos"


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_pyproject_extras_for_tests_win_over_dev(tmp_path: Path) -> None:
    repo = tree(tmp_path, {"pyproject.toml": """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"
[project]
name = "demo-pkg"
dependencies = ["attrs"]
[project.optional-dependencies]
dev = ["black"]
tests = ["pytest>=8", "freezegun"]
"""})
    plan = plan_for(repo, "python -m pytest -q")
    assert plan.project and plan.extras == ("tests",) and plan.dist_name == "demo-pkg"
    assert plan.install_args() == ["-e", ".[tests]"]
    # pytest is always asked for, unpinned, when the test command runs it (the resolver meets the extra's
    # own specifier); it is not called undeclared when a chosen declaration names it.
    assert plan.requirements == ("pytest",) and not any(line.startswith("pytest") for line in plan.detected)


def test_dependency_groups_follow_include_group_once(tmp_path: Path) -> None:
    repo = tree(tmp_path, {"pyproject.toml": """
[dependency-groups]
base = ["coverage", {include-group = "tests"}]
tests = ["pytest", "hypothesis", {include-group = "base"}]
"""})
    plan = plan_for(repo, "pytest")
    assert plan.requirements == ("pytest", "hypothesis", "coverage")
    assert not plan.project  # no build-system, no [project]: nothing to install of itself


def test_poetry_dev_dependencies_less_linters_and_the_lock_as_constraints(tmp_path: Path) -> None:
    repo = tree(tmp_path, {
        "pyproject.toml": """
[tool.poetry]
name = "rich-like"
[tool.poetry.dev-dependencies]
python = "^3.8"
pytest = "^7.0.0"
black = "^22.6"
attrs = "~21.4"
typing-extensions = ">=4.0.0, <5.0"
""",
        "poetry.lock": """
[[package]]
name = "pytest"
version = "7.4.4"
[[package]]
name = "Typing_Extensions"
version = "4.13.2"
""",
    })
    plan = plan_for(repo, "python -m pytest")
    assert plan.requirements == ("pytest>=7.0.0,<8", "attrs>=21.4,<21.5", "typing-extensions>=4.0.0, <5.0")
    assert plan.constraints == ("pytest==7.4.4", "typing-extensions==4.13.2")


def test_uv_lock_pins_one_version_each_and_never_the_project(tmp_path: Path) -> None:
    repo = tree(tmp_path, {
        "pyproject.toml": '[project]\nname = "w"\n[build-system]\nrequires = ["flit_core"]\n',
        "uv.lock": """
[[package]]
name = "w"
version = "1.0"
source = { editable = "." }
[[package]]
name = "watchdog"
version = "6.0.0"
[[package]]
name = "numpy"
version = "1.26.0"
[[package]]
name = "numpy"
version = "2.1.0"
""",
    })
    assert plan_for(repo, None).constraints == ("watchdog==6.0.0",)


def test_setup_py_extras_are_read_as_text(tmp_path: Path) -> None:
    repo = tree(tmp_path, {"setup.py": """
import os  # never run: FrogFix reads this file, it does not execute it
setup(name="parso", extras_require={
    'testing': ['pytest', 'docopt'],
    'qa': ['flake8==5.0.4'],
})
"""})
    plan = plan_for(repo, "python -m pytest -q")
    assert plan.extras == ("testing",) and plan.project
    assert plan.requirements == ("pytest",)  # asked for whatever setup.py's extras hold


def test_requirement_files_for_tests_and_tox_deps(tmp_path: Path) -> None:
    repo = tree(tmp_path, {
        "setup.py": "setup(name='x')\n",
        "requirements/requirements.txt": "python-dateutil\n",
        "requirements/requirements-tests.txt": "-r requirements.txt\npytest\n",
        "requirements/requirements-docs.txt": "sphinx\n",
        "requirements-mypy.txt": "mypy\n",
        "tox.ini": "[testenv]\ndeps =\n    hypothesis\n    py38: old-thing\n    {env:EXTRA:}\n    poetry\n"
                   "    -r{toxinidir}/requirements/requirements-tests.txt\n",
    })
    plan = plan_for(repo, "python -m pytest")
    assert plan.requirement_files == ("requirements/requirements-tests.txt",)
    assert plan.requirements == ("hypothesis", "pytest")  # no factor line, no substitution, no packaging tool


def test_pytest_is_added_only_when_the_test_command_runs_it_and_nothing_names_it(tmp_path: Path) -> None:
    repo = tree(tmp_path, {"requirements.txt": "requests\n"})
    assert "pytest" in plan_for(repo, "python3 -m pytest -q").requirements
    assert "pytest" not in plan_for(repo, "python3 -m unittest").requirements
    assert "pytest" not in plan_for(repo, "make test-pytest-free").requirements


def test_overrides_replace_what_was_detected(tmp_path: Path) -> None:
    repo = tree(tmp_path, {
        "pyproject.toml": '[project]\nname = "p"\n[project.optional-dependencies]\ntests = ["pytest"]\n',
        "requirements-dev.txt": "black\n",
    })
    plan = plan_for(repo, "pytest", Overrides(extras=("full",), requirements=(), packages=("pytest<9",)))
    assert plan.extras == ("full",) and plan.requirement_files == () and plan.requirements == ("pytest<9",)


def test_frogfix_yml_environment_keys_and_did_you_mean(tmp_path: Path) -> None:
    (tmp_path / ".frogfix.yml").write_text("environment:\n  extras: [tests]\n  packages: ['pytest<9']\n")
    config = load_repo_config(tmp_path)
    assert config.environment == Overrides(extras=("tests",), packages=("pytest<9",))
    (tmp_path / ".frogfix.yml").write_text("enviroment:\n  extras: [tests]\n")
    with pytest.raises(RepoConfigError, match="did you mean environment"):
        load_repo_config(tmp_path)
    (tmp_path / ".frogfix.yml").write_text("environment:\n  extra: [tests]\n")
    with pytest.raises(RepoConfigError, match=r"did you mean environment\.extras"):
        load_repo_config(tmp_path)
    hostile = (
        "  extras: ['tests]; rm -rf /']\n", "  requirements: ['../../etc/passwd']\n", "  packages: ['--index-url=x']\n"
    )
    for bad in hostile:
        (tmp_path / ".frogfix.yml").write_text("environment:\n" + bad)
        with pytest.raises(RepoConfigError):
            load_repo_config(tmp_path)


def test_dependency_files_are_known_and_other_repositories_are_not_python(tmp_path: Path) -> None:
    assert is_dependency_file("uv.lock") and is_dependency_file("requirements/test.txt")
    assert not is_dependency_file("src/requirements.py") and not is_dependency_file("docs/requirements.txt")
    assert not is_python(tree(tmp_path / "go", {"go.mod": "module x\n"}))


def _realrepo_tasks() -> list[str]:
    if not REALREPOS.is_dir():
        return []
    return [t["task"] for t in json.loads((REALREPOS / "MANIFEST.json").read_text())["tasks"]]


@pytest.mark.skipif(not REALREPOS.is_dir(), reason=f"the shared realrepos fixtures are not here ({REALREPOS})")
@pytest.mark.parametrize("task", _realrepo_tasks() or ["absent"])
def test_real_repositories_declare_what_their_tests_need(task: str, tmp_path: Path) -> None:
    """Every name the task's working environment needed at top level is planned (from its files alone)."""
    folder = REALREPOS / task
    with tarfile.open(fileobj=io.BytesIO((folder / "base.tar.gz").read_bytes())) as archive:
        archive.extractall(tmp_path, filter="data")
    meta = json.loads((folder / "task.json").read_text())
    plan = plan_for(tmp_path, meta["test_command"])
    assert plan.project, plan
    assert plan.extras or plan.requirements or plan.requirement_files, plan
    wanted = {
        "humanize-naturaldate-tz": lambda p: p.extras == ("tests",),
        "werkzeug-float-converter": lambda p: "pytest" in p.requirements and "watchdog==6.0.0" in p.constraints,
        "arrow-tzinfo-utc-prefix": lambda p: p.requirement_files == ("requirements/requirements-tests.txt",),
        "parso-future-grammar": lambda p: p.extras == ("testing",),
        "rich-prompt-markup": lambda p: "pytest==7.4.4" in p.constraints
        and not any("black" in r for r in p.requirements),
        "natsort-pathlib-paths": lambda p: {"pytest", "hypothesis", "pytest-mock"} <= set(p.requirements),
    }
    assert wanted[task](plan), plan
