"""app/outcome_words.py: why a job ended, how its agent ended, its tests, in plain words (issue 26).

The error texts are the ones the worker writes (worker/leaf/model.py, worker/attempts/repo_config.py, the
environment builder, app/forge's clients through worker/job/pipeline.py), as stored on real jobs.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from app import outcome_words  # `tests_line` by its module: imported by name, pytest would collect it
from app.answers import TestsAnswer
from app.outcome_words import ending, says_more, shown_url, why

ROOT = Path(__file__).resolve().parent.parent
URL = "http://127.0.0.1:30000/v1"


def test_it_imports_only_the_standard_library_and_the_statuses() -> None:
    """A pure vocabulary module: the dashboard, `show` and `fix` (and worker/leaf, if it wants) may all use it."""
    tree = ast.parse((ROOT / "app" / "outcome_words.py").read_text("utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported - {"app.statuses"} <= set(sys.stdlib_module_names) | {"__future__", "urllib.parse"}, imported


@pytest.mark.parametrize(
    ("status", "exit_reason", "error", "expected"),
    [
        ("failed", "llm_query_error",
         "model call failed after 5 attempt(s): connection error: ConnectError: [Errno 111] Connection refused",
         f"the model server at {URL} could not be reached (Connection refused); run ./manage.py doctor"),
        ("failed", "llm_query_error", "model call refused: HTTP 401: Invalid API key",
         f"the model server at {URL} refused the call (HTTP 401: Invalid API key); run ./manage.py doctor"),
        ("failed", None, "the model could not be used: model call failed after 3 attempt(s): HTTP 503: down",
         f"the model server at {URL} kept failing (HTTP 503: down); run ./manage.py doctor"),
        ("failed", "config_error", ".frogfix.yml: unknown key test_comand; did you mean test_command?",
         "the repository's .frogfix.yml is not usable: unknown key test_comand; did you mean test_command?"),
        ("failed", None, ".frogfix.yml is not valid YAML: mapping values are not allowed here, line 1 column 5",
         "the repository's .frogfix.yml is not usable: it is not valid YAML: mapping values are not allowed here,"
         " line 1 column 5"),
        ("environment_error", "environment_error",
         "installing the declared dependencies failed (exit 1): error: No solution found when resolving dependencies",
         "the test environment could not be built: installing the declared dependencies failed (exit 1): error: No"
         " solution found when resolving dependencies"),
        ("failed", None, "environment error: the tests could not start on the base commit: pytest refused its"
         " command line or configuration (a usage error) (exit 4)",
         "the test environment is not usable: the tests could not start on the base commit: pytest refused its"
         " command line or configuration (a usage error) (exit 4)"),
        ("failed", None, "GitLab read issue #1 of acme/calc: HTTP 401 401 Unauthorized (the forge token was rejected)",
         "the forge (GitLab) answered 401 to read issue #1 of acme/calc: the FrogFix token was rejected; check"
         " FROGFIX_GITLAB_TOKEN"),
        ("failed", None, "GitLab read issue #1 of acme/calc: HTTP 403 403 Forbidden (the forge token lacks permission)",
         "the forge (GitLab) answered 403 to read issue #1 of acme/calc: the FrogFix token lacks a permission it"
         " needs (Forbidden); check FROGFIX_GITLAB_TOKEN"),
        ("failed", None, "the forge or git server kept failing: GitLab read issue #1 of acme/calc: ConnectionError"
         " talking to the server (gave up after 5 attempts in 5.5s)",
         "the forge (GitLab) could not be reached for read issue #1 of acme/calc (ConnectionError, gave up after 5"
         " attempts in 5.5s); run ./manage.py doctor"),
        ("failed", None, "the forge or git server kept failing: GitLab read issue #1 of acme/calc: HTTP 503 503"
         " Service Unavailable (gave up after 5 attempts in 5.5s)",
         "the forge (GitLab) answered 503 to read issue #1 of acme/calc (Service Unavailable, gave up after 5"
         " attempts in 5.5s); an operator can retry"),
        ("failed", None, "no Gitea token is configured (set FROGFIX_GITEA_TOKEN)",
         "the forge is not set up right: no Gitea token is configured (set FROGFIX_GITEA_TOKEN); run ./manage.py"
         " doctor"),
        ("failed", "tool_error", "sandbox failure: bwrap: setting up uid map: Permission denied",
         "the sandbox failed: bwrap: setting up uid map: Permission denied"),
        ("failed", "git_error", "git clone failed: fatal: not a git repository",
         "git failed: git clone failed: fatal: not a git repository"),
        ("failed", None, "the job ran past its time limit (10800 s)",
         "the job ran past its time limit (10800 s); FROGFIX_JOB_TIMEOUT_SECONDS sets it"),
        ("no_fix", "max_turns", None, "the agent used every step it may take (FROGFIX_LEAF_MAX_STEPS) without a fix"),
        ("no_fix", "max_time", "model call ran out of time after 2 attempt(s)",
         "the agent ran out of time (FROGFIX_JOB_TIMEOUT_SECONDS) before a fix"),
        ("no_fix", "agent", "adds binary file tool.exe", "the patch was refused: adds binary file tool.exe"),
        ("no_fix", "agent", None, "the agent ended without a fix the tests prove"),
        ("failed", "cancelled", "the run stopped: KeyboardInterrupt",
         "the run was stopped before it ended (KeyboardInterrupt)"),
        ("cancelled", None, "cancelled on request", "it was cancelled on request"),
    ],
)
def test_why_says_it_in_plain_words(status: str, exit_reason: str | None, error: str | None, expected: str) -> None:
    assert why(status, exit_reason, error, model_url=URL) == expected


def test_no_why_for_a_job_that_did_not_fail() -> None:
    for status in ("done", "fixed", "unproven", "queued", "running", "verifying", "publishing"):
        assert why(status, "agent", None, model_url=URL) is None


def test_the_why_line_is_one_line_and_names_no_password() -> None:
    error = "model call failed after 5 attempt(s):\n connection error: ConnectError:\n [Errno 111] Connection refused"
    line = why("failed", "llm_query_error", error, model_url="http://user:s3cret@models.internal:30000/v1") or ""
    assert "\n" not in line and "s3cret" not in line and "user" not in line
    assert line.startswith("the model server at http://models.internal:30000/v1 could not be reached")
    assert shown_url("http://[::1]:8000/v1") == "http://[::1]:8000/v1"
    assert len(why("failed", None, "x" * 5000) or "") <= 500


def test_an_error_the_why_line_did_not_say_all_of_is_worth_showing() -> None:
    config = ".frogfix.yml: unknown key test_comand; did you mean test_command?"
    assert not says_more(config, why("failed", "config_error", config))
    model = "model call failed after 5 attempt(s): connection error: ConnectError: [Errno 111] Connection refused"
    assert says_more(model, why("failed", "llm_query_error", model, model_url=URL))
    assert not says_more(None, None)


def test_how_the_agent_ended() -> None:
    assert ending("agent", 4) == "the agent finished after 4 steps"
    assert ending("max_turns", 1) == "step limit reached after 1 step"
    assert ending("llm_query_error", 0) == "model unreachable after 0 steps"
    assert ending("config_error", 0) == ending("environment_error", 0) == ending(None, 0) == "the agent did not run"


def test_tests_in_words_in_the_one_shape() -> None:
    """`fix --json`'s tests and a forge attempt's are one shape (app/answers.py): `after` lists every run."""
    fix_tests = {
        "command": "python3 -m pytest -q",
        "before": {"exit_code": 1, "log": "", "timed_out": False, "counts": {"failed": 1, "passed": 1}},
        "after": [{"exit_code": 0, "counts": {"passed": 2}}, {"exit_code": 0, "counts": {"passed": 2}}],
        "flaky": False,
        "reproduction": None,
    }
    assert outcome_words.tests_line(fix_tests, None) == "before: 1 failed, 1 passed; after: 2 passed (2 runs)"
    # The shape `fix --json` wrote before (one `after` run and `after_runs`) is read into the one shape first.
    old_fix = {**fix_tests, "after": fix_tests["after"][0], "after_runs": fix_tests["after"]}
    read = TestsAnswer.read(old_fix)
    assert read is not None and outcome_words.tests_line(read.as_json()) == outcome_words.tests_line(fix_tests)
    forge_tests = {"command": "pytest", "before": {"exit_code": 1}, "after": [{"exit_code": 0}] * 2, "flaky": False}
    assert outcome_words.tests_line(forge_tests) == "before: failed; after: passed (2 runs)"
    flaky = {**forge_tests, "after": [{"exit_code": 0}, {"exit_code": 1}], "flaky": True}
    assert outcome_words.tests_line(flaky) == "before: failed; after: passed, then failed (flaky: the runs differ)"
    model_down = {"command": "pytest", "before": {"exit_code": 1, "counts": {"failed": 1, "passed": 1}}, "after": []}
    assert outcome_words.tests_line(model_down) == "before: 1 failed, 1 passed; after: did not run"
    stuck = {"command": "pytest", "before": {"exit_code": None, "timed_out": True}, "after": [{"exit_code": 4}],
             "reproduction": {"exit_code": 1, "counts": {"failed": 1, "error": 2}}}
    assert outcome_words.tests_line(stuck) == (
        "before: timed out; after: failed (exit 4); the patch's own tests on the old code: 1 failed, 2 errors"
    )
    evidence = {"level": "reproduced", "reason": "the patch's tests fail on the base source and pass with the fix"}
    assert outcome_words.tests_line(forge_tests, evidence).endswith(
        "; proves the fix: the patch's tests fail on the base source and pass with the fix"
    )
    assert outcome_words.tests_line(None) == outcome_words.tests_line({}) == "no tests run"
