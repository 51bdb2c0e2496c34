"""Run the worker side of a test as an unprivileged user, as the shipped worker image does.

Why: CI and most dev machines run the suite as root, and some holes only open for a non-root
worker (a pipe the worker creates is owned by its uid; as root the sandbox uid cannot open it,
as a plain user it can). A test that proves a wall "under a non-root worker" uses the
`nonroot` fixture and runs its worker-side script with `NonRoot.run_python`.

- Not root: the current user is already unprivileged and runs the script itself.
- Root: the user `NONROOT_TEST_USER` (default `frogfix-nonroot`) is found or made with useradd,
  and the script runs as that uid with no supplementary groups (setpriv). When the checkout's
  interpreter lives under a folder that user cannot pass (e.g. pyenv under /root, mode 0700),
  the script runs in a private mount namespace where that folder is an empty tmpfs with only
  the interpreter, the .venv and the checkout bound back: nothing on the host is chmod-ed.
- The fixture fails, with the reason, when root cannot make the user or bwrap does not run for
  it: CI runs as root, so a skip there would hide exactly the case these tests exist for.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_USER = "frogfix-nonroot"
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclass
class NonRoot:
    """An unprivileged uid and how to run the repo's Python as it."""

    name: str
    uid: int
    gid: int
    home: Path
    python: str = field(default_factory=lambda: str(REPO / ".venv" / "bin" / "python"))
    hidden: dict[str, list[str]] = field(default_factory=dict)  # folder -> paths bound back into it
    staging: Path | None = None
    base: Path | None = None

    def folder(self, prefix: str = "work-") -> Path:
        """A fresh folder this user owns (mode 0755), under a base every uid can pass."""
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=self.base))
        path.chmod(0o755)
        if os.geteuid() == 0:
            os.chown(path, self.uid, self.gid)
        return path

    def command(self, argv: list[str]) -> list[str]:
        """`argv` as a command line that runs it as this user with a clean environment."""
        env = ["env", "-i", f"PATH={SAFE_PATH}", f"HOME={self.home}", "LANG=C.UTF-8", f"PYTHONPATH={REPO}"]
        if os.geteuid() != 0:
            return [*env, *argv]
        drop = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--"]
        if not self.hidden:
            return [*drop, *env, *argv]
        view = self._view_script([*drop, *env, *argv])
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", view]

    def script(self, source: str, name: str = "worker.py") -> Path:
        """`source` as a Python file this user can read, in a folder of its own."""
        path = self.folder("script-") / name
        path.write_text(source)
        path.chmod(0o644)
        return path

    def run_json(self, script: str | Path, *args: str, timeout: float = 300.0) -> dict[str, Any]:
        """Run a worker-side script as this user; it must exit 0 and end its output with one JSON object
        that reports `uid` (or `worker_uid`): this user's, never root's."""
        done = self.run_python(script, *args, timeout=timeout)
        assert done.returncode == 0, done.stderr[-3000:]
        outcome: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        assert outcome.get("uid", outcome.get("worker_uid")) == self.uid != 0, outcome
        return outcome

    def run_python(self, script: str | Path, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess[str]:
        """Run a Python file with the checkout's .venv as this user (cwd: the repo root)."""
        argv = self.command([self.python, "-B", str(script), *args])
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)

    def _view_script(self, argv: list[str]) -> str:
        """Shell that hides each unreachable folder under a tmpfs holding only what the script needs."""
        assert self.staging is not None
        lines = ["set -e"]
        for index, (folder, keep) in enumerate(self.hidden.items()):
            for number, path in enumerate(keep):
                stage = shlex.quote(str(self.staging / f"{index}-{number}"))
                lines += [f"mkdir -p {stage}", f"mount --rbind {shlex.quote(path)} {stage}"]
            lines.append(f"mount -t tmpfs -o mode=0755,size=1m frogfix-nonroot {shlex.quote(folder)}")
            for number, path in enumerate(keep):
                stage = shlex.quote(str(self.staging / f"{index}-{number}"))
                lines += [f"mkdir -p {shlex.quote(path)}", f"mount --move {stage} {shlex.quote(path)}"]
        lines.append("exec " + shlex.join(argv))
        return "\n".join(lines)


def _find_or_create(name: str) -> pwd.struct_passwd:
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(name)
    if shutil.which("useradd") is None:
        pytest.fail(f"running as root without the test user {name!r} and without useradd to make it")
    made = subprocess.run(
        ["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
         "--shell", "/usr/sbin/nologin", name],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    try:
        return pwd.getpwnam(name)  # another test run may have made it meanwhile
    except KeyError:
        pytest.fail(f"cannot create the non-root test user {name!r}: {made.stderr.strip()}")


def _passable(folder: str, uid: int, gid: int) -> bool:
    """Whether `uid` (no supplementary groups) may search `folder`, by its mode bits."""
    st = os.stat(folder)
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _blocked_folders(needed: list[str], uid: int, gid: int) -> dict[str, list[str]]:
    """For each needed path under a folder `uid` cannot pass: that (topmost) folder -> the paths."""
    hidden: dict[str, list[str]] = {}
    for path in needed:
        parts = Path(path).parts
        for depth in range(1, len(parts)):
            folder = str(Path(*parts[:depth]))
            if not _passable(folder, uid, gid):
                hidden.setdefault(folder, []).append(path)
                break
    return hidden


def _needed_paths(python: str) -> list[str]:
    """What the script touches on the host: the interpreter's prefix, the .venv and the checkout."""
    real = os.path.realpath(python)
    prefix = os.path.dirname(os.path.dirname(real))
    return sorted({prefix, str(REPO / ".venv"), os.path.realpath(REPO / ".venv"), str(REPO)})


def _check_runs(user: NonRoot) -> None:
    """The user can start the checkout's Python, import FrogFix and the .venv's packages, run bwrap."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.fail("setpriv is not installed (apt-get install util-linux): the non-root tests need it")
    probe = "import pydantic, pytest, sandbox.local; print(sandbox.local.__file__)"
    done = subprocess.run(
        user.command([user.python, "-B", "-c", probe]), cwd=REPO, capture_output=True, text=True, check=False
    )
    if done.returncode != 0 or not done.stdout.strip().startswith(str(REPO)):
        pytest.fail(f"user {user.name} cannot run {user.python} with this checkout: {done.stdout}{done.stderr}")
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.fail("bubblewrap (bwrap) is not installed: apt-get install bubblewrap")
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--ro-bind", "/", "/", "--", "/bin/true"]
    done = subprocess.run(user.command(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.fail(f"bwrap does not run for user {user.name}: {done.stderr.strip()}")


@pytest.fixture(scope="session")
def nonroot() -> Iterator[NonRoot]:
    """An unprivileged user to run the worker side as (see the module docstring)."""
    base = Path(tempfile.mkdtemp(prefix="frogfix-nonroot-"))
    try:
        if os.geteuid() != 0:
            entry = pwd.getpwuid(os.getuid())
            home = base / "home"
            home.mkdir()
            user = NonRoot(entry.pw_name, entry.pw_uid, entry.pw_gid, home, base=base)
        else:
            entry = _find_or_create(os.environ.get("NONROOT_TEST_USER", DEFAULT_USER))
            if entry.pw_uid == 0:
                pytest.fail(f"the non-root test user {entry.pw_name!r} has uid 0")
            base.chmod(0o711)
            home = base / "home"
            home.mkdir(mode=0o700)
            os.chown(home, entry.pw_uid, entry.pw_gid)
            user = NonRoot(entry.pw_name, entry.pw_uid, entry.pw_gid, home, base=base)
            user.hidden = _blocked_folders(_needed_paths(user.python), user.uid, user.gid)
            user.staging = base / "staging"
        _check_runs(user)
        yield user
    finally:
        shutil.rmtree(base, ignore_errors=True)
