"""Building signed webhook requests the way GitLab and Gitea send them."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from pathlib import Path

from tests.conftest import GITEA_SECRET, GITLAB_SECRET, PAYLOADS


def gitlab_headers(
    event: str = "Issue Hook",
    token: str | None = GITLAB_SECRET,
    delivery: str | None = None,
    content_type: str = "application/json",
) -> dict[str, str]:
    headers = {
        "Content-Type": content_type,
        "User-Agent": "GitLab/17.11.1-ee",
        "X-Gitlab-Event": event,
        "Idempotency-Key": delivery or str(uuid.uuid4()),
        "X-Gitlab-Event-UUID": str(uuid.uuid4()),
        "X-Gitlab-Instance": "https://git.acme.test",
    }
    if token is not None:
        headers["X-Gitlab-Token"] = token
    return headers


def gitea_headers(
    body: bytes,
    event: str = "issues",
    event_type: str = "issue_label",
    secret: str | None = GITEA_SECRET,
    delivery: str | None = None,
    content_type: str = "application/json",
    signed: bytes | None = None,
) -> dict[str, str]:
    """Gitea's headers for `body`, signed over `signed` (default: the body itself).

    Gitea signs the JSON payload, also when it sends it as a form (`payload=<JSON>`): pass the
    JSON as `signed` for a form delivery.
    """
    headers = {
        "Content-Type": content_type,
        "X-Gitea-Event": event,
        "X-Gitea-Event-Type": event_type,
        "X-Gitea-Delivery": delivery or str(uuid.uuid4()),
    }
    if secret is not None:
        message = body if signed is None else signed
        headers["X-Gitea-Signature"] = hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()
    return headers


def payload(name: str) -> bytes:
    return (PAYLOADS / name).read_bytes()


def read(path: Path) -> bytes:
    return path.read_bytes()
