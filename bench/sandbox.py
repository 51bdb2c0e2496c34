"""What one tool call costs in a Kubernetes sandbox: FrogFix's long-lived runner stream vs Leaf's way.

FrogFix sends each call down one exec stream that stays open (one message out, one reply in).
Leaf, per call, copies a request file into the pod (an exec with stdin), checks that it arrived
(another exec), then starts a fresh Python process that runs the tool and prints the result (a
third exec). Both ways run here in one pod, over the same transport, with the same runner code,
and this prints the median and p90 wall time per call and the API round trips per call for a
Read and for an `echo` Bash.

Transport: the Kubernetes API double (tests/doubles/kubernetes_api.py) that the real `kubernetes`
client talks to over HTTPS and WebSocket on 127.0.0.1 (TLS like every real API server; --no-tls
for plain HTTP). --rtt-ms adds that delay before every connection, HTTP request and stream
message the server receives: a stand-in for the distance to a real API server and kubelet.
Round trips are counted by the server: TCP connects and TLS handshakes (one each per new
connection), HTTP requests (an exec's WebSocket upgrade is one) and client messages on open
exec streams (a stdin chunk or a v5 close-stdin signal).

    python bench/sandbox.py [--calls 30] [--rtt-ms 0] [--no-tls]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sandbox.base import SandboxLimits, SandboxSpec
from sandbox.kubernetes import KubernetesSandbox
from sandbox.kubernetes_manifests import RUNNER_PATH, WORKSPACE, KubernetesOptions
from tests.doubles.kubernetes_api import KubernetesApiDouble

CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "Read (200-line file)": ("Read", {"file_path": "src/module.py"}),
    "Bash `echo hi`": ("Bash", {"command": "echo hi"}),
}
REQUEST_FILE = "/tmp/leaf-request.json"
# Leaf's three steps, as argv (the API double maps paths under the pod's mounts into its folder).
COPY_IN = "import sys; open(sys.argv[1], 'wb').write(sys.stdin.buffer.read())"
RUN_ONCE = 'exec "$0" -I -S -B "$1" --root "$2" < "$3"'
PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), sys.executable)


class LeafWay:
    """A tool call the way Leaf makes it: three separate execs, a fresh runner process each time."""

    def __init__(self, sandbox: KubernetesSandbox, python: str) -> None:
        self.sandbox = sandbox
        self.python = python
        self.seq = 0

    def call(self, name: str, arguments: dict[str, Any]) -> str:
        self.seq += 1
        request = json.dumps({"id": self.seq, "op": "tool", "name": name, "arguments": arguments}).encode() + b"\n"
        code, _, err = self.sandbox.exec_once([self.python, "-I", "-S", "-c", COPY_IN, REQUEST_FILE], stdin=request)
        if code != 0:
            raise RuntimeError(f"copy failed: {err!r}")
        code, _, _ = self.sandbox.exec_once(["test", "-e", REQUEST_FILE])
        if code != 0:
            raise RuntimeError("the request file did not arrive")
        argv = ["/bin/sh", "-c", RUN_ONCE, self.python, RUNNER_PATH, WORKSPACE, REQUEST_FILE]
        code, out, err = self.sandbox.exec_once(argv)
        reply = json.loads(out.splitlines()[0]) if code == 0 and out else {}
        if reply.get("id") != self.seq or not reply.get("ok"):
            raise RuntimeError(f"the tool runner failed ({code}): {err[-500:]!r}")
        return str(reply["output"])


def round_trips(kube: KubernetesApiDouble, tls: bool) -> tuple[int, int, int]:
    counters = kube.counters
    return counters["connections"] * (2 if tls else 1), counters["requests"], counters["stream_messages"]


def measure(
    kube: KubernetesApiDouble, tls: bool, action: Callable[[], str], calls: int
) -> tuple[float, float, tuple[float, float, float], str]:
    action()  # warm up (and the answer both ways must agree)
    before = round_trips(kube, tls)
    timings = []
    answer = ""
    for _ in range(calls):
        started = time.perf_counter()
        answer = action()
        timings.append((time.perf_counter() - started) * 1000)
    after = round_trips(kube, tls)
    per_call = tuple((a - b) / calls for a, b in zip(after, before, strict=True))
    p90 = statistics.quantiles(timings, n=10)[-1] if len(timings) >= 2 else timings[0]
    return statistics.median(timings), p90, per_call, answer  # type: ignore[return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30, help="calls per measurement (default 30)")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="delay per round trip at the server (default 0)")
    parser.add_argument("--no-tls", action="store_true", help="plain HTTP instead of HTTPS")
    options = parser.parse_args()
    tls = not options.no_tls and shutil.which("openssl") is not None

    workspace = tempfile.mkdtemp(prefix="frogfix-bench-k8s-")
    os.makedirs(os.path.join(workspace, "src"))
    with open(os.path.join(workspace, "src", "module.py"), "w") as handle:
        handle.writelines(f"value_{i} = {i}  # a line of code\n" for i in range(200))
    spec = SandboxSpec(workspace=workspace, limits=SandboxLimits(wall_seconds=3600))
    try:
        with KubernetesApiDouble(latency_s=options.rtt_ms / 1000, tls=tls) as kube:
            cluster = KubernetesOptions(configuration=kube.configuration(), python=PYTHON, reclaim=False)
            with KubernetesSandbox(spec, kube=cluster) as sandbox:
                leaf = LeafWay(sandbox, PYTHON)
                rows = []
                for label, (name, arguments) in CALLS.items():
                    ours = measure(kube, tls, lambda n=name, a=arguments: sandbox.call_tool(n, a), options.calls)
                    theirs = measure(kube, tls, lambda n=name, a=arguments: leaf.call(n, a), options.calls)
                    if ours[3] != theirs[3]:
                        raise SystemExit(f"{label}: the two ways answered differently")
                    rows.append((label, ours, theirs))
        scheme = "HTTPS" if tls else "HTTP"
        print(
            f"transport: the Kubernetes API double over {scheme} + WebSocket on 127.0.0.1 (the real kubernetes "
            f"client), +{options.rtt_ms:g} ms per round trip, {options.calls} calls each"
        )
        print("round trips per call = connection setups (TCP + TLS) / HTTP requests / messages on open streams\n")
        header = f"{'call':<22} {'way':<34} {'median ms':>10} {'p90 ms':>8}  round trips per call"
        print(header)
        print("-" * len(header))
        for label, ours, theirs in rows:
            for way, (median, p90, trips, _) in (
                ("long-lived stream (FrogFix)", ours),
                ("copy + check + new process (Leaf)", theirs),
            ):
                detail = " / ".join(f"{t:g}" for t in trips)
                print(f"{label:<22} {way:<34} {median:>10.2f} {p90:>8.2f}  {sum(trips):>5g}  ({detail})")
        print()
        for label, ours, theirs in rows:
            fewer = sum(theirs[2]) / max(sum(ours[2]), 1e-9)
            print(f"{label}: {theirs[0] / ours[0]:.1f}x lower median cost per call, {fewer:.0f}x fewer round trips")
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
