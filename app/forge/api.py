"""The API side of the Forge seam: what the worker asks of GitLab or Gitea once a job runs.

Webhook parsing (webhook.py, gitlab_webhook.py, gitea_webhook.py) is pure and needs no network;
this module is the part that talks to the forge: re-read an issue, find who added the trigger label, check
that person may trigger, open or update the one draft MR for a job, comment on the issue.
Two implementations: gitlab_api.GitLabForge (python-gitlab) and gitea_api.GiteaForge (httpx).

Rules that hold for every implementation:
- every text posted (titles, descriptions, comments) goes through `OutboundText`: our own
  token is always scrubbed, the caller's `redact` runs, and the result is size-bounded;
- every exception is a ForgeError whose message is safe to show (scrubbed the same way);
- transient failures (429, 5xx, timeouts, dropped connections) are retried inside a bounded
  budget (`forge_call` under app/retrying.py's RetryPolicy) and surface as ForgeTransient only
  when that budget is spent.
"""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from app.forge.reviews import CiJob, CiReport, IssueComment, ThreadNote
from app.redaction import SecretRedactor
from app.retrying import GaveUp, RetryPolicy

T = TypeVar("T")

Redactor = Callable[[str], str]

DEFAULT_TEXT_LIMIT = 250_000  # far below GitLab's ~1,000,000 and Gitea's database limits
TITLE_LIMIT = 250  # GitLab caps MR titles at 255 characters
ERROR_DETAIL_LIMIT = 300  # how much of a forge's own error message we quote

GITLAB_DRAFT_PREFIX = "Draft: "
GITEA_DRAFT_PREFIX = "WIP: "
# Prefixes either forge may already have put on a title we re-send, so an update never doubles them.
_KNOWN_DRAFT_PREFIX = re.compile(r"^\s*(?:(?:draft|wip)\s*:|\[(?:draft|wip)\]|\((?:draft|wip)\)|draft\s+-)\s*", re.I)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------


class ForgeError(Exception):
    """A forge call failed for good. `str(exc)` is safe to show: it never holds a token.

    The typed facts say the same for the job's ending (app/endings.py), so nothing parses the message:
    `forge` ("GitLab", "Gitea"), `call` (what FrogFix asked: "read issue #1 of acme/calc"), `status` (HTTP),
    `said` (the forge's words, or the failure's), `gave_up` (the retries' tail), `unreachable` (no answer),
    `redirected`, `setup` (FrogFix's own forge settings are missing)."""

    def __init__(
        self, message: str, *, status: int | None = None, forge: str = "", call: str = "", said: str = "",
        gave_up: str = "", unreachable: bool = False, redirected: bool = False, setup: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.forge, self.call, self.said, self.gave_up = forge, call, said, gave_up
        self.unreachable, self.redirected, self.setup = unreachable, redirected, setup

    def facts(self) -> dict[str, Any]:
        """The typed facts, to carry onto another ForgeError (a retry's last one)."""
        return {
            "forge": self.forge, "call": self.call, "said": self.said, "gave_up": self.gave_up,
            "unreachable": self.unreachable, "redirected": self.redirected, "setup": self.setup,
        }


class ForgeTransient(ForgeError):
    """Worth trying again later (429, 5xx, timeout); `retry_after` is the forge's hint in seconds."""

    def __init__(self, message: str, *, retry_after: float | None = None, **facts: Any) -> None:
        super().__init__(message, **facts)
        self.retry_after = retry_after


class ForgeNotFound(ForgeError):
    """The project, issue, user or MR does not exist, or the token may not see it."""


class ForgeAuthError(ForgeError):
    """The token was refused (401) or lacks a right it needs (403): an operator must act."""


class ForgeConflict(ForgeError):
    """The forge refused because the thing already exists (e.g. an open MR for that branch)."""


def error_for_status(
    status: int | None, message: str, *, retry_after: float | None = None, **facts: Any
) -> ForgeError:
    """Map an HTTP status to the error class the caller acts on (retry, reject, alert); `facts` as ForgeError's."""
    if status == 401:
        return ForgeAuthError(f"{message} (the forge token was rejected)", status=status, **facts)
    if status == 403:
        return ForgeAuthError(f"{message} (the forge token lacks permission)", status=status, **facts)
    if status == 404:
        return ForgeNotFound(message, status=status, **facts)
    if status == 409:
        return ForgeConflict(message, status=status, **facts)
    if status in (408, 425, 429) or (status is not None and status >= 500):
        return ForgeTransient(message, status=status, retry_after=retry_after, **facts)
    return ForgeError(message, status=status, **facts)


def forge_call(retry: RetryPolicy, what: str, fn: Callable[[], T]) -> T:
    """One logical forge call under `retry`: ForgeTransient is tried again, anything else is final."""
    return retry.call(what, fn, transient=lambda exc: isinstance(exc, ForgeTransient), gave_up=_forge_gave_up)


def _forge_gave_up(ending: GaveUp) -> ForgeTransient:
    """The last ForgeTransient again, with the tail app/outcome_words.py reads ("gave up after ...");
    its `retry_after` is the forge's hint, else the wait the next try would have needed."""
    last = ending.error
    assert isinstance(last, ForgeTransient)
    tries = f"{ending.attempts} attempt{'s' if ending.attempts != 1 else ''}"
    gave_up = f"gave up after {tries} in {ending.elapsed_s:.1f}s"
    return ForgeTransient(
        f"{last.message} ({gave_up})",
        status=last.status,
        retry_after=last.retry_after if last.retry_after is not None else ending.wait_s,
        **{**last.facts(), "gave_up": gave_up},
    )


# ---------------------------------------------------------------------------------------------
# What the forge answers, normalised
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Issue:
    """An issue as the forge has it now (not as a possibly stale webhook said)."""

    project: str
    number: int
    title: str
    body: str
    state: Literal["open", "closed"]
    labels: tuple[str, ...]
    web_url: str
    author: str | None
    # GitLab's confidential flag (Gitea has no such thing): an issue can be made confidential after
    # its webhook, so the worker asks again at admission and before publishing.
    confidential: bool = False


@dataclass(frozen=True)
class ProjectInfo:
    """Where to clone from and which branch a fix targets."""

    path: str  # GitLab path_with_namespace, Gitea owner/name
    id: str
    default_branch: str
    clone_url: str  # plain HTTP(S) URL, never with credentials in it
    web_url: str


# What a human did with an MR, as `Forge.mr_verdict` reads it now: `merged`; `closed` (closed without
# merging); `open` (still undecided, GitLab's `opened` or `locked`).
MrVerdict = Literal["merged", "closed", "open"]


@dataclass(frozen=True)
class MergeRequest:
    """A GitLab merge request or Gitea pull request; `number` is its iid / index in the project."""

    id: int
    number: int
    web_url: str
    draft: bool
    source_branch: str
    target_branch: str
    title: str
    description: str
    state: str
    # Filled by `get_mr` (and where the listing gives them): the source branch's head commit, who opened
    # it, and what a human did with it (`mr_verdict`'s words: open, closed, merged).
    head_sha: str | None = None
    author: str | None = None
    verdict: MrVerdict = "open"
    # What the forge says of merging it into its target (issue 25): True it conflicts, False it merges
    # cleanly, None not known (GitLab still checking, or the forge did not say); and the target branch's
    # head that verdict was made against (GitLab `diff_refs.start_sha`, Gitea/Forgejo `base.sha`).
    conflicts: bool | None = None
    target_sha: str | None = None


# The MR's number at the end of the web URL we stored for a job: GitLab `/-/merge_requests/N`,
# Gitea and Forgejo `/pulls/N`.
_MR_URL_NUMBER = re.compile(r"/(?:-/)?(?:merge_requests|pulls)/([1-9][0-9]{0,9})/?$")


_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def full_sha(value: Any) -> str | None:
    """A whole commit id (SHA-1, or SHA-256 for such repositories) in lower case, or None for anything else."""
    text = value.lower() if isinstance(value, str) else ""
    return text if _FULL_SHA.fullmatch(text) else None


def mr_number_from_url(url: str | None) -> int | None:
    """The MR's number in a job's stored `mr_url` (the forge's own web_url), or None when it has none."""
    found = _MR_URL_NUMBER.search(url or "")
    return int(found.group(1)) if found else None


# ---------------------------------------------------------------------------------------------
# The protocol
# ---------------------------------------------------------------------------------------------


@runtime_checkable
class Forge(Protocol):
    """One forge's API, as the pipeline uses it. Projects are `group/sub/name` paths (or ids)."""

    @property
    def kind(self) -> Literal["gitlab", "gitea"]: ...

    def get_issue(self, project: str, number: int) -> Issue: ...

    def label_adder(self, project: str, number: int, label: str) -> str | None: ...

    def can_trigger(self, project: str, username: str) -> bool: ...

    def project_info(self, project: str) -> ProjectInfo: ...

    def find_open_mr(self, project: str, source_branch: str) -> MergeRequest | None: ...

    def create_draft_mr(
        self, project: str, source_branch: str, target_branch: str, title: str, description: str
    ) -> MergeRequest: ...

    def update_mr(self, project: str, mr: MergeRequest, title: str, description: str) -> MergeRequest:
        """New title and description; the MR stays a draft or stays ready as `mr.draft` says (a human's choice)."""
        ...

    def comment(self, project: str, number: int, body: str) -> None: ...

    def mr_verdict(self, project: str, number: int) -> MrVerdict:
        """Whether a human merged MR `number`, closed it unmerged, or has not decided (read now, never cached)."""
        ...

    # -- review rounds (issue 14) ----------------------------------------------------------------

    def bot_username(self) -> str:
        """The account FrogFix acts as (its token's user), read once per client: its comments start no round."""
        ...

    def get_mr(self, project: str, number: int) -> MergeRequest:
        """MR `number` as the forge has it now, with `head_sha`, `author` and `verdict` filled."""
        ...

    def review_thread(self, project: str, number: int) -> list[ThreadNote]:
        """Every human note on the MR, oldest first: comments, line comments with path and line, and
        whether each thread is resolved (GitLab discussions; Gitea comments, reviews and review comments)."""
        ...

    def reply(self, project: str, number: int, body: str, discussion_id: str | None = None) -> None:
        """Post `body` on MR `number`: in thread `discussion_id` where the forge has threads (GitLab), else
        as a comment on the MR. Never resolves anything. Same retry rule as `comment` (no double post)."""
        ...

    def ci_failures(self, project: str, report: CiReport, tail_lines: int) -> list[CiJob]:
        """The failing jobs of the CI result `report`, each with the last `tail_lines` lines of its log
        (GitLab: the pipeline's failed jobs and their traces; Gitea/Forgejo: the failing commit statuses
        of the commit, with their description and link, which is all a status has)."""
        ...

    # -- abstain and ask (issue 24) ----------------------------------------------------------------

    def issue_comments(self, project: str, number: int) -> list[IssueComment]:
        """The issue's comments, oldest first, system notes left out (FrogFix's own included: the caller
        tells them by `bot_username`): at most ISSUE_COMMENT_LIMIT, the newest, each body scrubbed of our
        token and cut to ISSUE_COMMENT_BODY_LIMIT (`bounded_comments`)."""
        ...

    def git_auth_header(self) -> str: ...

    def close(self) -> None: ...


def comment_marker() -> str:
    """A hidden, unique first line for one comment: a retry after a lost answer can find what was posted."""
    return f"<!-- frogfix:{secrets.token_hex(8)} -->\n"


def post_once(post: Callable[[], None], already_posted: Callable[[], bool]) -> Callable[[], None]:
    """One try of a comment POST for `forge_call`: every try after the first looks before it posts,
    because the try before may have posted and only lost its answer."""
    tries = 0

    def attempt() -> None:
        nonlocal tries
        tries += 1
        if tries > 1 and already_posted():
            return
        post()

    return attempt


# ---------------------------------------------------------------------------------------------
# Review rounds: bounds on what the forge's thread and CI give us (all of it untrusted)
# ---------------------------------------------------------------------------------------------

THREAD_NOTE_LIMIT = 200  # notes of a review thread handed on; the newest are kept
THREAD_BODY_LIMIT = 4_000  # characters of one note's body
THREAD_READ_LIMIT = 2_000  # notes read at most from the forge before bounding (a bound on the work)
CI_JOB_LIMIT = 5  # failing jobs (or statuses) fetched and handed on per CI result
CI_TRACE_BYTES = 512_000  # the end of a job log read at most, before its tail is cut
_SHA = re.compile(r"[0-9a-fA-F]{7,64}")


def bounded_thread(notes: Iterable[ThreadNote], scrub: Redactor) -> list[ThreadNote]:
    """Oldest first, at most THREAD_NOTE_LIMIT (the newest), each body scrubbed and cut: the thread reaches the
    model and the trajectory, so our own token must not ride along, and one huge comment must not crowd the rest."""
    ordered = sorted(notes, key=lambda n: (n.created_at or "", int(n.id) if n.id.isdigit() else 0))
    return [
        replace(note, body=bound_text(scrub(note.body), THREAD_BODY_LIMIT)) for note in ordered[-THREAD_NOTE_LIMIT:]
    ]


# An issue's comments (the reporter's answer to FrogFix's question): bounds on what is read and handed on.
ISSUE_COMMENT_LIMIT = 200  # the newest comments kept
ISSUE_COMMENT_BODY_LIMIT = 20_000  # characters of one comment's body
ISSUE_COMMENT_READ_LIMIT = 1_000  # comments read at most from the forge (a bound on the work)


def bounded_comments(comments: Iterable[IssueComment], scrub: Redactor) -> list[IssueComment]:
    """Oldest first (by time, then id), at most ISSUE_COMMENT_LIMIT (the newest), each body scrubbed and cut."""
    ordered = sorted(
        comments, key=lambda c: (c.created_at.timestamp() if c.created_at else 0.0, int(c.id) if c.id.isdigit() else 0)
    )
    return [
        replace(comment, body=bound_text(scrub(comment.body), ISSUE_COMMENT_BODY_LIMIT))
        for comment in ordered[-ISSUE_COMMENT_LIMIT:]
    ]


def checked_sha(sha: str) -> str:
    """A commit id from a webhook, before it goes into a URL path: hex only."""
    if not _SHA.fullmatch(sha or ""):
        raise ForgeError(f"not a commit id: {sha[:80]!r}")
    return sha.lower()


def draft_prefix(mr: MergeRequest, prefix: str) -> str:
    """The title prefix an update sends: the forge's draft prefix while the MR is a draft, none once a human
    marked it ready (an update must never turn a ready MR back into a draft)."""
    return prefix if mr.draft else ""


def upsert_draft_mr(
    forge: Forge, project: str, source_branch: str, target_branch: str, title: str, description: str
) -> tuple[MergeRequest, bool]:
    """Update the open MR for `source_branch`, or open a draft one; `(mr, created)`.

    A redelivered job or a race with another worker must never open a second MR: when the
    forge says one already exists (409), the existing one is found and updated instead.
    """
    existing = forge.find_open_mr(project, source_branch)
    if existing is not None:
        return forge.update_mr(project, existing, title, description), False
    try:
        return forge.create_draft_mr(project, source_branch, target_branch, title, description), True
    except ForgeConflict:
        existing = forge.find_open_mr(project, source_branch)
        if existing is None:
            raise
        return forge.update_mr(project, existing, title, description), False


# ---------------------------------------------------------------------------------------------
# Forge CI on the bot's branch
# ---------------------------------------------------------------------------------------------

# A patch may add or change CI configuration, and a pipeline on the bot's branch would run it with
# the project's CI variables before anyone reviewed it; so by default FrogFix asks each forge not
# to run CI for its push (FROGFIX_ALLOW_FORGE_CI turns this off).
# - GitLab: the push option `ci.skip` skips the branch pipeline (docs: "Push options for GitLab
#   CI/CD"), but not the merge request pipeline that opening or updating the MR starts
#   (gitlab-org/gitlab#27955); a commit message holding `[skip ci]` or `[ci skip]` skips both.
# - Gitea and Forgejo Actions: no push option; a push or pull request run is skipped when the head
#   commit's message (or the PR title) holds one of [actions] SKIP_WORKFLOW_STRINGS, by default
#   "[skip ci]", "[ci skip]", "[no ci]", "[skip actions]", "[actions skip]" (modules/setting/actions.go,
#   services/actions/notifier_helper.go). Woodpecker and Drone honour "[skip ci]" too.
SKIP_CI_MARKER = "[skip ci]"


def skip_ci_push_options(kind: str) -> tuple[str, ...]:
    """The push options that ask forge `kind` not to run CI for a push (only GitLab has one)."""
    return ("ci.skip",) if kind == "gitlab" else ()


# ---------------------------------------------------------------------------------------------
# Outbound text: redaction and size bounds
# ---------------------------------------------------------------------------------------------


def bound_text(text: str, limit: int) -> str:
    """`text` cut to at most `limit` characters, with a note saying how much was dropped."""
    if len(text) <= limit:
        return text

    def note(dropped: int) -> str:
        return f"\n\n[... trimmed by FrogFix: {dropped:,} characters not shown ...]"

    keep = max(0, limit - len(note(len(text))))
    return (text[:keep] + note(len(text) - keep))[:limit]


def strip_draft_prefix(title: str) -> str:
    """The title without any Draft:/WIP:/[Draft]/[WIP]/(Draft) prefix, so ours is never doubled."""
    previous = None
    while previous != title:
        previous, title = title, _KNOWN_DRAFT_PREFIX.sub("", title, count=1)
    return title.strip()


class OutboundText:
    """Scrubs and bounds everything a client sends or says: our token never leaves in a post or error."""

    def __init__(
        self,
        secrets: Iterable[str],
        redact: Redactor | None = None,
        limit: int = DEFAULT_TEXT_LIMIT,
        title_limit: int = TITLE_LIMIT,
    ) -> None:
        self._secrets = SecretRedactor(secrets)
        self._redact = redact
        self.limit = limit
        self.title_limit = title_limit

    def scrub(self, text: str) -> str:
        """Remove our own secrets (and their Basic-auth encodings), then apply the caller's redactor."""
        text = self._secrets.redact(text)
        if self._redact is not None:
            text = self._redact(text)
        return text

    def body(self, text: str) -> str:
        return bound_text(self.scrub(text), self.limit)

    def title(self, prefix: str, text: str) -> str:
        """One line, our draft prefix exactly once, short enough for every forge."""
        clean = " ".join(self.scrub(strip_draft_prefix(text)).split()) or "FrogFix"
        room = self.title_limit - len(prefix)
        if len(clean) > room:
            clean = clean[: room - 3] + "..."
        return prefix + clean

    def error(self, text: str) -> str:
        """A forge's error text, scrubbed and short enough for a log line or the dashboard."""
        text = self.scrub(text).replace("\r", " ").replace("\n", " ").strip()
        return text if len(text) <= ERROR_DETAIL_LIMIT else text[: ERROR_DETAIL_LIMIT - 3] + "..."


def basic_auth_header(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode("ascii")


def secret_forms(token: str) -> list[str]:
    """The token and the Basic-auth encodings we build from it: all must be scrubbed."""
    if not token:
        return []
    return [
        token,
        basic_auth_header("oauth2", token).split(" ", 1)[1],
        basic_auth_header(token, "x-oauth-basic").split(" ", 1)[1],
    ]


# ---------------------------------------------------------------------------------------------
# Git over HTTP: how the token reaches git without touching any config file
# ---------------------------------------------------------------------------------------------


def git_auth_env(
    header_value: str, url: str | None = None, base_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Environment that makes one git command send `Authorization: <header_value>`.

    It uses git's GIT_CONFIG_COUNT/KEY/VALUE variables (git >= 2.31), so the token is in no
    config file and not on the command line (where `ps` would show it). With `url`, the header
    is scoped to that URL prefix (`http.<url>.extraHeader`), so a submodule or a redirect to
    another host never receives it. Entries already in `base_env` are kept and appended to.
    """
    env = dict(base_env) if base_env is not None else {}
    try:
        count = int(env.get("GIT_CONFIG_COUNT", "0") or "0")
    except ValueError:
        count = 0
    key = f"http.{url}.extraHeader" if url else "http.extraHeader"
    env[f"GIT_CONFIG_KEY_{count}"] = key
    env[f"GIT_CONFIG_VALUE_{count}"] = f"Authorization: {header_value}"
    env["GIT_CONFIG_COUNT"] = str(count + 1)
    env["GIT_TERMINAL_PROMPT"] = "0"  # never block on a password prompt
    return env
