"""Model checks against the model double answering like SGLang, with and without its launch flags."""

from __future__ import annotations

from typing import Any

import pytest

from app.settings import get_settings
from tests.conftest import configure
from tests.doctor.conftest import by_name, free_port
from tests.doubles.openai_server import ScriptedOpenAIServer, sglang_responder
from worker.commands.doctor import model as doctor_model
from worker.commands.doctor.model import check_model
from worker.commands.doctor.results import DoctorOptions

MODEL = "FrogNano-4B-2609"


def _run(env: dict[str, Any], **flags: bool) -> tuple[dict[str, Any], ScriptedOpenAIServer]:
    with ScriptedOpenAIServer(sglang_responder(**flags), model=MODEL) as server:
        configure(env["monkeypatch"], model_base_url=server.base_url, model_name=MODEL)
        lines = by_name(check_model(get_settings(), DoctorOptions()))
    return lines, server


def test_correct_sglang_passes_every_model_check(frogfix_env: dict[str, Any]) -> None:
    lines, server = _run(frogfix_env)
    assert {n: r.outcome for n, r in lines.items()} == {
        "model.listed": "pass",
        "model.tool_calls": "pass",
        "model.reasoning": "pass",
        "model.cached_tokens": "pass",
    }
    assert "Bash" in lines["model.tool_calls"].detail
    [body] = [server.request_json(i) for i in range(len(server.requests))]
    assert [t["function"]["name"] for t in body["tools"]] == ["Bash"]
    assert body["max_completion_tokens"] == doctor_model.MAX_TOKENS <= 1024  # one bounded probe, room to think
    assert body["chat_template_kwargs"] == {"enable_thinking": True}


def test_without_tool_call_parser_names_the_flag(frogfix_env: dict[str, Any]) -> None:
    lines, _ = _run(frogfix_env, tool_call_parser=False)
    line = lines["model.tool_calls"]
    assert line.outcome == "fail" and "as text in content" in line.detail
    assert "--tool-call-parser qwen3_coder" in line.fix
    assert lines["model.reasoning"].outcome == "pass"


def test_without_reasoning_parser_names_the_flag(frogfix_env: dict[str, Any]) -> None:
    lines, _ = _run(frogfix_env, reasoning_parser=False)
    line = lines["model.reasoning"]
    assert line.outcome == "fail" and "</think>" in line.detail
    assert line.fix.startswith("restart SGLang with --reasoning-parser qwen3")
    assert lines["model.tool_calls"].outcome == "pass"


def test_without_either_parser_both_fail(frogfix_env: dict[str, Any]) -> None:
    lines, _ = _run(frogfix_env, reasoning_parser=False, tool_call_parser=False)
    assert lines["model.tool_calls"].outcome == "fail" and lines["model.reasoning"].outcome == "fail"
    assert "--tool-call-parser qwen3_coder" in lines["model.tool_calls"].fix
    assert "--reasoning-parser qwen3" in lines["model.reasoning"].fix


def test_without_cache_report_names_the_flag(frogfix_env: dict[str, Any]) -> None:
    lines, _ = _run(frogfix_env, cache_report=False)
    line = lines["model.cached_tokens"]
    assert line.outcome == "fail" and "--enable-cache-report" in line.fix
    assert lines["model.tool_calls"].outcome == "pass"


def test_nothing_listening_is_a_failed_line_not_a_traceback(frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], model_base_url=f"http://127.0.0.1:{free_port()}/v1")
    lines = by_name(check_model(get_settings(), DoctorOptions()))
    assert lines["model.listed"].outcome == "fail"
    assert "nothing answers" in lines["model.listed"].detail
    assert "FROGFIX_MODEL_BASE_URL" in lines["model.listed"].fix and "--tool-call-parser" in lines["model.listed"].fix
    assert [lines[n].outcome for n in ("model.tool_calls", "model.reasoning", "model.cached_tokens")] == ["skip"] * 3


@pytest.mark.parametrize("served", ["other-model"])
def test_model_not_listed(frogfix_env: dict[str, Any], served: str) -> None:
    with ScriptedOpenAIServer(sglang_responder(), model=served) as server:
        configure(frogfix_env["monkeypatch"], model_base_url=server.base_url, model_name=MODEL)
        lines = by_name(check_model(get_settings(), DoctorOptions()))
        assert server.count == 0  # no completion asked of a server that does not serve the model
    assert lines["model.listed"].outcome == "fail" and "serves other-model" in lines["model.listed"].detail
    assert f"--served-model-name {MODEL}" in lines["model.listed"].fix
