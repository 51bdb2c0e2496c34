"""One scripted Leaf run against the real bubblewrap sandbox (sandbox/local.py), end to end."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandbox.base import SandboxSpec, SandboxUnavailable
from tests.doubles.openai_server import ScriptedOpenAIServer, assistant, prefix_extensions, text_call, tool_call
from worker.leaf.loop import run_leaf
from worker.leaf.model import OpenAIChatModel
from worker.leaf.prompts import render_task, system_prompt

local = pytest.importorskip("sandbox.local")
pytestmark = pytest.mark.bwrap


@pytest.fixture
def repo() -> Iterator[tuple[Path, str]]:
    """A git checkout the sandbox's unprivileged host uid can reach (pytest's tmp dirs are 0700)."""
    if shutil.which("bwrap") is None or shutil.which("git") is None:
        pytest.skip("needs bubblewrap and git")
    parent = Path(tempfile.mkdtemp(prefix="frogfix-leaf-"))
    parent.chmod(0o711)
    work = parent / "repo"
    work.mkdir()
    (work / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@e"}
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "base"]):
        subprocess.run(command, cwd=work, check=True, env=env)
    base = subprocess.run(["git", "rev-parse", "HEAD"], cwd=work, check=True, capture_output=True, text=True)
    try:
        yield work, base.stdout.strip()
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def test_scripted_run_in_the_real_sandbox(
    repo: tuple[Path, str],
    serve: Callable[..., ScriptedOpenAIServer],
    client_for: Callable[..., OpenAIChatModel],
) -> None:
    work, base = repo
    server = serve(
        assistant(None, reasoning="Read it first.", tool_calls=[tool_call("Read", {"file_path": "calc.py"}, "r1")]),
        assistant(text_call("Edit", file_path="calc.py", old_string="return a - b", new_string="return a + b")),
        assistant(None, tool_calls=[
            tool_call("Bash", {"command": "python3 -c 'import calc; print(calc.add(1, 2))'", "timeout": 60}, "b1"),
            tool_call("Glob", {"pattern": "**/*.py"}, "g1"),
        ]),
        assistant("Fixed add() to add."),
    )
    try:
        sandbox = local.LocalSandbox(SandboxSpec(workspace=str(work)))
    except SandboxUnavailable as exc:
        pytest.skip(f"bubblewrap cannot start here: {exc}")
    with sandbox:
        result = run_leaf(client_for(server), sandbox, render_task("add() subtracts", "add(1, 2) == -1"),
                          system_prompt=system_prompt())
        patch = sandbox.patch(base)

    assert result.exit_reason == "agent", result.error
    outputs = [m["content"] for m in result.messages if m["role"] == "tool"]
    assert outputs[0].splitlines()[:3] == ["calc.py", "1. def add(a, b):", "2.     return a - b"]
    assert outputs[1] == "Edited calc.py (1 replacement)."
    assert outputs[2].startswith("Exit code: 0\nSTDOUT:\n3\n")
    assert outputs[3] == "calc.py"
    assert "+    return a + b" in patch and "-    return a - b" in patch
    good, pairs = prefix_extensions(server.requests)
    assert good == pairs == 3
