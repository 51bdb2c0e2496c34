"""What FrogFix writes on the forge cannot be turned against its readers by the model or the repository.

A hostile issue can shape the model's final answer and the names of the files it creates; both end
up in the MR description and the issue comment, which the forge renders for reviewers and where
GitLab runs quick actions written by the bot's account.
"""

from __future__ import annotations

import re

from tests.forge_oracles import bare_mentions, closing_references, quick_action_lines, rendered_outside_code
from worker.attempts.verifier import TestEvidence as Evidence
from worker.texts.mr_text import Provenance, code_span, comment_finished, inert, mr_description

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
    assert code_span("calc.py") == "`calc.py`"
    span = code_span("a`b ``c|d")
    assert span.startswith("```") and span.endswith("```") and "\\|" in span


def test_the_mr_description_shows_the_models_words_as_plain_text() -> None:
    description = mr_description(
        issue_ref="#1",
        issue_url=None,
        summary=HOSTILE,
        diffstat=[("x` @all ![i](http://h/p)", 1, 0)],
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


# -- issue 12: inert even where a forge reads raw text, and file names that hold line breaks -----


def _description(
    summary: str = "ok",
    diffstat: tuple[tuple[str, int, int], ...] = (),
    command: str = "pytest",
    log: str = "",
    flags: tuple[str, ...] = (),
    sandbox: str = "local",
) -> str:
    return mr_description(
        issue_ref="#1",
        issue_url=None,
        summary=summary,
        diffstat=list(diffstat),
        tests=Evidence(command, {"exit_code": 1, "log": log}, [{"exit_code": 0, "log": ""}]),
        flags=list(flags),
        job_url=None,
        provenance=Provenance("m", {}, "abc", sandbox, 1, 1),
        redact=lambda s: s,
    )


def _new_file(name: str) -> str:
    """A patch adding `name`, as git writes it (the name C-quoted)."""
    quoted = '"b/' + name.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r") + '"'
    header = f"diff --git {quoted.replace('b/', 'a/', 1)} {quoted}\nnew file mode 100644\n"
    return header + f"--- /dev/null\n+++ {quoted}\n@@ -0,0 +1 @@\n+x\n"


def test_no_summary_or_log_leaves_its_code_block() -> None:
    """CommonMark closes a fence on an indented line of backticks with trailing spaces, and ends a
    line at a lone CR; GitLab's quick-action reader ends a code block at the first line of ```."""
    for hostile in ("x\n  ````  \n@all ![i](http://h/p)", "x\r```\r@all <img src=http://h/p>", "x\n```\n/merge"):
        description = _description(summary=hostile, log=hostile)
        outside = rendered_outside_code(description)
        assert "@all" not in outside and "<img" not in outside, hostile
        assert quick_action_lines(description) == [], hostile


def test_closing_references_in_the_models_words_cannot_close_other_issues() -> None:
    """GitLab's closing pattern reads the raw description, code blocks included."""
    words = "Closes other-group/billing#17, fixes #2 and https://h/g/p/-/issues/3; Resolves PROJ-9"
    description = _description(summary=words, log=words, flags=(f"changes test file {words}",))
    assert closing_references(description) == set()
    assert "other-group/billing" in description and "PROJ-9" in description  # still readable


def test_file_names_with_line_breaks_stay_in_their_code_span_and_row() -> None:
    names = ["a\n/ready\n", "c\n/merge\n", "b\n@all\n", "e\n/assign @eve\n", "r\r/close\r", "q\\n.py"]
    description = _description(diffstat=tuple((n, 1, 0) for n in names))
    assert quick_action_lines(description) == [] and bare_mentions(description) == []
    rows = [line for line in description.split("\n") if line.startswith("| `")]
    assert len(rows) == len(names) and all(row.endswith(" | 1 | 0 |") for row in rows)
    assert '| `"a\\n/ready\\n"` |' in description and '| `"r\\r/close\\r"` |' in description
    assert '| `"q\\\\n.py"` |' in description  # a real backslash never reads as a line break


def test_the_job_page_names_files_on_one_line_as_the_mr_does() -> None:
    from app.web.views import parse_diff

    [shown] = parse_diff(_new_file("a\n/ready\n"))
    assert shown.path == '"a\\n/ready\\n"'


def test_the_test_command_flags_and_sandbox_image_cannot_leave_their_place() -> None:
    """.frogfix.yml chose the command and the image; a flag quotes a file name."""
    description = _description(
        command="pytest` @all ![i](http://h/p) `", flags=("changes test file a\n/ready\n",), sandbox="local (x\n/merge)"
    )
    outside = rendered_outside_code(description)
    assert "@all" not in outside and "<img" not in outside
    assert quick_action_lines(description) == []
    assert "- **changes test file a\\n/ready\\n**" in description  # a flag is one line


def test_a_comment_quoting_a_name_with_a_carriage_return_runs_nothing() -> None:
    text = comment_finished("no fix", "patch refused: adds binary file a\r/merge\r@all", 1, None, lambda s: s)
    assert quick_action_lines(text) == [] and bare_mentions(text) == []
    mr = comment_finished("draft merge request ready", "", 1, None, lambda s: s, mr_url="https://h/g/p/-/merge_requests/7")
    assert mr.endswith("Please review https://h/g/p/-/merge_requests/7.")  # our own link stays a link


def test_a_secret_holding_characters_that_inert_changes_is_still_redacted() -> None:
    """Redaction comes first: after a zero-width space or an entity, a redactor no longer sees the secret."""
    secret = "s3cr@t<&>pw"

    def redact(text: str) -> str:
        return text.replace(secret, "[REDACTED]")

    description = mr_description(
        issue_ref="#1",
        issue_url=None,
        summary=f"token {secret}",
        diffstat=[],
        tests=Evidence(f"pytest --pw {secret}", {"exit_code": 1, "log": secret}, []),
        flags=[f"changes test file {secret}"],
        job_url=None,
        provenance=Provenance("m", {}, "abc", f"local ({secret})", 1, 1),
        redact=redact,
    )
    comment = comment_finished("no fix", f"refused: {secret}", 1, None, redact)
    for text in (description, comment):
        assert "s3cr" not in text and "[REDACTED]" in text
