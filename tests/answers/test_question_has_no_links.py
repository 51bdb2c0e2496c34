"""FrogFix's question carries no link, image or reference, whatever the model wrote (issue 36).

The bot's account posts the question, so a link there is the bot's link. Found: link text with
nested or escaped brackets (`[a [b] c](//host/x)`), protocol-relative `//host` URLs and forge-relative
paths (`/-/user_settings/personal_access_tokens?...`) survived `safe_question`. The oracle is a
CommonMark renderer with link detection on (markdown-it-py with linkify-it-py, which also links bare
domains by their TLD), over the hostile cases and generated ones: no `<a`, no `<img`; and the forges'
own references (GitLab's and Gitea's: #1, !1, &1, ~label, %milestone, $1, ^alert, @user, commit SHAs)
never stand outside a code span.
"""

from __future__ import annotations

import html as html_text
import random
import re

import pytest
from markdown_it import MarkdownIt

from worker.job.question import safe_question

HOSTILE = [
    "Which version? [a [b] c](//host/x) tells you.",
    "Please confirm [a \\[b\\] c](//attacker.example/x) before we go on.",
    "See [docs][1] for the details.\n\n[1]: https://attacker.example/steal",
    "Log in at [here](/-/user_settings/personal_access_tokens?name=frogfix-bot&scopes=api,sudo) please.",
    "Open <https://attacker.example> and <mailto:a@attacker.example> to check the value.",
    "Does www.attacker.example or attacker.example/x or setup.py define it?",
    "Is ![x](https://attacker.example/p.png) what you expected to see here?",
    "Which one of [x]: //attacker.example and [x] do you mean exactly?",
    "What does //attacker.example/path return when the input is empty?",
    "Is http://169.254.169.254/latest or javascript:alert(1) or data:text/html,x relevant?",
    "Should #12, !3, &4, ~bug, ~\"needs review\", %v1.0, $5, ^alert#1 and @admin change too?",
    "Is commit deadbeef1234567 or 0123456789abcdef0123456789abcdef01234567 the right one?",
    "Please check [link](<//attacker.example/a b>) and [y](javascript:alert(1)) thoroughly.",
    "What about [nested [deeper [deepest]]](//a.b/c) and [`code`](//a.b) in the answer?",
    "Should the reply use \\\\[x\\\\](//attacker.example) or [[wiki page]] formatting here?",
    "Is a reference like group/project#12 or owner/repo!3 or GL-12 meant by the report?",
    "Do café.com, пример.рф, пример.com, ドメイン名例.jp or postmaster@例え.jp resolve in your network?",
]
PIECES = [
    "[", "]", "(", ")", "\\", "!", "<", ">", "//", "http://", "https:", "www.", "attacker.example", "/x",
    "a.b", ".py", "?q=1", "&", "#1", "!2", "@u", "~l", "%m", "$3", "^a", "deadbeef123", ":", " ", "text",
    "[a", "](", "]:", "mailto:", "`", "*", "_", "\n", "\n\n", "пример.рф", "café.com", "@例え.jp",
]


def generated(count: int, seed: int = 36) -> list[str]:
    rng = random.Random(seed)
    return ["Which value is right? " + "".join(rng.choice(PIECES) for _ in range(rng.randint(4, 40)))
            for _ in range(count)]


RENDERERS = {
    "commonmark+linkify": MarkdownIt("commonmark", {"linkify": True}).enable("linkify"),
    "gfm-like": MarkdownIt("gfm-like"),
}
# A forge reference the forges link by themselves, when it is not in a code span.
# (GitLab: #1 issue, !1 MR, &1 epic, $1 snippet, ~label, %milestone, @user, ^alert#1, a/b#1, commit SHAs;
# Gitea: #1, !1, @user, owner/repo#1, SHAs.)
REFERENCE = re.compile(
    r"(?<![\w])(?:[#!&$]\d|[~%@][\w\"']|\^alert#|[\w.-]+/[\w.-]+[#!]\d)|\b(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b"
)


def outside_code(html: str) -> str:
    return re.sub(r"<code>.*?</code>", "", html, flags=re.S)


@pytest.mark.parametrize("reply", HOSTILE + generated(800) + generated(800, seed=3600))
def test_the_question_renders_with_no_link_image_or_reference(reply: str) -> None:
    question = safe_question(reply, lambda text: text)
    if question is None:
        return  # nothing usable left: the fallback question is FrogFix's own words
    for name, renderer in RENDERERS.items():
        html = renderer.render(question)
        assert "<a" not in html and "<img" not in html, (name, question, html)
        assert not REFERENCE.search(html_text.unescape(outside_code(html))), (name, question, html)


def test_the_words_stay_readable() -> None:
    question = safe_question("Which version of setup.py do you run, does [the guide](//x.y) apply, and is issue.py#12"
                             " the file?", lambda text: text)
    assert question is not None
    assert "setup.py" in question and "the guide" in question and "//x.y" not in question
    assert "\\u200b" not in question  # no zero-width space shown as an escape (a code span shows what it holds)
