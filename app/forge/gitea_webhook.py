"""Gitea (and Forgejo) webhooks: verification and parsing (pure functions of headers, body and secret)."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from app.forge.webhook import (
    HeaderView,
    Intent,
    WebhookEvent,
    WebhookMalformed,
    WebhookUnauthorized,
    body_digest_id,
    decode_json_object,
    obj,
    positive_int,
    project_path,
    text_or_none,
)


def gitea_signature(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def verify_gitea(headers: Mapping[str, str], body: bytes, *, secret: str) -> None:
    """Check the hex HMAC-SHA256 of the raw body in constant time."""
    if not secret:
        raise WebhookUnauthorized("no Gitea webhook secret is configured (set FROGFIX_GITEA_WEBHOOK_SECRET)")
    h = HeaderView(headers)
    given = h.get("X-Gitea-Signature", "X-Forgejo-Signature", "X-Gogs-Signature")
    if given is None:
        hub = h.get("X-Hub-Signature-256")
        given = hub.removeprefix("sha256=") if hub else None
    if not given:
        raise WebhookUnauthorized("missing X-Gitea-Signature")
    expected = gitea_signature(secret, body)
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

    intent: Intent
    if action == "closed" or issue.get("state") == "closed":
        intent, reason = "cancel", "the issue is closed"
    elif action == "label_cleared":
        intent, reason = "cancel", "all labels were removed"
    elif action == "label_updated" and trigger_label in labels:
        intent, reason = "start", f"labels updated and include {trigger_label!r} (admission re-reads the issue)"
    elif action == "label_updated":
        intent, reason = "recheck", f"labels updated without {trigger_label!r}; payload labels may be stale"
    elif action == "opened" and trigger_label in labels:
        intent, reason = "start", f"issue opened with label {trigger_label!r}"
    else:
        intent, reason = "ignore", f"action {action!r} does not add {trigger_label!r}"
    return WebhookEvent("gitea", delivery_id, event, intent, reason, **fields)
