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
