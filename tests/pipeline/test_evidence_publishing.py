"""What the pipeline publishes for each verdict (worker/attempts/evidence.py): a proven fix as before, an unproven
patch as a draft marked "not reproduced", or, with FROGFIX_REQUIRE_REPRODUCTION, nothing and a comment."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from tests.conftest import configure
from tests.doubles.openai_server import assistant, text_call
from tests.pipeline.conftest import PROJECT, World
from tests.pipeline.test_pipeline_e2e import _gitlab_job, _job
from worker.tasks import run_job


def fix_on_main(world: World, tmp: Path) -> None:
    """The bug is already fixed on main: the base's tests pass, so no test can fail before a patch."""
    work = tmp / "main-work"
    subprocess.run(["git", "clone", "-q", str(world.bare("gitlab")), str(work)], check=True)
    calc = work / "calc.py"
    calc.write_text(calc.read_text().replace("return a - b", "return a + b"))
    for args in (("add", "-A"), ("-c", "user.name=dev", "-c", "user.email=dev@x", "commit", "-q", "-m", "fix add"),
                 ("push", "-q", "origin", "main")):
        subprocess.run(["git", "-C", str(work), *args], check=True, capture_output=True)


def cosmetic_script() -> list[Any]:
    edit = text_call("Edit", file_path="calc.py", old_string='"""A tiny calculator."""',
                     new_string='"""A tiny calculator, checked."""')
    return [assistant(edit), assistant("Tidied the module docstring; the tests pass.")]


def test_an_unproven_patch_is_published_as_a_draft_marked_not_reproduced(
    client: Any, world: World, tmp_path: Path
) -> None:
    fix_on_main(world, tmp_path)
    world.model._script[:] = cosmetic_script()
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    job, _, attempts = _job(job_id)
    [attempt] = attempts
    assert attempt.status == "unproven" and attempt.tests["evidence"]["level"] == "unproven"
    assert any(flag.startswith("not reproduced") for flag in job.flags)
    [mr] = world.gitlab.open_mrs(PROJECT)
    assert mr["draft"] is True and "[not reproduced] Fix #" in mr["title"], mr["title"]
    assert mr["description"].startswith("**Not reproduced:**"), mr["description"][:300]
    assert "Verdict: **unproven**" in mr["description"]


def test_with_require_reproduction_an_unproven_patch_is_not_published(
    client: Any, world: World, tmp_path: Path
) -> None:
    configure(world.env["monkeypatch"], require_reproduction="true")
    fix_on_main(world, tmp_path)
    world.model._script[:] = cosmetic_script()
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "no_fix"
    _, _, attempts = _job(job_id)
    assert attempts[0].status == "unproven"
    assert world.gitlab.open_mrs(PROJECT) == []
    # One comment besides "working on it": what was tried, and a question for the reporter (worker/job/question.py).
    started, note = [n["body"] for n in world.gitlab.notes]
    assert "working on" in started.lower(), started
    assert "<!-- frogfix:question -->" in note and "opened no merge request" in note and "unproven" in note
    job, kinds, _ = _job(job_id)
    assert job.status == "no_fix" and job.asked_at is not None and "asked" in kinds
    assert job.selection["chosen"] == 1  # chosen, and then held back: FROGFIX_REQUIRE_REPRODUCTION


def test_a_proven_fix_leads_the_mr_with_its_evidence(client: Any, world: World) -> None:
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    [mr] = world.gitlab.open_mrs(PROJECT)
    assert "[not reproduced]" not in mr["title"] and not mr["description"].startswith("**Not reproduced")
    description = mr["description"]
    assert "Verdict: **failed_before**" in description and "`tests/test_calc.py::test_add`" in description
    assert description.index("### Evidence") < description.index("### What the agent says")


FORGERY = '''"""A tiny calculator."""
import _pytest.reports as _reports

_made = _reports.TestReport.from_item_and_call.__func__


def _passed(cls, item, call):
    report = _made(cls, item, call)
    report.outcome = "passed"
    return report


_reports.TestReport.from_item_and_call = classmethod(_passed)'''


def test_a_patch_that_forges_its_results_is_never_published_and_the_issue_says_how_it_was_found(
    client: Any, world: World
) -> None:
    """The bug stays (calc still subtracts); the patch's code makes every report say passed. The job's
    one attempt is `tampered`: no MR, no question, and the issue names the attempt and the check."""
    edit = text_call("Edit", file_path="calc.py", old_string='"""A tiny calculator."""', new_string=FORGERY)
    world.model._script[:] = [assistant(edit), assistant("Fixed: every test passes now.")]
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "no_fix"
    job, kinds, attempts = _job(job_id)
    [attempt] = attempts
    assert attempt.status == "tampered" and attempt.tests["evidence"]["level"] == "tampered", attempt.tests
    assert "sentinel" in attempt.tests["evidence"]["reason"]
    assert world.gitlab.open_mrs(PROJECT) == [] and "asked" not in kinds and job.asked_at is None
    note = world.gitlab.notes[-1]["body"]
    assert "attempt 1:" in note and "were forged" in note and "must fail was reported passed" in note, note
    assert any(flag.startswith("reaches into the test runner") for flag in attempt.flags or []), attempt.flags
