"""What real Python projects write, found (issue 37), and a runner that cannot start is never a failing test.

Found on a real project: extras in a module-level `EXTRAS_REQUIRE` passed to `setup()`, and tox.ini's
`[testenv] extras =`, were not detected, so the environment had no pytest; `python3 -m pytest` then
said "No module named pytest" (exit 1), read as failing tests: the agent ran and the job ended no_fix.
Each case is a small repository here, built from a real mirror (pypiserver on loopback).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from app.settings import Settings
from tests.doubles.openai_server import ScriptedOpenAIServer, assistant
from tests.environment.pypi_wheels import copy_wheels, wheels
from tests.environment.test_setup_phase import CANARY, environments, repo, roots, run_fix, settings_for, wheel
from tests.realrepos.mirror import PackageMirror
from worker.environment.declared import plan_for
from worker.wiring import open_job_sandbox

pytestmark = pytest.mark.bwrap
__all__ = ["roots"]  # the fixture, used by name

USES_FROGDEP = "import frogdep\n\ndef test_value():\n    assert frogdep.VALUE == 42\n"
SETUP_PY = """from setuptools import setup

EXTRAS_REQUIRE = {
    "tests": ["frogdep"],
}
EXTRAS_REQUIRE["docs"] = ["frogfix-no-such-docs-tool"]

setup(name="demo", version="1.0", py_modules=["demo"], extras_require=EXTRAS_REQUIRE)
"""
PYPROJECT_CHECK = """[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "demo"
version = "1.0"

[project.optional-dependencies]
check = ["frogdep"]
docs = ["frogfix-no-such-docs-tool"]

[tool.setuptools]
py-modules = ["demo"]
"""
TOX_INI = "[tox]\nenvlist = py\n\n[base]\nextras = check\n\n[testenv]\nextras = {[base]extras}\ncommands = pytest\n"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PackageMirror]:
    """frogdep (only here) and what a setuptools project tested with pytest needs, from PyPI once."""
    packages = tmp_path_factory.mktemp("packages")
    wheel(packages, "frogdep", "1.0", "VALUE = 42\n")
    copy_wheels(wheels("setuptools", "wheel", "pytest"), packages)
    with PackageMirror(packages, CANARY) as served:
        yield served


def passing_in_the_environment(settings: Settings, checkout: Path) -> str:
    report = environments(settings).for_checkout(checkout, "python3 -m pytest -q", None, None)
    assert report.ok, (report.reason, report.log_tail)
    with closing(open_job_sandbox(checkout, settings, environment=report.path, project=report.project)) as box:
        run = box.run_command("python3 -m pytest -q -p no:cacheprovider", timeout=300)
    assert run.exit_code == 0 and "1 passed" in run.log, run.log
    return "\n".join(report.detected)


def test_setup_py_extras_in_a_module_level_variable_are_found(roots: tuple[Path, Path], mirror: PackageMirror) -> None:
    settings = settings_for(roots, mirror)
    checkout = repo(settings.resolved_workspace_dir() / "checkout", "", test=USES_FROGDEP,
                    extra={"setup.py": SETUP_PY, "demo.py": "", "requirements.txt": ""})
    plan = plan_for(checkout, "python3 -m pytest -q")
    assert plan.extras == ("tests",), plan  # not docs: its tool is not on the mirror, and no test needs it
    detected = passing_in_the_environment(settings, checkout)
    assert "extras tests (setup.py extras_require)" in detected


def test_tox_extras_and_the_sections_they_name_are_found(roots: tuple[Path, Path], mirror: PackageMirror) -> None:
    settings = settings_for(roots, mirror)
    checkout = repo(settings.resolved_workspace_dir() / "checkout", "", test=USES_FROGDEP,
                    extra={"pyproject.toml": PYPROJECT_CHECK, "tox.ini": TOX_INI, "demo.py": ""})
    plan = plan_for(checkout, "python3 -m pytest -q")
    assert plan.extras == ("check",), plan
    assert "extras check (tox.ini [testenv] extras)" in passing_in_the_environment(settings, checkout)


def fix(checkout: Path, roots: tuple[Path, Path], env: dict[str, str], turns: int = 0) -> tuple[dict, int]:
    script = [assistant("I could not find the bug.")] * max(turns, 1)
    with ScriptedOpenAIServer(script if turns else []) as model:
        proc = run_fix(checkout, roots, model.base_url, env)
        calls = len(model.requests)
    assert proc.stdout, proc.stderr[-3000:]
    out: dict = json.loads(proc.stdout)
    return out, calls


def test_a_runner_the_mirror_lacks_is_an_environment_error_before_the_model(
    roots: tuple[Path, Path], mirror: PackageMirror
) -> None:
    """`.frogfix.yml` names a runner that nothing installs: Python says "No module named nose2" (exit 1)."""
    checkout = repo(roots[0].parent / "checkout", "frogdep==1.0\n", test=USES_FROGDEP,
                    extra={".frogfix.yml": "test_command: python3 -m nose2 -v\n"})
    out, calls = fix(checkout, roots, {"FROGFIX_PIP_INDEX_URL": mirror.url_with_credentials})
    assert out["status"] == "environment_error" and calls == 0 and out["usage"]["calls"] == 0, out
    reason = out["environment"]["reason"]
    assert "the test runner nose2 is not installed" in reason and "No module named nose2" in reason, reason


def test_pytest_missing_from_the_host_is_an_environment_error_before_the_model(roots: tuple[Path, Path]) -> None:
    """No mirror: the host's python3 runs the tests; a runner it lacks never reads as failing tests."""
    checkout = repo(roots[0].parent / "checkout", "", test="def test_it():\n    assert True\n",
                    extra={".frogfix.yml": "test_command: python3 -m frogfix_no_such_runner -q\n"})
    out, calls = fix(checkout, roots, {})
    assert out["status"] == "environment_error" and calls == 0, out
    assert "the test runner frogfix_no_such_runner is not installed" in out["environment"]["reason"]


def test_tests_that_genuinely_fail_on_the_base_are_still_failures(
    roots: tuple[Path, Path], mirror: PackageMirror
) -> None:
    """A test importing a module its own repository lacks fails (ModuleNotFoundError in the test): the bug."""
    failing = "import frogdep\n\ndef test_value():\n    assert frogdep.VALUE == 41\n"
    checkout = repo(roots[0].parent / "checkout", "frogdep==1.0\n", test=failing,
                    extra={".frogfix.yml": "test_command: python3 -m pytest -q\n"})
    out, calls = fix(checkout, roots, {"FROGFIX_PIP_INDEX_URL": mirror.url_with_credentials}, turns=1)
    assert out["status"] != "environment_error" and calls >= 1, out
    assert out["tests"]["before"]["exit_code"] == 1, out["tests"]


def test_the_resolved_pins_name_pytest_when_the_test_command_runs_it(
    roots: tuple[Path, Path], mirror: PackageMirror
) -> None:
    settings = settings_for(roots, mirror)
    checkout = repo(settings.resolved_workspace_dir() / "checkout", "frogdep==1.0\n", test=USES_FROGDEP)
    report = environments(settings).for_checkout(checkout, "python3 -m pytest -q", None, None)
    assert report.ok and report.path is not None, report.reason
    listed = subprocess.run(["ls", str(next(report.path.glob("lib/python3*/site-packages")))], capture_output=True,
                            text=True, check=True).stdout
    assert "pytest" in listed and "frogdep" in listed
