"""What one tool call costs: through the persistent runner vs. a fresh sandbox per call.

Leaf starts a fresh Python process for every tool call (inside a pod, through several exec
round trips). FrogFix keeps one runner alive per sandbox and sends each call down its stdin.
This prints the median wall time of a Read and of an `echo` Bash both ways, and the ratio.
The fresh-per-call column is a lower bound for Leaf's way: it pays bubblewrap and Python
start-up (and our teardown) but none of Leaf's Kubernetes API latency.

    python bench/harness_sandbox.py [--calls 50]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sandbox.base import SandboxSpec
from sandbox.local import LocalSandbox

CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "Read (200-line file)": ("Read", {"file_path": "src/module.py"}),
    "Bash `echo hi`": ("Bash", {"command": "echo hi"}),
}


def median_ms(action: Callable[[], object], repeats: int) -> float:
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=50, help="calls per measurement (default 50)")
    options = parser.parse_args()

    base = tempfile.mkdtemp(prefix="frogfix-bench-")
    os.chmod(base, 0o711)  # when run as root the sandbox's host uid must reach the workspace
    workspace = os.path.join(base, "repo")
    os.makedirs(os.path.join(workspace, "src"))
    with open(os.path.join(workspace, "src", "module.py"), "w") as handle:
        handle.writelines(f"value_{i} = {i}  # a line of code\n" for i in range(200))
    spec = SandboxSpec(workspace=workspace)
    try:
        rows = []
        with LocalSandbox(spec) as sandbox:
            for name, arguments in CALLS.values():
                sandbox.call_tool(name, arguments)  # warm up
            persistent = {
                label: median_ms(functools.partial(sandbox.call_tool, name, arguments), options.calls)
                for label, (name, arguments) in CALLS.items()
            }

        def fresh(name: str, arguments: dict[str, Any]) -> None:
            with LocalSandbox(spec) as one_shot:
                one_shot.call_tool(name, arguments)

        for label, (name, arguments) in CALLS.items():
            per_call = median_ms(functools.partial(fresh, name, arguments), options.calls)
            rows.append((label, persistent[label], per_call))
        start_only = median_ms(lambda: LocalSandbox(spec).close(), max(5, options.calls // 5))
    finally:
        shutil.rmtree(base, ignore_errors=True)

    print(f"median of {options.calls} calls each, {os.cpu_count()} CPUs, uid {os.geteuid()}")
    print(f"{'tool call':<24}{'persistent runner':>20}{'fresh sandbox/call':>22}{'ratio':>10}")
    for label, kept, per_call in rows:
        print(f"{label:<24}{kept:>17.2f} ms{per_call:>19.2f} ms{per_call / kept:>9.0f}x")
    print(f"{'(sandbox start+close)':<24}{'':>20}{start_only:>19.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
