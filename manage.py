#!/usr/bin/env python3
"""FrogFix's one command line: serve, worker, migrate, sweep, fix, demo, doctor, reap-sandboxes, and the
job commands: jobs, show, cancel, retry, replay; eval; attest and verify (worker/commands/cli)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from worker.commands.bootstrap import use_checkout_venv  # noqa: E402  (standard library only)

use_checkout_venv()

from worker.commands.cli import cli  # noqa: E402  (after the interpreter is settled)

if __name__ == "__main__":
    cli()
