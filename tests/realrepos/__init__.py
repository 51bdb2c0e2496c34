"""Six real upstream bug fixes (../shared/fixtures/realrepos), read in place at test time.

`Task` is the one reader of a task folder, so the mirror's fill, the model double, the tests and
bench/environment.py agree on what a task declares. Nothing here copies fixture files into the repo.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tomllib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from tests.conftest import seeded

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT.parent / "shared" / "fixtures" / "realrepos"
FIX_TIMEOUT = 1500  # seconds for one `manage.py fix`: a cold environment plus two runs of arrow's suite, loaded

# Who commits the unpacked base tree: the tarball has no history, and hatch-vcs needs some.
GIT_IDENTITY = ("-c", "user.name=FrogFix Tests", "-c", "user.email=tests@frogfix.invalid", "-c", "commit.gpgsign=false")

# What pip/uv build a project with when it has no [build-system] (setup.py-only trees).
LEGACY_BUILD_REQUIRES = ("setuptools>=40.8.0", "wheel")
# What a backend's get_requires_for_build_editable adds to its static `requires` (an editable
# install asks for it): hatchling wants `editables`. The others add nothing today.
EDITABLE_REQUIRES = {"hatchling": ("editables~=0.3",)}


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` with the tests' identity; fail loudly."""
    done = subprocess.run(["git", *GIT_IDENTITY, "-C", str(repo), *args], check=True, capture_output=True, text=True)
    return done.stdout


@dataclass(frozen=True)
class Task:
    """One task folder: base tree, upstream fix, issue text, and what task.json says about them."""

    name: str
    folder: Path
    data: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def load(cls, folder: Path) -> Task:
        return cls(folder.name, folder, json.loads((folder / "task.json").read_text()))

    @property
    def fail_to_pass(self) -> list[str]:
        return list(self.data["fail_to_pass"])

    @property
    def test_files(self) -> list[str]:
        return list(self.data["test_files"])

    @property
    def issue_text(self) -> str:
        return (self.folder / "issue.md").read_text()

    @property
    def fix_patch(self) -> Path:
        return self.folder / "fix.patch"

    @property
    def pins(self) -> list[str]:
        """`name==version` lines pip resolved for this task (env_freeze without `-e .` and comments)."""
        lines = (line.strip() for line in self.data["env_freeze"])
        return [line for line in lines if line and not line.startswith(("#", "-e"))]

    @property
    def locked(self) -> list[str]:
        """The lock's closure (uv.lock / poetry.lock tasks), markers kept; empty for the others."""
        return list(self.data.get("locked_test_requirements") or [])

    @cached_property
    def pyproject(self) -> dict[str, Any] | None:
        """The base tree's pyproject.toml, read from the tarball without unpacking the rest."""
        with tarfile.open(self.folder / "base.tar.gz") as archive:
            try:
                member = archive.getmember("pyproject.toml")
            except KeyError:
                return None
            handle = archive.extractfile(member)
            assert handle is not None
            return tomllib.load(io.BytesIO(handle.read()))

    @property
    def build_requires(self) -> list[str]:
        """[build-system] requires (or setuptools + wheel as pip and uv assume without one), plus
        what the backend asks for to build the editable install the test environment uses."""
        system = (self.pyproject or {}).get("build-system") or {}
        requires = list(system.get("requires") or LEGACY_BUILD_REQUIRES)
        backend = str(system.get("build-backend") or "setuptools").split(".")[0]
        return requires + list(EDITABLE_REQUIRES.get(backend, ()))

    def unpack(self, dest: Path) -> Path:
        """The base tree in `dest` as a one-commit git checkout (hatch-vcs and FrogFix both need git)."""
        dest.mkdir(parents=True, exist_ok=True)
        with tarfile.open(self.folder / "base.tar.gz") as archive:
            archive.extractall(dest, filter="data")
        subprocess.run(["git", "init", "-q", "-b", "main", str(dest)], check=True, capture_output=True)
        git(dest, "add", "--all", "--force")
        git(dest, "commit", "-q", "--no-verify", "-m", f"base of {self.name} ({self.data['base'][:12]})")
        return dest


def load_tasks(root: Path = FIXTURES) -> list[Task]:
    """Every task folder under `root`, in MANIFEST order (the order the README's table uses)."""
    manifest = json.loads((root / "MANIFEST.json").read_text())
    return [Task.load(root / entry["task"]) for entry in manifest["tasks"]]


def run_fix(
    repo: Path, issue: Path, *, data_dir: Path, workspace_dir: Path, model_url: str, index_url: str = "",
    npm_registry_url: str = "", timeout: float = FIX_TIMEOUT,
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any] | None]:
    """`manage.py fix REPO --issue ISSUE --json` as the CLI runs it, with the realrepos settings.

    The environment is the caller's minus any FROGFIX_ setting (as tests/fix does), so the only
    mirrors FrogFix knows are `index_url` (PyPI) and `npm_registry_url`. Returns the process and its
    JSON (None when stdout is not one).
    """
    seeded(data_dir)  # its database at head (tests/conftest.py): the migrations are tested on their own
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env.update({
        "FROGFIX_DATA_DIR": str(data_dir),
        "FROGFIX_WORKSPACE_DIR": str(workspace_dir),
        "FROGFIX_MODEL_BASE_URL": model_url,
        "FROGFIX_MODEL_NAME": "scripted",
        "FROGFIX_PIP_INDEX_URL": index_url,
        "FROGFIX_NPM_REGISTRY_URL": npm_registry_url,
    })
    proc = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "fix", str(repo), "--issue", str(issue), "--json"],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        out = None
    return proc, out if isinstance(out, dict) else None
