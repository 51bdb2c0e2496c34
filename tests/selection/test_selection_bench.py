"""bench/selection.py with few trials and a fixed seed: its figures keep the properties they must have."""

from __future__ import annotations

import math
import random

import pytest

from app.selection import Candidate
from app.statuses import EvidenceLevel
from bench.selection import MIXES, Mix, first_verified, main, run_mix, simulate_task, verdict

SEED = 5
# Right patches always add a reproduction test that other right patches pass; half the wrong ones that pass the
# suite add a wrong test that reproduces nothing real: the agreement between right attempts is what tells them apart.
AGREEING = Mix("agreeing", p=0.4, spread=math.inf, suite_fails=0.0, writes_test=1.0, lucky=0.6, lucky_repro=0.5,
               right_agree=1.0, wrong_agree=0.0)
# Nothing can tell right from wrong: no test added, nothing fails before, every wrong patch passes the suite.
BLIND = Mix("blind", p=0.4, spread=math.inf, suite_fails=0.0, writes_test=0.0, lucky=1.0, lucky_repro=0.0)


@pytest.mark.parametrize("mix", [*MIXES, AGREEING, BLIND], ids=lambda m: m.name)
def test_the_figures_are_consistent_in_every_mix(mix: Mix) -> None:
    rows = run_mix(mix, 300, SEED)
    assert list(rows) == [1, 2, 4, 8]
    one = rows[1]
    # A right patch is always publishable, so one attempt's choice is right exactly when the attempt is.
    assert one.chosen == one.pass_k == one.pass1 == one.first
    previous = 0.0
    for row in rows.values():
        assert row.trials == 300 and row.attempts == 300 * row.k
        assert row.chosen <= row.pass_k and row.first <= row.pass_k  # a rule can only pick a right one that is there
        assert row.pass_k >= previous  # the first k attempts hold the first k - 1
        previous = row.pass_k
        assert abs(row.pass1 - mix.p) < 0.1


def test_agreement_recovers_what_first_verified_wins_loses_to_lucky_passes() -> None:
    rows = run_mix(AGREEING, 400, SEED)
    assert rows[8].pass_k > 0.95
    assert rows[8].chosen >= 0.9 * rows[8].pass_k
    assert rows[8].chosen - rows[8].first > 0.15  # the old rule publishes the first lucky reproduced patch
    assert verdict(AGREEING, rows)[0]


def test_where_nothing_tells_right_from_wrong_the_target_fails() -> None:
    rows = run_mix(BLIND, 400, SEED)
    assert rows[8].pass_k > 0.95 and rows[8].chosen < 0.6
    ok, line = verdict(BLIND, rows)
    assert not ok and line.endswith("FAIL")
    ok, line = verdict(Mix("blind, for information", p=0.4, spread=math.inf, target=False), rows)
    assert ok and line.endswith("info (not gated)")


def test_runs_are_reproducible_from_the_seed() -> None:
    first, again, other = run_mix(MIXES[0], 200, SEED), run_mix(MIXES[0], 200, SEED), run_mix(MIXES[0], 200, SEED + 1)
    assert [vars(r) for r in first.values()] == [vars(r) for r in again.values()]
    assert [vars(r) for r in first.values()] != [vars(r) for r in other.values()]


def test_simulated_attempts_are_what_the_docstring_says() -> None:
    rng = random.Random(SEED)
    attempts = [a for _ in range(300) for a in simulate_task(MIXES[0], rng, 8)]
    for a in attempts:
        c = a.candidate
        if a.right:
            assert c.eligible and not c.pass_to_fail
            assert (c.level == EvidenceLevel.reproduced) == bool(c.reproduction)
        elif c.level == EvidenceLevel.regressed:
            assert c.pass_to_fail and not c.eligible
        if c.level == EvidenceLevel.reproduced:
            assert c.reproduction <= c.fail_to_pass
    assert any(not a.right and a.candidate.level == EvidenceLevel.reproduced for a in attempts)  # lucky reproduced
    assert any(not a.right and a.candidate.eligible and a.candidate.level == EvidenceLevel.unproven for a in attempts)


def test_first_verified_wins_is_the_old_rule() -> None:
    unproven = Candidate(1, EvidenceLevel.unproven, True, changed_lines=1)
    failing = Candidate(2, EvidenceLevel.unproven, False)
    proven = Candidate(3, EvidenceLevel.failed_before, True, frozenset({"t"}), changed_lines=90)
    reproduced = Candidate(4, EvidenceLevel.reproduced, True, frozenset({"r"}), frozenset(), frozenset({"r"}), 1)
    assert first_verified([unproven, failing, proven, reproduced]) == 3
    assert first_verified([failing, unproven]) == 1
    assert first_verified([failing]) is None


def test_the_script_prints_every_mix_and_exits_by_the_target(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--trials", "150", "--seed", str(SEED)])
    out = capsys.readouterr().out
    for mix in MIXES:
        assert f"\n{mix.name} (150 trials;" in out
    assert out.count("chosen/pass@k") == len(MIXES)
    assert out.count(": PASS\n") + out.count(": FAIL\n") == sum(m.target for m in MIXES)
    assert code == (1 if ": FAIL\n" in out else 0)
