"""`Forge.issue_comments` (issue 24: the reporter's answer to FrogFix's question) on both clients, against
the HTTP doubles: oldest first, system notes left out, internal notes marked, our token scrubbed, bounded."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime

from app.forge.api import ISSUE_COMMENT_BODY_LIMIT, ISSUE_COMMENT_LIMIT, ForgeNotFound
from app.forge.gitea_api import GiteaForge
from app.forge.gitlab_api import GitLabForge
from app.redaction import REDACTED
from app.retrying import RetryPolicy
from tests.conftest import shared_fixture
from tests.doubles.gitea_api import GiteaDouble
from tests.doubles.gitlab_api import GitLabDouble

P = "acme/widgets"


def gitlab(double: GitLabDouble, retry: RetryPolicy) -> GitLabForge:
    return GitLabForge(double.base_url, double.token, retry=retry, timeout=5.0)


def gitea(double: GiteaDouble, retry: RetryPolicy) -> GiteaForge:
    return GiteaForge(double.base_url, double.token, retry=retry, timeout=5.0)


def test_gitlab_issue_comments(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = gitlab(gitlab_double, retry)
    forge.comment(P, 1, "FrogFix is working on this issue")
    gitlab_double.add_issue_note(P, 1, "added ~frognano-fix label", by="dev", system=True)
    gitlab_double.add_issue_note(P, 1, "The input is 2, 3", by="rep")
    gitlab_double.add_issue_note(P, 1, "only members see this", by="dev", internal=True)
    gitlab_double.add_issue_note(P, 1, f"/frogfix my token? {gitlab_double.token}", by="dev")

    comments = forge.issue_comments(P, 1)

    assert [(c.author, c.internal) for c in comments] == [
        ("frogfix-bot", False), ("rep", False), ("dev", True), ("dev", False),
    ]
    assert comments[0].body.endswith("FrogFix is working on this issue")  # ours, with its hidden marker
    assert comments[1].body == "The input is 2, 3"
    assert comments[1].created_at == datetime.fromisoformat(gitlab_double.notes[2]["created_at"].replace("Z", "+00:00"))
    assert comments[3].body == f"/frogfix my token? {REDACTED}"  # the comments reach the model: our token never
    assert comments[1].id == str(gitlab_double.notes[2]["id"])
    [read] = gitlab_double.calls("GET", "/issues/1/notes")
    assert read.query.get("sort") == ["desc"] and read.query.get("order_by") == ["created_at"]


def test_issue_comments_come_oldest_first_by_the_forges_times(
    gitlab_double: GitLabDouble, gitea_double: GiteaDouble, retry: RetryPolicy
) -> None:
    """Times as each forge writes them (GitLab UTC with milliseconds, Gitea with its server's offset)."""
    gitlab_double.add_issue_note(P, 1, "second", by="rep", created_at="2020-01-02T10:05:00.123Z")
    gitlab_double.add_issue_note(P, 1, "first", by="rep", created_at="2020-01-02T10:04:59.999Z")
    found = gitlab(gitlab_double, retry).issue_comments(P, 1)
    assert [c.body for c in found] == ["first", "second"]
    assert found[1].created_at == datetime(2020, 1, 2, 10, 5, 0, 123000, tzinfo=UTC)
    gitea_double.add_issue_comment(P, 1, "second", by="rep", created_at="2020-01-02T19:05:00+09:00")
    gitea_double.add_issue_comment(P, 1, "first", by="rep", created_at="2020-01-02T10:04:00Z")
    found = gitea(gitea_double, retry).issue_comments(P, 1)
    assert [c.body for c in found] == ["first", "second"]
    assert found[1].created_at == datetime(2020, 1, 2, 10, 5, tzinfo=UTC)


def test_gitlab_issue_comments_are_bounded_newest_kept(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    for i in range(ISSUE_COMMENT_LIMIT + 30):
        gitlab_double.add_issue_note(P, 1, f"comment {i}", by="rep")
    gitlab_double.add_issue_note(P, 1, "x" * (ISSUE_COMMENT_BODY_LIMIT * 2), by="rep")
    comments = gitlab(gitlab_double, retry).issue_comments(P, 1)
    assert len(comments) == ISSUE_COMMENT_LIMIT
    assert comments[-2].body == f"comment {ISSUE_COMMENT_LIMIT + 29}"  # the newest, oldest first
    assert len(comments[-1].body) <= ISSUE_COMMENT_BODY_LIMIT and "trimmed by FrogFix" in comments[-1].body


def test_gitlab_issue_comments_of_real_note_shapes(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    """Notes exactly as GitLab's notes API wrote them (the danger capture's discussions hold the same note
    objects as GET .../notes), moved onto the double's issue: system notes out, authors and times read."""
    real = json.loads(
        shared_fixture("gitlab/danger/api_responses/merge_request_1_discussions_response.json").read_text("utf-8")
    )
    issue = gitlab_double.issues[(gitlab_double.projects[next(iter(gitlab_double.projects))]["id"], 1)]
    notes = [copy.deepcopy(n) for d in real for n in d["notes"]]
    for note in notes:
        note.update(project_id=issue["project_id"], noteable_iid=1, noteable_type="Issue")
    gitlab_double.notes.extend(notes)
    comments = gitlab(gitlab_double, retry).issue_comments(P, 1)
    human = sorted((n for n in notes if not n["system"]), key=lambda n: (n["created_at"], n["id"]))
    assert [c.id for c in comments] == [str(n["id"]) for n in human]
    assert all(c.author and c.created_at is not None for c in comments)


def test_gitlab_issue_comments_of_a_missing_issue(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    try:
        gitlab(gitlab_double, retry).issue_comments(P, 99)
    except ForgeNotFound:
        return
    raise AssertionError("a missing issue must be ForgeNotFound")


def test_gitea_issue_comments(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    forge = gitea(gitea_double, retry)
    forge.comment(P, 1, "FrogFix is working on this issue")
    gitea_double.add_issue_comment(P, 1, "The input is 2, 3", by="rep")
    gitea_double.add_issue_comment(P, 1, f"/frogfix my token? {gitea_double.token}", by="dev")

    comments = forge.issue_comments(P, 1)

    assert [c.author for c in comments] == [gitea_double.bot["login"], "rep", "dev"]
    assert comments[1].created_at is not None and comments[1].created_at.tzinfo is not None
    assert comments[2].body == f"/frogfix my token? {REDACTED}" and not any(c.internal for c in comments)
    assert comments[1].id == str(gitea_double.comments[1]["id"])


def test_gitea_issue_comments_are_bounded(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    for i in range(ISSUE_COMMENT_LIMIT + 5):
        gitea_double.add_issue_comment(P, 1, f"comment {i}", by="rep")
    comments = gitea(gitea_double, retry).issue_comments(P, 1)
    assert len(comments) == ISSUE_COMMENT_LIMIT and comments[-1].body == f"comment {ISSUE_COMMENT_LIMIT + 4}"
