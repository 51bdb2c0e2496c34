"""The webhook endpoints with our own hand-written payloads: what starts, cancels, or is refused."""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from sqlalchemy import func, select

from app.db import session_scope
from app.forge.gitlab_webhook import standard_webhook_signature
from app.models import Job, JobEvent, WebhookDelivery
from tests.conftest import configure
from tests.webhook_requests import gitea_headers, gitlab_headers, payload


def jobs_in_db() -> list[Job]:
    with session_scope() as s:
        return list(s.execute(select(Job).order_by(Job.id)).scalars())


def deliveries() -> list[WebhookDelivery]:
    with session_scope() as s:
        return list(s.execute(select(WebhookDelivery).order_by(WebhookDelivery.id)).scalars())


def broker_messages(env: dict[str, Any]) -> int:
    return len(list((env["data_dir"] / "broker" / "queue").glob("*")))


def test_gitlab_label_added_creates_a_queued_job_and_enqueues_it(client: Any, frogfix_env: dict[str, Any]) -> None:
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    [job] = jobs_in_db()
    assert (job.id, job.forge, job.project, job.issue, job.status) == (
        job_id,
        "gitlab",
        "acme/calc",
        7,
        "queued",
    )
    assert job.trigger_user == "dana" and job.title == "add() returns the difference"
    assert job.last_enqueued_at is not None and job.enqueue_count == 1
    assert broker_messages(frogfix_env) == 1
    with session_scope() as s:
        kinds = [e.kind for e in s.execute(select(JobEvent).where(JobEvent.job_id == job_id)).scalars()]
    assert kinds == ["created"]


def test_gitlab_opened_with_label_starts(client: Any) -> None:
    r = client.post("/webhooks/gitlab", content=payload("gitlab_opened_with_label.json"), headers=gitlab_headers())
    assert r.status_code == 202


@pytest.mark.parametrize(
    "name",
    [
        "gitlab_other_label_added.json",
        "gitlab_label_added_closed.json",
        "gitlab_confidential_label_added.json",
    ],
)
def test_gitlab_events_that_start_nothing_answer_200(client: Any, frogfix_env: dict[str, Any], name: str) -> None:
    r = client.post("/webhooks/gitlab", content=payload(name), headers=gitlab_headers())
    assert r.status_code == 200, r.text
    assert r.json()["job_id"] is None
    assert jobs_in_db() == []
    assert broker_messages(frogfix_env) == 0


def test_confidential_issue_hook_allowed_by_setting(client: Any, frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], gitlab_allow_confidential="true")
    r = client.post(
        "/webhooks/gitlab",
        content=payload("gitlab_confidential_label_added.json"),
        headers=gitlab_headers(event="Confidential Issue Hook"),
    )
    assert r.status_code == 202


def test_same_delivery_twice_is_one_job_and_one_message(client: Any, frogfix_env: dict[str, Any]) -> None:
    headers = gitlab_headers(delivery="fixed-delivery-1")
    first = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=headers)
    second = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=headers)
    assert (first.status_code, second.status_code) == (202, 200)
    assert second.json()["outcome"] == "duplicate"
    assert len(jobs_in_db()) == 1 and len(deliveries()) == 1
    assert broker_messages(frogfix_env) == 1


def test_dedupe_falls_back_to_event_uuid(client: Any) -> None:
    headers = gitlab_headers()
    del headers["Idempotency-Key"]
    assert (
        client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=headers).status_code == 202
    )
    again = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=headers)
    assert again.json()["outcome"] == "duplicate"
    assert deliveries()[0].delivery_id == headers["X-Gitlab-Event-UUID"]


def test_second_trigger_while_active_creates_nothing(client: Any) -> None:
    client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    assert r.status_code == 200 and r.json()["outcome"] == "already_active"
    assert len(jobs_in_db()) == 1


def test_label_removed_cancels_the_queued_job_and_a_new_label_starts_again(client: Any) -> None:
    client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_removed.json"), headers=gitlab_headers())
    assert r.status_code == 200 and r.json()["outcome"] == "cancelled_job"
    [job] = jobs_in_db()
    assert job.status == "cancelled" and job.finished_at is not None
    again = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    assert again.status_code == 202
    assert [j.status for j in jobs_in_db()] == ["cancelled", "queued"]


def test_label_removed_from_a_running_job_asks_it_to_stop(client: Any) -> None:
    from app.jobs import transitions

    client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    with session_scope() as s:
        assert transitions.claim_job(s, jobs_in_db()[0].id)
    client.post("/webhooks/gitlab", content=payload("gitlab_label_removed.json"), headers=gitlab_headers())
    [job] = jobs_in_db()
    assert job.status == "running" and job.cancel_requested is True


@pytest.mark.parametrize("token", [None, "", "wrong-token", "gitlab-hook-secret-for-tests "])
def test_gitlab_wrong_or_missing_token_is_401_and_records_nothing(client: Any, token: str | None) -> None:
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers(token=token))
    assert r.status_code == 401
    assert deliveries() == [] and jobs_in_db() == []


def test_gitlab_without_a_configured_secret_refuses_everything(client: Any, frogfix_env: dict[str, Any]) -> None:
    configure(frogfix_env["monkeypatch"], gitlab_webhook_secret="")
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers(token=""))
    assert r.status_code == 401 and "FROGFIX_GITLAB_WEBHOOK_SECRET" in r.json()["error"]


def test_gitlab_standard_webhooks_signature(client: Any, frogfix_env: dict[str, Any]) -> None:
    token = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
    configure(frogfix_env["monkeypatch"], gitlab_signing_token=token)
    body = payload("gitlab_label_added.json")
    ts = str(int(time.time()))
    headers = gitlab_headers(delivery="msg_1")
    headers.update(
        {
            "webhook-id": "msg_1",
            "webhook-timestamp": ts,
            "webhook-signature": "v1,bm90LXRoaXMtb25l " + standard_webhook_signature(token, "msg_1", ts, body),
        }
    )
    assert client.post("/webhooks/gitlab", content=body, headers=headers).status_code == 202
    tampered = body.replace(b"acme/calc", b"acme/calx")
    headers["Idempotency-Key"] = "msg_2"
    assert client.post("/webhooks/gitlab", content=tampered, headers=headers).status_code == 401
    old = str(int(time.time()) - 3600)
    headers.update(
        {"webhook-timestamp": old, "webhook-signature": standard_webhook_signature(token, "msg_1", old, body)}
    )
    assert client.post("/webhooks/gitlab", content=body, headers=headers).status_code == 401
    del headers["webhook-signature"]
    assert client.post("/webhooks/gitlab", content=body, headers=headers).status_code == 401


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        (b"{not json", "application/json", 400),
        (b"[1, 2, 3]", "application/json", 400),
        (b'"a string"', "application/json", 400),
        (b"", "application/json", 400),
        (b"\xff\xfe\x00garbage", "application/json", 400),
        (b'{"object_kind": "issue"}', "application/json", 400),
        (
            b'{"object_kind": "issue", "object_attributes": {"iid": "seven"}, "project": {}}',
            "application/json",
            400,
        ),
        (b'{"object_kind": "issue"}', "text/plain", 415),
        (b"[" * 100_000 + b"]" * 100_000, "application/json", 400),
    ],
)
def test_gitlab_malformed_bodies(client: Any, body: bytes, content_type: str, status: int) -> None:
    r = client.post("/webhooks/gitlab", content=body, headers=gitlab_headers(content_type=content_type))
    assert r.status_code == status, r.text
    assert "error" in r.json()
    assert jobs_in_db() == []
    [delivery] = deliveries()
    assert delivery.outcome == "malformed"


def test_body_over_one_mebibyte_is_413(client: Any) -> None:
    body = json.dumps({"object_kind": "issue", "pad": "x" * (2 * 1024 * 1024)}).encode()
    r = client.post("/webhooks/gitlab", content=body, headers=gitlab_headers())
    assert r.status_code == 413
    r = client.post("/webhooks/gitea", content=body, headers=gitea_headers(body))
    assert r.status_code == 413
    assert deliveries() == []


def test_chunked_body_over_the_limit_is_413(client: Any) -> None:
    def chunks() -> Any:
        for _ in range(40):
            yield b"x" * 65536

    r = client.post("/webhooks/gitlab", content=chunks(), headers=gitlab_headers())
    assert r.status_code == 413


@pytest.mark.parametrize("event", ["Note Hook", "Merge Request Hook", "Push Hook", "Totally Unknown Hook", ""])
def test_gitlab_irrelevant_events_answer_200(client: Any, event: str) -> None:
    r = client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers(event=event))
    assert r.status_code == 200 and r.json()["outcome"] == "ignored"
    assert jobs_in_db() == []


def test_gitea_label_updated_with_trigger_starts(client: Any, frogfix_env: dict[str, Any]) -> None:
    body = payload("gitea_label_updated.json")
    r = client.post("/webhooks/gitea", content=body, headers=gitea_headers(body))
    assert r.status_code == 202, r.text
    [job] = jobs_in_db()
    assert (job.forge, job.project, job.issue, job.trigger_user) == ("gitea", "acme/calc", 3, "sam")
    assert broker_messages(frogfix_env) == 1


def test_gitea_opened_with_label_starts(client: Any) -> None:
    body = payload("gitea_opened_with_label.json")
    assert (
        client.post("/webhooks/gitea", content=body, headers=gitea_headers(body, event_type="issues")).status_code
        == 202
    )


def test_gitea_form_encoded_payload(client: Any) -> None:
    """Gitea signs the JSON payload, not the `payload=<JSON>` form body it sends (deliver.go)."""
    from urllib.parse import urlencode

    json_payload = payload("gitea_label_updated.json")
    body = urlencode({"payload": json_payload.decode()}).encode()
    headers = gitea_headers(body, content_type="application/x-www-form-urlencoded", signed=json_payload)
    assert client.post("/webhooks/gitea", content=body, headers=headers).status_code == 202


def test_gitea_form_signed_over_the_form_body_is_401(client: Any) -> None:
    from urllib.parse import urlencode

    body = urlencode({"payload": payload("gitea_label_updated.json").decode()}).encode()
    headers = gitea_headers(body, content_type="application/x-www-form-urlencoded")
    r = client.post("/webhooks/gitea", content=body, headers=headers)
    assert r.status_code == 401
    assert deliveries() == [] and jobs_in_db() == []


def test_gitea_form_without_a_payload_cannot_be_verified(client: Any) -> None:
    body = b"other=1"
    headers = gitea_headers(body, content_type="application/x-www-form-urlencoded")
    r = client.post("/webhooks/gitea", content=body, headers=headers)
    assert r.status_code == 401 and "payload" in r.json()["error"]
    assert deliveries() == []


def _gitea_issue_action(action: str, *, labelled: bool = True) -> bytes:
    """The label_updated payload turned into an `issues` event with `action` (hand-written, as Gitea sends it)."""
    data = json.loads(payload("gitea_label_updated.json"))
    data["action"] = action
    if not labelled:
        data["issue"]["labels"] = []
    return json.dumps(data).encode()


def test_gitea_deleted_issue_cancels_its_active_job(client: Any) -> None:
    body = payload("gitea_label_updated.json")
    client.post("/webhooks/gitea", content=body, headers=gitea_headers(body))
    deleted = _gitea_issue_action("deleted")
    r = client.post("/webhooks/gitea", content=deleted, headers=gitea_headers(deleted, event_type="issues"))
    assert r.status_code == 200 and r.json()["outcome"] == "cancelled_job"
    [job] = jobs_in_db()
    assert job.status == "cancelled"


def test_gitea_deleted_issue_asks_a_running_job_to_stop(client: Any) -> None:
    from app.jobs import transitions

    body = payload("gitea_label_updated.json")
    client.post("/webhooks/gitea", content=body, headers=gitea_headers(body))
    with session_scope() as s:
        assert transitions.claim_job(s, jobs_in_db()[0].id)
    deleted = _gitea_issue_action("deleted")
    client.post("/webhooks/gitea", content=deleted, headers=gitea_headers(deleted, event_type="issues"))
    [job] = jobs_in_db()
    assert job.status == "running" and job.cancel_requested is True


def test_gitea_reopened_labelled_issue_starts_like_opened(client: Any, frogfix_env: dict[str, Any]) -> None:
    reopened = _gitea_issue_action("reopened")
    r = client.post("/webhooks/gitea", content=reopened, headers=gitea_headers(reopened, event_type="issues"))
    assert r.status_code == 202, r.text
    [job] = jobs_in_db()
    assert (job.forge, job.issue, job.status) == ("gitea", 3, "queued")
    assert broker_messages(frogfix_env) == 1
    unlabelled = _gitea_issue_action("reopened", labelled=False)
    r = client.post("/webhooks/gitea", content=unlabelled, headers=gitea_headers(unlabelled, event_type="issues"))
    assert r.status_code == 200 and r.json()["outcome"] == "ignored"


def test_gitea_label_cleared_cancels_and_stale_update_only_notes(client: Any) -> None:
    body = payload("gitea_label_updated.json")
    client.post("/webhooks/gitea", content=body, headers=gitea_headers(body))
    without = payload("gitea_label_updated_without.json")
    r = client.post("/webhooks/gitea", content=without, headers=gitea_headers(without))
    assert r.status_code == 200 and r.json()["outcome"] == "noted"
    assert jobs_in_db()[0].status == "queued"
    cleared = payload("gitea_label_cleared.json")
    r = client.post("/webhooks/gitea", content=cleared, headers=gitea_headers(cleared))
    assert r.json()["outcome"] == "cancelled_job"
    assert jobs_in_db()[0].status == "cancelled"


def test_gitea_closed_issue_and_pull_requests_start_nothing(client: Any) -> None:
    body = payload("gitea_label_updated_closed.json")
    assert client.post("/webhooks/gitea", content=body, headers=gitea_headers(body)).status_code == 200
    pr = json.loads(payload("gitea_label_updated.json"))
    pr["issue"]["pull_request"] = {"merged": False}
    body = json.dumps(pr).encode()
    assert client.post("/webhooks/gitea", content=body, headers=gitea_headers(body)).status_code == 200
    assert jobs_in_db() == []


@pytest.mark.parametrize("secret", [None, "", "wrong-secret"])
def test_gitea_bad_signature_is_401(client: Any, secret: str | None) -> None:
    body = payload("gitea_label_updated.json")
    r = client.post("/webhooks/gitea", content=body, headers=gitea_headers(body, secret=secret))
    assert r.status_code == 401
    assert deliveries() == []


def test_gitea_signature_over_other_bytes_is_401(client: Any) -> None:
    body = payload("gitea_label_updated.json")
    headers = gitea_headers(body)
    assert client.post("/webhooks/gitea", content=body + b" ", headers=headers).status_code == 401


def test_gitea_dedupes_on_delivery_header(client: Any) -> None:
    body = payload("gitea_label_updated.json")
    headers = gitea_headers(body, delivery="d3f1c0de-0000-4000-8000-000000000001")
    assert client.post("/webhooks/gitea", content=body, headers=headers).status_code == 202
    assert client.post("/webhooks/gitea", content=body, headers=headers).json()["outcome"] == "duplicate"


def test_gitea_unknown_event_is_200(client: Any) -> None:
    body = payload("gitea_label_updated.json")
    r = client.post("/webhooks/gitea", content=body, headers=gitea_headers(body, event="release", event_type="release"))
    assert r.status_code == 200 and r.json()["outcome"] == "ignored"


def test_delivery_rows_record_every_outcome(client: Any) -> None:
    client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    client.post("/webhooks/gitlab", content=payload("gitlab_label_added.json"), headers=gitlab_headers())
    client.post("/webhooks/gitlab", content=payload("gitlab_label_removed.json"), headers=gitlab_headers())
    client.post(
        "/webhooks/gitlab",
        content=payload("gitlab_label_added.json"),
        headers=gitlab_headers(event="Note Hook"),
    )
    assert [d.outcome for d in deliveries()] == ["job_created", "already_active", "cancelled_job", "ignored"]
    with session_scope() as s:
        assert s.execute(select(func.count()).select_from(Job)).scalar_one() == 1
