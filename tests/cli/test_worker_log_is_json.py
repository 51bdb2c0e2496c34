"""`manage.py worker` (and so serve's embedded worker) logs JSON lines only (issue 40): Celery's banner and its
superuser warning, printed raw, no longer land in the JSON log; their facts are structured lines instead."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
READY_S = 120.0  # Celery's start on a loaded two-CPU machine


def test_the_worker_starts_with_json_lines_and_no_banner(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env.update(FROGFIX_DATA_DIR=str(tmp_path / "data"))
    proc = subprocess.Popen([sys.executable, str(ROOT / "manage.py"), "worker", "--pool", "solo"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line.rstrip("\n"))
            if "ready." in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(READY_S), lines
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        reader.join(10)
    records = [json.loads(line) for line in lines if line.strip()]  # each line is JSON: fails on any other
    events = [r["event"] for r in records]
    assert "worker_starting" in events and any(e.endswith("ready.") for e in events)
    if os.geteuid() == 0:
        assert "worker_runs_as_root" in events
    assert "SecurityWarning" not in "\n".join(lines)
    assert "[tasks]" not in out and "[config]" not in out and "-------------- frogfix@" not in out
