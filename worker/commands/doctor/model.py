"""Doctor's model checks: the model is listed, and one tiny tool-call request shows the launch flags.

SGLang must run with `--tool-call-parser qwen3_coder` (else the call stays as text in `content`),
`--reasoning-parser qwen3` (else the thinking stays in `content` as `...</think>` and there is no
`reasoning_content`) and `--enable-cache-report` (else `usage.prompt_tokens_details` is null and
the cache cannot be watched). One request, sent as the agent loop sends them (the thinking is on),
tells all three apart; it asks for one Bash call and caps the answer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from app.endings import Ending, EndingKind
from app.outcome_words import shown_url
from app.settings import Settings
from worker.commands.doctor.results import CheckResult, DoctorOptions, failed, passed, skipped

LIST_TIMEOUT_S = 10.0
CALL_TIMEOUT_S = 60.0
# The thinking comes before the call, so "a few tokens" means enough for a short thought and the call.
MAX_TOKENS = 1024
PROBE_COMMAND = "true"
SYSTEM = "You are a software-engineering agent in a checked-out repository. Use the tools."
TASK = f"Run the shell command `{PROBE_COMMAND}` with the Bash tool. Call the tool at once; do not explain."
FLAG_TOOLS = "--tool-call-parser qwen3_coder"
FLAG_REASONING = "--reasoning-parser qwen3"
FLAG_CACHE = "--enable-cache-report"


def _restart(flag: str) -> str:
    return f"restart SGLang with {flag} (FrogFix needs all of {FLAG_REASONING} {FLAG_TOOLS} {FLAG_CACHE})"


def check_model(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    listed = model_listed(settings).line
    if listed.outcome != "pass":
        why = "not checked: the model is not served there"
        return [listed, *(skipped(n, why) for n in ("model.tool_calls", "model.reasoning", "model.cached_tokens"))]
    return [listed, *_probe_lines(settings)]


@dataclass(frozen=True)
class Listed:
    """The model list's answer: doctor's line, and how a job would end for it (None when the model is served).

    `fix` and `eval` ask this before they build or run anything: the cheap question, one home."""

    line: CheckResult
    kind: EndingKind | None = None

    @property
    def ending(self) -> Ending | None:
        """The ending a job stopped by it has: its kind, doctor's detail as the cause."""
        return None if self.kind is None else Ending(self.kind, f"{self.line.detail}; {self.line.fix}",
                                                     cause=self.line.detail)


def model_listed(settings: Settings) -> Listed:
    """`GET /v1/models` answers and names FROGFIX_MODEL_NAME."""
    name = "model.listed"
    base = settings.model_base_url.rstrip("/")
    key = settings.model_api_key.get_secret_value() or "EMPTY"
    down_fix = f"start SGLang (python -m sglang.launch_server ... {FLAG_REASONING} {FLAG_TOOLS} {FLAG_CACHE}) " \
        "or correct FROGFIX_MODEL_BASE_URL (it ends in /v1)"
    shown = shown_url(base) or "FROGFIX_MODEL_BASE_URL"
    try:
        response = httpx.get(f"{base}/models", headers={"Authorization": f"Bearer {key}"}, timeout=LIST_TIMEOUT_S)
    except httpx.HTTPError as exc:
        said = f"nothing answers at {shown}: {type(exc).__name__}: {exc}"[:400]
        return Listed(failed(name, said, down_fix), EndingKind.model_unreachable)
    if response.status_code in (401, 403):
        said = f"{shown}/models refused the API key (HTTP {response.status_code})"
        return Listed(failed(name, said, "set FROGFIX_MODEL_API_KEY to the server's --api-key"),
                      EndingKind.model_refused)
    try:
        body = response.json()
    except ValueError:
        body = None
    data = body.get("data") if isinstance(body, dict) else None
    if response.status_code != 200 or not isinstance(data, list):
        said = f"{shown}/models answered HTTP {response.status_code} without a model list"
        return Listed(failed(name, said, down_fix), EndingKind.model_failing)
    served = [str(m.get("id")) for m in data if isinstance(m, dict)]
    if settings.model_name in served:
        return Listed(passed(name, f"{settings.model_name} is served at {shown}"))
    return Listed(failed(name, f"{shown} serves {', '.join(served) or 'no model'}, not {settings.model_name}",
                         f"set FROGFIX_MODEL_NAME to the served name, or start SGLang with --served-model-name "
                         f"{settings.model_name}"), EndingKind.model_refused)


def _bash_schema() -> dict[str, Any]:
    from worker.leaf.tools import TOOL_SCHEMAS

    return next(s for s in TOOL_SCHEMAS if s["function"]["name"] == "Bash")


def _probe_lines(settings: Settings) -> list[CheckResult]:
    """One request through the agent loop's own model client, with no retries and a short limit."""
    from dataclasses import replace

    from worker.leaf.model import ModelError, OpenAIChatModel
    from worker.wiring import sampling_from

    client = OpenAIChatModel(
        settings.model_base_url,
        settings.model_name,
        api_key=settings.model_api_key.get_secret_value(),
        sampling=replace(sampling_from(settings), max_completion_tokens=MAX_TOKENS),
        timeout=CALL_TIMEOUT_S,
        connect_timeout=LIST_TIMEOUT_S,
        max_retries=0,
    )
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    try:
        with client:
            reply = client.complete(messages, [_bash_schema()], max_completion_tokens=MAX_TOKENS)
    except ModelError as exc:
        why = "not checked: the tool-call request failed"
        return [
            failed("model.tool_calls", f"a one-call request failed: {exc}"[:400],
                   "look at the SGLang server's log; check FROGFIX_MODEL_BASE_URL and FROGFIX_MODEL_NAME"),
            skipped("model.reasoning", why),
            skipped("model.cached_tokens", why),
        ]
    message = reply.message
    cached = reply.usage.cached_tokens if reply.usage is not None else None
    return [
        _tool_calls_line(message, reply.finish_reason),
        _reasoning_line(message),
        passed("model.cached_tokens", f"usage.prompt_tokens_details.cached_tokens is reported ({cached})")
        if cached is not None
        else failed("model.cached_tokens", "usage.prompt_tokens_details is missing: cached tokens are not reported",
                    _restart(FLAG_CACHE)),
    ]


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _tool_calls_line(message: dict[str, Any], finish_reason: str | None) -> CheckResult:
    name = "model.tool_calls"
    content = _content(message)
    calls = message.get("tool_calls") or []
    names = [str((c.get("function") or {}).get("name")) for c in calls if isinstance(c, dict)]
    if names:
        return passed(name, f"parsed tool_calls: {', '.join(names)}")
    if "<tool_call>" in content or "<function=" in content:
        return failed(name, "the call came back as text in content (<tool_call>...), not as parsed tool_calls",
                      _restart(FLAG_TOOLS))
    if finish_reason == "length":
        return failed(name, f"the model used its {MAX_TOKENS} tokens before calling the tool",
                      "run doctor again; if it keeps happening, check that FROGFIX_MODEL_NAME is FrogNano")
    return failed(name, f"the model answered without a tool call (finish_reason {finish_reason})",
                  f"check that the served model is FrogNano and that SGLang runs with {FLAG_TOOLS}")


def _reasoning_line(message: dict[str, Any]) -> CheckResult:
    name = "model.reasoning"
    content = _content(message)
    reasoning = message.get("reasoning_content")
    if "</think>" in content or "<think>" in content:
        return failed(name, "the thinking came back inside content (<think>...</think>), no reasoning_content",
                      _restart(FLAG_REASONING))
    if isinstance(reasoning, str) and reasoning.strip():
        return passed(name, f"reasoning_content separated ({len(reasoning)} characters)")
    return failed(name, "no reasoning_content although thinking was asked for (chat_template_kwargs)",
                  _restart(FLAG_REASONING))
