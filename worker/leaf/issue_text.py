"""Issue text is untrusted: remove what a human reviewer would not see before the model reads it."""

from __future__ import annotations

import re

_HTML_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.S)
# Zero-width characters, bidirectional controls and other invisible format characters.
_INVISIBLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff\u00ad\u180e\U000e0000-\U000e007f]")
_MD_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]*)(?:\s+\"[^\"]*\")?\)")
_HTML_IMG = re.compile(r"<img\b[^>]*>", re.I)
_DETAILS_HIDDEN = re.compile(
    r"<(\w+)[^>]*\b(?:hidden|style\s*=\s*\"[^\"]*display\s*:\s*none[^\"]*\")[^>]*>.*?</\1>", re.I | re.S
)


def sanitize_issue_text(text: str | None, limit: int = 30_000) -> str:
    """Drop HTML comments, invisible and bidi control characters, image alt text and hidden HTML."""
    if not text:
        return ""
    text = text.replace("\r\n", "\n")
    text = _HTML_COMMENT.sub("", text)
    text = _DETAILS_HIDDEN.sub("", text)
    text = _MD_IMAGE.sub("[image]", text)
    text = _HTML_IMG.sub("[image]", text)
    text = _INVISIBLE.sub("", text)
    text = re.sub(r"\n{4,}", "\n\n\n", text).strip()
    if len(text) > limit:
        text = text[:limit] + f"\n[issue text truncated: {len(text) - limit} more characters]"
    return text
