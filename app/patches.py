"""Reading a `git diff --binary` for display: the dashboard's one patch parser.

Git C-quotes a path that holds odd bytes (`"a/sp\\303\\251cial"`), ends a name holding spaces with
a tab on its `---`/`+++` lines, and writes no such lines at all for binary, mode-only and
rename-only sections, where both paths come from the `diff --git a/X b/Y` header. It only ever
shows patches git itself regenerated (worker/attempts/stored_patch.py); nothing is judged from this
reading: the review rules and the MR's file table read what git stored instead (a patch git
cannot apply is stored as nothing). Standard library only.
`shown_path` is how every reader shows such a name to a person: one line, as git quotes it.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass, field

HEADER = "diff --git "
BINARY_MARK = "GIT binary patch"


@dataclass
class FileDiff:
    """One file's section of a `git diff --binary`: both sides' paths, header lines, added lines, removed count.

    `body` keeps the section's hunks (or binary data) exactly as written, for readers that show them.
    """

    old_path: str
    path: str
    header: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: int = 0
    binary: bool = False
    body: list[str] = field(default_factory=list)

    def has(self, prefix: str) -> bool:
        return any(line.startswith(prefix) for line in self.header)

    @property
    def symlink(self) -> bool:
        """The new side is a symlink (mode 120000): added, retargeted, or turned into one."""
        if self.has("deleted file mode"):
            return False
        return any(
            line in ("new file mode 120000", "new mode 120000")
            or (line.startswith("index ") and line.endswith(" 120000"))
            for line in self.header
        )

    @property
    def status(self) -> str:
        """added, deleted, renamed or modified, as the header says."""
        if self.has("deleted file mode"):
            return "deleted"
        if self.has("new file mode"):
            return "added"
        return "renamed" if self.has("rename to ") else "modified"


def unquote(name: str) -> str:
    """A path as git prints it: C-quoted (`"a/sp\\303\\251cial"`) when it holds odd bytes."""
    if not (len(name) >= 2 and name[0] == name[-1] == '"'):
        return name
    body, out, i = name[1:-1], bytearray(), 0
    escapes = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
    while i < len(body):
        octal = body[i + 1 : i + 4]
        if body[i] == "\\" and len(octal) == 3 and all(c in "01234567" for c in octal):
            out.append(int(octal, 8) & 0xFF)
            i += 4
        elif body[i] == "\\" and i + 1 < len(body) and body[i + 1] in escapes:
            out.append(escapes[body[i + 1]])
            i += 2
        else:
            out.extend(body[i].encode("utf-8", "surrogateescape"))
            i += 1
    return out.decode("utf-8", "surrogateescape")


def _quoted_end(text: str) -> int:
    """The index just past the C-quoted name that `text` starts with (-1 when it is not closed)."""
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
        elif text[i] == '"':
            return i + 1
        else:
            i += 1
    return -1


def header_paths(line: str) -> tuple[str, str]:
    """Both sides from `diff --git a/X b/Y`, for sections without `---`/`+++` lines (binary, mode, rename)."""
    rest = line[len(HEADER) :]
    if rest.startswith('"') and (end := _quoted_end(rest)) != -1:
        return unquote(rest[:end])[2:], unquote(rest[end + 1 :])[2:]
    if rest.endswith('"') and (start := rest.rfind(' "b/')) != -1:
        return rest[:start][2:], unquote(rest[start + 1 :])[2:]
    half = (len(rest) - 5) // 2  # `a/X b/X`: both sides are the same path unless it was renamed
    if half > 0 and rest[: 2 + half] == "a/" + rest[5 + half :] and rest[2 + half : 5 + half] == " b/":
        return rest[5 + half :], rest[5 + half :]
    old, _, new = rest.partition(" b/")
    return old.removeprefix("a/"), new


def _read_header_line(current: FileDiff, line: str) -> None:
    """One line before the hunks: keep it, and take the paths and binary marks it carries."""
    current.header.append(line)
    name = line[4:].rstrip("\t")  # git ends a name that holds spaces with a tab
    if line.startswith("--- ") and name != "/dev/null":
        current.old_path = unquote(name)[2:]
    elif line.startswith("+++ ") and name != "/dev/null":
        current.path = unquote(name)[2:]
    elif line.startswith(("rename from ", "copy from ")):
        current.old_path = unquote(line.split(" from ", 1)[1])
    elif line.startswith(("rename to ", "copy to ")):
        current.path = unquote(line.split(" to ", 1)[1])
    elif line.startswith("Binary files "):
        current.binary = True


def file_diffs(patch: str, *, headerless: str | None = None) -> Iterator[FileDiff]:
    """The file sections of a patch, in order.

    Lines before the first `diff --git` header are skipped, unless `headerless` names them: then
    they form a section of that name (a plain `diff -u`, shown rather than judged).
    """
    current = FileDiff(headerless, headerless) if headerless is not None else None
    in_hunks = False
    for line in patch.splitlines():
        if line.startswith(HEADER):
            if current is not None and (current.header or current.body or headerless is None):
                yield current
            current, in_hunks, headerless = FileDiff(*header_paths(line), [line]), False, None
            continue
        if current is None:
            continue
        if line.startswith("@@") or line == BINARY_MARK:
            in_hunks = True
            current.binary = current.binary or line == BINARY_MARK
        elif not in_hunks:
            _read_header_line(current, line)
            continue
        current.body.append(line)
        if line.startswith("+"):
            current.added.append(line[1:])
        elif line.startswith("-"):
            current.removed += 1
    if current is not None and (current.header or current.body or headerless is None):
        yield current


# -- showing names and text that git, the model or a repository chose --------------------------

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f", "\v": "\\v", "\a": "\\a"}


def _hidden(char: str) -> bool:
    """A character that breaks a line or shows nothing: controls, format characters (bidi
    overrides, zero-width), line and paragraph separators, and undecodable bytes."""
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_hidden(text: str, *, keep: str = "") -> str:
    """`text` with every hidden character except those in `keep` written as a visible escape
    (`\\n`, `\\r`, `\\x1c`, `\\u2028`), so it cannot start a line or hide anything where it is shown."""
    return "".join(_escape(c) if c not in keep and _hidden(c) else c for c in text)


def shown_path(path: str) -> str:
    """A path as a reviewer sees it: as is, or, when it holds a hidden character, a backslash or a
    double quote, C-quoted as git prints such names (`"a\\n/ready\\n"`). Either way one line, and
    two different names never look the same. The MR's file table and the job page use this."""
    if not any(c in '"\\' or _hidden(c) for c in path):
        return path
    return '"' + escape_hidden(path.replace("\\", "\\\\").replace('"', '\\"')) + '"'


# -- a patch's size, in the one wording the CLI, the job page and the selection use ---------------------


def changed_lines_words(count: int) -> str:
    """`1 changed line`, `2 changed lines`: a patch's added plus removed lines."""
    return f"{count} changed line{'' if count == 1 else 's'}"


def patch_size(patch: str | None) -> str:
    """A patch's size as every reader words it: `2 changed lines (+1 -1)`; `no change` for an empty one."""
    added = removed = 0
    for diff in file_diffs(patch or ""):
        added, removed = added + len(diff.added), removed + diff.removed
    if not added and not removed:
        return "no change"
    return f"{changed_lines_words(added + removed)} (+{added} -{removed})"
