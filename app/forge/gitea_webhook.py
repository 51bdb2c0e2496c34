"""Gitea (and Forgejo) webhooks: verification and parsing (pure functions of headers, body and secret)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from app.forge.webhook import (
    FORM_MEDIA,
    HeaderView,
    Intent,
    WebhookEvent,
    WebhookMalformed,
    WebhookUnauthorized,
    body_digest_id,
    decode_json_object,
    form_payload,
    media_type,
    obj,
    positive_int,
    project_path,
    text_or_none,
)


def gitea_signature(secret: str, payload: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), payload, hashlib.sha256).hexdigest()


def signed_payload(body: bytes, content_type: str | None) -> bytes:
    """The bytes Gitea signs: the JSON payload itself, also when it sent it as a form.

    A form delivery is `payload=<URL-encoded JSON>`, but Gitea and Forgejo compute the HMAC over
    the JSON before encoding it (services/webhook/deliver.go), so the form body never verifies.
    A form whose payload cannot be read has nothing signed in it, so it is refused as unverified.
    """
    if media_type(content_type) != FORM_MEDIA:
        return body
    try:
        return form_payload(body)
    except WebhookMalformed as exc:
        raise WebhookUnauthorized(f"cannot verify this form delivery: {exc}") from None


def verify_gitea(headers: Mapping[str, str], body: bytes, *, secret: str) -> None:
    """Check the hex HMAC-SHA256 of the signed payload in constant time."""
    if not secret:
        raise WebhookUnauthorized("no Gitea webhook secret is configured (set FROGFIX_GITEA_WEBHOOK_SECRET)")
    h = HeaderView(headers)
    given = h.get("X-Gitea-Signature", "X-Forgejo-Signature", "X-Gogs-Signature")
    if given is None:
        hub = h.get("X-Hub-Signature-256")
        given = hub.removeprefix("sha256=") if hub else None
    if not given:
        raise WebhookUnauthorized("missing X-Gitea-Signature")
    expected = gitea_signature(secret, signed_payload(body, h.get("Content-Type")))
    if not hmac.compare_digest(given.strip().lower().encode("utf-8", "surrogateescape"), expected.encode()):
        raise WebhookUnauthorized("wrong X-Gitea-Signature")


def _label_names(items: Any) -> tuple[str, ...]:
    if not isinstance(items, list):
        return ()
    return tuple(str(i["name"]) for i in items if isinstance(i, dict) and isinstance(i.get("name"), str))


def parse_gitea(
    headers: Mapping[str, str], body: bytes, *, secret: str, trigger_label: str = "frognano-fix"
) -> WebhookEvent:
    """Verify, then turn one Gitea delivery into a WebhookEvent.

    Gitea's label payload may carry stale labels and does not say which label changed, so a
    label change is only a hint: the admission stage re-reads the issue through the API.
    """
    verify_gitea(headers, body, secret=secret)
    h = HeaderView(headers)
    event = (h.get("X-Gitea-Event", "X-Forgejo-Event", "X-Gogs-Event") or "").strip()[:64]
    event_type = (h.get("X-Gitea-Event-Type", "X-Forgejo-Event-Type", "X-Gogs-Event-Type") or "").strip()[:64]
    delivery_id = (h.get("X-Gitea-Delivery", "X-Forgejo-Delivery", "X-Gogs-Delivery") or body_digest_id(body)).strip()
    delivery_id = delivery_id[:255]

    try:
        return _interpret(h, event, event_type, delivery_id, body, trigger_label)
    except WebhookMalformed as exc:
        exc.delivery_id, exc.event = delivery_id, event
        raise


def _interpret(
    h: HeaderView, event: str, event_type: str, delivery_id: str, body: bytes, trigger_label: str
) -> WebhookEvent:
    def ignore(reason: str, **extra: Any) -> WebhookEvent:
        return WebhookEvent("gitea", delivery_id, event or "(none)", "ignore", reason, **extra)

    payload = decode_json_object(body, h.get("Content-Type"))
    if event != "issues":
        return ignore(f"event {event or '(missing X-Gitea-Event)'} is not an issue event")
    if event_type and event_type not in ("issues", "issue_label"):
        return ignore(f"event type {event_type} is not handled")

    issue = obj(payload.get("issue"), "issue")
    repo = obj(payload.get("repository"), "repository")
    full_name = project_path(repo.get("full_name"), "repository.full_name")
    number = positive_int(issue.get("number", payload.get("number")), "issue.number")
    sender: dict[str, Any] = payload["sender"] if isinstance(payload.get("sender"), dict) else {}
    action = text_or_none(payload.get("action"), 64)
    labels = _label_names(issue.get("labels"))
    fields: dict[str, Any] = {
        "action": action,
        "project": full_name,
        "project_id": text_or_none(repo.get("id"), 64),
        "issue": number,
        "issue_url": text_or_none(issue.get("html_url"), 2000),
        "clone_url": text_or_none(repo.get("clone_url"), 2000),
        "title": text_or_none(issue.get("title")),
        "body": text_or_none(issue.get("body")),
        "sender": text_or_none(sender.get("login") or sender.get("username"), 255),
        "labels": labels,
    }
    if issue.get("pull_request"):
        return ignore("the issue is a pull request", **fields)

    intent, reason = _intent(action, issue.get("state"), labels, trigger_label)
    return WebhookEvent("gitea", delivery_id, event, intent, reason, **fields)


def _intent(action: str | None, state: Any, labels: tuple[str, ...], trigger_label: str) -> tuple[Intent, str]:
    """What an `issues` delivery asks of us; label payloads only hint (admission re-reads the issue)."""
    if action == "deleted":
        return "cancel", "the issue was deleted"
    if action == "closed" or state == "closed":
        return "cancel", "the issue is closed"
    if action == "label_cleared":
        return "cancel", "all labels were removed"
    if action == "label_updated" and trigger_label in labels:
        return "start", f"labels updated and include {trigger_label!r} (admission re-reads the issue)"
    if action == "label_updated":
        return "recheck", f"labels updated without {trigger_label!r}; payload labels may be stale"
    if action in ("opened", "reopened") and trigger_label in labels:
        return "start", f"issue {action} with label {trigger_label!r}"
    return "ignore", f"action {action!r} does not add {trigger_label!r}"
