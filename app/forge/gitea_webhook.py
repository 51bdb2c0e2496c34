"""Gitea (and Forgejo) webhooks: verification and parsing (pure functions of headers, body and secret)."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any

from app.forge.reviews import CiJob, CiReport, CiStatus, CommentKind, ReviewComment, command_text, comment_intent
from app.forge.webhook import (
    ANSWER_REASON,
    FORM_MEDIA,
    MAX_COMMENT_CHARS,
    HeaderView,
    Intent,
    MergeReport,
    WebhookEvent,
    WebhookMalformed,
    WebhookUnauthorized,
    answer_ignored,
    body_digest_id,
    bounded_list,
    comment_reason,
    commit_sha,
    decode_json_object,
    dict_or_empty,
    form_payload,
    media_type,
    obj,
    positive_int,
    project_path,
    text_or_none,
)

# A review's X-Gitea-Event (pull_request_approved / _rejected / _comment), its X-Gitea-Event-Type
# (pull_request_review_*), the `pull_request_review` some older senders use, and the review.type
# in the body (pull_request_review_* since Gitea ~1.13, pull_request_* before): one comment kind each.
REVIEW_KINDS: dict[str, CommentKind] = {
    "pull_request_review_rejected": "review_changes",
    "pull_request_rejected": "review_changes",
    "pull_request_review_comment": "review_comment",
    "pull_request_comment": "review_comment",
    "pull_request_review_approved": "review_approved",
    "pull_request_approved": "review_approved",
}
REVIEW_EVENTS = (*REVIEW_KINDS, "pull_request_review")
# A commit status's state: success, or a failure (failure, error); pending and warning decide nothing.
STATUS_STATES: dict[str, CiStatus] = {"success": "success", "failure": "failed", "error": "failed"}


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
    if event in REVIEW_EVENTS and isinstance(payload.get("review"), dict):
        return _review(payload, event, event_type, delivery_id)
    if event == "issue_comment" or (event in REVIEW_EVENTS and "comment" in payload):
        return _comment(payload, event, event_type, delivery_id)
    if event in REVIEW_EVENTS:
        return _review(payload, event, event_type, delivery_id)  # refuses a review event without a review
    if event == "status":
        return _status(payload, delivery_id)
    if event == "pull_request":
        return _pull_request(payload, delivery_id)
    if event != "issues":
        return ignore(f"event {event or '(missing X-Gitea-Event)'} is not an issue, comment, review or status event")
    if event_type and event_type not in ("issues", "issue_label"):
        return ignore(f"event type {event_type} is not handled")
    return _issue(payload, event, delivery_id, trigger_label)


def _issue(payload: dict[str, Any], event: str, delivery_id: str, trigger_label: str) -> WebhookEvent:
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
        return WebhookEvent("gitea", delivery_id, event, "ignore", "the issue is a pull request", **fields)

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


def _login(value: Any) -> str | None:
    user = dict_or_empty(value)
    return text_or_none(user.get("login") or user.get("username"), 255)


def _repo_fields(payload: dict[str, Any]) -> dict[str, Any]:
    """The repository a comment, review or status is about, and who sent it."""
    repo = obj(payload.get("repository"), "repository")
    return {
        "project": project_path(repo.get("full_name"), "repository.full_name"),
        "project_id": text_or_none(repo.get("id"), 64),
        "clone_url": text_or_none(repo.get("clone_url"), 2000),
        "sender": _login(payload.get("sender")),
    }


def _pr_state(state: Any, merged: Any) -> str | None:
    """open / closed / merged from a pull request's state and merged flag (a merged PR is also closed)."""
    if merged is True:
        return "merged"
    return state if state in ("open", "closed") else None


def _comment(payload: dict[str, Any], event: str, event_type: str, delivery_id: str) -> WebhookEvent:
    """A new comment on a pull request is a review (or stop) request for the worker's triage to judge;
    a `/frogfix` comment on a plain issue answers FrogFix's question (`_issue_comment`); any other one,
    or an edit or deletion, is nothing to us."""

    def ignore(reason: str, **extra: Any) -> WebhookEvent:
        return WebhookEvent("gitea", delivery_id, event, "ignore", reason, **extra)

    issue = obj(payload.get("issue"), "issue")
    pull = issue.get("pull_request")
    if not (payload.get("is_pull") is True or pull or event_type == "pull_request_comment"):
        return _issue_comment(payload, issue, event, delivery_id)
    action = payload.get("action")
    if action != "created":
        return ignore(f"comment {str(action)[:40]!r}: only a new comment asks for a round")
    fields = {
        **_repo_fields(payload),
        "mr": positive_int(issue.get("number", payload.get("number")), "issue.number"),
        "mr_state": _pr_state(issue.get("state"), dict_or_empty(pull).get("merged")),
        "title": text_or_none(issue.get("title"), 1000),
    }
    raw = obj(payload.get("comment"), "comment")
    comment = ReviewComment(
        id=str(positive_int(raw.get("id"), "comment.id")),
        kind="note",
        author=_login(raw.get("user")) or fields["sender"],
        body=text_or_none(raw.get("body"), MAX_COMMENT_CHARS) or "",
        url=text_or_none(raw.get("html_url"), 2000),
    )
    asks = comment_intent(comment.body)
    intent: Intent = asks
    reason = comment_reason(asks, "a comment on a pull request", "on a pull request")
    return WebhookEvent("gitea", delivery_id, event, intent, reason, action="created", comment=comment, **fields)


def _issue_comment(payload: dict[str, Any], issue: dict[str, Any], event: str, delivery_id: str) -> WebhookEvent:
    """A comment on a plain issue. One that starts with `/frogfix` answers the question FrogFix asked instead
    of opening a pull request (intake re-queues the issue's job only if it asked; the worker checks the
    commenter's rights); any other comment, an edit or deletion, or one on a closed issue is nothing to us.
    `/frogfix stop` on an issue stops nothing: anyone may comment, so a stop is the label's removal."""

    def ignore(reason: str, **extra: Any) -> WebhookEvent:
        return WebhookEvent("gitea", delivery_id, event, "ignore", reason, **extra)

    raw = dict_or_empty(payload.get("comment"))
    body = text_or_none(raw.get("body"), MAX_COMMENT_CHARS) or ""
    if command_text(body) is None:
        return ignore("a comment on an issue (not on a pull request) that is not a /frogfix command")
    fields = {
        **_repo_fields(payload),
        "issue": positive_int(issue.get("number", payload.get("number")), "issue.number"),
        "issue_url": text_or_none(issue.get("html_url"), 2000),
        "title": text_or_none(issue.get("title"), 1000),
    }
    action = payload.get("action")
    if action != "created":
        return ignore(f"comment {str(action)[:40]!r}: only a new /frogfix comment answers", **fields)
    why = answer_ignored(issue.get("state") == "closed", body)
    if why is not None:
        return ignore(why, **fields)
    comment = ReviewComment(
        id=str(positive_int(obj(payload.get("comment"), "comment").get("id"), "comment.id")),
        kind="note",
        author=_login(raw.get("user")) or fields["sender"],
        body=body,
        url=text_or_none(raw.get("html_url"), 2000),
    )
    return WebhookEvent(
        "gitea",
        delivery_id,
        event,
        "answer",
        ANSWER_REASON,
        action="created",
        comment=comment,
        **fields,
    )


def _review_kind(review: dict[str, Any], event: str, event_type: str) -> CommentKind | None:
    """The review's kind. The body's review.type first: the signature covers the body, not the headers."""
    for name in (review.get("type"), event_type, event):
        if isinstance(name, str) and name in REVIEW_KINDS:
            return REVIEW_KINDS[name]
    return None


def _review(payload: dict[str, Any], event: str, event_type: str, delivery_id: str) -> WebhookEvent:
    """A submitted review: one that requests changes, or a comment review (a line comment), is a
    review request; an approval asks for nothing.

    The payload names no review id: the id is derived from what the review says, so Gitea
    redelivering it (with a new delivery id) still makes one request, not two.
    """

    def ignore(reason: str, **extra: Any) -> WebhookEvent:
        return WebhookEvent("gitea", delivery_id, event, "ignore", reason, **extra)

    review = obj(payload.get("review"), "review")
    pr = obj(payload.get("pull_request"), "pull_request")
    head = dict_or_empty(pr.get("head"))
    fields = {
        **_repo_fields(payload),
        "mr": positive_int(pr.get("number", payload.get("number")), "pull_request.number"),
        "mr_state": _pr_state(pr.get("state"), pr.get("merged")),
        "source_branch": text_or_none(head.get("ref"), 255),
        "title": text_or_none(pr.get("title"), 1000),
    }
    action = payload.get("action")
    if action != "reviewed":
        return ignore(f"review action {str(action)[:40]!r} is not 'reviewed'", **fields)
    kind = _review_kind(review, event, event_type)
    if kind is None:
        return ignore(f"review type {str(review.get('type'))[:60]!r} is not handled", **fields)
    sha = payload.get("commit_id") or head.get("sha")
    body = text_or_none(review.get("content"), MAX_COMMENT_CHARS) or ""
    digest = hashlib.sha256(
        json.dumps([fields["mr"], kind, fields["sender"], sha if isinstance(sha, str) else None, body]).encode()
    ).hexdigest()
    comment = ReviewComment(
        id=f"review-{digest[:24]}",
        kind=kind,
        author=fields["sender"],
        body=body,
        url=text_or_none(pr.get("html_url"), 2000),
        sha=commit_sha(sha, "the review's commit_id") if isinstance(sha, str) and sha else None,
    )
    if kind == "review_approved":
        return ignore("an approving review asks for no changes", action=action, comment=comment, **fields)
    asks = comment_intent(body)
    intent: Intent = asks
    reason = comment_reason(asks, f"a {kind} review on a pull request", "in a review")
    return WebhookEvent("gitea", delivery_id, event, intent, reason, action=action, comment=comment, **fields)


def _pull_request(payload: dict[str, Any], delivery_id: str) -> WebhookEvent:
    """A pull request closed (`action` closed; `merged` true when it was merged) is the human end of
    FrogFix's record (intent `merge`); other pull request actions are not followed here."""
    pr = obj(payload.get("pull_request"), "pull_request")
    head = dict_or_empty(pr.get("head"))
    state = _pr_state(pr.get("state"), pr.get("merged"))
    fields = {
        **_repo_fields(payload), "action": text_or_none(payload.get("action"), 64),
        "mr": positive_int(pr.get("number", payload.get("number")), "pull_request.number"), "mr_state": state,
        "source_branch": text_or_none(head.get("ref"), 255), "title": text_or_none(pr.get("title"), 1000),
    }  # fmt: skip
    if fields["action"] != "closed" or state not in ("merged", "closed"):
        return WebhookEvent("gitea", delivery_id, "pull_request", "ignore",
                            "only a merge or a close of a pull request is followed", **fields)  # fmt: skip
    merged = pr.get("merge_commit_sha")
    report = MergeReport(
        "merged" if state == "merged" else "closed",
        _login(pr.get("merged_by")) if state == "merged" and pr.get("merged_by") else fields["sender"],
        text_or_none(pr.get("merged_at") or pr.get("closed_at"), 64),
        commit_sha(head["sha"], "pull_request.head.sha") if head.get("sha") else None,
        commit_sha(merged, "pull_request.merge_commit_sha") if merged and state == "merged" else None,
    )
    return WebhookEvent("gitea", delivery_id, "pull_request", "merge", f"the pull request was {report.action}",
                        merge=report, **fields)  # fmt: skip


def _status(payload: dict[str, Any], delivery_id: str) -> WebhookEvent:
    """A commit status that passed or failed is a CI result on its commit; pending or warning decides nothing."""
    fields = _repo_fields(payload)
    state = payload.get("state")
    if not isinstance(state, str) or state not in STATUS_STATES:
        return WebhookEvent(
            "gitea", delivery_id, "status", "ignore", f"status {str(state)[:40]!r} is not final", **fields
        )
    status = STATUS_STATES[state]
    context = text_or_none(payload.get("context"), 255) or "default"
    sha = commit_sha(payload.get("sha") or dict_or_empty(payload.get("commit")).get("id"), "sha")
    branches = [b for b in bounded_list(payload.get("branches"), 10) if isinstance(b, dict)]
    branch = text_or_none(branches[0].get("name"), 255) if branches else None
    url = text_or_none(payload.get("target_url"), 2000)
    description = text_or_none(payload.get("description"), 1000)
    failed = (CiJob(id=context, name=context, status="failed", failure_reason=description, url=url),)
    report = CiReport(
        system="gitea_status",
        id=context,
        sha=sha,
        status=status,
        ref=branch,
        url=url,
        description=description,
        failed_jobs=failed if status == "failed" else (),
    )
    return WebhookEvent(
        "gitea",
        delivery_id,
        "status",
        "ci",
        f"commit status {context!r} {state}",
        action=state,
        ci=report,
        source_branch=branch,
        **fields,
    )
