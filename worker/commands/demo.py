"""`manage.py demo`: a whole local job on a generated repository with a known bug, no model server needed.

The model is a replay of the assistant turns a good run makes (read, edit, run the tests,
answer), so everything else is real: the bubblewrap sandbox, the Leaf loop and its tool
protocol, the patch, and the tests run before and after in fresh sandboxes.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from app.attestations import keys, store
from worker.git.gitcalls import git_environment
from worker.leaf.model import ModelReply, ReplayModel, Usage

CALC = '''"""A tiny calculator."""


def add(a: int, b: int) -> int:
    return a - b


def mul(a: int, b: int) -> int:
    return a * b
'''

TEST = """from calc import add, mul


def test_add() -> None:
    assert add(2, 3) == 5


def test_mul() -> None:
    assert mul(2, 3) == 6
"""

PYPROJECT = """[project]
name = "calc"
version = "0.1.0"

[tool.pytest.ini_options]
pythonpath = ["."]
"""

ISSUE_TITLE = "add() returns the difference"
ISSUE_BODY = "Calling add(2, 3) gives -1 instead of 5."


def make_sample_repo(root: Path) -> Path:
    """A git repository whose `add` subtracts, with a failing test that shows it."""
    repo = root / "calc"
    (repo / "tests").mkdir(parents=True)
    (repo / "calc.py").write_text(CALC)
    (repo / "tests" / "test_calc.py").write_text(TEST)
    (repo / "pyproject.toml").write_text(PYPROJECT)
    for args in (
        ("init", "-q", "-b", "main"),
        ("add", "-A"),
        ("-c", "user.name=FrogFix demo", "-c", "user.email=demo@localhost", "commit", "-q", "-m", "calc"),
    ):
        # Fixed dates make the sample's commit the same every time, so a demo job can be replayed.
        dates = {"GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z"}
        # The isolated git environment: none of the machine's hooks or filters runs on the sample.
        env = {**git_environment(), **dates}
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env)
    return repo


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


DEMO_MODEL_LABEL = "the demo's scripted replies (no model ran)"


def demo_model() -> ReplayModel:
    """The assistant turns of a run that fixes the sample bug."""
    turns: list[tuple[str | None, str, list[dict[str, Any]]]] = [
        (None, "The issue says add() subtracts. Read calc.py.", [_call("d1", "Read", {"file_path": "calc.py"})]),
        (
            None,
            "Line 5 uses minus; make it a plus.",
            [_call("d2", "Edit", {"file_path": "calc.py", "old_string": "return a - b", "new_string": "return a + b"})],
        ),
        (None, "Run the tests.", [_call("d3", "Bash", {"command": "python3 -m pytest -q"})]),
        ("add() subtracted instead of adding; it now returns a + b and the tests pass.", "Done.", []),
    ]
    # Token figures as SGLang started with --enable-cache-report reports them: each prompt is the last
    # one plus the new turns, and the prefix cache serves what was sent before.
    prompts = (1890, 2230, 2480, 2790)
    completions = (48, 96, 31, 52)
    replies = []
    for i, (content, reasoning, calls) in enumerate(turns):
        message: dict[str, Any] = {"role": "assistant", "content": content, "reasoning_content": reasoning}
        if calls:
            message["tool_calls"] = calls
        cached = 0 if i == 0 else prompts[i - 1] + completions[i - 1] - 14
        usage = Usage(prompts[i], completions[i], prompts[i] + completions[i], cached)
        replies.append(ModelReply(message=message, finish_reason="tool_calls" if calls else "stop", usage=usage))
    return ReplayModel(replies, label=DEMO_MODEL_LABEL)


# -- the demo's signed statement (issue 41): a throwaway key pair of its own ---------------------------

DEMO_KEYS = "demo-attestation"  # in the data folder; never the installation's key or its trusted folder


def demo_key(data_dir: Path) -> tuple[Path, Path]:
    """The demo's own key pair (made on first use), so a demo with no FROGFIX_ATTESTATION_KEY still signs
    its change and shows `verify --replay`: the private key and its public key file. It proves only that
    this demo run signed it; it is trusted by nothing but a `--key` that names it."""
    folder = Path(data_dir) / DEMO_KEYS
    private, public = folder / "demo-signing-key.pem", folder / "public"
    if not private.is_file():
        keys.keygen(private, public)
    return private, public / f"{keys.load_signer(private).public_key.keyid}.pub"


def write_bundle(data_dir: Path, job_id: int) -> Path | None:
    """The job's bundle (what `/api/jobs/{id}/attestations` serves) as a file beside the demo's keys;
    None when the job signed nothing."""
    bundle = store.bundle(data_dir, job_id)
    if not bundle["attestations"]:
        return None
    path = Path(data_dir) / DEMO_KEYS / f"job-{job_id}-attestations.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(bundle, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def verify_command(bundle: Path, public: Path | None) -> str:
    """The one line that checks the demo's bundle and replays it with no model server."""
    key = f" --key {public}" if public is not None else ""
    return f"./manage.py verify {bundle}{key} --replay"
