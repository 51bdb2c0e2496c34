"""`fix --json` and `demo` report a top-level `usage`, summed over the run's model replies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.openai_server import Reply, ScriptedOpenAIServer
from tests.fix.sample_repo import make_sample_repo
from tests.fix.test_fix_command import ROOT, fixing_script, run_fix, workspace_dir


def with_cache_report(script: list[Any]) -> list[Any]:
    """SGLang's usage with --enable-cache-report on each reply: prompt grows 500 a turn, the cache serves 400 more."""
    replies = [item for item in script if isinstance(item, Reply)]
    for i, reply in enumerate(replies):
        reply.usage = {
            "prompt_tokens": 1500 + 500 * i,
            "completion_tokens": 25 + i,
            "prompt_tokens_details": {"cached_tokens": 400 * i},
            "reasoning_tokens": 0,
            "completion_tokens_details": None,
        }
    return script


@pytest.mark.bwrap
def test_fix_json_has_a_usage_object_summed_over_the_replies(tmp_path: Path) -> None:
    repo = make_sample_repo(tmp_path)
    with ScriptedOpenAIServer(with_cache_report(fixing_script())) as server:  # 4 replies and one 503 in between
        proc = run_fix(repo, tmp_path / "data", server.base_url, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    usage = out["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["cached_tokens"]) == (
        1500 + 2000 + 2500 + 3000, 25 + 26 + 27 + 28, 0 + 400 + 800 + 1200)
    assert usage["calls"] == 4 and usage["steps"] == 4 == out["steps"]
    assert usage["cached_share"] == round(2400 / 9000, 4)
    assert usage["model_seconds"] > 0 and usage["sandbox_seconds"] > 0
    # The trajectory keeps each reply's figures, and `fix`'s verdict with the same usage.
    saved = json.loads(Path(out["trajectory"]).read_text())
    assert [s["usage"]["cached_tokens"] for s in saved["steps"]] == [0, 400, 800, 1200]
    assert saved["fix"]["usage"] == usage
    # One name, one figure: the run's tool-call seconds, and `fix`'s sandbox seconds (tool calls and test runs).
    assert "sandbox_seconds" not in saved["usage"] and 0 < saved["usage"]["tool_seconds"] < usage["sandbox_seconds"]
    # The existing contract is intact: nothing renamed, `usage` only added.
    assert {"status", "exit_reason", "steps", "patch", "tests", "trajectory", "job_id", "flags"} <= set(out)


@pytest.mark.bwrap
def test_demo_prints_its_usage_table(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env.update(
        {"FROGFIX_DATA_DIR": str(tmp_path / "data"), "FROGFIX_WORKSPACE_DIR": str(workspace_dir(tmp_path / "data"))}
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "demo"], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:3] == ["prompt", "cached", "share"])
    row = lines[head + 1].split()
    assert row[0] == "usage" and row[1:4] == ["9390", "6733", "72%"] and row[5:7] == ["4", "4"]


@pytest.mark.bwrap
def test_steps_mean_replies_in_fix_json_its_usage_and_the_trajectory(tmp_path: Path) -> None:
    """A call that got no reply (refused here) is a model call made, never a step: all three readers agree."""
    from tests.doubles.openai_server import Status, assistant, sglang_error, tool_call

    repo = make_sample_repo(tmp_path)
    script = [assistant(None, tool_calls=[tool_call("Glob", {"pattern": "*.py"})]),
              Status(400, sglang_error(400, "bad request", "BadRequest"))]
    with ScriptedOpenAIServer(script) as server:
        proc = run_fix(repo, tmp_path / "data", server.base_url, "--json")
    out = json.loads(proc.stdout)
    saved = json.loads(Path(out["trajectory"]).read_text())
    assert out["exit_reason"] == "llm_query_error"
    assert (out["steps"], out["usage"]["steps"], saved["n_steps"], len(saved["steps"])) == (1, 1, 1, 1)
    assert out["usage"]["calls"] == 1
