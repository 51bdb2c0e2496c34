"""chosen@k: the solve rate of the attempt the selection rule (app/selection.py) publishes among k attempts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.evaluation_report import attempt_evidence, build_report, candidate_of, chosen_share, to_markdown
from app.jobs import evaluations as ev_records
from app.statuses import EvidenceLevel
from tests.eval.conftest import Candidate, recorded_job
from worker.commands.evaluate import EvalOptions, evaluate, load_report

BUG, OTHER = "tests/test_calc.py::test_divide", "tests/test_calc.py::test_other"


def _result(task: str, attempt: int, outcome: str, evidence: dict[str, Any] | None) -> dict[str, Any]:
    return {"task": task, "attempt": attempt, "solved": outcome == "verified", "outcome": outcome,
            "exit_reason": "agent", "steps": 3, "prompt_tokens": 10, "completion_tokens": 1, "cached_tokens": 0,
            "model_seconds": 0.5, "wall_seconds": 1.0, "trajectory": None, "reason": "", "evidence": evidence}


def reproduced(task: str, attempt: int, lines: int) -> dict[str, Any]:
    own = [f"tests/test_attempt_{attempt}.py::test_repro"]
    return _result(task, attempt, "verified", attempt_evidence("reproduced", True, own, [], own, lines))


def failed_before(task: str, attempt: int, lines: int, fixed: str = BUG) -> dict[str, Any]:
    return _result(task, attempt, "verified", attempt_evidence("failed_before", True, [fixed], [], [], lines))


def unproven(task: str, attempt: int, lines: int) -> dict[str, Any]:
    """A patch that passes every test and proves nothing: publishable as a draft, never solved."""
    return _result(task, attempt, "unproven", attempt_evidence("unproven", True, [], [], [], lines))


def refused(task: str, attempt: int) -> dict[str, Any]:
    return _result(task, attempt, "refused", attempt_evidence(None, False, [], [], [], 4))


def regressed(task: str, attempt: int) -> dict[str, Any]:
    return _result(task, attempt, "not_verified", attempt_evidence("regressed", False, [BUG], [OTHER], [], 1))


TASKS = [{"key": k, "project": "p", "recorded_solved": False} for k in ("1", "2", "3", "4")]


def _report() -> dict[str, Any]:
    results = [
        # 1: the small unproven patch first, the reproduced one second, then nothing: chosen = 2.
        unproven("1", 1, 2), reproduced("1", 2, 30), refused("1", 3),
        # 2: three verified patches; 1 and 2 make the same test pass (they agree): the smaller of them, 2.
        failed_before("2", 1, 50), failed_before("2", 2, 10), failed_before("2", 3, 1, fixed=OTHER),
        # 3: nothing verified: the unproven draft would be published, unsolved; a regression never.
        regressed("3", 1), unproven("3", 2, 8), refused("3", 3),
        # 4: recorded before eval stored evidence: judged by the verdict alone.
        _result("4", 1, "no_patch", None), _result("4", 2, "verified", None), _result("4", 3, "unproven", None),
    ]
    return build_report({"id": 9, "model": "m", "attempts": 3, "status": "finished", "tasks": TASKS}, results)


def test_chosen_at_k_is_the_rule_s_choice_averaged_over_every_k_of_a_task_s_attempts() -> None:
    report = _report()
    rows = {r["task"]: r for r in report["tasks"]}
    assert {key: r["chosen_attempt"] for key, r in rows.items()} == {"1": 2, "2": 2, "3": 2, "4": 2}
    # Task 1: alone, attempt 2 is solved (1 of 3); of two, {1,2} and {2,3} choose it, {1,3} chooses the
    # unproven 1 (2 of 3); of all three, 2.
    assert rows["1"]["chosen_by_k"] == [pytest.approx(1 / 3, abs=1e-4), pytest.approx(2 / 3, abs=1e-4), 1.0]
    assert rows["2"]["chosen_by_k"] == [1.0, 1.0, 1.0] and rows["3"]["chosen_by_k"] == [0.0, 0.0, 0.0]
    assert rows["4"]["chosen_by_k"] == [pytest.approx(1 / 3, abs=1e-4), pytest.approx(2 / 3, abs=1e-4), 1.0]

    cand = report["candidate"]
    chosen = [cand[f"chosen@{k}"]["value"] for k in (1, 2, 3)]
    means = ((1 / 3 + 1 + 0 + 1 / 3) / 4, (2 / 3 + 1 + 0 + 2 / 3) / 4, (1 + 1 + 0 + 1) / 4)
    assert chosen == [pytest.approx(v, abs=1e-4) for v in means]
    assert chosen[1] > cand["pass@1"]["value"] and chosen[2] > chosen[1]  # more attempts, more solved choices
    # Solved means the attempt's own evidence proves the fix, and the rule ranks those first: whenever an
    # attempt among the k is solved, the chosen one is. So chosen@k meets pass@k exactly (the unbiased
    # estimator is the same average over the k-subsets).
    assert chosen == [pytest.approx(cand[f"pass@{k}"]["value"], abs=1e-4) for k in (1, 2, 3)]
    assert cand["chosen@2"]["ci95"] is not None and "no cross-check runs" in cand["chosen@2"]["method"]
    assert report["selection"] == {"rule": "app/selection.py", "cross_checks": False, "chosen_over_pass": 1.0,
                                   "attempts_without_evidence": 3}


def test_the_markdown_puts_chosen_at_k_beside_pass_at_k_and_says_what_it_is() -> None:
    md = to_markdown(_report())
    lines = md.splitlines()
    at = lines.index(next(line for line in lines if line.startswith("| pass@2 ")))
    assert lines[at + 1].startswith("| chosen@2 (bootstrap 95%) | 0.58 [") and lines[at + 1].endswith(" | n/a |")
    assert lines[at - 1].startswith("| chosen@1 (bootstrap 95%) | 0.42 [")
    assert "Eval runs no cross-check between attempts, so two attempts agree only when neither adds a reproduction " \
           "test and both make the same tests pass." in md
    assert "chosen@3 / pass@3: 1.00" in md
    assert "Attempts recorded before eval stored their evidence (3) are judged by their verdict alone." in md
    assert "\n\n\n" not in md


def test_a_report_without_chosen_figures_still_renders() -> None:
    """A report saved before chosen@k (an `--out` report.json read back) renders as before."""
    report = _report()
    for k in (1, 2, 3):
        del report["candidate"][f"chosen@{k}"]
    del report["selection"]
    md = to_markdown(report)
    assert "chosen@" not in md and "| pass@3 (bootstrap 95%) |" in md


def test_candidates_come_from_the_stored_evidence() -> None:
    c = candidate_of(reproduced("1", 4, 12))
    assert (c.number, c.level, c.publishable, c.changed_lines) == (4, EvidenceLevel.reproduced, True, 12)
    assert c.reproduction == c.fail_to_pass == {"tests/test_attempt_4.py::test_repro"}
    assert not candidate_of(regressed("3", 1)).eligible and candidate_of(regressed("3", 1)).pass_to_fail
    odd = _result("5", 1, "verified", {"level": "from-a-newer-frogfix", "publishable": True})
    assert candidate_of(odd).level is None and not candidate_of(odd).eligible
    assert candidate_of(_result("5", 2, "verified", None)).level == EvidenceLevel.failed_before
    assert candidate_of(_result("5", 3, "unproven", None)).level == EvidenceLevel.unproven
    assert not candidate_of(_result("5", 4, "not_verified", None)).eligible
    assert len(attempt_evidence("regressed", False, [], [f"t{i}" for i in range(500)], [], 1)["pass_to_fail"]) == 100


def test_many_attempts_sample_their_subsets_with_a_fixed_seed() -> None:
    results = [unproven("7", n, 1) if n % 3 else reproduced("7", n, 5) for n in range(1, 13)]  # C(12, 6) = 924
    share = chosen_share("7", results, 6)
    assert share == chosen_share("7", results, 6) and 0.9 < share <= 1.0  # 4 of 12 solved: 1 - C(8,6)/C(12,6)
    assert chosen_share("7", results, 12) == 1.0 and chosen_share("7", results, 1) == pytest.approx(4 / 12)


@pytest.mark.bwrap
def test_each_live_attempt_stores_the_evidence_the_rule_reads(local_env: dict[str, Any], tmp_path: Path) -> None:
    task = recorded_job(tmp_path / "a", solved=True)
    evaluation_id, status, _ = evaluate(
        EvalOptions("candidate-chosen", "http://model.invalid/v1", attempts=2), models=Candidate({(task, 2)})
    )
    assert status == "finished"
    with session_scope() as session:
        stored = {r.attempt: r.evidence for r in ev_records.evaluation_results(session, evaluation_id)}
    # Attempt 1 gave up (no patch); attempt 2 fixed the bug, its evidence as worker/attempts/evidence.py judged it.
    assert stored[1] == attempt_evidence(None, False, [], [], [], 0)
    fixed = stored[2]
    assert fixed["level"] in ("reproduced", "failed_before") and fixed["publishable"] and fixed["fail_to_pass"]
    assert fixed["pass_to_fail"] == [] and fixed["changed_lines"] > 0
    assert (fixed["level"] == "reproduced") == bool(fixed["reproduction"])
    report = load_report(evaluation_id)
    assert report["tasks"][0]["chosen_attempt"] == 2 and report["selection"]["attempts_without_evidence"] == 0
    assert report["candidate"]["chosen@1"]["value"] == 0.5 and report["candidate"]["chosen@2"]["value"] == 1.0
