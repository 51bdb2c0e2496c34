"""Each Leaf tool's result, byte for byte, in-process and through a real bubblewrap sandbox."""

from __future__ import annotations

import os
import time

import pytest

from tests.sandbox.support import ToolHarness, leaf_bash

CALC = "def add(a, b):\n    return a - b\n"


def read_reference(shown: str, text: str, offset: int = 1, limit: int = 0, cut: int = 20_000) -> str:
    """LEAF.md's Read format, written out independently of the runner."""
    lines = text.splitlines()
    end = len(lines) if limit <= 0 else min(len(lines), offset - 1 + limit)
    body = "\n".join(f"{n}. {line}" for n, line in enumerate(lines[offset - 1 : end], start=offset))
    full = f"{shown}\n{body}"
    return full if len(full) <= cut else f"{full[:cut]}\n[truncated {len(full) - cut} chars]"


# ------------------------------------------------------------------------------------- Read


def test_read_numbers_lines_under_the_relative_path(tools: ToolHarness) -> None:
    tools.put("src/calc.py", CALC)
    assert tools.call("Read", file_path="src/calc.py") == "src/calc.py\n1. def add(a, b):\n2.     return a - b"


def test_read_offset_and_limit(tools: ToolHarness) -> None:
    tools.put("f.txt", "".join(f"l{i}\n" for i in range(1, 11)))
    assert tools.call("Read", file_path="f.txt", offset=3, limit=2) == "f.txt\n3. l3\n4. l4"
    assert tools.call("Read", file_path="f.txt", offset="9", limit="5") == "f.txt\n9. l9\n10. l10"
    assert tools.call("Read", file_path="f.txt", offset=0, limit=1) == "f.txt\n1. l1"
    assert tools.call("Read", file_path="f.txt", offset=8, limit=0) == "f.txt\n8. l8\n9. l9\n10. l10"
    assert tools.call("Read", file_path="f.txt", offset=50) == "f.txt\n"


def test_read_shows_absolute_and_dotted_paths_relative(tools: ToolHarness) -> None:
    tools.put("src/calc.py", CALC)
    expected = "src/calc.py\n1. def add(a, b):\n2.     return a - b"
    assert tools.call("Read", file_path=tools.abs("src/calc.py")) == expected
    assert tools.call("Read", file_path="./src/../src/calc.py") == expected
    assert tools.call("Read", path="src/calc.py") == expected


def test_read_splits_lines_like_splitlines(tools: ToolHarness) -> None:
    text = "a\r\nb\rc\x0cd\u2028e\n\nlast"
    tools.put("odd.txt", text)
    assert tools.call("Read", file_path="odd.txt") == read_reference("odd.txt", text)


def test_read_empty_file(tools: ToolHarness) -> None:
    tools.put("empty.txt", "")
    assert tools.call("Read", file_path="empty.txt") == "empty.txt\n"


def test_read_truncates_at_20000_chars_with_exact_count(tools: ToolHarness) -> None:
    text = "".join(f"line {i} {'x' * 40}\n" for i in range(3000))
    tools.put("big.txt", text)
    out = tools.call("Read", file_path="big.txt")
    assert out == read_reference("big.txt", text)
    head, trailer = out.rsplit("\n", 1)
    assert len(head) == 20_000
    assert trailer.startswith("[truncated ") and trailer.endswith(" chars]")
    assert tools.call("Read", file_path="big.txt", offset=10, limit=3) == read_reference("big.txt", text, 10, 3)


def test_read_errors_are_text(tools: ToolHarness) -> None:
    tools.put("src/calc.py", CALC)
    assert (
        tools.call("Read", file_path="nope.py") == "FileNotFoundError: [Errno 2] No such file or directory: 'nope.py'"
    )
    assert tools.call("Read", file_path="src") == "IsADirectoryError: [Errno 21] Is a directory: 'src'"
    assert tools.call("Read") == "ValueError: file_path is required"
    assert tools.call("Read", file_path="src/calc.py", offset="abc") == (
        "ValueError: offset must be an integer, got 'abc'"
    )


def test_read_undecodable_bytes_are_replaced(tools: ToolHarness) -> None:
    tools.put("latin.txt", b"caf\xe9\n")
    assert tools.call("Read", file_path="latin.txt") == "latin.txt\n1. caf\ufffd"


# ------------------------------------------------------------------------------------ Write


def test_write_creates_parents_and_counts_characters(tools: ToolHarness) -> None:
    tools.put("keep.txt", "")
    assert tools.call("Write", file_path="pkg/sub/new.py", content="print('hi')\n") == (
        "Wrote pkg/sub/new.py (12 bytes)."
    )
    assert tools.read_text("pkg/sub/new.py") == "print('hi')\n"
    assert tools.call("Write", file_path="u.txt", content="héllo ✓") == "Wrote u.txt (7 bytes)."
    assert tools.read_bytes("u.txt") == "héllo ✓".encode()
    assert tools.call("Write", file_path=tools.abs("abs.txt"), content="x") == "Wrote abs.txt (1 bytes)."
    assert tools.call("Write", file_path="empty.txt", content="") == "Wrote empty.txt (0 bytes)."


def test_write_errors_are_text(tools: ToolHarness) -> None:
    tools.put("dir/file.txt", "x")
    assert tools.call("Write", file_path="a.txt") == "ValueError: content is required"
    assert tools.call("Write", content="x") == "ValueError: file_path is required"
    assert tools.call("Write", file_path="dir", content="x") == "IsADirectoryError: [Errno 21] Is a directory: 'dir'"
    out = tools.call("Write", file_path="../escape.txt", content="x")
    assert out.startswith("PermissionError: ") and "is outside the workspace" in out
    assert not (tools.root.parent / "escape.txt").exists()


# ------------------------------------------------------------------------------------- Edit


def test_edit_replaces_once(tools: ToolHarness) -> None:
    tools.put("src/calc.py", CALC)
    out = tools.call("Edit", file_path="src/calc.py", old_string="return a - b", new_string="return a + b")
    assert out == "Edited src/calc.py (1 replacement)."
    assert tools.read_text("src/calc.py") == "def add(a, b):\n    return a + b\n"


def test_edit_multiple_matches(tools: ToolHarness) -> None:
    tools.put("m.txt", "x = 1\nx = 1\nx = 1\n")
    out = tools.call("Edit", file_path="m.txt", old_string="x = 1", new_string="x = 2")
    assert out == "ValueError: old_string matched 3 times; set replace_all=true or use a more specific old_string"
    assert tools.read_text("m.txt") == "x = 1\nx = 1\nx = 1\n"
    out = tools.call("Edit", file_path="m.txt", old_string="x = 1", new_string="x = 2", replace_all="true")
    assert out == "Edited m.txt (3 replacements)."
    assert tools.read_text("m.txt") == "x = 2\nx = 2\nx = 2\n"
    out = tools.call("Edit", file_path="m.txt", old_string="x = 2\nx = 2\nx = 2", new_string="y", replace_all=True)
    assert out == "Edited m.txt (1 replacement)."


def test_edit_errors_are_text(tools: ToolHarness) -> None:
    tools.put("src/calc.py", CALC)
    edit = {"file_path": "src/calc.py"}
    assert tools.call("Edit", **edit, old_string="nope", new_string="x") == "ValueError: old_string was not found"
    assert tools.call("Edit", **edit, old_string="", new_string="x") == "ValueError: old_string must be non-empty"
    assert tools.call("Edit", **edit, old_string="add") == "ValueError: new_string is required"
    assert tools.call("Edit", **edit, new_string="x") == "ValueError: old_string is required"
    assert tools.call("Edit", file_path="gone.py", old_string="a", new_string="b") == (
        "FileNotFoundError: [Errno 2] No such file or directory: 'gone.py'"
    )
    assert tools.read_text("src/calc.py") == CALC


def test_edit_keeps_crlf_and_undecodable_bytes(tools: ToolHarness) -> None:
    tools.put("crlf.txt", b"a\r\nb\r\nc\r\n")
    tools.put("latin.py", b"# caf\xe9\nx = 2\n")
    assert tools.call("Edit", file_path="crlf.txt", old_string="a\nb", new_string="x\ny") == (
        "Edited crlf.txt (1 replacement)."
    )
    assert tools.read_bytes("crlf.txt") == b"x\r\ny\r\nc\r\n"
    assert tools.call("Edit", file_path="latin.py", old_string="x = 2", new_string="x = 3") == (
        "Edited latin.py (1 replacement)."
    )
    assert tools.read_bytes("latin.py") == b"# caf\xe9\nx = 3\n"


# ------------------------------------------------------------------------------------- Glob


def test_glob_sorted_relative_files_only(tools: ToolHarness) -> None:
    for name in ("src/deep/c.py", "src/b.py", "a.py", "src/d.txt", ".hidden/e.py", "src/.f.py"):
        tools.put(name, "")
    assert tools.call("Glob", pattern="**/*.py") == "a.py\nsrc/b.py\nsrc/deep/c.py"
    assert tools.call("Glob", pattern="*.py") == "a.py"
    assert tools.call("Glob", pattern="src/*") == "src/b.py\nsrc/d.txt"
    assert tools.call("Glob", pattern="**/*.py", path="src") == "src/b.py\nsrc/deep/c.py"
    assert tools.call("Glob", pattern="*.py", path=tools.abs("src/deep")) == "src/deep/c.py"
    assert tools.call("Glob", pattern=".hidden/*.py") == ".hidden/e.py"
    assert tools.call("Glob", pattern="**/.f.py") == "src/.f.py"
    assert tools.call("Glob", pattern="src/[bd].*") == "src/b.py\nsrc/d.txt"
    assert tools.call("Glob", pattern="**") == "a.py\nsrc/b.py\nsrc/d.txt\nsrc/deep/c.py"


def test_glob_no_match_and_errors(tools: ToolHarness) -> None:
    tools.put("a.py", "")
    assert tools.call("Glob", pattern="**/*.rs") == "No files matched."
    assert tools.call("Glob", pattern="*.py", path="missing") == "No files matched."
    assert tools.call("Glob", pattern="") == "ValueError: pattern is required"
    assert tools.call("Glob") == "ValueError: pattern is required"


def test_glob_lists_at_most_1000(tools: ToolHarness) -> None:
    names = [f"many/f{i:04d}.txt" for i in range(1005)]
    for name in names:
        tools.put(name, "")
    expected = "\n".join(sorted(names)[:1000]) + "\n... 5 more files"
    assert tools.call("Glob", pattern="many/*.txt") == expected


def test_glob_survives_symlink_loops(tools: ToolHarness) -> None:
    tools.put("pkg/a.py", "")
    os.symlink(".", tools.root / "pkg/loop")
    os.symlink("..", tools.root / "pkg/up")
    started = time.monotonic()
    assert tools.call("Glob", pattern="**/*.py") == "pkg/a.py"
    assert time.monotonic() - started < 5


# ------------------------------------------------------------------------------------- Bash


def test_bash_exit_code_and_streams(tools: ToolHarness) -> None:
    tools.put("a.py", "")
    assert tools.call("Bash", command="echo out; echo err >&2; exit 3") == leaf_bash(3, "out\n", "err\n")
    assert tools.call("Bash", command="pwd", description="where am I") == leaf_bash(0, tools.inside_root + "\n", "")
    assert tools.call("Bash", command="ls") == leaf_bash(0, "a.py\n", "")
    assert tools.call("Bash", command="cat") == leaf_bash(0, "", "")  # stdin is /dev/null
    assert tools.call("Bash", command="kill -9 $$") == leaf_bash(-9, "", "")


def test_bash_output_text_rules(tools: ToolHarness) -> None:
    assert tools.call("Bash", command=r"printf 'a\r\nb\rc'") == leaf_bash(0, "a\nb\nc", "")
    assert tools.call("Bash", command=r"printf 'x\377y'") == leaf_bash(0, "x\ufffdy", "")


def test_bash_timeout_text(tools: ToolHarness) -> None:
    # 3 s: room for a loaded runner's bash to print "before" (0.5 s was not always enough)
    assert tools.call("Bash", command="echo before; sleep 10", timeout=3) == (
        "Timed out after 3.0s\nSTDOUT:\nbefore\n\nSTDERR:\n"
    )
    assert tools.call("Bash", command="sleep 10", timeout=1200).startswith("Timed out after 1.2s\n")
    assert tools.call("Bash", command="sleep 10", timeout_ms=300).startswith("Timed out after 0.3s\n")
    assert tools.call("Bash", command="sleep 10", timeout="0.4").startswith("Timed out after 0.4s\n")
    assert tools.call("Bash", command="sleep 10", timeout=0).startswith("Timed out after 0.1s\n")


def test_bash_waits_for_background_output_like_leaf(tools: ToolHarness) -> None:
    started = time.monotonic()
    assert tools.call("Bash", command="sleep 30 & echo started", timeout=3) == (
        "Timed out after 3.0s\nSTDOUT:\nstarted\n\nSTDERR:\n"
    )
    assert time.monotonic() - started < 15
    started = time.monotonic()
    assert tools.call("Bash", command="sleep 30 >/dev/null 2>&1 & echo ok") == leaf_bash(0, "ok\n", "")
    assert time.monotonic() - started < 15  # not the 30 s of the background sleep


@pytest.mark.parametrize("stream", ["", ">&2"])
def test_bash_output_cut_at_30000_chars(tools: ToolHarness, stream: str) -> None:
    out = tools.call("Bash", command=f"head -c 40000 /dev/zero | tr '\\0' a {stream}")
    full = leaf_bash(0, "a" * 40000, "") if not stream else leaf_bash(0, "", "a" * 40000)
    assert out == f"{full[:30000]}\n[truncated {len(full) - 30000} chars]"


def test_bash_and_unknown_tool_errors(tools: ToolHarness) -> None:
    assert tools.call("Bash") == "ValueError: command is required"
    assert tools.call("Bash", command="") == "ValueError: command is required"
    assert tools.call("Bash", command="true", timeout="soon") == "ValueError: timeout must be a number, got 'soon'"
    assert tools.call("Grep", pattern="x") == "Unknown tool: Grep"
