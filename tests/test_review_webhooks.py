"""Review-round webhooks, parsed: MR/PR comments and reviews become `review` / `stop` events,
finished pipelines and commit statuses become `ci` events, and everything else on those hooks
is ignored with a reason. The real payloads in ../shared/fixtures/forge and our own in
tests/payloads go through the same pure parsers (and a few through the real endpoints)."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select

from app.db import session_scope
from app.forge.gitea_webhook import parse_gitea
from app.forge.gitlab_webhook import parse_gitlab
from app.forge.reviews import CiJob, about_head, command_text, mentions, merge_ref_mr
from app.forge.webhook import (
    MAX_COMMENT_CHARS,
    WebhookError,
    WebhookEvent,
    WebhookMalformed,
    WebhookUnauthorized,
    project_path,
)
from app.models import Job
from tests.conftest import GITEA_SECRET, GITLAB_SECRET, shared_fixture
from tests.webhook_requests import gitea_headers, gitlab_headers, payload

GITLAB_HEAD = "3f9a1c07d2b84e5a6c1d0e9f8a7b6c5d4e3f2a10"
GITEA_HEAD = "b7c1e9a3f5d7b9c1e3a5f7d9b1c3e5a7f9d1b3c5"


def gitlab(body: bytes | dict[str, Any], event: str = "Note Hook", **options: Any) -> WebhookEvent:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_gitlab(gitlab_headers(event=event), raw, secret=GITLAB_SECRET, **options)


def gitea(body: bytes | dict[str, Any], event: str, event_type: str = "", **headers: str) -> WebhookEvent:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_gitea({**gitea_headers(raw, event=event, event_type=event_type), **headers}, raw, secret=GITEA_SECRET)


def doc(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(payload(name))
    return loaded


# --- GitLab, hand-written -------------------------------------------------------------------------


def test_gitlab_mr_note_is_a_review_request() -> None:
    event = gitlab(payload("gitlab_mr_note.json"))
    assert (event.intent, event.forge, event.event) == ("review", "gitlab", "Note Hook")
    assert (event.project, event.project_id, event.mr, event.mr_state) == ("acme/calc", "42", 12, "open")
    assert (event.source_branch, event.sender, event.issue) == ("frogfix/issue-7", "dana", None)
    assert event.clone_url == "https://git.acme.test/acme/calc.git"
    comment = event.comment
    assert comment is not None
    assert (comment.id, comment.kind, comment.author) == ("88101", "note", "dana")
    assert comment.discussion_id == "a41f0c9e7d3b5a1c9e7f5d3b1a9c7e5f3d1b9a7c"
    assert comment.url == "https://git.acme.test/acme/calc/-/merge_requests/12#note_88101"
    assert (comment.path, comment.line, comment.sha) == (None, None, GITLAB_HEAD)
    assert command_text(comment.body) == "also round negative amounts toward zero"


def test_gitlab_diff_note_carries_its_new_path_and_line() -> None:
    event = gitlab(payload("gitlab_mr_diff_note.json"))
    assert event.intent == "review" and event.comment is not None
    comment = event.comment
    assert (comment.kind, comment.path, comment.line, comment.sha) == ("diff_note", "calc/ops.py", 14, GITLAB_HEAD)
    assert comment.discussion_id == "c7e5a3f1d9b7e5c3a1f9d7b5e3c1a9f7d5b3e1c9"
    assert command_text(comment.body) is None  # a line comment is addressed to FrogFix by its kind


def test_gitlab_diff_note_on_a_removed_line_falls_back_to_the_old_side() -> None:
    data = doc("gitlab_mr_diff_note.json")
    data["object_attributes"]["position"].update(new_line=None, old_line=9, new_path=None, old_path="calc/legacy.py")
    comment = gitlab(data).comment
    assert comment is not None and (comment.path, comment.line) == ("calc/legacy.py", 9)


def test_gitlab_note_with_a_position_but_no_type_is_a_diff_note() -> None:
    data = doc("gitlab_mr_diff_note.json")
    data["object_attributes"]["type"] = "DiscussionNote"
    comment = gitlab(data).comment
    assert comment is not None and (comment.kind, comment.line) == ("diff_note", 14)
    data["object_attributes"]["position"] = None
    comment = gitlab(data).comment
    assert comment is not None and (comment.kind, comment.path, comment.line) == ("note", None, None)


@pytest.mark.parametrize("body", ["/frogfix stop", "  /FrogFix cancel please", "/frogfix stop\nthis is wrong"])
def test_gitlab_frogfix_stop_is_a_stop(body: str) -> None:
    for name in ("gitlab_mr_note.json", "gitlab_mr_diff_note.json"):
        data = doc(name)
        data["object_attributes"]["note"] = body
        event = gitlab(data)
        assert event.intent == "stop", name
        assert event.comment is not None and event.comment.body == body


@pytest.mark.parametrize("body", ["/frogfix rebase", "/FrogFix update", "/frogfix rebase\nmain moved"])
def test_gitlab_frogfix_rebase_asks_for_an_update_round(body: str) -> None:
    for name in ("gitlab_mr_note.json", "gitlab_mr_diff_note.json"):
        data = doc(name)
        data["object_attributes"]["note"] = body
        event = gitlab(data)
        assert event.intent == "update", name
        assert event.reason == "/frogfix rebase (an update round) on a merge request"
        assert event.comment is not None and event.comment.body == body


def test_gitlab_frogfix_stopping_is_not_a_stop() -> None:
    data = doc("gitlab_mr_note.json")
    data["object_attributes"]["note"] = "/frogfix stopping the float case is fine, handle negatives"
    assert gitlab(data).intent == "review"


@pytest.mark.parametrize(
    ("state", "state_id", "expected"),
    [
        ("opened", None, "open"),
        ("locked", None, "open"),
        ("closed", None, "closed"),
        ("merged", None, "merged"),
        (None, 3, "merged"),
        (None, 2, "closed"),
        ("reopened-somehow", None, None),
    ],
)
def test_gitlab_mr_state_is_normalised(state: str | None, state_id: int | None, expected: str | None) -> None:
    data = doc("gitlab_mr_note.json")
    data["merge_request"].pop("state_id", None)
    data["merge_request"]["state"] = state
    if state_id is not None:
        data["merge_request"]["state_id"] = state_id
    assert gitlab(data).mr_state == expected


@pytest.mark.parametrize("noteable", ["Commit", "Snippet", None])  # an issue's: tests/answers/test_answer_webhooks.py
def test_gitlab_note_not_on_a_merge_request_is_ignored(noteable: str | None) -> None:
    data = doc("gitlab_mr_note.json")
    data["object_attributes"]["noteable_type"] = noteable
    event = gitlab(data)
    assert event.intent == "ignore" and "not on a merge request" in event.reason
    assert event.comment is None


def test_gitlab_system_note_and_edits_are_ignored() -> None:
    data = doc("gitlab_mr_note.json")
    data["object_attributes"]["system"] = True
    event = gitlab(data)
    assert event.intent == "ignore" and "system note" in event.reason and event.mr == 12
    data = doc("gitlab_mr_note.json")
    data["object_attributes"]["action"] = "update"
    event = gitlab(data)
    assert event.intent == "ignore" and "only a new comment" in event.reason
    del data["object_attributes"]["action"]  # before GitLab 16.11 a note hook names no action
    assert gitlab(data).intent == "review"


def test_gitlab_confidential_note_follows_allow_confidential() -> None:
    body = payload("gitlab_mr_note.json")
    event = gitlab(body, event="Confidential Note Hook")
    assert event.intent == "ignore" and "FROGFIX_GITLAB_ALLOW_CONFIDENTIAL" in event.reason
    assert gitlab(body, event="Confidential Note Hook", allow_confidential=True).intent == "review"
    data = doc("gitlab_mr_note.json")
    data["event_type"] = "confidential_note"
    assert gitlab(data).intent == "ignore"
    data = doc("gitlab_mr_note.json")
    data["object_attributes"]["internal"] = True
    assert gitlab(data).intent == "ignore"


def test_gitlab_comment_text_is_bounded_and_storable() -> None:
    data = doc("gitlab_mr_note.json")
    data["object_attributes"]["note"] = "/frogfix \x00fix " + "x" * (3 * MAX_COMMENT_CHARS)
    data["object_attributes"]["position"] = {"new_path": "a" * 5000 + "\ud800", "new_line": 2**40}
    comment = gitlab(data).comment
    assert comment is not None
    assert len(comment.body) == MAX_COMMENT_CHARS and "\x00" not in comment.body
    assert comment.path is not None and len(comment.path) == 1000
    assert comment.line is None  # not a line number any file has


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.pop("merge_request"), "merge_request"),
        (lambda d: d["merge_request"].update(iid="12"), "merge_request.iid"),
        (lambda d: d["object_attributes"].update(id=None), "object_attributes.id"),
        (lambda d: d["project"].update(path_with_namespace="../etc"), "project.path_with_namespace"),
        (lambda d: d.update(project=[]), "project"),
        (lambda d: d["merge_request"]["last_commit"].update(id="not a sha; rm -rf"), "commit"),
    ],
)
def test_gitlab_malformed_note_is_refused_with_a_clear_message(change: Any, message: str) -> None:
    data = doc("gitlab_mr_note.json")
    change(data)
    with pytest.raises(WebhookMalformed, match=re.escape(message)) as refused:
        gitlab(data)
    assert refused.value.event == "Note Hook" and refused.value.delivery_id


def test_gitlab_failed_pipeline_is_a_ci_event_with_its_failed_jobs() -> None:
    event = gitlab(payload("gitlab_pipeline_failed.json"), event="Pipeline Hook")
    assert (event.intent, event.project, event.mr, event.mr_state) == ("ci", "acme/calc", 12, "open")
    assert (event.source_branch, event.sender, event.action) == ("frogfix/issue-7", "mira", "failed")
    report = event.ci
    assert report is not None
    assert (report.system, report.id, report.sha, report.status) == ("gitlab_pipeline", "311", GITLAB_HEAD, "failed")
    assert (report.ref, report.source) == ("refs/merge-requests/12/head", "merge_request_event")
    assert report.url == "https://git.acme.test/acme/calc/-/pipelines/311"
    # the allowed failure (docs-links) did not fail the pipeline; the hook carries no logs
    assert report.failed_jobs == (
        CiJob("9103", "unit-tests", "failed", "test", "script_failure", "https://git.acme.test/acme/calc/-/jobs/9103"),
    )


def test_gitlab_merged_results_pipeline_names_its_mr_and_its_merge_commit() -> None:
    event = gitlab(payload("gitlab_pipeline_merged_results.json"), event="Pipeline Hook")
    assert (event.intent, event.mr, event.mr_state, event.source_branch) == ("ci", 12, "open", "frogfix/issue-7")
    report = event.ci
    assert report is not None and report.status == "failed"
    # The merge commit GitLab made of the MR's head and main: on no branch, so triage maps it to the head.
    assert report.sha == "8c2d4e6f10a3b5c7d9e1f20a4b6c8d0e2f4a6b81" and report.sha != GITLAB_HEAD
    assert merge_ref_mr(report.ref) == 12
    assert [job.name for job in report.failed_jobs] == ["unit-tests"]


@pytest.mark.parametrize(
    ("ref", "mr"),
    [
        ("refs/merge-requests/12/merge", 12),
        ("refs/merge-requests/12/head", None),  # an MR pipeline on the head itself
        ("frogfix/issue-7", None),
        ("refs/merge-requests/0/merge", None),
        ("refs/merge-requests/12/merge/x", None),
        (" refs/merge-requests/12/merge", None),
        (None, None),
    ],
)
def test_merged_results_refs(ref: str | None, mr: int | None) -> None:
    assert merge_ref_mr(ref) == mr


def test_a_ci_result_is_about_the_head_only_on_that_very_commit() -> None:
    assert about_head("a" * 40, "a" * 40)
    assert not about_head("a" * 40, "b" * 40)
    assert not about_head(None, "a" * 40) and not about_head("a" * 40, None) and not about_head("", "")


@pytest.mark.parametrize("status", ["running", "pending", "created", "manual", "waiting_for_resource", None])
def test_gitlab_unfinished_pipeline_is_ignored(status: str | None) -> None:
    data = doc("gitlab_pipeline_failed.json")
    data["object_attributes"]["status"] = status
    event = gitlab(data, event="Pipeline Hook")
    assert event.intent == "ignore" and "not final" in event.reason and event.ci is None


@pytest.mark.parametrize("status", ["success", "canceled", "skipped"])
def test_gitlab_other_final_pipelines_are_ci_events(status: str) -> None:
    data = doc("gitlab_pipeline_failed.json")
    data["object_attributes"]["status"] = status
    event = gitlab(data, event="Pipeline Hook")
    assert event.intent == "ci" and event.ci is not None and event.ci.status == status


def test_gitlab_branch_pipeline_takes_its_branch_from_the_ref_and_tags_are_ignored() -> None:
    data = doc("gitlab_pipeline_failed.json")
    data["merge_request"] = None
    data["object_attributes"].update(ref="frogfix/issue-7", source="push", url=None)
    event = gitlab(data, event="Pipeline Hook")
    assert (event.intent, event.mr, event.mr_state, event.source_branch) == ("ci", None, None, "frogfix/issue-7")
    assert event.ci is not None and event.ci.url == "https://git.acme.test/acme/calc/-/pipelines/311"
    data["object_attributes"]["ref"] = "refs/merge-requests/12/head"
    assert gitlab(data, event="Pipeline Hook").source_branch is None
    data["object_attributes"].update(tag=True, ref="v1.2.0")
    assert gitlab(data, event="Pipeline Hook").intent == "ignore"


def test_gitlab_malformed_pipeline_is_refused() -> None:
    data = doc("gitlab_pipeline_failed.json")
    data["object_attributes"]["sha"] = "$(reboot)"
    data["commit"]["id"] = "$(reboot)"
    with pytest.raises(WebhookMalformed, match=re.escape("object_attributes.sha")):
        gitlab(data, event="Pipeline Hook")
    data = doc("gitlab_pipeline_failed.json")
    data["object_attributes"]["id"] = -4
    with pytest.raises(WebhookMalformed, match=re.escape("object_attributes.id")):
        gitlab(data, event="Pipeline Hook")


def test_gitlab_pipeline_failed_jobs_are_bounded() -> None:
    data = doc("gitlab_pipeline_failed.json")
    template = data["builds"][0]
    data["builds"] = [{**template, "id": n + 1, "name": "n" * 5000} for n in range(500)] + ["junk", None]
    report = gitlab(data, event="Pipeline Hook").ci
    assert report is not None and len(report.failed_jobs) == 50
    assert all(len(job.name) == 255 for job in report.failed_jobs)


def test_gitlab_job_hook_is_ignored_with_a_reason() -> None:
    event = gitlab(payload("gitlab_pipeline_failed.json"), event="Job Hook")
    assert event.intent == "ignore" and "pipelines" in event.reason


def test_gitlab_note_signature_is_checked() -> None:
    body = payload("gitlab_mr_note.json")
    for token in (None, "", "wrong"):
        with pytest.raises(WebhookUnauthorized):
            parse_gitlab(gitlab_headers(event="Note Hook", token=token), body, secret=GITLAB_SECRET)


# --- GitLab, the shared real payloads --------------------------------------------------------------

GITLAB_NOTES = {
    "gitlab/docs/note_hook_merge_request.json": ("1244", "note", "root", "This MR needs work.", 1, "master"),
    "gitlab/go-gitlab/note_merge_request.json": ("1244", "note", "root", "This MR needs work.", 1, "master"),
    "gitlab/zulip/note_hook__merge_request_note.json": (
        "1406328457",
        "note",
        "sbansal1999",
        "I am not sure if this new feature is even required or not.",
        1,
        "feature",
    ),
    "gitlab/go-scm/merge_request_comment_create.json": ("50772616", "note", "sytses", "lgtm", 1, "feature"),
    "gitlab/go-scm/review_comment_create.json": ("50772639", "diff_note", "sytses", "check spelling", 1, "feature"),
}


@pytest.mark.parametrize("rel", sorted(GITLAB_NOTES))
def test_gitlab_shared_mr_notes_are_review_requests(rel: str) -> None:
    data = json.loads(shared_fixture(rel).read_bytes())
    event = gitlab(shared_fixture(rel).read_bytes())
    note_id, kind, author, body, mr, branch = GITLAB_NOTES[rel]
    assert (event.intent, event.mr, event.mr_state, event.source_branch) == ("review", mr, "open", branch)
    assert event.project == data["project"]["path_with_namespace"]
    assert event.comment is not None
    assert (event.comment.id, event.comment.kind, event.comment.author, event.comment.body) == (
        note_id,
        kind,
        author,
        body,
    )
    assert event.comment.discussion_id == data["object_attributes"].get("discussion_id")
    assert event.comment.url == data["object_attributes"]["url"]
    assert event.comment.sha == data["merge_request"]["last_commit"]["id"]


def test_gitlab_shared_diff_note_has_its_position() -> None:
    comment = gitlab(shared_fixture("gitlab/go-scm/review_comment_create.json").read_bytes()).comment
    assert comment is not None
    assert (comment.path, comment.line) == ("README.md", 1)
    assert comment.discussion_id == "e2d22c5e7bc2dda3d55f3ddc6d48b65326e2612b"


@pytest.mark.parametrize(
    "rel",
    [
        "gitlab/docs/note_hook_issue.json",
        "gitlab/go-gitlab/note_issue.json",
        "gitlab/go-scm/issue_comment_create.json",
        "gitlab/go-playground_webhooks/comment-issue-event.json",
        "gitlab/go-playground_webhooks/confidential-comment-event.json",
    ],
)
def test_gitlab_shared_issue_notes_are_ignored(rel: str) -> None:
    event = gitlab(shared_fixture(rel).read_bytes(), allow_confidential=True)
    assert event.intent == "ignore" and "not on a merge request" in event.reason


GITLAB_PIPELINES = {
    # rel: (status, mr, source_branch, failed job ids)
    "gitlab/docs/pipeline_hook.json": ("success", 1, "test", ("378",)),  # a failed job in a passed pipeline
    "gitlab/go-scm/pipeline_hook.json": ("success", 15, "shivamnegi94-main-patch-62619", ()),
    "gitlab/go-gitlab/pipeline.json": ("success", 1, "test", ()),  # a skipped job with a failure_reason
    "gitlab/guancecloud_datakit/pipeline_hook_failed_merge_request_null.json": ("failed", None, "iss-449", ("120257",)),
}


@pytest.mark.parametrize("rel", sorted(GITLAB_PIPELINES))
def test_gitlab_shared_pipelines_are_ci_events(rel: str) -> None:
    data = json.loads(shared_fixture(rel).read_bytes())
    event = gitlab(shared_fixture(rel).read_bytes(), event="Pipeline Hook")
    status, mr, branch, failed = GITLAB_PIPELINES[rel]
    assert (event.intent, event.mr, event.source_branch) == ("ci", mr, branch)
    assert event.mr_state == ("open" if mr else None)
    report = event.ci
    assert report is not None
    attrs = data["object_attributes"]
    assert (report.id, report.sha, report.status, report.ref) == (str(attrs["id"]), attrs["sha"], status, attrs["ref"])
    assert report.source == attrs["source"]
    assert report.url == attrs.get("url", f"{data['project']['web_url']}/-/pipelines/{attrs['id']}")
    assert tuple(job.id for job in report.failed_jobs) == failed
    assert all(job.log_tail == "" and job.status == "failed" for job in report.failed_jobs)


def _strict_json(jsonc: bytes) -> bytes:
    """The docs' job hook block has `//` comments and a trailing comma; GitLab itself sends strict JSON."""
    text = re.sub(r"(?<=,)[ \t]+//[^\n]*", "", jsonc.decode())
    return re.sub(r",(\s*[}\]])", r"\1", text).encode()


@pytest.mark.parametrize(
    "rel",
    ["gitlab/docs/job_hook.jsonc", "gitlab/go-gitlab/job.json", "gitlab/guancecloud_datakit/job_hook_failed.json"],
)
def test_gitlab_shared_job_hooks_are_ignored(rel: str) -> None:
    event = gitlab(_strict_json(shared_fixture(rel).read_bytes()), event="Job Hook")
    assert event.intent == "ignore" and "Pipeline events" in event.reason


# --- Gitea / Forgejo, hand-written -----------------------------------------------------------------


def test_gitea_pr_comment_is_a_review_request() -> None:
    event = gitea(payload("gitea_pr_comment.json"), "issue_comment", "pull_request_comment")
    assert (event.intent, event.forge, event.event, event.action) == ("review", "gitea", "issue_comment", "created")
    assert (event.project, event.project_id, event.mr, event.mr_state) == ("acme/calc", "12", 4, "open")
    assert (event.sender, event.issue, event.source_branch) == ("rita", None, None)
    comment = event.comment
    assert comment is not None
    assert (comment.id, comment.kind, comment.author) == ("311", "note", "rita")
    assert comment.url == "https://gitea.acme.test/acme/calc/pulls/4#issuecomment-311"
    assert mentions(comment.body, "frogfix-bot") and command_text(comment.body) is None


def test_gitea_pr_comment_is_recognised_by_is_pull_or_pull_request() -> None:
    data = doc("gitea_pr_comment.json")
    del data["is_pull"]  # Gitea before ~1.16 sends no is_pull: issue.pull_request says it
    assert gitea(data, "issue_comment", "issue_comment").intent == "review"
    data["issue"]["pull_request"] = None
    event = gitea(data, "issue_comment", "issue_comment")
    assert event.intent == "ignore" and "not on a pull request" in event.reason and event.comment is None
    data["is_pull"] = True
    assert gitea(data, "issue_comment", "issue_comment").intent == "review"


@pytest.mark.parametrize("action", ["edited", "deleted", None])
def test_gitea_edited_or_deleted_comment_is_ignored(action: str | None) -> None:
    data = doc("gitea_pr_comment.json")
    data["action"] = action
    event = gitea(data, "issue_comment", "pull_request_comment")
    assert event.intent == "ignore" and "only a new comment" in event.reason


def test_gitea_frogfix_stop_is_a_stop() -> None:
    data = doc("gitea_pr_comment.json")
    data["comment"]["body"] = "/frogfix stop"
    assert gitea(data, "issue_comment", "pull_request_comment").intent == "stop"
    data = doc("gitea_review_rejected.json")
    data["review"]["content"] = "/frogfix cancel"
    assert gitea(data, "pull_request_rejected", "pull_request_review_rejected").intent == "stop"


def test_gitea_frogfix_update_asks_for_an_update_round() -> None:
    data = doc("gitea_pr_comment.json")
    data["comment"]["body"] = "/frogfix update"
    event = gitea(data, "issue_comment", "pull_request_comment")
    assert event.intent == "update" and event.reason == "/frogfix rebase (an update round) on a pull request"
    data = doc("gitea_review_rejected.json")
    data["review"]["content"] = "/frogfix rebase"
    assert gitea(data, "pull_request_rejected", "pull_request_review_rejected").intent == "update"


@pytest.mark.parametrize(
    ("state", "merged", "expected"),
    [("open", False, "open"), ("closed", False, "closed"), ("closed", True, "merged"), ("weird", None, None)],
)
def test_gitea_pr_state_is_normalised(state: str, merged: bool | None, expected: str | None) -> None:
    data = doc("gitea_pr_comment.json")
    data["issue"].update(state=state, pull_request={"merged": merged, "merged_at": None})
    assert gitea(data, "issue_comment", "pull_request_comment").mr_state == expected
    data = doc("gitea_review_rejected.json")
    data["pull_request"].update(state=state, merged=merged)
    assert gitea(data, "pull_request_rejected", "pull_request_review_rejected").mr_state == expected


def test_gitea_review_requesting_changes_is_a_review_request() -> None:
    event = gitea(payload("gitea_review_rejected.json"), "pull_request_rejected", "pull_request_review_rejected")
    assert (event.intent, event.mr, event.mr_state, event.action) == ("review", 4, "open", "reviewed")
    assert (event.source_branch, event.sender, event.project) == ("frogfix/issue-3", "rita", "acme/calc")
    comment = event.comment
    assert comment is not None
    assert (comment.kind, comment.author, comment.sha) == ("review_changes", "rita", GITEA_HEAD)
    assert comment.body.startswith("Negative amounts still round away from zero")
    assert comment.url == "https://gitea.acme.test/acme/calc/pulls/4"


def test_gitea_review_id_is_stable_over_redelivery_and_differs_per_review() -> None:
    body = payload("gitea_review_rejected.json")
    first = gitea(body, "pull_request_rejected", "pull_request_review_rejected").comment
    again = gitea(body, "pull_request_rejected", "pull_request_review_rejected").comment  # a new delivery id
    data = doc("gitea_review_rejected.json")
    data["review"]["content"] = "Also rename the helper."
    other = gitea(data, "pull_request_rejected", "pull_request_review_rejected").comment
    assert first is not None and again is not None and other is not None
    assert first.id == again.id and first.id != other.id and first.id.startswith("review-")


def test_gitea_review_kind_comes_from_the_signed_body() -> None:
    data = doc("gitea_review_rejected.json")
    # the headers are not signed; review.type in the body is
    event = gitea(data, "pull_request_approved", "pull_request_review_approved")
    assert event.intent == "review" and event.comment is not None and event.comment.kind == "review_changes"
    data["review"]["type"] = "pull_request_review_approved"
    event = gitea(data, "pull_request_rejected", "pull_request_review_rejected")
    assert event.intent == "ignore" and "approving" in event.reason
    assert event.comment is not None and event.comment.kind == "review_approved"
    data["review"]["type"] = "pull_request_review_comment"
    event = gitea(data, "pull_request_comment", "pull_request_review_comment")
    assert event.intent == "review" and event.comment is not None and event.comment.kind == "review_comment"


def test_gitea_review_type_falls_back_to_the_headers_then_unknown_is_ignored() -> None:
    data = doc("gitea_review_rejected.json")
    del data["review"]["type"]
    event = gitea(data, "pull_request_review", "pull_request_review_rejected")
    assert event.comment is not None and event.comment.kind == "review_changes"
    event = gitea(data, "pull_request_review", "")
    assert event.intent == "ignore" and "not handled" in event.reason
    data = doc("gitea_review_rejected.json")
    data["action"] = "review_requested"
    assert gitea(data, "pull_request_rejected", "pull_request_review_rejected").intent == "ignore"


def test_gitea_failed_status_is_a_ci_event() -> None:
    event = gitea(payload("gitea_status_failure.json"), "status", "status")
    assert (event.intent, event.project, event.mr, event.source_branch) == ("ci", "acme/calc", None, "frogfix/issue-3")
    assert (event.sender, event.action) == ("woodpecker", "failure")
    report = event.ci
    assert report is not None
    assert (report.system, report.id, report.sha, report.status) == (
        "gitea_status",
        "ci/woodpecker/pr/test",
        GITEA_HEAD,
        "failed",
    )
    assert (report.url, report.description, report.ref) == (
        "https://ci.acme.test/repos/3/pipeline/58",
        "Pipeline failed",
        "frogfix/issue-3",
    )
    assert [(job.name, job.status, job.url) for job in report.failed_jobs] == [
        ("ci/woodpecker/pr/test", "failed", "https://ci.acme.test/repos/3/pipeline/58"),
    ]


@pytest.mark.parametrize(("state", "status"), [("error", "failed"), ("success", "success")])
def test_gitea_error_and_success_statuses(state: str, status: str) -> None:
    data = doc("gitea_status_failure.json")
    data["state"] = state
    event = gitea(data, "status", "status")
    assert event.intent == "ci" and event.ci is not None and event.ci.status == status
    assert bool(event.ci.failed_jobs) == (status == "failed")


@pytest.mark.parametrize("state", ["pending", "warning", None, 3])
def test_gitea_pending_status_is_ignored(state: Any) -> None:
    data = doc("gitea_status_failure.json")
    data["state"] = state
    event = gitea(data, "status", "status")
    assert event.intent == "ignore" and "not final" in event.reason and event.ci is None


def test_gitea_status_without_branches_has_no_source_branch() -> None:
    data = doc("gitea_status_failure.json")
    del data["branches"]
    event = gitea(data, "status", "status")
    assert event.intent == "ci" and event.source_branch is None and event.ci is not None and event.ci.ref is None


@pytest.mark.parametrize(
    ("name", "event", "change", "message"),
    [
        ("gitea_status_failure.json", "status", lambda d: d.update(sha="HEAD~1", commit=None), "sha"),
        ("gitea_status_failure.json", "status", lambda d: d.pop("repository"), "repository"),
        ("gitea_review_rejected.json", "pull_request_rejected", lambda d: d.pop("review"), "review"),
        ("gitea_review_rejected.json", "pull_request_rejected", lambda d: d.update(pull_request="4"), "pull_request"),
        ("gitea_review_rejected.json", "pull_request_rejected", lambda d: d.update(commit_id="zz"), "commit_id"),
        ("gitea_pr_comment.json", "issue_comment", lambda d: d["comment"].update(id="311"), "comment.id"),
        ("gitea_pr_comment.json", "issue_comment", lambda d: d["issue"].update(number=0), "issue.number"),
        ("gitea_pr_comment.json", "issue_comment", lambda d: d.update(comment=None), "comment"),
    ],
)
def test_gitea_malformed_is_refused_with_a_clear_message(name: str, event: str, change: Any, message: str) -> None:
    data = doc(name)
    change(data)
    with pytest.raises(WebhookMalformed, match=re.escape(message)) as refused:
        gitea(data, event)
    assert refused.value.event == event


def test_gitea_comment_text_is_bounded_and_storable() -> None:
    data = doc("gitea_pr_comment.json")
    data["comment"]["body"] = "\ud800" + "y" * (2 * MAX_COMMENT_CHARS)
    comment = gitea(data, "issue_comment", "pull_request_comment").comment
    assert comment is not None and len(comment.body) == MAX_COMMENT_CHARS
    comment.body.encode("utf-8")


def test_gitea_review_signature_is_checked() -> None:
    body = payload("gitea_review_rejected.json")
    for secret in (None, "", "wrong-secret"):
        headers = gitea_headers(
            body, event="pull_request_rejected", event_type="pull_request_review_rejected", secret=secret
        )
        with pytest.raises(WebhookUnauthorized):
            parse_gitea(headers, body, secret=GITEA_SECRET)


# --- Gitea / Forgejo, the shared real payloads -----------------------------------------------------

GITEA_REVIEWS = {
    # rel: (X-Gitea-Event, X-Gitea-Event-Type, intent, kind, mr, source_branch) as Gitea sends each
    "gitea/woodpecker/HookPullRequestReviewDeny.json": (
        "pull_request_rejected",
        "pull_request_review_rejected",
        "review",
        "review_changes",
        7,
        "jony-patch-1",
    ),
    "gitea/woodpecker/HookPullRequestReviewComment.json": (
        "pull_request_comment",
        "pull_request_review_comment",
        "review",
        "review_comment",
        7,
        "jony-patch-1",
    ),
    "gitea/woodpecker/HookPullRequestReviewAck.json": (
        "pull_request_approved",
        "pull_request_review_approved",
        "ignore",
        "review_approved",
        7,
        "jony-patch-1",
    ),
    "gitea/jenkins-x_go-scm/review_approved.json": (
        "pull_request_approved",
        "pull_request_review_approved",
        "ignore",
        "review_approved",
        1,
        "feature",
    ),
    # older Gitea: review.type pull_request_comment; the MANIFEST notes the pull_request_review header
    "gitea/go-playground_webhooks/pull-request-review-event.json": (
        "pull_request_review",
        "",
        "review",
        "review_comment",
        2,
        "master",
    ),
}


@pytest.mark.parametrize("rel", sorted(GITEA_REVIEWS))
def test_gitea_shared_reviews(rel: str) -> None:
    data = json.loads(shared_fixture(rel).read_bytes())
    header, header_type, intent, kind, mr, branch = GITEA_REVIEWS[rel]
    event = gitea(shared_fixture(rel).read_bytes(), header, header_type)
    assert (event.intent, event.mr, event.mr_state, event.source_branch) == (intent, mr, "open", branch)
    assert event.project == data["repository"]["full_name"] and event.sender == data["sender"]["login"]
    assert event.comment is not None
    assert (event.comment.kind, event.comment.body) == (kind, data["review"]["content"])
    assert event.comment.sha == (data.get("commit_id") or data["pull_request"]["head"]["sha"])  # "" in some
    if intent == "ignore":
        assert "approving" in event.reason


GITEA_PR_COMMENTS = {
    # rel: (comment id, body, mr)
    "gitea/go-playground_webhooks/pull-request-comment-event.json": ("6", "example", 2),
    "gitea/go-scm/pull_request_comment_created.json": ("45", "run gofmt", 2),
}


@pytest.mark.parametrize("rel", sorted(GITEA_PR_COMMENTS))
@pytest.mark.parametrize(
    ("header", "header_type"),
    [("issue_comment", "pull_request_comment"), ("issue_comment", "issue_comment"), ("pull_request_comment", "")],
)
def test_gitea_shared_pr_comments_are_review_requests(rel: str, header: str, header_type: str) -> None:
    data = json.loads(shared_fixture(rel).read_bytes())
    event = gitea(shared_fixture(rel).read_bytes(), header, header_type)
    comment_id, body, mr = GITEA_PR_COMMENTS[rel]
    assert (event.intent, event.mr, event.mr_state, event.project) == (
        "review",
        mr,
        "open",
        data["repository"]["full_name"],
    )
    assert event.comment is not None
    assert (event.comment.id, event.comment.kind, event.comment.body) == (comment_id, "note", body)
    assert event.comment.author == data["comment"]["user"]["login"] == event.sender


@pytest.mark.parametrize(
    "rel",
    [
        "gitea/go-scm/issue_comment_created.json",
        "gitea/go-scm/issue_comment_edited.json",
        "gitea/go-playground_webhooks/issue-comment-event.json",
    ],
)
def test_gitea_shared_plain_issue_comments_stay_ignored(rel: str) -> None:
    event = gitea(shared_fixture(rel).read_bytes(), "issue_comment", "issue_comment")
    assert event.intent == "ignore" and "not on a pull request" in event.reason


def test_forgejo_headers_carry_a_review_too() -> None:
    body = shared_fixture("gitea/woodpecker/HookPullRequestReviewDeny.json").read_bytes()
    headers = gitea_headers(body, event="pull_request_rejected", event_type="pull_request_review_rejected")
    headers = {k.replace("Gitea", "Forgejo"): v for k, v in headers.items()}
    event = parse_gitea(headers, body, secret=GITEA_SECRET)
    assert event.intent == "review" and event.delivery_id == headers["X-Forgejo-Delivery"]


# --- Through the real endpoints ---------------------------------------------------------------------


def _jobs() -> list[Job]:
    with session_scope() as s:
        return list(s.execute(select(Job)).scalars())


@pytest.mark.parametrize(
    ("name", "event"),
    [
        ("gitlab_mr_note.json", "Note Hook"),
        ("gitlab_mr_diff_note.json", "Note Hook"),
        ("gitlab_pipeline_failed.json", "Pipeline Hook"),
    ],
)
def test_gitlab_endpoint_answers_review_hooks_and_checks_their_token(client: Any, name: str, event: str) -> None:
    body = payload(name)
    assert (
        client.post("/webhooks/gitlab", content=body, headers=gitlab_headers(event=event, token="no")).status_code
        == 401
    )
    r = client.post("/webhooks/gitlab", content=body, headers=gitlab_headers(event=event))
    assert r.status_code == 200, r.text  # no job of FrogFix's is on that MR: no round, no job
    assert _jobs() == []


@pytest.mark.parametrize(
    ("name", "event", "event_type"),
    [
        ("gitea_pr_comment.json", "issue_comment", "pull_request_comment"),
        ("gitea_review_rejected.json", "pull_request_rejected", "pull_request_review_rejected"),
        ("gitea_status_failure.json", "status", "status"),
    ],
)
def test_gitea_endpoint_answers_review_hooks_and_checks_their_signature(
    client: Any, name: str, event: str, event_type: str
) -> None:
    body = payload(name)
    bad = gitea_headers(body, event=event, event_type=event_type, secret="wrong-secret")
    assert client.post("/webhooks/gitea", content=body, headers=bad).status_code == 401
    r = client.post("/webhooks/gitea", content=body, headers=gitea_headers(body, event=event, event_type=event_type))
    assert r.status_code == 200, r.text
    assert _jobs() == []


def test_malformed_signed_review_hook_is_400_not_500(client: Any) -> None:
    data = doc("gitlab_mr_note.json")
    data["merge_request"] = "12"
    r = client.post("/webhooks/gitlab", content=json.dumps(data).encode(), headers=gitlab_headers(event="Note Hook"))
    assert r.status_code == 400 and "merge_request" in r.text


# --- Fuzz: random review-shaped JSON only ever gives a WebhookError or a well-formed event ---------

fuzz = settings(
    max_examples=250, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
odd = st.text(max_size=10) | st.sampled_from(
    ["\x00", "\ud800", "/frogfix stop", "/frogfix rebase", "", "a" * 7, GITLAB_HEAD]
)
scalar = st.none() | st.booleans() | st.integers(-3, 2**40) | st.floats() | odd
value = st.recursive(scalar, lambda c: st.lists(c, max_size=3) | st.dictionaries(odd, c, max_size=3), max_leaves=10)


def _maybe(base: dict[str, Any], draw_value: Any) -> st.SearchStrategy[Any]:
    """A real document with some of its fields replaced by junk."""
    keys = sorted(base)
    return st.dictionaries(st.sampled_from(keys), draw_value, max_size=4).map(lambda junk: {**base, **junk})


def _nested(name: str) -> st.SearchStrategy[Any]:
    data = doc(name)
    inner = {k: _maybe(v, value) if isinstance(v, dict) else st.just(v) | value for k, v in data.items()}
    return st.fixed_dictionaries(inner)


def _check(event: WebhookEvent) -> None:
    assert event.intent in ("ignore", "review", "stop", "update", "ci", "answer")
    if event.intent == "answer":
        assert event.comment is not None and event.project is not None and event.issue is not None
        assert event.mr is None and len(event.comment.body) <= MAX_COMMENT_CHARS
    if event.intent in ("review", "stop", "update"):
        assert event.comment is not None and event.project is not None and event.mr is not None
        assert len(event.comment.body) <= MAX_COMMENT_CHARS
    if event.intent == "ci":
        assert event.ci is not None and re.fullmatch("[0-9a-f]{7,64}", event.ci.sha)
    if event.project is not None:
        assert project_path(event.project, "project") == event.project
    assert event.mr is None or 0 < event.mr < 2**31
    for text in _texts([getattr(event, f.name) for f in fields(event)]):
        assert "\x00" not in text
        text.encode("utf-8")  # no lone surrogates: the database must be able to store it


def _texts(item: Any) -> list[str]:
    """Every string in an event's fields, its comment's and its CI report's (and their jobs')."""
    if isinstance(item, str):
        return [item]
    if hasattr(item, "to_dict"):
        item = item.to_dict()
    if isinstance(item, dict):
        item = list(item.values())
    if isinstance(item, (list, tuple)):
        return [text for inner in item for text in _texts(inner)]
    return []


@fuzz
@given(
    data=st.sampled_from(["gitlab_mr_note.json", "gitlab_mr_diff_note.json", "gitlab_pipeline_failed.json"]).flatmap(
        _nested
    ),
    event=st.sampled_from(["Note Hook", "Confidential Note Hook", "Pipeline Hook", "Job Hook"]),
)
def test_gitlab_review_parsers_raise_only_webhook_errors(data: Any, event: str) -> None:
    try:
        parsed = gitlab(data, event=event, allow_confidential=True)
    except WebhookError:
        return
    _check(parsed)


@fuzz
@given(
    data=st.sampled_from(["gitea_pr_comment.json", "gitea_review_rejected.json", "gitea_status_failure.json"]).flatmap(
        _nested
    ),
    event=st.sampled_from(
        list(
            (
                "issue_comment",
                "pull_request_rejected",
                "pull_request_comment",
                "pull_request_approved",
                "pull_request_review",
                "status",
            )
        )
    ),
)
def test_gitea_review_parsers_raise_only_webhook_errors(data: Any, event: str) -> None:
    try:
        parsed = gitea(data, event=event)
    except WebhookError:
        return
    _check(parsed)
