"""The code's shape, for issue notes: modules and lines per package, the largest modules,
functions over 60 and 80 lines, and the modules of ours that `fix` and the pipeline import.

Run: .venv/bin/python bench/layout.py [--json]. Counts lines as `wc -l` does; a function's
length is its `def` line to its last line (decorators excluded), nested functions counted apart.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("app", "worker", "sandbox")


def module_paths() -> list[Path]:
    found = [ROOT / "manage.py"]
    for package in PACKAGES:
        found.extend(sorted((ROOT / package).rglob("*.py")))
    return found


def functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                out.append((name, (child.end_lineno or child.lineno) - child.lineno + 1))
                visit(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return out


def imported_by(entry: str) -> list[str]:
    """The modules of ours `entry` (a dotted module) imports, transitively, lazy imports included."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_import_graph as graph  # the suite's own reader of imports

    seen: set[str] = set()
    todo = [entry]
    while todo:
        name = todo.pop()
        for target in graph.GRAPH.get(name, []):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return sorted(seen)


def main() -> None:
    per_package: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    sizes: list[tuple[int, str]] = []
    long_functions: list[tuple[int, str]] = []
    for path in module_paths():
        relative = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        package = relative.rpartition("/")[0] or "."
        per_package[package][0] += 1
        per_package[package][1] += lines
        sizes.append((lines, relative))
        if relative == "sandbox/runner.py":
            continue
        for name, length in functions(path):
            if length > 60:
                long_functions.append((length, f"{relative}:{name}"))
    sizes.sort(reverse=True)
    long_functions.sort(reverse=True)
    fix_entry = "worker.commands.fix" if (ROOT / "worker/commands/fix.py").exists() else None
    report = {
        "packages": {name: {"modules": m, "lines": n} for name, (m, n) in sorted(per_package.items())},
        "largest": sizes[:10],
        "over_60": [f for f in long_functions if f[0] <= 80],
        "over_80": [f for f in long_functions if f[0] > 80],
        "manage_py_lines": next(n for n, p in sizes if p == "manage.py"),
    }
    import_entries = {"fix": fix_entry, "pipeline": "worker.job.pipeline"}
    for label, override in (("fix", "FIX_ENTRY"), ("pipeline", "PIPELINE_ENTRY")):
        for arg in sys.argv[1:]:
            if arg.startswith(f"--{label}="):
                import_entries[label] = arg.split("=", 1)[1]
        del override
    for label, entry in import_entries.items():
        if entry:
            report[f"{label}_imports"] = len(imported_by(entry))
            report[f"{label}_direct_imports"] = len(__import__("test_import_graph").GRAPH.get(entry, []))
    if "--json" in sys.argv:
        print(json.dumps(report, indent=2))
        return
    print("| package | modules | lines |\n| --- | ---: | ---: |")
    for name, figures in report["packages"].items():
        print(f"| {name} | {figures['modules']} | {figures['lines']} |")
    print("\nlargest modules:", ", ".join(f"{p} {n}" for n, p in report["largest"]))
    print(f"functions over 80 lines ({len(report['over_80'])}):", ", ".join(f"{p} {n}" for n, p in report["over_80"]))
    print(f"functions over 60 lines ({len(report['over_60'])}):", ", ".join(f"{p} {n}" for n, p in report["over_60"]))
    print("manage.py lines:", report["manage_py_lines"])
    for label in ("fix", "pipeline"):
        if f"{label}_imports" in report:
            direct, every = report[f"{label}_direct_imports"], report[f"{label}_imports"]
            print(f"{label}: imports {direct} modules of ours directly, {every} in all")


if __name__ == "__main__":
    main()
