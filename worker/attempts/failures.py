"""The exceptions a job's run meets, as typed endings (app/endings.py): made where a job ends, from the
exception's type and typed facts (a ForgeError's forge, call and HTTP status; a RepoConfigError's problem;
an environment report), never from its message. The pipeline, its rounds and `fix` share them.
"""

from __future__ import annotations

from app.endings import Ending, EndingKind
from app.forge.api import ForgeError, ForgeTransient
from sandbox.base import SandboxError
from worker.attempts.repo_config import RepoConfigError
from worker.environment.report import EnvironmentReport, EnvironmentUnusable
from worker.git.gitcalls import RepoError, RepoTransient


def forge_ending(exc: ForgeError, detail: str) -> Ending:
    """A forge's failure as its ending, from the error's typed facts (never its message)."""
    if exc.setup:
        kind = EndingKind.forge_setup
    elif exc.unreachable and not exc.redirected:
        kind = EndingKind.forge_unreachable
    else:
        kind = EndingKind.forge_error
    return Ending(
        kind, detail, forge=exc.forge, call=exc.call, http_status=exc.status, said=exc.said, gave_up=exc.gave_up,
        transient=isinstance(exc, ForgeTransient), redirected=exc.redirected,
    )


def ending_of(exc: BaseException, detail: str) -> Ending:
    """The ending of a job a run's exception stopped, typed by the exception: `detail` is the job's error text."""
    if isinstance(exc, ForgeError):
        return forge_ending(exc, detail)
    if isinstance(exc, RepoTransient):
        return Ending(EndingKind.forge_unreachable, detail, cause=str(exc), transient=True)
    if isinstance(exc, RepoError):
        return Ending(EndingKind.git_error, detail)
    if isinstance(exc, RepoConfigError):
        return Ending(EndingKind.config_error, detail, cause=exc.problem)
    if isinstance(exc, SandboxError):
        return Ending(EndingKind.sandbox_failure, detail, cause=str(exc))
    if isinstance(exc, EnvironmentUnusable):
        return environment_ending(exc.report, detail)
    return Ending(EndingKind.internal_error, detail, cause=f"{type(exc).__name__}: {exc}")


def environment_ending(report: EnvironmentReport, detail: str) -> Ending:
    """The tests cannot run: the environment could not be built, or (built) the tests could not start."""
    kind = EndingKind.tests_unstartable if report.tests_unstartable else EndingKind.environment_error
    return Ending(kind, detail, cause=report.reason)


def stopped_ending(why: str) -> Ending:
    """`fix` stopped before it ended (Ctrl-C, SIGTERM, SIGHUP, a bug): `why` names what stopped it."""
    return Ending(EndingKind.stopped, f"the run stopped: {why}", cause=why)
