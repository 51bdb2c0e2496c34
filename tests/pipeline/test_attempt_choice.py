"""k attempts ranked (app/selection.py) in the real pipeline: every attempt runs, the evidence picks one.

The sample's `add` subtracts and tests/test_calc.py::test_add shows it. Scripted attempts whose
evidence is known: a lucky patch that special-cases the visible test (failed_before), a right
patch with a regression test of its own (reproduced), a wrong patch whose own test passes with it
but not a right patch's test (reproduced, disagreeing), and a patch that breaks `mul` (regressed).
"""

from __future__ import annotations

from typing import Any

import pytest

from app.db import session_scope
from app.jobs import records
from tests.conftest import configure
from tests.doubles.openai_server import assistant, text_call
from tests.pipeline.conftest import PROJECT, World
from tests.pipeline.test_pipeline_e2e import _branch_file, _gitlab_job, _job
from worker.job import series_run
from worker.tasks import run_job


def edit(new: str) -> str:
    return text_call("Edit", file_path="calc.py", old_string="return a - b", new_string=new)


def attempt(new: str, test: tuple[str, str] | None = None, answer: str = "Done.") -> list[Any]:
    """One attempt's turns: the edit of `add`, a regression test file when given, the final answer."""
    turns = [assistant(edit(new))]
    if test is not None:
        turns.append(assistant(text_call("Write", file_path=test[0], content=test[1])))
    return [*turns, assistant(answer)]


def regression_test(name: str, check: str) -> tuple[str, str]:
    return f"tests/test_{name}.py", f"from calc import add\n\n\ndef test_{name}() -> None:\n    assert {check}\n"


LUCKY = attempt("return 5 if (a, b) == (2, 3) else a - b", answer="Special-cased the failing input.")
RIGHT = attempt("return a + b", regression_test("add_negative", "add(-1, 1) == 0"), "add() now adds.")
RIGHT_TOO = attempt("return b + a", regression_test("add_negatives", "add(-2, -3) == -5"), "add() adds now.")
WRONG = attempt("return abs(a) + abs(b)", regression_test("add_small", "add(2, 3) == 5"), "Sum of magnitudes.")
REGRESSING = [
    assistant(edit("return a + b")),
    assistant(text_call("Edit", file_path="calc.py", old_string="return a * b", new_string="return a + b")),
    assistant("Made add add, and mul too."),
]


def choice_of(job_id: int) -> tuple[dict[str, Any], list[Any]]:
    job, _, attempts = _job(job_id)
    return job.selection, attempts


def test_a_reproduced_fix_is_chosen_over_an_earlier_lucky_pass_and_a_regression(client: Any, world: World) -> None:
    """The old rule published the first verified attempt: the lucky special case. Now all three run."""
    configure(world.env["monkeypatch"], attempts="3", verify_runs="1")
    world.model._script[:] = LUCKY + REGRESSING + RIGHT
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    selection, attempts = choice_of(job_id)
    levels = {a.number: a.tests["evidence"]["level"] for a in attempts}
    assert levels == {1: "failed_before", 2: "regressed", 3: "reproduced"}, levels
    assert selection["chosen"] == 3 and selection["attempts"] == 3
    assert [a.number for a in attempts if a.chosen] == [3]
    assert [row["attempt"] for row in selection["ranked"]] == [3, 1]  # the regressed one is no candidate
    [mr] = world.gitlab.open_mrs(PROJECT)
    description = mr["description"]
    job, _, _ = _job(job_id)
    assert "return a + b" in _branch_file(world.bare("gitlab"), job.branch, "calc.py")
    assert "### Choosing among 3 attempts" in description and "| 3 (chosen) | reproduced |" in description
    assert "attempt 3 of 3" in description and "1 other attempt(s) had no patch" in description


def test_agreeing_fixes_beat_a_smaller_one_that_agrees_with_nobody(client: Any, world: World) -> None:
    """Three reproduced patches: the wrong one is the smallest, but the others' regression tests fail
    over it, while the two right ones each pass the other's (and the wrong one's) tests."""
    configure(world.env["monkeypatch"], attempts="3", verify_runs="1")
    world.model._script[:] = WRONG + RIGHT + RIGHT_TOO
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    selection, attempts = choice_of(job_id)
    assert all(a.tests["evidence"]["level"] == "reproduced" for a in attempts)
    ranked = {row["attempt"]: row for row in selection["ranked"]}
    assert ranked[1]["agrees_with"] == [] and sorted(ranked[1]["checked"]) == [2, 3]
    assert sorted(ranked[2]["agrees_with"]) == [1, 3] and sorted(ranked[3]["agrees_with"]) == [1, 2]
    assert ranked[1]["changed_lines"] <= ranked[2]["changed_lines"]
    assert selection["chosen"] == 2, selection  # ties with 3 on agreement; the smaller, then the earlier
    _, kinds, _ = _job(job_id)
    assert kinds.count("agreement") == 6


def test_extra_attempts_run_while_idle_and_stop_when_production_arrives(
    client: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FROGFIX_ATTEMPTS=1, FROGFIX_MAX_ATTEMPTS=3: attempt 1 is only lucky, so an extra attempt starts
    (no production job queued); a production job queued during its model turns stops it at the next turn."""
    monkeypatch.setattr(series_run, "PREEMPT_POLL_S", 0.0)  # look before every call, however fast the turns
    configure(world.env["monkeypatch"], attempts="1", max_attempts="3", verify_runs="1")
    script = LUCKY + RIGHT
    queued: list[int] = []

    def respond(index: int, body: bytes) -> Any:
        if index == len(LUCKY) and not queued:  # attempt 2's first turn: production arrives meanwhile
            queued.append(_gitlab_job(client, world, title="another bug"))
        return script[index]

    world.model._responder = respond
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    selection, attempts = choice_of(job_id)
    assert [(a.number, a.status) for a in attempts] == [(1, "verified"), (2, "cancelled")]
    assert "production job" in (attempts[1].error or ""), attempts[1].error
    assert selection["chosen"] == 1 and selection["attempts"] == 1
    _, kinds, _ = _job(job_id)
    assert "attempt_preempted" in kinds and "extra_attempts_stopped" in kinds
    # The production job was left queued for its own worker; the extra attempt used one model turn.
    with session_scope() as session:
        assert records.get_job(session, queued[0]).status == "queued"
    assert world.model.count <= len(LUCKY) + 2


def test_no_extra_attempt_starts_while_a_production_job_is_queued(client: Any, world: World) -> None:
    configure(world.env["monkeypatch"], attempts="1", max_attempts="3", verify_runs="1")
    world.model._script[:] = LUCKY + RIGHT
    waiting = _gitlab_job(client, world, title="queued first")
    job_id = _gitlab_job(client, world)
    assert waiting != job_id
    assert run_job(job_id) == "done"
    selection, attempts = choice_of(job_id)
    assert [a.number for a in attempts] == [1] and selection["chosen"] == 1
    assert world.model.count == len(LUCKY)
    with session_scope() as session:
        events = [e for e in records.job_events(session, job_id) if e.kind == "extra_attempts_stopped"]
    assert events and "production job is waiting" in events[0].message


def test_extra_attempts_stop_once_a_reproduced_fix_has_an_agreeing_one(client: Any, world: World) -> None:
    configure(world.env["monkeypatch"], attempts="1", max_attempts="4", verify_runs="1")
    world.model._script[:] = RIGHT + RIGHT_TOO + LUCKY + LUCKY
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    selection, attempts = choice_of(job_id)
    assert [a.number for a in attempts] == [1, 2] and selection["chosen"] == 1
    assert world.model.count == len(RIGHT) + len(RIGHT_TOO)
    with session_scope() as session:
        events = [e for e in records.job_events(session, job_id) if e.kind == "extra_attempts_stopped"]
    assert events and "another agrees" in events[0].message


def test_every_attempt_s_requests_are_append_only_and_share_one_start(client: Any, world: World) -> None:
    """SGLang's radix cache serves a shared prefix once: each request of an attempt extends the one
    before it, and every attempt starts with the same system prompt and task (the cache's hit)."""
    import json

    configure(world.env["monkeypatch"], attempts="3", verify_runs="1")
    world.model._script[:] = LUCKY + RIGHT + RIGHT_TOO
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    requests = [json.loads(body)["messages"] for body in world.model.requests]
    assert len(requests) == len(LUCKY) + len(RIGHT) + len(RIGHT_TOO)
    starts = [i for i, messages in enumerate(requests) if len(messages) == len(requests[0])]
    assert len(starts) == 3, [len(m) for m in requests]
    for first, end in zip(starts, [*starts[1:], len(requests)], strict=True):
        assert requests[first][:2] == requests[0][:2]  # the same system prompt and task, byte for byte
        for before, after in zip(requests[first:end], requests[first + 1:end], strict=False):
            assert after[: len(before)] == before  # append-only: nothing earlier is rewritten


def by_turn(script: list[Any], together: int = 0) -> tuple[Any, list[bool]]:
    """A responder that answers each attempt's n-th turn with script[n] (attempts side by side interleave),
    holding the first turns until `together` of them arrived (they can only if the attempts run at once)."""
    import json
    import threading

    arrived = threading.Condition()
    firsts: list[int] = []
    missed: list[bool] = []

    def respond(index: int, body: bytes) -> Any:
        turn = sum(1 for m in json.loads(body)["messages"] if m["role"] == "assistant")
        if turn == 0 and together:
            with arrived:
                firsts.append(index)
                arrived.notify_all()
                if not arrived.wait_for(lambda: len(firsts) >= together, timeout=120):
                    missed.append(True)
        return script[turn]

    return respond, missed


def test_attempts_run_side_by_side_when_model_slots_are_free(client: Any, world: World) -> None:
    """FROGFIX_MODEL_SLOTS=3 and nothing else busy: the job takes two more slots, its three attempts
    send their first turns together (the shared prefix SGLang's cache serves once), and it gives the
    slots back."""
    configure(world.env["monkeypatch"], attempts="3", verify_runs="1", model_slots="3")
    world.model._responder, missed = by_turn(RIGHT, together=3)
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    assert not missed, "the attempts did not send their first turns at the same time"
    job, kinds, attempts = _job(job_id)
    assert sorted((a.number, a.status) for a in attempts) == [(1, "verified"), (2, "verified"), (3, "verified")]
    assert "side_by_side" in kinds and job.extra_slots == 0
    assert len({a.trajectory_path for a in attempts}) == 3 and job.selection["chosen"] == 1
    assert all(a.tests["evidence"]["level"] == "reproduced" for a in attempts)


def test_side_by_side_attempts_take_only_free_slots_and_none_while_production_waits(
    client: Any, world: World
) -> None:
    from app.jobs.job_slots import take_extra_slots
    from app.jobs.scheduler import production_load

    configure(world.env["monkeypatch"], attempts="3", verify_runs="1", model_slots="2")
    world.model._responder, _ = by_turn(RIGHT)
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    with session_scope() as session:
        events = [e.message for e in records.job_events(session, job_id) if e.kind == "side_by_side"]
    assert events == ["2 attempts run side by side (1 more model slot(s))"], events
    # A queued production job: no extra slot, whatever is free; a busy job counts its extra slots.
    waiting = _gitlab_job(client, world, title="waiting")
    with session_scope() as session:
        job = records.get_job(session, job_id)
        job.status, job.extra_slots = "running", 0
    with session_scope() as session:
        assert take_extra_slots(session, job_id, job.run, 2, 8, 600) == 0
    with session_scope() as session:
        records.get_job(session, waiting).status = "cancelled"
    with session_scope() as session:
        assert take_extra_slots(session, job_id, job.run, 5, 4, 600) == 3  # 4 slots, its own is one
    with session_scope() as session:
        assert production_load(session) == (0, 4)


def test_a_model_outage_in_an_extra_attempt_keeps_the_verified_fix(client: Any, world: World) -> None:
    """Found in review: attempt 1 reproduced the bug, the extra attempt met a model outage, and the job
    failed with nothing published. The outage now ends the series; the choice is made among what ran."""
    from tests.doubles.openai_server import Status

    configure(world.env["monkeypatch"], attempts="1", max_attempts="2", verify_runs="1", model_max_retries="1")

    def respond(index: int, body: bytes) -> Any:
        return RIGHT[index] if index < len(RIGHT) else Status(503, {"error": {"message": "no GPU"}})

    world.model._responder = respond
    job_id = _gitlab_job(client, world)
    assert run_job(job_id) == "done"
    selection, attempts = choice_of(job_id)
    assert [(a.number, a.status) for a in attempts] == [(1, "verified"), (2, "failed")]
    assert selection["chosen"] == 1 and len(world.gitlab.open_mrs(PROJECT)) == 1
