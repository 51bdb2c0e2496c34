"""The imports of app/, worker/ and sandbox/ run one way: no circle, and the packages' rules hold.

Every import counts, a function's lazy one too: an import put inside a function to dodge a circle
is still a circle. `from package import module` is an import of that module, not of the package's
`__init__` alone (which Python also runs, but which imports nothing back here).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "worker", "sandbox")
MAX_LINES = 800
# Shipped as one file into the sandbox, whose Python imports nothing of FrogFix (see its docstring).
LONGER_ALLOWED = {"sandbox/runner.py"}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


MODULES = modules()


def _known(name: str) -> str | None:
    """The module of ours `name` is, or the nearest package of ours above it; None for anything else."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """(the module of ours imported, line) for every import in `module`, at any depth of its code."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from x import y`: the module x.y when there is one, else x itself.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            found = _known(target)
            if found is not None and found != module:
                yield found, node.lineno


GRAPH = {module: sorted({target for target, _ in imports_of(module)}) for module in MODULES}


def cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work: list[tuple[str, int]] = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            edges = graph[node]
            if child < len(edges):
                work.append((node, child + 1))
                nxt = edges[child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            for succ in edges:
                if succ in on_stack:
                    low[node] = min(low[node], low[succ])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_checker_finds_a_circle_it_is_shown() -> None:
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]
    assert cycles({"a": ["b"], "b": [], "c": ["a", "b"]}) == []


def test_the_imports_form_no_circle() -> None:
    assert len(MODULES) > 80, "the modules were not found"
    assert cycles(GRAPH) == []


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [("app", "worker"), ("sandbox", "worker"), ("sandbox", "app"), ("worker.leaf", "app.web")],
)
def test_the_packages_rules_hold(importer: str, forbidden: str) -> None:
    """app/ and sandbox/ never import the worker; sandbox/ imports nothing of FrogFix's app; the agent
    loop no web code (the package docstrings say why)."""
    broken = [
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        if module == importer or module.startswith(importer + ".")
        for target in targets
        if target == forbidden or target.startswith(forbidden + ".")
    ]
    assert broken == []


def test_no_module_is_over_800_lines() -> None:
    long = {
        str(path.relative_to(ROOT)): n
        for path in MODULES.values()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert {k: v for k, v in long.items() if k not in LONGER_ALLOWED} == {}
    for allowed in LONGER_ALLOWED:
        assert "one file" in (ROOT / allowed).read_text(encoding="utf-8")[:3000], f"{allowed} says why it is long"


# What app/forge may import of ours beside itself: the redactor, and the retry policy (which imports
# only app/logs.py, structlog's set-up, which imports only the redactor).
FORGE_MAY_IMPORT = {"app.redaction", "app.retrying", "app.logs"}


def test_the_forge_imports_only_the_redactor_and_the_retry_policy() -> None:
    reached: set[str] = set()
    todo = [m for m in GRAPH if m == "app.forge" or m.startswith("app.forge.")]
    while todo:
        module = todo.pop()
        for target in GRAPH[module]:
            if target not in reached and not target.startswith("app.forge"):
                reached.add(target)
                todo.append(target)
    assert reached <= FORGE_MAY_IMPORT, sorted(reached - FORGE_MAY_IMPORT)


# worker/'s rooms from the bottom up: a room may import the rooms before it, never one after it
# (worker/__init__.py and each room's docstring say what it holds). The entries (the Celery
# tasks, the embedded worker, the command line that is manage.py's body) may import any room;
# no room imports them.
ROOMS = (
    "worker.leaf",
    "worker.git",
    "worker.environment",
    "worker.wiring",
    "worker.attempts",
    "worker.texts",
    "worker.job",
    "worker.commands",
)
ENTRIES = ("worker.tasks", "worker.embedded", "worker.commands.cli")


def is_entry(module: str) -> bool:
    return any(module == entry or module.startswith(entry + ".") for entry in ENTRIES)


def room_of(module: str) -> str | None:
    return next((room for room in ROOMS if module == room or module.startswith(room + ".")), None)


def room_breaches(graph: dict[str, list[str]]) -> list[str]:
    """Each import from a room into a room above it, or from a room into an entry."""
    broken = []
    for module, targets in graph.items():
        here = room_of(module)
        if here is None or is_entry(module):
            continue
        for target in targets:
            there = room_of(target)
            if is_entry(target) or (there is not None and ROOMS.index(there) > ROOMS.index(here)):
                broken.append(f"{module} ({here}) imports {target}")
    return broken


def test_the_room_checker_finds_an_import_upward() -> None:
    made = {
        "worker.git.gitcalls": ["worker.job.pipeline"],
        "worker.attempts.attempt": ["worker.git.gitcalls", "worker.tasks"],
        "worker.job.pipeline": ["worker.attempts.attempt"],
        "worker.commands.cli.service": ["worker.tasks"],  # an entry: it may
        "worker.commands.fix": ["worker.commands.cli.common"],
    }
    assert room_breaches(made) == [
        "worker.git.gitcalls (worker.git) imports worker.job.pipeline",
        "worker.attempts.attempt (worker.attempts) imports worker.tasks",
        "worker.commands.fix (worker.commands) imports worker.commands.cli.common",
    ]


def test_every_worker_module_is_in_a_room_or_an_entry() -> None:
    loose = [m for m in MODULES if m.startswith("worker.") and room_of(m) is None and not is_entry(m)]
    assert loose == []
    for room in ROOMS:
        path = MODULES[room]
        if path.name == "__init__.py":
            assert "Room rule" in (ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""), room


def test_the_rooms_import_one_way() -> None:
    assert room_breaches(GRAPH) == []


# No function over 80 lines outside the sandbox runner (copied whole into sandboxes), and no more
# than 8 over 60: a longer one is several steps that want names.
MAX_FUNCTION_LINES = 80
LONG_FUNCTION_LINES = 60
MAX_LONG_FUNCTIONS = 8
MANAGE_MAX_LINES = 80  # manage.py is a thin entry over worker/commands/cli


def function_lengths(source: str, where: str) -> list[tuple[str, int]]:
    """(where:qualified name, lines from `def` to the last line) of every function, nested ones apart."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = prefix + child.name
                found.append((f"{where}:{name}", (child.end_lineno or child.lineno) - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")

    visit(ast.parse(source), "")
    return found


def size_breaches(lengths: list[tuple[str, int]]) -> list[str]:
    broken = [f"{name} is {n} lines (at most {MAX_FUNCTION_LINES})" for name, n in lengths if n > MAX_FUNCTION_LINES]
    over = sorted(name for name, n in lengths if n > LONG_FUNCTION_LINES)
    if len(over) > MAX_LONG_FUNCTIONS:
        broken.append(f"{len(over)} functions over {LONG_FUNCTION_LINES} lines (at most {MAX_LONG_FUNCTIONS}): {over}")
    return broken


def project_function_lengths() -> list[tuple[str, int]]:
    lengths = function_lengths((ROOT / "manage.py").read_text(encoding="utf-8"), "manage.py")
    for path in MODULES.values():
        where = str(path.relative_to(ROOT))
        if where not in LONGER_ALLOWED:
            lengths += function_lengths(path.read_text(encoding="utf-8"), where)
    return lengths


def test_the_size_checker_finds_a_long_function_and_too_many_long_ones() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(81))
    made = function_lengths(f"class A:\n    def run(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n", "made.py")
    assert made == [("made.py:A.run", 82)]
    assert size_breaches(made) == ["made.py:A.run is 82 lines (at most 80)"]
    nine = [(f"m.py:f{i}", 61) for i in range(9)]
    assert len(size_breaches(nine)) == 1 and "9 functions over 60" in size_breaches(nine)[0]
    assert size_breaches(nine[:8]) == []


def test_no_function_is_over_80_lines_and_few_over_60() -> None:
    assert size_breaches(project_function_lengths()) == []


def manage_breach(text: str) -> str | None:
    lines = len(text.splitlines())
    return f"manage.py is {lines} lines (at most {MANAGE_MAX_LINES})" if lines > MANAGE_MAX_LINES else None


def test_manage_py_is_a_thin_entry() -> None:
    assert manage_breach("x = 1\n" * (MANAGE_MAX_LINES + 1)) == f"manage.py is 81 lines (at most {MANAGE_MAX_LINES})"
    assert manage_breach((ROOT / "manage.py").read_text(encoding="utf-8")) is None
