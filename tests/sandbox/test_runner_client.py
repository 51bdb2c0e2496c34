"""RunnerClient on its own, over a scripted channel: what both backends share, without a sandbox.

The client frames requests, numbers them, tells an error reply's kind by its `code` (never its
text) and marks the sandbox dead only when the runner can no longer be trusted.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from sandbox import PatchTooLarge, SandboxError, SandboxLimits, SandboxOptions
from sandbox.local import LocalSandbox
from sandbox.runner_client import RunnerBroken, RunnerClient, decode_reply, encode_request

LIMITS = SandboxLimits(default_tool_timeout=20.0)


class ScriptedChannel:
    """Answers each request with the next scripted reply (its `id` filled in) or raises it."""

    def __init__(self, *answers: dict[str, Any] | Exception) -> None:
        self.answers = list(answers)
        self.sent: list[tuple[dict[str, Any], float]] = []

    def exchange(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.sent.append((request, timeout))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return {"id": request["id"], **answer}


def client(*answers: dict[str, Any] | Exception, max_patch_bytes: int = 1000) -> tuple[RunnerClient, ScriptedChannel]:
    channel = ScriptedChannel(*answers)
    box = RunnerClient(LIMITS, SandboxOptions(tool_timeout_s=7.0, reply_grace_s=3.0, max_patch_bytes=max_patch_bytes))
    box._channel = channel
    return box, channel


def test_requests_are_numbered_and_deadlines_follow_the_call() -> None:
    box, channel = client(
        {"ok": True, "output": "a.txt\n1. a"},
        {"ok": True, "output": "Exit code: 0\nSTDOUT:\n\nSTDERR:\n"},
        {"ok": True, "exit_code": 1, "log": "F", "timed_out": False, "duration_s": 2},
        {"ok": True, "patch_b64": base64.b64encode(b"diff").decode()},
    )
    assert box.call_tool("Read", {"file_path": "a.txt"}) == "a.txt\n1. a"
    box.call_tool("Bash", {"command": "true", "timeout": 50})
    result = box.run_command("pytest", timeout=100)
    assert (result.exit_code, result.log, result.duration_s) == (1, "F", 2.0)
    assert box.patch("abc") == "diff"
    assert [request["id"] for request, _ in channel.sent] == [1, 2, 3, 4]
    assert [timeout for _, timeout in channel.sent] == [7.0, 53.0, 103.0, 603.0]
    assert channel.sent[3][0] == {"id": 4, "op": "patch", "base": "abc", "max_bytes": 1000}


def test_patch_too_large_is_told_by_its_code_and_leaves_the_sandbox_usable() -> None:
    box, _ = client(
        {"ok": False, "code": "patch_too_large", "error": "whatever the text says"},
        {"ok": False, "error": "ValueError: the patch is larger than 1000 bytes"},  # no code: no PatchTooLarge
        {"ok": True, "pong": True},
        max_patch_bytes=1000,
    )
    with pytest.raises(PatchTooLarge) as caught:
        box.patch_bytes("abc")
    assert caught.value.limit == 1000 and str(caught.value) == "sandbox runner: whatever the text says"
    with pytest.raises(SandboxError) as plain:
        box.patch("abc")
    assert not isinstance(plain.value, PatchTooLarge)
    assert box.ping()["pong"] is True


def test_a_broken_runner_or_a_bad_field_kills_the_client() -> None:
    box, _ = client(RunnerBroken("the sandbox runner exited"))
    with pytest.raises(SandboxError, match="runner exited"):
        box.ping()
    with pytest.raises(SandboxError, match="runner exited"):
        box.ping()  # dead: nothing more is sent
    box, channel = client({"ok": True, "output": 5})
    with pytest.raises(SandboxError, match="without a valid 'output'"):
        box.call_tool("Glob", {"pattern": "*"})
    with pytest.raises(SandboxError, match="without a valid 'output'"):
        box.call_tool("Glob", {"pattern": "*"})
    assert len(channel.sent) == 1
    box, _ = client({"ok": True, "patch_b64": "not base64!"})
    with pytest.raises(SandboxError, match="not base64"):
        box.patch_bytes("abc")


def test_closed_client_sends_nothing() -> None:
    box, channel = client()
    with box:
        pass
    with pytest.raises(SandboxError, match="the sandbox is closed"):
        box.ping()
    assert channel.sent == []


def test_framing() -> None:
    line = encode_request({"id": 1, "op": "tool", "arguments": {"content": "é", "n": object}})
    assert line.endswith(b"\n") and line.isascii()
    assert json.loads(line)["arguments"]["content"] == "é"
    assert decode_reply(b'{"id": 1, "ok": true}', 1) == {"id": 1, "ok": True}
    with pytest.raises(RunnerBroken, match="not JSON"):
        decode_reply(b"garbage", 1)
    with pytest.raises(RunnerBroken, match="unexpected reply"):
        decode_reply(b'{"id": 2, "ok": true}', 1)
    with pytest.raises(RunnerBroken, match="unexpected reply"):
        decode_reply(b"[1]", 1)


@pytest.mark.parametrize(("timeout", "waited"), [
    (float("inf"), 23.0), (float("-inf"), 23.0), (float("nan"), 23.0), ("Infinity", 23.0),
    (1e300, LIMITS.wall_seconds + 3.0),  # finite but past any clock: the sandbox's own limit
])
def test_a_bash_timeout_the_model_chose_never_makes_an_unbounded_wait(timeout: object, waited: float) -> None:
    box, channel = client({"ok": True, "output": "ValueError: timeout must be a finite number"})
    box.call_tool("Bash", {"command": "true", "timeout": timeout})
    assert channel.sent[0][1] == waited


@pytest.mark.bwrap
@pytest.mark.parametrize("timeout", [float("inf"), float("-inf"), float("nan"), "inf", 1e300])
def test_non_finite_bash_timeout_is_a_tool_error_and_the_runner_stays_in_step(
    sb: LocalSandbox, timeout: object
) -> None:
    """Infinity used to raise OverflowError in the client after the request went out, leaving
    its reply unread: the next call read it and the sandbox died (tool_error)."""
    output = sb.call_tool("Bash", {"command": "echo first", "timeout": timeout})
    if timeout == 1e300:
        assert output == "Exit code: 0\nSTDOUT:\nfirst\n\nSTDERR:\n"
    else:
        assert output.startswith("ValueError: timeout must be a finite number, got ")
    assert sb.call_tool("Bash", {"command": "echo second"}) == "Exit code: 0\nSTDOUT:\nsecond\n\nSTDERR:\n"
    assert sb.call_tool("Read", {"file_path": "missing.txt"}).startswith("FileNotFoundError")
