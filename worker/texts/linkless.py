"""A paragraph that no Markdown the forges render turns into a link, an image or a reference.

Why its own module: FrogFix's question to the issue (worker/job/question.py `safe_question`) is the
model's words posted by the bot's account, and a link there is the bot's link. Removing link
syntax with patterns misses forms (nested and escaped brackets, reference definitions,
autolinks, protocol-relative `//host`, forge-relative paths); this instead leaves no syntax to
form one, whatever the model wrote:
- `\\`, `[` and `]` are backslash-escaped, so no inline link, image, reference or reference
  definition opens (CommonMark, GitLab's and Gitea's renderers alike); `<` is HTML-escaped by
  `inert` afterwards, so no autolink or raw HTML;
- what a linkifier links by itself (a URL with a scheme, `www.`, `//host`) is replaced, and a
  word with a dot between letters (`attacker.example`, `setup.py`, which a linkifier's TLD list
  may match) is set in a code span, where no renderer links;
- forge references the forges link by themselves: a commit SHA is set in a code span, and
  `unreferenced` (applied after `inert`, whose hidden-character escaping would show a zero-width
  space written before it) puts a zero-width space after the sign of `&epic`, `~label`,
  `%milestone`, `$snippet` and `^alert` (`#`, `!` and `@` are `disarm`'s).
The caller: `unreferenced(inert(linkless(text)))`.
"""

from __future__ import annotations

import re

from worker.texts.mr_text import ZWSP

LINK_REMOVED = "(link removed)"
# Anything with `://`, whatever comes before it (`_http://x`: a linkifier does not need a word boundary).
_SCHEMED = re.compile(
    r"(?i)[a-z0-9+.\-]*://\S*|(?<![\w:/])//[^\s/]\S*|(?<![a-z0-9])www\.\S*"
    r"|(?<![a-z0-9])(?:mailto|javascript|data|file|vbscript|tel|ftp|irc|xmpp):\S+"
)
# A word holding a dot between a letter or digit and a letter, in any script (an IDN host, `пример.рф`):
# a host, an e-mail address, a file name, a dotted path. No `&`, `<` or `>` in it: `inert` escapes those
# as entities, which a code span would show as they are.
_DOTTED = re.compile(r"[\w@%+\-~/]*[^\W_]\.[^\W\d_][\w.\-~/%?=#+]*")
# Bounded by what is not hex, not by \b: emphasis (`_abc1234_`) makes a text node of it on the forge.
_SHA = re.compile(r"(?<![0-9A-Za-z])(?=[0-9a-f]{0,39}[0-9])(?=[0-9a-f]{0,39}[a-f])[0-9a-f]{7,40}(?![0-9A-Za-z])")
# A reference's sign before a word or a quote; `&` is `inert`'s `&amp;` by the time this runs.
_SIGIL = re.compile(r"(&amp;|[~%$^])(?=[\w\"'])")


def linkless(text: str) -> str:
    """`text` (one paragraph) with no link, image or reference left to form (see the module)."""
    text = _SCHEMED.sub(LINK_REMOVED, text)
    out: list[str] = []
    last = 0
    for match in re.finditer(f"{_DOTTED.pattern}|{_SHA.pattern}", text):
        out.append(_escaped(text[last : match.start()]))
        out.append(_code(match.group(0)))
        last = match.end()
    out.append(_escaped(text[last:]))
    return "".join(out)


def _code(token: str) -> str:
    """`token` as a code span. Not `code_span`: its zero-width spaces would be shown as escapes by `inert`,
    which the caller applies afterwards (and which disarms the span's content then). `token` has no
    backtick (the question's were replaced) and no hidden character (removed before)."""
    ticks = "`" * (max((len(run) for run in re.findall(r"`+", token)), default=0) + 1)
    pad = " " if token.startswith("`") or token.endswith("`") else ""
    return f"{ticks}{pad}{token}{pad}{ticks}"


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]")


def unreferenced(text: str) -> str:
    """`text` (already `inert`) with a zero-width space after each reference sign the forges link by themselves
    (an `&` is `&amp;` by then: the space goes after the entity)."""
    return _SIGIL.sub(lambda m: m.group(1) + ZWSP, text)
