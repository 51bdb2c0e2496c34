"""Every real payload in ../shared/fixtures/forge goes through the real endpoints.

The trigger label is set, per payload, to the first label that payload carries, so "starts
nothing" is a real claim and not an accident of an absent label. Only these should start a job.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.db import session_scope
from app.models import Job
from tests.conftest import GITEA_SECRET, SHARED_FIXTURES, configure, shared_fixture
from tests.webhook_requests import gitea_headers, gitlab_headers

GITLAB_STARTERS = {
    "gitlab/go-scm/issue_labeled.json",  # changes.labels: [] -> [critical]
    "gitlab/go-scm/issue_reopen.json",  # reopened with changes.labels: [] -> [critical]
    "gitlab/docs/issue_hook.json",  # changes.labels: [API] -> [Platform]
    "gitlab/go-gitlab/issue.json",  # same change as the docs example
    "gitlab/remember-5_gitlab-bot/issue-event.json",  # real 17.11 headers around the docs example body
}
GITEA_STARTERS = {
    "gitea/go-playground_webhooks/issue-label-event.json",  # label_updated on an open issue, labels [bug]
}
NOT_WEBHOOKS = {"MANIFEST.json", "hmac_test_vectors.json"}
GITLAB_EVENT_BY_KIND = {"issue": "Issue Hook", "note": "Note Hook", "merge_request": "Merge Request Hook"}


def _files(*folders: str) -> list[str]:
    if not SHARED_FIXTURES.is_dir():
        return ["(shared fixtures absent)"]
    found = []
    for folder in folders:
        for path in sorted((SHARED_FIXTURES / folder).rglob("*.json")):
            rel = path.relative_to(SHARED_FIXTURES).as_posix()
            if path.name not in NOT_WEBHOOKS and "/headers/" not in rel and "/api_responses/" not in rel:
                found.append(rel)
    return found


def _labels(data: dict[str, Any]) -> list[str]:
    """The payload's labels, any label that the change added first."""
    change = (data.get("changes") or {}).get("labels") or {}
    previous = {lab.get("title") for lab in change.get("previous") or [] if isinstance(lab, dict)}
    titles = [lab.get("title") for lab in change.get("current") or [] if isinstance(lab, dict)]
    titles = [t for t in titles if t not in previous] + [t for t in titles if t in previous]
    titles += [lab.get("title") for lab in data.get("labels") or [] if isinstance(lab, dict)]
    for key in ("issue", "pull_request"):
        inner = data.get(key)
        if isinstance(inner, dict):
            titles += [lab.get("name") for lab in inner.get("labels") or [] if isinstance(lab, dict)]
    return [t for t in titles if t]


def _jobs() -> list[Job]:
    with session_scope() as s:
        return list(s.execute(select(Job)).scalars())


@pytest.mark.parametrize("rel", _files("gitlab"))
def test_gitlab_fixture(client: Any, frogfix_env: dict[str, Any], rel: str) -> None:
    path = shared_fixture(rel)
    data = json.loads(path.read_bytes())
    headers = gitlab_headers()
    if "_source" in data and "body" in data:  # a capture with its real headers around the body
        headers = {**data["headers"], "X-Gitlab-Token": headers["X-Gitlab-Token"]}
        data = data["body"]
        body = json.dumps(data).encode()
    else:
        body = path.read_bytes()
        kind = data.get("object_kind")
        event = GITLAB_EVENT_BY_KIND.get(kind, "System Hook")
        if kind == "issue" and (data.get("event_type") == "confidential_issue" or "confidential-issue" in rel):
            event = "Confidential Issue Hook"
        headers["X-Gitlab-Event"] = event
    labels = _labels(data)
    configure(frogfix_env["monkeypatch"], trigger_label=labels[0] if labels else "frognano-fix")

    r = client.post("/webhooks/gitlab", content=body, headers=headers)

    if rel in GITLAB_STARTERS:
        assert r.status_code == 202, r.text
        [job] = _jobs()
        attrs = data["object_attributes"]
        assert (job.project, job.issue) == (data["project"]["path_with_namespace"], attrs["iid"])
        assert job.trigger_user == data["user"]["username"]
    else:
        assert r.status_code == 200, r.text
        assert _jobs() == []


def _gitea_event(data: dict[str, Any], rel: str) -> tuple[str, str]:
    if "pull_request" in data:
        return "pull_request", "pull_request_label" if "label" in data.get("action", "") else "pull_request"
    if "comment" in data:
        return "issue_comment", "issue_comment"
    action = data.get("action", "")
    if action.startswith("label"):
        return "issues", "issue_label"
    if action in ("assigned", "unassigned"):
        return "issues", "issue_assign"
    if action in ("milestoned", "demilestoned"):
        return "issues", "issue_milestone"
    return "issues", "issues"


@pytest.mark.parametrize("rel", _files("gitea", "forgejo"))
def test_gitea_and_forgejo_fixture(client: Any, frogfix_env: dict[str, Any], rel: str) -> None:
    path = shared_fixture(rel)
    body = path.read_bytes()
    data = json.loads(body)
    event, event_type = _gitea_event(data, rel)
    labels = _labels(data)
    configure(frogfix_env["monkeypatch"], trigger_label=labels[0] if labels else "frognano-fix")
    headers = gitea_headers(body, event=event, event_type=event_type)
    if rel.startswith("forgejo/"):
        headers = {k.replace("Gitea", "Forgejo"): v for k, v in headers.items()}

    r = client.post("/webhooks/gitea", content=body, headers=headers)

    if rel in GITEA_STARTERS:
        assert r.status_code == 202, r.text
        [job] = _jobs()
        assert (job.project, job.issue, job.trigger_user) == (
            data["repository"]["full_name"],
            data["issue"]["number"],
            data["sender"]["login"],
        )
    else:
        assert r.status_code == 200, r.text
        assert _jobs() == []


def _vectors() -> list[dict[str, str]]:
    path = SHARED_FIXTURES / "gitea" / "hmac_test_vectors.json"
    if not path.is_file():
        return [{"file": "(shared fixtures absent)"}]
    return list(json.loads(path.read_text())["vectors"])


@pytest.mark.parametrize("vector", _vectors(), ids=lambda v: Path(v["file"]).name)
def test_gitea_hmac_test_vectors_verify(client: Any, frogfix_env: dict[str, Any], vector: dict[str, str]) -> None:
    body = shared_fixture(vector["file"]).read_bytes()
    assert len(body) == int(vector["bytes"])
    configure(frogfix_env["monkeypatch"], gitea_webhook_secret=vector["secret"])
    event, event_type = _gitea_event(json.loads(body), vector["file"])
    headers = {
        "Content-Type": "application/json",
        "X-Gitea-Event": event,
        "X-Gitea-Event-Type": event_type,
        "X-Gitea-Delivery": vector["X-Gitea-Signature"][:36],
        "X-Gitea-Signature": vector["X-Gitea-Signature"],
    }
    assert client.post("/webhooks/gitea", content=body, headers=headers).status_code in (200, 202)
    headers["X-Gitea-Signature"] = vector["X-Gitea-Signature"][::-1]
    headers["X-Gitea-Delivery"] = "other-delivery"
    assert client.post("/webhooks/gitea", content=body, headers=headers).status_code == 401
    configure(frogfix_env["monkeypatch"], gitea_webhook_secret=GITEA_SECRET)
