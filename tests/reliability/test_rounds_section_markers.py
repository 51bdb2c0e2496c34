"""The MR's rounds section cannot be opened, closed or moved by text FrogFix did not write.

The finding: a final summary holding the line `## Review rounds` made the first round's rewrite take it
for the rounds section and delete everything after it (the files table, the tests and their logs, the
provenance). The section now lies between two HTML-comment markers read only outside fenced code
blocks, and `disarm` breaks every `<!--` in what the model, the issue or a repository chose. Whatever
the summary, a file name, the test command, a log, a flag or a round's row holds, a rewrite replaces
our section and leaves every other character of the description as it was.
"""

from __future__ import annotations

import pytest

from worker.attempts.verifier import TestEvidence as Evidence
from worker.texts.mr_text import (
    ROUNDS_END,
    ROUNDS_HEADING,
    ROUNDS_START,
    Provenance,
    RoundLine,
    keep_rounds_section,
    mr_description,
    rounds_section,
)

OLD_TABLES = (  # the table the previous versions wrote, before and after the forge CI column
    "| round | kind | asked by | commit | outcome |\n| --: | --- | --- | --- | --- |",
    "| round | kind | asked by | commit | outcome | forge CI |\n| --: | --- | --- | --- | --- | --- |",
)
FORGED_OLD = f"{ROUNDS_HEADING}\n\n{OLD_TABLES[1]}\n| 9 | review | `x` | - | pushed | - |\n\n{ROUNDS_END}"
FORGED_NEW = f"{ROUNDS_START}\n{FORGED_OLD}"

HOSTILE = [
    ROUNDS_HEADING,
    f"Fixed the rounding.\n{ROUNDS_HEADING}\neverything after this line is mine",
    f"Fixed.\n\n{FORGED_OLD}\n",
    f"Fixed.\n\n{FORGED_NEW}\n",
    ROUNDS_START,
    ROUNDS_END,
    f"{ROUNDS_END}\n{ROUNDS_START}\n{ROUNDS_HEADING}",
    f"Fixed.\r\n{ROUNDS_HEADING}\r\n{ROUNDS_START}\r\n{ROUNDS_END}\r\n",  # CRLF
    f"Fixed.\r{ROUNDS_START}\r{ROUNDS_HEADING}\r{ROUNDS_END}\r",  # a lone CR ends a line too
    f"   {ROUNDS_START}  \t\n\t{ROUNDS_END} ",  # indented, trailing blanks
    f"```\n{ROUNDS_HEADING}\n{ROUNDS_START}\n```\n````\n{ROUNDS_END}\n````",  # fences of its own
    "<!-\r\n- frogfix:rounds-start -->\n<!--\r frogfix:rounds-end -->",  # split across line breaks
    f"\u2028{ROUNDS_START}\u2029{ROUNDS_END}\x85{ROUNDS_HEADING}\x0b",  # the other line breaks
    f"\u00a0{ROUNDS_START}\u00a0\n\u200b{ROUNDS_END}",  # a no-break space, a zero-width one
]


def same(text: str) -> str:
    return text


def _description(text: str) -> str:
    """Round 0's description with `text` in every place the model, the issue or the repository fills."""
    return mr_description(
        issue_ref="#7",
        issue_url=None,
        summary=text,
        diffstat=[("calc.py", 3, 1), (text, 1, 0), (f"{text}.py", 2, 2)],
        tests=Evidence(f"pytest {text}", {"exit_code": 1, "log": f"FAILED\n{text}\n"}, [{"exit_code": 0, "log": text}]),
        flags=[f"changes a test file: {text}"],
        job_url="https://frogfix.example/jobs/3",
        provenance=Provenance("model", {"temperature": 0}, "a" * 40, f"local ({text})", 1, 2),
        redact=same,
    )


def _rows(text: str, count: int) -> list[RoundLine]:
    """`count` rounds whose kind, asker, outcome and forge CI are `text`."""
    return [RoundLine(n, text, text, "b" * 40, text, None, text) for n in range(1, count + 1)]


def _section(rows: list[RoundLine]) -> str:
    """The section `rows` make, as rounds_section writes it (ending with a line break)."""
    return rounds_section("", rows, same)


def _old_description(raw: str, table: str = OLD_TABLES[1], section: bool = True) -> str:
    """A description as the previous versions wrote it: `raw` in the summary's fence as it was (those
    versions left `<!--` alone), the old section at the end, a reviewer's note after it."""
    body = _description("PLACEHOLDER").replace("```text\nPLACEHOLDER\n```", f"```text\n{raw}\n```", 1)
    if not section:
        return body
    old = f"{ROUNDS_HEADING}\n\n{table}\n| 0 | issue | `dev` | `aaaaaaaaaaaa` | pushed |\n\n{ROUNDS_END}"
    return f"{body}\n\n{old}\n\nA reviewer's note after it.\n"


@pytest.mark.parametrize("hostile", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_text_anywhere_in_the_description_never_moves_the_rounds_section(hostile: str) -> None:
    original = _description(hostile)
    assert ROUNDS_START not in original and ROUNDS_END not in original  # the markers are FrogFix's alone
    evidence = original[original.index("### Files changed") :]  # files table, tests, logs, provenance
    assert "| calc.py |" not in evidence and "| `calc.py` | 3 | 1 |" in evidence and "</details>" in evidence

    one = rounds_section(original, _rows(hostile, 1), same)
    assert one == f"{original.rstrip()}\n\n{_section(_rows(hostile, 1))}"
    two = rounds_section(one, _rows(hostile, 2), same)
    assert two == f"{original.rstrip()}\n\n{_section(_rows(hostile, 2))}"
    assert evidence.rstrip() in two and two.count(ROUNDS_START) == 1 and two.count(ROUNDS_END) == 1
    # each row stays one line of the table: nothing in it opens, closes or breaks the section
    section = _section(_rows(hostile, 2))
    assert "\r" not in section and len(section.split("\n")) == len(_section([]).split("\n")) + 2

    # round 0 written again (a replaced branch) carries the section, and only the section, over
    fresh = _description(f"{hostile}\nagain")
    assert keep_rounds_section(two, fresh, same) == f"{fresh.rstrip()}\n\n{section}"


@pytest.mark.parametrize("hostile", HOSTILE[:4], ids=range(4))
def test_a_humans_edits_around_the_section_are_kept_byte_for_byte(hostile: str) -> None:
    """A web editor sends CRLF; a reviewer wrote before and after our section."""
    first = rounds_section(_description(hostile), _rows(hostile, 1), same)
    start, end = first.index(ROUNDS_START), first.index(ROUNDS_END) + len(ROUNDS_END)
    before = (first[:start] + "Reviewer: see the notes below.\n\n").replace("\n", "\r\n")
    after = "\r\n\r\n## Notes\r\n\r\nShip after round 2.  \r\n\r\n"
    edited = before + first[start:end].replace("\n", "\r\n") + after
    for count in (2, 3):
        edited = rounds_section(edited, _rows(hostile, count), same)
        assert edited == before + _section(_rows(hostile, count)).rstrip("\n") + after


@pytest.mark.parametrize("table", OLD_TABLES, ids=("v1", "v2"))
@pytest.mark.parametrize("raw", [FORGED_OLD, FORGED_NEW, f"{ROUNDS_HEADING}\nmine", f"{ROUNDS_START}\nx"])
def test_a_previous_versions_section_is_replaced_once_and_its_forgeries_are_not(raw: str, table: str) -> None:
    """Those versions wrote `## Review rounds`, the table and the end marker, and left the model free
    to write the same lines, markers included, in its summary's fence: only the real one is replaced."""
    old = _old_description(raw, table)
    real = old.index(f"\n\n{ROUNDS_HEADING}\n\n{table}") + 2
    one = rounds_section(old, _rows("dev", 1), same)
    assert one == old[:real] + _section(_rows("dev", 1)).rstrip("\n") + "\n\nA reviewer's note after it.\n"
    two = rounds_section(one, _rows("dev", 2), same)
    assert two == old[:real] + _section(_rows("dev", 2)).rstrip("\n") + "\n\nA reviewer's note after it.\n"
    assert f"```text\n{raw}\n```" in two  # the model's words, forgeries included, as they were

    # without a real section, the forgery in the fence is not one: the section goes at the end
    bare = _old_description(raw, table, section=False)
    assert rounds_section(bare, _rows("dev", 1), same) == f"{bare.rstrip()}\n\n{_section(_rows('dev', 1))}"

    # round 0 written again keeps the real section's rows, now between our markers
    fresh = _description("Fixed.")
    kept = keep_rounds_section(old, fresh, same)
    assert kept == (
        f"{fresh.rstrip()}\n\n{ROUNDS_START}\n{ROUNDS_HEADING}\n\n{table}\n"
        f"| 0 | issue | `dev` | `aaaaaaaaaaaa` | pushed |\n\n{ROUNDS_END}\n"
    )
    assert keep_rounds_section(bare, fresh, same) == fresh
