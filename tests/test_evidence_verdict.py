"""The one verdict (worker/attempts/evidence.py) as a pure function. Results channel: tests/test_run_checks.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.statuses import EvidenceLevel
from worker.attempts.evidence import RunOutcome, evidence_line, judge, patch_test_files

P, F, E, S = "passed", "failed", "error", "skipped"


def run(tests: dict[str, str] | None, exit_code: int = 0, started: bool = True) -> RunOutcome:
    return RunOutcome(exit_code, started, tests)


def test_each_level_in_its_order() -> None:
    base = run({"t::a": P, "t::b": F, "t::c": F}, 1)
    # b fixed, c still failing, a kept: failed_before; c does not block.
    found = judge(base, [run({"t::a": P, "t::b": P, "t::c": F}, 1)], None, [])
    assert (found.level, found.fail_to_pass, found.still_failing, found.pass_to_fail) == (
        EvidenceLevel.failed_before, ["t::b"], ["t::c"], []
    )
    assert found.proves_fix
    # A regression wins over everything else, a reproduction included.
    repro = run({"t::a": P, "tests/test_new.py::x": F}, 1)
    after = run({"t::a": F, "tests/test_new.py::x": P}, 1)
    found = judge(run({"t::a": P}), [after], repro, ["tests/test_new.py"])
    assert found.level == EvidenceLevel.regressed and found.pass_to_fail == ["t::a"] and not found.proves_fix
    assert found.reproduction.tests == ["tests/test_new.py::x"]
    # The reproduction: the patch's test fails on the base source, passes with the fix.
    found = judge(run({"t::a": P}), [run({"t::a": P, "tests/test_new.py::x": P})], repro, ["tests/test_new.py"])
    assert found.level == EvidenceLevel.reproduced and found.reproduction.failed_on_base
    assert found.fail_to_pass == ["tests/test_new.py::x"]
    # Nothing failed and nothing reproduces: unproven.
    found = judge(run({"t::a": P}), [run({"t::a": P})], None, [])
    assert found.level == EvidenceLevel.unproven and not found.proves_fix
    # A new test the patch brings that passes on the base source too reproduces nothing.
    found = judge(run({"t::a": P}), [run({"t::a": P, "tests/test_new.py::x": P})],
                  run({"t::a": P, "tests/test_new.py::x": P}), ["tests/test_new.py"])
    assert found.level == EvidenceLevel.unproven and found.reproduction.ran and not found.reproduction.tests
    # Tests that could not run with the patch: unrunnable.
    found = judge(run({"t::a": P}), [run(None, 4, started=False)], None, [])
    assert found.level == EvidenceLevel.unrunnable


def test_a_flaky_test_is_neither_a_regression_nor_a_proof() -> None:
    base = run({"t::a": P, "t::f": F}, 1)
    runs = [run({"t::a": P, "t::f": P}), run({"t::a": P, "t::f": F}, 1)]
    found = judge(base, runs, None, [])
    assert found.flaky == ["t::f"] and found.fail_to_pass == [] and found.level == EvidenceLevel.unproven
    runs = [run({"t::a": F, "t::f": P}, 1), run({"t::a": P, "t::f": P})]
    found = judge(run({"t::a": P, "t::f": P}), runs, None, [])
    assert found.flaky == ["t::a"] and found.pass_to_fail == [] and found.level == EvidenceLevel.unproven


def test_exit_codes_alone_when_a_run_has_no_report() -> None:
    assert judge(run(None, 1), [run(None, 0)], None, []).level == EvidenceLevel.failed_before
    assert judge(run(None, 0), [run(None, 1)], None, []).level == EvidenceLevel.regressed
    assert judge(run(None, 0), [run(None, 0)], run(None, 1), ["tests/t.py"]).level == EvidenceLevel.reproduced
    assert judge(run(None, 0), [run(None, 0)], None, []).level == EvidenceLevel.unproven
    assert judge(run(None, 1), [run(None, 0), run(None, 1)], None, []).level == EvidenceLevel.unproven
    assert judge(run(None, 1), [run(None, 1)], None, []).level == EvidenceLevel.unproven
    assert "evidence: unproven" in evidence_line(judge(run(None, 1), [run(None, 1)], None, []))


def test_the_patch_test_files_are_tests_and_their_data() -> None:
    paths = ["src/mod.py", "tests/test_mod.py", "tests/data/case.json", "pkg/test_x.py", "pkg/x_test.py", "README"]
    assert patch_test_files(paths) == ["tests/test_mod.py", "tests/data/case.json", "pkg/test_x.py", "pkg/x_test.py"]


@pytest.mark.parametrize("level", list(EvidenceLevel))
def test_only_reproduced_and_failed_before_prove_a_fix(level: EvidenceLevel) -> None:
    from worker.attempts.evidence import Evidence

    assert Evidence(level).proves_fix == (level in (EvidenceLevel.reproduced, EvidenceLevel.failed_before))


def test_the_job_page_shows_only_a_well_formed_verdict() -> None:
    from app.web.views import evidence_of

    assert evidence_of(None) is None and evidence_of({"evidence": "reproduced"}) is None
    assert evidence_of({"evidence": {"level": 3}}) is None
    shown = evidence_of({"evidence": {"level": "reproduced", "fail_to_pass": ["t::a", 7],
                                      "reproduction": {"tests": ["t::a"]}, "reason": None}})
    assert shown == {"level": "reproduced", "reason": "", "fail_to_pass": ["t::a", "7"], "pass_to_fail": [],
                     "still_failing": [], "flaky": [], "reproduction": {"tests": ["t::a"]}}


CHILD_TEST = '''import os, subprocess, sys

def test_a_script_the_tests_start_imports_its_sibling(tmp_path):
    script = os.path.join(os.path.dirname(__file__), "live", "run.py")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}  # as werkzeug's dev_server fixture does
    done = subprocess.run([sys.executable, script], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == "sibling\\n", done.stderr
'''


def test_the_runner_guard_leaves_the_tests_own_scripts_their_usual_path(tmp_path: Path) -> None:
    """Found on werkzeug's real suite: its tests start `live_apps/run.py` with their own PYTHONPATH, which
    drops the guard's hook while PYTHONSAFEPATH stayed, so the script could not import its siblings and the
    suite hung. The guard still keeps a root `pytest.py` from running as the runner."""
    from worker.attempts.evidence import REPORT_ENV, RUNNER_GUARD
    from worker.attempts.run_checks import PLUGIN_MODULE, plugin_source

    (tmp_path / "tests" / "live").mkdir(parents=True)
    (tmp_path / "tests" / "test_child.py").write_text(CHILD_TEST)
    (tmp_path / "tests" / "live" / "run.py").write_text("import sibling_app\n")
    (tmp_path / "tests" / "live" / "sibling_app.py").write_text('print("sibling")\n')
    (tmp_path / "pytest.py").write_text('print("3 passed")\nraise SystemExit(0)\n')
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(RUNNER_GUARD)
    (hook / f"{PLUGIN_MODULE}.py").write_text(plugin_source({}))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "PYTHONPATH")}
    env.update(PYTHONSAFEPATH=REPORT_ENV["PYTHONSAFEPATH"], PYTHONPATH=str(hook))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, check=False, timeout=300)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-2000:]


def test_tampered_outranks_every_level_and_a_reach_in_caps_a_proof() -> None:
    base = run({"t::a": P, "t::b": F}, 1)
    why = "FrogFix's sentinel test that must fail was reported passed"
    forged = RunOutcome(0, True, {"t::a": P, "t::b": P}, tampered=why)
    found = judge(base, [forged], None, [])
    assert found.level == EvidenceLevel.tampered and not found.proves_fix and "sentinel" in found.reason
    # in the reproduction run too (the patch's tests alone can forge)
    assert judge(base, [run({"t::a": P, "t::b": P})], forged, ["t"]).level == EvidenceLevel.tampered
    honest = judge(base, [run({"t::a": P, "t::b": P})], None, [])
    assert honest.level == EvidenceLevel.failed_before
    capped = judge(base, [run({"t::a": P, "t::b": P})], None, [], reach_in=["m.py imports the test runner's internals"])
    assert capped.level == EvidenceLevel.unproven and "reaches into the test runner" in capped.reason
    assert capped.publishable_unproven  # every test passes: a draft marked "not reproduced", flagged in bold
    # A run that exits 0 and sends nothing, where the base's did: forged.
    silent = judge(base, [run(None, 0)], None, [])
    assert silent.level == EvidenceLevel.tampered and "sent no results" in silent.reason
    # The base's own run failing a check: the project cannot be checked, so nothing is called forgery.
    odd_base = RunOutcome(1, True, {"t::a": P, "t::b": F}, tampered="pytest's summary line says 3 passed")
    lenient = judge(odd_base, [forged], None, [])
    assert lenient.level == EvidenceLevel.failed_before and any("base commit" in c for c in lenient.checks)
