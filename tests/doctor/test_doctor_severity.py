"""`doctor --json`'s `severity` means something only for a check that failed or warned (issue 26).

A passed or skipped check has no severity (`null`); a failure is an `error` or a `warning`, a
`warn` line a `warning`. The key stays in every object (README: `name`, `outcome`, `detail`, `fix`
and `severity`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.doctor.conftest import free_port
from worker.commands.doctor.checks import run_doctor
from worker.commands.doctor.results import failed, passed, skipped, warned

ROOT = Path(__file__).resolve().parents[2]


def test_only_failed_and_warned_checks_carry_a_severity() -> None:
    assert passed("database", "ok").to_dict()["severity"] is None
    assert skipped("gitea", "not configured").to_dict()["severity"] is None
    assert failed("model.listed", "down", "start it").severity == "error"
    assert failed("sandbox.cgroups", "no", "delegate", severity="warning").severity == "warning"
    assert warned("metrics.token", "open", "set it").severity == "warning"


def test_the_runner_keeps_no_severity_for_passed_and_skipped_lines(frogfix_env: dict[str, Any]) -> None:
    from app.settings import get_settings
    from worker.commands.doctor.checks import Group
    from worker.commands.doctor.results import DoctorOptions

    groups = [
        Group("a", 5, lambda s, o: [passed("a", "fine"), skipped("a.more", "not configured")], "-"),
        Group("b", 5, lambda s, o: [failed("b", "broken", "mend it")], "-"),
    ]
    results = run_doctor(get_settings(), DoctorOptions(), groups)
    assert [(r.outcome, r.severity) for r in results] == [("pass", None), ("skip", None), ("fail", "error")]


def test_doctor_json_gives_passed_and_skipped_checks_no_severity(frogfix_env: dict[str, Any]) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env = {**clean, "FROGFIX_DATA_DIR": str(frogfix_env["data_dir"]),
           "FROGFIX_MODEL_BASE_URL": f"http://127.0.0.1:{free_port()}/v1"}  # nothing listens: the model fails
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "doctor", "--json", "--min-free-gib", "0"],
        env=env, capture_output=True, text=True, timeout=240, cwd=ROOT,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    data = json.loads(proc.stdout)
    assert all("severity" in item for item in data)
    by_outcome: dict[str, set[Any]] = {}
    for item in data:
        by_outcome.setdefault(item["outcome"], set()).add(item["severity"])
    assert by_outcome["pass"] == {None} and by_outcome["skip"] == {None}, data
    assert by_outcome["fail"] <= {"error", "warning"} and "error" in by_outcome["fail"]
    assert by_outcome.get("warn", {"warning"}) == {"warning"}
    assert proc.returncode == 1
