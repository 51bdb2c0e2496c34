"""What FrogFix writes on the forge: the MR's title and description, the commit message, the issue comments.

Everything here is Markdown that the forge renders; every string passes the caller's redactor
and the forge client bounds the size again. Test logs are trimmed and folded. Whatever the
issue, the model or the repository chose is redacted first and then made inert (`disarm`,
`inert`, `inert_title`): forges read commands, mentions and closing references in raw text,
code included, so code formatting alone protects nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from app.forge.api import SKIP_CI_MARKER
from app.patches import escape_hidden, shown_path
from app.statuses import FINAL_STATUSES, EvidenceLevel, JobStatus
from worker.attempts.verifier import TestEvidence
from worker.leaf.trajectory_writer import HARNESS_VERSION

LOG_EXCERPT = 12_000
SUMMARY_LIMIT = 4_000


@dataclass
class Provenance:
    model: str
    sampling: dict[str, Any]
    base_commit: str
    sandbox: str
    attempt: int
    attempts: int
    harness_version: str = HARNESS_VERSION
    attestation: str = ""  # the signed statement's envelope digest (app/attestations); "" when unsigned


def _tail(text: str, limit: int = LOG_EXCERPT) -> str:
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} earlier characters cut ...]\n" + text[-limit:]


def _fence(text: str) -> str:
    """A fenced block that `text` cannot close: CommonMark also ends a line at a lone CR, and a
    closing fence may be indented or followed by spaces, so the fence is longer than any run of
    backticks anywhere in the text. The content is disarmed too: GitLab's quick-action reader has
    its own idea of where a code block ends (the first line of exactly three backticks)."""
    text = escape_hidden(text.replace("\r\n", "\n").replace("\r", "\n"), keep="\n\t")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}text\n{disarm(text)}\n{ticks}"


ZWSP = "\u200b"
# A line starts after \n and after every other line break a renderer or Python's splitlines() knows.
_LINE_START = "(?:^|(?<=[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]))"
_QUICK_ACTION = re.compile(_LINE_START + r"(\s*)/", re.M)
# Keywords that close (or reopen) issues, as one case-insensitive superset of the forges' defaults:
# - GitLab's default closing pattern (docs.gitlab.com, "Default closing pattern"; `implement` since
#   gitlab-ce#38424): \b((?:[Cc]los(?:e[sd]?|ing)|\b[Ff]ix(?:e[sd]|ing)?|\b[Rr]esolv(?:e[sd]?|ing)
#   |\b[Ii]mplement(?:s|ed|ing)?)(:?) +(?:(?:issues? +)?%{issue_ref}(...)|([A-Z][A-Z0-9_]+-\d+))+),
#   where issue_ref is #123, group/project#123 or a link to an issue;
# - Gitea and Forgejo (modules/references/references.go, [repository.pull-request] CLOSE_KEYWORDS
#   and REOPEN_KEYWORDS): close, closes, closed, fix, fixes, fixed, resolve, resolves, resolved;
#   reopen, reopens, reopened; before #123, !123, owner/repo#123, ABC-123 or an issues/pulls URL.
_KEYWORD = r"(?i:clos(?:e[sd]?|ing)|fix(?:e[sd]|ing)?|resolv(?:e[sd]?|ing)|implement(?:s|ed|ing)?|reopen(?:s|ed|ing)?)"
_REFERENCE_START = r"(?:[#!]|[\w.-]+(?:/[\w.-]+)*[#!]\d|(?i:https?):|[A-Z][A-Z0-9_]*-\d)"
_CLOSING = re.compile(rf"\b({_KEYWORD})(?=:?\s+(?:(?i:issues?)\s+)?{_REFERENCE_START})")
_NUMBERED = re.compile(r"([#!])(?=\d)")  # #17, !17, group/project#17: issue and MR references
_ISSUE_LINK = re.compile(r"(/(?:issues|pulls|merge_requests|work_items)/)(?=\d)")


def disarm(text: str) -> str:
    """Text the model, the issue or a repository chose, unable to act on the forge, even inside code.

    No working closing keyword before a reference, no issue or MR reference (#17, a/b!17, an issue
    link: no custom closing pattern can use them either), no @mention (a forge notifies people
    from titles, descriptions and commits) and no line that starts with `/` (GitLab runs quick
    actions written by the bot's account). Each is broken by a zero-width space, so the text
    reads the same. No `<!--` either: FrogFix's own markers (the rounds section's) are HTML
    comments, and no text it did not write may hold one, not even in a code block.
    """
    text = text.replace("<!--", "<!" + ZWSP + "--")
    text = _CLOSING.sub(lambda m: m.group(1)[0] + ZWSP + m.group(1)[1:], text)
    text = _NUMBERED.sub(lambda m: m.group(1) + ZWSP, text)
    text = _ISSUE_LINK.sub(lambda m: m.group(1) + ZWSP, text)
    text = text.replace("@", "@" + ZWSP)
    return _QUICK_ACTION.sub(lambda m: m.group(1) + ZWSP + "/", text)


def inert(text: str) -> str:
    """Text the model or a repository chose, made harmless as Markdown on the forge.

    Besides `disarm`: no images or raw HTML (a reviewer's browser would fetch a URL the model
    chose: a way to call home), and no hidden characters but newlines and tabs.
    """
    text = escape_hidden(text, keep="\n\t")
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return disarm(text.replace("![", "!" + ZWSP + "["))


def inert_title(text: str) -> str:
    """An issue title as FrogFix repeats it in a commit subject or an MR title: one line, disarmed.

    Titles are plain text on both forges (no HTML escaping), but GitLab reads mentions in MR
    titles, and commit messages and Gitea PR titles close the issues they name.
    """
    return disarm(escape_hidden(" ".join(text.split())))


def code_span(text: str, *, in_table: bool = True) -> str:
    """An inline code span that `text` cannot close or leave, disarmed inside too; `in_table` escapes `|`
    for a table cell (outside a table a backslash in a code span would show)."""
    text = disarm(escape_hidden(text))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    if in_table:
        text = text.replace("|", chr(92) + "|")
    return f"{ticks}{pad}{text}{pad}{ticks}"



NOT_REPRODUCED = "[not reproduced]"


def mr_title(issue: int, title: str, *, proven: bool = True) -> str:
    """`Fix #N: <title>`: our own reference closes the job's issue when the MR is merged; nothing else can.
    An unproven patch's title says so first."""
    return f"{'' if proven else NOT_REPRODUCED + ' '}Fix #{issue}: {inert_title(title)}"


def commit_message(issue: int, title: str, job_id: int, *, skip_ci: bool, round_number: int = 0) -> str:
    """The bot's commit: the MR title as subject (a review round says which), and the marker that keeps
    forge CI off the branch. A round's subject names the issue without a closing keyword: the MR's own
    title already closes it."""
    if round_number:
        subject = f"Review round {int(round_number)} for #{issue}: {inert_title(title)}"
        body = f"Changes asked on the merge request, drafted by FrogFix (job {job_id})."
    else:
        subject, body = mr_title(issue, title), f"Drafted by FrogFix (job {job_id})."
    if skip_ci:
        body += f"\n\nForge CI is skipped until a maintainer runs it on this branch: {SKIP_CI_MARKER}"
    return f"{subject[:200]}\n\n{body}"


def merge_commit_message(
    issue: int, target_branch: str, target: str, job_id: int, *, skip_ci: bool, round_number: int, conflicted: int
) -> str:
    """An update round's merge commit: which target head it merged, and the marker that keeps forge CI off."""
    target_name = inert_title(target_branch)[:100]
    subject = f"Merge {target_name} ({target[:12]}) for #{issue} (update round {int(round_number)})"
    body = (
        f"Drafted by FrogFix (job {job_id}): the target branch merged in"
        + (f", {conflicted} conflicted file(s) resolved by the agent." if conflicted else ", cleanly.")
    )
    if skip_ci:
        body += f"\n\nForge CI is skipped until a maintainer runs it on this branch: {SKIP_CI_MARKER}"
    return f"{subject[:200]}\n\n{body}"


def _exit(run: dict[str, Any] | None) -> str:
    if run is None:
        return "not run"
    if run.get("timed_out"):
        return "timed out"
    return f"exit {run.get('exit_code')}"


REVIEW_FLAGS = "Review flags"


def flags_block(
    flags: Sequence[str], redact: Callable[[str], str], *, round_number: int | None = None, limit: int | None = None
) -> list[str]:
    """The bold review flags, in the same words wherever they show: round 0's MR description, every
    round's reply and (`round_number`: whose they are) the rounds section. One line each, whatever
    file name a flag quotes; a flag quotes what the repository or the model chose, so it is redacted
    first, then made inert. `limit`: at most that many lines, then how many more. No flags: nothing."""
    if not flags:
        return []
    where = "" if round_number is None else f" (round {int(round_number)})"
    shown = list(flags)[:limit] if limit is not None else list(flags)
    lines = [f"**{REVIEW_FLAGS}{where}:**", *[f"- **{inert(escape_hidden(redact(flag)))}**" for flag in shown]]
    if len(flags) > len(shown):
        lines.append(f"- and {len(flags) - len(shown)} more (see the job page)")
    return [*lines, ""]


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
    selection: Mapping[str, Any] | None = None,
) -> str:
    """The draft MR's Markdown. Every piece the model, the issue or the repository chose is redacted
    first (a zero-width space could hide a secret from a later redaction), then made inert."""
    lines = [f"Draft fix for {issue_ref}" + (f" ({issue_url})" if issue_url else "") + ", opened by FrogFix.", ""]
    verdict = tests.verdict or {}
    if verdict.get("level") == EvidenceLevel.unproven:
        why = inert(escape_hidden(redact(str(verdict.get("reason") or ""))))
        lines = [f"**Not reproduced:** nothing shows this patch fixes the issue ({why}).", "", *lines]
    lines += ["A human must review this change before it is merged. FrogFix never merges.", ""]
    lines += _evidence_section(tests, redact)
    lines += _selection_section(selection)
    lines += flags_block(flags, redact)
    if tests.flaky:
        lines += ["**The patched tests gave different results between runs: treat them as flaky.**", ""]
    # The model's own words, which a hostile issue may have shaped: shown as plain text, never rendered.
    summary = redact(summary.strip() or "(no summary)")[:SUMMARY_LIMIT]
    lines += ["### What the agent says", "", _fence(summary), ""]
    lines += ["### Files changed", "", "| file | + | - |", "| --- | --: | --: |"]
    for path, added, removed in diffstat:
        lines.append(f"| {code_span(shown_path(redact(path)))} | {added} | {removed} |")
    lines += _tests_section(tests, redact)
    if job_url:
        lines += [f"Job: {job_url}", ""]
    lines += _provenance_section(provenance, redact)
    return redact("\n".join(lines))


def _evidence_section(tests: TestEvidence, redact: Callable[[str], str]) -> list[str]:
    """The verdict first: the reproduction (the test, its failure on the base, its pass with the fix), then
    the per-test comparison with the base (worker/attempts/evidence.py decides; this only shows)."""
    verdict = tests.verdict
    if not verdict:
        return []

    def named(ids: Sequence[str], limit: int = 20) -> str:
        shown = ", ".join(code_span(redact(str(i))) for i in list(ids)[:limit])
        return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")

    level, reason = str(verdict.get("level")), inert(escape_hidden(redact(str(verdict.get("reason") or ""))))
    lines = ["### Evidence", "", f"Verdict: **{inert(level)}**: {reason}", ""]
    repro = verdict.get("reproduction") or {}
    if repro.get("tests"):
        lines += [f"- reproduced by {named(repro['tests'])}: fails on the base with only the patch's test changes,"
                  " passes with the whole patch"]
        if tests.reproduction is not None:
            lines += ["", "<details><summary>The reproduction failing on the base (log tail)</summary>", "",
                      _fence(_tail(redact(tests.reproduction.get("log", "")), 4_000)), "", "</details>", ""]
    for key, label in (("fail_to_pass", "failed on the base, pass with the patch"),
                       ("pass_to_fail", "fail with the patch, did not fail on the base"),
                       ("still_failing", "failed on the base and still fail (pre-existing; not blocking)"),
                       ("flaky", "differ between the patched runs (flaky)")):
        if verdict.get(key):
            lines.append(f"- {label}: {named(verdict[key])}")
    return [*lines, ""]


def _selection_section(selection: Mapping[str, Any] | None) -> list[str]:
    """How many attempts ran and why this one was chosen (app/selection.py `Choice.to_dict`): FrogFix's
    own figures (levels, counts, attempt numbers); a job of one attempt has no such section."""
    if not selection or int(selection.get("attempts") or 0) < 2:
        return []
    ran, chosen = int(selection["attempts"]), selection.get("chosen")
    lines = [f"### Choosing among {ran} attempts", "", inert(str(selection.get("why") or "")), "",
             "| attempt | level | fail-to-pass | regressions | agrees with | changed lines |",
             "| --: | --- | --: | --: | --- | --: |"]
    ranked = selection.get("ranked") or []
    for row in ranked:
        checked = row.get("checked") or []
        agrees = ", ".join(str(int(n)) for n in row.get("agrees_with") or []) or ("none" if checked else "not checked")
        number = int(row["attempt"])
        mark = " (chosen)" if number == chosen else ""
        lines.append(f"| {number}{mark} | {inert(str(row.get('level')))} | {int(row.get('fail_to_pass') or 0)} | "
                     f"{int(row.get('regressions') or 0)} | {agrees} | {int(row.get('changed_lines') or 0)} |")
    if ran > len(ranked):
        lines += ["", f"{ran - len(ranked)} other attempt(s) had no patch that may be published (see the job page)."]
    return [*lines, ""]


def _tests_section(tests: TestEvidence, redact: Callable[[str], str]) -> list[str]:
    """The test command (the repository's .frogfix.yml chose it), the verdicts and the logs."""
    lines = ["", "### Tests", "", f"Command: {code_span(redact(tests.command))}", ""]
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
                _fence(_tail(redact(run.get("log", "")))),
                "",
                "</details>",
                "",
            ]
    return lines


def _provenance_section(p: Provenance, redact: Callable[[str], str]) -> list[str]:
    """What produced the patch; the sandbox names the repository's own image, so it is inert too."""
    sampling = ", ".join(f"{k}={v}" for k, v in sorted(p.sampling.items()) if not isinstance(v, dict))
    return [
        "<details><summary>Provenance</summary>",
        "",
        f"- model: {code_span(p.model)} ({sampling})",
        f"- harness: Leaf protocol, FrogFix {p.harness_version}",
        f"- base commit: `{p.base_commit}`",
        f"- sandbox: {inert(escape_hidden(redact(p.sandbox)))}",
        f"- attempt {p.attempt} of {p.attempts}",
        attestation_line(p.attestation),
        "",
        "</details>",
    ]


def attestation_line(digest: str) -> str:
    """The MR names its signed statement (the job's bundle holds it), or says plainly that it has none."""
    if not digest:
        return "- attestation: unsigned (no FROGFIX_ATTESTATION_KEY could sign this change)"
    return f"- attestation: signed, envelope sha256 `{digest}` (the job's `/api/jobs/<id>/attestations` bundle)"


def assisted_by(message: str, model: str, version: str) -> str:
    """`message` with the `Assisted-by: <model> (FrogFix <version>)` trailer as its last paragraph."""
    name = " ".join(re.sub(r"[^\x20-\x7e]", " ", model).split())[:100] or "unknown model"
    return f"{message.rstrip()}\n\nAssisted-by: {name} (FrogFix {version})"


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
    mr_url: str | None = None,
    log: str = "",
) -> str:
    """`detail` may quote what the model or the repository chose (file names, test output): made inert.
    `log` (a log's tail) follows in a fenced block no text can close.

    `notify` is a forge user name FrogFix itself decided to mention (who added the label), and
    `mr_url` the MR it opened: both are ours, so they stay working links and mentions.
    """
    where = f"[job {job_id}]({job_url})" if job_url else f"job {job_id}"
    mention = f"@{notify} " if notify and re.fullmatch(r"[\w.-]+", notify) else ""
    text = f"{mention}FrogFix finished ({where}): **{outcome}**."
    if mr_url:
        text += f" Please review {mr_url}."
    if detail:
        text += f" {inert(redact(detail))}"
    if log:
        text += f"\n\nThe log ends:\n\n{_fence(_tail(redact(log), 3_000))}"
    return redact(text)


# -- review rounds ------------------------------------------------------------------------------

ROUNDS_HEADING = "## Review rounds"
# The section lies between these two lines, outside any code block. `disarm` breaks every `<!--` in text
# FrogFix did not write, so neither the model nor a repository can open, close or move the section.
ROUNDS_START = "<!-- frogfix:rounds-start -->"
ROUNDS_END = "<!-- frogfix:rounds-end -->"  # where our section stops, so a human's text after it is kept
REPLY_SUMMARY_LIMIT = 2_000
MAX_ROUND_LINES = 50  # the newest rounds of a long thread: the section stays bounded
MAX_ROUND_FLAGS = 20  # a round's flags the rounds section lists; its reply and the job page list them all
_SHORT_SHA = re.compile(r"[0-9a-f]{7,64}")
# Our words for a job's status, in the rounds section and in the replies.
ROUND_OUTCOMES = {
    JobStatus.done.value: "pushed", JobStatus.no_fix.value: "no fix", JobStatus.failed.value: "failed",
    JobStatus.cancelled.value: "cancelled", JobStatus.rejected.value: "rejected",
}  # fmt: skip


def round_outcome(status: str) -> str:
    """A round's job status in our words ("pushed", "no fix", ...); one still on its way is "running"."""
    return ROUND_OUTCOMES.get(status, "running" if status not in FINAL_STATUSES else status.replace("_", " "))


@dataclass(frozen=True)
class RoundLine:
    """One round of an MR as the description lists it: who asked for what, and what came of it.

    Round 0 (the job that opened the MR from the issue) is listed too, so its forge CI shows."""

    number: int
    kind: str  # a RoundKind (review, ci), or "issue" for round 0
    asked_by: str | None
    commit: str | None  # what the round pushed, if it did
    outcome: str  # our own words: the job's status ("done", "no fix", "running", ...)
    job_url: str | None = None
    ci: str | None = None  # forge CI on `commit`, a CiStatus (success, failed, ...), when a result came
    flags: tuple[str, ...] = ()  # the review flags of what the round pushed (the job's flags)


_BREAK = re.compile(r"\r\n|\r|\n")  # where CommonMark ends a line
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_OLD_TABLE = "| round | kind |"  # how the table of the previous versions' section starts
_ROUND_FLAGS = re.compile(rf"\*\*{REVIEW_FLAGS} \(round \d+\):\*\*")  # a round's flags block in the section


def _marks(text: str) -> list[tuple[int, int, str | None]]:
    """`text`'s lines: (start, end before the line break, the line without its outer spaces and tabs, or
    None inside a fenced code block). Every line FrogFix did not write (the model's summary, a test log)
    is in a fence that text cannot close (`_fence`), so none is ever read as a marker or a heading."""
    marks: list[tuple[int, int, str | None]] = []
    fence, at = "", 0
    for brk in [*_BREAK.finditer(text), None]:
        end = brk.start() if brk else len(text)
        line, shown = text[at:end], None
        m = _FENCE.fullmatch(line)
        if fence:
            if m and m[1][0] == fence[0] and len(m[1]) >= len(fence) and not m[2].strip(" \t"):
                fence = ""
        elif m and not (m[1][0] == "`" and "`" in m[2]):
            fence = m[1]
        else:
            shown = line.strip(" \t")
        marks.append((at, end, shown))
        at = brk.end() if brk else end
    return marks


def _table_end(marks: list[tuple[int, int, str | None]], i: int) -> int:
    """The last line of the table right after line `i` (rows, blank lines, our heading, the rounds' flags
    blocks: a heading of ours and the `- ` lines right under it), without its trailing blank lines; `i`
    when there is none."""
    j, listing = i, False
    while j + 1 < len(marks) and (s := marks[j + 1][2]) is not None:
        if _ROUND_FLAGS.fullmatch(s):
            listing = True
        elif listing and s.startswith("- "):
            pass
        elif s in ("", ROUNDS_HEADING) or s[:1] == "|":
            listing = False
        else:
            break
        j += 1
    while j > i and marks[j][2] == "":
        j -= 1
    return j


def _section_end(marks: list[tuple[int, int, str | None]], i: int) -> int | None:
    """The last line of the rounds section that starts at line `i`, or None when none starts there.

    Ours runs from ROUNDS_START to the next ROUNDS_END; one a human cut (no end before the next start)
    is its start line and the table after it. The previous versions' section (ROUNDS_HEADING, our table,
    ROUNDS_END) is known by that exact shape: those versions left `<!--` in the model's words, so an end
    marker of theirs never reaches past the table, and a bare heading is never a section."""
    if marks[i][2] == ROUNDS_START:
        end = next((j for j in range(i + 1, len(marks)) if marks[j][2] in (ROUNDS_START, ROUNDS_END)), None)
        return end if end is not None and marks[end][2] == ROUNDS_END else _table_end(marks, i)
    if marks[i][2] != ROUNDS_HEADING:
        return None
    end = _table_end(marks, i)
    if not next((s for _, _, s in marks[i + 1 : end + 1] if s), "").startswith(_OLD_TABLE):
        return None
    after = next((j for j in range(end + 1, len(marks)) if marks[j][2] != ""), None)
    return after if after is not None and marks[after][2] == ROUNDS_END else end


def _sections(text: str) -> list[tuple[int, int]]:
    """The rounds sections in `text`: [start, end) offsets of whole lines, the last one's line break left out."""
    marks, spans, i = _marks(text), [], 0
    while i < len(marks):
        end = _section_end(marks, i)
        if end is not None:
            spans.append((marks[i][0], marks[end][1]))
        i = i + 1 if end is None else end + 1
    return spans


def _with_section(description: str, section: str, redact: Callable[[str], str]) -> str:
    """`description` with `section` as its one rounds section: where the first one was (any other one is
    removed with its line break), else at the end. Every other character stays as it was."""
    spans = _sections(description)
    if not spans:
        head = description.rstrip()
        return redact(f"{head}\n\n{section}\n" if head else f"{section}\n")
    parts, at = [], 0
    for n, (start, end) in enumerate(spans):
        parts += [description[at:start], "" if n else section]
        brk = _BREAK.match(description, end)
        at = brk.end() if n and brk else end
    return redact("".join(parts) + description[at:])


def rounds_section(description: str, rounds: Sequence[RoundLine], redact: Callable[[str], str]) -> str:
    """The MR's `description` with its one "## Review rounds" section rewritten (in place, or at the end).

    An earlier section (between our markers, or the previous versions' shape) is replaced, never
    followed by a second one; the rest of the description, a human's edits included, is kept as it is.
    """
    section = [
        ROUNDS_START, ROUNDS_HEADING, "",
        "| round | kind | asked by | commit | outcome | forge CI |", "| --: | --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    for r in list(rounds)[-MAX_ROUND_LINES:]:
        number = f"[{r.number}]({r.job_url})" if r.job_url else str(r.number)
        who = code_span(redact(r.asked_by)) if r.asked_by else "-"
        commit = f"`{r.commit[:12]}`" if r.commit and _SHORT_SHA.fullmatch(r.commit) else "-"
        kind = inert(escape_hidden(r.kind))
        ci = inert(escape_hidden(redact(r.ci)[:20])) if r.ci else "-"
        section.append(f"| {number} | {kind} | {who} | {commit} | {inert(escape_hidden(redact(r.outcome)))} | {ci} |")
    section.append("")
    for r in list(rounds)[-MAX_ROUND_LINES:]:  # round 0's own flags head the description already
        if r.number > 0:
            section += flags_block(r.flags, redact, round_number=r.number, limit=MAX_ROUND_FLAGS)
    section.append(ROUNDS_END)
    return _with_section(description, "\n".join(section), redact)


def keep_rounds_section(old: str, new: str, redact: Callable[[str], str]) -> str:
    """`new` (round 0's description, written again) with the rounds section `old` had, so a rewrite
    never loses the MR's history of rounds; `new` as it is when `old` had none."""
    spans = _sections(old)
    if not spans:
        return new
    lines = _BREAK.split(old[spans[0][0] : spans[0][1]])
    if lines[0].strip(" \t") != ROUNDS_START:  # the previous versions' section
        lines.insert(0, ROUNDS_START)
    if lines[-1].strip(" \t") != ROUNDS_END:
        lines += ["", ROUNDS_END]
    return _with_section(new, "\n".join(lines), redact)


def _job_ref(job_id: int, job_url: str | None) -> str:
    return f"[job {job_id}]({job_url})" if job_url else f"job {job_id}"


def round_reply_pushed(
    *,
    round_number: int,
    commit: str,
    diffstat: Sequence[tuple[str, int, int]],
    summary: str,
    job_id: int,
    job_url: str | None,
    redact: Callable[[str], str],
    flags: Sequence[str] = (),
    attestation: str | None = None,
) -> str:
    """The reply to a round's requests when it pushed a commit: the files changed, the round's review
    flags (as round 0's description shows them), its signed statement's digest (or "unsigned") when
    `attestation` is given, and the agent's summary.

    The summary is the model's text, which a hostile comment may have shaped: redacted, bounded and
    fenced (disarmed inside), as in the MR description.
    """
    short = commit[:12] if _SHORT_SHA.fullmatch(commit) else "?"
    lines = [
        f"FrogFix pushed `{short}` to this merge request (review round {round_number}, "
        f"{_job_ref(job_id, job_url)}). Nothing is resolved: that is for the reviewer.",
        "",
    ]
    files = [f"{code_span(shown_path(redact(path)))} (+{added} -{removed})" for path, added, removed in diffstat[:50]]
    if len(diffstat) > 50:
        files.append(f"and {len(diffstat) - 50} more")
    lines += ["**Files changed:** " + (", ".join(files) or "none"), ""]
    if attestation is not None:
        lines += [attestation_line(attestation).removeprefix("- "), ""]
    lines += flags_block(flags, redact)
    text = redact(summary.strip() or "(no summary)")[:REPLY_SUMMARY_LIMIT]
    lines += ["**What the agent says:**", "", _fence(text)]
    return redact("\n".join(lines))


def round_reply_ended(
    *, round_number: int, outcome: str, detail: str, job_id: int, job_url: str | None, redact: Callable[[str], str],
    kind: str = "review",
) -> str:
    """The reply when a round pushed nothing (no fix, failed, cancelled): why, made inert."""
    what = "update" if kind == "update" else "review"
    text = (
        f"FrogFix's {what} round {round_number} ({_job_ref(job_id, job_url)}) ended: **{inert(outcome)}**; "
        "nothing was pushed."
    )
    if detail:
        text += f" {inert(redact(detail)[:REPLY_SUMMARY_LIMIT])}"
    return redact(text)


def update_reply_pushed(
    *,
    round_number: int,
    commit: str,
    target_branch: str,
    target: str,
    resolutions: Sequence[tuple[str, str]],
    tests: str,
    summary: str,
    job_id: int,
    job_url: str | None,
    redact: Callable[[str], str],
    flags: Sequence[str] = (),
) -> str:
    """The reply when an update round pushed its merge: what was merged, each conflicted file and how it was
    resolved, the tests on the merged branch and the resolution's review flags (as round 0's description
    shows them). The agent's summary is fenced like a review round's."""
    short = commit[:12] if _SHORT_SHA.fullmatch(commit) else "?"
    head = target[:12] if _SHORT_SHA.fullmatch(target) else "?"
    lines = [
        f"FrogFix merged {code_span(redact(target_branch))} at `{head}` into this merge request as one merge commit,"
        f" `{short}` (update round {round_number}, {_job_ref(job_id, job_url)}). No commit was rewritten.",
        "",
    ]
    if resolutions:
        lines.append(f"**Conflicts resolved ({len(resolutions)}):**")
        lines += [f"- {code_span(shown_path(redact(path)))}: {inert(said)}" for path, said in resolutions[:50]]
        if len(resolutions) > 50:
            lines.append(f"- and {len(resolutions) - 50} more")
    else:
        lines.append("**Conflicts:** none; git merged it cleanly.")
    lines += ["", f"**Tests on the merged branch:** {inert(redact(tests))}"]
    if flags:
        lines += ["", *flags_block(flags, redact)[:-1]]
    text = redact(summary.strip())[:REPLY_SUMMARY_LIMIT]
    if text:
        lines += ["", "**What the agent says:**", "", _fence(text)]
    return redact("\n".join(lines))


def tampered_comment(forged: list[tuple[int, str]]) -> str:
    """The issue's comment when the only patches FrogFix has forged their test results: which, and how found."""
    found = "; ".join(f"attempt {number}: {how}" for number, how in forged)
    return (
        f"FrogFix proposes no change for this issue: the test results of {len(forged)} attempt(s) were forged"
        f" ({found}). The code under test changed what the test runner reported, so nothing those runs claimed"
        " can be trusted, and no patch was published. FrogFix adds check tests of its own to every run and"
        " compares each test's result, sent out of the test process as it happened, with the summary line and"
        " the exit code; the job page shows each run."
    )
