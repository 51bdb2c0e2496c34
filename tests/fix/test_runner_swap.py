"""A patch cannot swap the test runner: a root `pytest.py` that prints "3 passed" is not what runs.

Found with the worker as a non-root user (as the shipped image runs): `python3 -m pytest` put the
working tree first on sys.path, so the patch's `pytest.py` ran instead of pytest, and the job ended
`fixed`. The verification runs now start Python with the tree off the path until the runner is
imported (worker/attempts/evidence.py, RUNNER_GUARD), and the change is flagged as a runner file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.doubles.openai_server import ScriptedOpenAIServer, assistant, text_call
from tests.fix.sample_repo import ISSUE, make_sample_repo
from tests.nonroot import NonRoot

ROOT = Path(__file__).resolve().parents[2]
FAKE_PYTEST = 'print("3 passed in 0.01s")\nraise SystemExit(0)\n'
WRAPPER = """import json, os, runpy, sys
os.environ.update(json.loads(sys.argv[1]))
manage = sys.argv[2]
sys.argv = [manage, *sys.argv[3:]]
runpy.run_path(manage, run_name="__main__")
"""


def chown_tree(path: Path, uid: int, gid: int) -> None:
    if os.geteuid() != 0:
        return
    for folder, dirs, files in os.walk(path):
        os.chown(folder, uid, gid)
        for name in dirs + files:
            os.chown(os.path.join(folder, name), uid, gid, follow_symlinks=False)


def fix_as(nonroot: NonRoot, base: Path, repo: Path, issue: str, turns: list[str]) -> dict[str, Any]:
    """`manage.py fix --json` on `repo` as the unprivileged user, the model playing `turns` then finishing."""
    (base / "issue.md").write_text(issue)
    (base / "run_manage.py").write_text(WRAPPER)
    chown_tree(base, nonroot.uid, nonroot.gid)
    with ScriptedOpenAIServer([*(assistant(t) for t in turns), assistant("Fixed: the tests pass now.")]) as model:
        env = {
            "FROGFIX_DATA_DIR": str(base / "data"),
            "FROGFIX_WORKSPACE_DIR": str(base / "workspaces"),
            "FROGFIX_MODEL_BASE_URL": model.base_url,
            "FROGFIX_MODEL_NAME": "scripted",
        }
        done = nonroot.run_python(base / "run_manage.py", json.dumps(env), str(ROOT / "manage.py"), "fix",
                                  str(repo), "--issue", str(base / "issue.md"), "--json", timeout=600)
    assert done.stdout, done.stderr[-3000:]
    out: dict[str, Any] = json.loads(done.stdout)
    out["_exit_code"] = done.returncode
    return out


@pytest.mark.bwrap
def test_a_patched_in_pytest_py_does_not_run_in_place_of_pytest(nonroot: NonRoot) -> None:
    base = nonroot.folder("runner-swap-")
    repo = make_sample_repo(base)  # `add` subtracts; tests/test_calc.py::test_add fails on the base
    out = fix_as(nonroot, base, repo, ISSUE, [text_call("Write", file_path="pytest.py", content=FAKE_PYTEST)])
    after = out["tests"]["after"][0]
    assert "3 passed in 0.01s" not in after["log"] and after["exit_code"] == 1, after["log"][-2000:]
    assert out["status"] != "fixed" and out["evidence"]["level"] != "failed_before", out["evidence"]
    assert "tests/test_calc.py::test_add" in out["evidence"]["still_failing"]
