"""How much time, CPU and memory the Leaf loop itself costs, apart from the model and the tools.

The model is the scripted OpenAI server (tests/doubles/openai_server.py) in a process of its
own on loopback, answering every request at once with one Bash tool call; the sandbox is the
in-process double, answering instantly. So a step's wall time is the harness's own work plus
the HTTP round trip of the request. That round trip is measured in the same run as a baseline:
the same request bytes posted by a bare stdlib client to the same server (`POST /baseline`),
and subtracted. Reported:

- the loop's own overhead per step at histories of about 30 KB, 300 KB and 700 KB
  (targets: <= 2, 5 and 12 ms);
- CPU seconds and peak memory of the harness process for a 150-step run;
- the share of model requests that extend the previous one's messages byte for byte (100%).

Run: `python bench/harness_loop.py` (about half a minute).
"""

from __future__ import annotations

import http.client
import json
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.doubles.sandbox_double import SandboxDouble  # noqa: E402
from worker.leaf.loop import LeafLimits, StepRecord, run_leaf  # noqa: E402
from worker.leaf.model import OpenAIChatModel  # noqa: E402
from worker.leaf.prompts import system_prompt  # noqa: E402
from worker.leaf.tools import TOOL_SCHEMAS  # noqa: E402

TARGETS = {30_000: 2.0, 300_000: 5.0, 700_000: 12.0}  # history bytes -> ms budget per step
STEPS_PER_TARGET = 40
LONG_RUN_STEPS = 150
BASELINE_REPEATS = 30


class ModelServer:
    """The scripted server in a child process, so its CPU and memory are not the harness's."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.doubles.openai_server"],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().split()
        if len(line) != 2 or line[0] != "PORT":
            raise RuntimeError(f"scripted server did not start: {line}")
        self.base_url = f"http://127.0.0.1:{line[1]}/v1"
        parts = urlsplit(self.base_url)
        self.connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port)

    def stats(self) -> dict[str, Any]:
        self.connection.request("GET", "/v1/stats")
        data: dict[str, Any] = json.loads(self.connection.getresponse().read())
        return data

    def baseline_ms(self, body: bytes) -> float:
        """Median round trip of these exact bytes through a bare keep-alive client."""
        times = []
        for _ in range(BASELINE_REPEATS):
            started = time.perf_counter()
            self.connection.request("POST", "/v1/baseline", body, {"Content-Type": "application/json"})
            self.connection.getresponse().read()
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1000

    def close(self) -> None:
        self.connection.close()
        if self.process.stdin:
            self.process.stdin.close()
        self.process.wait(timeout=10)


class StepClock:
    """Wall time from the start of one step to the end of the next `on_step`."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.walls: list[float] = []
        self.sizes: list[int] = []

    def on_step(self, record: StepRecord, model: OpenAIChatModel) -> None:
        now = time.perf_counter()
        self.walls.append(now - self.last)
        self.sizes.append(model.last_request_bytes)
        self.last = now


def run(server: ModelServer, task: str, output_chars: int, steps: int) -> tuple[StepClock, OpenAIChatModel, Any]:
    sandbox = SandboxDouble(bash={"cat output.txt": (0, "y" * output_chars, "")})
    model = OpenAIChatModel(server.base_url, "FrogNano-4B-2609", timeout=30, max_retries=0)
    clock = StepClock()
    result = run_leaf(
        model, sandbox, task, system_prompt=system_prompt(),
        limits=LeafLimits(max_steps=steps), on_step=lambda r: clock.on_step(r, model),
    )
    assert result.exit_reason == "max_turns", (result.exit_reason, result.error)
    return clock, model, result


def overhead_at(server: ModelServer, target: int) -> dict[str, float]:
    """Steps whose history is about `target` bytes: a large task, then small tool outputs."""
    # About 3 KB of schemas and fields, and ~0.9 KB per step: centre the measured steps on target.
    task = "x" * max(1_000, target - 3_000 - 900 * STEPS_PER_TARGET // 2)
    clock, model, result = run(server, task, output_chars=200, steps=STEPS_PER_TARGET)
    # Warm-up: the first steps open the connection and fill caches.
    walls = [w * 1000 for w in clock.walls[5:]]
    sizes = clock.sizes[5:]
    index = 5 + len(walls) // 2
    messages = result.messages[: 2 + 2 * index]
    body = model.encode_request(messages, TOOL_SCHEMAS, LeafLimits().max_completion_tokens)
    baseline = server.baseline_ms(body)
    model.close()
    return {
        "body_kb": statistics.median(sizes) / 1000,
        "step_ms": statistics.median(walls),
        "step_p90_ms": sorted(walls)[int(len(walls) * 0.9)],
        "baseline_ms": baseline,
        "overhead_ms": statistics.median(walls) - baseline,
    }


def long_run(server: ModelServer) -> dict[str, float]:
    """150 steps with ~4.7 KB outputs: the history grows past 700 KB, as a long real run does."""
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu = time.process_time()
    wall = time.perf_counter()
    clock, model, result = run(server, "Fix the failing test in tests/test_calc.py.", 4_600, LONG_RUN_STEPS)
    cpu = time.process_time() - cpu
    wall = time.perf_counter() - wall
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    history_kb = model.last_request_bytes / 1000
    model.close()
    del result
    tracemalloc.start()
    _, traced_model, traced = run(server, "Fix the failing test in tests/test_calc.py.", 4_600, LONG_RUN_STEPS)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    traced_model.close()
    del traced
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "final_body_kb": history_kb,
        "rss_peak_mb": rss_after / 1024,
        "rss_growth_mb": (rss_after - rss_before) / 1024,
        "traced_peak_mb": peak / 1e6,
        "step_ms_median": statistics.median(clock.walls) * 1000,
    }


def main() -> int:
    server = ModelServer()
    failures = []
    try:
        print("Leaf loop overhead per step (scripted model over loopback HTTP, instant sandbox double)")
        print(f"{'history':>9} {'body':>9} {'step':>8} {'p90':>8} {'baseline':>9} {'overhead':>9} {'target':>7}")
        for target, budget in TARGETS.items():
            row = overhead_at(server, target)
            ok = row["overhead_ms"] <= budget
            failures += [] if ok else [f"overhead at {target // 1000} KB"]
            print(
                f"{target // 1000:>6} KB {row['body_kb']:>6.0f} KB {row['step_ms']:>5.2f} ms"
                f" {row['step_p90_ms']:>5.2f} ms {row['baseline_ms']:>6.2f} ms {row['overhead_ms']:>6.2f} ms"
                f" {budget:>4.0f} ms {'ok' if ok else 'OVER'}"
            )
        stats = server.stats()
        server_ms = statistics.median(stats["server_seconds"]) * 1000
        print(f"(baseline = bare keep-alive POST of the same bytes to the same server; "
              f"server's own handling, median: {server_ms:.2f} ms)")
        long = long_run(server)
        print(f"\n{LONG_RUN_STEPS}-step run, history growing to {long['final_body_kb']:.0f} KB of request body:")
        print(f"  wall {long['wall_s']:.2f} s, harness CPU {long['cpu_s']:.2f} s "
              f"({long['cpu_s'] / LONG_RUN_STEPS * 1000:.2f} ms/step), median step {long['step_ms_median']:.2f} ms")
        print(f"  peak RSS {long['rss_peak_mb']:.0f} MB (grew {long['rss_growth_mb']:.0f} MB during the run; "
              f"interpreter and openai import included), traced Python peak {long['traced_peak_mb']:.1f} MB")
        stats = server.stats()
        share = stats["prefix_ok"] / stats["prefix_pairs"] if stats["prefix_pairs"] else 1.0
        runs = len(TARGETS) + 2
        # The first request of each run starts a new history: it cannot extend the last run's.
        within = stats["prefix_ok"] / max(1, stats["prefix_pairs"] - (runs - 1))
        print(f"\nbyte-prefix extensions: {stats['prefix_ok']} of {stats['prefix_pairs'] - (runs - 1)} requests "
              f"within runs ({within:.0%}); {stats['requests']} requests in {runs} runs, raw share {share:.1%}")
        if within < 1.0:
            failures.append("prefix share")
    finally:
        server.close()
    if failures:
        print("FAILED: " + ", ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
