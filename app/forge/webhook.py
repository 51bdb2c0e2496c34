"""What every forge shares: the normalised webhook event, what it asks of us, and the errors.

Parsing a webhook is a pure function of (headers, body, secret): no I/O, no clock unless passed in.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from app.forge.reviews import CiReport, CommentIntent, ReviewComment, is_stop


class WebhookError(Exception):
    """A delivery we refuse; `status` is the HTTP answer. Set after verification: who sent it."""

    status = 400
    delivery_id: str | None = None
    event: str | None = None


class WebhookUnauthorized(WebhookError):
    status = 401


class WebhookMalformed(WebhookError):
    status = 400


class WebhookUnsupportedMedia(WebhookMalformed):
    status = 415


# start / cancel / recheck: an issue event about the trigger label (the first run).
# review: a comment or review on an MR/PR (a round request if the MR is FrogFix's and the worker's
#   triage finds it addressed to FrogFix by a member); stop: `/frogfix stop` on an MR/PR;
#   update: `/frogfix rebase` (or `update`) on an MR/PR: merge its moved target branch in (issue 25);
# ci: a finished CI result on a commit (GitLab pipeline, Gitea/Forgejo commit status).
# answer: a `/frogfix` comment on an issue (not an MR/PR): the reporter answered the question FrogFix
#   asked instead of opening an MR, so the issue's job may run again (intake checks it asked; the
#   worker checks the commenter's rights).
Intent = Literal["start", "cancel", "recheck", "ignore", "review", "stop", "update", "ci", "answer", "merge"]
# The intents that become a round request on an MR FrogFix opened (app/jobs/rounds.py).
ROUND_INTENTS: tuple[Intent, ...] = ("review", "stop", "update", "ci")


@dataclass(frozen=True)
class MergeReport:
    """An MR/PR merged or closed by a person (intent `merge`): who, when, the MR's head and, merged, the
    target's new commit; the worker signs it (worker/job/merge_attesting.py)."""

    action: Literal["merged", "closed"]
    by: str | None
    at: str | None
    head: str | None
    merged_commit: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "by": self.by, "at": self.at, "head": self.head,
                "merged_commit": self.merged_commit}  # fmt: skip


@dataclass(frozen=True)
class WebhookEvent:
    """One verified delivery, reduced to what FrogFix acts on."""

    forge: Literal["gitlab", "gitea"]
    delivery_id: str
    event: str
    intent: Intent
    reason: str
    action: str | None = None
    project: str | None = None
    project_id: str | None = None
    issue: int | None = None
    issue_url: str | None = None
    clone_url: str | None = None
    title: str | None = None
    body: str | None = None
    sender: str | None = None
    labels: tuple[str, ...] = field(default_factory=tuple)
    # Review rounds: the MR/PR the delivery is about (its iid / index), its state normalised to
    # open / closed / merged, its source branch, and the comment or CI result it carries.
    # An `answer` carries its `/frogfix` comment (on the issue: `issue`, no `mr`) in `comment` too.
    mr: int | None = None
    mr_state: str | None = None
    source_branch: str | None = None
    comment: ReviewComment | None = None
    ci: CiReport | None = None
    merge: MergeReport | None = None


class HeaderView:
    """Case-insensitive read-only headers (HTTP header names are case-insensitive)."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._h = {k.lower(): v for k, v in headers.items()}

    def get(self, *names: str) -> str | None:
        for name in names:
            value = self._h.get(name.lower())
            if value is not None:
                return value
        return None


ANSWER_REASON = "/frogfix on an issue: an answer to FrogFix's question"


def answer_ignored(closed: bool, body: str) -> str | None:
    """Why a new `/frogfix` comment on an issue answers nothing (both forges' one rule), or None."""
    if closed:
        return "/frogfix on a closed issue: FrogFix works only on open issues"
    if is_stop(body):
        return "/frogfix stop on an issue stops nothing: remove the trigger label to stop FrogFix"
    return None


# What each comment intent is called in a webhook's reason, per where the comment was made.
_INTENT_WORDS: dict[CommentIntent, str] = {"stop": "/frogfix stop", "update": "/frogfix rebase (an update round)"}


def comment_reason(intent: CommentIntent, otherwise: str, where: str) -> str:
    """The recorded reason of a comment on an MR/PR: its command, or `otherwise` (what kind of comment it is)."""
    return f"{_INTENT_WORDS[intent]} {where}" if intent in _INTENT_WORDS else otherwise


def body_digest_id(body: bytes) -> str:
    """A stable delivery id for forges too old to send one: the same bytes are the same delivery."""
    return "sha256:" + hashlib.sha256(body).hexdigest()


def media_type(content_type: str | None) -> str:
    """The bare media type of a Content-Type header (JSON when none is given)."""
    return (content_type or "application/json").split(";")[0].strip().lower()


FORM_MEDIA = "application/x-www-form-urlencoded"


def form_payload(body: bytes) -> bytes:
    """The `payload=` value of a form delivery, as the bytes Gitea put there (and signed)."""
    from urllib.parse import parse_qs

    try:
        fields = parse_qs(body.decode("utf-8"), strict_parsing=False)
    except UnicodeDecodeError as exc:
        raise WebhookMalformed("form body is not UTF-8") from exc
    if "payload" not in fields:
        raise WebhookMalformed("form body has no 'payload' field")
    return fields["payload"][0].encode("utf-8")


def decode_json_object(body: bytes, content_type: str | None) -> dict[str, Any]:
    """The JSON object in a body (JSON, or a form with `payload=` as Gitea can be set to send)."""
    media = media_type(content_type)
    if media == FORM_MEDIA:
        body = form_payload(body)
    elif media not in ("application/json", "text/json") and not media.endswith("+json"):
        raise WebhookUnsupportedMedia(f"unsupported content type {media!r}; send application/json")
    if not body.strip():
        raise WebhookMalformed("empty body")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise WebhookMalformed(f"body is not valid JSON: {str(exc)[:200]}") from exc
    if not isinstance(data, dict):
        raise WebhookMalformed(f"JSON body must be an object, not {type(data).__name__}")
    return data


def obj(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise WebhookMalformed(f"{what} must be a JSON object")
    return value


# NUL and lone surrogates are valid in JSON escapes but no database stores them (PostgreSQL
# refuses NUL in text, and neither SQLite nor PostgreSQL can encode a lone surrogate as UTF-8).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Control characters (NUL included) and lone surrogates have no place in a project path.
_BAD_PATH_CHARS = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
MAX_PROJECT_PATH = 255


def storable(value: str) -> str:
    """`value` with NUL and lone surrogates replaced by U+FFFD, so the database can store it."""
    return _UNSTORABLE.sub("\ufffd", value)


def text_or_none(value: Any, limit: int = 1_000_000) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        value = str(value)
    return storable(value[:limit])


def project_path(value: Any, what: str) -> str:
    """A forge project path (`group/sub/name`): refused, never truncated or rewritten, when it is
    not one a forge can send: empty, too long, control characters, or `.`/`..`/empty segments."""
    if not isinstance(value, str) or not value.strip():
        raise WebhookMalformed(f"{what} must be a non-empty string")
    path = value.strip()
    if len(path) > MAX_PROJECT_PATH:
        raise WebhookMalformed(f"{what} is longer than {MAX_PROJECT_PATH} characters")
    if _BAD_PATH_CHARS.search(path):
        raise WebhookMalformed(f"{what} contains control characters")
    if any(part in ("", ".", "..") for part in path.split("/")):
        raise WebhookMalformed(f"{what} must not have empty, '.' or '..' segments")
    return path


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value > 2**31 - 1:
        raise WebhookMalformed(f"{what} must be a positive integer")
    return value


# A reviewer's comment reaches the model: bounded here, once, for both forges.
MAX_COMMENT_CHARS = 20_000
_SHA = re.compile(r"[0-9a-fA-F]{7,64}")


def commit_sha(value: Any, what: str) -> str:
    """A commit id as a forge sends it (7 to 64 hex digits, lowered): the worker compares it with
    the MR's head and the commits it pushed, so anything else is refused, never passed on."""
    if not isinstance(value, str) or not _SHA.fullmatch(value.strip()):
        raise WebhookMalformed(f"{what} must be a commit id (hex)")
    return value.strip().lower()


def optional_positive_int(value: Any) -> int | None:
    """An optional number (a line, a position): None when absent or not a positive integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value > 2**31 - 1:
        return None
    return value


def bounded_list(items: Any, limit: int) -> list[Any]:
    """The first `limit` items of a JSON list (none when it is not a list): a hook's lists are bounded."""
    return list(items[:limit]) if isinstance(items, list) else []


def dict_or_empty(value: Any) -> dict[str, Any]:
    """An optional JSON object of a hook: itself, or {} when it is absent or not an object."""
    return value if isinstance(value, dict) else {}
