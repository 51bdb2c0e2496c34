"""Review rounds' shared vocabulary: a reviewer's comment, a thread note, a CI result, and how to read them.

One home for what the webhook parsers (pure), the forge API clients and the round pipeline all
name: so a comment's kinds, the `/frogfix` command and the CI statuses are written once. An issue's
comments (`IssueComment`: the reporter's answer to a question FrogFix asked) are named here too.
Everything in these records came from the forge and was typed by people FrogFix does not trust:
the round pipeline hands it to the model as data, never as instructions.
Standard library only (the webhook parsers import it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, runtime_checkable

COMMAND = "/frogfix"
STOP_WORDS = ("stop", "cancel")
# `/frogfix rebase` / `/frogfix update`: merge the MR's moved target branch into it (an update round, issue 25).
UPDATE_WORDS = ("rebase", "update")

# What a comment on the bot's MR is, as the forge said it:
# - note: a plain MR/PR comment (GitLab Note on a MergeRequest, Gitea issue_comment on a pull request);
# - diff_note: a line comment (GitLab DiffNote / DiscussionNote with a position);
# - review_changes: a Gitea/Forgejo review that requests changes;
# - review_comment: a Gitea/Forgejo review of type comment (its line comments come with it);
# - review_approved: an approving review (never starts a round).
CommentKind = Literal["note", "diff_note", "review_changes", "review_comment", "review_approved"]

# CI statuses, normalised over GitLab pipelines and Gitea/Forgejo commit statuses.
CiStatus = Literal["success", "failed", "canceled", "skipped", "running", "pending"]
CI_FINAL: tuple[str, ...] = ("success", "failed", "canceled", "skipped")


@dataclass(frozen=True)
class ReviewComment:
    """One comment or review on an MR/PR as the webhook carried it (text untrusted, bounded by the parser)."""

    id: str  # GitLab note id, Gitea comment or review id
    kind: CommentKind
    author: str | None
    body: str
    url: str | None = None
    discussion_id: str | None = None  # GitLab: the thread a reply goes to
    path: str | None = None  # a line comment's file (new path)
    line: int | None = None  # a line comment's line in the new file (old line when only that is known)
    sha: str | None = None  # the head commit the comment was made on, when the forge says

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "author": self.author,
            "body": self.body,
            "url": self.url,
            "discussion_id": self.discussion_id,
            "path": self.path,
            "line": self.line,
            "sha": self.sha,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReviewComment:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


@dataclass(frozen=True)
class ThreadNote:
    """One note of an MR's review thread as the forge API lists it now (system notes left out)."""

    id: str
    author: str | None
    body: str
    created_at: str | None = None
    discussion_id: str | None = None
    path: str | None = None
    line: int | None = None
    resolved: bool | None = None  # None: a note that cannot be resolved (a plain comment)
    kind: str = "note"  # note, diff_note, review

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "author": self.author,
            "body": self.body,
            "created_at": self.created_at,
            "discussion_id": self.discussion_id,
            "path": self.path,
            "line": self.line,
            "resolved": self.resolved,
            "kind": self.kind,
        }


@dataclass(frozen=True)
class IssueComment:
    """One human comment on an issue as the forge API lists it now (system notes left out), oldest first.

    `created_at` is the forge's own clock, timezone-aware (None when the forge gave none that reads);
    `internal`: a GitLab internal (confidential) note, which only members see.
    """

    id: str
    author: str | None
    body: str
    created_at: datetime | None = None
    internal: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "author": self.author,
            "body": self.body,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "internal": self.internal,
        }


def forge_time(value: Any) -> datetime | None:
    """A timestamp as a forge writes it, timezone-aware: the APIs' ISO 8601 (`2024-05-01T10:00:00.123Z`,
    `2024-05-01T19:00:00+09:00`) and GitLab hooks' `2024-05-01 10:00:00 UTC`; None for anything else.
    A time without a zone is taken as UTC."""
    if not isinstance(value, str) or not value.strip() or len(value) > 64:
        return None
    text = value.strip()
    if text.endswith(" UTC"):
        text = text[:-4]
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class CiJob:
    """One failed CI job (GitLab) or failing commit status (Gitea), with the tail of its log when there is one."""

    id: str
    name: str
    status: str
    stage: str | None = None
    failure_reason: str | None = None
    url: str | None = None
    log_tail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "status": self.status,
            "stage": self.stage,
            "failure_reason": self.failure_reason,
            "url": self.url,
            "log_tail": self.log_tail,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CiJob:
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__ if k in data})  # type: ignore[arg-type]


@dataclass(frozen=True)
class CiReport:
    """One CI result on a commit, as the hook carried it. Hooks carry no logs: the worker fetches them."""

    system: Literal["gitlab_pipeline", "gitea_status"]
    id: str  # GitLab pipeline id; Gitea status context
    sha: str
    status: CiStatus
    ref: str | None = None  # GitLab: the branch, or refs/merge-requests/N/head; Gitea: a branch when sent
    url: str | None = None
    source: str | None = None  # GitLab: push, merge_request_event, web, ...
    description: str | None = None
    failed_jobs: tuple[CiJob, ...] = field(default_factory=tuple)  # from the hook, without logs

    def to_dict(self) -> dict[str, Any]:
        return {
            "system": self.system,
            "id": self.id,
            "sha": self.sha,
            "status": self.status,
            "ref": self.ref,
            "url": self.url,
            "source": self.source,
            "description": self.description,
            "failed_jobs": [job.to_dict() for job in self.failed_jobs],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CiReport:
        values = {k: data.get(k) for k in cls.__dataclass_fields__ if k != "failed_jobs"}
        jobs = tuple(CiJob.from_dict(j) for j in data.get("failed_jobs") or [] if isinstance(j, dict))
        return cls(**values, failed_jobs=jobs)  # type: ignore[arg-type]


_MERGE_REF = re.compile(r"refs/merge-requests/([1-9][0-9]{0,9})/merge")


def merge_ref_mr(ref: str | None) -> int | None:
    """The MR a GitLab merged-results pipeline ran for (`refs/merge-requests/N/merge`), else None.

    Such a pipeline tests a merge commit GitLab made of the MR's head and its target, which is on no
    branch: its result is about the MR's head only when that commit's second parent is the head."""
    found = _MERGE_REF.fullmatch(ref or "")
    return int(found.group(1)) if found else None


STALE_CI = "stale: the branch moved on"  # a CI result on a commit that is no longer the MR's head


def about_head(tested: str | None, head: str | None) -> bool:
    """Whether a CI result on commit `tested` is about the MR's head `head` (unknown heads never match).

    A result on an older head is stale: the branch moved on, so its failures may be fixed already."""
    return bool(tested) and bool(head) and tested == head


@runtime_checkable
class MergeCommits(Protocol):
    """A forge whose CI may test an MR merged into its target (GitLab's merged results pipelines)."""

    def merge_source(self, project: str, sha: str) -> str | None:
        """The source side (second parent) of merge commit `sha`; None when `sha` is not a two-parent merge."""
        ...


_COMMAND_RE = re.compile(r"^\s*/frogfix(?![\w-])[ \t]*(?P<rest>.*)", re.S | re.I)


def command_text(body: str) -> str | None:
    """What follows `/frogfix` when the comment starts with it (may be empty); None when it does not."""
    found = _COMMAND_RE.match(body or "")
    return found.group("rest").strip() if found else None


def is_stop(body: str) -> bool:
    """`/frogfix stop` (or `/frogfix cancel`): cancel the running round and drop the waiting requests."""
    words = (command_text(body) or "").split(None, 1)
    return bool(words) and words[0].lower() in STOP_WORDS


def is_update(body: str) -> bool:
    """`/frogfix rebase` (or a bare `/frogfix update`): merge the target branch into FrogFix's MR in an update round.

    FrogFix never rebases (that would rewrite the branch's commits): "rebase" is the word people
    use, and it asks for the same thing, the MR brought up to date with a merge commit."""
    words = [w for w in (w.lower().strip(".!:,") for w in (command_text(body) or "").split()) if w != "please"]
    if not words or words[0] not in UPDATE_WORDS:
        return False
    # `/frogfix rebase ...` is always this; `/frogfix update the docstring` is a review request, so an
    # update asks for it only alone, or as "update the branch" / "update from main".
    return words[0] == "rebase" or len(words) == 1 or words[1:] in (["branch"], ["the", "branch"]) or words[1] == "from"


CommentIntent = Literal["stop", "update", "review"]


def comment_intent(body: str) -> CommentIntent:
    """What a comment on FrogFix's MR asks for: a stop, an update round, or (maybe) a review round."""
    if is_stop(body):
        return "stop"
    return "update" if is_update(body) else "review"


def mentions(body: str, username: str) -> bool:
    """Whether `body` mentions `@username` as a whole word (case-insensitive, as both forges match)."""
    if not username:
        return False
    return re.search(rf"(?<![\w@.-])@{re.escape(username)}(?![\w-])", body or "", re.I) is not None


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
_SECTION = re.compile(r"section_(?:start|end):\d+:[A-Za-z0-9_.-]+(?:\[[^\]]*\])?\r?")


def log_tail(text: str, lines: int = 80, chars: int = 8_000) -> str:
    """The last `lines` lines of a CI log, without ANSI colours or GitLab's section markers, bounded."""
    clean = _SECTION.sub("", _ANSI.sub("", text.replace("\r\n", "\n")))
    kept = [line.rsplit("\r", 1)[-1] for line in clean.split("\n")]  # a \r-rewritten line shows its last state
    while kept and not kept[-1].strip():
        kept.pop()
    tail = "\n".join(kept[-lines:])
    return tail[-chars:]
