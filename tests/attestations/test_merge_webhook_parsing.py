"""Merge and close deliveries in the forges' real payload shapes (../shared/fixtures/forge) become the
`merge` intent with who, when, the MR's head and the merged commit; anything else on an MR is ignored."""

from __future__ import annotations

import json

from app.forge.gitea_webhook import parse_gitea
from app.forge.gitlab_webhook import parse_gitlab
from tests.conftest import GITEA_SECRET, GITLAB_SECRET, shared_fixture
from tests.webhook_requests import gitea_headers, gitlab_headers


def _gitlab(hook: dict) -> object:
    return parse_gitlab(gitlab_headers(event="Merge Request Hook"), json.dumps(hook).encode(), secret=GITLAB_SECRET)


def test_gitlab_merge_request_hook_merge_close_and_open() -> None:
    hook = json.loads(shared_fixture("gitlab/docs/merge_request_hook.json").read_text())
    assert _gitlab(hook).intent == "ignore"  # the fixture's own action: open
    hook["object_attributes"].update(action="merge", state="merged", merge_commit_sha="A" * 40)
    event = _gitlab(hook)
    assert event.intent == "merge" and event.mr == 1 and event.merge is not None
    assert event.merge.action == "merged" and event.merge.by == "root" and event.merge.merged_commit == "a" * 40
    assert event.merge.head == "da1560886d4f094c3e6c9ef40349f7d38b5d27d7"
    hook["object_attributes"].update(action="close", state="closed")
    closed = _gitlab(hook)
    assert closed.intent == "merge" and closed.merge is not None
    assert closed.merge.action == "closed" and closed.merge.merged_commit is None


def test_gitea_pull_request_closed_and_merged() -> None:
    hook = json.loads(shared_fixture("gitea/woodpecker/HookPullRequestClosed.json").read_text())
    raw = json.dumps(hook).encode()
    headers = gitea_headers(raw, event="pull_request", event_type="pull_request", secret=GITEA_SECRET)
    closed = parse_gitea(headers, raw, secret=GITEA_SECRET)
    assert closed.intent == "merge" and closed.merge is not None and closed.merge.action == "closed"
    assert closed.merge.by == "anbraten" and closed.merge.head == "d555a5dd07f4d0148a58d4686ec381502ae6a2d4"
    hook["pull_request"].update(merged=True, merge_commit_sha="b" * 40, merged_by={"login": "rita"},
                                merged_at="2023-12-05T18:06:43Z")  # fmt: skip
    raw = json.dumps(hook).encode()
    headers = gitea_headers(raw, event="pull_request", event_type="pull_request", secret=GITEA_SECRET)
    merged = parse_gitea(headers, raw, secret=GITEA_SECRET)
    assert merged.merge is not None and merged.merge.action == "merged" and merged.merge.by == "rita"
    assert merged.merge.merged_commit == "b" * 40
    hook["action"] = "opened"
    raw = json.dumps(hook).encode()
    headers = gitea_headers(raw, event="pull_request", event_type="pull_request", secret=GITEA_SECRET)
    assert parse_gitea(headers, raw, secret=GITEA_SECRET).intent == "ignore"
