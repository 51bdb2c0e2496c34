"""Local jobs to evaluate (real `fix` runs on the demo's sample repository) and scripted candidates."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from worker.commands.demo import ISSUE_BODY, ISSUE_TITLE, demo_model, make_sample_repo
from worker.commands.fix import LocalFix
from worker.leaf.model import ModelClient, ModelReply, ReplayModel, Usage


def giving_up() -> ReplayModel:
    """A model that answers at once without changing anything: no patch, never solved."""
    message = {"role": "assistant", "content": "I cannot find the bug."}
    return ReplayModel([ModelReply(message=message, finish_reason="stop", usage=Usage(1000, 20, 1020, 0))])




def recorded_job(root: Path, solved: bool) -> str:
    """A finished local job on the sample (its tests fail before), solved or not by the recorded run."""
    repo = make_sample_repo(root)
    outcome = LocalFix(repo, ISSUE_TITLE, ISSUE_BODY, model=demo_model() if solved else giving_up()).run()
    assert outcome.status == ("fixed" if solved else "no_fix"), outcome.error
    assert outcome.before is not None and outcome.before.exit_code not in (0, None)
    return str(outcome.job_id)  # a job's key, as eval's tasks name it


class Candidate:
    """A scripted candidate that solves exactly the (task, attempt) pairs it is told to; it counts its attempts."""

    def __init__(self, solves: set[tuple[str, int]]) -> None:
        self.solves = solves
        self.calls: list[tuple[str, int]] = []
        self.on_attempt: Callable[[str, int], None] = lambda _k, _a: None

    def __call__(self, key: str, attempt: int) -> ModelClient:
        self.calls.append((key, attempt))
        self.on_attempt(key, attempt)
        return demo_model() if (key, attempt) in self.solves else giving_up()


from tests.pipeline.conftest import world  # noqa: E402, F401  (the forge world, for forge jobs to evaluate)
