#!/usr/bin/env python3
"""bench/selection: how much of pass@k the selection rule publishes, over simulated attempts.

No model and no sandbox: each task's k attempts are drawn from a seeded random.Random, turned
into the `Candidate`s and the cross-check outcomes the pipeline would see, and ranked by the rule
itself (app/selection.py `choose`, with the runs `cross_checks` asks for). Printed per mix,
for k = 1, 2, 4, 8 (each trial draws 8 attempts; k takes the first k):
- pass@1: the share of attempts whose patch is right;
- pass@k: the share of tasks where some attempt of the first k is right (what the attempts contain);
- chosen: the share of tasks where the attempt `choose` publishes is right;
- first-verified: the same for the rule before issue 24, the baseline computed in the same run: the
  first attempt whose level is reproduced or failed_before, else the first publishable unproven one;
- chosen / pass@k (how much the selection recovers) and chosen / first-verified.
Target (issue 24): at k = 8, chosen >= 0.9 x pass@8 in every target mix: PASS or FAIL per mix, and
the exit status is 1 when any target mix fails. Mixes marked "info" are outside the target (they
show where no rule can tell right from wrong) and are printed, never gated.

The model, each knob a field of `Mix` (printed with the mix):
- Difficulty varies by task: a task's per-attempt solve probability is drawn from a Beta
  distribution with mean `p` and concentration `spread` (a + b); a small spread makes pass@k grow
  slowly with k, as measured: spread 0.37 gives FrogNano-4B's card (pass@1 0.615, pass@3 0.71),
  spread 0.55 with p 0.46 CodeMonkeys' (pass@1 0.46, pass@10 about 0.70).
- The task: with probability `suite_fails` its suite already has a test that fails on the base
  and that a right patch makes pass (`t_base`); otherwise nothing fails before the fix.
- A right patch (probability the task's p) never regresses and passes the suite. With probability
  `writes_test` it adds a test that fails on the base and passes with it: `reproduced` (that
  test, and `t_base` when the suite fails, are its fail-to-pass set); otherwise `failed_before`
  when the suite fails (fail-to-pass {t_base}), else `unproven`.
- A wrong patch passes the whole suite with probability `lucky` (a lucky pass); among those,
  `lucky_repro` add a wrong test that fails on the base and passes with their own wrong fix
  (`reproduced`, fail-to-pass {that test}); of the rest, on a task whose suite fails,
  `lucky_fb` make `t_base` pass without fixing the bug (`failed_before`, fail-to-pass {t_base}:
  the same set as a right patch's without a test, so with no cross-check they agree with it);
  the others are `unproven` (no test, nothing fixed, everything passes). An unlucky wrong patch is
  never publishable: `regress` of them break a test that passed (`regressed`), the rest leave
  tests failing or give no patch.
- Cross-checks (patch A with B's reproduction tests; only the pairs `cross_checks` returns are
  run, each drawn once per trial): a right patch passes another right patch's tests with
  probability `right_agree` (a test may lean on details of its own fix); a wrong patch passes a
  right patch's tests with probability `wrong_passes_right` (0: it does not fix the bug); a right
  patch never passes a wrong test (the wrong test expects the wrong behaviour); a wrong patch
  passes another wrong patch's test with probability `wrong_agree` (the same wrong idea twice).
- Patch size: changed lines drawn from one log-normal distribution (median about 10 lines) for
  every patch, a wrong one's scaled by `wrong_size` (1: no size signal either way).

Usage: python bench/selection.py [--quick] [--trials 20000] [--seed 24]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.selection import Candidate, Pair, choose, cross_checks  # noqa: E402
from app.statuses import EvidenceLevel  # noqa: E402

KS = (1, 2, 4, 8)
TARGET_K = 8
TARGET = 0.9  # chosen >= TARGET x pass@TARGET_K
TRIALS = 20_000
QUICK_TRIALS = 2_000
SEED = 24
BASE_TEST = "tests/test_bug.py::test_reported"  # the suite's test that fails on the base (when one does)


@dataclass(frozen=True)
class Mix:
    """One simulated population of tasks and attempts (see the module's docstring for each knob)."""

    name: str
    p: float  # mean per-attempt probability that the patch is right
    spread: float = 0.37  # Beta concentration of a task's p (math.inf: every task has p)
    suite_fails: float = 0.5  # the suite has a test failing on the base that a right patch fixes
    writes_test: float = 0.7  # a right patch adds a test that fails on the base (reproduced)
    lucky: float = 0.35  # a wrong patch passes the whole suite
    lucky_repro: float = 0.1  # of lucky wrong patches: adds a wrong test failing on the base (reproduced)
    lucky_fb: float = 0.3  # of the other lucky ones, when the suite fails: makes t_base pass (failed_before)
    regress: float = 0.3  # of unlucky wrong patches: break a passing test (regressed)
    right_agree: float = 0.95  # a right patch passes another right patch's reproduction tests
    wrong_passes_right: float = 0.0  # a wrong patch passes a right patch's reproduction tests
    wrong_agree: float = 0.05  # a wrong patch passes another wrong patch's reproduction tests
    wrong_size: float = 1.0  # a wrong patch's changed lines, relative to a right one's
    target: bool = True  # gated by TARGET (False: printed for information)

    def knobs(self) -> str:
        shown = (f for f in fields(self) if f.name not in ("name", "target"))
        return ", ".join(f"{f.name}={getattr(self, f.name):g}" for f in shown)


MIXES: tuple[Mix, ...] = (
    # The target mixes: the pass rates published for real models, the default lucky rates.
    Mix("FrogNano-4B card", p=0.615),
    Mix("CodeMonkeys-like", p=0.46, spread=0.55, lucky=0.4),
    Mix("weak model, many lucky passes", p=0.3, spread=0.5, lucky=0.5),
    # Stress mixes, printed for information: where the evidence cannot tell right from wrong.
    Mix("info: right patches write fewer tests, wrong ones more", p=0.3, spread=0.5, lucky=0.5, lucky_repro=0.15,
        writes_test=0.5, target=False),
    Mix("info: wrong patches smaller and agreeing", p=0.46, spread=0.55, lucky=0.5, lucky_repro=0.2,
        lucky_fb=0.5, wrong_agree=0.2, wrong_passes_right=0.05, right_agree=0.8, wrong_size=0.6, target=False),
    Mix("info: few tests written, little fails before", p=0.46, spread=0.55, suite_fails=0.2, writes_test=0.2,
        lucky=0.5, target=False),
)


@dataclass
class Attempt:
    """One simulated attempt: whether its patch is right, and the candidate the rule sees."""

    right: bool
    candidate: Candidate


def task_probability(mix: Mix, rng: random.Random) -> float:
    if math.isinf(mix.spread):
        return mix.p
    return rng.betavariate(mix.p * mix.spread, (1 - mix.p) * mix.spread)


def _lines(mix: Mix, rng: random.Random, right: bool) -> int:
    size = rng.lognormvariate(math.log(10), 0.8) * (1.0 if right else mix.wrong_size)
    return max(1, round(size))


def simulate_attempt(mix: Mix, rng: random.Random, number: int, p: float, suite_fails: bool) -> Attempt:
    """One attempt of a task whose per-attempt solve probability is `p`."""
    right = rng.random() < p
    lines = _lines(mix, rng, right)
    none: frozenset[str] = frozenset()
    base = frozenset({BASE_TEST}) if suite_fails else none
    if right:
        own = frozenset({f"tests/test_attempt_{number}.py::test_repro"}) if rng.random() < mix.writes_test else none
        level = EvidenceLevel.reproduced if own else EvidenceLevel.failed_before if base else EvidenceLevel.unproven
        return Attempt(True, Candidate(number, level, True, own | base, none, own, lines))
    if rng.random() < mix.lucky:
        if rng.random() < mix.lucky_repro:
            own = frozenset({f"tests/test_attempt_{number}.py::test_wrong"})
            return Attempt(False, Candidate(number, EvidenceLevel.reproduced, True, own, none, own, lines))
        if base and rng.random() < mix.lucky_fb:
            return Attempt(False, Candidate(number, EvidenceLevel.failed_before, True, base, none, none, lines))
        return Attempt(False, Candidate(number, EvidenceLevel.unproven, True, changed_lines=lines))
    if rng.random() < mix.regress:
        broken = frozenset({"tests/test_other.py::test_passing"})
        return Attempt(False, Candidate(number, EvidenceLevel.regressed, False, none, broken, none, lines))
    return Attempt(False, Candidate(number, None, False, changed_lines=lines))  # tests fail, or no patch


def simulate_task(mix: Mix, rng: random.Random, k: int) -> list[Attempt]:
    p = task_probability(mix, rng)
    suite_fails = rng.random() < mix.suite_fails
    return [simulate_attempt(mix, rng, n, p, suite_fails) for n in range(1, k + 1)]


@dataclass
class CrossRuns:
    """The cross-check outcomes of one task's attempts, each pair drawn once (the same run for every k)."""

    mix: Mix
    rng: random.Random
    attempts: Sequence[Attempt]
    drawn: dict[Pair, bool] = field(default_factory=dict)

    def outcome(self, pair: Pair) -> bool:
        if pair not in self.drawn:
            patch, tests = self.attempts[pair[0] - 1].right, self.attempts[pair[1] - 1].right
            if patch and tests:
                chance = self.mix.right_agree
            elif tests:
                chance = self.mix.wrong_passes_right
            elif patch:
                chance = 0.0  # a right patch fails a wrong test
            else:
                chance = self.mix.wrong_agree
            self.drawn[pair] = self.rng.random() < chance
        return self.drawn[pair]

    def cross(self, candidates: Sequence[Candidate]) -> dict[Pair, bool]:
        """What the pipeline would run for these candidates, and what those runs say."""
        return {pair: self.outcome(pair) for pair in cross_checks(candidates)}


def first_verified(candidates: Sequence[Candidate]) -> int | None:
    """The rule before issue 24: the first verified attempt (reproduced or failed_before), else the first
    publishable unproven one."""
    proven = (EvidenceLevel.reproduced, EvidenceLevel.failed_before)
    for levels in (proven, (EvidenceLevel.unproven,)):
        found = next((c.number for c in candidates if c.publishable and c.level in levels), None)
        if found is not None:
            return found
    return None


@dataclass
class Row:
    """One k's counts over the trials of a mix."""

    k: int
    trials: int = 0
    attempts: int = 0
    right_attempts: int = 0
    any_right: int = 0
    chosen_right: int = 0
    first_right: int = 0

    @property
    def pass1(self) -> float:
        return self.right_attempts / self.attempts if self.attempts else 0.0

    @property
    def pass_k(self) -> float:
        return self.any_right / self.trials if self.trials else 0.0

    @property
    def chosen(self) -> float:
        return self.chosen_right / self.trials if self.trials else 0.0

    @property
    def first(self) -> float:
        return self.first_right / self.trials if self.trials else 0.0

    @property
    def recovered(self) -> float:
        """chosen / pass@k."""
        return self.chosen / self.pass_k if self.pass_k else float("nan")

    @property
    def over_baseline(self) -> float:
        """chosen / first-verified."""
        return self.chosen / self.first if self.first else float("nan")


def run_mix(mix: Mix, trials: int, seed: int, ks: Sequence[int] = KS) -> dict[int, Row]:
    """Every k's figures for `mix` over `trials` simulated tasks (max(ks) attempts each, k takes the first k)."""
    rng = random.Random(f"{seed}:{mix.name}")
    rows = {k: Row(k) for k in ks}
    kmax = max(ks)
    for _ in range(trials):
        attempts = simulate_task(mix, rng, kmax)
        runs = CrossRuns(mix, rng, attempts)
        for k, row in rows.items():
            first_k = attempts[:k]
            candidates = [a.candidate for a in first_k]
            chosen = choose(candidates, runs.cross(candidates)).chosen
            baseline = first_verified(candidates)
            row.trials += 1
            row.attempts += k
            row.right_attempts += sum(a.right for a in first_k)
            row.any_right += any(a.right for a in first_k)
            row.chosen_right += chosen is not None and attempts[chosen - 1].right
            row.first_right += baseline is not None and attempts[baseline - 1].right
    return rows


def verdict(mix: Mix, rows: dict[int, Row]) -> tuple[bool, str]:
    """Whether the mix meets the target, and the line that says so."""
    row = rows[TARGET_K]
    ok = row.chosen >= TARGET * row.pass_k
    outcome = ("PASS" if ok else "FAIL") if mix.target else "info (not gated)"
    line = (f"  target at k = {TARGET_K}: chosen {row.chosen:.3f} >= {TARGET:g} x pass@{TARGET_K} "
            f"{row.pass_k:.3f} = {TARGET * row.pass_k:.3f}: {outcome}")
    return ok or not mix.target, line


def print_mix(mix: Mix, rows: dict[int, Row], trials: int) -> bool:
    worst = max(math.sqrt(r.chosen * (1 - r.chosen) / r.trials) for r in rows.values())
    print(f"\n{mix.name} ({trials} trials; standard error of each rate <= {worst:.4f})")
    print(f"  {mix.knobs()}")
    print(f"  {'k':>2} {'pass@1':>7} {'pass@k':>7} {'chosen':>7} {'first-verified':>15} "
          f"{'chosen/pass@k':>14} {'chosen/first-verified':>22}")
    for r in rows.values():
        print(f"  {r.k:>2} {r.pass1:>7.3f} {r.pass_k:>7.3f} {r.chosen:>7.3f} {r.first:>15.3f} "
              f"{r.recovered:>14.3f} {r.over_baseline:>22.3f}")
    ok, line = verdict(mix, rows)
    print(line)
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_TRIALS} trials a mix instead of {TRIALS}")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    trials = args.trials or (QUICK_TRIALS if args.quick else TRIALS)
    print(f"selection over simulated attempts: app/selection.choose vs first-verified-wins, seed {args.seed}")
    failed = [mix.name for mix in MIXES if not print_mix(mix, run_mix(mix, trials, args.seed), trials)]
    print(f"\n{'FAIL: ' + ', '.join(failed) if failed else 'PASS'}: chosen >= {TARGET:g} x pass@{TARGET_K} "
          f"in {'all but ' + str(len(failed)) + ' of ' if failed else 'all '}"
          f"{sum(m.target for m in MIXES)} target mixes")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
