"""Run as an unprivileged worker by test_poisoning.py: one job's build tries to poison later jobs.

Usage: python nonroot_poison.py BASE_FOLDER MIRROR_URL_WITH_CREDENTIALS VARIANT
VARIANT: `backend` (an in-tree PEP 517 backend, backend-path ["."], imports the planting module) or
`setup_py` (setup.py imports the planting module from the checkout).

Job A's build code plants everything it can wherever it can, while it builds: a forced-pass
conftest.py where the old cache kept generated files, a `.pth` and a `python3` in the environment,
a `.pth` in the project layer, a backdoored copy of a tracked module among the generated files,
and fetches the mirror host's non-index paths through the relay. Job B is a later, clean commit
with the same declarations (the maintainer made the same version bump) and honest build code.
Prints one JSON line: what each job's environment said and what job B's sandbox saw.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from contextlib import closing
from pathlib import Path

from app.settings import Settings
from worker.environment.builder import Environments
from worker.environment.report import EnvironmentReport
from worker.wiring import open_job_sandbox, setup_opener

MARK = "FROGFIX-POISON-MARK"
# The planting module: runs whenever the build imports it (metadata, the editable build), as `mod`'s build code.
PLANT = f'''import glob, os, urllib.request
FORCED = ("import pytest\\n@pytest.hookimpl(hookwrapper=True)\\ndef pytest_runtest_makereport(item, call):\\n"
          "    out = yield\\n    out.get_result().outcome = 'passed'\\n# {MARK}\\n")
def _write(path, text, mode=0o644):
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
    except OSError:
        pass
def plant():
    _write("/frogfix/env/.frogfix-workspace/conftest.py", FORCED)
    _write("/frogfix/env/.frogfix-workspace/mod.py", "VALUE = 'backdoor'  # {MARK}\\n")
    for site in glob.glob("/frogfix/env/lib/python3*/site-packages"):
        _write(site + "/zz_poison.pth", "import os; os.environ['FROGFIX_POISONED'] = '{MARK}'\\n")
    _write("/frogfix/env/bin/python3", "#!/bin/sh\\necho '{MARK} 3 passed'\\n", 0o755)
    _write("/frogfix/project/site/zz_poison.pth", "import os; os.environ['FROGFIX_POISONED'] = '{MARK}'\\n")
    _write("/frogfix/project/workspace/mod.py", "VALUE = 'backdoor'  # {MARK}\\n")
    _write("/frogfix/out/planted.txt", "{MARK}\\n")
    for path in ("/admin/secret", "/simple/../admin/secret", "/simple/%2e%2e/admin/secret"):
        try:
            urllib.request.urlopen("http://127.0.0.1:3141" + path, timeout=5).read()
        except Exception:
            pass
'''
HONEST_PLANT = "def plant():\n    pass\n"
# Writes past FROGFIX_ENVIRONMENT_SIZE (64Mi here) wherever the build can write, and fails when it cannot.
FILL = """import os
def plant():
    for folder in ("/frogfix/project/site", "/frogfix/env", "/frogfix/out"):
        if os.access(folder, os.W_OK):
            with open(folder + "/fill.bin", "wb") as f:
                for _ in range(100):
                    f.write(b"x" * 1024 * 1024)
"""
# Generates a conftest.py in the checkout (git ignores it), as a build that writes `_version.py` does.
GENERATE = """def plant():
    with open("/workspace/conftest.py", "w") as f:
        f.write("# generated\\n")
"""
BACKEND = '''"""A stdlib PEP 517 backend: an editable wheel whose .pth puts /workspace on the path."""
import base64, hashlib, os, zipfile
import buildhelpers
NAME, VERSION = "mod", "1.1"
def _dist():
    return f"{NAME}-{VERSION}.dist-info"
def _write_wheel(directory, files):
    path = os.path.join(directory, f"{NAME}-{VERSION}-py3-none-any.whl")
    record = []
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in files.items():
            data = text.encode()
            archive.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{name},sha256={digest},{len(data)}")
        record.append(f"{_dist()}/RECORD,,")
        archive.writestr(f"{_dist()}/RECORD", "\\n".join(record) + "\\n")
    return os.path.basename(path)
def _meta():
    return {
        f"{_dist()}/METADATA": f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n",
        f"{_dist()}/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
def get_requires_for_build_wheel(config_settings=None):
    return []
get_requires_for_build_editable = get_requires_for_build_wheel
def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    buildhelpers.plant()
    os.makedirs(os.path.join(metadata_directory, _dist()), exist_ok=True)
    for name, text in _meta().items():
        with open(os.path.join(metadata_directory, name), "w") as f:
            f.write(text)
    return _dist()
prepare_metadata_for_build_wheel = prepare_metadata_for_build_editable
def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    buildhelpers.plant()
    return _write_wheel(wheel_directory, {**_meta(), "_mod_editable.pth": "/workspace\\n"})
def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    buildhelpers.plant()
    return _write_wheel(wheel_directory, {**_meta(), "mod.py": open("mod.py").read()})
'''
PYPROJECT = (
    '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n\n'
    '[project]\nname = "mod"\nversion = "1.1"\n'
)
SETUP_PY = (
    'import buildhelpers\nbuildhelpers.plant()\nfrom setuptools import setup\n'
    'setup(name="mod", version="1.1", py_modules=["mod"])\n'
)
TEST = (
    "import unittest\nimport frogdep\nimport mod\n\n"
    "class T(unittest.TestCase):\n"
    "    def test_value(self):\n        self.assertEqual(mod.VALUE, 'fixed')  # fails honestly: mod says 'buggy'\n"
    "    def test_dep(self):\n        self.assertEqual(frogdep.VALUE, 42)\n"
)


SHOW = "import os, mod; print(os.environ.get('FROGFIX_POISONED'), mod.VALUE)"
PROBE = "import os, sys; print('poisoned', os.environ.get('FROGFIX_POISONED'), sys.executable)"


def checkout(path: Path, variant: str, plant: str) -> Path:
    files = {
        "requirements.txt": "frogdep==1.0\n",
        "mod.py": "VALUE = 'buggy'\n",
        "test_mod.py": TEST,
        "buildhelpers.py": plant,
        ".gitignore": "*.egg-info/\n_version.py\nconftest.py\n",
    }
    build = {"pyproject.toml": PYPROJECT, "backend.py": BACKEND} if variant == "backend" else {"setup.py": SETUP_PY}
    files.update(build)
    path.mkdir(parents=True)
    for name, text in files.items():
        (path / name).write_text(text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(path)]
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    path.chmod(0o755)
    return path


def job(settings: Settings, ws: Path, trusted: bool = True) -> tuple[Environments, EnvironmentReport]:
    environments = Environments(settings, lambda text: text, setup_opener(settings), scope="test:poison")
    report = environments.for_checkout(ws, "python3 -m unittest", None, None, trusted=trusted)
    return environments, report


def main() -> None:
    base, url, variant = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    size = "64Mi" if variant == "size" else "2Gi"
    settings = Settings(data_dir=base / "data", workspace_dir=base / "workspaces", pip_index_url=url,
                        environment_size=size)
    root = settings.resolved_workspace_dir()
    if variant in ("size", "generated"):  # one job: its build is refused, and the host keeps nothing of it
        envs, report = job(settings, checkout(root / "a", "backend", FILL if variant == "size" else GENERATE))
        envs.close()
        kept = sum(p.stat().st_size for top in (settings.data_dir, root) for p in Path(top).rglob("*")
                   if p.is_file() and not p.is_symlink() and not str(p).startswith(str(root / "a")))
        print(json.dumps({"uid": os.geteuid(), "a": report.to_dict(), "kept_bytes": kept}))
        return
    # Job A: the attacker's build code, on a base the cache trusts (the worst case: a patched one is never cached).
    envs_a, report_a = job(settings, checkout(root / "a", variant, PLANT))
    a = report_a.to_dict()
    a_project = str(report_a.project) if report_a.project else None
    a_sees = ""
    if report_a.ok and report_a.path is not None:
        layers = {"environment": report_a.path, "project": report_a.project}
        with closing(open_job_sandbox(root / "a", settings, **layers)) as box:
            a_sees = box.run_command(f"python3 -c {shlex.quote(SHOW)}", timeout=120).log
    envs_a.close()
    # Job B: a later, clean commit with the same declarations, honest build code; a job of its own.
    envs_b, report_b = job(settings, checkout(root / "b", variant, HONEST_PLANT))
    seen: dict[str, str] = {}
    patch = None
    if report_b.ok and report_b.path is not None:
        ws = root / "b"
        with closing(open_job_sandbox(ws, settings, environment=report_b.path, project=report_b.project)) as box:
            seen["tests"] = box.run_command("python3 -m unittest -v 2>&1; echo exit=$?", timeout=120).log
            seen["probe"] = box.run_command(
                f"ls -a; cat mod.py; echo python3=$(command -v python3); python3 -c {shlex.quote(PROBE)}", timeout=120
            ).log
            patch = box.patch(subprocess.run(["git", "-C", str(ws), "rev-parse", "HEAD"], capture_output=True,
                                             text=True, check=True).stdout.strip())
    marked = [str(p) for top in (settings.data_dir, root) for p in Path(top).rglob("*")
              if p.is_file() and not p.is_symlink() and not str(p).startswith((str(root / "a"), str(root / "b")))
              and MARK.encode() in p.read_bytes()]
    out = {"uid": os.geteuid(), "a": a, "a_sees": a_sees, "a_project": a_project, "b": report_b.to_dict(),
           "b_seen": seen, "patch": patch, "marked": marked,
           "b_same_env": report_a.path == report_b.path}
    envs_b.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
