"""What FrogFix writes on the forge cannot be turned against its readers by the model or the repository.

A hostile issue can shape the model's final answer and the names of the files it creates; both end
up in the MR description and the issue comment, which the forge renders for reviewers and where
GitLab runs quick actions written by the bot's account.
"""

from __future__ import annotations

import re

from worker.report import Provenance, _code, comment_finished, inert, mr_description
from worker.report import TestEvidence as Evidence

HOSTILE = (
    "Fixed it.\n/merge\n  /close\n@all please approve\n![x](http://127.0.0.1:9/leak?d=secret)\n"
    '<img src="http://127.0.0.1:9/p"> <details open>'
)


def _visible_markdown(text: str) -> str:
    """The description without its fenced blocks: what the forge renders as Markdown."""
    return re.sub(r"(`{3,})text\n.*?\n\1", "", text, flags=re.S)


def test_inert_removes_mentions_images_html_and_quick_actions() -> None:
    made = inert(HOSTILE)
    assert not re.search(r"^\s*/", made, re.M)  # no line starts a quick action
    assert not re.search(r"@\w", made) and "![" not in made and "<" not in made
    assert "Fixed it." in made and "merge" in made and "all please approve" in made  # still readable


def test_code_spans_cannot_be_closed_by_the_text() -> None:
    assert _code("calc.py") == "`calc.py`"
    span = _code("a`b ``c|d")
    assert span.startswith("```") and span.endswith("```") and "\\|" in span


def test_the_mr_description_shows_the_models_words_as_plain_text() -> None:
    patch = "diff --git a/x` @all ![i](http://h/p) b/x` @all ![i](http://h/p)\n--- a/x\n+++ b/x\n+1\n"
    description = mr_description(
        issue_ref="#1",
        issue_url=None,
        summary=HOSTILE,
        patch=patch,
        tests=Evidence("pytest", {"exit_code": 1, "log": "@all /merge"}, [{"exit_code": 0, "log": ""}]),
        flags=["adds binary file @all.bin"],
        job_url=None,
        provenance=Provenance("m", {}, "abc", "local", 1, 1),
        redact=lambda s: s,
    )
    # shown, inside a text block, and disarmed even there (GitLab's quick-action reader ends a code
    # block at its first line of three backticks, and a forge may read mentions in code)
    assert "\u200b/merge" in description and "@\u200ball please approve" in description
    rendered = _visible_markdown(description)
    assert not re.search(r"^\s*/", rendered, re.M)
    outside_code = re.sub(r"(`+).*?\1", "", rendered)  # code spans render no mention, image or HTML
    assert "@all" not in outside_code and "@\u200ball.bin" in outside_code
    assert "![x]" not in rendered and "<img" not in rendered and "<details open>" not in rendered


def test_comments_quote_reasons_inertly_but_may_notify_the_labeller() -> None:
    text = comment_finished(
        "no fix", "attempt 1's patch was refused: adds binary file @all/x.bin", 1, None, lambda s: s, notify="dev"
    )
    assert text.startswith("@dev FrogFix finished") and "@all" not in text
    assert comment_finished("failed", "x", 1, None, lambda s: s, notify="a b @all").startswith("FrogFix")
