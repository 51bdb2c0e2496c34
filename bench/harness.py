#!/usr/bin/env python3
"""bench/harness: the Leaf harness's figures in one run (sandbox per-call cost, then loop overhead)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    for script in ("harness_sandbox.py", "harness_loop.py"):
        print(f"== bench/{script}", flush=True)
        done = subprocess.run([sys.executable, str(HERE / script), *sys.argv[1:]])
        if done.returncode != 0:
            sys.exit(done.returncode)
