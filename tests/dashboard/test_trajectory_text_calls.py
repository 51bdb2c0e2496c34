"""The trajectory page shows a text tool call once, as the loop read and ran it (issue 26).

The dashboard reads text calls with the loop's own reader (app/textcalls.py): a reply's prose is
shown without the raw XML of the calls it held, and each call once, with the id its answer carries.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import records
from app.trajectory import attempt_path
from app.web import views
from tests.dashboard.scenario import finished_job
from tests.doubles.openai_server import text_call
from tests.doubles.sandbox_double import SandboxDouble
from worker.leaf.loop import plan_calls, run_leaf
from worker.leaf.model import ModelReply, ReplayModel, Usage
from worker.leaf.trajectory_writer import TrajectoryWriter

PROSE = "The issue says add() subtracts; fix the operator."
EDIT = text_call("Edit", file_path="calc.py", old_string="return a - b", new_string="return a + b")
JSON_CALL = (
    '<tool_call>\n{"name": "Bash", "arguments": {"command": "python3 -m pytest -q", "timeout": 60}}\n</tool_call>'
)
BROKEN = "<tool_call>\n<function=Read>\n<parameter=file_path>calc.py</function>\n</tool_call>"  # never closed
THOUGHT = "<think>Maybe <function=Bash><parameter=command>rm -rf /</parameter></function>? No.</think>"
FINAL = "add() subtracted; it now adds."


def _reply(content: str, n: int) -> ModelReply:
    return ModelReply(message={"role": "assistant", "content": content}, finish_reason="stop",
                      usage=Usage(100 + n, 10, 110 + n, 0))


def _run(path: Path, replies: list[str]) -> SandboxDouble:
    """A real Leaf run over scripted text replies, its trajectory written by the worker's writer."""
    sandbox = SandboxDouble(files={"calc.py": "def add(a, b):\n    return a - b\n"},
                            bash={"python3 -m pytest -q": (0, "2 passed", "")})
    writer = TrajectoryWriter(path, job_id=1, model="m", sampling={}, fsync=False)
    model = ReplayModel([_reply(text, i) for i, text in enumerate(replies)])
    result = run_leaf(model, sandbox, "fix add()", system_prompt="sys", on_step=writer.on_step)
    writer.finish(result, patch=None)
    return sandbox


def test_a_text_call_is_shown_once_and_the_prose_without_its_xml(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    sandbox = _run(path, [f"{PROSE}\n\n{EDIT}", FINAL])
    assert sandbox.calls[0][0] == "Edit"
    view = views.build_trajectory(json.loads(path.read_text()))

    first = view.steps[0]
    assert first.content == PROSE  # the prose, without the call's raw XML
    [edit] = first.calls
    assert (edit.name, edit.source, edit.call_id) == ("Edit", "text", "call_text_0_0")
    assert edit.arguments == [("file_path", "calc.py"), ("old_string", "return a - b"),
                              ("new_string", "return a + b")]
    assert edit.output and "Edited calc.py" in edit.output  # the answer found by the id the loop gave it
    assert view.steps[1].content == FINAL and view.steps[1].calls == []


def test_the_page_shows_what_ran_for_every_form_the_loop_reads(signed_in: Any, data_dir: Path) -> None:
    """The JSON form (which the old regex missed), a block the loop could not read (shown once, raw, with the
    error it was answered with), a call quoted while thinking (never run, never shown as a call)."""
    job_id = finished_job(data_dir)
    path = data_dir / attempt_path(job_id, 1, 1)
    replies = [f"{PROSE}\n{EDIT}\n{JSON_CALL}", f"{THOUGHT}Reading it again.\n{BROKEN}", FINAL]
    sandbox = _run(path, replies)
    assert [name for name, _ in sandbox.calls] == ["Edit", "Bash"]  # what ran: no Read, no rm

    view = views.build_trajectory(json.loads(path.read_text()))
    assert [[c.name for c in s.calls] for s in view.steps] == [["Edit", "Bash"], ["?"], []]
    assert view.steps[0].calls[1].arguments == [("command", "python3 -m pytest -q"), ("timeout", "60")]
    broken = view.steps[1].calls[0]
    assert broken.raw_arguments == BROKEN and broken.output and "ToolCallFormatError" in broken.output
    assert view.steps[1].content == "Reading it again."
    assert view.steps[1].reasoning and "rm -rf" in view.steps[1].reasoning  # inline thinking, shown as reasoning

    with session_scope() as session:
        [attempt] = records.job_attempts(session, job_id)
    text = signed_in.get(f"/jobs/{job_id}/attempts/{attempt.id}/trajectory").text
    shown = html.unescape(text)
    assert shown.count("<function=Edit>") == 0 and shown.count('"name": "Bash"') == 0  # no raw XML or JSON
    assert shown.count(PROSE) == 1 and shown.count("return a + b") == 1  # the prose once, the argument once
    assert shown.count("<function=Read>") == 1  # the unreadable block once, inside its call
    assert text.count('class="callhead"') == 3 and text.count("text call</span>") == 3


@pytest.mark.parametrize(
    "content",
    [
        EDIT,
        f"{PROSE}\n{EDIT}\n{EDIT}",
        JSON_CALL,
        BROKEN,
        f"Use <tool_call>...</tool_call> blocks.\n{EDIT}",
        f"{THOUGHT}{EDIT}",
        "<function=Glob>\n<parameter=pattern>\n**/*.py\n</parameter>\n</function>",
        "Mentions <function=Read> in prose only.",
        FINAL,
    ],
    ids=["one", "prose-and-two", "json", "broken", "mention-and-call", "thinking", "bare-function", "mention", "final"],
)
def test_the_page_reads_the_calls_the_loop_plans(content: str) -> None:
    """One reader: for any reply, the page's calls are the loop's, in order, under the same ids."""
    planned, _ = plan_calls({"role": "assistant", "content": content}, 0)
    document = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "t"},
                             {"role": "assistant", "content": content}], "steps": []}
    [step] = views.build_trajectory(document).steps
    assert [(c.call_id, c.name) for c in step.calls] == [(p.call_id, p.name or "?") for p in planned]
    assert "<tool_call>\n<function" not in (step.content or "")
