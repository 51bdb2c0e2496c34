"""The checkout's own virtual environment: ./install.sh makes .venv, ./manage.py and ./test.sh use it.

Each test copies the script it checks into a scratch checkout whose .venv/bin/python (and, where it
matters, python3 and apt-get on PATH) are small recording stand-ins, so what the script runs and in
which order is observed without installing anything."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def script(path: Path, body: str) -> Path:
    """An executable /bin/sh script at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def recorder(path: Path, log: Path, exit_code: int = 0) -> Path:
    """A stand-in that appends its name and arguments to `log` and exits with `exit_code`."""
    return script(path, f'echo "{path.name} $*" >>"{log}"\nexit {exit_code}\n')


def bare_python(tmp_path: Path) -> Path:
    """An interpreter with nothing but the standard library: a venv made without pip."""
    target = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True, timeout=120)
    return target / "bin" / "python"


# What manage.py needs before anything third-party: itself, pyproject.toml's dependency list and the
# standard-library bootstrap it runs first (worker/commands/bootstrap.py).
MANAGE_FILES = ("manage.py", "pyproject.toml", "worker/__init__.py", "worker/commands/__init__.py",
                "worker/commands/bootstrap.py")


def checkout(tmp_path: Path, *files: str) -> Path:
    """A scratch checkout holding copies of `files` from this one."""
    root = tmp_path / "checkout"
    root.mkdir()
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, root / name)
    return root


def run(argv: list[str | Path], cwd: Path, path_first: Path | None = None) -> subprocess.CompletedProcess[str]:
    outer = ("FROGFIX_MANAGE_REEXEC", "FROGFIX_TEST_PHASE", "FROGFIX_TEST_WORKERS")  # this run's own
    env = {k: v for k, v in os.environ.items() if k not in outer}
    if path_first is not None:
        env["PATH"] = f"{path_first}:{env.get('PATH', '/usr/bin:/bin')}"
    return subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


# manage.py


def test_manage_reexecs_into_the_checkout_venv_when_the_interpreter_lacks_the_dependencies(tmp_path: Path) -> None:
    root = checkout(tmp_path, *MANAGE_FILES)
    log = tmp_path / "calls.log"
    script(root / ".venv" / "bin" / "python", f'echo "venv $* mark=$FROGFIX_MANAGE_REEXEC" >>"{log}"\n')
    done = run([bare_python(tmp_path), "manage.py", "jobs", "--limit", "3"], cwd=root)
    assert done.returncode == 0, done.stderr
    assert log.read_text() == f"venv {root / 'manage.py'} jobs --limit 3 mark=1\n"


def test_manage_stays_under_an_interpreter_that_has_the_project_installed(tmp_path: Path) -> None:
    root = checkout(tmp_path, "manage.py", "pyproject.toml")
    for package in ("app", "worker", "sandbox"):  # the project, as an installed interpreter has it
        (root / package).symlink_to(ROOT / package)
    log = tmp_path / "calls.log"
    recorder(root / ".venv" / "bin" / "python", log)
    done = run([sys.executable, "manage.py", "--help"], cwd=root)
    assert done.returncode == 0, done.stderr
    assert "FrogFix: labelled issues become draft MRs." in done.stdout
    assert not log.exists()  # never handed over to .venv


def test_a_venv_that_lacks_them_too_is_a_clear_error_not_a_loop(tmp_path: Path) -> None:
    root = checkout(tmp_path, *MANAGE_FILES)
    bare = bare_python(tmp_path)
    counter = tmp_path / "execs"
    script(root / ".venv" / "bin" / "python", f'echo x >>"{counter}"\nexec "{bare}" "$@"\n')
    done = run([bare, "manage.py", "jobs"], cwd=root)
    assert done.returncode == 1
    assert counter.read_text() == "x\n"  # handed over once, then it stopped
    assert "lacks FrogFix's dependencies (fastapi, uvicorn, celery, redis and " in done.stderr
    assert "run ./install.sh" in done.stderr and "Traceback" not in done.stderr


def test_a_half_installed_venv_run_directly_is_a_clear_error(tmp_path: Path) -> None:
    """./install.sh stopped before pip finished: .venv's own interpreter lacks the dependencies too."""
    root = checkout(tmp_path, *MANAGE_FILES)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / ".venv")], check=True, timeout=120)
    done = run([root / ".venv" / "bin" / "python", "manage.py", "jobs"], cwd=root)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "lacks FrogFix's dependencies" in done.stderr and "run ./install.sh" in done.stderr


def test_without_a_venv_a_bare_interpreter_is_told_to_run_install(tmp_path: Path) -> None:
    root = checkout(tmp_path, *MANAGE_FILES)
    done = run([bare_python(tmp_path), "manage.py", "jobs"], cwd=root)
    assert done.returncode == 1
    assert done.stderr.startswith("manage.py: ") and done.stderr.rstrip().endswith("run ./install.sh")
    assert "Traceback" not in done.stderr


# test.sh


def test_test_sh_runs_pytest_in_the_venv_and_counts_no_tests_as_a_failure(tmp_path: Path) -> None:
    root = checkout(tmp_path, "test.sh")
    log = tmp_path / "calls.log"
    recorder(root / ".venv" / "bin" / "python", log, exit_code=5)
    done = run(["./test.sh", "-q", "tests/x"], cwd=root)
    # (the recorder is no interpreter with xdist, so both phases run in one process)
    assert log.read_text() == "python -c import xdist\n" + "python -m pytest -q tests/x\n" * 2
    assert done.returncode == 1 and "collected no tests; that is a failure" in done.stderr


def test_test_sh_without_a_venv_uses_python3_and_passes_its_exit_code_on(tmp_path: Path) -> None:
    root = checkout(tmp_path, "test.sh")
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    recorder(bin_dir / "python3", log, exit_code=3)
    done = run(["./test.sh", "-k", "webhooks"], cwd=root, path_first=bin_dir)
    assert log.read_text() == "python3 -c import xdist\n" + "python3 -m pytest -k webhooks\n" * 2
    assert done.returncode == 3


PHASED_PYTHON = """
echo "python $* phase=${{FROGFIX_TEST_PHASE:-}}" >>"{log}"
case "$*" in
  "-c import xdist") exit 0 ;;
esac
[ "$FROGFIX_TEST_PHASE" = parallel ] && exit {parallel}
exit {serial}
"""


@pytest.mark.parametrize(("parallel", "serial", "expected"), [(0, 5, 0), (5, 0, 0), (0, 1, 1), (2, 0, 2), (5, 5, 1)])
def test_test_sh_spreads_the_suite_then_runs_the_serial_tests_and_needs_tests_in_one_phase(
    tmp_path: Path, parallel: int, serial: int, expected: int
) -> None:
    root = checkout(tmp_path, "test.sh")
    log = tmp_path / "calls.log"
    script(root / ".venv" / "bin" / "python", PHASED_PYTHON.format(log=log, parallel=parallel, serial=serial))
    done = run(["env", "FROGFIX_TEST_WORKERS=3", "./test.sh", "-q"], cwd=root)
    assert log.read_text().splitlines() == [
        "python -c import xdist phase=",
        "python -m pytest -n 3 --dist worksteal -q phase=parallel",
        "python -m pytest -q phase=serial",
    ]
    assert done.returncode == expected, done.stderr
    assert ("collected no tests" in done.stderr) == (parallel == serial == 5)


def test_test_sh_with_no_workers_runs_the_first_phase_in_process(tmp_path: Path) -> None:
    root = checkout(tmp_path, "test.sh")
    log = tmp_path / "calls.log"
    script(root / ".venv" / "bin" / "python", PHASED_PYTHON.format(log=log, parallel=0, serial=0))
    assert run(["env", "FROGFIX_TEST_WORKERS=0", "./test.sh"], cwd=root).returncode == 0
    assert log.read_text().splitlines() == ["python -m pytest phase=parallel", "python -m pytest phase=serial"]


# install.sh


def install_world(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """A checkout with install.sh, apt-get and sudo that only record what they were asked, and
    the recording python that `python3 -m venv` is to put in .venv: (root, log, bin, venv python)."""
    root = checkout(tmp_path, "install.sh", "pyproject.toml")
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    recorder(bin_dir / "apt-get", log)
    script(bin_dir / "sudo", 'exec "$@"\n')
    return root, log, bin_dir, recorder(tmp_path / "venv-python", log)


def test_install_creates_the_venv_installs_into_it_and_a_second_run_does_nothing(tmp_path: Path) -> None:
    root, log, bin_dir, venv_python = install_world(tmp_path)
    make_venv = f'mkdir -p .venv/bin && cp "{venv_python}" .venv/bin/python\n'
    script(bin_dir / "python3", f'echo "python3 $*" >>"{log}"\n{make_venv}')

    first = run(["./install.sh"], cwd=root, path_first=bin_dir)
    assert first.returncode == 0, first.stderr
    calls = [line for line in log.read_text().splitlines() if not line.startswith("apt-get")]
    assert calls == [
        "python3 -m venv .venv",
        "venv-python -m pip install -q --disable-pip-version-check -e .[dev]",
    ]
    assert "PIP_BREAK_SYSTEM_PACKAGES" not in (root / "install.sh").read_text()

    log.write_text("")
    again = run(["./install.sh"], cwd=root, path_first=bin_dir)
    assert again.returncode == 0 and "up to date" in again.stdout
    assert [line for line in log.read_text().splitlines() if "pip install" in line or "venv" in line] == [
        "venv-python -c import pip"
    ]

    (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text() + "\n# changed\n")
    log.write_text("")
    changed = run(["./install.sh"], cwd=root, path_first=bin_dir)
    assert changed.returncode == 0, changed.stderr
    assert "venv-python -m pip install -q --disable-pip-version-check -e .[dev]" in log.read_text().splitlines()


def test_install_fetches_python3_venv_when_venv_cannot_make_an_environment(tmp_path: Path) -> None:
    """Debian's python3 without python3-venv: `python3 -m venv` fails (leaving a half-made .venv)."""
    root, log, bin_dir, venv_python = install_world(tmp_path)
    fetched = tmp_path / "fetched"
    script(
        bin_dir / "apt-get",
        f'echo "apt-get $*" >>"{log}"\ncase "$*" in *python3-venv*) touch "{fetched}";; esac\n',
    )
    script(
        bin_dir / "python3",
        f'echo "python3 $*" >>"{log}"\nmkdir -p .venv/bin\n'
        f'[ -e "{fetched}" ] || {{ echo "ensurepip is not available" >&2; exit 1; }}\n'
        f'cp "{venv_python}" .venv/bin/python\n',
    )
    done = run(["./install.sh"], cwd=root, path_first=bin_dir)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    venv_calls = [i for i, line in enumerate(calls) if line == "python3 -m venv .venv"]
    assert len(venv_calls) == 2
    installs = [i for i, line in enumerate(calls)  # apt-get [-o DPkg::Lock::Timeout=...] install ... python3-venv
                if line.startswith("apt-get ") and " install " in line and "python3-venv" in line]
    assert len(installs) == 1 and venv_calls[0] < installs[0] < venv_calls[1]
    assert calls[-1] == "venv-python -m pip install -q --disable-pip-version-check -e .[dev]"


@pytest.mark.parametrize("name", ["install.sh", "test.sh", ".ci/run"])
def test_no_script_installs_into_or_runs_the_project_with_a_bare_system_python(name: str) -> None:
    text = (ROOT / name).read_text()
    assert "PIP_BREAK_SYSTEM_PACKAGES" not in text and "python3 -m pip" not in text
    if name == ".ci/run":
        assert ".venv/bin/python -m ruff check ." in text and "./test.sh -q" in text
