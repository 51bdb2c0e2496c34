"""The trajectory file: Leaf's format plus ours, rewritten atomically each step, secrets scrubbed."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from app.redaction import redact_value
from tests.doubles.openai_server import ScriptedOpenAIServer, assistant, text_call, tool_call
from tests.doubles.sandbox_double import SandboxDouble
from worker.leaf.loop import StepRecord, run_leaf
from worker.leaf.model import ModelReply, OpenAIChatModel, ReplayModel, SamplingParams
from worker.leaf.tools import TOOL_SCHEMAS
from worker.leaf.trajectory_writer import HARNESS_VERSION, TrajectoryWriter

SECRET = "glpat-SECRETTOKEN123"


def scrub(text: str) -> str:
    return text.replace(SECRET, "[REDACTED]")


def make_writer(path: Path, **kwargs: Any) -> TrajectoryWriter:
    return TrajectoryWriter(path, job_id=42, model="FrogNano-4B-2609", sampling=SamplingParams().as_dict(),
                            base_commit="abc123", redact=scrub, fields={"issue": 7}, **kwargs)


def test_written_after_every_step_and_finished(
    tmp_path: Path, serve: Callable[..., ScriptedOpenAIServer], client_for: Callable[..., OpenAIChatModel]
) -> None:
    path = tmp_path / "traj" / "job-42.json"
    writer = make_writer(path)
    snapshots: list[dict[str, Any]] = []

    def on_step(record: StepRecord) -> None:
        writer.on_step(record)
        snapshots.append(json.loads(path.read_text()))

    sandbox = SandboxDouble(bash={"env": (0, f"TOKEN={SECRET}", "")})
    server = serve(
        assistant(None, tool_calls=[tool_call("Bash", {"command": "env"}, "b1")]),
        assistant(f"The token was {SECRET}; done."),
    )
    result = run_leaf(client_for(server), sandbox, f"issue mentions {SECRET}", system_prompt="sys",
                      on_step=on_step)
    writer.finish(result, patch=f"diff --git a/x b/x\n+{SECRET}\n")
    final = json.loads(path.read_text())

    assert [s["partial"] for s in snapshots] == [True, True]
    assert [len(s["messages"]) for s in snapshots] == [4, 5]
    assert snapshots[0]["n_steps"] == 1 and snapshots[0]["exit_reason"] is None
    assert final["trajectory_format"] == "leaf-function-calling"
    assert final["format_version"] == 1
    identity = (final["job_id"], final["model"], final["base_commit"], final["issue"])
    assert identity == (42, "FrogNano-4B-2609", "abc123", 7)
    assert final["harness_version"] == HARNESS_VERSION
    assert final["sampling"]["temperature"] == 0.6 and final["sampling"]["top_k"] == 20
    assert final["tools"] == TOOL_SCHEMAS
    assert final["exit_reason"] == "agent" and final["partial"] is False and final["n_steps"] == 2
    assert final["final_message"] == "The token was [REDACTED]; done."
    assert final["steps"][0]["tool_calls"][0]["name"] == "Bash"
    assert set(final["timings"]) == {"elapsed_s", "model_s", "tools_s"}
    assert final["usage"]["calls"] == 2
    assert final["output_patch"].endswith("+[REDACTED]\n")
    raw = path.read_text()
    assert SECRET not in raw and "[REDACTED]" in raw
    assert [m["role"] for m in final["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    assert writer.writes == 3
    # The live history was not touched by redaction.
    assert SECRET in result.messages[3]["content"]


def test_a_failed_write_leaves_the_previous_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "t.json"
    writer = make_writer(path)
    result = run_leaf(ReplayModel([{"role": "assistant", "content": "done"}]), SandboxDouble(), "t",
                      system_prompt="s", on_step=writer.on_step)
    before = path.read_bytes()

    def broken_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(OSError):
        writer.finish(result)
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]


def test_rewritten_history_is_refused(tmp_path: Path) -> None:
    writer = make_writer(tmp_path / "t.json", fsync=False)
    history = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    writer._take(history)
    with pytest.raises(ValueError, match="append-only"):
        writer._take([dict(history[0]), {"role": "user", "content": "changed"}])


def test_redact_value_walks_everything() -> None:
    value = {"a": [SECRET, {"b": f"x{SECRET}y", SECRET: 1}], "n": 3, "none": None}
    assert redact_value(value, scrub) == {"a": ["[REDACTED]", {"b": "x[REDACTED]y", "[REDACTED]": 1}], "n": 3,
                                          "none": None}


def test_replay_from_a_saved_trajectory(tmp_path: Path) -> None:
    replies = [
        ModelReply({"role": "assistant", "content": None,
                    "tool_calls": [tool_call("Write", {"file_path": "a", "content": "1"}, "w")]}, "tool_calls"),
        ModelReply({"role": "assistant", "content": text_call("Read", file_path="a")}, "stop"),
        ModelReply({"role": "assistant", "content": "done", "reasoning_content": "ok"}, "stop"),
    ]
    path = tmp_path / "t.json"
    writer = make_writer(path, fsync=False)
    first = run_leaf(ReplayModel(replies), SandboxDouble(), "task", system_prompt="s", on_step=writer.on_step)
    writer.finish(first)

    again = run_leaf(ReplayModel.from_trajectory(path), SandboxDouble(), "task", system_prompt="s")
    assert again.exit_reason == "agent"
    assert again.messages == first.messages
    assert ReplayModel.from_trajectory(json.loads(path.read_text())).remaining == 3
