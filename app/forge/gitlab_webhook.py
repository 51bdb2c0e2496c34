"""GitLab webhooks: verification and parsing (pure functions of headers, body and secrets)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from app.forge.reviews import (
    CI_FINAL,
    CiJob,
    CiReport,
    CiStatus,
    CommentKind,
    ReviewComment,
    command_text,
    comment_intent,
)
from app.forge.webhook import (
    ANSWER_REASON,
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
    obj,
    optional_positive_int,
    positive_int,
    project_path,
    text_or_none,
)

ISSUE_HOOK = "Issue Hook"
CONFIDENTIAL_ISSUE_HOOK = "Confidential Issue Hook"
NOTE_HOOK = "Note Hook"
CONFIDENTIAL_NOTE_HOOK = "Confidential Note Hook"
PIPELINE_HOOK = "Pipeline Hook"
MERGE_REQUEST_HOOK = "Merge Request Hook"
JOB_HOOK = "Job Hook"
# merge_request.state, and state_id where an older hook sends only that (1 opened, 2 closed, 3 merged, 4 locked).
MR_STATES = {"opened": "open", "locked": "open", "closed": "closed", "merged": "merged"}
MR_STATE_IDS = {1: "open", 2: "closed", 3: "merged", 4: "open"}
MAX_FAILED_BUILDS = 50
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
    if event in (NOTE_HOOK, CONFIDENTIAL_NOTE_HOOK):
        return _note(payload, event, delivery_id, allow_confidential)
    if event == PIPELINE_HOOK:
        return _pipeline(payload, delivery_id)
    if event == MERGE_REQUEST_HOOK:
        return _merge_request(payload, delivery_id)
    if event == JOB_HOOK:
        return ignore("job events are not followed: FrogFix follows whole pipelines (Pipeline events)")
    if event not in (ISSUE_HOOK, CONFIDENTIAL_ISSUE_HOOK):
        return ignore(f"event {event or '(missing X-Gitlab-Event)'} is not an issue, comment or pipeline event")
    return _issue(payload, event, delivery_id, trigger_label, allow_confidential)


def _issue(
    payload: dict[str, Any], event: str, delivery_id: str, trigger_label: str, allow_confidential: bool
) -> WebhookEvent:
    def ignore(reason: str, **extra: Any) -> WebhookEvent:
        return WebhookEvent("gitlab", delivery_id, event, "ignore", reason, **extra)

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


def _username(value: Any) -> str | None:
    return text_or_none(value.get("username"), 255) if isinstance(value, dict) else None


def _project_fields(payload: dict[str, Any]) -> dict[str, Any]:
    """The project a Note or Pipeline hook is about, and who sent it."""
    project = obj(payload.get("project"), "project")
    return {
        "project": project_path(project.get("path_with_namespace"), "project.path_with_namespace"),
        "project_id": text_or_none(project.get("id") or payload.get("project_id"), 64),
        "clone_url": text_or_none(project.get("git_http_url") or project.get("http_url"), 2000),
        "sender": _username(payload.get("user")),
    }


def _mr_state(mr: dict[str, Any]) -> str | None:
    """open / closed / merged from merge_request.state (or state_id); None when it says neither."""
    state = mr.get("state")
    if isinstance(state, str) and state in MR_STATES:
        return MR_STATES[state]
    state_id = mr.get("state_id")
    return MR_STATE_IDS.get(state_id) if isinstance(state_id, int) and not isinstance(state_id, bool) else None


def _mr_fields(mr: dict[str, Any]) -> dict[str, Any]:
    """The merge request a hook is about: its iid, state, source branch and title."""
    return {
        "mr": positive_int(mr.get("iid"), "merge_request.iid"),
        "mr_state": _mr_state(mr),
        "source_branch": text_or_none(mr.get("source_branch"), 255),
        "title": text_or_none(mr.get("title"), 1000),
    }


def _merge_request(payload: dict[str, Any], delivery_id: str) -> WebhookEvent:
    """A Merge Request Hook: a merge (`action` merge) or a close is the human end of FrogFix's record (intent
    `merge`); anything else on an MR is not followed here. The merged commit is `merge_commit_sha` (the
    squash's own commit where GitLab made no merge commit: `squash_commit_sha`)."""
    attrs = obj(payload.get("object_attributes"), "object_attributes")
    action, state = text_or_none(attrs.get("action"), 64), _mr_state(attrs)
    if action not in ("merge", "close") or state not in ("merged", "closed") or not optional_positive_int(
        attrs.get("iid")
    ):
        return WebhookEvent("gitlab", delivery_id, MERGE_REQUEST_HOOK, "ignore",
                            "only a merge or a close of an MR (with its iid) is followed", action=action)  # fmt: skip
    fields = {**_project_fields(payload), **_mr_fields(attrs), "action": action}
    last = dict_or_empty(attrs.get("last_commit"))
    merged = attrs.get("merge_commit_sha") or attrs.get("squash_commit_sha")
    report = MergeReport(
        "merged" if state == "merged" else "closed", fields["sender"],
        text_or_none(attrs.get("merged_at") or attrs.get("updated_at"), 64),
        commit_sha(last["id"], "object_attributes.last_commit.id") if last.get("id") else None,
        commit_sha(merged, "object_attributes.merge_commit_sha") if merged and state == "merged" else None,
    )  # fmt: skip
    return WebhookEvent("gitlab", delivery_id, MERGE_REQUEST_HOOK, "merge", f"the MR was {report.action}",
                        merge=report, **fields)  # fmt: skip


def _confidential_note(payload: dict[str, Any], event: str, attrs: dict[str, Any]) -> bool:
    """Whether a note is confidential: its hook, its event_type, or the note's own flags."""
    return (
        event == CONFIDENTIAL_NOTE_HOOK
        or payload.get("event_type") == "confidential_note"
        or attrs.get("confidential") is True
        or attrs.get("internal") is True
    )


def _not_a_new_comment(attrs: dict[str, Any], confidential: bool, allow_confidential: bool, only: str) -> str | None:
    """Why a note (on an MR or an issue) is nothing to act on, or None: a confidential one while that is
    off, GitLab's own system note, or not a new comment (`only` says what a new one does).

    `action` since GitLab 16.11; an older hook names none, for a new comment and an edit alike (an edit
    then reads as new, and the request's dedupe key, the note id, makes it one request)."""
    if confidential and not allow_confidential:
        return "confidential comments are ignored (FROGFIX_GITLAB_ALLOW_CONFIDENTIAL is off)"
    if attrs.get("system") is True:
        return "a system note (GitLab's own record of a change), not a comment"
    action = attrs.get("action")
    if action is not None and action != "create":
        return f"comment {str(action)[:40]!r}: {only}"
    return None


def _note(payload: dict[str, Any], event: str, delivery_id: str, allow_confidential: bool) -> WebhookEvent:
    """A comment: on a merge request it is a review (or stop) request for the worker's triage to judge;
    on an issue, a `/frogfix` comment answers FrogFix's question (`_issue_note`); on a commit or snippet,
    or written by GitLab itself (a system note), it is nothing to us."""

    def ignore(reason: str, **extra: Any) -> WebhookEvent:
        return WebhookEvent("gitlab", delivery_id, event, "ignore", reason, **extra)

    if payload.get("object_kind") != "note":
        return ignore(f"object_kind {str(payload.get('object_kind'))[:40]!r} is not 'note'")
    attrs = obj(payload.get("object_attributes"), "object_attributes")
    noteable = attrs.get("noteable_type")
    if noteable == "Issue":
        return _issue_note(payload, event, delivery_id, attrs, allow_confidential)
    if noteable != "MergeRequest":
        return ignore(f"a comment on {str(noteable)[:40]!r}, not on a merge request")
    fields = {**_project_fields(payload), **_mr_fields(obj(payload.get("merge_request"), "merge_request"))}
    confidential = _confidential_note(payload, event, attrs)
    why = _not_a_new_comment(attrs, confidential, allow_confidential, "only a new comment asks for a round")
    if why is not None:
        return ignore(why, **fields)
    action = attrs.get("action")

    comment = _review_comment(attrs, payload, fields["sender"])
    asks = comment_intent(comment.body)
    intent: Intent = asks
    reason = comment_reason(asks, f"a {comment.kind} on a merge request", "on a merge request")
    return WebhookEvent(
        "gitlab", delivery_id, event, intent, reason, action=text_or_none(action, 64), comment=comment, **fields
    )


def _issue_note(
    payload: dict[str, Any], event: str, delivery_id: str, attrs: dict[str, Any], allow_confidential: bool
) -> WebhookEvent:
    """A comment on an issue. One that starts with `/frogfix` answers the question FrogFix asked instead of
    opening an MR (intake re-queues the issue's job only if it asked; the worker checks the commenter's
    rights); any other comment, a system note, an edit, or a comment on a closed issue is nothing to us.
    `/frogfix stop` on an issue stops nothing: anyone may comment, so a stop is the label's removal."""

    def ignore(reason: str, **extra: Any) -> WebhookEvent:
        return WebhookEvent("gitlab", delivery_id, event, "ignore", reason, **extra)

    body = text_or_none(attrs.get("note"), MAX_COMMENT_CHARS) or ""
    if command_text(body) is None:
        return ignore("a comment on an issue (not on a merge request) that is not a /frogfix command")
    issue = obj(payload.get("issue"), "issue")
    fields: dict[str, Any] = {
        **_project_fields(payload),
        "issue": positive_int(issue.get("iid"), "issue.iid"),
        "issue_url": text_or_none(issue.get("url"), 2000),
        "title": text_or_none(issue.get("title"), 1000),
    }
    confidential = _confidential_note(payload, event, attrs) or issue.get("confidential") is True
    why = _not_a_new_comment(attrs, confidential, allow_confidential, "only a new /frogfix comment answers")
    if why is not None:
        return ignore(why, **fields)
    action = attrs.get("action")
    why = answer_ignored(issue.get("state") == "closed", body)
    if why is not None:
        return ignore(why, **fields)
    comment = ReviewComment(
        id=str(positive_int(attrs.get("id"), "object_attributes.id")),
        kind="note",
        author=fields["sender"],
        body=body,
        url=text_or_none(attrs.get("url"), 2000),
    )
    return WebhookEvent(
        "gitlab",
        delivery_id,
        event,
        "answer",
        ANSWER_REASON,
        action=text_or_none(action, 64),
        comment=comment,
        **fields,
    )


def _review_comment(attrs: dict[str, Any], payload: dict[str, Any], author: str | None) -> ReviewComment:
    """The comment itself: a DiffNote (or any note with a position) is a line comment on new_path:new_line,
    or old_path:old_line on a removed line."""
    position = dict_or_empty(attrs.get("position"))
    kind: CommentKind = "diff_note" if attrs.get("type") == "DiffNote" or position else "note"
    new_line = optional_positive_int(position.get("new_line"))
    old_line = optional_positive_int(position.get("old_line"))
    if new_line is not None or old_line is None:
        path, line = position.get("new_path") or position.get("old_path"), new_line
    else:  # a comment on a removed line: only the old side has it
        path, line = position.get("old_path") or position.get("new_path"), old_line
    head_sha = position.get("head_sha")
    last_commit = dict_or_empty(dict_or_empty(payload.get("merge_request")).get("last_commit"))
    sha = head_sha if isinstance(head_sha, str) and head_sha else last_commit.get("id")
    return ReviewComment(
        id=str(positive_int(attrs.get("id"), "object_attributes.id")),
        kind=kind,
        author=author,
        body=text_or_none(attrs.get("note"), MAX_COMMENT_CHARS) or "",
        url=text_or_none(attrs.get("url"), 2000),
        discussion_id=text_or_none(attrs.get("discussion_id"), 255),
        path=text_or_none(path, 1000) if isinstance(path, str) else None,
        line=line,
        sha=commit_sha(sha, "the comment's commit") if isinstance(sha, str) and sha else None,
    )


def _pipeline(payload: dict[str, Any], delivery_id: str) -> WebhookEvent:
    """A finished pipeline is a CI result on its commit (and its MR, when the hook names one);
    a pipeline still on its way, or one on a tag, is nothing to us yet."""

    def ignore(reason: str, **extra: Any) -> WebhookEvent:
        return WebhookEvent("gitlab", delivery_id, PIPELINE_HOOK, "ignore", reason, **extra)

    if payload.get("object_kind") != "pipeline":
        return ignore(f"object_kind {str(payload.get('object_kind'))[:40]!r} is not 'pipeline'")
    attrs = obj(payload.get("object_attributes"), "object_attributes")
    fields = _project_fields(payload)
    status = attrs.get("status")
    if status not in CI_FINAL:
        return ignore(f"pipeline status {str(status)[:40]!r} is not final", **fields)
    if attrs.get("tag") is True:
        return ignore("a tag pipeline: FrogFix follows the pipelines of its MR branches", **fields)
    pipeline_id = positive_int(attrs.get("id"), "object_attributes.id")
    commit = dict_or_empty(payload.get("commit"))
    sha = commit_sha(attrs.get("sha") or commit.get("id"), "object_attributes.sha")
    ref = text_or_none(attrs.get("ref"), 255)
    mr = payload.get("merge_request")
    if isinstance(mr, dict):
        fields.update(_mr_fields(mr))
    if not fields.get("source_branch") and ref and not ref.startswith("refs/"):
        fields["source_branch"] = ref
    project = payload["project"]
    web_url = project.get("web_url") if isinstance(project.get("web_url"), str) else None
    url = attrs.get("url") or (f"{web_url}/-/pipelines/{pipeline_id}" if web_url else None)
    ci_status: CiStatus = status
    report = CiReport(
        system="gitlab_pipeline",
        id=str(pipeline_id),
        sha=sha,
        status=ci_status,
        ref=ref,
        url=text_or_none(url, 2000),
        source=text_or_none(attrs.get("source"), 64),
        description=text_or_none(attrs.get("name"), 1000),
        failed_jobs=_failed_builds(payload.get("builds"), web_url),
    )
    return WebhookEvent(
        "gitlab",
        delivery_id,
        PIPELINE_HOOK,
        "ci",
        f"pipeline {pipeline_id} {status}",
        action=status,
        ci=report,
        **fields,
    )


def _failed_builds(builds: Any, web_url: str | None) -> tuple[CiJob, ...]:
    """The hook's failed jobs that failed the pipeline (allowed failures left out), without logs."""
    jobs = []
    for build in bounded_list(builds, MAX_FAILED_BUILDS * 4):
        if not isinstance(build, dict) or build.get("status") != "failed" or build.get("allow_failure") is True:
            continue
        build_id = optional_positive_int(build.get("id"))
        if build_id is None:
            continue
        jobs.append(
            CiJob(
                id=str(build_id),
                name=text_or_none(build.get("name"), 255) or f"job {build_id}",
                status="failed",
                stage=text_or_none(build.get("stage"), 255),
                failure_reason=text_or_none(build.get("failure_reason"), 255),
                url=text_or_none(f"{web_url}/-/jobs/{build_id}", 2000) if web_url else None,
            )
        )
    return tuple(jobs[:MAX_FAILED_BUILDS])
