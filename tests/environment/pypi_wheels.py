"""Wheels from PyPI for the environment tests' mirrors, downloaded once per machine and list.

A setup.py project's build needs setuptools from the mirror, and a repository whose test command
runs pytest needs pytest there; the tests' own mirrors (tests/realrepos/mirror.py's pypiserver)
serve these beside the wheels written by hand. Cached under FROGFIX_TEST_MIRROR_CACHE (default
~/.cache/frogfix-test-mirror), like the realrepos mirror, so only a first run downloads.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from pathlib import Path

from tests.realrepos.mirror import _pip_download


def wheels(*requirements: str) -> Path:
    """A folder holding wheels for `requirements` and their dependencies (filled on first use)."""
    base = os.environ.get("FROGFIX_TEST_MIRROR_CACHE") or str(Path.home() / ".cache" / "frogfix-test-mirror")
    key = hashlib.sha256("\n".join(sorted(requirements)).encode()).hexdigest()[:16]
    folder = Path(base) / f"wheels-{key}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / ".filled").is_file():
            done = _pip_download(folder, ["--only-binary=:all:", *requirements])
            if done.returncode != 0:
                raise RuntimeError(f"could not download {' '.join(requirements)} from PyPI:\n{done.stderr[-2000:]}")
            (folder / ".filled").write_text("\n".join(requirements) + "\n")
    return folder


def copy_wheels(folder: Path, into: Path) -> None:
    for item in folder.iterdir():
        if item.suffix == ".whl":
            shutil.copy(item, into / item.name)
