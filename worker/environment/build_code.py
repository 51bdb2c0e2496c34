"""Build code: the files of a checkout that installing it runs, found by reading them as text only.

Installing a repository runs more of it than its dependency files declare:
- `setup.py`, the checkout modules it imports (from the root, `src/` and any folder it puts on
  `sys.path`), and the `.py` files it names in a string (`exec(open("pkg/version.py").read())`);
- an in-tree PEP 517 backend (`[build-system] backend-path`) and what it imports from those folders;
- build hooks and code-run metadata: hatch's custom hooks (`hatch_build.py` or their `path`) and
  `[tool.hatch.version] source = "code"`, PDM's `pdm_build.py`, setuptools `cmdclass` and `attr:`
  modules (pyproject or setup.cfg), Poetry's build script;
- local path dependencies (`-e ./sub`, `file:` URLs, Poetry's and uv's `path =`): their `setup.py`,
  `pyproject.toml` and `setup.cfg`, and their own build code by these same rules.
Each module found is followed to the checkout modules it imports, in a bounded walk
(MAX_WALK_FILES files, MAX_WALK_DEPTH imports deep; past that a file is not found).

Why: a patch that rewrites one of these changes the environment its tests ran in as surely as a
changed dependency file (an attacker's patch once rewrote an in-tree `backend.py` unflagged), so
`review_flags` flags it (`PatchEvidence.build_code`) and the environment's cache hashes it. Nothing
here imports or runs a file: `ast`, `tomllib`, `configparser` and regexes read them. Reading too
much costs a reviewer one more flag; reading too little hides a change, so names are resolved
generously (every import that names a file of the checkout counts, even one Python would not reach).
"""

from __future__ import annotations

import ast
import configparser
import os
import posixpath
import re
import stat
import tomllib
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

from worker.environment.declared import MAX_DECLARATION_BYTES

# A repository-relative regular file's text; None when absent, not a regular file or too large.
Read = Callable[[str], str | None]

MAX_WALK_FILES = 200  # files one walk (from setup.py, a backend, the hooks) reaches
MAX_WALK_DEPTH = 8  # imports followed from a walk's first files
MAX_LOCAL_PROJECTS = 8  # local path dependencies read, besides the repository's own project
MAX_LOOKUPS = 20_000  # times one `build_code_paths` may call `read` (each path is asked once)
MAX_REQUIREMENT_FILES = 64  # requirement files read, `-r` includes followed
PROJECT_FILES = ("setup.py", "pyproject.toml", "setup.cfg")  # a local path dependency's build files
# Requirement files read when the caller lists none (a `read` cannot list a folder); `-r` includes are followed.
COMMON_REQUIREMENTS = (
    "requirements.txt", "requirements-dev.txt", "requirements-test.txt", "requirements-tests.txt",
    "requirements_dev.txt", "requirements_test.txt", "requirements/base.txt", "requirements/dev.txt",
    "requirements/test.txt", "requirements/tests.txt",
)  # fmt: skip
_DOTTED = re.compile(r"[A-Za-z_][\w.]*")
_IMPORT_LINE = re.compile(r"^[ \t]*import[ \t]+([\w. \t,]+)", re.M)
_FROM_LINE = re.compile(r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+\(?([\w \t,]+)", re.M)
_SYS_PATH_CALL = re.compile(r"\bpath\.(?:insert|append)\(([^)\n]{0,512})\)")
_STRING = re.compile(r"""["']([^"'\n\\]{1,512})["']""")
_NAMED_URL = re.compile(r"^[A-Za-z0-9][\w.-]*\s*(?:\[[^\]]*\])?\s*@\s*(\S+)")
_EDITABLE = re.compile(r"^(?:-e|--editable)(?:\s*=\s*|\s*)")
_INCLUDE = re.compile(r"^(?:-r|--requirement|-c|--constraint)(?:\s*=\s*|\s+)(\S+)")
_ROOT_VARIABLES = ("${PROJECT_ROOT}/", "{toxinidir}/", "{root}/")
_MAX_PIECE_NODES = 32
_ARCHIVES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")


def build_code_paths(read: Read, requirement_files: Iterable[str] = ()) -> tuple[str, ...]:
    """Repository-relative paths of the files the project's own install executes (see the module), sorted, unique.

    `read(path)` gives a repository-relative regular file's text or None (a checkout folder:
    `read_from_folder`; or git's objects); only paths it gives text for are returned. It is asked
    at most MAX_LOOKUPS times. `requirement_files`: the checkout's requirement files when
    the caller can list them (besides COMMON_REQUIREMENTS and the files their `-r` lines name).
    """
    files = _Files(read)
    found: set[str] = set()
    projects, seen = deque([""]), {""}
    while projects:
        folder = projects.popleft()
        own, local = _project(files, folder, tuple(requirement_files) if folder == "" else ())
        found |= own
        for sub in local:
            present = [path for name in PROJECT_FILES if (path := _join(sub, name)) and files.exists(path)]
            found.update(present)
            if present and sub not in seen and len(seen) <= MAX_LOCAL_PROJECTS:
                seen.add(sub)
                projects.append(sub)
    return tuple(sorted(found))


def resolution_inputs(read: Read, requirement_files: Iterable[str] = ()) -> tuple[str, ...]:
    """Files besides the declarations and the build code that resolving the project's dependencies reads,
    for the environment's key: requirement files and their `-r`/`-c` includes, setuptools' `file`
    metadata (pyproject's `[tool.setuptools.dynamic]`, setup.cfg's `file:`), and every existing file a
    string in setup.py names (`open("requirements.txt")`). Sorted, unique, bounded like the rest."""
    files = _Files(read)
    found = {name for name, _ in _requirement_files_read(files, [*requirement_files, *COMMON_REQUIREMENTS])}
    named: list[str] = []
    dynamic = _table(_table(_table(_toml(files.text("pyproject.toml")), "tool"), "setuptools"), "dynamic")
    for value in dynamic.values():
        given = value.get("file") if isinstance(value, dict) else None
        named += [given] if isinstance(given, str) else [f for f in given or [] if isinstance(f, str)]
    cfg = _ini(files.text("setup.cfg"))
    for section in cfg.sections():
        for _, value in cfg.items(section):
            if value.strip().startswith("file:"):
                named += [part.strip() for part in value.strip()[5:].split(",")]
    named += _STRING.findall(files.text("setup.py") or "")
    for name in named[:MAX_WALK_FILES]:
        path = _join("", name) if name and not name.startswith("/") else None
        if path is not None and files.exists(path):
            found.add(path)
    return tuple(sorted(found))


def is_build_code(path: str, build_paths: Iterable[str]) -> bool:
    """Whether a changed path (repository-relative) is among `build_paths` (from `build_code_paths`)."""
    return posixpath.normpath(path) in set(build_paths)


def read_from_folder(root: Path) -> Read:
    """A `read` over a checkout folder: a regular file's text (UTF-8, undecodable bytes replaced), or None
    for a path that leaves `root`, passes a symlink or `.git`, is no regular file, or is larger than
    MAX_DECLARATION_BYTES."""
    base = Path(os.path.realpath(root))

    def read(path: str) -> str | None:
        relative = _inside(path)
        if relative is None or relative.split("/")[0] == ".git":
            return None
        target = base / relative
        if os.path.realpath(target) != str(target):  # a symlink on the way, or the file is one
            return None
        try:
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_DECLARATION_BYTES:  # a folder, a FIFO, too large
            os.close(fd)
            return None
        with os.fdopen(fd, "rb") as handle:
            data = handle.read(MAX_DECLARATION_BYTES + 1)
        return None if len(data) > MAX_DECLARATION_BYTES else data.decode("utf-8", "replace")

    return read


# -- one project: the repository's own, or a local path dependency's ---------------------------------


def _project(files: _Files, folder: str, requirement_files: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """The build code of the project in `folder` ("" for the root), and the folders of its local path dependencies."""
    pyproject = _toml(files.text(_join(folder, "pyproject.toml")))
    cfg = _ini(files.text(_join(folder, "setup.cfg")))
    tool = _table(pyproject, "tool")
    setuptools = _table(tool, "setuptools")
    package_dirs = [_join(folder, d) for d in _table(setuptools, "package-dir").values() if isinstance(d, str)]
    roots = _folders([folder, _join(folder, "src"), *package_dirs])
    found: set[str] = set()
    setup = files.module(_join(folder, "setup.py"))
    if setup is not None:
        extra = _folders(_join(folder, p) for p in setup.sys_paths)
        found |= _walk(files, [_join(folder, "setup.py")], _folders([*roots, *extra]))
    system = _table(pyproject, "build-system")
    backend, backend_path = system.get("build-backend"), system.get("backend-path")
    if isinstance(backend, str) and isinstance(backend_path, list):
        folders = _folders(_join(folder, p) for p in backend_path if isinstance(p, str))
        name = backend.partition(":")[0].strip()
        found |= _walk(files, [c for f in folders for c in _module_files(f, name)], folders)
    scripts, modules = _hooks(pyproject, cfg)
    starts = [_join(folder, s) for s in scripts] + [c for m in modules for r in roots for c in _module_files(r, m)]
    found |= _walk(files, starts, roots)
    lines = _declared_requirements(pyproject, cfg, setup)
    local = {p for line in lines if (p := _local_path(line, folder)) is not None} | _path_sources(tool, folder)
    if folder == "":
        local |= _requirement_file_paths(files, (*COMMON_REQUIREMENTS, *requirement_files))
        local |= {p for line in _tox_deps(files.text("tox.ini")) if (p := _local_path(line, "")) is not None}
    return found, local - {"", folder}  # the root project is read already


def _folders(folders: Iterable[str | None]) -> tuple[str, ...]:
    """The folders inside the checkout ("" is its root), each once, in order."""
    return tuple(dict.fromkeys(f for f in folders if f is not None))


def _hooks(pyproject: dict[str, Any], cfg: configparser.RawConfigParser) -> tuple[list[str], list[str]]:
    """Build hooks' files (relative to the project) and modules (dotted) that the build backends load."""
    tool = _table(pyproject, "tool")
    scripts, modules = [], []
    hatch = _table(tool, "hatch")
    build, metadata = _table(hatch, "build"), _table(hatch, "metadata")
    targets = [_table(build, "hooks")] + [_table(t, "hooks") for t in _table(build, "targets").values()]
    for hooks in [*targets, _table(metadata, "hooks")]:
        if "custom" in hooks:
            path = _table(hooks, "custom").get("path", "hatch_build.py")
            scripts.append(path if isinstance(path, str) else "hatch_build.py")
    version = _table(hatch, "version")
    if version.get("source") == "code" and isinstance(version.get("path"), str):
        scripts.append(version["path"])
    pdm = _table(tool, "pdm")
    backend = _table(pyproject, "build-system").get("build-backend")
    if pdm or (isinstance(backend, str) and backend.startswith("pdm")):
        hook = _table(pdm, "build").get("custom-hook", "pdm_build.py")
        scripts.append(hook if isinstance(hook, str) else "pdm_build.py")
        getter = _table(pdm, "version").get("getter")
        if _table(pdm, "version").get("source") == "call" and isinstance(getter, str):
            modules.append(getter.partition(":")[0].strip())
    setuptools = _table(tool, "setuptools")
    modules += [v.partition(":")[0] for v in _table(setuptools, "cmdclass").values() if isinstance(v, str)]
    for value in _table(setuptools, "dynamic").values():
        if isinstance(value, dict) and isinstance(value.get("attr"), str):
            modules.append(value["attr"])
    if cfg.has_option("options", "cmdclass"):
        modules += [line.partition("=")[2].strip() for line in cfg.get("options", "cmdclass").splitlines()]
    for section, key in (("metadata", "version"), ("metadata", "long_description")):
        value = cfg.get(section, key, fallback="").strip()
        if value.startswith("attr:"):
            modules.append(value.removeprefix("attr:").strip())
    poetry = _table(tool, "poetry")
    for build_value in (poetry.get("build"), _table(poetry, "build").get("script")):
        if isinstance(build_value, str):
            scripts.append(build_value)
        elif isinstance(build_value, dict) and isinstance(build_value.get("script"), str):
            scripts.append(build_value["script"])
    return scripts, [m for m in modules if _DOTTED.fullmatch(m)]


# -- the walk over imports -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Module:
    """What one Python file may load: imported names, `.py` files it names, folders it puts on sys.path."""

    imports: tuple[tuple[int, str], ...] = ()  # (relative import level, dotted name)
    files: tuple[str, ...] = ()  # string literals (or joined pieces) ending in .py
    sys_paths: tuple[str, ...] = ()
    requirements: tuple[str, ...] = ()  # string literals that are `file:` requirements


class _Files:
    """`read`, asked at most MAX_LOOKUPS times: whether a path exists, each Python file's `_Module` (no text kept)."""

    def __init__(self, read: Read) -> None:
        self._read = read
        self._asked = 0
        self._modules: dict[str, _Module | None] = {}
        self._exists: dict[str, bool] = {}

    def text(self, path: str | None) -> str | None:
        relative = _inside(path) if path else None
        if not relative or self._asked >= MAX_LOOKUPS:
            return None
        self._asked += 1
        text = self._read(relative)
        self._exists[relative] = text is not None
        return text

    def exists(self, path: str) -> bool:
        if path.endswith(".py"):
            return self.module(path) is not None
        return self._exists[path] if path in self._exists else self.text(path) is not None

    def module(self, path: str | None) -> _Module | None:
        relative = _inside(path) if path else None
        if not relative:
            return None
        if relative not in self._modules:
            text = self.text(relative)
            self._modules[relative] = None if text is None else _parse(text)
        return self._modules[relative]


def _walk(files: _Files, starts: Iterable[str | None], roots: tuple[str, ...]) -> set[str]:
    """The files of `starts` that exist and the checkout modules they import (resolved under `roots`), breadth first."""
    found: set[str] = set()
    queue = deque((path, 0) for path in dict.fromkeys(p for p in starts if p))
    while queue and len(found) < MAX_WALK_FILES:
        path, depth = queue.popleft()
        module = files.module(path)
        if path in found or module is None:
            continue
        found.add(path)
        if depth < MAX_WALK_DEPTH:
            more = [c for c in _references(path, module, roots) if c not in found and files.module(c) is not None]
            queue.extend((c, depth + 1) for c in more)
    return found


def _references(path: str, module: _Module, roots: tuple[str, ...]) -> list[str]:
    """The files `module` (at `path`) may load: each import's modules and packages under `roots`, named `.py` files."""
    here = posixpath.dirname(path)
    found: list[str] = []
    for level, name in module.imports:
        if level:
            package = here
            for _ in range(level - 1):
                package = posixpath.dirname(package)
            found += _module_files(package, name)
        else:
            found += [c for root in roots for c in _module_files(root, name)]
    named = [name.lstrip("/") for name in module.files]  # `dirname(__file__) + "/pkg/version.py"`
    found += [c for name in named for c in (_join("", name), _join(here, name)) if c]
    return list(dict.fromkeys(found))


def _module_files(folder: str, dotted: str) -> list[str]:
    """`a.b.c` under `folder`: a.py, a/__init__.py, a/b.py, ... a/b/c/__init__.py (a package's __init__ runs too)."""
    parts = [p for p in dotted.split(".") if p]
    files: list[str | None] = [_join(folder, "__init__.py")] if not parts else []
    for n in range(1, len(parts) + 1):
        stem = "/".join(parts[:n])
        files += [_join(folder, stem + ".py"), _join(folder, stem + "/__init__.py")]
    return [f for f in files if f]


def _parse(text: str) -> _Module:
    """What a Python file may load, from its syntax tree; from its lines when it does not parse (newer syntax)."""
    text = text.removeprefix("\ufeff")
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # a null byte, nesting deeper than CPython's own
        return _scan(text)
    imports: list[tuple[int, str]] = []
    strings: list[str] = []
    sys_paths: list[str] = []
    inner: set[int] = set()  # the `/`s inside a `/` chain: its top one reads the whole chain
    for node in ast.walk(tree):  # parents before children
        if _is_div(node):
            inner.update(id(child) for child in (node.left, node.right) if _is_div(child))
            if id(node) in inner:
                continue
        if isinstance(node, ast.Import):
            imports += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            imports.append((node.level, base))
            imports += [(node.level, f"{base}.{a.name}" if base else a.name) for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) <= 4096:
            strings.append(node.value)
        elif isinstance(node, ast.Call | ast.BinOp):
            pieces = _pieces(node)
            if len(pieces) > 1:
                strings.append("/".join(pieces))
            if isinstance(node, ast.Call) and _is_sys_path_call(node):
                sys_paths += [*_pieces(node.args[-1]), "/".join(_pieces(node.args[-1]))]
            if isinstance(node, ast.Call) and _callee(node) in ("import_module", "__import__", "run_module"):
                imports += [(0, p) for p in pieces[:1] if _DOTTED.fullmatch(p)]
    return _module(imports, strings, sys_paths)


def _scan(text: str) -> _Module:
    """`_parse`'s fallback: `import x` / `from x import y` lines and quoted strings, by regex."""
    imports: list[tuple[int, str]] = []
    for match in _IMPORT_LINE.finditer(text):
        imports += [(0, part.split()[0]) for part in match[1].split(",") if part.split()]
    for match in _FROM_LINE.finditer(text):
        level, base = len(match[1]), match[2]
        imports.append((level, base))
        names = [part.split()[0] for part in match[3].split(",") if part.split()]
        imports += [(level, f"{base}.{name}" if base else name) for name in names]
    sys_paths = [s for call in _SYS_PATH_CALL.finditer(text) for s in _STRING.findall(call[1])]
    return _module(imports, _STRING.findall(text), sys_paths)


def _module(imports: list[tuple[int, str]], strings: list[str], sys_paths: list[str]) -> _Module:
    return _Module(
        imports=tuple(dict.fromkeys((level, name) for level, name in imports if not name or _DOTTED.fullmatch(name))),
        files=tuple(dict.fromkeys(s for s in strings if s.endswith(".py"))),
        sys_paths=tuple(dict.fromkeys(p for s in sys_paths if (p := _inside(s)) is not None)),
        requirements=tuple(dict.fromkeys(s for s in strings if "file:" in s and len(s) <= 1024)),
    )


def _pieces(node: ast.AST) -> list[str]:
    """The string literals of a call's arguments or a `/` chain, in source order: `join(here, "pkg", "v.py")`.

    Iterative, and at most _MAX_PIECE_NODES nodes are looked at: a path is a few pieces, and a
    hostile file's chain of thousands of `/` costs no more."""
    found: list[str] = []
    stack = [node]
    for _ in range(_MAX_PIECE_NODES):
        if not stack:
            break
        item = stack.pop()
        if isinstance(item, ast.Constant) and isinstance(item.value, str):
            found.append(item.value)
        elif _is_div(item):
            stack += [item.right, item.left]
        elif isinstance(item, ast.Call):
            stack += reversed(item.args)
    return found


def _is_div(node: ast.AST) -> TypeGuard[ast.BinOp]:
    return isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)


def _callee(call: ast.Call) -> str:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _is_sys_path_call(call: ast.Call) -> bool:
    """`sys.path.insert(…, x)`, `sys.path.append(x)` (or `path.…` after `from sys import path`)."""
    func = call.func
    if not (isinstance(func, ast.Attribute) and func.attr in ("insert", "append") and call.args):
        return False
    owner = func.value
    return (isinstance(owner, ast.Attribute) and owner.attr == "path") or (
        isinstance(owner, ast.Name) and owner.id == "path"
    )


# -- local path dependencies ----------------------------------------------------------------------


def _declared_requirements(
    pyproject: dict[str, Any], cfg: configparser.RawConfigParser, setup: _Module | None
) -> list[str]:
    """Requirement strings of the pyproject's and setup.cfg's tables, and setup.py's `file:` strings."""
    project = _table(pyproject, "project")
    lists: list[Any] = [_table(pyproject, "build-system").get("requires"), project.get("dependencies")]
    lists += list(_table(project, "optional-dependencies").values())
    lists += list(_table(pyproject, "dependency-groups").values())
    lists += list(_table(_table(_table(pyproject, "tool"), "pdm"), "dev-dependencies").values())
    lines = [item for value in lists if isinstance(value, list) for item in value if isinstance(item, str)]
    for key in ("install_requires", "setup_requires", "tests_require"):
        lines += cfg.get("options", key, fallback="").splitlines()
    if cfg.has_section("options.extras_require"):
        lines += [line for _, value in cfg.items("options.extras_require") for line in value.splitlines()]
    return lines + list(setup.requirements if setup is not None else ())


def _path_sources(tool: dict[str, Any], folder: str) -> set[str]:
    """Folders named by `path =` in Poetry's dependency tables and uv's sources (relative to the project)."""
    poetry = _table(tool, "poetry")
    tables = [_table(poetry, "dependencies"), _table(poetry, "dev-dependencies"), _table(_table(tool, "uv"), "sources")]
    tables += [_table(group, "dependencies") for group in _table(poetry, "group").values() if isinstance(group, dict)]
    found = set()
    for table in tables:
        for value in table.values():
            for entry in value if isinstance(value, list) else [value]:
                path = entry.get("path") if isinstance(entry, dict) else None
                if isinstance(path, str) and (local := _join(folder, path)) is not None:
                    found.add(local)
    return found


def _requirement_file_paths(files: _Files, names: Iterable[str]) -> set[str]:
    """Local paths the requirement files name (relative to the root, or to the file), `-r`/`-c` includes followed."""
    found: set[str] = set()
    for name, lines in _requirement_files_read(files, names):
        for line in lines:
            for base in dict.fromkeys(("", posixpath.dirname(name))):
                if (path := _local_path(line, base)) is not None:
                    found.add(path)
    return found


def _requirement_files_read(files: _Files, names: Iterable[str]) -> Iterator[tuple[str, list[str]]]:
    """Each requirement file that reads, with its lines (comments cut) but its `-r`/`-c` includes, which are
    followed instead (relative to the including file; at most MAX_REQUIREMENT_FILES files)."""
    queue: deque[str | None] = deque(names)
    seen: set[str] = set()
    while queue and len(seen) < MAX_REQUIREMENT_FILES:
        name = queue.popleft()
        if name is None or name in seen:
            continue
        seen.add(name)
        text = files.text(name)
        if text is None:
            continue
        lines = []
        for line in text.splitlines():
            line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].strip()
            if included := _INCLUDE.match(line):
                queue.append(_join(posixpath.dirname(name), included[1]))
            else:
                lines.append(line)
        yield name, lines


def _tox_deps(text: str | None) -> list[str]:
    """tox.ini's `deps` lines of every `[testenv…]` section."""
    cfg = _ini(text)
    sections = [s for s in cfg.sections() if s.startswith("testenv")]
    return [line for s in sections for line in cfg.get(s, "deps", fallback="").splitlines()]


def _local_path(requirement: str, folder: str) -> str | None:
    """The checkout folder a requirement installs from (`-e ./sub`, `./sub`, `name @ file:sub`, `file:///${PROJECT_ROOT}/sub`),
    relative to the root; None for a package name, a remote URL, an archive or a path out of the checkout."""
    text = _EDITABLE.sub("", requirement.strip(), count=1).strip()
    if not text or text.startswith("-"):
        return None
    if named := _NAMED_URL.match(text):
        text = named[1]
    text = text.split(";", 1)[0].split("#", 1)[0].strip()
    if text.startswith("file:"):
        text = text.removeprefix("file:")
        text = re.sub(r"^/*(?=\$\{PROJECT_ROOT\})", "", text)
    elif "://" in text or not (text.startswith((".", "{", "$")) or "/" in text):
        return None
    for variable in _ROOT_VARIABLES:  # the project's own folder
        text = "./" + text.removeprefix(variable) if text.startswith(variable) else text
    text = re.sub(r"\[[^\]]*\]$", "", text)
    if text.startswith("/") or text.endswith(_ARCHIVES):
        return None
    return _join(folder, text)


# -- reading ---------------------------------------------------------------------------------------


def _inside(path: str) -> str | None:
    """`path` normalized, when it stays inside the checkout (relative, no `..` out); None otherwise."""
    if "\0" in path or path.startswith("/"):
        return None
    normal = posixpath.normpath(path)
    if normal == ".." or normal.startswith("../"):
        return None
    return "" if normal == "." else normal


def _join(folder: str, name: str) -> str | None:
    """`name` under `folder`, normalized ("" for the checkout itself); None when it leaves the checkout."""
    return _inside(posixpath.join(folder, name))


def _table(data: Any, key: str) -> dict[str, Any]:
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def _toml(text: str | None) -> dict[str, Any]:
    try:
        return tomllib.loads(text) if text else {}
    except tomllib.TOMLDecodeError:
        return {}  # unreadable: the environment's own reading (declared.py) says so


def _ini(text: str | None) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    if text:
        try:
            parser.read_string(text)
        except configparser.Error:
            return configparser.RawConfigParser(strict=False, interpolation=None)
    return parser
