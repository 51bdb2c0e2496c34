"""`manage.py operators`: list, `set-password NAME` (from stdin), `remove NAME`, never the last operator (issue 40).

Real processes on the test's database; the dashboard's sign-in is the judge of what a change did.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from app.auth import verify_operator
from app.db import session_scope
from tests.dashboard.conftest import sign_in

MANAGE = Path(__file__).resolve().parents[2] / "manage.py"


def manage(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(MANAGE), *args], input=stdin, env=dict(os.environ),
                          capture_output=True, text=True, timeout=60)


def names() -> list[str]:
    done = manage("operators", "--json")
    assert done.returncode == 0, done.stderr
    return [row["username"] for row in json.loads(done.stdout)]


def test_operators_are_listed_reset_and_removed_but_never_the_last(frogfix_env: dict[str, Any], client: Any) -> None:
    assert manage("operators").stdout.startswith("no operators yet")
    for name, password in (("alice", "correct horse battery"), ("bob", "another horse battery")):
        assert manage("create-admin", name, "--password-stdin", stdin=password + "\n").returncode == 0
    listed = manage("operators")
    assert listed.returncode == 0, listed.stderr
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["OPERATOR", "alice", "bob"]
    assert names() == ["alice", "bob"]

    # A reset: the new password signs in, the old one does not, and a session signed for the old one ends.
    assert sign_in(client, "alice", "correct horse battery").url.path == "/"
    reset = manage("operators", "set-password", "alice", stdin="a brand new passphrase\n")
    assert reset.returncode == 0, reset.stderr
    assert "a brand new passphrase" not in reset.stdout + reset.stderr
    assert client.get("/", follow_redirects=False).status_code in (302, 303)  # signed out
    with session_scope() as s:
        assert verify_operator(s, "alice", "a brand new passphrase") is not None
        assert verify_operator(s, "alice", "correct horse battery") is None

    weak = manage("operators", "set-password", "alice", stdin="short\n")
    assert weak.returncode == 2 and weak.stderr.strip() == (
        "frogfix operators set-password: the password is too short: use at least 12 characters")
    unknown = manage("operators", "set-password", "zed", stdin="a long enough passphrase\n")
    assert unknown.returncode == 2 and "no operator named 'zed'" in unknown.stderr

    removed = manage("operators", "remove", "bob")
    assert removed.returncode == 0 and removed.stdout.strip() == "operator bob removed", removed.stderr
    assert names() == ["alice"]
    last = manage("operators", "remove", "alice")
    assert last.returncode == 1 and last.stderr.startswith("frogfix operators remove: alice is the last operator")
    assert names() == ["alice"]
    assert manage("operators", "remove", "zed").returncode == 2
