"""Whole Leaf runs: a scripted model over real HTTP, an in-process sandbox double."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from app.textcalls import ERROR_NAME, UNREAD_REPLY
from sandbox.base import SandboxError
from tests.doubles.openai_server import (
    Hang,
    ScriptedOpenAIServer,
    Status,
    assistant,
    prefix_extensions,
    text_call,
    tool_call,
)
from tests.doubles.sandbox_double import SandboxDouble
from worker.leaf.loop import (
    LeafLimits,
    LeafResult,
    LeafRun,
    StepRecord,
    estimate_tokens,
    history_message,
    initial_messages,
    run_leaf,
    trim_output,
)
from worker.leaf.model import ModelReply, OpenAIChatModel, ReplayModel, Usage
from worker.leaf.tools import TOOL_SCHEMAS

Serve = Callable[..., ScriptedOpenAIServer]
ClientFor = Callable[..., OpenAIChatModel]
SYSTEM = "You are a software-engineering agent in a checked-out repository."


def run(model: Any, sandbox: SandboxDouble | None = None, **kwargs: Any) -> LeafResult:
    return run_leaf(model, sandbox or SandboxDouble(), "Fix the bug.", system_prompt=SYSTEM, **kwargs)


def assert_prefix_chain(server: ScriptedOpenAIServer) -> None:
    good, pairs = prefix_extensions(server.requests)
    assert good == pairs, f"only {good} of {pairs} requests extend the previous one byte for byte"
    assert (server.prefix_ok, server.prefix_pairs) == (good, pairs)  # the server's own online count


def tool_messages(result: LeafResult) -> list[dict[str, Any]]:
    return [m for m in result.messages if m["role"] == "tool"]


def test_native_calls_then_final_answer(serve: Serve, client_for: ClientFor) -> None:
    sandbox = SandboxDouble(files={"src/calc.py": "def add(a, b):\n    return a - b\n"},
                            bash={"pytest -q": (0, "1 passed", "")})
    server = serve(
        assistant(None, reasoning="Look first.", tool_calls=[tool_call("Read", {"file_path": "src/calc.py"}, "c1")]),
        assistant("Fixing.", tool_calls=[tool_call(
            "Edit", {"file_path": "src/calc.py", "old_string": "a - b", "new_string": "a + b"}, "c2")]),
        assistant(None, tool_calls=[tool_call("Bash", {"command": "pytest -q", "timeout": 60}, "c3")]),
        assistant("Fixed the sign in add().", reasoning="Tests pass."),
    )
    steps: list[StepRecord] = []
    result = run(client_for(server), sandbox, on_step=steps.append)

    assert result.exit_reason == "agent"
    assert result.steps == 4 and len(steps) == 4 and result.records == steps
    assert result.final_answer == "Fixed the sign in add()."
    assert result.error is None
    assert sandbox.files["src/calc.py"] == "def add(a, b):\n    return a + b\n"
    assert [name for name, _ in sandbox.calls] == ["Read", "Edit", "Bash"]
    assert sandbox.calls[2][1] == {"command": "pytest -q", "timeout": 60}
    # History: system, user, then assistant/tool pairs, the assistant messages as returned.
    assert [m["role"] for m in result.messages] == [
        "system", "user", "assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant",
    ]
    assert result.messages[0] == {"role": "system", "content": SYSTEM}
    assert result.messages[2]["reasoning_content"] == "Look first."
    assert result.messages[2]["tool_calls"][0]["id"] == "c1"
    assert result.messages[3] == {"role": "tool", "tool_call_id": "c1",
                                  "content": "src/calc.py\n1. def add(a, b):\n2.     return a - b"}
    assert result.messages[-1] == {"role": "assistant", "content": "Fixed the sign in add().",
                                   "reasoning_content": "Tests pass."}
    # Every request carried the five tools and the whole history so far.
    for index in range(4):
        body = server.request_json(index)
        assert body["tools"] == TOOL_SCHEMAS
        assert body["messages"] == result.messages[: len(body["messages"])]
    assert server.request_json(3)["messages"] == result.messages[:-1]
    assert_prefix_chain(server)
    # The double counts a quarter of each body's bytes as its prompt tokens, as SGLang reports them.
    prompts = [math.ceil(len(body) / 4) for body in server.requests]
    assert result.usage.calls == 4 and result.usage.prompt_tokens == sum(prompts)
    assert result.usage.completion_tokens == 40
    assert steps[0].to_dict()["tool_calls"][0]["name"] == "Read"


def test_parallel_calls_run_in_order_each_answered(serve: Serve, client_for: ClientFor) -> None:
    sandbox = SandboxDouble(files={"a.py": "A", "b.py": "B"})
    server = serve(
        assistant(None, tool_calls=[
            tool_call("Read", {"file_path": "a.py"}, "p1"),
            tool_call("Read", {"file_path": "b.py"}, "p2"),
            tool_call("Glob", {"pattern": "*.py"}, "p3"),
        ]),
        assistant("Both read."),
    )
    result = run(client_for(server), sandbox)
    assert result.exit_reason == "agent"
    assert [c[1].get("file_path") or c[1].get("pattern") for c in sandbox.calls] == ["a.py", "b.py", "*.py"]
    assert [(m["tool_call_id"], m["content"]) for m in tool_messages(result)] == [
        ("p1", "a.py\n1. A"), ("p2", "b.py\n1. B"), ("p3", "a.py\nb.py"),
    ]
    assert_prefix_chain(server)


def test_text_calls_get_synthetic_ids_and_the_message_stays_as_returned(
    serve: Serve, client_for: ClientFor
) -> None:
    sandbox = SandboxDouble(files={"a.py": "x = 1\ny = 2\n"})
    content = "<think>Read two lines.</think>\n" + text_call("Read", file_path="a.py", offset=2, limit=1) + "\n" + \
        text_call("Edit", file_path="a.py", old_string="y = 2", new_string="y = 3", replace_all=False)
    server = serve(assistant(content), assistant("Done."))
    result = run(client_for(server), sandbox)

    assert result.exit_reason == "agent"
    assert sandbox.calls == [
        ("Read", {"file_path": "a.py", "offset": 2, "limit": 1}),
        ("Edit", {"file_path": "a.py", "old_string": "y = 2", "new_string": "y = 3", "replace_all": False}),
    ]
    assert result.messages[2] == {"role": "assistant", "content": content}  # not rewritten
    assert [m["tool_call_id"] for m in tool_messages(result)] == ["call_text_0_0", "call_text_0_1"]
    assert tool_messages(result)[0]["content"] == "a.py\n2. y = 2"
    assert result.records[0].text_calls is True
    assert_prefix_chain(server)


def test_a_call_in_reasoning_content_is_never_run(serve: Serve, client_for: ClientFor) -> None:
    """It used to be read out of reasoning_content and run; SGLang never does that."""
    sandbox = SandboxDouble(files={"a.py": "A"})
    thought = "I need the file.\n" + text_call("Bash", command="rm -rf src")
    server = serve(assistant("\n\nNothing to change: a.py is right.", reasoning=thought), assistant("never"))
    result = run(client_for(server), sandbox)
    assert sandbox.calls == []
    assert (result.exit_reason, result.final_answer, len(server.requests)) == (
        "agent", "Nothing to change: a.py is right.", 1)
    assert result.messages[-1]["reasoning_content"] == thought  # kept as returned, just not run


@pytest.mark.parametrize("content", ["\n\n", "", "  \n", "<think>only thinking</think>\n\n"])
def test_a_reply_without_a_call_or_an_answer_is_not_a_final_answer(
    serve: Serve, client_for: ClientFor, content: str
) -> None:
    """SGLang strips a <tool_call> it cannot read and sends "\n\n": that used to end the run as
    a successful final answer with empty text. The model now hears its call was not understood."""
    server = serve(assistant(content, reasoning="Call Read.\n"), assistant("\n\nDone."))
    result = run(client_for(server), SandboxDouble())
    assert (result.exit_reason, result.final_answer, len(server.requests)) == ("agent", "Done.", 2)
    told = server.request_json(1)["messages"][-1]
    assert told == {"role": "tool", "tool_call_id": "call_text_0_0", "content": UNREAD_REPLY}
    assert told["content"].startswith(f"{ERROR_NAME}: ")
    assert server.request_json(1)["messages"][-2] == {"role": "assistant", "content": content,
                                                      "reasoning_content": "Call Read.\n"}
    assert result.records[0].calls[0].rejected and result.records[0].text_calls
    assert_prefix_chain(server)


def test_empty_replies_use_up_the_step_budget(serve: Serve, client_for: ClientFor) -> None:
    server = serve(*[assistant("\n\n") for _ in range(3)])
    result = run(client_for(server), limits=LeafLimits(max_steps=3))
    assert (result.exit_reason, result.steps, len(server.requests)) == ("max_turns", 3, 3)


def test_malformed_text_call_is_answered_with_an_error(serve: Serve, client_for: ClientFor) -> None:
    broken = "<tool_call>\n<function=Read>\nfile_path=a.py\n</function>\n</tool_call>"
    server = serve(assistant(broken), assistant("giving up"))
    sandbox = SandboxDouble()
    result = run(client_for(server), sandbox)
    assert sandbox.calls == []
    [answer] = tool_messages(result)
    assert answer["content"].startswith("ToolCallFormatError: ")
    assert result.exit_reason == "agent"


def test_abort_is_sent_again_and_never_appended(serve: Serve, client_for: ClientFor) -> None:
    """finish_reason abort (HTTP 200) used to be taken as the final answer."""
    aborted = assistant("", reasoning="Half a thought", finish_reason="abort")
    server = serve(aborted, aborted, assistant("\n\nDone."))
    result = run(client_for(server))
    assert (result.exit_reason, result.final_answer, result.steps) == ("agent", "Done.", 1)
    assert len(server.requests) == 3 and len(set(server.requests)) == 1  # the same messages each time
    assert [m["role"] for m in result.messages] == ["system", "user", "assistant"]


def test_abort_after_the_retry_budget_is_llm_query_error(serve: Serve, client_for: ClientFor) -> None:
    call = tool_call("Bash", {"command": "rm -rf src"})
    server = serve(*[assistant(None, tool_calls=[call], finish_reason="abort")] * 3)
    sandbox = SandboxDouble()
    result = run(client_for(server, max_retries=2), sandbox)
    assert result.exit_reason == "llm_query_error" and result.error and "abort" in result.error
    assert sandbox.calls == [] and len(server.requests) == 3 and len(result.messages) == 2


def test_an_abort_from_another_client_ends_the_run_unappended() -> None:
    aborted = ModelReply({"role": "assistant", "content": "", "tool_calls": [tool_call("Bash", {"command": "ls"})]},
                         "abort")
    sandbox = SandboxDouble()
    result = run(ReplayModel([aborted]), sandbox)
    assert (result.exit_reason, result.steps, result.records, sandbox.calls) == ("llm_query_error", 0, [], [])
    assert result.model_calls_made == 1 and result.figures().model_calls == 1  # a call, no step
    assert len(result.messages) == 2


def strict_json(body: bytes) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"{token} in a request")

    return json.loads(body, parse_constant=refuse)


@pytest.mark.parametrize("arguments", [
    '{"command": "sleep 1", "timeout": Infinity}',
    '{"command": "sleep 1", "timeout": -Infinity}',
    '{"command": "sleep 1", "timeout": NaN}',
    '{"command": "sleep 1", "nested": {"list": [1, NaN]}}',
])
def test_non_finite_arguments_get_an_answer_and_every_later_request_is_strict(
    serve: Serve, client_for: ClientFor, arguments: str
) -> None:
    """SGLang writes inf as a bare Infinity; echoed back, it made every later request a 400."""
    server = serve(assistant(None, tool_calls=[tool_call("Bash", arguments, "n1")]),
                   assistant(None, tool_calls=[tool_call("Glob", {"pattern": "*"}, "g1")]),
                   assistant("\n\nDone."))
    sandbox = SandboxDouble()
    result = run(client_for(server), sandbox)
    assert (result.exit_reason, result.final_answer, len(server.requests)) == ("agent", "Done.", 3)
    assert [name for name, _ in sandbox.calls] == ["Glob"]  # the Bash call was answered, not run
    answer = tool_messages(result)[0]
    assert answer["tool_call_id"] == "n1" and answer["content"].startswith("ValueError: ")
    assert "not finite" in answer["content"]
    for body in server.requests[1:]:
        for message in strict_json(body)["messages"]:
            for call in message.get("tool_calls") or []:
                assert isinstance(strict_json(call["function"]["arguments"].encode()), dict)
    rewritten = json.loads(result.messages[2]["tool_calls"][0]["function"]["arguments"])
    assert rewritten["command"] == "sleep 1"
    assert_prefix_chain(server)  # rewritten once, when appended: the history still only grows


def test_history_arguments_that_are_no_json_object_are_rewritten_once() -> None:
    calls = [tool_call("Read", '{"file_path": "a.py"', "j1"), tool_call("Read", "[1, 2]", "j2"),
             tool_call("Read", {"file_path": "a.py"}, "j3")]
    message = history_message({"role": "assistant", "content": "\n\n", "tool_calls": calls})
    assert [c["function"]["arguments"] for c in message["tool_calls"]] == ["{}", "{}", '{"file_path": "a.py"}']
    assert message["tool_calls"][2] is calls[2]  # strict ones are kept exactly as returned
    strict = calls[2:]
    assert history_message({"role": "assistant", "content": "", "tool_calls": strict})["tool_calls"] is strict


def test_broken_json_arguments_and_unknown_tool_go_back_to_the_model(
    serve: Serve, client_for: ClientFor
) -> None:
    server = serve(
        assistant(None, tool_calls=[
            tool_call("Read", '{"file_path": "a.py"', "j1"),
            tool_call("Read", "[1, 2]", "j2"),
            tool_call("Browse", {"url": "http://example.com"}, "j3"),
            tool_call("Read", {"file_path": "a.py"}, "j4"),
        ]),
        assistant("ok"),
    )
    sandbox = SandboxDouble(files={"a.py": "A"})
    result = run(client_for(server), sandbox)
    answers = [m["content"] for m in tool_messages(result)]
    assert answers[0].startswith("JSONDecodeError: ")
    assert answers[1].startswith("TypeError: tool arguments must be a JSON object")
    assert answers[2] == "Unknown tool: Browse"
    assert answers[3] == "a.py\n1. A"
    assert sandbox.calls == [("Read", {"file_path": "a.py"})]
    assert [c.rejected for c in result.records[0].calls] == [True, True, True, False]
    assert result.exit_reason == "agent"


def test_finish_reason_length_ends_the_run(serve: Serve, client_for: ClientFor) -> None:
    server = serve(assistant("partial <tool_call>\n<function=Re", finish_reason="length",
                             usage={"prompt_tokens": 1000, "completion_tokens": 8192}))
    sandbox = SandboxDouble()
    result = run(client_for(server), sandbox)
    assert result.exit_reason == "max_tokens_per_turn"
    assert sandbox.calls == []
    assert result.messages[-1]["content"].startswith("partial")


def test_length_with_tool_calls_does_not_run_them(serve: Serve, client_for: ClientFor) -> None:
    server = serve(assistant(None, tool_calls=[tool_call("Bash", {"command": "rm -rf /"})], finish_reason="length",
                             usage={"prompt_tokens": 131000, "completion_tokens": 72}))
    sandbox = SandboxDouble()
    result = run(client_for(server), sandbox)
    assert result.exit_reason == "max_context_len"  # the turn was cut because the context ran out
    assert sandbox.calls == []


def test_server_errors_are_retried_within_a_run(serve: Serve, client_for: ClientFor) -> None:
    server = serve(Status(500), Status(502), assistant("fine"))
    result = run(client_for(server))
    assert (result.exit_reason, result.final_answer) == ("agent", "fine")
    assert len(server.requests) == 3


def test_server_that_never_answers_ends_with_llm_query_error(serve: Serve, client_for: ClientFor) -> None:
    server = serve(Hang(), Hang())
    started = time.monotonic()
    result = run(client_for(server, timeout=0.3, max_retries=1))
    assert result.exit_reason == "llm_query_error"
    assert result.error and "timed out" in result.error
    assert time.monotonic() - started < 10  # two 0.3 s tries, not the double's hour-long hang
    # "steps" are replies (trajectory, job page, fix --json agree); the call without one is still a call made.
    assert (result.steps, result.model_calls_made, result.records) == (0, 1, [])


def test_context_overflow_answer_ends_with_max_context_len(serve: Serve, client_for: ClientFor) -> None:
    overflow = "The input (131100 tokens) is longer than the model's context length (131072 tokens)."
    server = serve(
        assistant(None, tool_calls=[tool_call("Glob", {"pattern": "**/*"})]),
        Status(400, {"object": "error", "code": 400, "message": overflow}),
    )
    result = run(client_for(server))
    assert result.exit_reason == "max_context_len"
    assert result.error and "context length" in result.error
    assert len(server.requests) == 2


def test_usage_reaching_the_context_limit_ends_the_run(serve: Serve, client_for: ClientFor) -> None:
    server = serve(assistant(None, tool_calls=[tool_call("Glob", {"pattern": "*"})],
                             usage={"prompt_tokens": 120_000, "completion_tokens": 1_000}))
    result = run(client_for(server), limits=LeafLimits(max_context_tokens=121_000))
    assert result.exit_reason == "max_context_len"
    assert result.steps == 1
    assert result.usage.context_tokens >= 121_000


def test_max_turns(serve: Serve, client_for: ClientFor) -> None:
    server = serve(*[assistant(None, tool_calls=[tool_call("Glob", {"pattern": "*"})]) for _ in range(5)])
    result = run(client_for(server), limits=LeafLimits(max_steps=3))
    assert (result.exit_reason, result.steps, len(server.requests)) == ("max_turns", 3, 3)
    assert_prefix_chain(server)


def test_max_time(serve: Serve, client_for: ClientFor) -> None:
    now = [0.0]

    def clock() -> float:
        now[0] += 40.0
        return now[0]

    server = serve(*[assistant(None, tool_calls=[tool_call("Glob", {"pattern": "*"})]) for _ in range(5)])
    result = run(client_for(server), limits=LeafLimits(max_seconds=100.0), clock=clock)
    assert result.exit_reason == "max_time"
    assert result.steps == 2  # started at 40: steps at 80 and 120 fit, the check at 160 does not


def test_model_call_cut_by_the_run_deadline_is_max_time(serve: Serve, client_for: ClientFor) -> None:
    server = serve(Hang(), Hang())
    started = time.monotonic()
    result = run(client_for(server, timeout=30.0), limits=LeafLimits(max_seconds=0.4))
    assert result.exit_reason == "max_time"
    assert time.monotonic() - started < 10  # the run's 0.4 s, not the call's 30 s


def test_sandbox_failure_is_tool_error(serve: Serve, client_for: ClientFor) -> None:
    server = serve(assistant(None, tool_calls=[tool_call("Bash", {"command": "ls"})]), assistant("never"))
    result = run(client_for(server), SandboxDouble(fail_on={"Bash"}))
    assert result.exit_reason == "tool_error"
    assert result.error and result.error.startswith("SandboxError: ")
    assert len(server.requests) == 1


def test_cancel_between_tool_calls(serve: Serve, client_for: ClientFor) -> None:
    sandbox = SandboxDouble(files={"a.py": "A"})
    server = serve(assistant(None, tool_calls=[tool_call("Read", {"file_path": "a.py"}),
                                               tool_call("Bash", {"command": "make"})]))
    result = run(client_for(server), sandbox, cancel=lambda: len(sandbox.calls) >= 1)
    assert result.exit_reason == "cancelled"
    assert [name for name, _ in sandbox.calls] == ["Read"]
    assert len(result.records) == 1  # the partial step was still reported


def test_cancel_before_the_first_call(serve: Serve, client_for: ClientFor) -> None:
    server = serve(assistant("never"))
    result = run(client_for(server), cancel=lambda: True)
    assert (result.exit_reason, result.steps, server.requests) == ("cancelled", 0, [])


def test_tool_output_is_trimmed_once_when_appended(serve: Serve, client_for: ClientFor) -> None:
    sandbox = SandboxDouble(bash={"big": (0, "x" * 5000, "")})
    server = serve(assistant(None, tool_calls=[tool_call("Bash", {"command": "big"})]), assistant("ok"))
    result = run(client_for(server), sandbox, limits=LeafLimits(max_tool_output_chars=1000))
    [answer] = tool_messages(result)
    full = "Exit code: 0\nSTDOUT:\n" + "x" * 5000 + "\nSTDERR:\n"
    assert answer["content"] == full[:1000] + f"\n[truncated {len(full) - 1000} chars]"
    assert server.request_json(1)["messages"][-1] == answer
    assert trim_output("abcdef", 3) == "abc\n[truncated 3 chars]"
    assert trim_output("abc", 3) == "abc"


def test_on_step_failure_does_not_end_the_run(serve: Serve, client_for: ClientFor) -> None:
    def broken(record: StepRecord) -> None:
        raise RuntimeError("database is gone")

    server = serve(assistant(None, tool_calls=[tool_call("Glob", {"pattern": "*"})]), assistant("done"))
    with capture_logs() as logs:
        assert run(client_for(server), on_step=broken).exit_reason == "agent"
    # worker/leaf logs through structlog only (as model.py), with the step as a field
    assert [(e["event"], e["step"], e["log_level"]) for e in logs if e["event"] == "leaf_on_step_failed"] == [
        ("leaf_on_step_failed", 0, "warning"), ("leaf_on_step_failed", 1, "warning")]


def test_history_message_keeps_only_what_the_template_reads() -> None:
    returned: dict[str, Any] = {"role": "assistant", "content": "hi", "reasoning_content": None, "tool_calls": [],
                "refusal": None, "function_call": None}
    assert history_message(returned) == {"role": "assistant", "content": "hi"}


def test_replay_reproduces_a_run(serve: Serve, client_for: ClientFor) -> None:
    script = [
        assistant(None, tool_calls=[tool_call("Write", {"file_path": "n.py", "content": "print(1)\n"}, "w1")]),
        assistant(text_call("Read", file_path="n.py")),
        assistant("All good."),
    ]
    server = serve(*script)
    first = run(client_for(server), SandboxDouble())
    replayed = run(ReplayModel(ModelReply(m, None) for m in first.messages if m["role"] == "assistant"),
                   SandboxDouble())
    assert replayed.exit_reason == first.exit_reason == "agent"
    assert json.dumps(replayed.messages) == json.dumps(first.messages)


def test_usage_totals_use_server_reports() -> None:
    replies = [ModelReply({"role": "assistant", "content": None,
                           "tool_calls": [tool_call("Glob", {"pattern": "*"}, "g")]}, "tool_calls",
                          Usage(100 * (i + 1), 5, 0)) for i in range(2)]
    replies.append(ModelReply({"role": "assistant", "content": "end"}, "stop", None))
    result = run(ReplayModel(replies))
    assert result.usage.prompt_tokens == 300 and result.usage.completion_tokens == 10
    assert result.usage.calls == 3


@pytest.mark.parametrize("fail", [True, False])
def test_model_client_bug_is_llm_query_error(fail: bool) -> None:
    class Exploding:
        def complete(self, *args: Any, **kwargs: Any) -> ModelReply:
            raise KeyError("bug")

    result = run(Exploding() if fail else ReplayModel([]))
    assert result.exit_reason == "llm_query_error"


# Each exit, pinned without HTTP: the recorded-model double answers at once, the clock is scripted.

def replies(*messages: dict[str, Any], usage: Usage | None = None) -> ReplayModel:
    return ReplayModel(ModelReply(m, "tool_calls" if m.get("tool_calls") else "stop", usage) for m in messages)


def glob_turn(call_id: str = "g") -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [tool_call("Glob", {"pattern": "*"}, call_id)]}


@pytest.mark.parametrize(("finish", "usage", "reason"), [
    ("length", None, "max_tokens_per_turn"),  # no usage: the turn's own cap
    ("max_tokens", Usage(1000, 8192, 9192), "max_tokens_per_turn"),
    ("LENGTH", Usage(1000, 500, 1500), "max_context_len"),  # the server shortened the turn to fit
    ("max_new_tokens", Usage(130_000, 1072, 131_072), "max_context_len"),
])
def test_length_exit_reasons(finish: str, usage: Usage | None, reason: str) -> None:
    content = "<think>Plan the edit.</think>\nAlmost there.  "
    sandbox = SandboxDouble()
    seen: list[StepRecord] = []
    result = run(ReplayModel([ModelReply({"role": "assistant", "content": content}, finish, usage)]),
                 sandbox, on_step=seen.append)
    assert (result.exit_reason, result.error, result.steps) == (reason, None, 1)
    assert result.final_answer == "Almost there."
    assert sandbox.calls == [] and result.records == seen and len(seen) == 1
    assert seen[0].tool_messages == [] and seen[0].finish_reason == finish


@pytest.mark.parametrize("failure", [SandboxError("pod gone"), RuntimeError("runner bug")])
def test_tool_error_reports_the_partial_step(failure: Exception) -> None:
    class Failing(SandboxDouble):
        def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
            if self.calls:
                self.calls.append((name, dict(arguments)))
                raise failure
            return super().call_tool(name, arguments)

    sandbox = Failing(files={"a.py": "A"})
    turn = {"role": "assistant", "content": None, "tool_calls": [
        tool_call("Read", {"file_path": "a.py"}, "r1"), tool_call("Bash", {"command": "ls"}, "b1"),
        tool_call("Read", {"file_path": "a.py"}, "r2")]}
    seen: list[tuple[int, int]] = []
    result = run(replies(turn, {"role": "assistant", "content": "never"}), sandbox,
                 on_step=lambda record: seen.append((record.step, len(record.history))))
    assert (result.exit_reason, result.error) == ("tool_error", f"{type(failure).__name__}: {failure}")
    assert [name for name, _ in sandbox.calls] == ["Read", "Bash"]
    assert [m.get("tool_call_id") for m in result.messages[3:]] == ["r1"]  # the failed call is not answered
    assert seen == [(0, 4)] and [c.call_id for c in result.records[0].calls] == ["r1"]
    assert result.final_answer == "" and result.steps == 1


def test_cancel_before_a_later_model_call() -> None:
    seen: list[StepRecord] = []
    model = replies(glob_turn(), {"role": "assistant", "content": "never"})
    result = run(model, on_step=seen.append, cancel=lambda: len(seen) >= 1)
    assert (result.exit_reason, result.steps, len(seen), model.remaining) == ("cancelled", 1, 1, 1)
    assert result.messages[-1]["role"] == "tool"


def test_a_failing_cancel_check_carries_on() -> None:
    def broken() -> bool:
        raise OSError("database is gone")

    result = run(replies(glob_turn(), {"role": "assistant", "content": "done"}), cancel=broken)
    assert (result.exit_reason, result.final_answer, result.steps) == ("agent", "done", 2)


def test_on_step_runs_once_per_step_after_its_tool_answers() -> None:
    seen: list[tuple[int, int, int]] = []
    result = run(replies(glob_turn("g1"), glob_turn("g2"), {"role": "assistant", "content": "done"}),
                 on_step=lambda r: seen.append((r.step, len(r.history), len(r.tool_messages))))
    assert seen == [(0, 4, 1), (1, 6, 1), (2, 7, 0)]
    assert [r.step for r in result.records] == [0, 1, 2]


def test_tool_output_that_is_not_text_is_stringified() -> None:
    class Numbers(SandboxDouble):
        def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
            return 42  # type: ignore[return-value]

    result = run(replies(glob_turn(), {"role": "assistant", "content": "ok"}), Numbers())
    assert tool_messages(result)[0]["content"] == "42"


def test_context_is_estimated_without_usage_reports() -> None:
    model = replies(glob_turn(), glob_turn("g2"))
    result = run(model, limits=LeafLimits(max_context_tokens=60))
    pieces = [result.messages[:2], result.messages[2:3], result.messages[3:]]
    expected = sum(estimate_tokens(piece) for piece in pieces)
    assert expected >= 60 > estimate_tokens(result.messages[:2])
    assert (result.exit_reason, result.steps, model.remaining) == ("max_context_len", 1, 1)
    assert result.records[0].context_tokens == result.usage.context_tokens == expected


def test_zero_steps_allowed_is_max_turns() -> None:
    model = replies({"role": "assistant", "content": "never"})
    result = run(model, limits=LeafLimits(max_steps=0))
    assert (result.exit_reason, result.steps, result.records, model.remaining) == ("max_turns", 0, [], 1)
    assert [m["role"] for m in result.messages] == ["system", "user"]


def test_model_failure_after_the_deadline_is_max_time_read_from_the_clock() -> None:
    ticks = iter([5.0, 10.0, 200.0, 250.0])  # start, the step's time check, the failure's check, the end
    result = run(ReplayModel([]), limits=LeafLimits(max_seconds=100.0), clock=lambda: next(ticks))
    assert (result.exit_reason, result.steps, result.model_calls_made, result.records) == ("max_time", 0, 1, [])
    assert result.error and result.elapsed_s == 245.0
    ticks = iter([5.0, 10.0, 50.0, 60.0])
    early = run(ReplayModel([]), limits=LeafLimits(max_seconds=100.0), clock=lambda: next(ticks))
    assert (early.exit_reason, early.error, early.elapsed_s) == ("llm_query_error", result.error, 55.0)


def test_leaf_run_appends_to_the_history_it_was_given() -> None:
    history = initial_messages(SYSTEM, "Fix the bug.")
    sent = json.dumps(history)
    leaf = LeafRun(replies(glob_turn(), {"role": "assistant", "content": "done"}), SandboxDouble(), history,
                   LeafLimits(), TOOL_SCHEMAS, on_step=None, cancel=None, clock=time.monotonic)
    result = leaf.run()
    assert result.messages is history and json.dumps(history[:2]) == sent
    assert [m["role"] for m in history] == ["system", "user", "assistant", "tool", "assistant"]
    assert (leaf.model_calls_made, leaf.records, leaf.final_answer) == (2, result.records, "done")
    assert all(record.history is history for record in result.records)


@pytest.mark.parametrize("arguments", [
    '{"command": "ls", "x": ' + "[" * 1000 + "]" * 1000 + "}",  # json.loads itself runs out of stack
    '{"command": "ls", "timeout": NaN, "x": ' + "[" * 500 + "]" * 500 + "}",  # the strict rewrite did
])
def test_deeply_nested_arguments_get_an_answer_and_the_run_goes_on(
    serve: Serve, client_for: ClientFor, arguments: str
) -> None:
    """RecursionError is no ValueError: it left run_leaf, and the attempt failed as an internal error."""
    server = serve(assistant(None, tool_calls=[tool_call("Bash", arguments, "d1")]),
                   assistant(None, tool_calls=[tool_call("Glob", {"pattern": "*"}, "g1")]),
                   assistant("\n\nDone."))
    sandbox = SandboxDouble()
    result = run(client_for(server), sandbox)
    assert (result.exit_reason, result.final_answer, len(server.requests)) == ("agent", "Done.", 3)
    assert [name for name, _ in sandbox.calls] == ["Glob"]  # the nested call was answered, not run
    answer = tool_messages(result)[0]
    assert answer["tool_call_id"] == "d1" and answer["content"].startswith(("JSONDecodeError: ", "ValueError: "))
    assert result.messages[2]["tool_calls"][0]["function"]["arguments"] == "{}"
    for body in server.requests[1:]:
        for message in strict_json(body)["messages"]:
            for call in message.get("tool_calls") or []:
                assert isinstance(strict_json(call["function"]["arguments"].encode()), dict)


def test_a_deeply_nested_json_text_call_gets_an_answer_and_the_run_goes_on(
    serve: Serve, client_for: ClientFor
) -> None:
    """The text fallback's JSON form, 1000 deep: a format error answer, nothing run."""
    depth = 1000
    nested = '{"name": "Bash", "arguments": {"command": "ls", "x": ' + "[" * depth + "]" * depth + "}}"
    server = serve(assistant(f"<tool_call>\n{nested}\n</tool_call>"), assistant("\n\nDone."))
    sandbox = SandboxDouble()
    result = run(client_for(server), sandbox)
    assert (result.exit_reason, result.final_answer, len(server.requests)) == ("agent", "Done.", 2)
    assert sandbox.calls == []
    assert tool_messages(result)[0]["content"].startswith((ERROR_NAME, "ValueError: "))
