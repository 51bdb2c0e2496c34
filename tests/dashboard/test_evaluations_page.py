"""The dashboard's evaluations page lists past `manage.py eval` runs and opens their tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.db import session_scope
from app.jobs import evaluations as ev_records

HOSTILE = "<script>alert(1)</script>"


def _result(task: str, attempt: int, solved: bool) -> dict[str, Any]:
    return {
        "task": task, "attempt": attempt, "solved": solved, "outcome": "verified" if solved else "no_patch",
        "exit_reason": "agent", "steps": 4, "prompt_tokens": 1000, "completion_tokens": 100, "cached_tokens": 500,
        "model_seconds": 2.0, "wall_seconds": 3.0, "trajectory": None, "reason": HOSTILE,
    }


def test_the_list_and_one_evaluation_show_the_reports_figures(signed_in: Any, tmp_path: Path) -> None:
    assert "No evaluation yet" in signed_in.get("/evaluations").text
    tasks = [
        {"key": "7", "project": f"acme/{HOSTILE}", "title": "t", "recorded_solved": True, "human": "merged"},
        {"key": "8", "project": "acme/calc", "title": "t", "recorded_solved": False, "human": "closed"},
    ]
    with session_scope() as session:
        eid = ev_records.create_evaluation(
            session, model=f"cand{HOSTILE}", base_url="http://m/v1", selector="", attempts=2, tasks=tasks, who="t"
        )
        runner = ev_records.Runner("test-host", 1, "1")
        ev_records.claim(session, eid, runner, 60)
        for values in (_result("7", 1, False), _result("7", 2, False), _result("8", 1, True), _result("8", 2, False)):
            assert ev_records.record_result(session, eid, values, runner)

    listing = signed_in.get("/evaluations")
    assert listing.status_code == 200 and f'href="/evaluations/{eid}"' in listing.text
    assert "1 / 4" in listing.text and HOSTILE not in listing.text and "&lt;script&gt;" in listing.text

    page = signed_in.get(f"/evaluations/{eid}")
    assert page.status_code == 200 and HOSTILE not in page.text
    assert 'data-testid="solve-rate">0.25 [' in page.text  # 1 of 4 attempts
    assert 'data-testid="pass-2">0.50 [' in page.text  # task 8 solved once in two: pass@2 = 1; task 7: 0
    assert 'data-testid="chosen-2">0.50 [' in page.text and 'data-testid="chosen-1">0.25 [' in page.text
    assert "Eval runs no cross-check between attempts" in page.text and "chosen@2 / pass@2: 1.00" in page.text
    assert "Lost (1): 7" in page.text and "Gained (1): 8" in page.text
    assert "Not comparable, unequal attempts (0)" in page.text and "made 1 attempt per task" in page.text
    assert signed_in.get("/evaluations/999").status_code == 404
    assert signed_in.get("/evaluations/0").status_code in (404, 422)
    human = 'Human verdicts: 0 of 1 merged MRs solved; 1 of 1 closed-unmerged MRs "solved"; 0 MRs still open'
    assert human in page.text and 'href="/jobs/8"' in page.text

    # `manage.py eval --out` writes the same report through the same template, as a standalone file.
    from worker.commands.evaluate import load_report, write_outputs

    written = write_outputs(load_report(eid), tmp_path / "out")
    assert [p.name for p in written] == ["report.md", "report.json", "report.html"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'data-testid="solve-rate">0.25 [' in html and 'data-testid="pass-2">0.50 [' in html
    assert "Lost (1): 7" in html and human in html
    assert HOSTILE not in html and "<script" not in html and "&lt;script&gt;" in html
    assert 'href="/jobs/' not in html and "/static/" not in html  # a file: no links into the dashboard
