"""Which attempt a job publishes: the rule, in one home (docs/EVIDENCE.md "Choosing among attempts").

Generating a right patch among k is easier than knowing which one it is, so the choice rests on
evidence a reviewer can check, in this order:

1. the evidence level: `reproduced` over `failed_before` over `unproven` (worker/attempts/evidence.py);
   a regressed, refused or failing attempt is never a candidate;
2. no regressions (a test that passed on the base and fails with the patch);
3. agreement: how many other candidates' reproduction tests (their own regression tests, the ones
   that fail on the base source) pass with this patch, each run over this patch's source changes
   (`cross_checks` says which runs are worth making; a candidate without reproduction tests
   agrees with another whose fail-to-pass tests are the same, non-empty set);
4. the smaller patch (changed lines);
5. the earlier attempt.

The pipeline, `fix`, `eval` and bench/selection.py call `choose`; nothing else ranks attempts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.patches import changed_lines_words
from app.statuses import EvidenceLevel

# Lower is better; levels absent here (tampered, regressed, unrunnable) never publish.
LEVEL_RANK: Mapping[EvidenceLevel, int] = {
    EvidenceLevel.reproduced: 0,
    EvidenceLevel.failed_before: 1,
    EvidenceLevel.unproven: 2,
}
Pair = tuple[int, int]  # (the attempt whose patch runs, the attempt whose reproduction tests run)


@dataclass(frozen=True)
class Candidate:
    """One attempt as the rule sees it: its evidence, and the size of its patch."""

    number: int
    level: EvidenceLevel | None  # None: never tested (refused, no patch)
    publishable: bool  # the attempt itself may be published (proven, or unproven with every test passing)
    fail_to_pass: frozenset[str] = frozenset()
    pass_to_fail: frozenset[str] = frozenset()
    reproduction: frozenset[str] = frozenset()  # its own tests that fail on the base source
    changed_lines: int = 0

    @property
    def eligible(self) -> bool:
        return self.publishable and self.level in LEVEL_RANK


@dataclass(frozen=True)
class Ranked:
    """A candidate's place: its agreement (which others it agrees with) and why it ranks there."""

    candidate: Candidate
    agrees_with: tuple[int, ...]
    checked: tuple[int, ...]  # the others whose agreement with this one was judged

    @property
    def key(self) -> tuple[int, int, int, int, int]:
        c = self.candidate
        return (_level_rank(c), 1 if c.pass_to_fail else 0, -len(self.agrees_with), c.changed_lines, c.number)


@dataclass
class Choice:
    """The outcome of the rule: the attempt to publish (None: none may be), every candidate ranked, why."""

    chosen: int | None
    ranked: list[Ranked] = field(default_factory=list)
    why: str = ""
    attempts: int = 0  # how many attempts ran, candidates or not

    def to_dict(self) -> dict[str, Any]:
        return {
            "chosen": self.chosen,
            "attempts": self.attempts,
            "why": self.why,
            "ranked": [
                {
                    "attempt": r.candidate.number,
                    "level": r.candidate.level.value if r.candidate.level else None,
                    "fail_to_pass": len(r.candidate.fail_to_pass),
                    "regressions": len(r.candidate.pass_to_fail),
                    "agrees_with": list(r.agrees_with),
                    "checked": list(r.checked),
                    "changed_lines": r.candidate.changed_lines,
                }
                for r in self.ranked
            ],
        }


def agrees(a: Candidate, b: Candidate, cross: Mapping[Pair, bool]) -> bool | None:
    """Whether `a`'s patch agrees with `b`: `b`'s reproduction tests pass with it (a cross-check run),
    or, with no reproduction tests on either side, both make the same tests pass. None: not known."""
    if b.reproduction:
        return cross.get((a.number, b.number))
    if a.reproduction or not (a.fail_to_pass and b.fail_to_pass):
        return None  # nothing of b's own for a to pass (the reverse check, if any, speaks for the pair)
    return a.fail_to_pass == b.fail_to_pass


def rank(candidates: Sequence[Candidate], cross: Mapping[Pair, bool]) -> list[Ranked]:
    """The eligible candidates, best first."""
    eligible = [c for c in candidates if c.eligible]
    ranked = []
    for a in eligible:
        verdicts = {b.number: agrees(a, b, cross) for b in eligible if b.number != a.number}
        ranked.append(Ranked(
            a,
            tuple(n for n, v in verdicts.items() if v),
            tuple(n for n, v in verdicts.items() if v is not None),
        ))  # fmt: skip
    return sorted(ranked, key=lambda r: r.key)


def choose(candidates: Sequence[Candidate], cross: Mapping[Pair, bool] | None = None) -> Choice:
    """The rule (see the module's docstring): the best eligible candidate, or None."""
    ranked = rank(candidates, cross or {})
    if not ranked:
        return Choice(None, [], "no attempt's patch may be published", len(candidates))
    best = ranked[0]
    return Choice(best.candidate.number, ranked, _why(best, ranked[1:], len(candidates)), len(candidates))


def cross_checks(candidates: Sequence[Candidate]) -> list[Pair]:
    """The runs that can change the choice: within the best tier (the best level, no regressions),
    each candidate's patch against each other's reproduction tests. A lone candidate needs none."""
    eligible = [c for c in candidates if c.eligible]
    if len(eligible) < 2:
        return []
    best = min((_level_rank(c), bool(c.pass_to_fail)) for c in eligible)
    tier = [c for c in eligible if (_level_rank(c), bool(c.pass_to_fail)) == best]
    return [(a.number, b.number) for a in tier for b in tier if a.number != b.number and b.reproduction]


def settled(candidates: Sequence[Candidate], cross: Mapping[Pair, bool]) -> bool:
    """Whether more attempts are unlikely to change the choice: the best candidate is reproduced and agrees
    with another (that one's reproduction tests pass over its patch, or both make the same tests pass).

    Extra attempts (beyond FROGFIX_ATTEMPTS) stop once this holds."""
    ranked = rank(candidates, cross)
    return bool(ranked) and ranked[0].candidate.level == EvidenceLevel.reproduced and bool(ranked[0].agrees_with)


def _level_rank(candidate: Candidate) -> int:
    return LEVEL_RANK.get(candidate.level, len(LEVEL_RANK)) if candidate.level is not None else len(LEVEL_RANK)


def _why(best: Ranked, rest: Sequence[Ranked], total: int) -> str:
    c = best.candidate
    level = c.level.value if c.level else "untested"
    parts = [f"attempt {c.number} of {total}: {level}"]
    if best.checked:
        parts.append(f"agrees with {len(best.agrees_with)} of {len(best.checked)} other attempt(s)")
    parts.append(changed_lines_words(c.changed_lines))
    if not rest:
        return "; ".join(parts) + ("; the only attempt that may be published" if total > 1 else "")
    runner_up = rest[0]
    decided = next(
        (name for name, mine, theirs in zip(("level", "regressions", "agreement", "patch size", "order"),
                                            best.key, runner_up.key, strict=True) if mine != theirs),
        "order",
    )  # fmt: skip
    return "; ".join(parts) + f"; ahead of attempt {runner_up.candidate.number} on {decided}"
