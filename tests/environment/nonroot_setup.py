"""Run as an unprivileged worker by test_setup_phase.py: build an environment from the mirror, use it.

Usage: python nonroot_setup.py BASE_FOLDER MIRROR_URL_WITH_CREDENTIALS
Prints one JSON line: the worker's uid, the report, and what a job sandbox saw.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import closing
from pathlib import Path

from app.settings import Settings
from tests.environment.test_setup_phase import repo
from worker.environment.builder import Environments
from worker.wiring import open_job_sandbox, setup_opener


def main() -> None:
    base, url = Path(sys.argv[1]), sys.argv[2]
    settings = Settings(data_dir=base / "data", workspace_dir=base / "workspaces", pip_index_url=url)
    checkout = repo(settings.resolved_workspace_dir() / "checkout", "frogdep==1.0\n")
    environments = Environments(
        settings, lambda text: text,
        setup_opener(settings), scope="test:nonroot",
    )
    report = environments.for_checkout(checkout, "python3 -m unittest", None, None)
    used = ""
    if report.ok and report.path is not None:
        with closing(open_job_sandbox(checkout, settings, environment=report.path)) as box:
            used = box.run_command("python3 -c 'import frogdep, sys; print(frogdep.VALUE, sys.prefix)'", timeout=60).log
    print(json.dumps({"uid": os.geteuid(), "report": report.to_dict(), "used": used}))


if __name__ == "__main__":
    main()
