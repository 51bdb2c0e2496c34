"""The selection rule (app/selection.py) on the mixes of issue 24's "Done means": the right attempt wins each."""

from __future__ import annotations

from collections.abc import Iterable

from app.selection import Candidate, Choice, agrees, choose, cross_checks, rank, settled
from app.statuses import EvidenceLevel

REPRODUCED, FAILED_BEFORE, UNPROVEN = EvidenceLevel.reproduced, EvidenceLevel.failed_before, EvidenceLevel.unproven
BUG = "tests/test_calc.py::test_divide_by_zero"  # the suite's test that fails on the base


def _set(*names: str) -> frozenset[str]:
    return frozenset(names)


def right(number: int, lines: int = 20, *, test: str | None = None) -> Candidate:
    """A right patch with its own reproduction test (it fails on the base, passes with the fix)."""
    own = _set(test or f"tests/test_attempt_{number}.py::test_repro")
    return Candidate(number, REPRODUCED, True, own, frozenset(), own, lines)


def lucky_unproven(number: int, lines: int = 3) -> Candidate:
    """A wrong patch that passes the whole suite and reproduces nothing."""
    return Candidate(number, UNPROVEN, True, changed_lines=lines)


def fixes_bug_test(number: int, lines: int) -> Candidate:
    """A patch that makes the suite's failing test pass and adds no test of its own."""
    return Candidate(number, FAILED_BEFORE, True, _set(BUG), changed_lines=lines)


def regressed(number: int, lines: int = 1) -> Candidate:
    return Candidate(number, EvidenceLevel.regressed, False, _set(BUG), _set("tests/test_calc.py::test_add"),
                     changed_lines=lines)


def agreeing(
    pairs: Iterable[tuple[int, int]], disagreeing: Iterable[tuple[int, int]] = ()
) -> dict[tuple[int, int], bool]:
    """Cross-check outcomes: (the attempt whose patch ran, the attempt whose reproduction tests ran) -> passed."""
    return {**{p: True for p in pairs}, **{p: False for p in disagreeing}}


def test_a_wrong_patch_that_passes_the_suite_loses_to_a_right_one_with_a_reproduction_test() -> None:
    # The wrong one comes first and is smaller: the evidence level decides before anything else.
    choice = choose([lucky_unproven(1, lines=2), right(2, lines=40)])
    assert choice.chosen == 2
    assert choice.why.startswith("attempt 2 of 2: reproduced") and "ahead of attempt 1 on level" in choice.why
    assert [r.candidate.number for r in choice.ranked] == [2, 1]


def test_the_evidence_levels_rank_reproduced_then_failed_before_then_unproven() -> None:
    mix = [lucky_unproven(1, lines=1), fixes_bug_test(2, lines=2), right(3, lines=90)]
    assert choose(mix).chosen == 3
    assert choose(mix[:2]).chosen == 2
    assert choose(mix[:1]).chosen == 1  # an unproven patch whose tests all pass may still be published


def test_a_patch_with_a_regression_is_never_chosen() -> None:
    assert choose([regressed(1)]).chosen is None
    assert choose([regressed(1)]).why == "no attempt's patch may be published"
    assert choose([regressed(1, lines=1), lucky_unproven(2, lines=50)]).chosen == 2
    # Even a candidate whose level slipped through with regressions ranks below one without, at the same level.
    odd = Candidate(1, REPRODUCED, True, _set("t::a"), _set("t::b"), _set("t::a"), 1)
    choice = choose([odd, right(2, lines=100)])
    assert choice.chosen == 2 and "ahead of attempt 1 on regressions" in choice.why


def test_attempts_that_cannot_be_published_are_never_candidates() -> None:
    failing = Candidate(1, UNPROVEN, False, changed_lines=1)  # tests still fail with it
    refused = Candidate(2, None, False)  # never tested
    unrunnable = Candidate(3, EvidenceLevel.unrunnable, True, changed_lines=1)  # not a level that publishes
    assert choose([failing, refused, unrunnable]).chosen is None
    assert choose([failing, refused, unrunnable, fixes_bug_test(4, 9)]).chosen == 4
    assert [r.candidate.number for r in rank([failing, refused, unrunnable, fixes_bug_test(4, 9)], {})] == [4]


def test_two_agreeing_reproduced_patches_beat_a_lone_reproduced_one_with_a_smaller_patch() -> None:
    a, b, lone = right(1, lines=50), right(2, lines=40), right(3, lines=5)
    # 1 and 2 pass each other's reproduction tests; 3's test fails over both, and theirs over 3.
    cross = agreeing([(1, 2), (2, 1)], [(3, 1), (3, 2), (1, 3), (2, 3)])
    choice = choose([a, b, lone], cross)
    assert choice.chosen == 2  # agreement first, then the smaller of the two
    assert choice.ranked[0].agrees_with == (1,) and choice.ranked[0].checked == (1, 3)
    assert [r.candidate.number for r in choice.ranked] == [2, 1, 3]
    assert "agrees with 1 of 2 other attempt(s)" in choice.why and "ahead of attempt 1 on patch size" in choice.why
    # Without the cross-check runs the lone, smaller patch would have won.
    assert choose([a, b, lone]).chosen == 3


def test_a_right_patch_that_agrees_beats_a_wrong_reproduced_one_that_came_first_and_is_smaller() -> None:
    wrong = right(1, lines=2, test="tests/test_wrong.py::test_misread_issue")  # a wrong test, passing its own fix
    cross = agreeing([(2, 3), (3, 2)], [(1, 2), (1, 3), (2, 1), (3, 1)])
    assert choose([wrong, right(2, lines=30), right(3, lines=35)], cross).chosen == 2


def test_agreement_without_reproduction_tests_is_the_same_non_empty_fail_to_pass_set() -> None:
    one, two = fixes_bug_test(1, lines=30), fixes_bug_test(2, lines=20)
    other = Candidate(3, FAILED_BEFORE, True, _set("tests/test_calc.py::test_other"), changed_lines=1)
    assert agrees(one, two, {}) is True and agrees(one, other, {}) is False
    assert agrees(lucky_unproven(4), lucky_unproven(5), {}) is None  # nothing made to pass: nothing to compare
    choice = choose([one, two, other])
    assert choice.chosen == 2 and choice.ranked[0].agrees_with == (1,)
    # A reproduction test on one side: only a cross-check run can tell (None until it ran).
    assert agrees(one, right(6), {}) is None and agrees(right(6), one, {}) is None
    assert agrees(one, right(6), {(1, 6): True}) is True


def test_a_tie_goes_to_the_smaller_patch_then_the_earlier_attempt() -> None:
    choice = choose([right(1, lines=30), right(2, lines=12), right(3, lines=12)])
    assert choice.chosen == 2 and "ahead of attempt 3 on order" in choice.why
    assert choose([fixes_bug_test(1, 9), fixes_bug_test(2, 8)]).chosen == 2
    assert choose([lucky_unproven(1, 8), lucky_unproven(2, 8)]).chosen == 1


def test_cross_checks_run_only_within_the_best_tier() -> None:
    mix = [right(1), fixes_bug_test(2, 5), right(3), lucky_unproven(4), regressed(5), right(6)]
    assert sorted(cross_checks(mix)) == [(1, 3), (1, 6), (3, 1), (3, 6), (6, 1), (6, 3)]
    # A candidate with regressions is not in the tier of those without.
    odd = Candidate(7, REPRODUCED, True, _set("t::a"), _set("t::b"), _set("t::a"), 1)
    assert sorted(cross_checks([right(1), odd, right(3)])) == [(1, 3), (3, 1)]
    assert cross_checks([right(1), fixes_bug_test(2, 5), lucky_unproven(3)]) == []  # a lone best: nothing to run
    # The best tier has no reproduction tests: no run can change the choice.
    assert cross_checks([fixes_bug_test(1, 5), fixes_bug_test(2, 5), lucky_unproven(3)]) == []
    assert cross_checks([regressed(1), regressed(2)]) == []


def test_settled_needs_a_reproduced_best_that_another_attempt_agrees_with() -> None:
    a, b = right(1, lines=10), right(2, lines=20)
    assert not settled([], {})
    assert not settled([a], {})
    assert not settled([a, b], {})  # not cross-checked yet
    assert not settled([a, b], agreeing([], [(1, 2), (2, 1)]))
    assert settled([a, b], agreeing([(1, 2)]))  # 2's reproduction test passes over 1's patch
    # Agreement ranks before size: the larger patch that passes the other's test is the best, and settles it.
    assert settled([a, b], agreeing([(2, 1)], [(1, 2)])) and choose([a, b], agreeing([(2, 1)], [(1, 2)])).chosen == 2
    # A lone reproduced best, however well the attempts below it agree among themselves: not settled.
    lone = right(3, lines=1)
    assert not settled([lone, fixes_bug_test(4, 1), fixes_bug_test(5, 1)], {})
    # Agreement at a lower level never settles it.
    assert not settled([fixes_bug_test(1, 5), fixes_bug_test(2, 5)], {})
    assert not settled([regressed(1), regressed(2)], {})


def test_choice_to_dict_has_the_shape_the_job_page_and_fix_json_read() -> None:
    choice = choose([lucky_unproven(1, 3), right(2, 40), right(3, 50), regressed(4)], agreeing([(2, 3), (3, 2)]))
    data = choice.to_dict()
    assert set(data) == {"chosen", "attempts", "why", "ranked"}
    assert data["chosen"] == 2 and data["attempts"] == 4 and data["why"] == choice.why
    assert data["ranked"][0] == {
        "attempt": 2, "level": "reproduced", "fail_to_pass": 1, "regressions": 0, "agrees_with": [3],
        "checked": [3], "changed_lines": 40,
    }
    assert [r["attempt"] for r in data["ranked"]] == [2, 3, 1]  # the regressed one is not ranked at all
    assert data["ranked"][2]["level"] == "unproven" and data["ranked"][2]["checked"] == []
    assert Choice(None).to_dict() == {"chosen": None, "attempts": 0, "why": "", "ranked": []}
    none = choose([regressed(1)]).to_dict()
    assert none == {"chosen": None, "attempts": 1, "why": "no attempt's patch may be published", "ranked": []}


def test_one_patch_size_wording_in_every_reader() -> None:
    """Issue 40: a patch was "13 lines" in replay, "2 changed line(s)" in the selection and "+1 -1" on the page;
    now each says `N changed lines (+a -r)`, or the count alone where only the count is kept."""
    from app.patches import changed_lines_words, patch_size

    patch = ("diff --git a/calc.py b/calc.py\nindex 8124ccd..97eb2fc 100644\n--- a/calc.py\n+++ b/calc.py\n"
             "@@ -2,7 +2,7 @@\n \n \n def add(a: int, b: int) -> int:\n-    return a - b\n+    return a + b\n")
    assert patch_size(patch) == "2 changed lines (+1 -1)"
    assert patch_size("") == patch_size(None) == "no change"
    assert changed_lines_words(1) == "1 changed line"
    assert "; 2 changed lines" in choose([right(1, 2)]).why and "line(s)" not in choose([right(1, 2)]).why
