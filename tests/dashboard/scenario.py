"""Jobs for the dashboard tests: seeded rows, real trajectory files, and a scripted run in a thread.

The scripted run stands in for a worker: it moves a job through the same app/jobs/ functions the
pipeline calls (claim, events, attempts, steps after every agent step, final status) and writes the
trajectory with the real TrajectoryWriter, so the dashboard reads what a worker would leave.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from app import auth
from app.db import session_scope
from app.forge.webhook import WebhookEvent
from app.jobs import intake, records, transitions
from app.models import Job, JobStatus, utcnow
from app.trajectory import attempt_path
from worker.leaf.loop import StepRecord, ToolCallRecord
from worker.leaf.model import Usage
from worker.leaf.trajectory_writer import TrajectoryWriter

USERNAME = "alice"
PASSWORD = "correct horse battery staple"

PATCH = "\n".join(
    [
        "diff --git a/calc.py b/calc.py",
        "index 8124ccd..97eb2fc 100644",
        "--- a/calc.py",
        "+++ b/calc.py",
        "@@ -2,7 +2,7 @@",
        " ",
        " ",
        " def add(a: int, b: int) -> int:",
        "-    return a - b",
        "+    return a + b",
        " ",
        " ",
        " def mul(a: int, b: int) -> int:",
    ]
) + "\n"

LONG_LOG = "\n".join(f"tests/test_calc.py::test_case_{i} PASSED" for i in range(80)) + "\n80 passed in 0.31s"
TESTS = {
    "command": "python3 -m pytest -q",
    "before": {"exit_code": 1, "log": "F.\nFAILED tests/test_calc.py::test_add - assert -1 == 5\n1 failed, 1 passed",
               "timed_out": False, "seconds": 0.4},
    "after": [{"exit_code": 0, "log": LONG_LOG, "timed_out": False, "seconds": 0.3},
              {"exit_code": 0, "log": "..\n2 passed in 0.02s", "timed_out": False, "seconds": 0.3}],
    "flaky": False,
}

# (reasoning, tool name, arguments, output) per step; the last step answers without a tool.
SCRIPT: list[tuple[str | None, str | None, dict[str, Any], str]] = [
    ("The issue says add() subtracts. Read calc.py first.", "Read", {"file_path": "calc.py"},
     'calc.py\n1. """A tiny calculator."""\n2. \n3. \n4. def add(a: int, b: int) -> int:\n5.     return a - b'),
    (None, "Bash", {"command": "python3 -m pytest -q"},
     "Exit code: 1\n" + "\n".join(f"line {i} of a long failing test log" for i in range(60))),
    ("Fix the operator.", "Edit", {"file_path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"},
     "Edited calc.py (1 replacement)."),
    (None, "Bash", {"command": "python3 -m pytest -q"}, "Exit code: 0\nSTDOUT:\n..\n2 passed in 0.02s"),
]
FINAL_ANSWER = "add() subtracted; it now adds. Tests pass."


def make_operator(username: str = USERNAME, password: str = PASSWORD) -> None:
    with session_scope() as session:
        auth.create_operator(session, username, password)


def new_job(project: str = "acme/calc", issue: int = 7, title: str = "add() returns the difference",
            sender: str = "bob", forge: str = "gitlab") -> int:
    """A queued job, created the way a webhook creates one."""
    with session_scope() as session:
        result = intake.record_delivery(
            session,
            WebhookEvent(forge, f"delivery-{project}-{issue}-{time.monotonic_ns()}", "issues", "start",
                         "the trigger label was added", project=project, issue=issue, title=title, sender=sender,
                         issue_url=f"https://git.acme.test/{project}/-/issues/{issue}"),
        )
    assert result.job_id is not None
    return result.job_id


class ScriptedTrajectory:
    """Writes a trajectory file step by step with the worker's own writer."""

    def __init__(self, path: Path, job_id: int) -> None:
        self.writer = TrajectoryWriter(
            path, job_id=job_id, model="FrogNano-4B-2609", sampling={"temperature": 0.6, "top_p": 0.95},
            base_commit="7445f7eee3b936b4c0ce26c8ba8aecf3503569ad", fsync=False,
            fields={"attempt": 1, "run": 1, "forge": "gitlab", "project": "acme/calc", "issue": 7},
        )
        self.history: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a software-engineering agent."},
            {"role": "user", "content": "Fix the bug in the issue below.\n\nTitle: add() returns the difference"},
        ]
        self.steps = 0
        self.records: list[StepRecord] = []

    def step(self, index: int) -> None:
        reasoning, tool, arguments, output = SCRIPT[index % len(SCRIPT)]
        call_id = f"call_{index}"
        assistant: dict[str, Any] = {"role": "assistant", "content": None}
        if reasoning:
            assistant["reasoning_content"] = reasoning
        assistant["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}
        ]
        answer = {"role": "tool", "tool_call_id": call_id, "content": output}
        self.history += [assistant, answer]
        record = StepRecord(
            step=index, assistant=assistant, tool_messages=[answer],
            calls=[ToolCallRecord(call_id, str(tool), arguments, output, 0.05, "native")],
            finish_reason="tool_calls", usage=Usage(100 + index, 20, 120 + index), model_seconds=0.2,
            tool_seconds=0.05, text_calls=False, context_tokens=200 + index * 50, history=self.history,
        )
        self.records.append(record)
        self.writer.on_step(record)
        self.steps = index + 1

    def finish(self, patch: str | None) -> None:
        from worker.leaf.loop import LeafResult, UsageTotals

        final = {"role": "assistant", "content": FINAL_ANSWER}
        self.history.append(final)
        result = LeafResult("agent", self.steps + 1, self.history, FINAL_ANSWER, UsageTotals(500, 100, self.steps + 1),
                            None, 2.0, 1.0, 0.5, self.records)
        self.writer.finish(result, patch=patch)


def finished_job(data_dir: Path, status: str = "done", *, project: str = "acme/calc", issue: int = 7,
                 steps: int = 4, with_trajectory: bool = True, age_minutes: float = 30) -> int:
    """A job that already ran to `status`, with one attempt, its patch, tests and trajectory."""
    job_id = new_job(project=project, issue=issue)
    stored = attempt_path(job_id, 1, 1)  # relative to the data folder, as the worker records it
    path = data_dir / stored
    if with_trajectory:
        trajectory = ScriptedTrajectory(path, job_id)
        for i in range(steps):
            trajectory.step(i)
        trajectory.finish(PATCH if status == "done" else None)
    started = utcnow() - timedelta(minutes=age_minutes)
    with session_scope() as session:
        assert transitions.claim_job(session, job_id)
        attempt_id = records.start_attempt(session, job_id, 1, 1)
        records.update_attempt(
            session, attempt_id, finished=True, status="verified" if status == "done" else "no_fix",
            steps=steps, trajectory_path=stored if with_trajectory else None,
            patch=PATCH if status == "done" else None, summary=FINAL_ANSWER, tests=TESTS if status == "done" else None,
            exit_reason="agent",
        )
        records.add_event(session, job_id, "admitted", "bob may trigger; issue re-read from the API")
        records.add_event(session, job_id, "agent_started", "attempt 1: running the agent")
        records.update_job(session, job_id, steps=steps, exit_reason="agent", base_commit="7445f7eee3b9",
                        branch="frogfix/issue-7", started_at=started)
        extra: dict[str, Any] = {}
        if status == "done":
            extra["mr_url"] = "https://git.acme.test/acme/calc/-/merge_requests/3"
        transitions.set_status(session, job_id, JobStatus(status),
                        error="the model could not be used" if status == "failed" else None, **extra)
        records.add_event(session, job_id, status, f"finished: {status}")
    return job_id


class ScriptedRun(threading.Thread):
    """A worker stand-in: claims the job, takes `steps` agent steps `delay` seconds apart, then ends.

    It checks for a cancel request before each step, as the pipeline does, and stops when asked.
    `hold` keeps it at its last step until released (for tests that cancel a running job).
    """

    def __init__(self, job_id: int, data_dir: Path, steps: int = 4, delay: float = 0.5, hold: bool = False) -> None:
        super().__init__(daemon=True, name=f"scripted-run-{job_id}")
        self.job_id, self.data_dir, self.steps, self.delay = job_id, data_dir, steps, delay
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self.outcome: str | None = None
        self.error: BaseException | None = None

    def _cancelled(self) -> bool:
        with session_scope() as session:
            return records.cancel_requested(session, self.job_id)

    def _event(self, kind: str, message: str) -> None:
        with session_scope() as session:
            records.add_event(session, self.job_id, kind, message)

    def run(self) -> None:
        try:
            self.outcome = self._run()
        except BaseException as exc:  # the test reports it
            self.error = exc

    def _run(self) -> str:
        with session_scope() as session:
            assert transitions.claim_job(session, self.job_id)
        self._event("admitted", "bob may trigger; issue re-read from the API")
        self._event("prepared", "mirror updated; base main at 7445f7eee3b9")
        with session_scope() as session:
            records.update_job(session, self.job_id, base_commit="7445f7eee3b936b4c0ce26c8ba8aecf3503569ad",
                            branch="frogfix/issue-7")
            attempt_id = records.start_attempt(session, self.job_id, 1, 1)
        stored = attempt_path(self.job_id, 1, 1)
        trajectory = ScriptedTrajectory(self.data_dir / stored, self.job_id)
        with session_scope() as session:
            records.update_attempt(session, attempt_id, trajectory_path=stored)
        self._event("agent_started", "attempt 1: running the agent (FrogNano-4B-2609)")
        for index in range(self.steps):
            time.sleep(self.delay)
            if self._cancelled():
                return self._end_cancelled(attempt_id, trajectory)
            trajectory.step(index)
            with session_scope() as session:
                records.update_attempt(session, attempt_id, steps=index + 1)
                records.update_job(session, self.job_id, steps=index + 1)
        while not self.release.wait(0.1):
            if self._cancelled():
                return self._end_cancelled(attempt_id, trajectory)
        trajectory.finish(PATCH)
        with session_scope() as session:
            records.update_attempt(session, attempt_id, finished=True, status="verified", exit_reason="agent",
                                steps=self.steps, patch=PATCH, summary=FINAL_ANSWER, tests=TESTS)
            records.update_job(session, self.job_id, exit_reason="agent", steps=self.steps)
            transitions.set_status(session, self.job_id, JobStatus.verifying)
        self._event("agent_finished", f"attempt 1: agent after {self.steps} steps")
        time.sleep(self.delay)
        self._event("verified", "attempt 1: tests before exit 1, after exit 0, 0")
        mr = "https://git.acme.test/acme/calc/-/merge_requests/3"
        with session_scope() as session:
            transitions.set_status(session, self.job_id, JobStatus.publishing, expected=("verifying",))
        time.sleep(self.delay / 2)
        with session_scope() as session:
            records.update_job(session, self.job_id, mr_url=mr)
            transitions.set_status(session, self.job_id, JobStatus.done, expected=("publishing",))
            records.add_event(session, self.job_id, "done", f"opened draft {mr}")
        return "done"

    def _end_cancelled(self, attempt_id: int, trajectory: ScriptedTrajectory) -> str:
        trajectory.finish(None)
        with session_scope() as session:
            records.update_attempt(session, attempt_id, finished=True, status="cancelled", exit_reason="cancelled")
            transitions.set_status(session, self.job_id, JobStatus.cancelled, error="cancelled on request")
            records.add_event(session, self.job_id, "cancelled", "cancelled on request")
        return "cancelled"


def job_status(job_id: int) -> str:
    with session_scope() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.status
