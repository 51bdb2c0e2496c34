"""Every setting is checked once, at start, for every command (issue 40): a bad value is one line on stderr
naming the variable, its problem and a good value, exit 2, no traceback and nothing started.

Real processes: `manage.py doctor`, `demo` and `serve` with one bad setting each.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.settings import POSTGRES_SCHEME, Settings
from tests.nonroot import NonRoot

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = [("doctor",), ("demo",), ("serve", "--port", "0")]  # serve's port would refuse too; its settings first


def manage(args: tuple[str, ...], data: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], env={**clean, "FROGFIX_DATA_DIR": str(data), **env},
        cwd=next(p for p in data.parents if p.is_dir()), capture_output=True, text=True, timeout=120,
    )


def one_line(proc: subprocess.CompletedProcess[str], command: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == "" and "Traceback" not in proc.stderr, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith(f"frogfix {command}: "), line
    return line


BAD = {
    "project_limits": ({"FROGFIX_PROJECT_LIMITS": "notjson"},
                       ["FROGFIX_PROJECT_LIMITS: not JSON", 'e.g. FROGFIX_PROJECT_LIMITS={"group/project": ']),
    "sandbox_memory": ({"FROGFIX_SANDBOX_MEMORY": "1Gi"},
                       ["FROGFIX_SANDBOX_MEMORY: ", "exceed FROGFIX_SANDBOX_MEMORY 1Gi",
                        "(e.g. FROGFIX_SANDBOX_MEMORY=4Gi)"]),
    "database_driver": ({"FROGFIX_DATABASE_URL": "postgresql+psycopg2://frog:pw-canary-41@db/frogfix"},
                        ["FROGFIX_DATABASE_URL: ", f"use the scheme {POSTGRES_SCHEME}://"]),
    "number": ({"FROGFIX_ATTEMPTS": "0"}, ["FROGFIX_ATTEMPTS: Input should be greater than or equal to 1",
                                           "(e.g. FROGFIX_ATTEMPTS=1)"]),
}


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_setting_is_one_line_naming_it_and_a_good_value(tmp_path: Path, command: tuple[str, ...],
                                                               case: str) -> None:
    env, expected = BAD[case]
    data = tmp_path / "data"
    line = one_line(manage(command, data, **env), command[0])
    for words in expected:
        assert words in line, line
    assert "pw-canary-41" not in line and "FROGFIX_?" not in line
    assert not data.exists()  # nothing was started: no data folder, database or broker folder


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_an_unusable_data_folder_is_named_as_the_data_folder(tmp_path: Path, command: tuple[str, ...]) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    line = one_line(manage(command, a_file / "data"), command[0])
    assert f"FROGFIX_DATA_DIR: the data folder {a_file / 'data'} cannot be made or written" in line, line
    assert "broker" not in line.lower() and "redis" not in line.lower()


@pytest.mark.parametrize(("flags", "expected"), [
    (("--port", "99999"), "--port 99999 is not a TCP port: give one from 1 to 65535 (e.g. --port 8000)"),
    (("--workers", "0"), "--workers 0: serve needs at least one web worker process (e.g. --workers 1)"),
])
def test_serve_refuses_a_port_or_worker_count_it_cannot_use(tmp_path: Path, flags: tuple[str, ...],
                                                            expected: str) -> None:
    data = tmp_path / "data"
    line = one_line(manage(("serve", *flags), data), "serve")
    assert line == f"frogfix serve: {expected}"
    assert not (data / "frogfix.db").exists()  # nothing was migrated or started


@pytest.mark.parametrize("scheme", ["postgres", "postgresql"])
def test_postgres_common_spellings_mean_the_driver_frogfix_ships(scheme: str) -> None:
    url = Settings(database_url=f"{scheme}://frog:pw@db.internal:5432/frogfix").database_url
    assert url == f"{POSTGRES_SCHEME}://frog:pw@db.internal:5432/frogfix"


def test_doctor_reaches_a_postgres_url_through_psycopg(tmp_path: Path) -> None:
    """`postgres://` is no longer "start the database server" for a missing plugin: it is tried, said unreachable."""
    proc = manage(("doctor", "--json"), tmp_path / "data", FROGFIX_DATABASE_URL="postgres://frog:pw@127.0.0.1:1/x")
    assert "NoSuchModuleError" not in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    assert '"name": "database"' in proc.stdout and "127.0.0.1:1" in proc.stdout


def test_a_data_folder_this_user_may_not_write_is_named_under_a_non_root_user(nonroot: NonRoot) -> None:
    """The product runs non-root: a data folder it may not write is named as such, not as the broker."""
    locked = nonroot.folder("locked-")
    locked.chmod(0o555)  # the user's own folder, made read-only: as the user, nothing can be made in it
    data = locked / "data"
    argv = nonroot.command(["env", f"FROGFIX_DATA_DIR={data}", nonroot.python, str(ROOT / "manage.py"), "doctor"])
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120)
    line = one_line(proc, "doctor")
    assert f"the data folder {data} cannot be made or written ({locked} is not writable by this user" in line, line
    assert "broker" not in line.lower()
