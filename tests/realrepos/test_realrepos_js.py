"""`manage.py fix` on three real JavaScript/TypeScript upstream bugs (../shared/fixtures/realrepos-js):
npm + jest, Yarn classic + vitest, pnpm + vitest with TypeScript type checks.

The company's mirror is a real Verdaccio with a password (tests/npm_registry.py); the model double
applies the upstream fix through the agent's Write tool, and there is no `.frogfix.yml`: FrogFix must
find the package manager and the runner itself, install the lockfile's versions from the mirror, and
prove the fix by the runner's own per-test results. One task runs by default (the quickest);
FROGFIX_REALREPOS=all (or a comma-separated list of task names) runs more, as for the Python corpus.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from app.patches import file_diffs
from tests.doubles.openai_server import ScriptedOpenAIServer
from tests.realrepos import FIX_TIMEOUT, run_fix
from tests.realrepos.conftest import RunDirs
from tests.realrepos.fix_double import fixing_script
from tests.realrepos.js_tasks import JS_FIXTURES, JsTask, installed_packages, load_js_tasks, lockfile_pins
from tests.realrepos.test_realrepos import SELECT, files_holding, secret_forms

DEFAULT_TASKS = ("d3-format-prefix-parens",)  # the quickest suite (about 6 s)
NO_FIXTURES = f"realrepos-js fixtures not found at {JS_FIXTURES} (they live in the shared folder beside the checkout)"


def task_params() -> list[Any]:
    try:
        known = [entry["task"] for entry in json.loads((JS_FIXTURES / "MANIFEST.json").read_text())["tasks"]]
    except OSError:
        known = list(DEFAULT_TASKS)
    value = os.environ.get(SELECT, "").strip()
    chosen = set(known) if value == "all" else {n.strip() for n in value.split(",") if n.strip()} or set(DEFAULT_TASKS)
    skip = f"not among the tasks run by default: {SELECT}=all runs all of them ({SELECT}=name,name picks some)"
    return [pytest.param(name, id=name, marks=() if name in chosen else pytest.mark.skip(reason=skip))
            for name in known]


@pytest.fixture(scope="session")
def js_tasks() -> dict[str, JsTask]:
    if not (JS_FIXTURES / "MANIFEST.json").is_file():
        pytest.skip(NO_FIXTURES)
    return {task.name: task for task in load_js_tasks()}


def environment_checkout(workspaces: Path) -> Path:
    """The cached environment's checkout folders (the run's only environment)."""
    found = sorted((workspaces / ".environments").glob("*/env/checkout"))
    assert len(found) == 1, found
    return found[0]


@pytest.mark.realrepos
@pytest.mark.bwrap
@pytest.mark.timeout(FIX_TIMEOUT + 300)
@pytest.mark.parametrize("name", task_params())
def test_fix_installs_the_lockfile_from_the_npm_mirror_and_reproduces(
    name: str, js_tasks: dict[str, JsTask], npm_registry: Any, run_dirs: RunDirs
) -> None:
    task = js_tasks[name]
    repo = task.unpack(run_dirs.work / "repo")
    issue = run_dirs.work / "issue.md"
    issue.write_text(task.issue_text)
    seen = len(npm_registry.requests())
    with ScriptedOpenAIServer(fixing_script(task)) as model:
        proc, out = run_fix(repo, issue, data_dir=run_dirs.data, workspace_dir=run_dirs.workspaces,
                            model_url=model.base_url, npm_registry_url=npm_registry.url)
        model_bodies = b"".join(model.requests)
    assert out is not None, f"fix printed no JSON (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
    environment = out.get("environment") or {}
    assert out["status"] != "environment_error", json.dumps(environment, indent=1)[-4000:]
    assert environment.get("ok") is True and environment.get("built") is True, environment

    # What the install fetched came from the mirror, and is what the lockfile pins; so is what is installed.
    pins = lockfile_pins(repo, task.lockfile)
    served = set(npm_registry.served_tarballs(since=seen))
    manager = {("pnpm", "10.28.0"), ("yarn", "1.22.22")}
    assert served and served - manager <= pins, sorted(served - manager - pins)[:20]
    installed = installed_packages(environment_checkout(run_dirs.workspaces))
    assert installed and installed <= pins, sorted(installed - pins)[:20]
    assert installed <= served, f"installed yet never fetched from the mirror: {sorted(installed - served)[:20]}"

    # The patch is the upstream fix, nothing the install or the runs left behind (node_modules above all).
    patched = {diff.path for diff in file_diffs(out["patch"])}
    assert set(task.source_files) <= patched <= set(task.source_files) | set(task.test_files), sorted(patched)

    # The runner's own per-test results prove it: reproduced, the fixture's fail_to_pass named.
    evidence = out["evidence"]
    shown = json.dumps({"evidence": evidence, "tests": out["tests"]}, indent=1)[-9000:]
    assert out["status"] == "fixed" and evidence["level"] == "reproduced", shown
    assert set(task.fail_to_pass) <= set(evidence["fail_to_pass"]), evidence
    assert set(task.fail_to_pass) <= set(evidence["reproduction"]["tests"]), evidence
    if not task.data["preexisting_failures"]:  # the whole suite passes with the fix, as upstream's CI did
        after = out["tests"]["after"]
        tails = [(run["exit_code"], run["log"][-1500:]) for run in after]
        assert after and all(run["exit_code"] == 0 for run in after), tails

    # The mirror's password is nowhere FrogFix writes, nor in what the model saw.
    needles = secret_forms(npm_registry.password, npm_registry.user)
    assert not [n for n in needles if n in (proc.stdout + proc.stderr).encode()]
    assert files_holding(run_dirs.data, needles) == []
    assert files_holding(run_dirs.workspaces, needles) == []
    trajectory = Path(out["trajectory"]).read_bytes()
    assert not [n for n in needles if n in trajectory + model_bodies], "the mirror password reached the agent"
