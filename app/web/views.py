"""What the dashboard shows, shaped for its templates: pure functions, no database and no HTTP.

Kept apart from the routes so they can be tested on their own: durations, the coloured diff,
the trajectory split into steps, the test evidence, and the jobs-per-day chart as inline SVG.
Everything that ends up in HTML is escaped here or by Jinja's autoescape.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from threading import Lock
from typing import Any

from markupsafe import Markup
from pydantic import ValidationError

from app import textcalls, trajectory
from app.answers import TestRunAnswer, TestsAnswer
from app.jobs.records import QUEUED_EVENTS
from app.outcome_words import why
from app.patches import FileDiff, file_diffs, shown_path
from app.settings import get_settings
from app.statuses import ACTIVE_STATUSES, FINAL_STATUSES, status_label
from app.usage import UsageFigures

FOLD_CHARS = 1_500  # tool outputs and logs longer than this start folded
FOLD_LINES = 25
SHOW_CHARS = 200_000  # a single output shown in the page is cut here (the raw file has all of it)
MAX_TRAJECTORY_BYTES = 64 * 1024 * 1024


def fmt_time(value: datetime | None) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


def fmt_ago(value: datetime | None, now: datetime | None = None) -> str:
    if value is None:
        return "—"
    seconds = ((now or datetime.now(UTC)) - value).total_seconds()
    if seconds < 0:
        return "just now"
    return f"{fmt_duration(seconds)} ago" if seconds >= 1 else "just now"


def fmt_duration(seconds: float | None) -> str:
    """Short and human: 0.4 s, 42 s, 3 min 05 s, 2 h 07 min, 3 d 4 h."""
    if seconds is None:
        return "—"
    if seconds < 9.95:
        return f"{max(0.0, seconds):.1f} s"
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 86400:
        return f"{s // 3600} h {(s % 3600) // 60:02d} min"
    return f"{s // 86400} d {(s % 86400) // 3600} h"


def http_url(value: str | None) -> str | None:
    """The URL when it is http(s), else None: links from webhook payloads never run script."""
    if value and value.lower().startswith(("https://", "http://")):
        return value
    return None


def short_sha(value: str | None) -> str:
    """A commit as the forges show it in lists: its first 8 hex digits ("—" when there is none)."""
    return value[:8] if value else "—"


def mr_ref(number: int | None, forge: str) -> str:
    """How the forge writes an MR/PR number: GitLab `!7`, Gitea/Forgejo `#7` (a PR is an issue there)."""
    if number is None:
        return "its MR"
    return f"!{number}" if forge == "gitlab" else f"#{number}"


def job_seconds(started: datetime | None, finished: datetime | None, now: datetime | None = None) -> float | None:
    """How long a job ran: to its end, or until now while it runs."""
    if started is None:
        return None
    return max(0.0, ((finished or now or datetime.now(UTC)) - started).total_seconds())


# -- the diff ---------------------------------------------------------------------------------


@dataclass
class DiffLine:
    kind: str  # add, del, ctx, hunk, meta
    text: str
    old: int | None = None
    new: int | None = None


@dataclass
class DiffFile:
    path: str
    added: int = 0
    removed: int = 0
    lines: list[DiffLine] = field(default_factory=list)
    status: str = "modified"


_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+(\d+)(?:,\d+)? @@")
_HIDDEN_HEADER = ("diff --git ", "--- ", "+++ ", "index ")  # the file card's title says it already


def parse_diff(patch: str | None) -> list[DiffFile]:
    """A unified `git diff` split per file, each line with its kind and old/new line numbers.

    The files and their names come from app/patches.py (which reads git's quoted names); this
    only numbers and colours the lines.
    """
    return [_diff_file(diff) for diff in file_diffs(patch or "", headerless="(patch)")]


def _diff_file(diff: FileDiff) -> DiffFile:
    shown = DiffFile(shown_path(diff.path), status=diff.status)  # one line, as the MR names it
    shown.lines = [DiffLine("meta", line) for line in diff.header if not line.startswith(_HIDDEN_HEADER)]
    old = new = 0
    in_hunk = False
    for raw in diff.body:
        if raw.startswith("@@"):
            m = _HUNK.match(raw)
            if m:
                old, new = int(m.group(1)), int(m.group(2))
            shown.lines.append(DiffLine("hunk", raw))
            in_hunk = True
        elif not in_hunk or raw.startswith("\\"):  # binary data, "\ No newline at end of file"
            shown.lines.append(DiffLine("meta", raw))
        elif raw.startswith("+"):
            shown.lines.append(DiffLine("add", raw[1:], None, new))
            shown.added += 1
            new += 1
        elif raw.startswith("-"):
            shown.lines.append(DiffLine("del", raw[1:], old, None))
            shown.removed += 1
            old += 1
        else:
            shown.lines.append(DiffLine("ctx", raw[1:] if raw.startswith(" ") else raw, old, new))
            old += 1
            new += 1
    return shown


# -- test evidence ----------------------------------------------------------------------------


@dataclass
class TestLog:
    label: str
    exit_code: int | None
    log: str
    timed_out: bool = False
    seconds: float | None = None

    @property
    def passed(self) -> bool:
        return self.exit_code == 0

    @property
    def folded(self) -> bool:
        return len(self.log) > FOLD_CHARS or self.log.count("\n") > FOLD_LINES


def test_logs(tests: dict[str, Any] | None) -> tuple[str | None, list[TestLog], bool]:
    """(command, [before, after...], flaky) from an attempt's `tests` JSON, read in the one shape
    (app/answers.py `TestsAnswer`, which reads older shapes too); nothing for one it cannot read."""
    try:
        read = TestsAnswer.read(tests)
    except ValidationError:
        read = None
    if read is None:
        return None, [], False
    runs = [_test_log("before the patch", read.before)] if read.before is not None else []
    many = len(read.after) > 1
    runs += [_test_log("with the patch" + (f", run {i + 1}" if many else ""), run) for i, run in enumerate(read.after)]
    return read.command or None, runs, read.flaky


def evidence_of(tests: dict[str, Any] | None) -> dict[str, Any] | None:
    """The verdict worker/attempts/evidence.py recorded with the attempt's tests (None for older attempts)."""
    evidence = (tests or {}).get("evidence")
    if not isinstance(evidence, dict) or not isinstance(evidence.get("level"), str):
        return None
    lists = ("fail_to_pass", "pass_to_fail", "still_failing", "flaky")
    shown: dict[str, Any] = {key: [str(t) for t in evidence.get(key) or []] for key in lists}
    repro = evidence.get("reproduction")
    shown["reproduction"] = {"tests": [str(t) for t in repro.get("tests") or []] if isinstance(repro, dict) else []}
    return {"level": evidence["level"], "reason": str(evidence.get("reason") or ""), **shown}


def selection_of(selection: dict[str, Any] | None) -> dict[str, Any] | None:
    """How the published attempt was chosen (app/selection.py `Choice.to_dict`), well formed, or None."""
    if not isinstance(selection, dict) or not isinstance(selection.get("ranked"), list):
        return None
    rows = []
    for row in selection["ranked"]:
        if not isinstance(row, dict) or not isinstance(row.get("attempt"), int):
            continue
        rows.append({
            "attempt": row["attempt"], "level": str(row.get("level") or "—"),
            "fail_to_pass": int(row.get("fail_to_pass") or 0), "regressions": int(row.get("regressions") or 0),
            "agrees_with": [int(n) for n in row.get("agrees_with") or [] if isinstance(n, int)],
            "checked": bool(row.get("checked")), "changed_lines": int(row.get("changed_lines") or 0),
        })  # fmt: skip
    chosen = selection.get("chosen")
    attempts = selection.get("attempts")
    return {"chosen": chosen if isinstance(chosen, int) else None, "why": str(selection.get("why") or ""),
            "attempts": attempts if isinstance(attempts, int) else len(rows), "ranked": rows}


def _test_log(label: str, run: TestRunAnswer) -> TestLog:
    return TestLog(label, run.exit_code, run.log[:SHOW_CHARS], run.timed_out, run.seconds)


# -- repository guidance ----------------------------------------------------------------------


@dataclass
class GuidanceItem:
    source: str  # "AGENTS.md", "src/api/AGENTS.md" or ".frogfix.yml instructions"
    folder: str  # the folder it governs; "" for the whole repository
    text: str
    size_bytes: int | None
    cut: bool


@dataclass
class GuidanceView:
    files: list[GuidanceItem]
    omitted: list[str]
    skipped: list[str]


def repository_guidance(meta: dict[str, Any]) -> GuidanceView | None:
    """The guidance an attempt's agent got (its AGENTS.md files and `.frogfix.yml` instructions), from its
    trajectory; None when the trajectory does not record any (older runs, plain replays)."""
    raw = meta.get("repository_guidance")
    if not isinstance(raw, dict):
        return None
    files = []
    for item in raw.get("files") or []:
        if isinstance(item, dict):
            size = item.get("size_bytes")
            files.append(
                GuidanceItem(
                    str(item.get("source") or "?"),
                    str(item.get("folder") or ""),
                    str(item.get("text") or "")[:SHOW_CHARS],
                    size if isinstance(size, int) else None,
                    bool(item.get("cut")),
                )
            )
    omitted, skipped = raw.get("omitted"), raw.get("skipped")
    return GuidanceView(
        files,
        [str(x) for x in omitted] if isinstance(omitted, list) else [],
        [str(x) for x in skipped] if isinstance(skipped, list) else [],
    )


# -- trajectories -----------------------------------------------------------------------------


@dataclass
class ToolCallView:
    call_id: str
    name: str
    arguments: list[tuple[str, str]]  # (name, value) pairs, values as text
    raw_arguments: str | None  # when they were not a JSON object
    output: str | None
    output_chars: int = 0
    seconds: float | None = None
    rejected: bool = False
    source: str = "native"

    @property
    def folded(self) -> bool:
        text = self.output or ""
        return len(text) > FOLD_CHARS or text.count("\n") > FOLD_LINES

    @property
    def headline(self) -> str:
        """One line that says what the call did: the command, the file or the pattern."""
        for key in ("command", "file_path", "path", "pattern"):
            for name, value in self.arguments:
                if name == key and value:
                    first = value.strip().splitlines()[0] if value.strip() else ""
                    return first[:160] + ("…" if len(first) > 160 or "\n" in value.strip() else "")
        return ""


@dataclass
class StepView:
    number: int  # 1-based, as the dashboard counts
    reasoning: str | None
    content: str | None
    calls: list[ToolCallView]
    finish_reason: str | None = None
    tokens: int | None = None
    model_seconds: float | None = None
    tool_seconds: float | None = None


@dataclass
class TrajectoryView:
    path: str
    meta: dict[str, Any]
    system_prompt: str | None
    task: str | None
    steps: list[StepView]
    final_message: str | None

    @property
    def partial(self) -> bool:
        return bool(self.meta.get("partial"))


# The file is missing, outside the data folder, too large or not a trajectory: the page says so.
TrajectoryUnavailable = trajectory.TrajectoryError


def _text_call_views(parsed: textcalls.TextParse, ids: list[str], step: int) -> list[ToolCallView]:
    """The calls the loop read from a reply's text, read by its own reader (app/textcalls.py), so the page
    shows what ran. A block it could not read shows its raw text; the loop answered it with the error."""
    shown: list[ToolCallView] = []
    for i, (call, (start, end)) in enumerate(zip(parsed.calls, parsed.spans, strict=True)):
        call_id = ids[i] if i < len(ids) else textcalls.text_call_id(step, i)
        args, _ = _arguments(call.arguments)
        raw = parsed.visible[start:end].strip() if call.error else None
        shown.append(ToolCallView(call_id, call.name or "?", [] if call.error else args, raw, None, source="text"))
    return shown


def _arguments(raw: Any) -> tuple[list[tuple[str, str]], str | None]:
    value = raw
    if isinstance(raw, str):
        try:
            value = json.loads(raw)
        except ValueError:
            return [], raw
    if isinstance(value, dict):
        pairs = [(str(k), v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)) for k, v in value.items()]
        return pairs, None
    return [], None if value is None else json.dumps(value, ensure_ascii=False)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # OpenAI content parts
        return "".join(str(p.get("text", "")) if isinstance(p, dict) else str(p) for p in value)
    return str(value)


def build_trajectory(document: dict[str, Any], path: str = "") -> TrajectoryView:
    """Split the saved messages into steps: one assistant message and the tool answers that follow it."""
    messages = [m for m in document.get("messages") or [] if isinstance(m, dict)]
    summaries = [s for s in document.get("steps") or [] if isinstance(s, dict)]
    system_prompt = next((_text(m.get("content")) for m in messages if m.get("role") == "system"), None)
    task = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), None)
    steps: list[StepView] = []
    pending: dict[str, ToolCallView] = {}
    for message in messages:
        role = message.get("role")
        if role == "assistant":
            index = len(steps)
            steps.append(_step_view(message, summaries[index] if index < len(summaries) else {}, index))
            pending = {c.call_id: c for c in steps[-1].calls}
        elif role == "tool" and steps:
            _answer_call(message, steps[-1], pending)
    meta = {k: v for k, v in document.items() if k not in ("messages", "steps", "tools")}
    return TrajectoryView(path, meta, system_prompt, task, steps, _text(document.get("final_message")))


def _step_view(message: dict[str, Any], summary: dict[str, Any], index: int) -> StepView:
    """Step `index` + 1: the assistant's reasoning, prose and calls (native, or written as text), with what
    the step's summary recorded of each call and of the model's answer."""
    calls: list[ToolCallView] = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict):
            continue
        function = call.get("function") or {}
        args, raw = _arguments(function.get("arguments"))
        calls.append(ToolCallView(str(call.get("id") or ""), str(function.get("name") or "?"), args, raw, None))
    content = _text(message.get("content"))
    reasoning = _text(message.get("reasoning_content"))
    if not calls:  # as the loop reads a reply without native calls: its text calls and its prose
        parsed = textcalls.extract_text_calls(content)
        ids = [str(c.get("id", "")) for c in summary.get("tool_calls") or [] if isinstance(c, dict)]
        calls = _text_call_views(parsed, ids, index)
        content = parsed.prose or None
        reasoning = reasoning or parsed.inline_reasoning
    for record in summary.get("tool_calls") or []:
        if not isinstance(record, dict):
            continue
        for view in calls:
            if view.call_id == record.get("id"):
                seconds = record.get("seconds")
                view.seconds = float(seconds) if isinstance(seconds, int | float) else None
                view.rejected = bool(record.get("rejected"))
                view.source = str(record.get("source") or view.source)
    usage = summary.get("usage") if isinstance(summary.get("usage"), dict) else None
    return StepView(
        number=index + 1,
        reasoning=reasoning,
        content=content,
        calls=calls,
        finish_reason=summary.get("finish_reason"),
        tokens=usage.get("total_tokens") if usage else None,
        model_seconds=summary.get("model_seconds"),
        tool_seconds=summary.get("tool_seconds"),
    )


def _answer_call(message: dict[str, Any], step: StepView, pending: dict[str, ToolCallView]) -> None:
    """A tool's answer onto the call of `step` it answers (by id, else the first unanswered; else a new
    "?" call), its output cut to SHOW_CHARS."""
    output = _text(message.get("content")) or ""
    call_id = str(message.get("tool_call_id") or "")
    answered = pending.get(call_id) or next((c for c in step.calls if c.output is None), None)
    if answered is None:
        answered = ToolCallView(call_id, "?", [], None, None)
        step.calls.append(answered)
    answered.output_chars = len(output)
    answered.output = output[:SHOW_CHARS]


_cache_lock = Lock()
_cache: OrderedDict[tuple[str, int, int], TrajectoryView] = OrderedDict()


def load_trajectory(path: str | None, data_dir: Path) -> TrajectoryView:
    """Read and split a trajectory file; only files under the data folder are read.

    Tolerant on purpose: a partially written file, or one from an older version, still shows
    whatever steps it holds. Parsed views are cached by (path, mtime, size): the live job page
    asks again every few seconds and the file only changes when a step ends.
    """
    resolved = trajectory_file(path, data_dir)
    stat = resolved.stat()
    key = (str(resolved), stat.st_mtime_ns, stat.st_size)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    document = trajectory.load(resolved)
    if not isinstance(document.get("messages"), list):
        raise TrajectoryUnavailable("the file is not a Leaf trajectory")
    view = build_trajectory(document, str(resolved))
    with _cache_lock:
        _cache[key] = view
        while len(_cache) > 8:
            _cache.popitem(last=False)
    return view


def trajectory_file(path: str | None, data_dir: Path) -> Path:
    """The attempt's stored path (relative, or absolute from an older version) found under
    `data_dir`, checked: a regular file, inside the data folder, and not huge."""
    resolved = trajectory.existing(data_dir, path)
    if resolved.stat().st_size > MAX_TRAJECTORY_BYTES:
        raise TrajectoryUnavailable("the trajectory file is too large to show here; download it instead")
    return resolved


def current_step(view: TrajectoryView) -> dict[str, Any] | None:
    """The newest step in a short form, for the live progress line."""
    if not view.steps:
        return None
    step = view.steps[-1]
    calls = [{"name": c.name, "headline": c.headline} for c in step.calls]
    return {"number": step.number, "calls": calls}


# -- the jobs-per-day chart ------------------------------------------------------------------

# One series per final status, then every active job together.
CHART_SERIES: tuple[tuple[str, str], ...] = (
    *((status, status_label(status)) for status in FINAL_STATUSES),
    ("active", "in progress"),
)


def jobs_per_day_svg(per_day: list[tuple[str, dict[str, int]]]) -> Markup:
    """Jobs created per day, a stacked bar each, by outcome (every active status as one)."""
    keys = {key for key, _ in CHART_SERIES}
    grouped = []
    for day, counts in per_day:
        bars = dict.fromkeys(keys, 0)
        for status, n in counts.items():
            bars["active" if status in ACTIVE_STATUSES else status if status in bars else "failed"] += n
        grouped.append((day, bars))
    return stacked_bars_svg(grouped, CHART_SERIES, "Jobs per day by outcome")


# The usage page's tokens per day: the cached part of the prompts, the rest of them, the completions.
TOKEN_SERIES: tuple[tuple[str, str], ...] = (
    ("cached", "cached prompt tokens"),
    ("uncached", "uncached prompt tokens"),
    ("completion", "completion tokens"),
)


def tokens_per_day_svg(per_day: list[tuple[str, UsageFigures]]) -> Markup:
    """Tokens used per day, a stacked bar each, split as TOKEN_SERIES."""
    bars = [
        (day, {"cached": u.cached_tokens, "uncached": max(0, u.prompt_tokens - u.cached_tokens),
               "completion": u.completion_tokens})
        for day, u in per_day
    ]
    return stacked_bars_svg(bars, TOKEN_SERIES, "Tokens per day, cached and not")


def stacked_bars_svg(
    days: list[tuple[str, dict[str, int]]], series: tuple[tuple[str, str], ...], label: str
) -> Markup:
    """A stacked bar per day, one segment per series, coloured through CSS classes (so dark mode restyles it)."""
    width, height = 1100, 230
    left, right, top, bottom = 48, 8, 10, 28
    plot_w, plot_h = width - left - right, height - top - bottom
    totals = [sum(c.get(key, 0) for key, _ in series) for _, c in days]
    peak = max(totals, default=0)
    scale_max = _nice_ceiling(peak)
    slot = plot_w / max(1, len(days))
    bar_w = max(2.0, slot * 0.7)
    parts = [
        f'<svg class="chart" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
    ]
    for tick in range(5):
        value = scale_max * tick / 4
        y = top + plot_h - plot_h * tick / 4
        parts.append(f'<line class="grid" x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}"/>')
        parts.append(f'<text class="axis" x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{_tick(value)}</text>')
    for i, (day, counts) in enumerate(days):
        x = left + slot * i + (slot - bar_w) / 2
        y = top + plot_h
        for key, name in series:
            n = counts.get(key, 0)
            if not n or not scale_max:
                continue
            h = plot_h * n / scale_max
            y -= h
            parts.append(
                f'<rect class="bar s-{key}" x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}">'
                f"<title>{escape(day)}: {n} {escape(name)}</title></rect>"
            )
        if len(days) <= 16 or i % 2 == 0:
            parts.append(
                f'<text class="axis" x="{x + bar_w / 2:.1f}" y="{height - 10}" text-anchor="middle">'
                f"{escape(day[5:])}</text>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))


def _tick(value: float) -> str:
    """An axis label that stays short: 40, 2.5k, 1.2M."""
    for limit, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= limit:
            return f"{value / limit:g}{suffix}"
    return f"{value:g}"


def _nice_ceiling(value: int) -> int:
    """A round axis maximum at or above `value`, in 4 equal integer ticks (4, 8, 20, 100, 200...)."""
    if value <= 4:
        return 4
    raw = -(-value // 4)  # the smallest tick that fits
    if raw < 10:
        return raw * 4
    magnitude = 10 ** (len(str(raw)) - 1)
    for mult in (1, 2, 2.5, 5, 10):
        step = mult * magnitude
        if step >= raw and step == int(step):
            return int(step) * 4
    return raw * 4


def current_run_events(events: list[Any]) -> list[Any]:
    """The events of the job's current run: those since it last entered the queue (app/jobs/records.py
    QUEUED_EVENTS), so a retry's stage strip and status start again rather than show the last run's."""
    starts = [i for i, e in enumerate(events) if e.kind in QUEUED_EVENTS]
    return events[starts[-1]:] if starts else events


def why_line(job: Any) -> str | None:
    """Why a finished job failed or found nothing, in one line (app/outcome_words.py); None while it runs.

    A local job names the model server its run asked (its record keeps it), a forge job this server's."""
    if job.status in ACTIVE_STATUSES:
        return None
    url = getattr(job, "model_url", None) or get_settings().model_base_url
    return why(job.status, job.exit_reason, job.ending, model_url=url)


def environment_log(events: list[Any]) -> dict[str, str] | None:
    """The test environment's build, when it failed: its one line and the tail of its log, from the job's latest
    `environment_error` event (the job core records the report there); None when the environment did not fail."""
    failed = next((e for e in reversed(events) if e.kind == "environment_error"), None)
    data = failed.data if failed is not None and isinstance(failed.data, dict) else None
    if failed is None or data is None:
        return None
    return {"line": str(failed.message or ""), "log": str(data.get("log_tail") or "")}


def path_breaks(path: str | None) -> Markup:
    """A project's path whose lines may break only after a slash: each part unbreakable (`.seg`), a break
    opportunity after each `/`; escaped, as every shown value is."""
    parts = (path or "").split("/")
    return Markup("/<wbr>").join(Markup('<span class="seg">{}</span>').format(part) if part else Markup("")
                                 for part in parts)
