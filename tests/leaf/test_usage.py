"""Usage per model reply: SGLang's figures (cached tokens included) reach each step, the run's sums
and the trajectory; a server that reports no cached tokens is named once in the log."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.conftest import sglang_case as shared_sglang_case
from tests.doubles.openai_server import Reply, ScriptedOpenAIServer, Status, assistant, tool_call
from tests.doubles.sandbox_double import SandboxDouble
from worker.leaf.loop import run_leaf
from worker.leaf.model import OpenAIChatModel, SamplingParams
from worker.leaf.trajectory_writer import TrajectoryWriter

Serve = Callable[..., ScriptedOpenAIServer]
ClientFor = Callable[..., OpenAIChatModel]


def sglang_case(name: str) -> dict[str, Any]:
    """One of SGLang 0.5.23's answers in tests/conftest.py's SGLANG_FIXTURES, as the server sent it
    (skipped, saying so, only when that folder is absent)."""
    response: dict[str, Any] = shared_sglang_case("responses.jsonl", name)["sglang_response"]
    return response


def as_reply(response: dict[str, Any]) -> Reply:
    """The double answers with the fixture's message, finish reason and usage, unchanged."""
    choice = response["choices"][0]
    return Reply(message=choice["message"], finish_reason=choice["finish_reason"], usage=response["usage"])


def test_each_step_records_its_replys_usage_and_the_trajectory_sums_them(
    tmp_path: Path, serve: Serve, client_for: ClientFor
) -> None:
    first = sglang_case("cache_report_on_first_turn")  # a Glob call: 1200 prompt, 0 cached, 30 completion
    last = sglang_case("cache_report_on")  # the answer: 5000 prompt, 4800 cached, 40 completion
    server = serve(as_reply(first), as_reply(last))
    path = tmp_path / "t.json"
    writer = TrajectoryWriter(path, job_id=1, model="m", sampling=SamplingParams().as_dict(), fsync=False)
    result = run_leaf(client_for(server), SandboxDouble(), "task", system_prompt="sys", on_step=writer.on_step)
    writer.finish(result)
    saved = json.loads(path.read_text())

    assert result.exit_reason == "agent" and len(saved["steps"]) == 2  # one step per reply
    usages = [step["usage"] for step in saved["steps"]]
    assert [(u["prompt_tokens"], u["completion_tokens"], u["cached_tokens"]) for u in usages] == [
        (1200, 30, 0),
        (5000, 40, 4800),
    ]
    summary = saved["usage"]
    assert (summary["prompt_tokens"], summary["completion_tokens"], summary["cached_tokens"]) == (6200, 70, 4800)
    assert (summary["calls"], summary["steps"], summary["cached_unreported"]) == (2, 2, 0)
    assert summary["cached_share"] == round(4800 / 6200, 4)
    assert summary["model_seconds"] > 0 and summary["model_seconds"] == pytest.approx(
        sum(step["model_seconds"] for step in saved["steps"]), abs=0.01
    )
    figures = result.figures()
    assert (figures.prompt_tokens, figures.cached_tokens, figures.model_calls, figures.steps) == (6200, 4800, 2, 2)
    # The loop timed only its tool calls: named so, never `sandbox_seconds` (the job's tool calls and test runs).
    assert "sandbox_seconds" not in summary and summary["tool_seconds"] == round(result.tool_seconds, 3)
    assert summary["tool_seconds"] == pytest.approx(sum(step["tool_seconds"] for step in saved["steps"]), abs=0.01)
    assert saved["timings"]["tools_s"] == summary["tool_seconds"]


def test_model_seconds_include_a_call_that_failed(serve: Serve, client_for: ClientFor) -> None:
    """Wall time inside model calls counts the retries and the call that finally failed."""
    server = serve(
        assistant(None, tool_calls=[tool_call("Glob", {"pattern": "*"})]),
        Status(503, {"object": "error", "message": "overloaded", "type": "503", "param": None, "code": 503}),
        Status(503, {"object": "error", "message": "overloaded", "type": "503", "param": None, "code": 503}),
    )
    model = client_for(server, max_retries=1, backoff_base=0.3, backoff_max=0.3)
    result = run_leaf(model, SandboxDouble(), "task", system_prompt="sys")

    assert result.exit_reason == "llm_query_error" and len(result.records) == 1
    recorded = sum(r.model_seconds for r in result.records)
    assert result.model_seconds >= recorded + 0.15  # the failed call's backoff is in, not only the replies
    assert result.figures().model_seconds == result.model_seconds
    assert (result.figures().model_calls, result.figures().steps) == (1, 1)


@pytest.fixture
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Warnings are once per process and server, and ports are reused: forget earlier tests' servers."""
    import worker.leaf.model

    monkeypatch.setattr(worker.leaf.model, "_warned", set())


def _no_cache_warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in logs if entry["event"] == "model_no_cached_tokens"]


def test_a_server_without_cached_figures_is_named_once(
    serve: Serve, client_for: ClientFor, fresh_warnings: None
) -> None:
    off = sglang_case("cache_report_off")  # prompt_tokens_details: null
    silent = serve(*(as_reply(off) for _ in range(3)))
    other = serve(as_reply(off))
    with capture_logs() as logs:
        for model in (client_for(silent), client_for(silent)):  # two clients, one server: still one warning
            model.complete([{"role": "user", "content": "x"}], [])
        client_for(silent).complete([{"role": "user", "content": "y"}], [])
        assert len(_no_cache_warnings(logs)) == 1
        warning = _no_cache_warnings(logs)[0]
        assert warning["server"] == silent.base_url.rstrip("/") and "--enable-cache-report" in warning["hint"]

        client_for(other).complete([{"role": "user", "content": "x"}], [])  # another server: its own warning
        assert len(_no_cache_warnings(logs)) == 2


def test_cached_figures_raise_no_warning_and_unknown_counts_as_zero(
    serve: Serve, client_for: ClientFor, fresh_warnings: None
) -> None:
    on = serve(as_reply(sglang_case("cache_report_on")))
    with capture_logs() as logs:
        reply = client_for(on).complete([{"role": "user", "content": "x"}], [])
    assert reply.usage is not None and reply.usage.cached_tokens == 4800
    assert _no_cache_warnings(logs) == []

    off = serve(as_reply(sglang_case("cache_report_off")))
    result = run_leaf(client_for(off), SandboxDouble(), "task", system_prompt="sys")
    assert result.usage.cached_tokens == 0 and result.usage.cached_unreported == 1
    assert result.records[0].to_dict()["usage"]["cached_tokens"] == 0


def test_the_warning_never_shows_credentials_from_the_url(serve: Serve, fresh_warnings: None) -> None:
    server = serve(as_reply(sglang_case("cache_report_off")))
    url = server.base_url.replace("http://", "http://user:pa55word-CANARY@")
    with capture_logs() as logs, OpenAIChatModel(url, "m", timeout=5.0, max_retries=0) as model:
        model.complete([{"role": "user", "content": "x"}], [])
    text = repr(_no_cache_warnings(logs))
    assert "127.0.0.1" in text and "CANARY" not in text and "user:" not in text


@pytest.mark.parametrize("odd", [True, "5000", -1.5, -1, None, [1], {"x": 1}, 2**31, 10**20])
def test_odd_usage_figures_from_a_server_count_as_zero(odd: Any) -> None:
    """A server that sends bools, strings, floats, negatives or objects as token counts cannot poison the sums."""
    from worker.leaf.model import Usage

    usage = Usage.from_dict(
        {"prompt_tokens": odd, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": odd}}
    )
    assert usage is not None and usage.prompt_tokens == 0 and usage.completion_tokens == 7
    assert usage.cached_tokens == 0


def test_an_absurd_token_count_is_logged_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """10**20 summed into the usage columns broke the attempt's final write; now it counts as 0, said once."""
    from worker import leaf
    from worker.leaf.model import Usage

    monkeypatch.setattr(leaf.model, "_warned", set())
    with capture_logs() as logs:
        first = Usage.from_dict({"prompt_tokens": 10**20, "completion_tokens": 10**9})
        Usage.from_dict({"prompt_tokens": 7, "completion_tokens": 2**40})
    assert first is not None and (first.prompt_tokens, first.completion_tokens) == (0, 10**9)
    warnings = [entry for entry in logs if entry["event"] == "model_usage_out_of_range"]
    assert len(warnings) == 1 and warnings[0]["limit"] == 10**9 and warnings[0]["digits"] == 21


def test_an_aborted_replys_tokens_count_as_a_call_without_a_step(serve: Serve, client_for: ClientFor) -> None:
    """SGLang reports usage on an abort (prompt 1000, completion 31): the GPU spent them, the budget counts them."""
    aborted = as_reply(sglang_case("abort_mid_call"))
    last = sglang_case("cache_report_on")  # the answer: 5000 prompt, 4800 cached, 40 completion
    # Sent again within the retry budget, then answered: the abort is a call of that step.
    answered = run_leaf(client_for(serve(aborted, as_reply(last))), SandboxDouble(), "task", system_prompt="sys")
    figures = answered.figures()
    assert answered.exit_reason == "agent" and len(answered.records) == 1
    assert (figures.prompt_tokens, figures.completion_tokens, figures.cached_tokens) == (6000, 71, 4800)
    assert (figures.model_calls, figures.steps) == (2, 1)
    # Aborted until the retries ran out: the run ends llm_query_error, and every abort's tokens still count.
    failed = run_leaf(client_for(serve(aborted, aborted, aborted), max_retries=2), SandboxDouble(), "task",
                      system_prompt="sys")
    figures = failed.figures()
    assert failed.exit_reason == "llm_query_error" and failed.records == []
    assert (figures.prompt_tokens, figures.completion_tokens, figures.model_calls, figures.steps) == (3000, 93, 3, 0)
    assert failed.usage.cached_unreported == 3
