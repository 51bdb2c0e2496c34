"""`manage.py fix` on six real upstream bugs: the environment is built from what each repository
declares, from a password-protected mirror and nothing else, and the base tests run before the agent.

The model double applies the upstream fix (fix_double.py), so these tests judge FrogFix's side:
environment, tests before and after, the patch it takes, and where the mirror's password goes
(nowhere). Three tasks run by default (the fastest that cover pyproject extras with a src layout
and hatch-vcs, tox.ini deps over setup.py, and poetry.lock); FROGFIX_REALREPOS=all runs all six,
or a comma-separated list of task names picks some.
"""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from app.patches import file_diffs
from tests.doubles.openai_server import ScriptedOpenAIServer
from tests.realrepos import FIX_TIMEOUT, FIXTURES, Task, run_fix
from tests.realrepos.conftest import MIRROR_CANARY, RunDirs
from tests.realrepos.fix_double import fixing_script, no_patch_script
from tests.realrepos.mirror import USER, PackageMirror

SELECT = "FROGFIX_REALREPOS"
# Base suite seconds with a warm env on this project's 16-core runner: humanize 2.3, natsort 6.7,
# rich 7.7, parso 8.9, werkzeug 12.5, arrow 15.2 (see the report beside these tests' first commit).
DEFAULT_TASKS = ("humanize-naturaldate-tz", "natsort-pathlib-paths", "rich-prompt-markup")
ANSI = re.compile(r"\x1b\[[0-9;]*m")
CACHE_TASK = "humanize-naturaldate-tz"  # the fastest: the cache test is about FrogFix's cost, not the suite's


def _known_tasks() -> list[str]:
    """The manifest's tasks, or the default three when the fixtures are absent (they then skip)."""
    try:
        return [entry["task"] for entry in json.loads((FIXTURES / "MANIFEST.json").read_text())["tasks"]]
    except OSError:
        return list(DEFAULT_TASKS)


def _selected(known: list[str]) -> set[str]:
    value = os.environ.get(SELECT, "").strip()
    if value == "all":
        return set(known)
    return {name.strip() for name in value.split(",") if name.strip()} if value else set(DEFAULT_TASKS)


def task_params() -> list[Any]:
    known = _known_tasks()
    chosen = _selected(known)
    skip = f"not among the tasks run by default: {SELECT}=all runs all six ({SELECT}=name,name picks some)"
    return [pytest.param(name, id=name, marks=() if name in chosen else pytest.mark.skip(reason=skip))
            for name in known]


def secret_forms(password: str, user: str = USER) -> list[bytes]:
    """The password as it could leak: raw, URL-quoted (in an index URL), or inside a Basic header."""
    basic = base64.b64encode(f"{user}:{password}".encode())
    return sorted({password.encode(), quote(password, safe="").encode(), basic})


def files_holding(root: Path, needles: list[bytes]) -> list[str]:
    """Every file under `root` (links not followed: a venv's python links outside) holding a needle."""
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder) / name
            if path.is_symlink():
                data = os.readlink(path).encode()
            else:
                try:
                    data = path.read_bytes()
                except OSError:
                    continue  # a socket or a file that went away: nothing persisted there
            if any(needle in data for needle in needles):
                found.append(str(path.relative_to(root)))
    return found


def start_task(task: Task, dirs: RunDirs) -> tuple[Path, Path]:
    """The base tree as a one-commit checkout, and the issue file beside it."""
    repo = task.unpack(dirs.work / "repo")
    issue = dirs.work / "issue.md"
    issue.write_text(task.issue_text)
    return repo, issue


def failed_lines(log: str, test_id: str) -> list[str]:
    """pytest's summary lines that report `test_id` as failing (-q prints FAILED/ERROR lines).

    Colours are stripped first: pytest colours its output inside the sandbox, and bolds the test
    name, so a colour code sits between `FAILED` and the id.
    """
    plain = ANSI.sub("", log)
    return [line for line in plain.splitlines() if line.startswith(("FAILED ", "ERROR ")) and test_id in line]


@pytest.mark.realrepos
@pytest.mark.bwrap
@pytest.mark.timeout(FIX_TIMEOUT + 300)
@pytest.mark.parametrize("name", task_params())
def test_fix_builds_the_declared_environment_from_the_mirror(
    name: str, realrepos_tasks: dict[str, Task], mirror: PackageMirror, run_dirs: RunDirs
) -> None:
    task = realrepos_tasks[name]
    repo, issue = start_task(task, run_dirs)
    seen = len(mirror.requests())
    with ScriptedOpenAIServer(fixing_script(task)) as model:
        proc, out = run_fix(repo, issue, data_dir=run_dirs.data, workspace_dir=run_dirs.workspaces,
                            model_url=model.base_url, index_url=mirror.url_with_credentials)
        model_bodies = b"".join(model.requests)
    served = mirror.requests()[seen:]
    assert out is not None, f"fix printed no JSON (exit {proc.returncode}):\n{proc.stderr[-4000:]}"

    # The environment was built, and from the mirror: package files were served to this run.
    environment = out.get("environment") or {}
    assert out["status"] != "environment_error", json.dumps(environment, indent=1)[-4000:]
    assert environment.get("ok") is True, environment
    downloaded = [r.path.rsplit("/", 1)[-1] for r in served if r.path.startswith("/packages/") and r.status == 200]
    assert any(f.startswith("pytest-") for f in downloaded), f"pytest did not come from the mirror: {served}"

    # The base tests ran (pytest collected and ran them: 0, or 1 with failures) before the model was asked.
    assert out["tests"]["before"]["exit_code"] in (0, 1), out["tests"]["before"]["log"][-3000:]
    assert out["usage"]["calls"] >= 1

    # The patch is the upstream fix and nothing the environment or the test runs left in the tree.
    patched = {diff.path for diff in file_diffs(out["patch"])}
    fix_files = set(task.data["source_files"]) | set(task.test_files)
    assert set(task.data["source_files"]) <= patched <= fix_files, sorted(patched)

    # The fixed test passes after: no FAILED/ERROR line names it, or the whole run passed.
    # (Loose on purpose: per-test results come with `evidence`; when present it must agree.)
    after = out["tests"]["after"][0] if out["tests"]["after"] else None
    assert after is not None and after["exit_code"] in (0, 1), out["tests"]
    for test_id in task.fail_to_pass:
        assert after["exit_code"] == 0 or not failed_lines(after["log"], test_id), after["log"][-3000:]
    # The evidence proves it: the upstream regression tests fail on the base source with only the fix's test
    # changes and pass with the fix (reproduced); the fixture's pre-existing failures do not block it.
    evidence = out["evidence"]
    runs = {k: [(r or {}).get("exit_code"), (r or {}).get("counts"), (r or {}).get("log", "")[-1500:]]
            for k, r in (("before", out["tests"]["before"]), ("reproduction", out["tests"].get("reproduction")),
                         *((f"after {i}", r) for i, r in enumerate(out["tests"]["after"])))}
    shown = json.dumps({"evidence": evidence, "runs": runs}, indent=1)[-9000:]
    assert evidence["level"] == "reproduced" and out["status"] == "fixed", shown
    assert set(task.fail_to_pass) <= set(evidence["fail_to_pass"]), evidence
    assert set(task.fail_to_pass) <= set(evidence["reproduction"]["tests"]), evidence
    flaky = set(task.data.get("flaky") or [])
    assert set(task.data.get("preexisting_failures") or []) - flaky <= set(evidence["still_failing"]), evidence

    # The mirror's password is nowhere: not in FrogFix's output, its files, the trajectory, or what the model saw.
    needles = secret_forms(MIRROR_CANARY)
    printed = (proc.stdout + proc.stderr).encode()
    assert not [n for n in needles if n in printed], "the mirror password reached fix's output"
    assert files_holding(run_dirs.data, needles) == []
    assert files_holding(run_dirs.workspaces, needles) == []
    trajectory = Path(out["trajectory"]).read_bytes()
    assert not [n for n in needles if n in trajectory + model_bodies], "the mirror password reached the agent"


@pytest.mark.realrepos
@pytest.mark.bwrap
@pytest.mark.timeout(2 * FIX_TIMEOUT + 300)
def test_a_second_run_reuses_the_environment(
    realrepos_tasks: dict[str, Task], mirror: PackageMirror, run_dirs: RunDirs
) -> None:
    """Same repository, same data dir: the environment comes from the cache, faster, without the mirror."""
    task = realrepos_tasks[CACHE_TASK]
    repo, issue = start_task(task, run_dirs)
    runs = []
    for _ in range(2):
        seen = len(mirror.requests())
        with ScriptedOpenAIServer(no_patch_script()) as model:
            proc, out = run_fix(repo, issue, data_dir=run_dirs.data, workspace_dir=run_dirs.workspaces,
                                model_url=model.base_url, index_url=mirror.url_with_credentials)
        assert out is not None, f"fix printed no JSON (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        assert out["status"] != "environment_error", out.get("environment")
        runs.append((out["environment"], [r for r in mirror.requests()[seen:] if r.path.startswith("/packages/")]))
    (cold, cold_files), (warm, warm_files) = runs
    assert cold["ok"] is True and cold["cached"] is False and cold_files, cold
    assert warm["ok"] is True and warm["cached"] is True, warm
    assert warm["seconds"] < cold["seconds"], (cold, warm)
    assert warm_files == [], f"a cached environment still downloaded from the mirror: {warm_files}"
