"""GitLab webhooks: verification and parsing (pure functions of headers, body and secrets)."""

from __future__ import annotations

import base64
import binascii
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

ISSUE_HOOK = "Issue Hook"
CONFIDENTIAL_ISSUE_HOOK = "Confidential Issue Hook"
SIGNATURE_TOLERANCE_S = 300


def verify_gitlab(
    headers: Mapping[str, str], body: bytes, *, secret: str, signing_token: str = "", now: float | None = None
) -> None:
    """Check `X-Gitlab-Token` (constant time) and, if a signing token is set, the Standard Webhooks signature."""
    h = HeaderView(headers)
    if not secret and not signing_token:
        raise WebhookUnauthorized("no GitLab webhook secret is configured (set FROGFIX_GITLAB_WEBHOOK_SECRET)")
    if secret:
        token = h.get("X-Gitlab-Token")
        if token is None:
            raise WebhookUnauthorized("missing X-Gitlab-Token")
        if not hmac.compare_digest(token.encode("utf-8", "surrogateescape"), secret.encode("utf-8")):
            raise WebhookUnauthorized("wrong X-Gitlab-Token")
    if signing_token:
        _verify_standard_signature(h, body, signing_token, now)


def standard_webhook_signature(signing_token: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """`v1,<base64 HMAC-SHA256>` over `{id}.{timestamp}.{body}` (the Standard Webhooks scheme)."""
    key = base64.b64decode(signing_token.removeprefix("whsec_"))
    mac = hmac.new(key, msg_id.encode() + b"." + timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1," + base64.b64encode(mac.digest()).decode()


def _verify_standard_signature(h: HeaderView, body: bytes, signing_token: str, now: float | None) -> None:
    msg_id, timestamp, signatures = h.get("webhook-id"), h.get("webhook-timestamp"), h.get("webhook-signature")
    if not (msg_id and timestamp and signatures):
        raise WebhookUnauthorized("missing webhook-id, webhook-timestamp or webhook-signature")
    try:
        ts = int(timestamp)
    except ValueError as exc:
        raise WebhookUnauthorized("webhook-timestamp is not an integer") from exc
    if now is not None and abs(now - ts) > SIGNATURE_TOLERANCE_S:
        raise WebhookUnauthorized("webhook-timestamp is outside the allowed window")
    try:
        expected = standard_webhook_signature(signing_token, msg_id, timestamp, body)
    except (binascii.Error, ValueError) as exc:
        raise WebhookUnauthorized("the configured signing token is not valid base64") from exc
    for candidate in signatures.split():
        if hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), expected.encode()):
            return
    raise WebhookUnauthorized("no webhook-signature matches")


def _label_titles(items: Any) -> tuple[str, ...]:
    if not isinstance(items, list):
        return ()
    return tuple(str(i["title"]) for i in items if isinstance(i, dict) and isinstance(i.get("title"), str))


def parse_gitlab(
    headers: Mapping[str, str],
    body: bytes,
    *,
    secret: str,
    signing_token: str = "",
    trigger_label: str = "frognano-fix",
    allow_confidential: bool = False,
    now: float | None = None,
) -> WebhookEvent:
    """Verify, then turn one GitLab delivery into a WebhookEvent with what it asks of us."""
    verify_gitlab(headers, body, secret=secret, signing_token=signing_token, now=now)
    h = HeaderView(headers)
    event = (h.get("X-Gitlab-Event") or "").strip()[:64]
    delivery_id = (h.get("Idempotency-Key") or h.get("X-Gitlab-Event-UUID") or body_digest_id(body)).strip()[:255]

    try:
        return _interpret(h, event, delivery_id, body, trigger_label, allow_confidential)
    except WebhookMalformed as exc:
        exc.delivery_id, exc.event = delivery_id, event
        raise


def _interpret(
    h: HeaderView, event: str, delivery_id: str, body: bytes, trigger_label: str, allow_confidential: bool
) -> WebhookEvent:
    def ignore(reason: str, **extra: Any) -> WebhookEvent:
        return WebhookEvent("gitlab", delivery_id, event or "(none)", "ignore", reason, **extra)

    payload = decode_json_object(body, h.get("Content-Type"))
    if event not in (ISSUE_HOOK, CONFIDENTIAL_ISSUE_HOOK):
        return ignore(f"event {event or '(missing X-Gitlab-Event)'} is not an issue event")
    if payload.get("object_kind") != "issue":
        return ignore(f"object_kind {str(payload.get('object_kind'))[:40]!r} is not 'issue'")

    attrs = obj(payload.get("object_attributes"), "object_attributes")
    project = obj(payload.get("project"), "project")
    iid = positive_int(attrs.get("iid"), "object_attributes.iid")
    path = project_path(project.get("path_with_namespace"), "project.path_with_namespace")
    user: dict[str, Any] = payload["user"] if isinstance(payload.get("user"), dict) else {}
    action = text_or_none(attrs.get("action"), 64)
    labels = _label_titles(payload.get("labels")) or _label_titles(attrs.get("labels"))
    fields: dict[str, Any] = {
        "action": action,
        "project": path,
        "project_id": text_or_none(project.get("id") or attrs.get("project_id"), 64),
        "issue": iid,
        "issue_url": text_or_none(attrs.get("url"), 2000),
        "clone_url": text_or_none(project.get("git_http_url") or project.get("http_url"), 2000),
        "title": text_or_none(attrs.get("title")),
        "body": text_or_none(attrs.get("description")),
        "sender": text_or_none(user.get("username"), 255),
        "labels": labels,
    }
    confidential = event == CONFIDENTIAL_ISSUE_HOOK or attrs.get("confidential") is True
    if confidential and not allow_confidential:
        return ignore("confidential issues are ignored (FROGFIX_GITLAB_ALLOW_CONFIDENTIAL is off)", **fields)

    changes: dict[str, Any] = payload["changes"] if isinstance(payload.get("changes"), dict) else {}
    label_change = changes.get("labels") if isinstance(changes.get("labels"), dict) else None
    previous = _label_titles(label_change.get("previous")) if label_change else ()
    current = _label_titles(label_change.get("current")) if label_change else labels
    state = attrs.get("state")
    intent: Intent
    if state == "closed" or action == "close":
        intent, reason = "cancel", "the issue is closed"
    elif label_change is not None and trigger_label in previous and trigger_label not in current:
        intent, reason = "cancel", f"label {trigger_label!r} was removed"
    elif label_change is not None and trigger_label in current and trigger_label not in previous:
        intent, reason = "start", f"label {trigger_label!r} was added"
    elif action == "open" and trigger_label in labels:
        intent, reason = "start", f"issue opened with label {trigger_label!r}"
    else:
        intent, reason = "ignore", f"label {trigger_label!r} was not just added"
    return WebhookEvent("gitlab", delivery_id, event, intent, reason, **fields)
