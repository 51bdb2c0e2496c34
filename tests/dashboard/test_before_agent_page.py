"""A job that ended before the agent ran (issue 40): its page offers no trajectory (there is none) and no
replay, shows the test environment's build log that `fix` printed, and its why line names the remedy.

A real `fix` on a repository declaring a package the company's mirror (a real PEP 503 index on loopback)
does not have; then the job page as an operator sees it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from app.outcome_words import ENVIRONMENT_REMEDY
from tests.fix.sample_repo import git, make_sample_repo
from tests.fix.test_fix_command import run_fix


@pytest.mark.bwrap
def test_an_environment_that_failed_shows_its_log_and_no_trajectory(local_env: dict[str, Any], signed_in: Any,
                                                                    tmp_path: Path) -> None:
    from tests.realrepos.mirror import PackageMirror

    repo = make_sample_repo(tmp_path)
    (repo / "requirements.txt").write_text("frogfix-no-such-package==3.1\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "a dependency the mirror lacks")
    packages = tmp_path / "packages"
    packages.mkdir()
    with PackageMirror(packages, "mirror-password-40") as mirror:
        proc = run_fix(repo, local_env["data_dir"], "http://127.0.0.1:9/v1", "--skip-model-check",
                       env_extra={"FROGFIX_PIP_INDEX_URL": mirror.url_with_credentials})
    assert proc.returncode == 3, proc.stderr  # environment error: the agent never ran
    job_id = int(re.search(r"\[frogfix (\d+)\]", proc.stderr).group(1))  # type: ignore[union-attr]

    page = signed_in.get(f"/jobs/{job_id}")
    assert page.status_code == 200
    html = page.text
    assert 'data-testid="trajectory-link"' not in html and "Trajectory, step by step" not in html
    assert "shared with the worker" not in html
    assert 'id="replay-button"' not in html  # nothing to replay either
    log = re.search(r'<pre class="log" data-testid="environment-log">(.*?)</pre>', html, re.S)
    assert log is not None, html[-3000:]
    assert "frogfix-no-such-package" in log.group(1)  # the installer's own words, as `fix` printed them
    why = re.search(r'<p class="error" id="why"><strong>Why:</strong> (.*?)</p>', html, re.S)
    assert why is not None and why.group(1).startswith("the test environment could not be built: ")
    assert "unsatisfiable; add what is missing" in why.group(1)
    assert why.group(1).endswith(ENVIRONMENT_REMEDY.replace("'", "&#39;")), why.group(1)
    assert "mirror-password-40" not in html


def test_a_finished_attempt_with_no_step_and_no_file_offers_no_trajectory(frogfix_env: dict[str, Any]) -> None:
    """Its row names where the trajectory would be, but the agent never ran: no link, and no hint that the data
    folder might not be shared (which is for a file missing from a trajectory that exists elsewhere)."""
    from types import SimpleNamespace

    from app.web.dashboard import _attempt_view

    def attempt(status: str, steps: int) -> Any:
        return SimpleNamespace(tests=None, patch=None, trajectory_path="trajectories/job-7-run-1-1.json",
                               status=status, steps=steps)

    never = _attempt_view(attempt("failed", 0), frogfix_env["data_dir"])
    assert never["trajectory"] is False
    assert never["trajectory_problem"] == "no trajectory: the attempt ended before the agent ran"
    lost = _attempt_view(attempt("failed", 3), frogfix_env["data_dir"])  # it ran, yet its file is not here
    assert lost["trajectory"] is False and "shared with the worker" in lost["trajectory_problem"]
    running = _attempt_view(attempt("running", 0), frogfix_env["data_dir"])
    assert running["trajectory"] is True and running["trajectory_problem"] == "no step saved yet"
