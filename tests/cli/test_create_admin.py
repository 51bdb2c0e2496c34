"""`manage.py create-admin`: an operator account the dashboard accepts; clear errors otherwise."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from app.auth import verify_operator
from app.db import session_scope

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def _create(username: str, password: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), "create-admin", username, "--password-stdin"],
        input=password + "\n",
        env=dict(os.environ),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_create_admin_then_sign_in(frogfix_env: dict[str, Any], client: Any) -> None:
    done = _create("alice", "correct horse battery")
    assert done.returncode == 0, done.stderr
    with session_scope() as s:
        assert verify_operator(s, "alice", "correct horse battery") is not None
        assert verify_operator(s, "alice", "wrong password here") is None
    page = client.get("/login")
    assert page.status_code == 200
    again = _create("alice", "another long password")
    assert again.returncode == 2 and "already exists" in again.stderr
    weak = _create("bob", "short")
    assert weak.returncode == 2 and "at least 12" in weak.stderr
