"""What SGLang 0.5.23 really answers (../shared/fixtures/sglang), through the client and the loop.

Each response case is served byte for byte by the scripted server, followed by a plain final
answer, and the run must end as that answer deserves: calls only from `tool_calls` or the
visible content (never reasoning), no final answer without text, an abort sent again, and every
later request strict JSON that SGLang accepts. Each error case must be read as SGLang meant it.
The double itself must answer in SGLang's shapes.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from app.textcalls import UNREAD_REPLY, extract_text_calls
from tests.conftest import SGLANG_FIXTURES, sglang_case, sglang_case_names
from tests.doubles.openai_server import (
    HISTORY_ARGS_INVALID,
    ScriptedOpenAIServer,
    Status,
    assistant,
    context_too_long,
    overloaded,
    tool_call,
)
from tests.doubles.sandbox_double import SandboxDouble
from worker.leaf import model as model_module
from worker.leaf.loop import LeafResult, history_message, run_leaf
from worker.leaf.model import ContextOverflow, ModelQueryError, OpenAIChatModel
from worker.leaf.tools import TOOL_NAMES, TOOL_SCHEMAS

Serve = Callable[..., ScriptedOpenAIServer]
ClientFor = Callable[..., OpenAIChatModel]
MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
FILES = {"calc.py": "def add(a, b):\n    return a - b\n", "a.py": "A\n"}

# Stop-finished answers without tool_calls whose content holds a call as text: the server ran
# without --tool-call-parser (or the model left out the wrapper); the fallback reads them.
TEXT_CALL_CASES = {"no_tool_parser_text_call", "no_tool_parser_call_before_think_close",
                   "function_without_tool_call_wrapper"}


def strict(raw: str | bytes) -> Any:
    def refuse(token: str) -> Any:
        raise ValueError(f"{token} is not JSON")

    return json.loads(raw, parse_constant=refuse)


def run(model: OpenAIChatModel, sandbox: SandboxDouble) -> LeafResult:
    return run_leaf(model, sandbox, "Fix the bug.", system_prompt="You are an agent.")


@pytest.mark.parametrize("name", sglang_case_names("responses.jsonl"))
def test_every_sglang_answer_ends_the_run_as_it_deserves(serve: Serve, client_for: ClientFor, name: str) -> None:
    case = sglang_case("responses.jsonl", name)
    response = case["sglang_response"]
    choice = response["choices"][0]
    message, finish = choice["message"], choice["finish_reason"]
    server = serve(Status(case["http_status"], response), assistant("\n\nDone."))
    sandbox = SandboxDouble(files=dict(FILES))
    result = run(client_for(server), sandbox)

    native = message.get("tool_calls") or []
    text_calls = extract_text_calls(message["content"]).calls
    assert bool(text_calls) == (name in TEXT_CALL_CASES) or bool(native)
    # Nothing is ever run from the reasoning: every call made was in tool_calls or the content.
    offered = {c["function"]["name"] for c in native} | {c.name for c in text_calls}
    assert {called for called, _ in sandbox.calls} <= offered & set(TOOL_NAMES)
    for body in server.requests:  # SGLang refuses a bare NaN or Infinity in the history
        for sent in strict(body)["messages"]:
            for call in sent.get("tool_calls") or []:
                assert isinstance(strict(call["function"]["arguments"]), dict)

    if finish == "abort":  # sent again, the aborted turn not appended
        assert (result.exit_reason, result.final_answer, len(server.requests)) == ("agent", "Done.", 2)
        assert server.requests[0] == server.requests[1] and sandbox.calls == []
    elif finish == "length":  # cut: nothing in it runs
        assert result.exit_reason in {"max_tokens_per_turn", "max_context_len"}
        assert (sandbox.calls, len(server.requests)) == ([], 1)
    elif native or text_calls:  # every call answered, in order, then the next turn
        assert (result.exit_reason, result.final_answer, len(server.requests)) == ("agent", "Done.", 2)
        answered = [m["tool_call_id"] for m in result.messages if m["role"] == "tool"]
        assert answered == ([c["id"] for c in native] or [f"call_text_0_{i}" for i in range(len(text_calls))])
    elif message["content"].strip():  # a final answer: that text, and no further request
        assert (result.exit_reason, len(server.requests)) == ("agent", 1)
        assert result.final_answer == message["content"].strip() and sandbox.calls == []
    else:  # no call and no text (a stripped <tool_call>, say): told so, not taken as done
        assert server.request_json(1)["messages"][-1]["content"] == UNREAD_REPLY
        assert (result.exit_reason, result.final_answer) == ("agent", "Done.")


def test_a_call_quoted_while_thinking_is_not_run(serve: Serve, client_for: ClientFor) -> None:
    response = sglang_case("responses.jsonl", "call_quoted_in_reasoning_then_answer")["sglang_response"]
    assert "<tool_call>" in response["choices"][0]["message"]["reasoning_content"]
    server = serve(Status(200, response))
    sandbox = SandboxDouble(files=dict(FILES))
    result = run(client_for(server), sandbox)
    assert (result.exit_reason, sandbox.calls, len(server.requests)) == ("agent", [], 1)
    assert result.final_answer == response["choices"][0]["message"]["content"].strip()


def test_infinity_from_sglang_gets_an_answer_and_the_run_goes_on(serve: Serve, client_for: ClientFor) -> None:
    """The issue's case: SGLang's own `Infinity`, echoed back, made every later request a 400."""
    response = sglang_case("responses.jsonl", "numeric_inf_arg")["sglang_response"]
    arguments = response["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert "Infinity" in arguments
    server = serve(Status(200, response), assistant("\n\nDone."))
    sandbox = SandboxDouble()
    result = run(client_for(server), sandbox)
    assert (result.exit_reason, len(server.requests), sandbox.calls) == ("agent", 2, [])
    answer = next(m for m in result.messages if m["role"] == "tool")["content"]
    assert answer.startswith("ValueError: ") and "Infinity" in answer


# errors.jsonl's one entry with no body: a 200 answer with finish_reason abort, which the
# responses cases (abort_mid_reasoning, abort_mid_call) serve and check.
NOT_AN_ERROR = {"abort_without_status"}


@pytest.mark.parametrize("name", [n for n in sglang_case_names("errors.jsonl") if n not in NOT_AN_ERROR])
def test_every_sglang_error_is_read_as_meant(serve: Serve, client_for: ClientFor, name: str) -> None:
    case = sglang_case("errors.jsonl", name)
    status, body = case["http_status"], case["body"]
    assert body is not None, f"{name} has no error body: list it in NOT_AN_ERROR"
    server = serve(Status(status, body), assistant("\n\nok"))
    model = client_for(server)
    if name.startswith("context_"):
        with pytest.raises(ContextOverflow, match=r"context length|maximum allowed length"):
            model.complete(MESSAGES, TOOL_SCHEMAS)
        assert len(server.requests) == 1
    elif status >= 500:  # overload, timeouts, internal errors: worth another try
        reply = model.complete(MESSAGES, TOOL_SCHEMAS)
        assert (reply.message["content"], reply.attempts) == ("\n\nok", 2)
    else:  # the request itself was refused: no retry, and SGLang's own words in the error
        with pytest.raises(ModelQueryError) as refused:
            model.complete(MESSAGES, TOOL_SCHEMAS)
        words = body.get("message") or body.get("detail")
        assert f"HTTP {status}: " in str(refused.value) and words[:60] in str(refused.value)
        assert len(server.requests) == 1


def test_openai_shaped_errors_are_still_read(serve: Serve, client_for: ClientFor) -> None:
    overflow = {"error": {"message": "This model's maximum context length is 131072 tokens.",
                          "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}
    server = serve(Status(400, overflow), Status(401, {"error": {"message": "bad key", "type": "auth"}}))
    model = client_for(server)
    with pytest.raises(ContextOverflow, match="maximum context length"):
        model.complete(MESSAGES, TOOL_SCHEMAS)
    with pytest.raises(ModelQueryError, match="HTTP 401: auth: bad key"):
        model.complete(MESSAGES, TOOL_SCHEMAS)


def post(server: ScriptedOpenAIServer, body: bytes) -> tuple[int, Any]:
    request = urllib.request.Request(f"{server.base_url}/chat/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def test_the_double_answers_in_sglang_shapes(serve: Serve) -> None:
    """Field for field what the fixtures hold: content "\n\n" next to calls, cached tokens."""
    fixture = sglang_case("responses.jsonl", "call_read")["sglang_response"]
    cached = sglang_case("responses.jsonl", "cache_report_on")["sglang_response"]
    server = serve(assistant(None, tool_calls=[tool_call("Read", {"file_path": "calc.py"})]), assistant("Done."))
    model = OpenAIChatModel(server.base_url, "m")
    history: list[dict[str, Any]] = list(MESSAGES)
    first_body = model.encode_request(history, TOOL_SCHEMAS)
    _, first = post(server, first_body)
    history += [first["choices"][0]["message"], {"role": "tool", "tool_call_id": "x", "content": "calc.py\n1. x"}]
    second_body = model.encode_request(history, TOOL_SCHEMAS)
    _, second = post(server, second_body)

    assert set(first) == set(fixture)
    assert set(first["choices"][0]) == set(fixture["choices"][0])
    assert set(first["choices"][0]["message"]) == set(fixture["choices"][0]["message"])
    assert first["choices"][0]["message"]["content"] == fixture["choices"][0]["message"]["content"] == "\n\n"
    assert first["choices"][0]["matched_stop"] is None and second["choices"][0]["matched_stop"] == 151645
    assert set(first["usage"]) == set(cached["usage"])
    # cached_tokens: what a request shares with the one before, a quarter of the bytes as tokens.
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert second_body.startswith(first_body[:-2])
    assert second["usage"]["prompt_tokens_details"] == {"cached_tokens": (len(first_body) - 2) // 4}
    assert second["usage"]["prompt_tokens"] == -(-len(second_body) // 4)


def test_the_double_refuses_a_history_sglang_refuses(serve: Serve) -> None:
    server = serve(assistant("never"))
    bad = {"role": "assistant", "content": "", "tool_calls": [
        tool_call("Bash", '{"command": "ls", "timeout": Infinity}', "c1")]}
    refused = sglang_case("errors.jsonl", "history_args_invalid_json")
    status, body = post(server, json.dumps({"model": "m", "messages": [*MESSAGES, bad]}).encode())
    assert (status, body) == (refused["http_status"], refused["body"]) and body == HISTORY_ARGS_INVALID
    assert server.count == 1 and server._script  # refused before the script was touched
    for name, built in [("context_input_longer_than_context", context_too_long()), ("queue_full", overloaded())]:
        case = sglang_case("errors.jsonl", name)
        assert (built.code, built.body) == (case["http_status"], case["body"])


def test_a_call_that_arrives_as_text_is_warned_about_once_per_server(
    serve: Serve, client_for: ClientFor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sign of a server started without --tool-call-parser qwen3_coder: SGLang's own answer then."""
    monkeypatch.setattr(model_module, "_warned", set())  # ports are reused: forget earlier tests' servers
    response = sglang_case("responses.jsonl", "no_tool_parser_text_call")
    assert response["server"]["tool_call_parser"] is None
    text = Status(200, response["sglang_response"])
    assert "<tool_call>" in response["sglang_response"]["choices"][0]["message"]["content"]
    first, second = serve(text, text), serve(text, assistant("\n\nplain"))
    with capture_logs() as logs:
        for server in (first, second):
            model = client_for(server)
            model.complete(MESSAGES, TOOL_SCHEMAS)
            model.complete(MESSAGES, TOOL_SCHEMAS)
    warned = [entry for entry in logs if entry["event"] == "model_tool_calls_as_text"]
    assert [entry["server"] for entry in warned] == [first.base_url, second.base_url]
    assert all(entry["log_level"] == "warning" and "--tool-call-parser qwen3_coder" in entry["hint"]
               for entry in warned)


def _without_tool_parser(content: str) -> Status:
    """SGLang's answer (no_tool_parser_text_call) with `content` in place of its own."""
    response = json.loads(json.dumps(sglang_case("responses.jsonl", "no_tool_parser_text_call")["sglang_response"]))
    response["choices"][0]["message"]["content"] = content
    return Status(200, response)


def test_a_stripped_block_beside_a_real_text_call_costs_no_format_error(serve: Serve, client_for: ClientFor) -> None:
    """The prose block (textcalls.jsonl wrapper_without_function, which SGLang drops) next to
    SGLang's own text call: the call runs, and the model is told nothing about the prose."""
    prose = sglang_case("textcalls.jsonl", "wrapper_without_function")
    assert prose["sglang"]["calls"] == []
    real = sglang_case("responses.jsonl", "no_tool_parser_text_call")["sglang_response"]["choices"][0]["message"]
    content = "\n\nUse <tool_call>...</tool_call> blocks.\n" + prose["text"] + "\n" + real["content"].lstrip()
    server = serve(_without_tool_parser(content), assistant("\n\nDone."))
    sandbox = SandboxDouble(files=dict(FILES))
    result = run(client_for(server), sandbox)
    assert (result.exit_reason, result.final_answer) == ("agent", "Done.")
    assert sandbox.calls == [("Read", {"file_path": "calc.py"})]
    answers = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert answers == ["calc.py\n1. def add(a, b):\n2.     return a - b"]


def test_a_reply_whose_only_block_is_stripped_is_told_it_was_not_understood(
    serve: Serve, client_for: ClientFor
) -> None:
    """Without another call the dropped block is answered, never taken as the final answer."""
    prose = sglang_case("textcalls.jsonl", "wrapper_without_function")["text"]
    server = serve(_without_tool_parser("\n\n" + prose), assistant("\n\nDone."))
    sandbox = SandboxDouble(files=dict(FILES))
    result = run(client_for(server), sandbox)
    told = server.request_json(1)["messages"][-1]
    assert told["role"] == "tool" and told["content"].startswith("ToolCallFormatError: ")
    assert "<function=NAME>" in told["content"] and sandbox.calls == []
    assert (result.exit_reason, result.final_answer) == ("agent", "Done.")


@pytest.mark.parametrize("name", ["first_request.json", "after_parallel_calls.json", "after_text_calls.json"])
def test_request_bodies_stay_those_sglang_accepted(name: str) -> None:
    """Re-encoding an accepted body's messages gives that body again: same fields, same order,
    messages last, the history's assistant turns (through history_message) unchanged."""
    sglang_case("responses.jsonl", "call_read")  # skips when the shared fixtures are absent
    accepted = json.loads((SGLANG_FIXTURES / "requests" / name).read_text(encoding="utf-8"))
    messages = [history_message(m) if m["role"] == "assistant" else m for m in accepted["messages"]]
    with OpenAIChatModel("http://127.0.0.1:9/v1", accepted["model"]) as model:
        body = json.loads(model.encode_request(messages, accepted["tools"]))
    assert list(body) == list(accepted) and body == accepted
    assert accepted["tools"] == TOOL_SCHEMAS
