#!/usr/bin/env python3
"""bench/environment: what a task's test environment costs FrogFix cold, and cached.

For each realrepos task (../shared/fixtures/realrepos; all six unless --tasks), against a real
password-protected package mirror on loopback (tests/realrepos/mirror.py, filled once and cached
outside the repo), this runs `manage.py fix --json` with a model double that answers at once with
no patch, so the run's cost is FrogFix's own, and reads `environment.seconds`:
  - cold: a fresh data dir and workspace dir (nothing cached);
  - warm: the same dirs again, --warm times (the median is kept): the environment of the mirror's
    packages comes from FrogFix's cache, and the project's own install (its build code, offline,
    into the job's own layer) runs again, as it does in every job.
Prints per task the cold and warm seconds, warm/cold and what the project's own install took in
the warm runs, then the overall ratio (sum of warm over sum of cold, measured in this same run)
against the target: a warm job's environment costs at most a quarter of a cold one's.
The figures are FrogFix's reported `environment.seconds`; the whole `fix` wall time is printed
beside them. (When worker.environment.builder.build_environment is exposed, the same loop can
call it directly and drop the base-test run from the wall time.)

JavaScript (../shared/fixtures/realrepos-js): the same loop against a real Verdaccio on loopback as the
company's npm mirror (tests/npm_registry.py), for one task by default (--js-tasks picks others; `none` skips).
A JavaScript environment has no per-job install of the project, so its warm cost is the cache's alone.

Usage: python bench/environment.py [--tasks humanize-naturaldate-tz,rich-prompt-markup]
       [--js-tasks d3-format-prefix-parens] [--warm 3] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.doubles.openai_server import ScriptedOpenAIServer  # noqa: E402
from tests.realrepos import FIXTURES, Task, load_tasks, run_fix  # noqa: E402
from tests.realrepos.fix_double import no_patch_script  # noqa: E402
from tests.realrepos.js_tasks import JS_FIXTURES, load_js_tasks  # noqa: E402
from tests.realrepos.mirror import PackageMirror, filled_cache  # noqa: E402

TARGET = 0.25  # warm environment seconds (the project's own install included) / cold environment seconds
JS_DEFAULT = "d3-format-prefix-parens"
PASSWORD = "bench-mirror-password-not-secret"


@dataclass
class Measured:
    """One task's environment figures from `fix --json`, or why there are none."""

    task: str
    cold: float | None = None
    warm: list[float] = field(default_factory=list)
    cold_wall: float = 0.0
    warm_wall: list[float] = field(default_factory=list)
    project: list[float] = field(default_factory=list)  # the project's own install in each warm run
    cached_flags: list[bool] = field(default_factory=list)
    error: str | None = None

    @property
    def warm_median(self) -> float | None:
        return statistics.median(self.warm) if self.warm else None


def environment_seconds(repo: Path, issue: Path, dirs: Path, mirror: dict[str, str]) -> tuple[dict[str, Any], float]:
    """One `fix` run; its `environment` object and the run's wall seconds. `mirror`: run_fix's mirror argument."""
    started = time.perf_counter()
    with ScriptedOpenAIServer(no_patch_script()) as model:
        proc, out = run_fix(repo, issue, data_dir=dirs / "data", workspace_dir=dirs / "workspaces",
                            model_url=model.base_url, **mirror)
    wall = time.perf_counter() - started
    if out is None:
        raise RuntimeError(f"fix printed no JSON (exit {proc.returncode}): {proc.stderr[-1500:]}")
    environment = out.get("environment") or {}
    if not environment.get("ok"):
        raise RuntimeError(f"environment not built: {environment.get('reason') or out.get('status')}")
    return environment, wall


def measure(task: Task, base: Path, mirror: dict[str, str], warm_runs: int) -> Measured:
    """Cold once in fresh dirs, then warm `warm_runs` times in the same dirs."""
    result = Measured(task.name)
    dirs = base / task.name
    for folder in (dirs, dirs / "data", dirs / "workspaces", dirs / "work"):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o711)  # the sandbox's unprivileged uid must traverse them
    repo = task.unpack(dirs / "work" / "repo")
    issue = dirs / "work" / "issue.md"
    issue.write_text(task.issue_text)
    try:
        cold, result.cold_wall = environment_seconds(repo, issue, dirs, mirror)
        result.cold = float(cold["seconds"])
        result.cached_flags.append(bool(cold.get("cached")))
        for _ in range(warm_runs):
            warm, wall = environment_seconds(repo, issue, dirs, mirror)
            result.warm.append(float(warm["seconds"]))
            result.project.append(float(warm.get("project_seconds") or 0.0))
            result.warm_wall.append(wall)
            result.cached_flags.append(bool(warm.get("cached")))
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        result.error = str(exc)
    return result


def report(results: list[Measured]) -> None:
    print(f"{'task':28} {'cold s':>8} {'warm s':>8} {'warm/cold':>10} {'own install s':>14} "
          f"{'fix wall cold/warm s':>22}  cached")
    for r in results:
        if r.cold is None or r.warm_median is None:
            print(f"{r.task:28} {'-':>8} {'-':>8} {'-':>10} {'':>14} {'':>22}  error: {r.error}")
            continue
        ratio = r.warm_median / r.cold if r.cold else float("inf")
        walls = f"{r.cold_wall:.1f} / {statistics.median(r.warm_wall):.1f}"
        flags = "".join("y" if f else "n" for f in r.cached_flags)
        own = statistics.median(r.project) if r.project else 0.0
        print(f"{r.task:28} {r.cold:8.2f} {r.warm_median:8.2f} {ratio:9.1%} {own:14.2f} {walls:>22}  {flags}"
              + (f"  error: {r.error}" if r.error else ""))
    done = [r for r in results if r.cold and r.warm_median is not None]
    if not done:
        print("overall: nothing measured")
        return
    overall = sum(r.warm_median or 0.0 for r in done) / sum(r.cold or 0.0 for r in done)
    verdict = "met" if overall <= TARGET else "NOT met"
    print(f"overall warm/cold over {len(done)} task(s): {overall:.1%}  (target <= {TARGET:.0%}: {verdict})")
    print("cached column: first run, then each warm run (y = fix reported environment.cached)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--tasks", default="", help="comma-separated Python task names (default: all six; none: skip)")
    parser.add_argument("--js-tasks", default=JS_DEFAULT, help=f"JavaScript tasks (default: {JS_DEFAULT}; none: skip)")
    parser.add_argument("--warm", type=int, default=3, help="cached runs per task (the median is reported)")
    parser.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="frogfix-bench-env-"))
    base.chmod(0o711)
    try:
        results = [] if args.tasks == "none" else python_results(args.tasks, base, args.warm)
        if args.js_tasks != "none":
            results += javascript_results(args.js_tasks, base, args.warm)
        report(results)
    finally:
        if args.keep:
            print(f"folder: {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)


def chosen_tasks(tasks: list[Task], names: str) -> list[Task]:
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = set(wanted) - {t.name for t in tasks}
    if unknown:
        sys.exit(f"unknown task(s): {', '.join(sorted(unknown))}; known: {', '.join(t.name for t in tasks)}")
    return [t for t in tasks if not wanted or t.name in wanted]


def python_results(names: str, base: Path, warm: int) -> list[Measured]:
    if not (FIXTURES / "MANIFEST.json").is_file():
        sys.exit(f"realrepos fixtures not found at {FIXTURES}")
    tasks = load_tasks()
    chosen = chosen_tasks(tasks, names)
    started = time.perf_counter()
    packages = filled_cache(tasks)  # all six, like the tests: one cache folder whichever run
    print(f"mirror: {packages} (ready in {time.perf_counter() - started:.1f} s)")
    results = []
    with PackageMirror(packages, PASSWORD) as mirror:
        for task in chosen:
            results.append(measure(task, base, {"index_url": mirror.url_with_credentials}, warm))
            print(f"  measured {task.name}", flush=True)
    return results


def javascript_results(names: str, base: Path, warm: int) -> list[Measured]:
    from tests.npm_registry import Verdaccio

    if not (JS_FIXTURES / "MANIFEST.json").is_file():
        sys.exit(f"realrepos-js fixtures not found at {JS_FIXTURES}")
    chosen = chosen_tasks(list(load_js_tasks()), names)
    folder = base / "verdaccio"
    folder.mkdir()
    registry = Verdaccio(folder).start()
    print(f"npm mirror: Verdaccio on {registry.plain_url}")
    try:
        results = []
        for task in chosen:
            results.append(measure(task, base, {"npm_registry_url": registry.url}, warm))
            print(f"  measured {task.name}", flush=True)
        return results
    finally:
        registry.stop()

if __name__ == "__main__":
    main()
