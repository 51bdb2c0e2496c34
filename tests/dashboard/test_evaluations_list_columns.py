"""The evaluations list shows each evaluation's solve rate and its gained / lost tasks (issue 26), and the
report keeps each figure and its confidence interval on one line.

The list's figures are the report's own: solved / finished attempts with unrunnable ones left out, and
gained / lost judged like with like against the recorded run (app/evaluation_report.py `comparison`).
"""

from __future__ import annotations

from typing import Any

from app.db import session_scope
from app.evaluation_report import UNRUNNABLE
from app.jobs import evaluations as ev_records

TASKS = [
    {"key": "7", "project": "acme/calc", "title": "t", "recorded_solved": True, "human": "merged"},
    {"key": "8", "project": "acme/calc", "title": "t", "recorded_solved": False, "human": "closed"},
    {"key": "9", "project": "acme/gone", "title": "t", "recorded_solved": True, "human": "unknown"},
]


def _result(task: str, attempt: int, solved: bool, outcome: str | None = None) -> dict[str, Any]:
    return {
        "task": task, "attempt": attempt, "solved": solved,
        "outcome": outcome or ("verified" if solved else "no_patch"),
        "exit_reason": "agent", "steps": 4, "prompt_tokens": 1000, "completion_tokens": 100, "cached_tokens": 500,
        "model_seconds": 2.0, "wall_seconds": 3.0, "trajectory": None, "reason": "project gone" if outcome else None,
    }


def _evaluation() -> int:
    """Task 7 lost (recorded solved, 0 of 2), task 8 gained (1 of 2), task 9 unrunnable (out of every rate)."""
    with session_scope() as session:
        eid = ev_records.create_evaluation(
            session, model="cand", base_url="http://m/v1", selector="", attempts=2, tasks=TASKS, who="t"
        )
        runner = ev_records.Runner("test-host", 1, "1")
        ev_records.claim(session, eid, runner, 60)
        for values in (_result("7", 1, False), _result("7", 2, False), _result("8", 1, True), _result("8", 2, False),
                       _result("9", 1, False, UNRUNNABLE)):
            assert ev_records.record_result(session, eid, values, runner)
    return eid


def test_the_list_counts_and_compares_as_the_report_does(frogfix_env: dict[str, Any]) -> None:
    eid = _evaluation()
    with session_scope() as session:
        [(row, done, solved)] = ev_records.list_evaluations(session)
        report = ev_records.report_of(session, eid)
        comparisons = ev_records.list_comparisons(session)
        assert ev_records.list_comparisons(session, limit=0) == {}
    assert row.id == eid and (solved, done) == (report["attempts_solved"], report["attempts_finished"]) == (1, 4)
    assert comparisons == {eid: {k: report[k] for k in ("gained", "lost", "not_comparable")}}
    assert comparisons[eid] == {"gained": ["8"], "lost": ["7"], "not_comparable": []}


def test_the_list_shows_the_solve_rate_and_gained_and_lost(signed_in: Any) -> None:
    eid = _evaluation()
    page = signed_in.get("/evaluations")
    assert page.status_code == 200
    assert "<th class=\"num\" title=\"solved attempts / finished attempts" in page.text
    assert 'data-testid="solve-rate">0.25</td>' in page.text  # 1 of 4: the unrunnable attempt is out
    assert f'href="/evaluations/{eid}"' in page.text and "1 / 4" in page.text
    # The route passes `comparisons` (app/jobs/evaluations.py `list_comparisons`) for this column.
    assert 'data-testid="gained-lost"><span title="gained: 8">+1</span> / <span title="lost: 7">-1</span>' in page.text


def test_the_template_shows_gained_and_lost_from_the_comparisons(frogfix_env: dict[str, Any]) -> None:
    from app.web.dashboard import templates

    rows = [({"id": 3, "model": "m", "created_at": None, "status": "finished", "tasks": TASKS, "attempts": 2,
              "selector": ""}, 4, 1),
            ({"id": 2, "model": "m", "created_at": None, "status": "running", "tasks": TASKS, "attempts": 2,
              "selector": ""}, 0, 0)]
    comparisons = {3: {"gained": ["8"], "lost": ["7", "9"], "not_comparable": ["5"]}, 2: {"gained": [], "lost": [],
                                                                                         "not_comparable": []}}
    html = templates.get_template("evaluations.html").render(rows=rows, comparisons=comparisons, path="/evaluations")
    assert '<span title="gained: 8">+1</span> / <span title="lost: 7, 9">-2</span>' in html
    assert "(1 not comparable)" in html
    assert 'data-testid="solve-rate">0.25</td>' in html and 'data-testid="solve-rate">n/a</td>' in html
    assert 'data-testid="gained-lost">—</td>' in html  # no finished attempt yet: nothing to compare
    # Without the comparisons (an older route), the column says nothing rather than a wrong figure.
    bare = templates.get_template("evaluations.html").render(rows=rows, path="/evaluations")
    assert bare.count('data-testid="gained-lost">—</td>') == 2


def test_the_reports_figures_keep_their_interval_on_one_line(signed_in: Any, tmp_path: Any) -> None:
    eid = _evaluation()
    page = signed_in.get(f"/evaluations/{eid}").text
    assert '<table class="figures" data-testid="overall">' in page
    css = signed_in.get("/static/app.css").text
    assert "table.figures td + td { white-space: nowrap; }" in css

    from worker.commands.evaluate import load_report, write_outputs

    html = (write_outputs(load_report(eid), tmp_path / "out")[2]).read_text()
    assert '<table class="figures" data-testid="overall">' in html
    assert ".figures td + td { white-space: nowrap; }" in html  # the standalone file carries its own style
