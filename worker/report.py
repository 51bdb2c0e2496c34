"""What FrogFix writes on the forge: the draft MR's description and the issue comments.

Everything here is Markdown that the forge renders; every string passes the caller's redactor
and the forge client bounds the size again. Test logs are trimmed and folded.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from worker.leaf.trajectory import HARNESS_VERSION

LOG_EXCERPT = 12_000
SUMMARY_LIMIT = 4_000


@dataclass
class TestEvidence:
    command: str
    before: dict[str, Any] | None
    after: list[dict[str, Any]] = field(default_factory=list)
    flaky: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"command": self.command, "before": self.before, "after": self.after, "flaky": self.flaky}


@dataclass
class Provenance:
    model: str
    sampling: dict[str, Any]
    base_commit: str
    sandbox: str
    attempt: int
    attempts: int
    harness_version: str = HARNESS_VERSION


def _tail(text: str, limit: int = LOG_EXCERPT) -> str:
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} earlier characters cut ...]\n" + text[-limit:]


def _fence(text: str) -> str:
    longest = max((len(run) for run in text.split("\n") if set(run) == {"`"}), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}text\n{text.replace(chr(0), '')}\n{ticks}"


ZWSP = "\u200b"
_QUICK_ACTION = re.compile(r"^(\s*)/", re.M)


def inert(text: str) -> str:
    """Text the model or a repository chose, made harmless as Markdown on the forge.

    No @mentions (they notify people), no images or raw HTML (a reviewer's browser would fetch a
    URL the model chose: a way to call home), and no line-leading `/` (GitLab runs quick actions
    such as /merge or /close written by the bot's account).
    """
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    text = text.replace("@", "@" + ZWSP).replace("![", "!" + ZWSP + "[")
    return _QUICK_ACTION.sub(lambda m: m.group(1) + ZWSP + "/", text)


def _code(text: str) -> str:
    """An inline code span that `text` cannot close, safe in a table cell too."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text.replace('|', chr(92) + '|')}{pad}{ticks}"


def _exit(run: dict[str, Any] | None) -> str:
    if run is None:
        return "not run"
    if run.get("timed_out"):
        return "timed out"
    return f"exit {run.get('exit_code')}"


def mr_description(
    *,
    issue_ref: str,
    issue_url: str | None,
    summary: str,
    diffstat: Sequence[tuple[str, int, int]],  # (path, added, removed) as git stored them (PatchEvidence)
    tests: TestEvidence,
    flags: list[str],
    job_url: str | None,
    provenance: Provenance,
    redact: Callable[[str], str],
) -> str:
    lines = [f"Draft fix for {issue_ref}" + (f" ({issue_url})" if issue_url else "") + ", opened by FrogFix.", ""]
    lines += ["A human must review this change before it is merged. FrogFix never merges.", ""]
    if flags:
        lines += ["**Review flags:**", *[f"- **{inert(flag)}**" for flag in flags], ""]
    if tests.flaky:
        lines += ["**The patched tests gave different results between runs: treat them as flaky.**", ""]
    # The model's own words, which a hostile issue may have shaped: shown as plain text, never rendered.
    lines += ["### What the agent says", "", _fence((summary.strip() or "(no summary)")[:SUMMARY_LIMIT]), ""]
    lines += ["### Files changed", "", "| file | + | - |", "| --- | --: | --: |"]
    lines += [f"| {_code(path)} | {added} | {removed} |" for path, added, removed in diffstat]
    lines += ["", "### Tests", "", f"Command: `{tests.command}`", ""]
    lines += [f"- before the patch (base commit): {_exit(tests.before)}"]
    lines += [f"- with the patch, run {i + 1}: {_exit(run)}" for i, run in enumerate(tests.after)]
    lines.append("")
    for label, run in [("before the patch", tests.before)] + [
        (f"with the patch, run {i + 1}", run) for i, run in enumerate(tests.after)
    ]:
        if run is not None:
            lines += [
                f"<details><summary>Test log {label} ({_exit(run)})</summary>",
                "",
                _fence(_tail(run.get("log", ""))),
                "",
                "</details>",
                "",
            ]
    if job_url:
        lines += [f"Job: {job_url}", ""]
    p = provenance
    sampling = ", ".join(f"{k}={v}" for k, v in sorted(p.sampling.items()) if not isinstance(v, dict))
    lines += [
        "<details><summary>Provenance</summary>",
        "",
        f"- model: `{p.model}` ({sampling})",
        f"- harness: Leaf protocol, FrogFix {p.harness_version}",
        f"- base commit: `{p.base_commit}`",
        f"- sandbox: {p.sandbox}",
        f"- attempt {p.attempt} of {p.attempts}",
        "",
        "</details>",
    ]
    return redact("\n".join(lines))


def comment_started(job_id: int, job_url: str | None) -> str:
    where = f" ([job {job_id}]({job_url}))" if job_url else f" (job {job_id})"
    return (
        f"FrogFix is working on this issue{where}. "
        "It will open a draft merge request if it finds a fix that passes the tests."
    )


def comment_finished(
    outcome: str,
    detail: str,
    job_id: int,
    job_url: str | None,
    redact: Callable[[str], str],
    *,
    notify: str | None = None,
) -> str:
    """`detail` may quote what the model or the repository chose (file names, test output): made inert.

    `notify` is a forge user name FrogFix itself decided to mention (who added the label).
    """
    where = f"[job {job_id}]({job_url})" if job_url else f"job {job_id}"
    mention = f"@{notify} " if notify and re.fullmatch(r"[\w.-]+", notify) else ""
    return redact(f"{mention}FrogFix finished ({where}): **{outcome}**. {inert(detail)}")
