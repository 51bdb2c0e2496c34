"""How a forge reads what FrogFix posts, as test oracles written from the forges' own rules.

- GitLab's quick actions: `Gitlab::QuickActions::Extractor` deletes `\\r`, skips blocks from a line
  starting with ``` to the next line of exactly ```, and runs every other line that starts with
  `/command`. Its idea of a code block is not CommonMark's.
- Closing references: GitLab's default closing pattern (docs: "Default closing pattern") and
  Gitea/Forgejo's close and reopen keywords before a reference (modules/references), as one
  superset; both read the raw text, code blocks included.
- Mentions, images and HTML: what a CommonMark renderer (markdown-it-py) leaves outside code.
"""

from __future__ import annotations

import re

from markdown_it import MarkdownIt

_KEYWORD = r"(?i:clos(?:e[sd]?|ing)|fix(?:e[sd]|ing)?|resolv(?:e[sd]?|ing)|implement(?:s|ed|ing)?|reopen(?:s|ed)?)"
_REF = r"(?:(?:[\w.-]+(?:/[\w.-]+)*)?[#!]\d+|https?://\S+?/(?:issues|pulls|work_items)/\d+|[A-Z][A-Z0-9_]+-\d+)"
_CLOSING = re.compile(rf"\b{_KEYWORD}:?[ \t]+(?:(?i:issues?)[ \t]+)?((?:{_REF})(?:(?: *,? +and +| *,? *)(?:{_REF}))*)")
_GITLAB_CODE_BLOCK = re.compile(r"^```.+?\n```$", re.S | re.M)


def closing_references(text: str) -> set[str]:
    """Every issue a forge would close (or reopen) from `text` with its default keywords."""
    found: set[str] = set()
    for match in _CLOSING.finditer(text):
        found.update(re.findall(_REF, match.group(1)))
    return found


def quick_action_lines(text: str) -> list[str]:
    """Lines GitLab would run as quick actions, and, stricter, any line (by every line break
    Python knows, `\\r` included) that starts with a slash after optional spaces."""
    gitlab = _GITLAB_CODE_BLOCK.sub("", text.replace("\r", ""))
    runs = [line for line in gitlab.split("\n") if line.startswith("/")]
    return list(dict.fromkeys(runs + [line for line in text.splitlines() if re.match(r"\s*/", line)]))


def bare_mentions(text: str) -> list[str]:
    """`@name` anywhere, code included (a forge may read mentions in code spans)."""
    return re.findall(r"@[\w.-]+", text)


def rendered_outside_code(markdown: str) -> str:
    """The HTML a CommonMark renderer makes of `markdown`, without code blocks and code spans."""
    html = MarkdownIt("commonmark").enable("table").render(markdown)
    return re.sub(r"<pre>.*?</pre>|<code>.*?</code>", "", html, flags=re.S)
