"""Each evidence level through `manage.py fix --json`, on small real repositories, real pytest, bubblewrap.

The bug: `clamp(x, low, high)` never applies `high`. The existing tests pass on the base (none covers
it), so only a test the patch brings can show the bug: the reproduction (worker/attempts/evidence.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.doubles.openai_server import ScriptedOpenAIServer, assistant, text_call
from tests.fix.sample_repo import git
from tests.fix.test_fix_command import run_fix, workspace_dir

MATHX = '''def clamp(x, low, high):
    return max(low, x)


def double(x):
    return 2 * x
'''
EXISTING = '''from mathx import clamp, double


def test_clamp_low():
    assert clamp(-5, 0, 10) == 0


def test_double():
    assert double(3) == 6
'''
BROKEN_ELSEWHERE = '''def test_known_broken():
    assert "unrelated" == "fixed one day"
'''
REGRESSION_TEST = '''from mathx import clamp


def test_clamp_high():
    assert clamp(50, 0, 10) == 10
'''
FIX = text_call(
    "Edit", file_path="mathx.py", old_string="return max(low, x)", new_string="return min(high, max(low, x))"
)
ADD_TEST = text_call("Write", file_path="tests/test_clamp_high.py", content=REGRESSION_TEST)
# "Fixes" clamp and breaks double, which a test that passed on the base covers.
BREAK = text_call("Write", file_path="mathx.py", content=MATHX.replace("max(low, x)", "min(high, max(low, x))")
                  .replace("2 * x", "x + x + 1"))


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    for name in ("data", "data2"):
        shutil.rmtree(workspace_dir(tmp_path / name), ignore_errors=True)


def repository(root: Path, broken_elsewhere: bool = False) -> Path:
    repo = root / "mathx"
    (repo / "tests").mkdir(parents=True)
    (repo / "mathx.py").write_text(MATHX)
    (repo / "tests" / "test_mathx.py").write_text(EXISTING)
    (repo / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    if broken_elsewhere:
        (repo / "tests" / "test_other.py").write_text(BROKEN_ELSEWHERE)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "mathx")
    return repo


def fix(repo: Path, data: Path, *turns: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    with ScriptedOpenAIServer([*(assistant(t) for t in turns), assistant("Fixed clamp().")]) as server:
        proc = run_fix(repo, data, server.base_url, "--json")
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


@pytest.mark.bwrap
def test_a_fix_with_its_regression_test_is_reproduced(tmp_path: Path) -> None:
    code, out = fix(repository(tmp_path), tmp_path / "data", FIX, ADD_TEST)
    evidence = out["evidence"]
    assert evidence["level"] == "reproduced" and out["status"] == "fixed" and code == 0, evidence
    assert evidence["reproduction"] == {
        "tests": ["tests/test_clamp_high.py::test_clamp_high"], "failed_on_base": True, "ran": True,
        "files": ["tests/test_clamp_high.py"],
    }
    # Before the fix, for a test the patch brings, is the reproduction: it failed there.
    assert evidence["fail_to_pass"] == ["tests/test_clamp_high.py::test_clamp_high"]
    assert evidence["pass_to_fail"] == [] and evidence["per_test"] is True
    assert "assert 50 == 10" in out["tests"]["reproduction"]["log"]  # its failure on the base source


@pytest.mark.bwrap
def test_a_fix_without_a_test_is_unproven(tmp_path: Path) -> None:
    code, out = fix(repository(tmp_path), tmp_path / "data", FIX)
    evidence = out["evidence"]
    assert evidence["level"] == "unproven" and out["status"] == "unproven" and code == 4, evidence
    assert evidence["reproduction"]["ran"] is False and any(f.startswith("not reproduced") for f in out["flags"])


@pytest.mark.bwrap
def test_a_patch_that_breaks_a_passing_test_is_regressed(tmp_path: Path) -> None:
    code, out = fix(repository(tmp_path), tmp_path / "data", BREAK, ADD_TEST)
    evidence = out["evidence"]
    assert evidence["level"] == "regressed" and out["status"] == "no_fix" and code == 1, evidence
    assert evidence["pass_to_fail"] == ["tests/test_mathx.py::test_double"]
    assert evidence["reproduction"]["tests"] == ["tests/test_clamp_high.py::test_clamp_high"]  # yet it regressed


@pytest.mark.bwrap
def test_a_pre_existing_failure_does_not_block_a_reproduced_fix(tmp_path: Path) -> None:
    code, out = fix(repository(tmp_path, broken_elsewhere=True), tmp_path / "data", FIX, ADD_TEST)
    evidence = out["evidence"]
    assert out["tests"]["before"]["exit_code"] == 1 and out["tests"]["after"][0]["exit_code"] == 1  # exit codes: no
    assert evidence["level"] == "reproduced" and out["status"] == "fixed" and code == 0, evidence
    assert evidence["still_failing"] == ["tests/test_other.py::test_known_broken"]
    assert evidence["fail_to_pass"] == ["tests/test_clamp_high.py::test_clamp_high"]


@pytest.mark.bwrap
def test_fix_runs_every_attempt_and_reports_the_one_the_evidence_chose(tmp_path: Path) -> None:
    """FROGFIX_ATTEMPTS=3: an unproven fix, a regression, then the fix with its regression test. The old
    rule took the first that passed; `fix --json` now lists each attempt with its evidence and `chosen`."""
    turns = [assistant(FIX), assistant("Fixed clamp()."),
             assistant(BREAK), assistant(ADD_TEST), assistant("Fixed clamp(), tidied double()."),
             assistant(FIX), assistant(ADD_TEST), assistant("Fixed clamp() with a test.")]
    with ScriptedOpenAIServer(turns) as server:
        proc = run_fix(repository(tmp_path), tmp_path / "data", server.base_url, "--json",
                       env_extra={"FROGFIX_ATTEMPTS": "3"})
    assert proc.stdout, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    levels = [(a["number"], a["evidence"]["level"], a["chosen"]) for a in out["attempts"]]
    assert levels == [(1, "unproven", False), (2, "regressed", False), (3, "reproduced", True)], levels
    assert out["status"] == "fixed" and proc.returncode == 0 and out["evidence"]["level"] == "reproduced"
    assert out["selection"]["chosen"] == 3 and "tests/test_clamp_high.py" in out["patch"]
    assert out["trajectory"].endswith("-run-1-3.json") and Path(out["trajectory"]).is_file()
    assert all(a["usage"]["prompt_tokens"] > 0 for a in out["attempts"])
    assert out["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in out["attempts"])
