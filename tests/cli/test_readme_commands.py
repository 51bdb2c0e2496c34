"""Every `manage.py` command line in README.md and docs/*.md names a real command and real flags.

The truth is the CLI itself: `manage.py`'s Typer app turned into its Click group, so a command or
flag renamed in code and not in the docs fails here. Fenced code blocks and inline code both count;
a code line ending in `\\` continues on the next, and so does an indented `[--flag ...]` line
under a command. Prose outside code is not read.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import typer.main

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

COMMAND = re.compile(r"(?<![\w./-])(?:\./)?manage\.py(?![\w.-])")
FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9-]*)")
# Where a command line ends: a shell operator or a comment (`#` after a space).
END = re.compile(r"\s(?:&&|\|\||;|\||#)(?:\s|$)|;\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)


@dataclass(frozen=True)
class Mention:
    """One `manage.py ...` command line as the document shows it."""

    document: str
    line: int  # 1-based, where the command line starts
    text: str


@cache
def cli_options() -> dict[str, frozenset[str]]:
    """Each command's name and every option string it takes (`--help` included), from manage.py's app."""
    spec = importlib.util.spec_from_file_location("frogfix_manage_for_docs", ROOT / "manage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    group = typer.main.get_command(module.cli)  # Typer's own Click (typer._click), so read by duck typing
    options: dict[str, frozenset[str]] = {}
    for name, command in getattr(group, "commands", {}).items():
        opts = {"--help"}
        # a command group (`attest keygen`, `attest revoke`): its subcommands' options count as its own
        for part in [command, *getattr(command, "commands", {}).values()]:
            for param in part.params:
                if param.param_type_name == "option":
                    opts.update(param.opts, param.secondary_opts)
        options[name] = frozenset(opts)
    assert options, "manage.py's app has no commands"
    return options


def _code_lines(text: str) -> list[tuple[int, str]]:
    """Logical lines of the fenced code blocks: `\\` continuations joined, and an indented line that
    starts with `[-` or `--` joined to the command line above it."""
    lines: list[tuple[int, str]] = []
    in_fence = False
    pending: tuple[int, str] | None = None  # a line that ended in a backslash
    for number, raw in enumerate(text.splitlines(), 1):
        if FENCE.match(raw):
            in_fence = not in_fence
            if pending is not None:
                lines.append(pending)
                pending = None
            continue
        if not in_fence:
            continue
        if pending is not None:
            start, head = pending
            line: tuple[int, str] = (start, head + " " + raw.strip())
        elif raw[:1].isspace() and raw.lstrip().startswith(("[-", "--")) and lines and COMMAND.search(lines[-1][1]):
            start, head = lines.pop()
            line = (start, head + " " + raw.strip())
        else:
            line = (number, raw)
        if line[1].rstrip().endswith("\\"):
            pending = (line[0], line[1].rstrip()[:-1].rstrip())
        else:
            pending = None
            lines.append(line)
    if pending is not None:
        lines.append(pending)
    return lines


def _inline_spans(text: str) -> list[tuple[int, str]]:
    """Inline code outside the fences (a span may run over a line break, as Markdown allows)."""
    prose: list[str] = []
    in_fence = False
    for raw in text.splitlines():
        if FENCE.match(raw):
            in_fence = not in_fence
            prose.append("")  # keeps the line numbers; a blank line ends any span
            continue
        prose.append("" if in_fence else raw)
    joined = "\n".join(prose)
    spans = []
    for paragraph in re.finditer(r"(?:[^\n]+\n?)+", joined):
        for span in INLINE.finditer(paragraph.group()):
            line = joined.count("\n", 0, paragraph.start() + span.start(2)) + 1
            spans.append((line, " ".join(span.group(2).split())))
    return spans


def mentions(text: str, document: str = "<text>") -> list[Mention]:
    """Every `manage.py COMMAND ...` in the text's code, one Mention per occurrence."""
    found = []
    for line, code in [*_code_lines(text), *_inline_spans(text)]:
        for match in COMMAND.finditer(code):
            found.append(Mention(document, line, code[match.start() :]))
    return found


def problems(command_line: str, options: dict[str, frozenset[str]]) -> list[str]:
    """What is wrong with one `manage.py ...` line: an unknown command, or a flag the command lacks."""
    match = COMMAND.search(command_line)
    assert match is not None, command_line
    rest = command_line[match.end() :]
    end = END.search(rest)
    words = (rest[: end.start()] if end else rest).split()
    if not words or not re.match(r"[a-z]", words[0]):
        return []  # `./manage.py` by itself, or `manage.py --help`
    name = words[0].rstrip("`.,;:)")
    if name not in options:
        return [f"`manage.py {name}`: no such command (commands: {', '.join(sorted(options))})"]
    wrong = []
    for word in words[1:]:
        for flag in FLAG.findall(word):
            if flag not in options[name]:
                wrong.append(f"`manage.py {name}` has no option {flag}")
    return wrong


def _all_mentions() -> list[Mention]:
    found = []
    for path in DOCUMENTS:
        found += mentions(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    return found


# ------------------------------------------------------------------------------ the documents


def test_every_manage_py_command_in_readme_and_docs_is_real() -> None:
    options = cli_options()
    wrong = [
        f"{mention.document}:{mention.line}: {problem}  ({mention.text[:100]})"
        for mention in _all_mentions()
        for problem in problems(mention.text, options)
    ]
    assert wrong == []


def test_the_check_reads_what_readme_shows() -> None:
    """Guards the check itself: it finds README's command lines, so an empty pass means nothing wrong."""
    readme = [m for m in _all_mentions() if m.document == "README.md"]
    shown = {m.text.split()[1] for m in readme if len(m.text.split()) > 1}
    assert {"demo", "serve", "create-admin", "retry", "eval", "doctor"} <= shown
    assert any("--workers" in m.text for m in readme)  # `serve --workers`, in the commands block
    first_code = mentions((ROOT / "README.md").read_text(encoding="utf-8"))[0]
    assert first_code.line <= 5 and "./manage.py demo" in first_code.text  # README starts with the demo


def test_every_command_is_in_readme() -> None:
    readme = " ".join(m.text for m in _all_mentions() if m.document == "README.md")
    missing = [name for name in cli_options() if f"manage.py {name}" not in readme]
    assert missing == []


# ------------------------------------------------------------------------------ the check can fail


def test_an_unknown_flag_is_reported() -> None:
    options = cli_options()
    assert problems("./manage.py fix --no-such-flag", options) == ["`manage.py fix` has no option --no-such-flag"]
    assert problems("./manage.py serve [--host 127.0.0.1] [--workers 1] [--no-worker]", options) == []
    assert problems("./manage.py retry JOB [--follow] [--timeout SECONDS]", options) == []


def test_an_unknown_command_is_reported() -> None:
    (problem,) = problems("python manage.py frobnicate --json", cli_options())
    assert problem.startswith("`manage.py frobnicate`: no such command")


def test_only_the_command_line_itself_is_checked() -> None:
    options = cli_options()
    # after `&&`, `|`, `;` or a comment, the flags are another program's
    assert problems("./manage.py demo && git log --oneline", options) == []
    assert problems("./manage.py jobs --json | jq --raw-output .total", options) == []
    assert problems("./manage.py doctor   # try --verbose elsewhere", options) == []
    assert problems("./manage.py", options) == [] and problems("./manage.py --help", options) == []


def test_code_blocks_continuations_and_inline_code_are_read() -> None:
    text = "\n".join(
        [
            "Prose mentions manage.py fix --nope outside code: not read.",
            "",
            "```bash",
            "$ ./manage.py eval --attempts 3 \\",
            "    --no-such-option 1",
            "./manage.py replay JOB [--live]",
            "                 [--bogus]",
            "kubectl -n frogfix exec -it deploy/frogfix-api -c api -- ./manage.py create-admin you --sudo",
            "```",
            "",
            "Inline: `./manage.py",
            "show JOB --follow --tail` and `manage.py jobs --json`.",
        ]
    )
    found = mentions(text, "t.md")
    where = [(m.line, m.text.split()[1]) for m in found]
    assert where == [(4, "eval"), (6, "replay"), (8, "create-admin"), (11, "show"), (12, "jobs")]
    wrong = [problem for m in found for problem in problems(m.text, cli_options())]
    assert wrong == [
        "`manage.py eval` has no option --no-such-option",
        "`manage.py replay` has no option --bogus",
        "`manage.py create-admin` has no option --sudo",
        "`manage.py show` has no option --tail",
    ]


@pytest.mark.parametrize("name", ["serve", "retry", "eval", "create-admin"])
def test_the_truth_comes_from_the_cli(name: str) -> None:
    """The option sets are the real ones (a check against an empty set would pass nothing)."""
    expected = {
        "serve": {"--host", "--port", "--workers", "--no-worker", "--no-migrate"},
        "retry": {"--follow", "--timeout"},
        "eval": {"--out", "--attempts", "--scripted-model", "--fail-below", "--fail-if-lost", "--resume"},
        "create-admin": {"--password-stdin"},
    }[name]
    assert expected <= cli_options()[name]
