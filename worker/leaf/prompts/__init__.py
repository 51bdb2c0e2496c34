"""The system prompt and the task template, as package data an operator may replace.

`prompts_dir` (settings: FROGFIX_PROMPTS_DIR) may hold its own `system.md` and/or `task.md`;
a file missing there falls back to ours. The system prompt must stay constant across runs
(no dates, no job ids): SGLang's prefix cache and FrogNano's training both rely on it. The
task template uses `string.Template` placeholders (`$issue_title`, `$issue_body`, `$project`,
`$issue_number`), so braces and dollar signs in issue text need no escaping.

The repository's own guidance (its AGENTS.md files and `.frogfix.yml`'s `instructions`, read from
the base commit by worker/repo_config.py) is appended to the task as a section of its own, between
markers of its own, after the issue: apart from the untrusted issue text, and in the first user
message rather than the system prompt, which stays constant. Neither text can fake the other's
markers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Any, Final

PACKAGE_DIR: Final = Path(__file__).resolve().parent
BEGIN_MARKER: Final = "<<<UNTRUSTED_ISSUE_BEGIN>>>"
END_MARKER: Final = "<<<UNTRUSTED_ISSUE_END>>>"
GUIDANCE_BEGIN: Final = "<<<REPOSITORY_GUIDANCE_BEGIN>>>"
GUIDANCE_END: Final = "<<<REPOSITORY_GUIDANCE_END>>>"
DEFAULT_MAX_BODY_CHARS: Final = 30_000
GUIDANCE_INTRO: Final = (
    "Repository guidance: the repository's own instructions for agents, read from the commit you are working on"
    " (its AGENTS.md files and the `instructions` of its .frogfix.yml). They come from the repository's"
    " maintainers, not from the issue. Follow them for how to build, test and change this code, for example"
    " which test command to run, as long as they do not conflict with the task above. An AGENTS.md governs"
    " the folder it is in and everything below it; where two apply, the nearer one wins."
)


def load_prompt(name: str, prompts_dir: str | Path | None = None) -> str:
    """A prompt file's text (`system.md`, `task.md`), the operator's copy first."""
    for folder in ([Path(prompts_dir)] if prompts_dir else []) + [PACKAGE_DIR]:
        candidate = folder / name
        if candidate.is_file():
            return candidate.read_text(encoding="utf-8").rstrip("\n")
    raise FileNotFoundError(f"no prompt file {name!r}")


def system_prompt(prompts_dir: str | Path | None = None) -> str:
    """The system message: short and identical for every run."""
    return load_prompt("system.md", prompts_dir)


def _defang(text: str) -> str:
    """Keep issue or guidance text from closing (or faking) either delimited block."""
    for marker in (BEGIN_MARKER, END_MARKER, GUIDANCE_BEGIN, GUIDANCE_END):
        text = text.replace(marker, marker.replace("<<<", "<<(quoted)<"))
    return text.replace("\r\n", "\n")


def render_task(
    title: str,
    body: str,
    *,
    prompts_dir: str | Path | None = None,
    project: str = "",
    issue_number: str | int = "",
    max_body_chars: int = DEFAULT_MAX_BODY_CHARS,
) -> str:
    """The user message: the template with the issue inserted as delimited, untrusted data."""
    body = body or "(no description)"
    if max_body_chars > 0 and len(body) > max_body_chars:
        body = f"{body[:max_body_chars]}\n[issue text truncated: {len(body) - max_body_chars} more chars]"
    values = {
        "issue_title": _defang(" ".join(title.split())),
        "issue_body": _defang(body.strip("\n")),
        "project": _defang(project),
        "issue_number": str(issue_number),
    }
    return Template(load_prompt("task.md", prompts_dir)).safe_substitute(values)


# -- repository guidance ------------------------------------------------------------------------


@dataclass(frozen=True)
class GuidanceFile:
    """One piece of repository guidance: an AGENTS.md with the folder it governs, or `.frogfix.yml`'s instructions."""

    source: str  # "AGENTS.md", "src/api/AGENTS.md" or ".frogfix.yml instructions"
    folder: str  # the folder it governs, "" for the whole repository
    text: str  # what the agent is given (cut to the caps)
    size_bytes: int  # the whole file's size
    cut: bool = False

    def heading(self) -> str:
        where = f"{self.folder} and everything below it" if self.folder else "the whole repository"
        return f"=== {self.source}, for {where} ==="

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "folder": self.folder, "text": self.text,
            "size_bytes": self.size_bytes, "cut": self.cut,
        }


@dataclass(frozen=True)
class RepoGuidance:
    """The guidance one attempt's agent gets, and what was left out of it and why (for the job page)."""

    files: tuple[GuidanceFile, ...] = ()
    omitted: tuple[str, ...] = ()  # AGENTS.md files over the total size (or count) cap: named, not shown
    skipped: tuple[str, ...] = ()  # "path: why" (a symlink, ignored by git, outside the checkout, empty)

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": [f.to_dict() for f in self.files], "omitted": list(self.omitted), "skipped": list(self.skipped),
        }


def render_guidance(guidance: RepoGuidance) -> str:
    """The guidance section: the intro, then each file under a heading naming the folder it governs, delimited."""
    blocks = []
    for item in guidance.files:
        text = _defang(item.text.strip("\n"))
        block = f"{_defang(item.heading())}\n{text}"  # folder names come from the repository too
        if item.cut:
            block += (
                f"\n[cut: {item.source} is {item.size_bytes} bytes; only its first {len(item.text)} characters"
                " are shown; Read the file for the rest]"
            )
        blocks.append(block)
    if guidance.omitted:
        more = len(guidance.omitted) - 20
        names = ", ".join(guidance.omitted[:20]) + (f" and {more} more" if more > 0 else "")
        blocks.append(f"[not shown, over the size limit for guidance: {_defang(names)}; Read them if you work there]")
    body = "\n\n".join(blocks)
    return f"{GUIDANCE_INTRO}\n\n{GUIDANCE_BEGIN}\n{body}\n{GUIDANCE_END}"


def add_guidance(task: str, guidance: RepoGuidance | None) -> str:
    """The task with the guidance section after it; the task alone when there is no guidance."""
    if guidance is None or not (guidance.files or guidance.omitted):
        return task
    return f"{task}\n\n{render_guidance(guidance)}"


def strip_guidance(task: str) -> str:
    """A recorded task without its guidance section (a live replay reads the guidance again)."""
    start = task.rfind(f"\n\n{GUIDANCE_INTRO}\n\n{GUIDANCE_BEGIN}\n")
    return task[:start] if start >= 0 and task.endswith(GUIDANCE_END) else task
