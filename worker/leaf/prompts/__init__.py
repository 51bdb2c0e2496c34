"""The system prompt and the task template, as package data an operator may replace.

`prompts_dir` (settings: FROGFIX_PROMPTS_DIR) may hold its own `system.md` and/or `task.md`;
a file missing there falls back to ours. The system prompt must stay constant across runs
(no dates, no job ids): SGLang's prefix cache and FrogNano's training both rely on it. The
task template uses `string.Template` placeholders (`$issue_title`, `$issue_body`, `$project`,
`$issue_number`), so braces and dollar signs in issue text need no escaping.
"""

from __future__ import annotations

from pathlib import Path
from string import Template
from typing import Final

PACKAGE_DIR: Final = Path(__file__).resolve().parent
BEGIN_MARKER: Final = "<<<UNTRUSTED_ISSUE_BEGIN>>>"
END_MARKER: Final = "<<<UNTRUSTED_ISSUE_END>>>"
DEFAULT_MAX_BODY_CHARS: Final = 30_000


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
    """Keep issue text from closing (or faking) the untrusted-data block around it."""
    for marker in (BEGIN_MARKER, END_MARKER):
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
