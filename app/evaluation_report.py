"""An evaluation's report: the figures (solve rate, pass@k, gained and lost tasks, human agreement) and its
Markdown form. The CLI, `--json` and the dashboard all read `build_report`, so they never disagree.

Definitions (stated in the report too):
- an attempt is *solved* when its patch was verified exactly as the pipeline verifies one;
- solve rate = solved attempts / finished attempts, with a Wilson 95% interval;
- pass@k per task is the unbiased estimator 1 - C(n-c, k) / C(n, k) (n finished attempts, c solved),
  averaged over tasks, with a 95% percentile bootstrap interval over tasks (fixed seed, so reruns agree);
- the candidate *solves a task* when at least one of its attempts is solved (pass@K's event);
- chosen@k per task is the share of the task's attempts' k-subsets (every one, or a fixed-seed sample of
  SUBSETS when there are more) whose attempt chosen by the selection rule (app/selection.py `choose`) is
  solved, averaged over tasks like pass@k (so chosen@1 = pass@1 and chosen@k <= pass@k). Eval runs no
  cross-check between attempts (the `cross` map is empty), so attempts agree only when neither adds a
  reproduction test and both make the same tests pass. While *solved* is the attempt's own evidence, which
  the rule ranks first, chosen@k equals pass@k; it parts from it once solved is judged otherwise;
- the recorded run solved a task when the job ended `done` (a `fix` job: `fixed`) after the n attempts it
  made (the pipeline runs up to FROGFIX_ATTEMPTS and stops at the first verified one): pass@n, frozen per task;
- like with like: gained = the candidate solved it within the recorded run's n attempts, the recorded run did
  not; lost = the recorded run solved it, the candidate solved none of at least n attempts; a task that
  differs with unequal budgets is listed as not comparable (so `--fail-if-lost` never blames a shorter budget);
- an attempt that could never run (project or commit gone) is `unrunnable`: out of every rate, listed apart;
- each task runs under its recorded job's Leaf limits where the trajectory saved them, else today's settings
  (`limits.source`), and the report counts which.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.selection import Candidate, choose
from app.statuses import AttemptOutcome, EvidenceLevel

UNRUNNABLE = "unrunnable"  # an attempt's outcome when its task can never run (recorded with the reason)
Z95 = 1.959963984540054
BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 16
SUBSETS = 256  # chosen@k: every k-subset of a task's attempts up to this many, else a fixed-seed sample this size
REGRESSIONS_KEPT = 100  # an eval result keeps this many regression names: the rule reads only whether there are any


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a proportion; None for no trials."""
    if n <= 0:
        return None
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n attempts with c solved: 1 - C(n-c, k) / C(n, k)."""
    if k <= 0 or n < k:
        raise ValueError(f"pass@{k} needs at least {k} attempts, not {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def bootstrap_mean(values: Sequence[float], seed: int = BOOTSTRAP_SEED) -> tuple[float, float] | None:
    """95% percentile bootstrap interval of the mean, resampling tasks with a fixed seed."""
    if not values:
        return None
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(BOOTSTRAP_SAMPLES))
    return means[int(0.025 * (BOOTSTRAP_SAMPLES - 1))], means[math.ceil(0.975 * (BOOTSTRAP_SAMPLES - 1))]


@dataclass(frozen=True)
class Figure:
    """A rate with its interval and how it was computed."""

    value: float | None
    interval: tuple[float, float] | None
    method: str

    def to_dict(self) -> dict[str, Any]:
        interval = [round(x, 4) for x in self.interval] if self.interval else None
        return {"value": None if self.value is None else round(self.value, 4), "ci95": interval, "method": self.method}

    def text(self) -> str:
        if self.value is None:
            return "n/a"
        ci = f" [{self.interval[0]:.2f}, {self.interval[1]:.2f}]" if self.interval else ""
        return f"{self.value:.2f}{ci}"


def counted(n: int, word: str) -> str:
    """`1 task`, `2 tasks`: counts that read as words, in the report and in eval's progress lines."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def attempt_evidence(
    level: str | None, publishable: bool, fail_to_pass: Iterable[str], pass_to_fail: Iterable[str],
    reproduction: Iterable[str], changed_lines: int,
) -> dict[str, Any]:
    """An eval attempt's evidence as the selection rule reads it (`evaluation_results.evidence`)."""
    return {
        "level": level,
        "publishable": publishable,
        "fail_to_pass": sorted(fail_to_pass),
        "pass_to_fail": sorted(pass_to_fail)[:REGRESSIONS_KEPT],
        "reproduction": sorted(reproduction),
        "changed_lines": changed_lines,
    }


def candidate_of(result: Mapping[str, Any]) -> Candidate:
    """A result as the selection rule sees it. One recorded before eval stored evidence is judged by its verdict
    alone: solved as failed_before, `unproven` as unproven, anything else never published."""
    number = int(result["attempt"])
    evidence = result.get("evidence")
    if isinstance(evidence, Mapping):
        level = evidence.get("level")
        return Candidate(
            number, EvidenceLevel(level) if level in {v.value for v in EvidenceLevel} else None,
            bool(evidence.get("publishable")), frozenset(evidence.get("fail_to_pass") or ()),
            frozenset(evidence.get("pass_to_fail") or ()), frozenset(evidence.get("reproduction") or ()),
            int(evidence.get("changed_lines") or 0),
        )
    if result["solved"]:
        return Candidate(number, EvidenceLevel.failed_before, True)
    if result["outcome"] == AttemptOutcome.unproven:  # every test passes, nothing proven
        return Candidate(number, EvidenceLevel.unproven, True)
    return Candidate(number, None, False)


def chosen_share(key: str, results: Sequence[Mapping[str, Any]], k: int) -> float:
    """How often the attempt the rule chooses among k of the task's attempts is solved: over every k-subset of
    them (in attempt order), or a fixed-seed sample of SUBSETS when there are more. No cross-check runs."""
    candidates = [candidate_of(r) for r in results]
    solved = {c.number: bool(r["solved"]) for c, r in zip(candidates, results, strict=True)}
    n = len(candidates)
    if math.comb(n, k) <= SUBSETS:
        subsets: Iterable[Sequence[Candidate]] = list(itertools.combinations(candidates, k))
    else:
        rng = random.Random(f"{key}:{k}")
        subsets = [[candidates[i] for i in sorted(rng.sample(range(n), k))] for _ in range(SUBSETS)]
    picks = [choose(subset).chosen for subset in subsets]
    return sum(1 for pick in picks if pick is not None and solved[pick]) / len(picks)


def _verdict_row(task: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What gained and lost are judged on: the recorded run's verdict and n, and the candidate's attempts."""
    return {
        "task": task["key"],
        "recorded_solved": bool(task.get("recorded_solved")),
        "recorded_attempts": int(task.get("recorded_attempts") or 1),
        "first_solved_attempt": min((int(r["attempt"]) for r in results if r["solved"]), default=None),
        "finished_attempts": len(results),
    }


def _task_row(task: Mapping[str, Any], results: list[Mapping[str, Any]], k: int) -> dict[str, Any]:
    n = len(results)
    c = sum(1 for r in results if r["solved"])
    prompt = sum(int(r["prompt_tokens"]) for r in results)
    cached = sum(int(r["cached_tokens"]) for r in results)
    verdict = _verdict_row(task, results)
    return {
        "task": task["key"],
        "project": task.get("project", ""),
        "title": task.get("title", ""),
        "recorded_solved": verdict["recorded_solved"],
        "recorded_attempts": verdict["recorded_attempts"],
        "first_solved_attempt": verdict["first_solved_attempt"],
        "human": task.get("human", "unknown"),
        "limits": next((r.get("limits") for r in results if r.get("limits")), None),
        "finished_attempts": n,
        "complete": n >= k,
        "solved_attempts": c,
        "solved": c > 0,
        # The attempt the selection rule would publish among all of the task's finished attempts.
        "chosen_attempt": choose([candidate_of(r) for r in results]).chosen,
        "chosen_by_k": [round(chosen_share(str(task["key"]), results, i), 4) for i in range(1, min(n, k) + 1)],
        "attempts": [
            {
                "attempt": r["attempt"],
                "solved": bool(r["solved"]),
                "outcome": r["outcome"],
                "exit_reason": r["exit_reason"],
                "steps": r["steps"],
                "tokens": int(r["prompt_tokens"]) + int(r["completion_tokens"]),
                "cached_share": round(int(r["cached_tokens"]) / int(r["prompt_tokens"]), 4)
                if r["prompt_tokens"] else None,
                "model_seconds": round(float(r["model_seconds"]), 3),
                "wall_seconds": round(float(r["wall_seconds"]), 3),
                "trajectory": r["trajectory"],
                "reason": r["reason"],
            }
            for r in results
        ],
        "tokens": sum(int(r["prompt_tokens"]) + int(r["completion_tokens"]) for r in results),
        "cached_share": round(cached / prompt, 4) if prompt else None,
        "model_seconds": round(sum(float(r["model_seconds"]) for r in results), 3),
        "wall_seconds": round(sum(float(r["wall_seconds"]) for r in results), 3),
    }


def _pass_figures(rows: list[dict[str, Any]], k_max: int) -> dict[str, Figure]:
    figures: dict[str, Figure] = {}
    for k in range(1, k_max + 1):
        values = [
            pass_at_k(r["finished_attempts"], r["solved_attempts"], k) for r in rows if r["finished_attempts"] >= k
        ]
        mean = sum(values) / len(values) if values else None
        method = f"unbiased estimator, bootstrap 95% over {len(values)} tasks"
        figures[f"pass@{k}"] = Figure(mean, bootstrap_mean(values), method)
    return figures


def _chosen_figures(rows: list[dict[str, Any]], k_max: int) -> dict[str, Figure]:
    figures: dict[str, Figure] = {}
    for k in range(1, k_max + 1):
        values = [r["chosen_by_k"][k - 1] for r in rows if r["finished_attempts"] >= k]
        mean = sum(values) / len(values) if values else None
        method = (f"the selection rule's choice among {k} of a task's attempts, averaged over every {k} of them "
                  f"(no cross-check runs), bootstrap 95% over {len(values)} tasks")
        figures[f"chosen@{k}"] = Figure(mean, bootstrap_mean(values), method)
    return figures


def _human(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Agreement with what humans did with the recorded MRs (read from the forge when the evaluation began)."""
    merged = [r for r in rows if r["human"] == "merged"]
    closed = [r for r in rows if r["human"] == "closed"]
    still_open = sum(1 for r in rows if r["human"] == "open")
    return {
        "merged": len(merged),
        "merged_solved": sum(1 for r in merged if r["solved"]),
        "closed_unmerged": len(closed),
        "closed_unmerged_solved": sum(1 for r in closed if r["solved"]),
        "open": still_open,
        "unknown": len(rows) - len(merged) - len(closed) - still_open,
    }


def _by_task(results: Sequence[Mapping[str, Any]]) -> tuple[dict[str, list[Mapping[str, Any]]], dict[str, str]]:
    """Result rows per task in attempt order, and the tasks with an unrunnable attempt (their first reason)."""
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    unrunnable: dict[str, str] = {}
    for r in sorted(results, key=lambda r: (r["task"], r["attempt"])):
        if r["outcome"] == UNRUNNABLE:
            unrunnable.setdefault(r["task"], r.get("reason") or "")
        else:
            by_task.setdefault(r["task"], []).append(r)
    return by_task, unrunnable


def comparison(evaluation: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Gained, lost and not comparable tasks against the recorded run, exactly as `build_report` judges them, from
    the evaluation's `tasks` and result rows that need only `task`, `attempt`, `solved` and `outcome` (the
    evaluations list shows them without building every report)."""
    by_task, _ = _by_task(results)
    return _compare([_verdict_row(t, by_task[t["key"]]) for t in evaluation["tasks"] if t["key"] in by_task])


def _compare(rows: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Gained, lost and not comparable tasks, each judged with the recorded run's attempt count n."""
    gained: list[str] = []
    lost: list[str] = []
    other: list[str] = []
    for r in rows:
        n, first = r["recorded_attempts"], r["first_solved_attempt"]
        if r["recorded_solved"] and first is None:
            (lost if r["finished_attempts"] >= n else other).append(r["task"])
        elif not r["recorded_solved"] and first is not None:
            (gained if first <= n else other).append(r["task"])
    return {"gained": gained, "lost": lost, "not_comparable": other}


def _recorded_figure(rows: list[dict[str, Any]]) -> Figure:
    recorded = sum(1 for r in rows if r["recorded_solved"])
    counts = sorted({r["recorded_attempts"] for r in rows})
    made = (f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}") if counts else "0"
    return Figure(
        recorded / len(rows) if rows else None, wilson(recorded, len(rows)),
        f"tasks the recorded run solved / tasks, Wilson 95%; the recorded job made {made} "
        f"{'attempt' if made == '1' else 'attempts'} per task and was solved when any verified "
        "(pass@n, n = its attempts)",
    )


def build_report(evaluation: Mapping[str, Any], results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The whole report as one JSON-ready dict, from the evaluation's row and its result rows."""
    k = int(evaluation["attempts"])
    by_task, unrunnable = _by_task(results)
    tasks = [t for t in evaluation["tasks"] if t["key"] in by_task]
    rows = [_task_row(t, by_task[t["key"]], k) for t in tasks]
    finished = sum(r["finished_attempts"] for r in rows)
    solved = sum(r["solved_attempts"] for r in rows)
    candidate_pass = _pass_figures(rows, k)
    candidate_chosen = _chosen_figures(rows, k)
    return {
        "evaluation": evaluation["id"],
        "model": evaluation["model"],
        "base_url": evaluation.get("base_url", ""),
        "selector": evaluation.get("selector", ""),
        "status": evaluation.get("status", ""),
        "attempts_per_task": k,
        "tasks_total": len(evaluation["tasks"]),
        "tasks_evaluated": len(rows),
        "tasks_complete": sum(1 for r in rows if r["complete"]),
        "attempts_finished": finished,
        "attempts_solved": solved,
        "candidate": {
            "solve_rate": Figure(solved / finished if finished else None, wilson(solved, finished),
                                 "solved attempts / attempts, Wilson 95%").to_dict(),
            **{name: f.to_dict() for name, f in candidate_pass.items()},
            **{name: f.to_dict() for name, f in candidate_chosen.items()},
            "tasks_solved": sum(1 for r in rows if r["solved"]),
        },
        "selection": {
            "rule": "app/selection.py",
            "cross_checks": False,  # eval runs none: agreement only from equal fail-to-pass sets
            "chosen_over_pass": _ratio(candidate_chosen[f"chosen@{k}"].value, candidate_pass[f"pass@{k}"].value),
            "attempts_without_evidence": sum(
                1 for rs in by_task.values() for r in rs if not isinstance(r.get("evidence"), Mapping)
            ),
        },
        "recorded": {
            "solve_rate": _recorded_figure(rows).to_dict(),
            "tasks_solved": sum(1 for r in rows if r["recorded_solved"]),
            "attempts": sorted({r["recorded_attempts"] for r in rows}),
        },
        **_compare(rows),
        "unrunnable": [{"task": key, "reason": why} for key, why in unrunnable.items() if key not in by_task],
        "human": _human(rows),
        "limits": {source: sum(1 for r in rows if (r["limits"] or {}).get("source") == source)
                   for source in ("recorded", "settings")},
        "tasks": rows,
    }


def _ratio(part: float | None, whole: float | None) -> float | None:
    return round(part / whole, 4) if part is not None and whole else None


def _figure_text(data: Mapping[str, Any]) -> str:
    ci = data.get("ci95")
    return Figure(data.get("value"), tuple(ci) if ci else None, data.get("method", "")).text()


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def _cell(text: str) -> str:
    """A table cell: a project path is the forge's text, so its pipes and line breaks are neutralised."""
    return text.replace("|", "\\|").replace("\n", " ")[:120]


def _like_with_like(counts: Sequence[int]) -> str:
    """How gained and lost were judged, in plain sentences, with the recorded run's n."""
    if len(counts) == 1:
        n = f"n = {counts[0]}"
        made = f"The recorded run made {counted(counts[0], 'attempt')} per task ({n})"
    else:
        n = "n = the recorded run's attempts on that task"
        made = f"The recorded run made {counts[0]} to {counts[-1]} attempts per task ({n})"
    return (
        f"Compared like with like. {made}, and solved a task when one of its attempts was verified. "
        "Gained: the recorded run did not solve the task, and the candidate did within n attempts. "
        "Lost: the recorded run solved it, and none of the candidate's attempts did, over at least n. "
        "Not comparable: the verdicts differ, but the candidate had fewer than n attempts, or solved it only "
        "after its nth."
    )


def _selection_line(selection: Mapping[str, Any], k: int) -> str:
    """What chosen@k is, in plain sentences, and why eval cannot see the rule miss."""
    ratio = selection.get("chosen_over_pass")
    older = int(selection.get("attempts_without_evidence") or 0)
    return (
        "chosen@k: how often the attempt FrogFix would publish among k of a task's attempts is solved (the rule of "
        "app/selection.py: evidence level, no regressions, agreement, smaller patch), averaged over every k of its "
        f"attempts as pass@k is; chosen@{k} / pass@{k}: {'n/a' if ratio is None else f'{ratio:.2f}'}. "
        "Eval runs no cross-check between attempts, so two attempts agree only when neither adds a reproduction test "
        "and both make the same tests pass. An attempt is solved when its own evidence proves the fix, and the rule "
        "ranks those first, so the chosen attempt is solved whenever one of the k is; how often the rule prefers a "
        "right patch to a wrong one that passes its own tests is bench/selection.py's to measure."
        + (f" Attempts recorded before eval stored their evidence ({older}) are judged by their verdict alone."
           if older else "")
    )


def _limits_line(counts: Mapping[str, int]) -> str:
    recorded, settings = counts.get("recorded", 0), counts.get("settings", 0)
    return (
        f"Limits: {counted(recorded, 'task')} ran under the recorded job's Leaf limits (steps, context and "
        f"completion tokens), {settings} under today's settings (a trajectory saved before FrogFix recorded "
        "them); the time limit is today's FROGFIX_JOB_TIMEOUT_SECONDS."
    )


def to_markdown(report: Mapping[str, Any]) -> str:
    """The report for people: the overall figures, gained and lost tasks, then one row per task."""
    counts = report["recorded"].get("attempts") or [1]  # the recorded run's attempt counts: pass@n only for one n
    lines = [*_figure_lines(report, counts), *_comparison_lines(report, counts), *_task_lines(report)]
    return "\n".join(lines) + "\n"


def _figure_lines(report: Mapping[str, Any], counts: list[int]) -> list[str]:
    """The title, what was evaluated, and the table of the candidate's and the recorded run's rates."""
    k = report["attempts_per_task"]
    cand, rec = report["candidate"], report["recorded"]
    complete = f"all {k} attempts" if k > 1 else "its attempt"
    lines = [
        f"# Evaluation {report['evaluation']}: {report['model']}",
        "",
        f"{report['tasks_evaluated']} of {counted(report['tasks_total'], 'task')} evaluated "
        f"({report['tasks_complete']} with {complete}); "
        f"{report['attempts_solved']} of {counted(report['attempts_finished'], 'attempt')} solved. "
        f"Status: {report['status']}. Selector: `{report['selector'] or '(default)'}`.",
        "",
        "| figure | candidate | recorded run |",
        "|---|---|---|",
        f"| solve rate (Wilson 95%) | {_figure_text(cand['solve_rate'])} | {_figure_text(rec['solve_rate'])} |",
    ]
    for i in range(1, k + 1):
        recorded = _figure_text(rec["solve_rate"]) if counts == [i] else "n/a"
        lines.append(f"| pass@{i} (bootstrap 95%) | {_figure_text(cand[f'pass@{i}'])} | {recorded} |")
        if f"chosen@{i}" in cand:
            lines.append(f"| chosen@{i} (bootstrap 95%) | {_figure_text(cand[f'chosen@{i}'])} | n/a |")
    lines.append(f"| tasks solved | {cand['tasks_solved']} | {rec['tasks_solved']} |")
    return lines


def _comparison_lines(report: Mapping[str, Any], counts: list[int]) -> list[str]:
    """Gained, lost and not comparable tasks, the unrunnable ones, the human verdicts and the limits."""
    other = report.get("not_comparable", [])
    selection = report.get("selection")
    lines = [
        "",
        *([_selection_line(selection, report["attempts_per_task"]), ""] if selection else []),
        f"Gained ({len(report['gained'])}): {', '.join(report['gained']) or 'none'}  ",
        f"Lost ({len(report['lost'])}): {', '.join(report['lost']) or 'none'}  ",
        f"Not comparable ({len(other)}): {', '.join(other) or 'none'}",
        "",
        _like_with_like(counts),
        "",
    ]
    unrunnable = report.get("unrunnable", [])
    if unrunnable:
        lines += [
            *[f"Unrunnable (excluded from every rate): {_cell(u['task'])}: {_cell(u['reason'])}  "
              for u in unrunnable],
            "",
        ]
    human = report["human"]
    return [
        *lines,
        f"Human verdicts: {human['merged_solved']} of {human['merged']} merged MRs solved; "
        f"{human['closed_unmerged_solved']} of {human['closed_unmerged']} closed-unmerged MRs \"solved\"; "
        f"{counted(human['open'], 'MR')} still open; {counted(human['unknown'], 'task')} with no known verdict.",
        "",
        _limits_line(report.get("limits") or {}),
        "",
    ]


def _task_lines(report: Mapping[str, Any]) -> list[str]:
    """One row per task: its recorded result, each attempt (solved/exit/steps) and its costs."""
    lines = [
        "| task | project | recorded | attempts (solved/exit/steps) | tokens | cached | model s | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["tasks"]:
        attempts = " ".join(
            f"{'✓' if a['solved'] else '✗'}{a['exit_reason'] or a['outcome']}/{a['steps']}" for a in row["attempts"]
        )
        lines.append(
            f"| {_cell(row['task'])} | {_cell(row['project'])} "
            f"| {'solved' if row['recorded_solved'] else 'not solved'} in {row['recorded_attempts']} "
            f"| {attempts} "
            f"| {row['tokens']} | {_share(row['cached_share'])} "
            f"| {row['model_seconds']:.1f} | {row['wall_seconds']:.1f} |"
        )
    return lines
