"""`manage.py doctor` end to end: a subprocess against the doubles, its JSON and its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import shared_fixture
from tests.doctor.conftest import by_name
from tests.doubles.gitlab_api import GitLabDouble
from tests.doubles.openai_server import ScriptedOpenAIServer, sglang_responder
from worker.commands.doctor import CheckResult

ROOT = Path(__file__).resolve().parents[2]
MODEL = "FrogNano-4B-2609"


def _doctor(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "doctor", *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    return proc.returncode, proc.stdout, proc.stderr


def _env(frogfix_env: dict[str, Any], gitlab: GitLabDouble, model_url: str) -> dict[str, str]:
    return {
        "FROGFIX_DATA_DIR": str(frogfix_env["data_dir"]),
        "FROGFIX_MODEL_BASE_URL": model_url,
        "FROGFIX_MODEL_NAME": MODEL,
        "FROGFIX_GITLAB_URL": gitlab.base_url,
        "FROGFIX_GITLAB_TOKEN": gitlab.token,
        "FROGFIX_GITLAB_WEBHOOK_SECRET": "hook-secret-value",
        "FROGFIX_ALLOWED_PROJECTS": "acme/*",
    }


def test_doctor_json_against_the_doubles(frogfix_env: dict[str, Any]) -> None:
    shared_fixture("")  # the GitLab double answers in shapes from ../shared
    with GitLabDouble() as gitlab, ScriptedOpenAIServer(sglang_responder(), model=MODEL) as model:
        gitlab.add_project("acme/calc")
        gitlab.add_member("acme/calc", "frogfix-bot", 40)
        code, out, err = _doctor(_env(frogfix_env, gitlab, model.base_url), "--json", "--min-free-gib", "0")
    assert "Traceback" not in err
    data = json.loads(out)
    assert all(set(item) >= {"name", "outcome", "detail", "fix"} for item in data)
    lines = by_name([CheckResult(**item) for item in data])
    expected_pass = ["database", "broker", "gitlab.url", "gitlab.token", "gitlab.project", "gitlab.webhook_secret",
                     "model.listed", "model.tool_calls", "model.reasoning", "model.cached_tokens",
                     "disk.data", "disk.workspace"]
    assert {n: lines[n].outcome for n in expected_pass} == dict.fromkeys(expected_pass, "pass")
    assert lines["gitea"].outcome == "skip"
    assert {"sandbox.bubblewrap", "sandbox.network", "sandbox.filesystem", "sandbox.cgroups"} <= set(lines)
    # Exit code non-zero exactly when a check failed (the sandbox lines depend on this machine).
    assert code == (1 if any(r.outcome == "fail" for r in lines.values()) else 0)
    assert gitlab.token not in out


def test_doctor_text_fails_for_a_server_without_parsers(frogfix_env: dict[str, Any]) -> None:
    shared_fixture("")
    flags = {"tool_call_parser": False, "reasoning_parser": False}
    with GitLabDouble() as gitlab, ScriptedOpenAIServer(sglang_responder(**flags), model=MODEL) as model:
        gitlab.add_project("acme/calc")
        gitlab.add_member("acme/calc", "frogfix-bot", 30)
        code, out, err = _doctor(_env(frogfix_env, gitlab, model.base_url))
    assert code == 1
    assert "Traceback" not in err
    lines = {line.split(":", 1)[0]: line for line in out.splitlines()}
    assert lines["FAIL model.tool_calls"].endswith(
        "fix: restart SGLang with --tool-call-parser qwen3_coder "
        "(FrogFix needs all of --reasoning-parser qwen3 --tool-call-parser qwen3_coder --enable-cache-report)"
    )
    assert "--reasoning-parser qwen3" in lines["FAIL model.reasoning"]
    assert "PASS gitlab.token" in lines
    assert "SKIP gitea" in lines
    assert out.splitlines()[-1].endswith("skipped")


def test_settings_that_do_not_load_are_one_line_not_a_traceback(frogfix_env: dict[str, Any]) -> None:
    """A mistyped setting is the commonest day-one failure: doctor (as every command) names each variable in one
    line on stderr, exit 2, and never echoes a value."""
    env = {"FROGFIX_DATA_DIR": str(frogfix_env["data_dir"]), "FROGFIX_SANDBOX": "kubernets-canary-7f3e",
           "FROGFIX_VERIFY_RUNS": "many"}
    for extra in (("--json",), ()):
        code, out, err = _doctor(env, *extra)
        assert code == 2 and out == "", err
        [line] = err.splitlines()
        assert line.startswith("frogfix doctor: FROGFIX_SANDBOX: ") and "FROGFIX_VERIFY_RUNS: " in line, line
        assert "(e.g. FROGFIX_SANDBOX=local)" in line and "(e.g. FROGFIX_VERIFY_RUNS=2)" in line
        assert "canary-7f3e" not in out + err
