"""Real FrogFix worker processes for tests, and what a test checks is left of them afterwards."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class Workers:
    """`manage.py worker` processes in their own process groups, so SIGKILL takes the pool children too."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"worker-{len(self.procs)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "worker"],
            env=dict(os.environ),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def logs(self) -> str:
        return "".join(p.read_text("utf-8", "replace") for p in sorted(self.log_dir.glob("worker-*.log")))

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)


def sandboxes_running(workspace_dir: str | Path) -> list[str]:
    """bwrap processes over `workspace_dir` (other sandboxes on the machine are not ours)."""
    out = subprocess.run(["pgrep", "-af", "bwrap"], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if str(workspace_dir) in line]


def workspaces_left(workspace_dir: str | Path) -> list[str]:
    """Job folders left in the workspace dir (the warm pool's `.pool` is kept on purpose)."""
    return sorted(p.name for p in Path(workspace_dir).iterdir() if p.name != ".pool")
