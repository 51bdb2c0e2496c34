"""Answers to FrogFix's question (issue 24), from the hook to the queue.

A `/frogfix` comment on an issue (not an MR/PR) is an `answer`; any other issue comment, an edit, a
system note, a closed issue or `/frogfix stop` is ignored with a reason. Intake then queues the issue's
newest round-0 job again only when it asked a question (`asked_at`) and ended waiting for the answer.
The real payloads in ../shared/fixtures/forge and our own in tests/payloads go through the same pure
parsers, and the intake cases through the real endpoints.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from app.db import session_scope
from app.forge.gitea_webhook import parse_gitea
from app.forge.gitlab_webhook import parse_gitlab
from app.forge.webhook import MAX_COMMENT_CHARS, WebhookEvent, WebhookMalformed
from app.jobs import records
from app.models import Job, WebhookDelivery, utcnow
from tests.conftest import GITEA_SECRET, GITLAB_SECRET, shared_fixture
from tests.webhook_requests import gitea_headers, gitlab_headers, payload

ANSWER = "/frogfix add(2, 3) should be 5; I get -1 on Python 3.12"


def gitlab(body: bytes | dict[str, Any], event: str = "Note Hook", **options: Any) -> WebhookEvent:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return parse_gitlab(gitlab_headers(event=event), raw, secret=GITLAB_SECRET, **options)


def gitea(body: bytes | dict[str, Any], event_type: str = "issue_comment") -> WebhookEvent:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = gitea_headers(raw, event="issue_comment", event_type=event_type)
    return parse_gitea(headers, raw, secret=GITEA_SECRET)


def doc(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(payload(name))
    return loaded


# --- GitLab: hand-written -------------------------------------------------------------------------


def test_gitlab_frogfix_comment_on_an_issue_is_an_answer() -> None:
    event = gitlab(payload("gitlab_issue_note.json"))
    assert (event.intent, event.forge, event.event, event.action) == ("answer", "gitlab", "Note Hook", "create")
    assert (event.project, event.project_id, event.issue, event.mr) == ("acme/calc", "42", 7, None)
    assert (event.sender, event.issue_url) == ("rita", "https://git.acme.test/acme/calc/-/issues/7")
    assert event.clone_url == "https://git.acme.test/acme/calc.git"
    comment = event.comment
    assert comment is not None
    assert (comment.id, comment.kind, comment.author, comment.body) == ("88201", "note", "rita", ANSWER)
    assert comment.url == "https://git.acme.test/acme/calc/-/issues/7#note_88201"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"note": "Thanks, I will look"}, "not a /frogfix command"),
        ({"note": "/frogfixing later"}, "not a /frogfix command"),
        ({"note": "please /frogfix"}, "not a /frogfix command"),  # only a comment that starts with it
        ({"note": "/frogfix stop"}, "stops nothing"),
        ({"note": "/FrogFix Cancel"}, "stops nothing"),
        ({"system": True}, "system note"),
        ({"action": "update"}, "only a new /frogfix comment"),
        ({"internal": True}, "FROGFIX_GITLAB_ALLOW_CONFIDENTIAL"),
        ({"confidential": True}, "FROGFIX_GITLAB_ALLOW_CONFIDENTIAL"),
    ],
)
def test_gitlab_other_issue_comments_are_ignored_with_a_reason(change: dict[str, Any], reason: str) -> None:
    data = doc("gitlab_issue_note.json")
    data["object_attributes"].update(change)
    event = gitlab(data)
    assert event.intent == "ignore" and reason in event.reason, event.reason
    if "not a /frogfix command" in reason:
        assert "not on a merge request" in event.reason and event.comment is None


def test_gitlab_answer_on_a_closed_or_confidential_issue_is_ignored() -> None:
    data = doc("gitlab_issue_note.json")
    data["issue"]["state"] = "closed"
    assert "closed issue" in gitlab(data).reason
    data = doc("gitlab_issue_note.json")
    data["issue"]["confidential"] = True
    assert gitlab(data).intent == "ignore"
    assert gitlab(data, allow_confidential=True).intent == "answer"
    body = payload("gitlab_issue_note.json")
    assert gitlab(body, event="Confidential Note Hook").intent == "ignore"
    assert gitlab(body, event="Confidential Note Hook", allow_confidential=True).intent == "answer"


def test_gitlab_answer_without_its_issue_or_id_is_malformed() -> None:
    data = doc("gitlab_issue_note.json")
    del data["issue"]
    with pytest.raises(WebhookMalformed, match="issue must be a JSON object"):
        gitlab(data)
    data = doc("gitlab_issue_note.json")
    data["object_attributes"]["id"] = "x"
    with pytest.raises(WebhookMalformed, match=r"object_attributes\.id"):
        gitlab(data)


def test_gitlab_answer_before_gitlab_16_11_names_no_action_and_is_still_an_answer() -> None:
    data = doc("gitlab_issue_note.json")
    del data["object_attributes"]["action"]
    assert gitlab(data).intent == "answer"


def test_answer_text_is_bounded_and_storable() -> None:
    data = doc("gitlab_issue_note.json")
    data["object_attributes"]["note"] = "/frogfix " + "x\x00" * MAX_COMMENT_CHARS
    event = gitlab(data)
    assert event.comment is not None and len(event.comment.body) == MAX_COMMENT_CHARS
    assert "\x00" not in event.comment.body


# --- GitLab: the shared real payloads -------------------------------------------------------------


@pytest.mark.parametrize(
    "rel",
    [
        "gitlab/docs/note_hook_issue.json",
        "gitlab/go-gitlab/note_issue.json",
        "gitlab/go-scm/issue_comment_create.json",
        "gitlab/go-playground_webhooks/comment-issue-event.json",
    ],
)
def test_gitlab_shared_issue_notes_become_answers_only_with_the_command(rel: str) -> None:
    data = json.loads(shared_fixture(rel).read_bytes())
    assert gitlab(data).intent == "ignore"  # "Hello world", "bump": no command
    data["object_attributes"]["note"] = "/frogfix the input is 2, 3"
    data["issue"]["state"] = "opened"  # the docs' example issue is closed
    event = gitlab(data)
    assert event.intent == "answer", event.reason
    assert event.issue == data["issue"]["iid"] and event.project == data["project"]["path_with_namespace"]
    assert event.comment is not None and event.comment.id == str(data["object_attributes"]["id"])
    assert event.comment.author == data["user"]["username"] == event.sender
    if data["object_attributes"].get("action") is None:  # an old hook: no action, still an answer
        assert event.action is None


def test_gitlab_shared_confidential_issue_note_follows_allow_confidential() -> None:
    data = json.loads(shared_fixture("gitlab/go-playground_webhooks/confidential-comment-event.json").read_bytes())
    data["object_attributes"]["note"] = "/frogfix"
    data["issue"]["state"] = "opened"
    assert gitlab(data, event="Confidential Note Hook").intent == "ignore"  # event_type confidential_note
    assert gitlab(data, event="Confidential Note Hook", allow_confidential=True).intent == "answer"


def test_gitlab_shared_closed_issue_in_the_docs_example_is_ignored() -> None:
    data = json.loads(shared_fixture("gitlab/docs/note_hook_issue.json").read_bytes())
    data["object_attributes"]["note"] = "/frogfix"
    event = gitlab(data)  # its issue is closed
    assert event.intent == "ignore" and "closed issue" in event.reason


# --- Gitea / Forgejo --------------------------------------------------------------------------------


def test_gitea_frogfix_comment_on_an_issue_is_an_answer() -> None:
    event = gitea(payload("gitea_issue_comment.json"))
    assert (event.intent, event.forge, event.event, event.action) == ("answer", "gitea", "issue_comment", "created")
    assert (event.project, event.project_id, event.issue, event.mr) == ("acme/calc", "12", 7, None)
    assert (event.sender, event.issue_url) == ("rita", "https://gitea.acme.test/acme/calc/issues/7")
    comment = event.comment
    assert comment is not None
    assert (comment.id, comment.kind, comment.author, comment.body) == ("412", "note", "rita", ANSWER)
    assert comment.url == "https://gitea.acme.test/acme/calc/issues/7#issuecomment-412"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"comment": {"body": "thanks"}}, "not a /frogfix command"),
        ({"comment": {"body": "/frogfix stop"}}, "stops nothing"),
        ({"action": "edited"}, "only a new /frogfix comment"),
        ({"action": "deleted"}, "only a new /frogfix comment"),
        ({"issue": {"state": "closed"}}, "closed issue"),
    ],
)
def test_gitea_other_issue_comments_are_ignored_with_a_reason(change: dict[str, Any], reason: str) -> None:
    data = doc("gitea_issue_comment.json")
    for key, value in change.items():
        if isinstance(value, dict):
            data[key].update(value)
        else:
            data[key] = value
    event = gitea(data)
    assert event.intent == "ignore" and reason in event.reason, event.reason
    if "not a /frogfix command" in reason:
        assert "not on a pull request" in event.reason


def test_gitea_a_frogfix_comment_on_a_pull_request_stays_a_review() -> None:
    data = doc("gitea_issue_comment.json")
    data["is_pull"] = True
    data["issue"]["pull_request"] = {"merged": False, "merged_at": None}
    event = gitea(data, "pull_request_comment")
    assert event.intent == "review" and event.mr == 7 and event.issue is None


@pytest.mark.parametrize(
    "rel", ["gitea/go-playground_webhooks/issue-comment-event.json", "gitea/go-scm/issue_comment_created.json"]
)
def test_gitea_shared_issue_comments_become_answers_only_with_the_command(rel: str) -> None:
    data = json.loads(shared_fixture(rel).read_bytes())
    assert gitea(data).intent == "ignore"
    data["comment"]["body"] = "/frogfix the input is 2, 3"
    data["issue"]["state"] = "open"
    event = gitea(data)
    assert event.intent == "answer", event.reason
    assert event.issue == data["issue"]["number"] and event.project == data["repository"]["full_name"]
    assert event.comment is not None and event.comment.id == str(data["comment"]["id"])
    assert event.comment.author == data["comment"]["user"]["login"]


def test_gitea_shared_edited_comment_stays_ignored() -> None:
    data = json.loads(shared_fixture("gitea/go-scm/issue_comment_edited.json").read_bytes())
    data["comment"]["body"] = "/frogfix"
    data["issue"]["state"] = "open"
    event = gitea(data)
    assert event.intent == "ignore" and "only a new /frogfix comment" in event.reason


# --- intake, through the real endpoints -------------------------------------------------------------


def _post_gitlab(client: Any, *, note: str = ANSWER, note_id: int = 88201, by: str = "rita",
                 delivery: str | None = None) -> Any:
    data = doc("gitlab_issue_note.json")
    data["object_attributes"].update(note=note, id=note_id)
    data["user"]["username"] = by
    return client.post("/webhooks/gitlab", content=json.dumps(data).encode(),
                       headers=gitlab_headers(event="Note Hook", delivery=delivery))


def _post_gitea(client: Any, *, body: str = ANSWER, comment_id: int = 412, delivery: str | None = None) -> Any:
    data = doc("gitea_issue_comment.json")
    data["comment"].update(body=body, id=comment_id)
    raw = json.dumps(data).encode()
    return client.post("/webhooks/gitea", content=raw,
                       headers=gitea_headers(raw, event="issue_comment", event_type="issue_comment", delivery=delivery))


def _job(forge: str = "gitlab", *, status: str = "no_fix", asked: bool = True, round_number: int = 0) -> int:
    """A job of issue acme/calc#7 as the pipeline leaves it (no webhook: the row is what is judged)."""
    now = utcnow()
    with session_scope() as s:
        job = Job(forge=forge, project="acme/calc", issue=7, status=status, run=1, trigger_user="dana",
                  round=round_number, created_at=now, updated_at=now, finished_at=now, error="x",
                  asked_at=now - timedelta(minutes=5) if asked else None)
        s.add(job)
        s.flush()
        return int(job.id)


def _row(job_id: int) -> Job:
    with session_scope() as s:
        job = records.get_job(s, job_id)
        s.expunge(job)
        return job


def _events(job_id: int) -> list[Any]:
    with session_scope() as s:
        return [(e.kind, e.message, e.data) for e in records.job_events(s, job_id)]


def _deliveries() -> list[tuple[str, str, int | None]]:
    with session_scope() as s:
        rows = s.execute(select(WebhookDelivery.outcome, WebhookDelivery.reason, WebhookDelivery.job_id)).all()
        return [tuple(r) for r in rows]  # type: ignore[misc]


def test_an_answer_requeues_the_job_that_asked(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[int] = []
    monkeypatch.setattr("app.web.webhooks.send_run_job", lambda job_id: sent.append(job_id) or True)
    job_id = _job()

    r = _post_gitlab(client, delivery="d-1")

    assert r.status_code == 202, r.text
    assert (r.json()["outcome"], r.json()["job_id"]) == ("job_requeued", job_id)
    assert sent == [job_id]  # after the commit
    job = _row(job_id)
    assert (job.status, job.trigger_user, job.error, job.finished_at) == ("queued", "rita", None, None)
    assert job.asked_at is not None and job.last_enqueued_at is not None and not job.cancel_requested
    kind, message, data = _events(job_id)[-1]
    assert kind == "answered" and "rita answered" in message
    assert data["comment_id"] == "88201" and data["author"] == "rita"
    with session_scope() as s:
        assert records.announced_this_round(s, job_id) is False  # the answer run says it works on it again

    # The same delivery again: deduplicated on the delivery id; the same comment in a new delivery: on its id.
    assert _post_gitlab(client, delivery="d-1").json()["outcome"] == "duplicate"
    with session_scope() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status="no_fix", finished_at=utcnow()))
    assert _post_gitlab(client, delivery="d-2").json()["outcome"] == "duplicate"
    assert sent == [job_id]
    # Another answer (a new comment) queues it again.
    assert _post_gitlab(client, note_id=88202, delivery="d-3").json()["outcome"] == "job_requeued"
    assert sent == [job_id, job_id]


def test_a_gitea_answer_requeues_the_job_that_asked(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.web.webhooks.send_run_job", lambda job_id: True)
    other_forge = _job("gitlab")  # the same issue number on the other forge is another issue
    job_id = _job("gitea")
    r = _post_gitea(client)
    assert r.status_code == 202 and r.json()["job_id"] == job_id, r.text
    assert _row(job_id).status == "queued" and _row(other_forge).status == "no_fix"


@pytest.mark.parametrize(
    ("setup", "outcome", "reason"),
    [
        ({"status": "no_fix", "asked": False}, "ignored", "not waiting for an answer: it asked no question"),
        ({"status": "done"}, "ignored", "not waiting for an answer: it ended done"),
        ({"status": "cancelled"}, "ignored", "not waiting for an answer: it ended cancelled"),
        ({"status": "failed"}, "ignored", "not waiting for an answer: it ended failed"),
        ({"status": "running", "asked": False}, "already_active", "already running"),
        ({"status": "queued", "asked": False}, "already_active", "already queued"),
        # A job that asked and runs: the answer is kept for the run after it (issue 36; test_answer_gate.py).
        ({"status": "running"}, "answer_waiting", "answer runs when it ends"),
        ({"status": "queued"}, "answer_waiting", "answer runs when it ends"),
        (None, "ignored", "no job for"),
    ],
)
def test_an_answer_queues_nothing_unless_the_job_waits_for_it(
    client: Any, monkeypatch: pytest.MonkeyPatch, setup: dict[str, Any] | None, outcome: str, reason: str
) -> None:
    sent: list[int] = []
    monkeypatch.setattr("app.web.webhooks.send_run_job", lambda job_id: sent.append(job_id) or True)
    job_id = _job(**setup) if setup is not None else None
    before = _row(job_id).status if job_id is not None else None

    r = _post_gitlab(client)

    assert r.status_code == 200 and r.json()["outcome"] == outcome and reason in r.json()["reason"], r.text
    assert sent == []
    if job_id is not None:
        assert _row(job_id).status == before and "answered" not in [k for k, _, _ in _events(job_id)]
    assert _deliveries()[-1][:2] == (outcome, r.json()["reason"])


def test_the_newest_round_zero_job_is_the_one_judged(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.web.webhooks.send_run_job", lambda job_id: True)
    older = _job(status="no_fix", asked=True)
    newer = _job(status="done", asked=False)  # the label added again: a new job, which published
    _job(status="no_fix", asked=True, round_number=1)  # a review round is not the issue's job
    r = _post_gitlab(client)
    assert r.json()["outcome"] == "ignored" and f"job {newer} " in r.json()["reason"]
    assert _row(older).status == "no_fix"


def test_a_rejected_answer_leaves_the_question_open(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A non-member's `/frogfix` ends its run `rejected` (the worker checks the rights): a member's still counts."""
    monkeypatch.setattr("app.web.webhooks.send_run_job", lambda job_id: True)
    job_id = _job(status="rejected", asked=True)
    r = _post_gitlab(client, by="dana")
    assert r.json()["outcome"] == "job_requeued" and _row(job_id).trigger_user == "dana"


def test_frogfix_own_comment_never_answers(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.web.webhooks.send_run_job", lambda job_id: True)
    job_id = _job()
    # Our comments start with a hidden marker, so they never start with the command either way.
    r = _post_gitlab(client, note="<!-- frogfix:0123456789abcdef -->\n/frogfix")
    assert r.json()["outcome"] == "ignored" and _row(job_id).status == "no_fix"


def test_an_answer_when_the_broker_is_down_stays_queued_for_the_sweep(
    client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("app.web.webhooks.send_run_job", lambda job_id: False)
    job_id = _job()
    r = _post_gitlab(client)
    assert r.status_code == 202 and r.json()["outcome"] == "job_requeued"
    job = _row(job_id)
    assert job.status == "queued" and job.last_enqueued_at is None  # the sweep sends it at once


def test_an_answer_that_names_no_author_queues_nothing(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker checks the commenter's rights: without a name there is nobody to check, so nothing runs."""
    monkeypatch.setattr("app.web.webhooks.send_run_job", lambda job_id: True)
    job_id = _job()
    data = doc("gitlab_issue_note.json")
    del data["user"]
    r = client.post("/webhooks/gitlab", content=json.dumps(data).encode(), headers=gitlab_headers(event="Note Hook"))
    assert r.json()["outcome"] == "ignored" and "names no author" in r.json()["reason"]
    assert _row(job_id).status == "no_fix"
