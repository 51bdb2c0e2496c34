"""The worker side of tests/test_js_runners.py's non-root case: a repository whose package.json runs
`node --test`, detected and run through run_tests in the local sandbox, as an unprivileged worker.

Runnable as `python js_worker_side.py FOLDER`; prints one JSON object (tests/nonroot.py reads it).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from app.settings import get_settings
from worker.attempts.repo_config import load_repo_config
from worker.attempts.verifier import run_tests

NODE_TESTS = """const { describe, it } = require('node:test');
describe('outer', () => {
  it('passes', () => {});
  it('fails', () => { throw new Error('no'); });
});
"""


def main(folder: Path) -> dict[str, object]:
    workspace = folder / "ws"
    (workspace / "test").mkdir(parents=True)
    (workspace / "package.json").write_text(json.dumps({"scripts": {"test": "tsc && node --test test/"}}))
    (workspace / "test" / "a.test.js").write_text(NODE_TESTS)
    config = load_repo_config(workspace)
    run = run_tests(workspace, config, get_settings(), lambda text: text)
    return {"uid": os.getuid(), "command": config.test_command, "exit_code": run.exit_code, "tests": run.tests,
            "tampered": run.tampered, "log": run.log[-2000:]}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
