"""app/outcome_words.py: why a job ended, how its agent ended, its tests, in plain words (issue 26).

Each ending is fed typed (app/endings.py: its kind and facts, as the worker makes it where the job ends):
the words come from the kind, never from parsing the text (issue 38).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from app import outcome_words  # `tests_line` by its module: imported by name, pytest would collect it
from app.answers import TestsAnswer
from app.endings import Ending, EndingKind
from app.outcome_words import ending, says_more, shown_url, why

ROOT = Path(__file__).resolve().parent.parent
URL = "http://127.0.0.1:30000/v1"


def test_it_imports_only_the_standard_library_the_statuses_and_the_endings() -> None:
    """A pure vocabulary module: the dashboard, `show` and `fix` (and worker/leaf, if it wants) may all use it.
    No `re`: an ending is worded from its kind and typed facts, never parsed from its text (issue 38)."""
    tree = ast.parse((ROOT / "app" / "outcome_words.py").read_text("utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    allowed = set(sys.stdlib_module_names) | {"__future__", "urllib.parse", "collections.abc"}
    assert imported - {"app.statuses", "app.endings"} <= allowed, imported
    assert "re" not in imported
    text = (ROOT / "app" / "outcome_words.py").read_text("utf-8")
    assert ".startswith(" not in text and ".removeprefix(" not in text and "re." not in text


K = EndingKind
GITLAB_CALL = {"forge": "GitLab", "call": "read issue #1 of acme/calc"}
GAVE_UP = "gave up after 5 attempts in 5.5s"


@pytest.mark.parametrize(
    ("status", "exit_reason", "end", "expected"),
    [
        ("failed", "llm_query_error", Ending(K.model_unreachable, "model call failed ...", cause="Connection refused"),
         f"the model server at {URL} could not be reached (Connection refused); run ./manage.py doctor"),
        ("failed", "llm_query_error", Ending(K.model_refused, "...", cause="HTTP 401: Invalid API key"),
         f"the model server at {URL} refused the call (HTTP 401: Invalid API key); run ./manage.py doctor"),
        ("failed", None, Ending(K.model_failing, "the model could not be used: ...", cause="HTTP 503: down"),
         f"the model server at {URL} kept failing (HTTP 503: down); run ./manage.py doctor"),
        ("failed", None, Ending(K.model_timeout, "...", cause="timed out after 30.0s"),
         f"the model server at {URL} did not answer in time (timed out after 30.0s); run ./manage.py doctor"),
        ("failed", None, Ending(K.model_out_of_time, "..."),
         f"the model server at {URL} did not answer before the job's time ran out; run ./manage.py doctor"),
        ("failed", None, Ending(K.model_aborted, "..."),
         f"the model server at {URL} aborted the request; run ./manage.py doctor"),
        ("failed", None, Ending(K.model_error, "...", cause="model answered without a message: {}"),
         f"the model server at {URL} could not be used (model answered without a message: {{}}); run ./manage.py"
         " doctor"),
        ("failed", "config_error", Ending(K.config_error, ".frogfix.yml: unknown key test_comand; did you mean"
         " test_command?", cause="unknown key test_comand; did you mean test_command?"),
         "the repository's .frogfix.yml is not usable: unknown key test_comand; did you mean test_command?"),
        ("failed", None, Ending(K.config_error, "...", cause="it is not valid YAML: mapping values are not allowed"
                                " here, line 1 column 5"),
         "the repository's .frogfix.yml is not usable: it is not valid YAML: mapping values are not allowed here,"
         " line 1 column 5"),
        ("environment_error", "environment_error", Ending(
            K.environment_error, "...", cause="installing the declared dependencies failed (exit 1): error: No"
            " solution found when resolving dependencies"),
         "the test environment could not be built: installing the declared dependencies failed (exit 1): error: No"
         " solution found when resolving dependencies; " + outcome_words.ENVIRONMENT_REMEDY),
        ("failed", None, Ending(K.tests_unstartable, "environment error: ...", cause="the tests could not start on"
                                " the base commit: pytest refused its command line or configuration (a usage"
                                " error) (exit 4)"),
         "the test environment is not usable: the tests could not start on the base commit: pytest refused its"
         " command line or configuration (a usage error) (exit 4)"),
        ("failed", None, Ending(K.forge_error, "GitLab read issue ...", http_status=401, said="Unauthorized",
                                **GITLAB_CALL),
         "the forge (GitLab) answered 401 to read issue #1 of acme/calc: the FrogFix token was rejected; check"
         " FROGFIX_GITLAB_TOKEN"),
        ("failed", None, Ending(K.forge_error, "GitLab read issue ...", http_status=403, said="Forbidden",
                                **GITLAB_CALL),
         "the forge (GitLab) answered 403 to read issue #1 of acme/calc: the FrogFix token lacks a permission it"
         " needs (Forbidden); check FROGFIX_GITLAB_TOKEN"),
        ("failed", None, Ending(K.forge_error, "...", http_status=404, **GITLAB_CALL),
         "the forge (GitLab) answered 404 to read issue #1 of acme/calc: it does not exist, or the FrogFix token"
         " may not see it"),
        ("failed", None, Ending(K.forge_unreachable, "the forge or git server kept failing: ...",
                                said="ConnectionError", gave_up=GAVE_UP, transient=True, **GITLAB_CALL),
         "the forge (GitLab) could not be reached for read issue #1 of acme/calc (ConnectionError, gave up after 5"
         " attempts in 5.5s); run ./manage.py doctor"),
        ("failed", None, Ending(K.forge_error, "the forge or git server kept failing: ...", http_status=503,
                                said="Service Unavailable", gave_up=GAVE_UP, transient=True, **GITLAB_CALL),
         "the forge (GitLab) answered 503 to read issue #1 of acme/calc (Service Unavailable, gave up after 5"
         " attempts in 5.5s); an operator can retry"),
        ("failed", None, Ending(K.forge_error, "...", said="the server redirected (HTTP 301); check"
                                " FROGFIX_GITLAB_URL", redirected=True, **GITLAB_CALL),
         "the forge (GitLab) answered read issue #1 of acme/calc with a redirect (the server redirected (HTTP 301);"
         " check FROGFIX_GITLAB_URL); check FROGFIX_GITLAB_URL"),
        ("failed", None, Ending(K.forge_unreachable, "the forge or git server kept failing: git fetch failed",
                                cause="git fetch failed", transient=True),
         "the forge or the git server could not be reached reliably (git fetch failed); an operator can retry"),
        ("failed", None, Ending(K.forge_setup, "no Gitea token is configured (set FROGFIX_GITEA_TOKEN)"),
         "the forge is not set up right: no Gitea token is configured (set FROGFIX_GITEA_TOKEN); run ./manage.py"
         " doctor"),
        ("failed", "tool_error", Ending(K.sandbox_failure, "sandbox failure: ...",
                                        cause="bwrap: setting up uid map: Permission denied"),
         "the sandbox failed: bwrap: setting up uid map: Permission denied"),
        ("failed", "git_error", Ending(K.git_error, "git clone failed: fatal: not a git repository"),
         "git failed: git clone failed: fatal: not a git repository"),
        ("failed", None, Ending(K.job_timeout, "the job ran past its time limit (10800 s)"),
         "the job ran past its time limit (10800 s); FROGFIX_JOB_TIMEOUT_SECONDS sets it"),
        ("failed", None, Ending(K.internal_error, "internal error: ...", cause="KeyError: 'x'"),
         "FrogFix hit an internal error (KeyError: 'x'); the worker's log has more"),
        ("failed", None, Ending(K.branch_moved, "the branch moved while the job ran"),
         "the branch moved while the job ran"),
        ("failed", None, Ending(K.worker_lost, "the worker running this job stopped 3 times; giving up"),
         "the worker running this job stopped 3 times; giving up"),
        ("no_fix", "max_turns", Ending(K.no_fix),
         "the agent used every step it may take (FROGFIX_LEAF_MAX_STEPS) without a fix"),
        ("no_fix", "max_time", Ending(K.limits, "model call ran out of time after 2 attempt(s)"),
         "the agent ran out of time (FROGFIX_JOB_TIMEOUT_SECONDS) before a fix"),
        ("failed", "max_context_len", Ending(K.limits),
         "the conversation outgrew the context the agent may use (FROGFIX_LEAF_MAX_CONTEXT_TOKENS) before a fix"),
        ("no_fix", "agent", Ending(K.refused, "adds binary file tool.exe", cause="adds binary file tool.exe"),
         "the patch was refused: adds binary file tool.exe"),
        ("no_fix", "agent", Ending(K.no_fix), "the agent ended without a fix the tests prove"),
        ("no_fix", "agent", None, "the agent ended without a fix the tests prove"),
        ("tampered", "agent", Ending(K.tampered, "attempt 1's test results were forged: x"),
         "attempt 1's test results were forged: x"),
        ("failed", "cancelled", Ending(K.stopped, "the run stopped: KeyboardInterrupt", cause="KeyboardInterrupt"),
         "the run was stopped before it ended (KeyboardInterrupt)"),
        ("cancelled", None, Ending(K.cancelled, "cancelled on request"), "it was cancelled on request"),
        ("cancelled", None, Ending(K.cancelled, "the issue is closed"), "it was cancelled: the issue is closed"),
        ("rejected", None, Ending(K.rejected, "bob may not trigger FrogFix here"),
         "the trigger was refused: bob may not trigger FrogFix here"),
        ("failed", None, None,
         "it failed without a recorded reason; the timeline and the worker's log may say more"),
    ],
)
def test_why_words_each_ending_kind(status: str, exit_reason: str | None, end: Ending | None, expected: str) -> None:
    assert why(status, exit_reason, end, model_url=URL) == expected


def test_every_ending_kind_has_words() -> None:
    """Each kind gives a sentence of its own (not the fallback), with or without a detail."""
    fallback = "it failed without a recorded reason; the timeline and the worker's log may say more"
    for kind in EndingKind:
        line = why("failed", None, Ending(kind, "x"), model_url=URL)
        assert line and "\n" not in line, kind
        if kind not in (EndingKind.unknown,):
            assert why("failed", None, Ending(kind), model_url=URL) != fallback or kind in (
                EndingKind.branch_moved, EndingKind.tampered, EndingKind.worker_lost, EndingKind.no_fix,
            ), kind


def test_no_why_for_a_job_that_did_not_fail() -> None:
    for status in ("done", "fixed", "unproven", "queued", "running", "verifying", "publishing"):
        assert why(status, "agent", None, model_url=URL) is None


def test_the_why_line_is_one_line_and_names_no_password() -> None:
    end = Ending(K.model_unreachable, "model call failed:\n connection error", cause="Connection\n refused")
    line = why("failed", "llm_query_error", end, model_url="http://user:s3cret@models.internal:30000/v1") or ""
    assert "\n" not in line and "s3cret" not in line and "user" not in line
    assert line.startswith("the model server at http://models.internal:30000/v1 could not be reached")
    assert shown_url("http://[::1]:8000/v1") == "http://[::1]:8000/v1"
    assert len(why("failed", None, Ending(K.unknown, "x" * 5000)) or "") <= 500


def test_an_error_the_why_line_did_not_say_all_of_is_worth_showing() -> None:
    config = ".frogfix.yml: unknown key test_comand; did you mean test_command?"
    end = Ending(K.config_error, config, cause="unknown key test_comand; did you mean test_command?")
    assert not says_more(config, why("failed", "config_error", end))
    model = "model call failed after 5 attempt(s): connection error: ConnectError: [Errno 111] Connection refused"
    assert says_more(model, why("failed", "llm_query_error", Ending(K.model_unreachable, model,
                                                                    cause="Connection refused"), model_url=URL))
    assert not says_more(None, None)


def test_an_ending_round_trips_through_its_dict_and_its_stored_columns() -> None:
    end = Ending(K.forge_error, "GitLab ...", http_status=503, said="down", transient=True, **GITLAB_CALL)
    assert Ending.from_dict(end.to_dict()) == end
    assert Ending.stored(end.kind, end.detail, end.facts()) == end
    assert end.to_dict()["kind"] == "forge_error" and "redirected" not in end.to_dict()
    # A record kept before endings had kinds: the kind its status or exit reason alone tells, never its text.
    assert Ending.stored(None, "sandbox failure: x", None, status="failed", exit_reason="tool_error").kind == (
        K.sandbox_failure)
    assert Ending.stored(None, "whatever", None, status="rejected").kind == K.rejected
    assert Ending.stored("not-a-kind", "t", {}, status="failed").kind == K.unknown


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
