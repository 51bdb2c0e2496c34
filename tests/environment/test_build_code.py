"""Build code: the files a checkout's own install runs, read as text (worker/environment/build_code.py).

An attacker's patch rewrote an in-tree PEP 517 backend (`backend.py`, `backend-path = ["."]`) and
went unflagged: only the dependency files were. Each rule here is one way an install runs a file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.environment.test_declared import tree
from worker.environment import build_code
from worker.environment.build_code import build_code_paths, is_build_code, read_from_folder
from worker.environment.declared import MAX_DECLARATION_BYTES

IN_TREE_BACKEND = """
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]

[project]
name = "calc"
version = "0"
"""


def found(root: Path, files: dict[str, str], requirement_files: tuple[str, ...] = ()) -> tuple[str, ...]:
    return build_code_paths(read_from_folder(tree(root, files)), requirement_files)


def test_an_in_tree_backend_and_what_it_imports_from_its_folders(tmp_path: Path) -> None:
    paths = found(tmp_path, {
        "pyproject.toml": IN_TREE_BACKEND,
        "backend.py": "import helpers\nfrom setuptools import build_meta\n",
        "helpers.py": "from . import nothing\nimport _shared.util\n",
        "_shared/__init__.py": "", "_shared/util.py": "X = 1\n",
        "calc.py": "def add(a, b):\n    return a + b\n",  # ordinary code: the backend never imports it
        "tests/test_calc.py": "import calc\n",
    })  # fmt: skip
    assert paths == ("_shared/__init__.py", "_shared/util.py", "backend.py", "helpers.py")


def test_a_dotted_backend_in_a_package_under_its_own_backend_path(tmp_path: Path) -> None:
    paths = found(tmp_path, {
        "pyproject.toml": '[build-system]\nbuild-backend = "tools.backend:hooks"\nbackend-path = ["_build"]\n',
        "_build/tools/__init__.py": "", "_build/tools/backend.py": "from .impl import go\n",
        "_build/tools/impl.py": "", "tools/backend.py": "",  # not under backend-path: not the backend
    })  # fmt: skip
    assert paths == ("_build/tools/__init__.py", "_build/tools/backend.py", "_build/tools/impl.py")
    escaping = '[build-system]\nbuild-backend = "backend"\nbackend-path = ["../.."]\n'
    assert found(tmp_path / "out", {"pyproject.toml": escaping, "backend.py": ""}) == ()


def test_setup_py_its_src_imports_its_sys_path_and_the_files_it_executes(tmp_path: Path) -> None:
    paths = found(tmp_path, {
        "setup.py": (
            "import os, sys\n"
            "sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'tools'))\n"
            "from mypkg._build import BuildPy\n"
            "import buildtool\n"
            "exec(open('mypkg/version.py').read())\n"
            "runpy.run_path(os.path.join('scripts', 'gen.py'))\n"
            "exec((Path(__file__).parent / 'scripts' / 'more.py').read_text())\n"
            "exec(open(os.path.dirname(__file__) + '/scripts/extra.py').read())\n"
            "from setuptools import setup\nsetup(cmdclass={'build_py': BuildPy})\n"
        ),
        "src/mypkg/__init__.py": "", "src/mypkg/_build.py": "from mypkg import _helpers\n",
        "src/mypkg/_helpers.py": "", "src/mypkg/core.py": "",
        "mypkg/version.py": "__version__ = '1'\n", "tools/buildtool.py": "", "scripts/gen.py": "",
        "scripts/more.py": "", "scripts/extra.py": "",
    })  # fmt: skip
    assert paths == (
        "mypkg/version.py", "scripts/extra.py", "scripts/gen.py", "scripts/more.py", "setup.py",
        "src/mypkg/__init__.py", "src/mypkg/_build.py",
        "src/mypkg/_helpers.py", "tools/buildtool.py",
    )  # fmt: skip
    assert is_build_code("./src/mypkg/_build.py", paths) and not is_build_code("src/mypkg/core.py", paths)


def test_a_setup_py_that_does_not_parse_is_read_line_by_line(tmp_path: Path) -> None:
    paths = found(tmp_path, {
        "setup.py": "print 'python 2'\nimport version_tool\nfrom helpers.sub import (thing,\n  other)\n"
                    "execfile('pkg/about.py')\n",
        "version_tool.py": "", "helpers/__init__.py": "", "helpers/sub.py": "", "pkg/about.py": "",
        "calc.py": "",
    })  # fmt: skip
    assert paths == ("helpers/__init__.py", "helpers/sub.py", "pkg/about.py", "setup.py", "version_tool.py")


def test_hatch_hooks_by_default_name_and_by_their_path(tmp_path: Path) -> None:
    default = found(tmp_path / "default", {
        "pyproject.toml": '[build-system]\nbuild-backend = "hatchling.build"\n[tool.hatch.build.hooks.custom]\n',
        "hatch_build.py": "from _hooks import common\n", "_hooks/__init__.py": "", "_hooks/common.py": "",
    })  # fmt: skip
    assert default == ("_hooks/__init__.py", "_hooks/common.py", "hatch_build.py")
    custom = found(tmp_path / "custom", {
        "pyproject.toml": (
            '[tool.hatch.build.targets.wheel.hooks.custom]\npath = "build/wheel_hook.py"\n'
            '[tool.hatch.metadata.hooks.custom]\npath = "build/meta.py"\n'
            '[tool.hatch.version]\nsource = "code"\npath = "src/pkg/__about__.py"\n'
        ),
        "build/wheel_hook.py": "", "build/meta.py": "", "src/pkg/__about__.py": "", "hatch_build.py": "",
    })  # fmt: skip
    assert custom == ("build/meta.py", "build/wheel_hook.py", "src/pkg/__about__.py")


def test_pdm_setuptools_and_poetry_hooks(tmp_path: Path) -> None:
    paths = found(tmp_path, {
        "pyproject.toml": (
            '[tool.pdm.build]\nis-purelib = true\n'
            '[tool.setuptools.cmdclass]\nbuild_py = "buildsupport.commands.BuildPy"\n'
            '[tool.setuptools.dynamic]\nversion = {attr = "pkg.about.__version__"}\n'
            '[tool.poetry.build]\nscript = "poetry_build.py"\n'
        ),
        "pdm_build.py": "", "buildsupport/__init__.py": "", "buildsupport/commands.py": "",
        "src/pkg/__init__.py": "", "src/pkg/about.py": "", "poetry_build.py": "", "other.py": "",
    })  # fmt: skip
    assert paths == (
        "buildsupport/__init__.py", "buildsupport/commands.py", "pdm_build.py", "poetry_build.py",
        "src/pkg/__init__.py", "src/pkg/about.py",
    )  # fmt: skip
    cfg = found(tmp_path / "cfg", {
        "setup.cfg": "[options]\ncmdclass =\n    build_py = mycmds.BuildPy\n[metadata]\nversion = attr: ver.V\n",
        "mycmds.py": "", "ver.py": "",
    })  # fmt: skip
    assert cfg == ("mycmds.py", "ver.py")


def test_local_path_dependencies_give_their_build_files_and_their_build_code(tmp_path: Path) -> None:
    paths = found(tmp_path, {
        "pyproject.toml": (
            '[project]\nname = "app"\ndependencies = ["attrs", "lib-a @ file:./libs/a"]\n'
            '[tool.uv.sources]\nlib-b = { path = "libs/b", editable = true }\nremote = { git = "https://x/y" }\n'
            '[tool.poetry.dependencies]\nlib-c = { path = "../outside" }\n'
        ),
        "libs/a/pyproject.toml": '[project]\nname = "lib-a"\n', "libs/a/a.py": "",
        "libs/b/setup.py": "import b_build\n", "libs/b/b_build.py": "", "libs/b/b.py": "",
        "requirements-dev.txt": "-r requirements/more.txt\n-e ./libs/d  # editable\npytest>=8\n",
        "requirements/more.txt": "./libs/e[extra]\ngit+https://example.com/x.git\n",
        "libs/d/setup.cfg": "[metadata]\nname = d\n", "libs/e/setup.py": "",
        "ci/reqs.txt": "file:libs/f\n", "libs/f/pyproject.toml": "",
    })  # fmt: skip
    assert paths == (
        "libs/a/pyproject.toml", "libs/b/b_build.py", "libs/b/setup.py", "libs/d/setup.cfg", "libs/e/setup.py",
    )  # fmt: skip
    # A requirement file the caller lists (the patch evidence lists every one of git's tree) is read too.
    listed = found(tmp_path, {}, requirement_files=("ci/reqs.txt",))
    assert "libs/f/pyproject.toml" in listed


def test_symlinks_and_non_regular_files_read_as_absent(tmp_path: Path) -> None:
    root = tree(tmp_path / "repo", {"real_setup.py": "import helpers\n", "helpers.py": "", "pyproject.toml": ""})
    (tmp_path / "outside.py").write_text("")
    os.symlink("real_setup.py", root / "setup.py")
    os.symlink(tmp_path, root / "linked")
    os.mkfifo(root / "fifo.py")
    read = read_from_folder(root)
    assert build_code_paths(read) == ()
    assert read("setup.py") is None and read("linked/outside.py") is None and read("fifo.py") is None
    assert read("../outside.py") is None and read("/etc/hostname") is None and read(".git/config") is None
    assert read("real_setup.py") == "import helpers\n" and read("./helpers.py") == ""
    (root / "big.py").write_bytes(b"#" * (MAX_DECLARATION_BYTES + 1))
    assert read("big.py") is None


def test_the_walk_is_bounded_in_depth_and_in_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    chain = {f"m{n}.py": f"import m{n + 1}\n" for n in range(12)}
    paths = found(tmp_path / "deep", {"setup.py": "import m1\n", **chain})
    assert paths == tuple(sorted(["setup.py", *(f"m{n}.py" for n in range(1, build_code.MAX_WALK_DEPTH + 1))]))
    wide = {"setup.py": "".join(f"import w{n}\n" for n in range(300)), **{f"w{n}.py": "" for n in range(300)}}
    assert len(found(tmp_path / "wide", wide)) == build_code.MAX_WALK_FILES
    asked: list[str] = []
    monkeypatch.setattr(build_code, "MAX_LOOKUPS", 50)
    reader = read_from_folder(tmp_path / "wide")
    build_code_paths(lambda path: asked.append(path) or reader(path))
    assert len(asked) == 50


def test_hostile_python_costs_a_bounded_read(tmp_path: Path) -> None:
    """A `/` chain deeper than CPython's parser takes, a null byte: read by lines, never a crash."""
    deep = "x = a" + ' / "p"' * 5000 + "\nimport helper\n"
    assert found(tmp_path / "deep", {"setup.py": deep, "helper.py": ""}) == ("helper.py", "setup.py")
    assert found(tmp_path / "nul", {"setup.py": "import helper\n\0", "helper.py": ""}) == ("helper.py", "setup.py")
    chain = "x = open(here" + ' / "a"' * 900 + ' / "v.py")\n'  # parses; its pieces are read boundedly
    assert found(tmp_path / "chain", {"setup.py": chain, "v.py": ""}) == ("setup.py", "v.py")


def test_nothing_to_build_reads_a_handful_of_paths(tmp_path: Path) -> None:
    asked: list[str] = []
    reader = read_from_folder(tree(tmp_path, {"calc.py": "", "README.md": ""}))
    assert build_code_paths(lambda path: asked.append(path) or reader(path)) == ()
    assert len(asked) < 20 and "calc.py" not in asked
