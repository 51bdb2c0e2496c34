"""OpenAIChatModel over real HTTP: request body, sampling, retries, timeouts, overflow, replay."""

from __future__ import annotations

import email.utils
import json
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from app.endings import EndingKind
from app.outcome_words import shown_url
from tests.doubles.openai_server import Drop, Hang, ScriptedOpenAIServer, Status, assistant, tool_call
from tests.servers import wait_until
from worker.leaf.model import (
    ContextOverflow,
    ModelQueryError,
    ModelReply,
    OpenAIChatModel,
    ReplayModel,
    SamplingParams,
    Usage,
    is_context_overflow,
)
from worker.leaf.tools import TOOL_SCHEMAS

MESSAGES = [{"role": "system", "content": "sys"}, {"role": "user", "content": "fix it"}]
Serve = Callable[..., ScriptedOpenAIServer]
ClientFor = Callable[..., OpenAIChatModel]


def test_sampling_defaults_match_leaf() -> None:
    fields = SamplingParams().body_fields()
    assert fields == {
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "max_completion_tokens": 8192,
        "chat_template_kwargs": {"enable_thinking": True},
    }
    custom = replace(SamplingParams(), temperature=0.2, extra_body={"seed": 7, "top_k": 5})
    assert custom.body_fields(max_completion_tokens=100) | {} == {
        **fields, "temperature": 0.2, "seed": 7, "top_k": 5, "max_completion_tokens": 100,
    }


def test_request_body_and_reply(serve: Serve, client_for: ClientFor) -> None:
    message = {
        "role": "assistant", "content": "\n\n", "reasoning_content": "think",
        "tool_calls": [dict(tool_call("Read", {"file_path": "a.py"}, "call_1"), index=0)],
    }
    server = serve(assistant(None, reasoning="think", tool_calls=[tool_call("Read", {"file_path": "a.py"}, "call_1")],
                             usage={"prompt_tokens": 50, "completion_tokens": 7}))
    model = client_for(server)
    reply = model.complete(MESSAGES, TOOL_SCHEMAS)
    assert reply.message == message
    assert reply.finish_reason == "tool_calls"
    assert reply.usage == Usage(50, 7, 57, 0)  # a first request: nothing cached yet
    assert reply.attempts == 1
    body = server.request_json(0)
    assert body["model"] == "frognano-test"
    assert body["messages"] == MESSAGES
    assert body["tools"] == TOOL_SCHEMAS
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is True
    assert body["max_completion_tokens"] == 8192 and body["top_k"] == 20
    assert list(body)[-1] == "messages"  # last, so each body extends the one before
    headers = {k.lower(): v for k, v in server.headers[0].items()}
    assert headers["content-type"] == "application/json"
    assert headers["authorization"] == "Bearer EMPTY"


def test_encoding_reuses_unchanged_messages_and_notices_new_objects() -> None:
    model = OpenAIChatModel("http://127.0.0.1:9/v1", "m")
    history = list(MESSAGES)
    first = model.encode_request(history, TOOL_SCHEMAS)
    history.append({"role": "assistant", "content": "ünïcode"})
    second = model.encode_request(history, TOOL_SCHEMAS)
    assert second.startswith(first[:-2])
    assert json.loads(second)["messages"] == history
    other = [dict(m) for m in history[:1]] + [{"role": "user", "content": "different"}]
    assert json.loads(model.encode_request(other, TOOL_SCHEMAS))["messages"] == other
    assert json.loads(model.encode_request(history, TOOL_SCHEMAS, 99))["max_completion_tokens"] == 99
    model.close()


def test_retries_5xx_and_429_then_succeeds(serve: Serve, client_for: ClientFor) -> None:
    server = serve(Status(500, {"error": {"message": "boom"}}), Status(503), Status(429, headers={"Retry-After": "0"}),
                   assistant("done"))
    reply = client_for(server).complete(MESSAGES, TOOL_SCHEMAS)
    assert reply.message["content"] == "done"
    assert reply.attempts == 4
    assert len(server.requests) == 4
    assert len(set(server.requests)) == 1  # the same bytes every attempt


RETRY_DATE = "Wed, 21 Oct 2015 07:28:00 GMT"
RETRY_DATE_TS = email.utils.parsedate_to_datetime(RETRY_DATE).timestamp()


@pytest.mark.parametrize(
    ("status", "header", "now", "waited"),
    [
        (429, RETRY_DATE, RETRY_DATE_TS - 7, 7.0),  # an HTTP-date 7 s ahead of the client's wall clock
        (503, RETRY_DATE, RETRY_DATE_TS - 42, 42.0),
        (429, "7", RETRY_DATE_TS, 7.0),  # seconds
        (503, "999999", RETRY_DATE_TS, 60.0),  # an absurd ask: capped at backoff_max
        (503, RETRY_DATE, RETRY_DATE_TS - 10**6, 60.0),
    ],
)
def test_retry_after_is_waited_as_seconds_or_as_an_http_date(
    serve: Serve, client_for: ClientFor, status: int, header: str, now: float, waited: float
) -> None:
    slept: list[float] = []
    server = serve(Status(status, headers={"Retry-After": header}), assistant("done"))
    model = client_for(server, backoff_base=0.01, backoff_max=60.0, sleep=slept.append, now=lambda: now)
    assert model.complete(MESSAGES, TOOL_SCHEMAS).attempts == 2
    assert slept == [waited]


def test_a_retry_after_date_in_the_past_waits_the_backoff_only(serve: Serve, client_for: ClientFor) -> None:
    slept: list[float] = []
    server = serve(Status(503, headers={"Retry-After": RETRY_DATE}), assistant("done"))
    model = client_for(server, backoff_base=0.01, backoff_max=60.0, sleep=slept.append, now=lambda: RETRY_DATE_TS + 100)
    assert model.complete(MESSAGES, TOOL_SCHEMAS).attempts == 2
    assert len(slept) == 1 and 0.005 <= slept[0] <= 0.01  # backoff_base with its jitter, nothing more


def test_retries_a_dropped_connection(serve: Serve, client_for: ClientFor) -> None:
    server = serve(Drop(), assistant("ok"))
    assert client_for(server).complete(MESSAGES, TOOL_SCHEMAS).attempts == 2


def test_gives_up_after_the_retry_budget(serve: Serve, client_for: ClientFor) -> None:
    server = serve(*[Status(502)] * 5)
    with pytest.raises(ModelQueryError, match=r"after 3 attempt\(s\): HTTP 502"):
        client_for(server, max_retries=2).complete(MESSAGES, TOOL_SCHEMAS)
    assert len(server.requests) == 3


def test_client_errors_are_not_retried(serve: Serve, client_for: ClientFor) -> None:
    server = serve(Status(401, {"error": {"message": "bad key"}}), assistant("never"))
    with pytest.raises(ModelQueryError, match="HTTP 401"):
        client_for(server).complete(MESSAGES, TOOL_SCHEMAS)
    assert len(server.requests) == 1


def test_server_that_never_answers_times_out_within_bounds(serve: Serve, client_for: ClientFor) -> None:
    server = serve(Hang(), Hang())
    started = time.monotonic()
    with pytest.raises(ModelQueryError, match="timed out"):
        client_for(server, timeout=0.3, max_retries=1).complete(MESSAGES, TOOL_SCHEMAS)
    assert time.monotonic() - started < 10  # two 0.3 s tries, not the double's hour-long hang
    wait_until(lambda: len(server.requests) >= 2, timeout=10)  # the double notes the retry in its own thread
    assert len(server.requests) == 2


def test_call_timeout_caps_the_whole_call_including_retries(serve: Serve, client_for: ClientFor) -> None:
    server = serve(*[Hang()] * 10)
    started = time.monotonic()
    with pytest.raises(ModelQueryError):
        client_for(server, timeout=5.0, max_retries=8).complete(MESSAGES, TOOL_SCHEMAS, timeout=0.4)
    assert time.monotonic() - started < 4  # 0.4 s, not one 5 s try (let alone nine)


@pytest.mark.parametrize(
    "message",
    [
        "This model's maximum context length is 131072 tokens. However, you requested 140000 tokens.",
        "The input (140001 tokens) is longer than the model's context length (131072 tokens).",
        "Requested token count exceeds the model's maximum context length of 131072 tokens.",
        "too many tokens in prompt",
    ],
)
def test_context_overflow_is_recognised(serve: Serve, client_for: ClientFor, message: str) -> None:
    server = serve(Status(400, {"object": "error", "message": message, "type": "BadRequestError", "code": 400}))
    with pytest.raises(ContextOverflow):
        client_for(server).complete(MESSAGES, TOOL_SCHEMAS)
    assert len(server.requests) == 1


def test_overflow_markers_only_count_on_client_errors() -> None:
    assert is_context_overflow(400, "maximum context length exceeded")
    assert not is_context_overflow(500, "maximum context length exceeded")
    assert not is_context_overflow(400, "invalid tool_choice")


def test_nonsense_answers_are_retried_then_query_errors(serve: Serve, client_for: ClientFor) -> None:
    # A garbled 200 (cut by a proxy, say) is retried like a 5xx; an answer that stays garbled is an error.
    server = serve(Status(200, {"choices": []}), Status(200, b"not json at all"), assistant("fine"))
    reply = client_for(server, max_retries=2).complete(MESSAGES, TOOL_SCHEMAS)
    assert reply.message["content"] == "fine" and server.count == 3
    server = serve(Status(200, {"choices": []}), Status(200, {"choices": []}))
    with pytest.raises(ModelQueryError, match="without a message"):
        client_for(server, max_retries=1).complete(MESSAGES, TOOL_SCHEMAS)
    server = serve(Status(200, b"not json at all"), Status(200, b"{"))
    with pytest.raises(ModelQueryError, match=r"invalid JSON|non-JSON"):
        client_for(server, max_retries=1).complete(MESSAGES, TOOL_SCHEMAS)


def test_unreachable_server_is_a_query_error() -> None:
    with OpenAIChatModel("http://127.0.0.1:9/v1", "m", max_retries=1, backoff_base=0.01, timeout=1) as model, \
            pytest.raises(ModelQueryError, match="connection error") as raised:
        model.complete(MESSAGES, TOOL_SCHEMAS)
    # The job's ending says so typed: the kind and the system's own words, no message parsed (issue 38).
    assert raised.value.ending.kind == EndingKind.model_unreachable
    assert raised.value.ending.cause == "Connection refused"


def test_each_model_failure_is_typed_for_the_jobs_ending(serve: Serve, client_for: ClientFor) -> None:
    refused = serve(Status(401, {"error": {"message": "Invalid API key"}}))
    with pytest.raises(ModelQueryError) as raised:
        client_for(refused, max_retries=1).complete(MESSAGES, TOOL_SCHEMAS)
    assert raised.value.kind == EndingKind.model_refused and raised.value.cause == "HTTP 401: Invalid API key"
    failing = serve(Status(503, {"error": {"message": "down"}}), Status(503, {"error": {"message": "down"}}))
    with pytest.raises(ModelQueryError) as raised:
        client_for(failing, max_retries=1).complete(MESSAGES, TOOL_SCHEMAS)
    assert raised.value.kind == EndingKind.model_failing and raised.value.cause == "HTTP 503: down"


def test_replay_model_returns_recordings_in_order() -> None:
    replay = ReplayModel([
        {"role": "assistant", "content": "one"},
        ModelReply({"role": "assistant", "content": "two"}, "stop"),
    ])
    assert replay.complete(MESSAGES, TOOL_SCHEMAS).message["content"] == "one"
    assert replay.complete(MESSAGES, TOOL_SCHEMAS).finish_reason == "stop"
    assert replay.remaining == 0
    with pytest.raises(ModelQueryError, match="replay"):
        replay.complete(MESSAGES, TOOL_SCHEMAS)
    assert replay.received == [2, 2, 2]


def test_a_server_is_named_in_logs_without_credentials() -> None:
    assert shown_url("http://frog:s3cret@sglang.internal:30000/v1?token=x#f") == "http://sglang.internal:30000/v1"
    assert shown_url("https://sglang.internal/v1") == "https://sglang.internal/v1"
    assert "s3cret" not in OpenAIChatModel("http://frog:s3cret@127.0.0.1:9/v1", "m").server
