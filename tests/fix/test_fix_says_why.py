"""Every failure says why, in one line (issue 26): `fix`'s stdout, then `show` on the local job it made.

Real processes: `manage.py fix` on small git repositories (bubblewrap sandboxes, real pytest), a model
URL on a loopback port where nothing listens, a real package mirror (pypiserver) that lacks a
package, and `manage.py show <local id>` reading the job's record.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doubles.openai_server import ScriptedOpenAIServer
from tests.fix.sample_repo import git, make_sample_repo
from tests.fix.test_fix_command import ROOT, fixing_script, run_fix, workspace_dir
from tests.servers import free_port


@pytest.fixture(autouse=True)
def _clean(tmp_path: Path):  # type: ignore[no-untyped-def]
    yield
    shutil.rmtree(workspace_dir(tmp_path / "data"), ignore_errors=True)


def show(data_dir: Path, job_id: str, model_url: str = "http://127.0.0.1:9/v1") -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env.update({"FROGFIX_DATA_DIR": str(data_dir), "FROGFIX_MODEL_BASE_URL": model_url})
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), "show", job_id], env=env, capture_output=True,
                          text=True, timeout=120)


def job_id_of(data_dir: Path) -> str:
    """The one job a `fix` run left in this data folder's database (a local job is a job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env.update({"FROGFIX_DATA_DIR": str(data_dir)})
    listed = subprocess.run([sys.executable, str(ROOT / "manage.py"), "jobs", "--json"], env=env,
                            capture_output=True, text=True, timeout=120)
    items = json.loads(listed.stdout)["items"]
    assert len(items) == 1 and items[0]["forge"] == "local", items
    return str(items[0]["id"])


def lines_starting(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def shown_why(text: str) -> str:
    """`show`'s why field, its wrapped lines joined back into one."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("  why "))
    parts = [lines[start].removeprefix("  why ").strip()]
    for line in lines[start + 1:]:
        if not line.startswith(" " * 13) or line[13:14] == " ":
            break
        parts.append(line.strip())
    return " ".join(parts)


def committed(repo: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "change")
    return repo


@pytest.mark.bwrap
def test_a_model_server_that_goes_down_during_the_job_is_named_with_its_url_and_doctor(tmp_path: Path) -> None:
    """The model check skipped (a server that answered it and then went away): the job names it."""
    repo = make_sample_repo(tmp_path)
    data = tmp_path / "data"
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    proc = run_fix(repo, data, url, "--skip-model-check", env_extra={"FROGFIX_MODEL_MAX_RETRIES": "0"})
    assert proc.returncode == 2, proc.stderr
    out = proc.stdout
    assert out.startswith("status: failed (model unreachable after 0 steps, "), out
    why = lines_starting(out, "why: ")
    assert why == [f"why: the model server at {url} could not be reached (Connection refused); run ./manage.py doctor"]
    assert "tests: python3 -m pytest -q: before: 1 failed, 1 passed; after: did not run" in out
    assert "llm_query_error" not in out and "exit None" not in out

    shown = show(data, job_id_of(data), model_url=url)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"job {job_id_of(data)}: failed\n")
    assert shown_why(shown.stdout) == why[0].removeprefix("why: ")
    assert "model unreachable after 0 steps" in shown.stdout


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            "test_comand: python3 -m pytest -q\n",
            "unknown key test_comand (line 1 column 1); did you mean test_command?",
        ),
        (
            "test_timeout: soon\n",
            "test_timeout must be a number of seconds between 1 and 10800, not the text 'soon' (line 1 column 15)",
        ),
        (
            "test_command: [pytest, -q]\n",
            "test_command must be a non-empty string, not a list of 2 items (line 1 column 15)",
        ),
    ],
)
def test_a_bad_frogfix_yml_names_the_key_and_what_is_wrong(tmp_path: Path, config: str, expected: str) -> None:
    repo = committed(make_sample_repo(tmp_path), {".frogfix.yml": config})
    data = tmp_path / "data"
    proc = run_fix(repo, data, "http://127.0.0.1:9/v1", "--skip-model-check")  # it ends before the model
    assert proc.returncode == 2, proc.stderr
    line = f"the repository's .frogfix.yml is not usable: {expected}"
    assert proc.stdout.startswith("status: failed (the agent did not run, "), proc.stdout
    assert lines_starting(proc.stdout, "why: ") == [f"why: {line}"]
    assert "config_error" not in proc.stdout
    assert "trajectory: none (the job ended before the agent ran)" in proc.stdout

    shown = show(data, job_id_of(data))
    assert shown.returncode == 0, shown.stderr
    assert shown_why(shown.stdout) == line
    assert "  agent      the agent did not run" in shown.stdout and "config_error" not in shown.stdout


@pytest.mark.bwrap
def test_an_environment_that_cannot_be_built_says_so_and_why(tmp_path: Path) -> None:
    from tests.realrepos.mirror import PackageMirror

    packages = tmp_path / "packages"
    packages.mkdir()
    repo = make_sample_repo(tmp_path)
    repo = committed(repo, {"requirements.txt": "frogfix-no-such-package==3.1\n"})
    data = tmp_path / "data"
    with PackageMirror(packages, "mirror-password-26") as mirror:
        index = {"FROGFIX_PIP_INDEX_URL": mirror.url_with_credentials}
        proc = run_fix(repo, data, "http://127.0.0.1:9/v1", "--skip-model-check", env_extra=index)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout.startswith("status: environment error (the agent did not run, "), proc.stdout
    why = lines_starting(proc.stdout, "why: ")
    assert len(why) == 1 and why[0].startswith(
        "why: the test environment could not be built: installing the declared dependencies failed"
    ), proc.stdout
    assert "No solution found when resolving dependencies" in why[0]  # the installer's own first error line
    assert "frogfix-no-such-package" in why[0], proc.stderr  # and its cause, which names the package
    assert "environment error:" not in proc.stdout  # said once, by the why line
    assert "mirror-password-26" not in proc.stdout + proc.stderr

    shown = show(data, job_id_of(data))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"job {job_id_of(data)}: failed\n")
    assert shown_why(shown.stdout) == why[0].removeprefix("why: ")
    assert "mirror-password-26" not in shown.stdout


@pytest.mark.bwrap
def test_a_fix_says_no_why_and_its_tests_in_words(tmp_path: Path) -> None:
    repo = make_sample_repo(tmp_path)
    data = tmp_path / "data"
    with ScriptedOpenAIServer(fixing_script()) as server:
        proc = run_fix(repo, data, server.base_url, env_extra={"FROGFIX_VERIFY_RUNS": "2"})
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("status: fixed (the agent finished after 4 steps, "), out
    assert lines_starting(out, "why") == []
    assert "tests: python3 -m pytest -q: before: 1 failed, 1 passed; after: 2 passed (2 runs)" in out
    assert "before exit" not in out and "after exit" not in out  # no exit codes left to decode

    shown = show(data, job_id_of(data))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"job {job_id_of(data)}: done\n")
    assert "  why " not in shown.stdout
    assert "  agent      the agent finished after 4 steps" in shown.stdout
    assert "tests: before: 1 failed, 1 passed; after: 2 passed (2 runs)" in " ".join(shown.stdout.split())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")} | {"FROGFIX_DATA_DIR": str(data)}
    as_json = json.loads(subprocess.run([sys.executable, str(ROOT / "manage.py"), "show", job_id_of(data), "--json"],
                                        env=env, capture_output=True, text=True, timeout=120).stdout)
    # A local job is a job: `show --json` has a forge job's shape, forge `local`, project the checkout's folder.
    assert (as_json["forge"], as_json["status"], as_json["exit_reason"]) == ("local", "done", "agent")
    [attempt] = as_json["attempts"]
    assert attempt["chosen"] is True and attempt["status"] == "verified" and "+    return a + b" in attempt["patch"]
    assert attempt["evidence"]["level"] == "failed_before"  # the answer lifts the verdict beside `tests`
    assert attempt["tests"]["before"]["counts"] == {"failed": 1, "passed": 1}
    assert (data / attempt["trajectory_path"]).is_file()
