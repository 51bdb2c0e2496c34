"""Run as an unprivileged worker by test_javascript_environment.py: install a lockfile from the npm mirror, use it.

Usage: python nonroot_javascript.py BASE_FOLDER REGISTRY_URL_WITH_CREDENTIALS
Prints one JSON line: the worker's uid, the report, and what a job sandbox saw.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import closing
from pathlib import Path

from app.settings import Settings
from tests.environment.test_javascript_environment import PACKAGE, SOURCES, js_repo
from worker.environment.builder import Environments
from worker.wiring import open_job_sandbox, setup_opener


def main() -> None:
    base, url = Path(sys.argv[1]), sys.argv[2]
    settings = Settings(data_dir=base / "data", workspace_dir=base / "workspaces", npm_registry_url=url)
    checkout = js_repo(settings.resolved_workspace_dir() / "checkout", PACKAGE, SOURCES)
    environments = Environments(settings, lambda text: text, setup_opener(settings), scope="test:nonroot-js")
    report = environments.for_checkout(checkout, "node --test", None, None)
    used = ""
    if report.ok and report.path is not None:
        with closing(open_job_sandbox(checkout, settings, environment=report.path)) as box:
            command = "node -e \"console.log(require('is-number')(7))\"; touch node_modules/planted || echo READ-ONLY"
            used = box.run_command(command, timeout=120).log
    print(json.dumps({"uid": os.geteuid(), "report": report.to_dict(), "used": used}))


if __name__ == "__main__":
    main()
