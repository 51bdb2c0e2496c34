"""What a Python checkout declares about its test environment, read as text only.

Nothing here runs the repository's code: `setup.py` is searched with a bounded regex, the rest is
parsed (TOML, INI). The result is a `Plan`: what the setup phase installs into a fresh virtual
environment, and the human-readable lines saying where each part came from. Where the detection
guesses wrong, `.frogfix.yml`'s `environment:` replaces a part (see `Overrides`).

The rules, in one place (docs/ENVIRONMENTS.md repeats them for operators):
- the project itself, editable, when it has a build (a `[build-system]`, `[project]` or
  `[tool.poetry]` table, a setup.py or a setup.cfg), so a src/ layout imports the checkout's code;
- its extras and PEP 735 dependency groups named for tests (`test`, `tests`, `testing`); where
  none is, those named for development (`dev`, `develop`, `development`);
- Poetry's dev dependencies (`[tool.poetry.dev-dependencies]`, `[tool.poetry.group.<test or dev>]`),
  less linters and formatters, which no test imports;
- requirements files (`requirements*.txt`, `requirements/*.txt`) for tests, else the plain ones
  (never docs, lint or typing ones);
- tox.ini's `[testenv]` deps and extras;
- `uv.lock` and `poetry.lock` pin what they lock (as constraints: they never add a package);
- the test runner: `pytest` when the test command runs pytest and nothing above names it.
"""

from __future__ import annotations

import ast
import configparser
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from worker.environment.readiness import runs_pytest

TEST_NAMES = ("test", "tests", "testing")
DEV_NAMES = ("dev", "develop", "development")
# Development tools no test imports: left out of Poetry's dev dependencies (a repository that
# needs one in its tests names it under `environment: packages` in .frogfix.yml).
NOT_FOR_TESTS = frozenset(
    {
        "black", "mypy", "flake8", "isort", "pylint", "ruff", "pre-commit", "codespell", "doc8", "tox", "nox",
        "twine", "bandit", "pyright", "pydocstyle", "pycodestyle", "autopep8", "yapf", "commitizen", "asv",
        "sphinx", "mkdocs", "ipython", "ipdb", "bump2version", "bumpversion", "poetry", "pip", "uv",
    }
)
# Requirement files whose name says they are for these are never installed.
SKIPPED_REQUIREMENTS = ("doc", "docs", "lint", "mypy", "typing", "types", "release", "publish", "bench", "style")
MAX_DECLARATION_BYTES = 2 * 1024**2  # a dependency file larger than this is not read
# Files whose content decides the environment: the cache key hashes them, a patch changing one is flagged.
DEPENDENCY_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "tox.ini", "uv.lock", "poetry.lock")
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_SETUP_EXTRAS = re.compile(r"extras_require\s*=\s*(?:dict\s*\(|\{)(?P<body>.{0,20000}?)(?:\}\s*[,)]|\)\s*,)", re.S)
EXTRA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # an extra's or a dependency group's name
_SETUP_KEY = re.compile(r"""['"]([A-Za-z0-9][A-Za-z0-9._-]*)['"]\s*:|\b([A-Za-z_][A-Za-z0-9_]*)\s*=\s*\[""")


class DeclarationError(ValueError):
    """A dependency file FrogFix must read is unreadable; the message names it."""


@dataclass(frozen=True)
class Overrides:
    """`.frogfix.yml` `environment:`: each given key replaces what detection found for it.

    `extras` and `groups` name the project's extras and PEP 735 groups; `requirements` names
    requirement files; `packages` adds requirement strings; `project: false` leaves the project
    itself uninstalled (a repository that is not a package).
    """

    extras: tuple[str, ...] | None = None
    groups: tuple[str, ...] | None = None
    requirements: tuple[str, ...] | None = None
    packages: tuple[str, ...] = ()
    project: bool | None = None


@dataclass(frozen=True)
class Plan:
    """What the setup phase installs, and why; JSON-able, and part of the cache key."""

    project: bool
    extras: tuple[str, ...] = ()
    requirements: tuple[str, ...] = ()  # requirement strings
    requirement_files: tuple[str, ...] = ()  # repository-relative, read by the installer inside the sandbox
    constraints: tuple[str, ...] = ()  # name==version pins from a lock file
    dist_name: str | None = None  # the project's distribution name, where declared statically
    detected: tuple[str, ...] = ()  # "where each part came from", for people
    inputs: tuple[str, ...] = field(default=())  # the files read, for the cache key

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def install_args(self) -> list[str]:
        """The installer's arguments (uv pip install / pip install), relative to the checkout."""
        args: list[str] = []
        for path in self.requirement_files:
            args += ["-r", path]
        if self.project:
            args += ["-e", "." + (f"[{','.join(self.extras)}]" if self.extras else "")]
        return args


def is_python(workspace: Path) -> bool:
    """Whether the checkout is a Python project FrogFix builds an environment for."""
    names = ("pyproject.toml", "setup.py", "setup.cfg", "tox.ini", "requirements.txt")
    return any(_regular(workspace / name) for name in names) or bool(_requirement_files(workspace))


@dataclass(frozen=True)
class _Declarations:
    """The checkout's declaration files, parsed once for every step of `plan_for`."""

    pyproject: dict[str, Any]
    project: dict[str, Any]  # pyproject.toml's [project]
    poetry: dict[str, Any]  # pyproject.toml's [tool.poetry]
    setup_cfg: configparser.RawConfigParser
    tox: configparser.RawConfigParser

    @classmethod
    def read(cls, workspace: Path) -> _Declarations:
        pyproject = _toml(workspace, "pyproject.toml")
        poetry = _table(_table(pyproject, "tool"), "poetry")
        setup_cfg = _ini(workspace, "setup.cfg")
        return cls(pyproject, _table(pyproject, "project"), poetry, setup_cfg, _ini(workspace, "tox.ini"))

    def has_build(self, workspace: Path) -> bool:
        """Whether the checkout is a package its installer can build (and so install, editable)."""
        tables = bool(self.pyproject.get("build-system") or self.project or self.poetry)
        return tables or any(_regular(workspace / name) for name in ("setup.py", "setup.cfg"))


@dataclass
class _Draft:
    """The plan as `plan_for`'s steps gather it; `detected` says where each part came from, in their order."""

    project: bool
    inputs: list[str]
    extras: list[str] = field(default_factory=list)
    requirements: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    detected: list[str] = field(default_factory=list)


def plan_for(workspace: Path, test_command: str | None, overrides: Overrides | None = None) -> Plan:
    """The environment the checkout at `workspace` declares, with `.frogfix.yml`'s overrides applied."""
    o = overrides or Overrides()
    inputs = [name for name in DEPENDENCY_FILES if _regular(workspace / name)]
    declared = _Declarations.read(workspace)
    draft = _Draft(project=declared.has_build(workspace) if o.project is None else o.project, inputs=inputs)
    if draft.project:
        draft.detected.append("the project itself, editable (`-e .`)")
    _add_extras(workspace, declared, o, draft)
    _add_groups(declared, o, draft)
    _add_requirement_files(workspace, declared, o, draft)
    draft.requirements += list(o.packages)
    if o.packages:
        draft.detected.append(f"packages from .frogfix.yml: {', '.join(o.packages)}")
    constraints = _lock_pins(workspace, "uv.lock") or _lock_pins(workspace, "poetry.lock")
    if constraints:
        lock = "uv.lock" if _regular(workspace / "uv.lock") else "poetry.lock"
        draft.detected.append(f"{lock} pins {len(constraints)} packages (as constraints)")
    if test_command and runs_pytest(test_command):
        _add_pytest(workspace, declared, draft)
    return Plan(
        project=draft.project,
        extras=tuple(dict.fromkeys(draft.extras)),
        requirements=tuple(dict.fromkeys(draft.requirements)),
        requirement_files=tuple(draft.files),
        constraints=tuple(constraints),
        dist_name=_dist_name(declared.project, declared.poetry, declared.setup_cfg),
        detected=tuple(draft.detected),
        inputs=tuple(draft.inputs),
    )


def _add_extras(workspace: Path, declared: _Declarations, o: Overrides, draft: _Draft) -> None:
    """The project's extras: `.frogfix.yml`'s, else those named for tests (or dev) and tox.ini's."""
    if o.extras is not None:
        draft.extras = list(o.extras)
        draft.detected.append(f"extras from .frogfix.yml: {', '.join(draft.extras) or '(none)'}")
        return
    if not draft.project:
        return
    offered = _offered_extras(workspace, declared.project, declared.poetry, declared.setup_cfg)
    draft.extras = _chosen(offered)
    if draft.extras:
        draft.detected.append(f"extras {', '.join(draft.extras)} ({offered[draft.extras[0]]})")
    # tox installs these for its test run, offered where FrogFix can see it or not (uv warns of an unknown one).
    tox_extras = [e for e in _tox_list(declared.tox, "extras") if EXTRA_NAME.fullmatch(e) and e not in draft.extras]
    if tox_extras:
        draft.extras += tox_extras
        draft.detected.append(f"extras {', '.join(tox_extras)} (tox.ini [testenv] extras)")


def _add_groups(declared: _Declarations, o: Overrides, draft: _Draft) -> None:
    """PEP 735 dependency groups (`.frogfix.yml`'s, else those named for tests or dev) and Poetry's dev ones."""
    groups_table = _table(declared.pyproject, "dependency-groups")
    groups = list(o.groups) if o.groups is not None else _chosen({name: "" for name in groups_table})
    for group in groups:
        found = _group(groups_table, group, set())
        draft.requirements += found
        origin = ".frogfix.yml" if o.groups is not None else "pyproject.toml [dependency-groups]"
        draft.detected.append(f"dependency group {group} ({origin}): {len(found)} requirements")
    poetry_deps = _poetry_dev(declared.poetry)
    if poetry_deps:
        draft.requirements += poetry_deps
        draft.detected.append(f"Poetry dev dependencies: {', '.join(_names(poetry_deps))}")


def _add_requirement_files(workspace: Path, declared: _Declarations, o: Overrides, draft: _Draft) -> None:
    """Requirement files (`.frogfix.yml`'s, which must exist, else those for tests) and tox.ini's deps."""
    if o.requirements is not None:
        files = [path for path in o.requirements if _regular(workspace / path)]
        missing = sorted(set(o.requirements) - set(files))
        if missing:
            raise DeclarationError(f".frogfix.yml environment.requirements names missing files: {', '.join(missing)}")
    else:
        files = _chosen_requirement_files(workspace)
    if files:
        draft.detected.append(f"requirement files {', '.join(files)}")
    draft.inputs += [path for path in files if path not in draft.inputs]
    tox_deps, tox_files = _tox_deps(workspace, declared.tox)
    tox_deps = [d for d in tox_deps if _names([d]) and _names([d])[0] not in NOT_FOR_TESTS]
    tox_files = [path for path in tox_files if path not in files]
    if tox_deps or tox_files:
        draft.requirements += tox_deps
        files += tox_files
        draft.inputs += [path for path in tox_files if path not in draft.inputs]
        draft.detected.append(f"tox.ini [testenv] deps: {', '.join(_names(tox_deps) + tox_files)}")
    draft.files = files


def _add_pytest(workspace: Path, declared: _Declarations, draft: _Draft) -> None:
    """`pytest`, unpinned, for a test command that runs it: the resolver meets what the declarations say of it,
    and it is there even when the declaration that names it was not chosen (an extra named for something else)."""
    named = _names(draft.requirements) + _names(_project_deps(declared.project, draft.extras))
    named += _names(_requirement_file_lines(workspace, draft.files))
    if "pytest" not in named:
        draft.detected.append("pytest (the test command runs it; nothing chosen above declares it)")
    if "pytest" not in _names(draft.requirements):
        draft.requirements.append("pytest")


def dependency_paths(workspace: Path) -> list[str]:
    """Every file whose change can change the environment: the fixed names and the requirement files."""
    return [name for name in DEPENDENCY_FILES if (workspace / name).exists()] + _requirement_files(workspace)


def is_dependency_file(path: str) -> bool:
    """Whether a changed path (repository-relative) is one the environment is built from."""
    return path in DEPENDENCY_FILES or _is_requirement_path(path)


# -- reading ------------------------------------------------------------------------------------


def _table(data: Any, key: str) -> dict[str, Any]:
    """`data[key]` when it is a table, else an empty one: a repository's TOML may hold anything."""
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, dict) else {}


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def _read(workspace: Path, name: str) -> str | None:
    path = workspace / name
    if not _regular(path) or not path.resolve().is_relative_to(workspace.resolve()):
        return None
    if path.stat().st_size > MAX_DECLARATION_BYTES:
        limit = MAX_DECLARATION_BYTES // 1024**2
        raise DeclarationError(f"{name} is larger than {limit} MiB; FrogFix does not read it")
    return path.read_text(encoding="utf-8", errors="replace")


def _toml(workspace: Path, name: str) -> dict[str, Any]:
    text = _read(workspace, name)
    if text is None:
        return {}
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DeclarationError(f"{name} is not valid TOML: {exc}") from exc


def _ini(workspace: Path, name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False)
    text = _read(workspace, name)
    if text is not None:
        try:
            parser.read_string(text, source=name)
        except configparser.Error as exc:
            raise DeclarationError(f"{name} cannot be read as INI: {exc}") from exc
    return parser


def _chosen(offered: dict[str, str]) -> list[str]:
    """The names for tests; failing that, the names for development."""
    for wanted in (TEST_NAMES, DEV_NAMES):
        names = [name for name in offered if name.lower() in wanted]
        if names:
            return names
    return []


def _offered_extras(
    workspace: Path, project: dict[str, Any], poetry: dict[str, Any], setup_cfg: configparser.RawConfigParser
) -> dict[str, str]:
    """Every extra the project offers, with where it is declared."""
    offered: dict[str, str] = {}
    optional = project.get("optional-dependencies")
    if isinstance(optional, dict):
        offered.update({str(name): "pyproject.toml [project.optional-dependencies]" for name in optional})
    if isinstance(poetry.get("extras"), dict):
        offered.update({str(name): "pyproject.toml [tool.poetry.extras]" for name in poetry["extras"]})
    if setup_cfg.has_section("options.extras_require"):
        offered.update({name: "setup.cfg [options.extras_require]" for name in setup_cfg["options.extras_require"]})
    text = _read(workspace, "setup.py")
    if text:
        for name in setup_py_extras(text):
            offered.setdefault(name, "setup.py extras_require")
    return offered


def setup_py_extras(text: str) -> list[str]:
    """The extras a setup.py offers, read with `ast` (never run): `extras_require=` as a dict literal,
    `dict(...)`, or a module-level name bound to one (and keys it is given later, `EXTRAS["x"] = ...`).
    A setup.py Python cannot parse falls back to a bounded regex over `extras_require={...}`."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError):
        match = _SETUP_EXTRAS.search(text)
        found = _SETUP_KEY.findall(match.group("body")) if match else []
        return list(dict.fromkeys(quoted or keyword for quoted, keyword in found))
    bound: dict[str, list[str]] = {}
    for statement in tree.body:
        targets: list[ast.expr] = []
        if isinstance(statement, ast.Assign):
            targets = statement.targets
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            targets = [statement.target]
        value = getattr(statement, "value", None)
        for target in targets:
            if isinstance(target, ast.Name) and value is not None:
                bound[target.id] = _dict_keys(value, bound)
            elif isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                key = target.slice
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    bound.setdefault(target.value.id, []).append(key.value)
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _called(node) in ("setup", "setuptools.setup"):
            for keyword in node.keywords:
                if keyword.arg == "extras_require":
                    names += _dict_keys(keyword.value, bound)
    return list(dict.fromkeys(name for name in names if EXTRA_NAME.fullmatch(name)))


def _called(call: ast.Call) -> str:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


def _dict_keys(value: ast.expr, bound: dict[str, list[str]]) -> list[str]:
    """The string keys of a dict literal, `dict(...)` call, a name bound to one, or `{**a, **b}` of those."""
    if isinstance(value, ast.Name):
        return list(bound.get(value.id, []))
    if isinstance(value, ast.Dict):
        keys: list[str] = []
        for key, item in zip(value.keys, value.values, strict=True):
            if key is None:
                keys += _dict_keys(item, bound)  # {**other}
            elif isinstance(key, ast.Constant) and isinstance(key.value, str):
                keys.append(key.value)
        return keys
    if isinstance(value, ast.Call) and _called(value) == "dict":
        keys = [k.arg for k in value.keywords if k.arg]
        for keyword in value.keywords:
            if keyword.arg is None:  # dict(**other)
                keys += _dict_keys(keyword.value, bound)
        for arg in value.args:
            keys += _dict_keys(arg, bound)
        return keys
    return []


def _group(table: dict[str, Any], name: str, seen: set[str]) -> list[str]:
    """A PEP 735 group's requirement strings, its `{include-group = ...}` entries followed (once each)."""
    if name in seen:
        return []
    seen.add(name)
    found: list[str] = []
    for item in table.get(name) or []:
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict) and isinstance(item.get("include-group"), str):
            found += _group(table, item["include-group"], seen)
    return found


def _poetry_dev(poetry: dict[str, Any]) -> list[str]:
    """Poetry's test or dev dependencies as PEP 508 strings, less the tools no test imports."""
    tables: list[dict[str, Any]] = []
    if isinstance(poetry.get("dev-dependencies"), dict):
        tables.append(poetry["dev-dependencies"])
    groups = _table(poetry, "group")
    for name in _chosen({str(n): "" for n in groups}):
        deps = _table(groups[name], "dependencies")
        if deps:
            tables.append(deps)
    found: list[str] = []
    for table in tables:
        for name, spec in table.items():
            if name.lower() == "python" or _normal(name) in NOT_FOR_TESTS:
                continue
            found.append(name + _poetry_version(spec))
    return found


def _poetry_version(spec: Any) -> str:
    """Poetry's `^1.2`, `~1.2`, `>=1,<2`, `*` or a table's `version` as a PEP 440 specifier."""
    if isinstance(spec, dict):
        spec = spec.get("version", "*")
    if not isinstance(spec, str):
        return ""
    spec = spec.strip()
    if spec in ("", "*"):
        return ""
    for lead in ("^", "~"):
        if spec.startswith(lead) and not spec.startswith("~="):
            parts = [int(p) for p in re.findall(r"\d+", spec)[:3]] or [0]
            if lead == "^":
                index = next((i for i, p in enumerate(parts) if p), len(parts) - 1)
            else:
                index = min(1, len(parts) - 1) if len(parts) > 1 else 0
            upper = [*parts[:index], parts[index] + 1]
            return f">={'.'.join(map(str, parts))},<{'.'.join(map(str, upper))}"
    return spec if spec[0] in "<>=!~" else f"=={spec}"


def _project_deps(project: dict[str, Any], extras: list[str]) -> list[str]:
    found = [d for d in project.get("dependencies") or [] if isinstance(d, str)]
    optional = _table(project, "optional-dependencies")
    for extra in extras:
        found += [d for d in optional.get(extra) or [] if isinstance(d, str)]
    return found


def _requirement_files(workspace: Path) -> list[str]:
    found = sorted(p.name for p in workspace.glob("requirements*.txt") if _regular(p))
    folder = workspace / "requirements"
    if folder.is_dir() and not folder.is_symlink():
        found += sorted(f"requirements/{p.name}" for p in folder.glob("*.txt") if _regular(p))
    return found


def _is_requirement_path(path: str) -> bool:
    return bool(re.fullmatch(r"requirements[^/]*\.txt|requirements/[^/]+\.txt", path))


def _chosen_requirement_files(workspace: Path) -> list[str]:
    """Test requirement files where there are some (they usually include the plain ones), else the plain ones."""
    candidates = _requirement_files(workspace)

    def words(path: str) -> set[str]:
        return set(re.split(r"[^a-z]+", Path(path).stem.lower()))

    kept = [p for p in candidates if not words(p) & set(SKIPPED_REQUIREMENTS)]
    tests = [p for p in kept if words(p) & {*TEST_NAMES, "ci"}]
    return tests or [p for p in kept if not words(p) & set(DEV_NAMES)] or kept


def _requirement_file_lines(workspace: Path, files: list[str]) -> list[str]:
    lines: list[str] = []
    for path in files:
        text = _read(workspace, path) or ""
        lines += [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith(("#", "-"))]
    return lines


def _tox_value(tox: configparser.RawConfigParser, key: str) -> str:
    """`[testenv]`'s `key`, its `{[section]key}` references to other sections replaced (three deep)."""
    if not tox.has_option("testenv", key):
        return ""
    text = tox.get("testenv", key)

    def substituted(match: re.Match[str]) -> str:
        section, name = match.group(1), match.group(2)
        return tox.get(section, name) if tox.has_option(section, name) else match.group(0)

    for _ in range(3):
        text = re.sub(r"\{\[([^\]{}]+)\]([\w-]+)\}", substituted, text)
    return text


def _tox_list(tox: configparser.RawConfigParser, key: str) -> list[str]:
    items = re.split(r"[\s,]+", _tox_value(tox, key))
    return [item for item in items if item and "{" not in item and ":" not in item]


def _tox_deps(workspace: Path, tox: configparser.RawConfigParser) -> tuple[list[str], list[str]]:
    """tox.ini `[testenv] deps`: requirement strings, and the requirement files it names with `-r`.

    Lines conditional on a factor (`py38: foo`) and substitutions other than `{toxinidir}` are
    left out: they name environments FrogFix does not run.
    """
    deps: list[str] = []
    files: list[str] = []
    for raw in _tox_value(tox, "deps").splitlines():
        line = raw.split(" #", 1)[0].strip().replace("{toxinidir}/", "")
        if not line or line.startswith("#") or "{" in line or re.match(r"^[\w,!-]+\s*:", line):
            continue
        if line.startswith("-r"):
            path = line[2:].strip()
            if _regular(workspace / path) and (workspace / path).resolve().is_relative_to(workspace.resolve()):
                files.append(path)
        elif not line.startswith("-"):
            deps.append(line)
    return deps, files


def _lock_pins(workspace: Path, name: str) -> list[str]:
    """`name==version` for every package the lock pins to one version (the project itself left out)."""
    lock = _toml(workspace, name)
    versions: dict[str, set[str]] = {}
    for package in lock.get("package") or []:
        if not isinstance(package, dict) or not isinstance(package.get("name"), str):
            continue
        source = package.get("source")
        if isinstance(source, dict) and ({"editable", "virtual", "directory", "path"} & set(source)):
            continue
        if isinstance(package.get("version"), str):
            versions.setdefault(_normal(package["name"]), set()).add(package["version"])
    return [f"{n}=={next(iter(v))}" for n, v in sorted(versions.items()) if len(v) == 1]


def _dist_name(project: dict[str, Any], poetry: dict[str, Any], setup_cfg: configparser.RawConfigParser) -> str | None:
    for value in (project.get("name"), poetry.get("name")):
        if isinstance(value, str) and value.strip():
            return value.strip()
    if setup_cfg.has_option("metadata", "name"):
        return setup_cfg.get("metadata", "name").strip() or None
    return None


def _setup_py_mentions(workspace: Path, name: str) -> bool:
    text = _read(workspace, "setup.py") or ""
    return re.search(rf"""['"]{re.escape(name)}\b""", text) is not None


def _names(requirements: list[str]) -> list[str]:
    names = []
    for item in requirements:
        match = _NAME.match(item)
        if match:
            names.append(_normal(match.group(1)))
    return names


def _normal(name: str) -> str:
    """PEP 503's normalised name."""
    return re.sub(r"[-_.]+", "-", name).lower()
