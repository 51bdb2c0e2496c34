"""install.sh's apt_install (issue 40): a dpkg lock another package manager holds ends it with apt's message and one
line saying what to do, not apt's bare exit 100; the lock is waited for first (apt's DPkg::Lock::Timeout).

The function is run on its own with a stand-in `apt-get` first on PATH, which answers as apt does when the lock
is held: nothing is installed and no real package manager is touched.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELD = ("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (unattended-upgr)\n"
        "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?")


def apt_install(tmp_path: Path, apt_says: str, code: int) -> subprocess.CompletedProcess[str]:
    text = (ROOT / "install.sh").read_text()
    function = re.search(r"^apt_install\(\) \{\n.*?^}\n", text, re.S | re.M)
    assert function is not None, "install.sh has no apt_install function"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/calls\ncat >&2 <<'EOF'\n{apt_says}\nEOF\n"
                                  f"exit {code}\n")
    (fake / "apt-get").chmod(0o755)
    script = f'set -euo pipefail\nSUDO=""\n{function.group(0)}apt_install chromium\necho "not reached"\n'
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)


def test_a_held_dpkg_lock_is_said_plainly(tmp_path: Path) -> None:
    done = apt_install(tmp_path, HELD, 100)
    assert done.returncode == 100 and "not reached" not in done.stdout
    lines = done.stderr.strip().splitlines()
    assert "It is held by process 4242" in done.stderr  # apt's own words stay
    assert lines[-1] == ("install.sh: another package manager holds the dpkg lock (apt's message above names it); "
                         "wait until it finishes, then run ./install.sh again")
    assert "DPkg::Lock::Timeout=120" in (tmp_path / "calls").read_text()  # it waited for the lock first


def test_another_apt_failure_says_what_failed(tmp_path: Path) -> None:
    done = apt_install(tmp_path, "E: Unable to locate package chromium", 100)
    assert done.returncode == 100
    assert done.stderr.strip().splitlines()[-1] == (
        "install.sh: apt-get could not install chromium (exit 100; apt's message is above)")
