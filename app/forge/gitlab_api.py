"""GitLab through python-gitlab: the Forge protocol for the worker.

python-gitlab's own retrying is off (`retry_transient_errors=False` on the client and
`obey_rate_limit=False` on every call: its 429 loop would sleep up to ten times with no time
bound), so our RetryPolicy (app/retrying.py, through `forge_call`) decides. python-gitlab's
exceptions do not carry response headers, so a session response hook remembers the last
Retry-After seen on this thread.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

import gitlab
import gitlab.exceptions
import requests

from app.forge.api import (
    CI_JOB_LIMIT,
    CI_TRACE_BYTES,
    DEFAULT_TEXT_LIMIT,
    GITLAB_DRAFT_PREFIX,
    ISSUE_COMMENT_READ_LIMIT,
    THREAD_READ_LIMIT,
    ForgeError,
    ForgeNotFound,
    ForgeTransient,
    Issue,
    MergeRequest,
    MrVerdict,
    OutboundText,
    ProjectInfo,
    Redactor,
    basic_auth_header,
    bounded_comments,
    bounded_thread,
    checked_sha,
    comment_marker,
    draft_prefix,
    error_for_status,
    forge_call,
    full_sha,
    post_once,
    secret_forms,
)
from app.forge.reviews import CiJob, CiReport, IssueComment, ThreadNote, forge_time, log_tail
from app.retrying import RetryPolicy

T = TypeVar("T")

_DISCUSSION_ID = re.compile(r"[0-9a-fA-F]{8,64}")  # GitLab's discussion ids are SHA-1 hex
DEVELOPER = 30  # GitLab access levels: 10 guest, 20 reporter, 30 developer, 40 maintainer, 50 owner
# Passed to every python-gitlab call so that only our RetryPolicy retries.
_ONCE: dict[str, Any] = {"obey_rate_limit": False, "retry_transient_errors": False}


# GitLab's merge status while it is still (re)computing whether the MR merges: `merge_status` is the
# MergeRequest state machine (preparing, unchecked, checking, cannot_be_merged_recheck,
# cannot_be_merged_rechecking; done: can_be_merged, cannot_be_merged), `detailed_merge_status` the
# 15.6+ field (DetailedMergeStatusService answers preparing, checking or unchecked before any check).
_MERGE_STATUS_PENDING = frozenset(
    {"preparing", "unchecked", "checking", "cannot_be_merged_recheck", "cannot_be_merged_rechecking"}
)
_DETAILED_STATUS_PENDING = frozenset({"preparing", "checking", "unchecked"})
def gitlab_conflicts(data: dict[str, Any]) -> bool | None:
    """Whether an MR, as GitLab's merge request API answers it, conflicts with its target branch.

    The field names are GitLab's merge requests API (doc/api/merge_requests.md; in the shared fixtures
    gitlab/go-gitlab/api_responses/get_merge_request.json and gitlab/go-gitlab/note_merge_request.json):
    `state`, `has_conflicts` (bool), `merge_status` (deprecated since 15.6; can_be_merged means "no
    conflicts between the source and target branches", cannot_be_merged "conflicts", the rest are the
    pending states above) and `detailed_merge_status` (mergeable, conflict, draft_status, need_rebase,
    not_open, ci_must_pass, ... or checking/unchecked/preparing).

    GitLab checks mergeability asynchronously: while either status says it is (re)checking, the answer
    is None (`has_conflicts` then still holds the previous verdict), and so it is for an MR no longer
    open. Otherwise `detailed_merge_status` conflict or `has_conflicts` true mean it conflicts and
    `has_conflicts` false that it merges cleanly. A draft MR is `draft_status` whatever its conflicts
    (GitLab runs the draft check before the conflict check), so for FrogFix's draft MRs `has_conflicts`
    is what tells. An old GitLab that sends no `has_conflicts` (11.3, for one) still says it in
    `merge_status`; with none of these the answer is None.
    """
    detailed, status = data.get("detailed_merge_status"), data.get("merge_status")
    if data.get("state") in ("closed", "merged") or detailed == "not_open":
        return None  # GitLab stops checking an MR that is no longer open: what it last said is moot
    if detailed in _DETAILED_STATUS_PENDING or status in _MERGE_STATUS_PENDING:
        return None
    has_conflicts = data.get("has_conflicts")
    if detailed == "conflict" or has_conflicts is True:
        return True
    if has_conflicts is False:
        return False
    if has_conflicts is None and status in ("can_be_merged", "cannot_be_merged"):
        return status == "cannot_be_merged"
    return None


class GitLabForge:
    """The Forge protocol over GitLab's REST API v4 (python-gitlab)."""

    kind: Literal["gitlab"] = "gitlab"

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        redact: Redactor | None = None,
        text_limit: int = DEFAULT_TEXT_LIMIT,
        min_access_level: int = DEVELOPER,
        ssl_verify: bool | str = True,
    ) -> None:
        if not url:
            raise ForgeError("no GitLab URL is configured (set FROGFIX_GITLAB_URL)", forge="GitLab", setup=True)
        if not token:
            raise ForgeError("no GitLab token is configured (set FROGFIX_GITLAB_TOKEN)", forge="GitLab", setup=True)
        self._token = token
        self._text = OutboundText(secret_forms(token), redact, text_limit)
        self._retry = retry or RetryPolicy()
        self._min_access = min_access_level
        self._seen = threading.local()
        self._bot: str | None = None
        self._gl = gitlab.Gitlab(
            url, private_token=token, timeout=timeout, retry_transient_errors=False, ssl_verify=ssl_verify
        )
        self._gl.session.hooks["response"].append(self._remember_retry_after)

    # -- plumbing --------------------------------------------------------------------------

    def _remember_retry_after(self, response: requests.Response, *args: Any, **kwargs: Any) -> None:
        self._seen.retry_after = response.headers.get("Retry-After")

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """One logical call: translated errors, bounded retries."""

        def attempt() -> T:
            self._seen.retry_after = None
            try:
                return fn()
            except gitlab.exceptions.GitlabError as exc:
                error = self._translate(what, exc)
            except (
                requests.exceptions.ConnectionError,
                requests.exceptions.Timeout,
                requests.exceptions.ChunkedEncodingError,
            ) as exc:
                error = ForgeTransient(f"GitLab {what}: {type(exc).__name__} talking to the server", forge="GitLab",
                                       call=what, said=type(exc).__name__, unreachable=True)
            except requests.exceptions.RequestException as exc:
                said = f"{type(exc).__name__}: {self._text.error(str(exc))}"
                error = ForgeError(f"GitLab {what}: {said}", forge="GitLab", call=what, said=said)
            # Raised outside the except blocks so the library's exception (and the response it
            # holds) is not chained to ours: only the scrubbed message travels on.
            raise error

        return forge_call(self._retry, what, attempt)

    def _translate(self, what: str, exc: gitlab.exceptions.GitlabError) -> ForgeError:
        status = exc.response_code
        detail = self._text.error(str(exc.error_message or ""))
        if isinstance(exc, gitlab.exceptions.RedirectError):
            said = f"the server redirected ({detail}); check FROGFIX_GITLAB_URL"
            return ForgeError(f"GitLab {what}: {said}", forge="GitLab", call=what, said=said, redirected=True)
        if status is None:
            said = f"{type(exc).__name__}: {detail}"
            return ForgeError(f"GitLab {what}: {said}", forge="GitLab", call=what, said=said)
        retry_after = self._retry.retry_after(getattr(self._seen, "retry_after", None))
        return error_for_status(status, f"GitLab {what}: HTTP {status} {detail}".rstrip(), retry_after=retry_after,
                                forge="GitLab", call=what, said=detail.removeprefix(str(status)).strip())

    def _project(self, project: str) -> Any:
        """A lazy project handle (no request): python-gitlab URL-encodes a path_with_namespace."""
        return self._gl.projects.get(project, lazy=True)

    # -- the protocol ----------------------------------------------------------------------

    def get_issue(self, project: str, number: int) -> Issue:
        data = self._call(
            f"read issue #{number} of {project}",
            lambda: self._project(project).issues.get(number, **_ONCE).attributes,
        )
        state: Literal["open", "closed"] = "closed" if data.get("state") == "closed" else "open"
        labels = tuple((label["name"] if isinstance(label, dict) else str(label)) for label in data.get("labels") or ())
        author = data.get("author") or {}
        return Issue(
            project=project,
            number=int(data.get("iid", number)),
            title=str(data.get("title") or ""),
            body=str(data.get("description") or ""),
            state=state,
            labels=labels,
            web_url=str(data.get("web_url") or ""),
            author=author.get("username"),
            confidential=data.get("confidential") is True,
        )

    def label_adder(self, project: str, number: int, label: str) -> str | None:
        """Who most recently added `label`, from the issue's resource label events."""

        def events() -> list[dict[str, Any]]:
            issue = self._project(project).issues.get(number, lazy=True)
            return [e.attributes for e in issue.resourcelabelevents.list(get_all=True, **_ONCE)]

        found = self._call(f"read label events of #{number} in {project}", events)
        added = [
            e
            for e in found
            if e.get("action") == "add" and isinstance(e.get("label"), dict) and e["label"].get("name") == label
        ]
        if not added:
            return None
        latest = max(added, key=lambda e: (str(e.get("created_at") or ""), int(e.get("id") or 0)))
        user = latest.get("user") or {}
        return user.get("username")

    def can_trigger(self, project: str, username: str) -> bool:
        """True when `username` has at least developer access (direct or inherited) and is active."""
        users = self._call(
            f"look up user {username}",
            lambda: [u.attributes for u in self._gl.users.list(username=username, get_all=False, **_ONCE)],
        )
        match = [u for u in users if str(u.get("username", "")).lower() == username.lower()]
        if not match:
            return False
        user_id = match[0]["id"]
        try:
            member = self._call(
                f"read access of {username} to {project}",
                lambda: self._project(project).members_all.get(user_id, **_ONCE).attributes,
            )
        except ForgeNotFound:
            return False
        state = member.get("state", "active")
        return int(member.get("access_level") or 0) >= self._min_access and state == "active"

    def project_info(self, project: str) -> ProjectInfo:
        data = self._call(f"read project {project}", lambda: self._gl.projects.get(project, **_ONCE).attributes)
        branch = data.get("default_branch")
        if not branch:
            raise ForgeError(f"GitLab project {project} has no default branch (is the repository empty?)")
        return ProjectInfo(
            path=str(data.get("path_with_namespace") or project),
            id=str(data.get("id")),
            default_branch=str(branch),
            clone_url=str(data.get("http_url_to_repo") or ""),
            web_url=str(data.get("web_url") or ""),
        )

    def _open_mrs_from(self, project: str, source_branch: str) -> list[dict[str, Any]]:
        """Open MRs from `source_branch` of this same project (not from a fork's branch of that name), oldest first."""
        mrs = self._project(project).mergerequests.list(
            state="opened", source_branch=source_branch, get_all=True, **_ONCE
        )
        ours = [
            m.attributes
            for m in mrs
            if m.attributes.get("source_branch") == source_branch
            and m.attributes.get("state") == "opened"
            and m.attributes.get("source_project_id") == m.attributes.get("target_project_id")
        ]
        return sorted(ours, key=lambda m: int(m.get("iid") or 0))

    def find_open_mr(self, project: str, source_branch: str) -> MergeRequest | None:
        found = self._call(
            f"list open merge requests of {project}", lambda: self._open_mrs_from(project, source_branch)
        )
        return self._mr(found[0]) if found else None

    def create_draft_mr(
        self, project: str, source_branch: str, target_branch: str, title: str, description: str
    ) -> MergeRequest:
        payload = {
            "source_branch": source_branch,
            "target_branch": target_branch,
            "title": self._text.title(GITLAB_DRAFT_PREFIX, title),
            "description": self._text.body(description),
        }
        tried = False

        def attempt() -> dict[str, Any]:
            nonlocal tried
            if tried:
                # The last POST may have succeeded before the connection failed: never open a second MR.
                existing = self._open_mrs_from(project, source_branch)
                if existing:
                    return existing[0]
            tried = True
            return dict(self._project(project).mergerequests.create(payload, **_ONCE).attributes)

        data = self._call(f"open a draft merge request from {source_branch} in {project}", attempt)
        mr = self._mr(data)
        if not mr.draft:
            raise ForgeError(
                f"GitLab opened !{mr.number} in {project} but did not mark it as a draft; "
                "FrogFix only opens drafts, please check it"
            )
        return mr

    def update_mr(self, project: str, mr: MergeRequest, title: str, description: str) -> MergeRequest:
        # No `draft` key: the title's prefix alone keeps a draft a draft and a ready MR ready.
        payload = {
            "title": self._text.title(draft_prefix(mr, GITLAB_DRAFT_PREFIX), title),
            "description": self._text.body(description),
        }
        data = self._call(
            f"update !{mr.number} in {project}",
            lambda: self._project(project).mergerequests.update(mr.number, payload, **_ONCE),
        )
        return self._mr(data)

    def comment(self, project: str, number: int, body: str) -> None:
        """Post a note once: a try after a failed one first looks for the note among the newest."""
        marker = comment_marker()
        payload = {"body": self._text.body(marker + body)}
        notes = self._project(project).issues.get(number, lazy=True).notes

        def posted() -> bool:
            newest = notes.list(order_by="created_at", sort="desc", per_page=50, get_all=False, **_ONCE)
            return any(marker in str(n.attributes.get("body") or "") for n in newest)

        self._call(f"comment on #{number} in {project}", post_once(lambda: notes.create(payload, **_ONCE), posted))

    def issue_comments(self, project: str, number: int) -> list[IssueComment]:
        """The issue's notes (newest first from the API, up to ISSUE_COMMENT_READ_LIMIT), system notes left
        out; internal notes (GitLab's confidential comments) are marked `internal`."""

        def read() -> list[dict[str, Any]]:
            notes = self._project(project).issues.get(number, lazy=True).notes
            found: list[dict[str, Any]] = []
            for note in notes.list(iterator=True, order_by="created_at", sort="desc", per_page=100, **_ONCE):
                found.append(note.attributes)
                if len(found) >= ISSUE_COMMENT_READ_LIMIT:
                    break
            return found

        notes = self._call(f"read the comments of #{number} in {project}", read)
        comments = []
        for note in notes:
            if not isinstance(note, dict) or note.get("system"):
                continue
            author = note.get("author")
            comments.append(
                IssueComment(
                    id=str(note.get("id") or ""),
                    author=author.get("username") if isinstance(author, dict) else None,
                    body=str(note.get("body") or ""),
                    created_at=forge_time(note.get("created_at")),
                    internal=note.get("internal") is True or note.get("confidential") is True,
                )
            )
        return bounded_comments(comments, self._text.scrub)

    def mr_verdict(self, project: str, number: int) -> MrVerdict:
        """GitLab's MR `state`: `merged`, `closed` (unmerged), else open (`opened`, `locked`)."""
        data = self._call(
            f"read !{number} of {project}",
            lambda: self._project(project).mergerequests.get(int(number), **_ONCE).attributes,
        )
        state = data.get("state")
        return "merged" if state == "merged" else "closed" if state == "closed" else "open"

    # -- review rounds ---------------------------------------------------------------------

    def bot_username(self) -> str:
        """The token's own account (GET /user), read once per client."""
        if self._bot is None:
            data = self._call("read the token's own user", lambda: self._gl.http_get("/user", **_ONCE))
            name = data.get("username") if isinstance(data, dict) else None
            if not name:
                raise ForgeError("GitLab did not say which user the FrogFix token belongs to")
            self._bot = str(name)
        return self._bot

    def get_mr(self, project: str, number: int) -> MergeRequest:
        data = self._call(
            f"read !{number} of {project}",
            lambda: self._project(project).mergerequests.get(int(number), **_ONCE).attributes,
        )
        return self._mr(data)

    def review_thread(self, project: str, number: int) -> list[ThreadNote]:
        """The MR's discussions, every page (up to THREAD_READ_LIMIT notes), system notes left out."""

        def read() -> list[dict[str, Any]]:
            mr = self._project(project).mergerequests.get(int(number), lazy=True)
            found: list[dict[str, Any]] = []
            read_notes = 0
            for discussion in mr.discussions.list(iterator=True, per_page=100, **_ONCE):
                found.append(discussion.attributes)
                read_notes += len(discussion.attributes.get("notes") or ())
                if read_notes >= THREAD_READ_LIMIT:
                    break
            return found

        discussions = self._call(f"read the discussions of !{number} in {project}", read)
        return bounded_thread(self._thread_notes(discussions), self._text.scrub)

    @staticmethod
    def _thread_notes(discussions: Iterable[dict[str, Any]]) -> list[ThreadNote]:
        notes: list[ThreadNote] = []
        for discussion in discussions:
            for note in discussion.get("notes") or ():
                if not isinstance(note, dict) or note.get("system"):
                    continue
                position: dict[str, Any] = note["position"] if isinstance(note.get("position"), dict) else {}
                line = position.get("new_line") or position.get("old_line")
                author = note.get("author") or {}
                notes.append(
                    ThreadNote(
                        id=str(note.get("id") or ""),
                        author=author.get("username") if isinstance(author, dict) else None,
                        body=str(note.get("body") or ""),
                        created_at=note.get("created_at"),
                        discussion_id=str(discussion.get("id") or "") or None,
                        path=position.get("new_path") or position.get("old_path") or None,
                        line=int(line) if isinstance(line, int) else None,
                        resolved=bool(note.get("resolved")) if note.get("resolvable") else None,
                        kind="diff_note" if note.get("type") == "DiffNote" or position else "note",
                    )
                )
        return notes

    def reply(self, project: str, number: int, body: str, discussion_id: str | None = None) -> None:
        """A note in thread `discussion_id`, or a new MR note; posted once (see `comment`). Resolves nothing.

        The id came with a webhook: one that is not a GitLab discussion id, or a thread deleted since,
        gets the reply on the MR instead, so the reviewer still hears what the round did."""
        if discussion_id is not None and not _DISCUSSION_ID.fullmatch(discussion_id):
            discussion_id = None
        if discussion_id is not None:
            try:
                return self._reply(project, number, body, discussion_id)
            except ForgeNotFound:
                pass
        self._reply(project, number, body, None)

    def _reply(self, project: str, number: int, body: str, discussion_id: str | None) -> None:
        marker = comment_marker()
        payload = {"body": self._text.body(marker + body)}
        mr = self._project(project).mergerequests.get(int(number), lazy=True)

        def posted() -> bool:
            if discussion_id:
                found = mr.discussions.get(discussion_id, **_ONCE).attributes.get("notes") or ()
                return any(isinstance(n, dict) and marker in str(n.get("body") or "") for n in found)
            newest = mr.notes.list(order_by="created_at", sort="desc", per_page=50, get_all=False, **_ONCE)
            return any(marker in str(n.attributes.get("body") or "") for n in newest)

        def post() -> None:
            notes = mr.discussions.get(discussion_id, lazy=True).notes if discussion_id else mr.notes
            notes.create(payload, **_ONCE)

        self._call(f"reply on !{number} in {project}", post_once(post, posted))

    def ci_failures(self, project: str, report: CiReport, tail_lines: int) -> list[CiJob]:
        """The pipeline's failed jobs (allow_failure ones left out), at most CI_JOB_LIMIT, with their logs' tails."""
        if not str(report.id).isdigit():
            raise ForgeError(f"GitLab pipeline id {str(report.id)[:40]!r} is not a number")
        pipeline = self._project(project).pipelines.get(int(report.id), lazy=True)
        jobs = self._call(
            f"list the failed jobs of pipeline {report.id} in {project}",
            lambda: [j.attributes for j in pipeline.jobs.list(scope=["failed"], get_all=True, **_ONCE)],
        )
        failed = [j for j in jobs if j.get("status") == "failed" and not j.get("allow_failure")]
        failed.sort(key=lambda j: int(j.get("id") or 0))
        return [self._ci_job(project, job, tail_lines) for job in failed[:CI_JOB_LIMIT]]

    def merge_source(self, project: str, sha: str) -> str | None:
        """The MR head a merged-results pipeline tested: the second parent of its merge commit `sha`.

        GitLab writes `refs/merge-requests/N/merge` as a merge of the target's head (first parent)
        and the MR's head (second parent); any other shape is no merged result, so None."""
        commit = checked_sha(sha)
        data = self._call(
            f"read commit {commit[:12]} of {project}",
            lambda: self._project(project).commits.get(commit, **_ONCE).attributes,
        )
        parents = data.get("parent_ids")
        if not isinstance(parents, list) or len(parents) != 2 or not isinstance(parents[1], str):
            return None
        try:
            return checked_sha(parents[1])
        except ForgeError:
            return None

    def _ci_job(self, project: str, job: dict[str, Any], tail_lines: int) -> CiJob:
        job_id = int(job.get("id") or 0)
        try:
            trace = self._call(f"read the log of job {job_id} in {project}", lambda: self._trace_end(project, job_id))
        except ForgeNotFound:  # erased or expired: the job's name and reason still help
            trace = ""
        return CiJob(
            id=str(job_id),
            name=self._text.scrub(str(job.get("name") or "")),
            status=str(job.get("status") or "failed"),
            stage=job.get("stage"),
            failure_reason=job.get("failure_reason"),
            url=job.get("web_url"),
            log_tail=self._text.scrub(log_tail(trace, tail_lines)),
        )

    def _trace_end(self, project: str, job_id: int) -> str:
        """The last CI_TRACE_BYTES of a job's log, read as a stream so a huge log is never held whole."""
        chunks = (
            self._project(project)
            .jobs.get(job_id, lazy=True)
            .trace(streamed=True, iterator=True, chunk_size=65_536, **_ONCE)
        )
        kept: deque[bytes] = deque()
        size = 0
        for chunk in chunks:
            kept.append(chunk)
            size += len(chunk)
            while size - len(kept[0]) >= CI_TRACE_BYTES:
                size -= len(kept.popleft())
        return b"".join(kept)[-CI_TRACE_BYTES:].decode("utf-8", "replace")

    def git_auth_header(self) -> str:
        """HTTP Basic with user `oauth2` and the token as password: GitLab accepts this for git over HTTP."""
        return basic_auth_header("oauth2", self._token)

    def close(self) -> None:
        self._gl.session.close()

    # -- shapes ----------------------------------------------------------------------------

    @staticmethod
    def _mr(data: dict[str, Any]) -> MergeRequest:
        draft = data.get("draft")
        if draft is None:  # GitLab before 13.x only says work_in_progress
            draft = data.get("work_in_progress")
        diff_refs: dict[str, Any] = data["diff_refs"] if isinstance(data.get("diff_refs"), dict) else {}
        author = data.get("author") or {}
        state = data.get("state")
        return MergeRequest(
            id=int(data.get("id") or 0),
            number=int(data.get("iid") or 0),
            web_url=str(data.get("web_url") or ""),
            draft=bool(draft),
            source_branch=str(data.get("source_branch") or ""),
            target_branch=str(data.get("target_branch") or ""),
            title=str(data.get("title") or ""),
            description=str(data.get("description") or ""),
            state=str(data.get("state") or ""),
            head_sha=data.get("sha") or diff_refs.get("head_sha") or None,
            author=author.get("username") if isinstance(author, dict) else None,
            verdict="merged" if state == "merged" else "closed" if state == "closed" else "open",
            conflicts=gitlab_conflicts(data),
            # `diff_refs.start_sha`: the target branch's head recorded with the MR's latest diff version
            # (`base_sha` is the merge base, `head_sha` the source head); the best GitLab gives here.
            target_sha=full_sha(diff_refs.get("start_sha")),
        )
