"""worker/attempts/failures.py and the errors it reads: a job's ending is typed where the job ends (issue 38).

The kind and facts come from the exception's type and fields (a ForgeError's forge, call and HTTP status,
a RepoConfigError's problem, an environment report), never from parsing its message."""

from __future__ import annotations

import pytest

from app.endings import Ending, EndingKind
from app.forge.api import ForgeError, ForgeTransient, error_for_status, forge_call
from app.outcome_words import why
from app.retrying import RetryPolicy
from sandbox.base import SandboxError
from worker.attempts.failures import ending_of, environment_ending, stopped_ending
from worker.attempts.frogfix_yml import RepoConfigError, config_problem, config_state
from worker.environment.report import EnvironmentUnusable, failed
from worker.git.gitcalls import RepoError

CALL = "read issue #1 of acme/calc"


def test_a_forge_answer_is_typed_by_its_status_and_call() -> None:
    exc = error_for_status(401, f"GitLab {CALL}: HTTP 401 Unauthorized", forge="GitLab", call=CALL, said="Unauthorized")
    end = ending_of(exc, str(exc))
    assert (end.kind, end.forge, end.call, end.http_status) == (EndingKind.forge_error, "GitLab", CALL, 401)
    assert why("failed", None, end) == (
        f"the forge (GitLab) answered 401 to {CALL}: the FrogFix token was rejected; check FROGFIX_GITLAB_TOKEN")


def test_a_forge_that_kept_failing_says_how_the_retries_ended() -> None:
    def unreachable() -> None:
        raise ForgeTransient(f"Gitea {CALL}: ConnectError talking to the server", forge="Gitea", call=CALL,
                             said="ConnectError", unreachable=True)

    policy = RetryPolicy(attempts=2, base_delay_s=0.0, max_delay_s=0.0, sleep=lambda _s: None)
    with pytest.raises(ForgeTransient) as raised:
        forge_call(policy, CALL, unreachable)
    end = ending_of(raised.value, f"the forge or git server kept failing: {raised.value}")
    assert end.kind == EndingKind.forge_unreachable and end.transient and end.gave_up.startswith("gave up after 2")
    assert (why("failed", None, end) or "").startswith(
        f"the forge (Gitea) could not be reached for {CALL} (ConnectError, gave up after 2 attempts")


def test_the_other_exceptions_a_run_meets() -> None:
    setup = ForgeError("no GitLab token is configured (set FROGFIX_GITLAB_TOKEN)", forge="GitLab", setup=True)
    assert ending_of(setup, str(setup)).kind == EndingKind.forge_setup
    config = config_problem("unknown key x")
    assert ending_of(config, str(config)) == Ending(EndingKind.config_error, str(config), cause="unknown key x")
    assert config_state("is not valid YAML: y").problem == "it is not valid YAML: y"
    assert ending_of(RepoConfigError("AGENTS.md unreadable"), "t").cause == "AGENTS.md unreadable"
    assert ending_of(RepoError("git clone failed: x"), "git clone failed: x").kind == EndingKind.git_error
    assert ending_of(SandboxError("bwrap: denied"), "sandbox failure: bwrap: denied").cause == "bwrap: denied"
    assert ending_of(KeyError("k"), "internal error: KeyError: 'k'").kind == EndingKind.internal_error
    built = EnvironmentUnusable(failed("installing failed (exit 1)"))
    assert ending_of(built, "x").kind == EndingKind.environment_error
    started = failed("the tests could not start on the base commit: z", tests_unstartable=True)
    assert environment_ending(started, "x") == Ending(EndingKind.tests_unstartable, "x", cause=started.reason)
    stopped = stopped_ending("KeyboardInterrupt")
    assert stopped.detail == "the run stopped: KeyboardInterrupt"
    assert why("failed", "cancelled", stopped) == "the run was stopped before it ended (KeyboardInterrupt)"
