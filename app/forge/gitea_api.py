"""Gitea (and Forgejo) through its REST API over httpx: the Forge protocol for the worker.

Supported: Gitea 1.16 and newer (the issue timeline endpoint appeared in 1.16) and every Forgejo
release. The API has no "draft" flag to set: a pull request is work in progress when its title
starts with one of the instance's WORK_IN_PROGRESS_PREFIXES (default `WIP:` and `[WIP]`).
Gitea 1.22 and newer report `draft` in the answer; 1.16-1.21 do not, and then the title decides,
by Gitea's own rule (`gitea_wip_title`).

Listings are read page by page until a page is empty (`[]`, or `null` as the timeline answers),
never stopping at a short page: MAX_RESPONSE_ITEMS may cap pages below what we ask for, and the
timeline drops entries the token may not see. `transport` is the httpx seam tests use.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Literal
from urllib.parse import quote

import httpx

from app.forge.api import (
    CI_JOB_LIMIT,
    DEFAULT_TEXT_LIMIT,
    GITEA_DRAFT_PREFIX,
    ISSUE_COMMENT_READ_LIMIT,
    THREAD_READ_LIMIT,
    ForgeAuthError,
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

TRIGGER_PERMISSIONS = frozenset({"write", "admin", "owner"})
CODE_UNIT = "repo.code"  # FrogFix pushes code for the person who triggers it: write on this unit counts
GITEA_WIP_PREFIXES = ("WIP:", "[WIP]")  # Gitea's default [repository.pull-request] WORK_IN_PROGRESS_PREFIXES
FAILING_STATUSES = frozenset({"failure", "error"})  # Gitea's CommitStatusState values that mean "broken"
PAGE_SIZE = 50  # what we ask for; the instance's [api] MAX_RESPONSE_ITEMS (default 50) may give fewer
MAX_PAGES = 100  # a bound on any listing, so a huge timeline cannot keep a worker busy forever


def gitea_wip_title(title: str, prefixes: tuple[str, ...]) -> bool:
    """Gitea's HasWorkInProgressPrefix: a case-insensitive prefix test on the title as it is.

    The title's leading spaces are kept (" WIP: x" is not work in progress to Gitea); the
    configured prefixes are trimmed, as Gitea's settings loader trims list values.
    """
    upper = title.upper()
    return any(p.strip() and upper.startswith(p.strip().upper()) for p in prefixes)


def gitea_conflicts(mergeable: Any, *, open_: bool, draft: bool) -> bool | None:
    """Whether a pull request conflicts with its base branch, from what Gitea/Forgejo's API says.

    Field names: Gitea's api.PullRequest (modules/structs/pull.go; in the shared fixtures
    forgejo/woodpecker/HookPullRequestEdited.json and gitea/go-playground_webhooks/pull-request-event.json):
    `mergeable` (bool), `merge_base` (sha), `base` {ref, sha}, `head` {ref, sha}.

    What they mean, read in go-gitea/gitea (services/convert/pull.go, ToAPIPullRequest, and
    models/issues/pull.go): `mergeable` is `pr.Mergeable()`, false when the pull's status is CHECKING
    (the conflict check that runs after a push to either branch is not done), CONFLICT or ERROR, *or*
    when the pull is work in progress (a WIP title prefix: Gitea's draft); it is a plain bool, always
    sent, never null. `base.sha` is the base branch's head commit, read from the repository when the
    API answers (GetBranch(pr.BaseBranch).GetCommit()); `merge_base` is the merge base stored by the
    last check, not the target head. So `base.sha` is the best target head there is, though while a
    check is pending it may be newer than the verdict.

    Hence: `mergeable` true is conflicts False; false on an open pull that is not a draft is taken as a
    conflict, True (the API cannot tell it from a check still running or one that failed); false on a
    draft says nothing (None), and neither does anything on a closed or merged pull, nor a missing field.
    FrogFix's own pulls are drafts until a human marks them ready, so for them it is mostly None: compare
    `base.sha` with the head the branch was built on, and merge locally, to know more.
    """
    if not open_ or not isinstance(mergeable, bool):
        return None
    if mergeable:
        return False
    return None if draft else True


def _explain_403(exc: ForgeAuthError, why: str) -> ForgeAuthError:
    """A 403 with what the FrogFix account lacks; any other auth error as it was."""
    if exc.status != 403:
        return exc
    return ForgeAuthError(f"{exc.message}; {why}", status=403)


def team_writes_code(team: dict[str, Any]) -> bool:
    """Whether a team (as `GET /repos/{owner}/{repo}/teams` lists it) may write the code.

    Admin and owner teams may write everything. Other teams say it per unit in `units_map`
    (Gitea 1.17+); before that a team had one `permission` for all its units.
    """
    permission = str(team.get("permission") or "").lower()
    if permission in ("admin", "owner"):
        return True
    units = team.get("units_map")
    if isinstance(units, dict) and units:
        return str(units.get(CODE_UNIT) or "").lower() in TRIGGER_PERMISSIONS
    return permission in TRIGGER_PERMISSIONS and CODE_UNIT in (team.get("units") or [CODE_UNIT])


class GiteaForge:
    """The Forge protocol over Gitea's REST API v1."""

    kind: Literal["gitea"] = "gitea"

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        redact: Redactor | None = None,
        text_limit: int = DEFAULT_TEXT_LIMIT,
        transport: httpx.BaseTransport | None = None,
        verify: bool | str = True,
        wip_prefixes: tuple[str, ...] = GITEA_WIP_PREFIXES,
    ) -> None:
        if not url:
            raise ForgeError("no Gitea URL is configured (set FROGFIX_GITEA_URL)", forge="Gitea", setup=True)
        if not token:
            raise ForgeError("no Gitea token is configured (set FROGFIX_GITEA_TOKEN)", forge="Gitea", setup=True)
        self._token = token
        self._text = OutboundText(secret_forms(token), redact, text_limit)
        self._retry = retry or RetryPolicy()
        self._wip_prefixes = wip_prefixes
        self._bot: str | None = None
        self._http = httpx.Client(
            base_url=url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"token {token}", "Accept": "application/json", "User-Agent": "FrogFix"},
            timeout=timeout,
            transport=transport,
            verify=verify,
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    # -- plumbing --------------------------------------------------------------------------

    @staticmethod
    def _repo_path(project: str) -> str:
        parts = project.strip("/").split("/")
        if len(parts) != 2 or not all(parts):
            raise ForgeError(f"a Gitea project is owner/name, not {project[:200]!r}")
        return "/repos/" + "/".join(quote(p, safe="") for p in parts)

    def _request(
        self, method: str, path: str, what: str, *, params: dict[str, Any] | None = None, json: Any = None
    ) -> Any:
        """One HTTP exchange with errors translated; no retrying here (see `_call`)."""
        error: ForgeError
        try:
            response = self._http.request(method, path, params=params, json=json)
        except httpx.TimeoutException:
            error = ForgeTransient(f"Gitea {what}: timed out", forge="Gitea", call=what, said="timed out",
                                   unreachable=True)
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            error = ForgeTransient(f"Gitea {what}: {type(exc).__name__} talking to the server", forge="Gitea",
                                   call=what, said=type(exc).__name__, unreachable=True)
        except httpx.HTTPError as exc:
            said = f"{type(exc).__name__}: {self._text.error(str(exc))}"
            error = ForgeError(f"Gitea {what}: {said}", forge="Gitea", call=what, said=said)
        else:
            return self._answer(response, what)
        raise error  # outside the except blocks: httpx's exception is not chained to ours

    def _answer(self, response: httpx.Response, what: str) -> Any:
        """The JSON of a 2xx answer, or the ForgeError its status means."""
        if response.is_success:
            if response.status_code == 204 or not response.content:
                return None
            try:
                return response.json()
            except ValueError:
                raise ForgeError(f"Gitea {what}: the answer is not JSON (is FROGFIX_GITEA_URL right?)") from None
        if 300 <= response.status_code < 400:
            said = f"the server redirected (HTTP {response.status_code}); check FROGFIX_GITEA_URL"
            raise ForgeError(f"Gitea {what}: {said}", forge="Gitea", call=what, said=said, redirected=True)
        detail = ""
        try:
            body = response.json()
            if isinstance(body, dict):
                detail = str(body.get("message") or body.get("error") or "")
        except ValueError:
            detail = response.text[:500]
        message = f"Gitea {what}: HTTP {response.status_code} {self._text.error(detail)}".rstrip()
        retry_after = self._retry.retry_after(response.headers.get("Retry-After"))
        raise error_for_status(response.status_code, message, retry_after=retry_after, forge="Gitea", call=what,
                               said=self._text.error(detail))

    def _call(
        self, method: str, path: str, what: str, *, params: dict[str, Any] | None = None, json: Any = None
    ) -> Any:
        return forge_call(self._retry, what, lambda: self._request(method, path, what, params=params, json=json))

    def _object(self, method: str, path: str, what: str, *, json: Any = None) -> dict[str, Any]:
        """A call whose answer must be one JSON object."""
        data = self._call(method, path, what, json=json)
        if not isinstance(data, dict):
            raise ForgeError(f"Gitea {what}: expected a JSON object")
        return data

    def _pages(
        self, path: str, what: str, params: dict[str, Any] | None = None, *, retried: bool = True
    ) -> list[dict[str, Any]]:
        """Every item of a paginated listing: pages until an empty or `null` one, up to MAX_PAGES.

        A short page is not the end (a capped page size, or timeline entries hidden from us), and
        neither X-Total-Count (per page on the timeline) nor Link (absent there) can be trusted.
        Past the bound it fails rather than act on part of a list (an older label adder, a
        missed pull request). `retried=False` is for a caller already inside a retry of its own.
        """
        get = self._call if retried else self._request
        items: list[dict[str, Any]] = []
        for page in range(1, MAX_PAGES + 2):  # up to MAX_PAGES pages of items, and one to see the end
            batch = get("GET", path, what, params={**(params or {}), "page": page, "limit": PAGE_SIZE})
            if batch is None or batch == []:
                return items
            if not isinstance(batch, list):
                raise ForgeError(f"Gitea {what}: expected a list")
            items.extend(b for b in batch if isinstance(b, dict))
        raise ForgeError(f"Gitea {what}: more than {MAX_PAGES} pages; FrogFix will not act on part of the list")

    # -- the protocol ----------------------------------------------------------------------

    def get_issue(self, project: str, number: int) -> Issue:
        what = f"read issue #{number} of {project}"
        data = self._object("GET", f"{self._repo_path(project)}/issues/{int(number)}", what)
        if data.get("pull_request"):
            raise ForgeNotFound(f"Gitea {what}: #{number} is a pull request, not an issue")
        user = data.get("user") or {}
        return Issue(
            project=project,
            number=int(data.get("number", number)),
            title=str(data.get("title") or ""),
            body=str(data.get("body") or ""),
            state="closed" if data.get("state") == "closed" else "open",
            labels=tuple(str(label["name"]) for label in data.get("labels") or () if isinstance(label, dict)),
            web_url=str(data.get("html_url") or ""),
            author=user.get("login") or user.get("username"),
        )

    def label_adder(self, project: str, number: int, label: str) -> str | None:
        """Who most recently added `label`, from the issue timeline (Gitea >= 1.16, where it appeared).

        A label timeline entry has type "label" (always a string in this API) and body "1" when
        the label was added, "" when it was removed.
        """
        what = f"read the timeline of #{number} in {project}"
        entries = self._pages(f"{self._repo_path(project)}/issues/{int(number)}/timeline", what)
        added = [
            e
            for e in entries
            if e.get("type") == "label"
            and str(e.get("body") or "") == "1"
            and isinstance(e.get("label"), dict)
            and e["label"].get("name") == label
        ]
        if not added:
            return None
        latest = max(added, key=lambda e: (str(e.get("created_at") or ""), int(e.get("id") or 0)))
        user = latest.get("user") or {}
        return user.get("login") or user.get("username")

    def can_trigger(self, project: str, username: str) -> bool:
        """True for `write`, `admin` or `owner` on the repository, or write on its code through a team.

        The permission endpoint reports the repository-level mode; a "general access" team's
        write is granted per unit (`units_map`) while that mode reads `read`, so the teams are
        asked next. An unknown user is refused.
        """
        permission = self._repo_permission(project, username)
        if permission is None:
            return False
        if permission in TRIGGER_PERMISSIONS:
            return True
        return any(self._is_team_member(team, username) for team in self._code_writing_teams(project))

    def _repo_permission(self, project: str, username: str) -> str | None:
        """The repository-level mode Gitea reports for `username`; None for an unknown user."""
        what = f"read the permission of {username} on {project}"
        path = f"{self._repo_path(project)}/collaborators/{quote(username, safe='')}/permission"
        try:
            data = self._object("GET", path, what)
        except ForgeNotFound:
            return None
        except ForgeAuthError as exc:
            raise _explain_403(
                exc,
                "Gitea lets only repository admins read another user's permission, "
                "so the FrogFix account needs admin on this repository",
            ) from None
        return str(data.get("permission") or "").lower()

    def _code_writing_teams(self, project: str) -> list[dict[str, Any]]:
        """The organisation teams of the repository that may write its code (none for a user's repository)."""
        what = f"list the teams of {project}"
        try:
            teams = self._call("GET", f"{self._repo_path(project)}/teams", what)
        except ForgeNotFound:
            return []
        except ForgeError as exc:
            if exc.status == 405:  # "repo is not owned by an organization"
                return []
            raise
        if not isinstance(teams, list):
            return []
        return [t for t in teams if isinstance(t, dict) and team_writes_code(t)]

    def _is_team_member(self, team: dict[str, Any], username: str) -> bool:
        what = f"check whether {username} is in team {team.get('name')!r}"
        path = f"/teams/{int(team.get('id') or 0)}/members/{quote(username, safe='')}"
        try:
            self._call("GET", path, what)
        except ForgeNotFound:
            return False
        except ForgeAuthError as exc:
            raise _explain_403(
                exc,
                "Gitea lets only organisation owners and team members read a team's members, "
                "so the FrogFix account needs to own the organisation (or be in the team), "
                "with a token that may read organisations",
            ) from None
        return True

    def project_info(self, project: str) -> ProjectInfo:
        data = self._object("GET", self._repo_path(project), f"read repository {project}")
        branch = data.get("default_branch")
        if data.get("empty") is True:  # an empty repository still names a default branch
            raise ForgeError(
                f"Gitea repository {project} is empty: it has no commits yet, so there is nothing to fix; "
                "push a first commit, then add the label again"
            )
        if not branch:
            raise ForgeError(f"Gitea repository {project} has no default branch (is it empty?)")
        return ProjectInfo(
            path=str(data.get("full_name") or project),
            id=str(data.get("id")),
            default_branch=str(branch),
            clone_url=str(data.get("clone_url") or ""),
            web_url=str(data.get("html_url") or ""),
        )

    def find_open_mr(self, project: str, source_branch: str) -> MergeRequest | None:
        pulls = self._pages(
            f"{self._repo_path(project)}/pulls", f"list open pull requests of {project}", {"state": "open"}
        )
        ours = [p for p in pulls if self._is_ours(p, source_branch)]
        if not ours:
            return None
        return self._mr(min(ours, key=lambda p: int(p.get("number") or 0)))

    def create_draft_mr(
        self, project: str, source_branch: str, target_branch: str, title: str, description: str
    ) -> MergeRequest:
        what = f"open a draft pull request from {source_branch} in {project}"
        payload = {
            "head": source_branch,
            "base": target_branch,
            "title": self._text.title(GITEA_DRAFT_PREFIX, title),
            "body": self._text.body(description),
        }
        path = f"{self._repo_path(project)}/pulls"
        tried = False

        def attempt() -> Any:
            nonlocal tried
            if tried:
                # The last POST may have succeeded before the connection failed: never open a second PR.
                for pull in self._pages(path, what, {"state": "open"}, retried=False):
                    if self._is_ours(pull, source_branch):
                        return pull
            tried = True
            return self._request("POST", path, what, json=payload)

        data = forge_call(self._retry, what, attempt)
        mr = self._mr(data)
        if not isinstance(data.get("draft"), bool):
            mr = replace(mr, draft=self._issue_says_draft(project, mr))
        if not mr.draft:
            raise ForgeError(
                f"Gitea opened #{mr.number} in {project} but it is not a draft (is {GITEA_DRAFT_PREFIX.strip()!r} "
                "among the instance's WORK_IN_PROGRESS_PREFIXES?); FrogFix only opens drafts, please check it"
            )
        return mr

    def _issue_says_draft(self, project: str, mr: MergeRequest) -> bool:
        """Gitea's own verdict where the server gives one: the issue view's `pull_request.draft`.

        Gitea added it in 1.22 with the pull request's own `draft`, so on 1.16-1.21 this finds
        nothing and the title test stands; one read is cheap next to a wrong "not a draft" error.
        """
        what = f"read the draft state of #{mr.number} in {project}"
        try:
            issue = self._object("GET", f"{self._repo_path(project)}/issues/{mr.number}", what)
        except ForgeNotFound:
            return mr.draft
        meta = issue.get("pull_request")
        if isinstance(meta, dict) and isinstance(meta.get("draft"), bool):
            return bool(meta["draft"])
        return mr.draft

    def update_mr(self, project: str, mr: MergeRequest, title: str, description: str) -> MergeRequest:
        # Gitea's draft is the title's WIP prefix: sent only while the PR is a draft, so a ready PR stays ready.
        payload = {
            "title": self._text.title(draft_prefix(mr, GITEA_DRAFT_PREFIX), title),
            "body": self._text.body(description),
        }
        path = f"{self._repo_path(project)}/pulls/{int(mr.number)}"
        data = self._object("PATCH", path, f"update #{mr.number} in {project}", json=payload)
        return self._mr(data)

    def comment(self, project: str, number: int, body: str) -> None:
        """Post a comment once: a try after a failed one first looks for the comment among the newest."""
        marker = comment_marker()
        path = f"{self._repo_path(project)}/issues/{int(number)}/comments"
        what = f"comment on #{number} in {project}"
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 3600))

        def posted() -> bool:
            recent = self._request("GET", path, what, params={"since": since})
            return isinstance(recent, list) and any(
                isinstance(c, dict) and marker in str(c.get("body") or "") for c in recent
            )

        def post() -> None:
            self._request("POST", path, what, json={"body": self._text.body(marker + body)})

        forge_call(self._retry, what, post_once(post, posted))

    def issue_comments(self, project: str, number: int) -> list[IssueComment]:
        """The issue's comments: Gitea lists them in one unpaged answer, oldest first, and only plain
        comments (no label or state changes); the newest ISSUE_COMMENT_READ_LIMIT are read."""
        what = f"read the comments of #{number} in {project}"
        found = self._call("GET", f"{self._repo_path(project)}/issues/{int(number)}/comments", what)
        if found is not None and not isinstance(found, list):
            raise ForgeError(f"Gitea {what}: expected a list")
        comments = [
            IssueComment(
                id=str(c.get("id") or ""),
                author=self._login(c.get("user")),
                body=str(c.get("body") or ""),
                created_at=forge_time(c.get("created_at")),
            )
            for c in (found or [])[-ISSUE_COMMENT_READ_LIMIT:]
            if isinstance(c, dict)
        ]
        return bounded_comments(comments, self._text.scrub)

    def mr_verdict(self, project: str, number: int) -> MrVerdict:
        """Gitea's and Forgejo's pull: `merged` true is merged; else `state` closed is closed unmerged."""
        what = f"read pull request #{number} of {project}"
        data = self._object("GET", f"{self._repo_path(project)}/pulls/{int(number)}", what)
        if data.get("merged") is True:
            return "merged"
        return "closed" if data.get("state") == "closed" else "open"

    # -- review rounds ---------------------------------------------------------------------

    def bot_username(self) -> str:
        """The token's own account (GET /user), read once per client."""
        if self._bot is None:
            data = self._object("GET", "/user", "read the token's own user")
            name = data.get("login") or data.get("username")
            if not name:
                raise ForgeError("Gitea did not say which user the FrogFix token belongs to")
            self._bot = str(name)
        return self._bot

    def get_mr(self, project: str, number: int) -> MergeRequest:
        what = f"read pull request #{number} of {project}"
        return self._mr(self._object("GET", f"{self._repo_path(project)}/pulls/{int(number)}", what))

    def review_thread(self, project: str, number: int) -> list[ThreadNote]:
        """The PR's comments, its submitted reviews and their line comments (resolved when Gitea names a resolver)."""
        base = self._repo_path(project)
        what = f"read the comments of #{number} in {project}"
        comments = self._call("GET", f"{base}/issues/{int(number)}/comments", what)  # Gitea: one unpaged list
        notes = [self._comment_note(c) for c in comments or () if isinstance(c, dict)]
        reviews = self._pages(f"{base}/pulls/{int(number)}/reviews", f"read the reviews of #{number} in {project}")
        for review in reviews[-THREAD_READ_LIMIT:]:
            state = str(review.get("state") or "").upper()
            if state == "PENDING":  # not submitted: only its author sees it
                continue
            if str(review.get("body") or "").strip():
                notes.append(self._review_note(review, state))
            if int(review.get("comments_count") or 0) > 0 and len(notes) < THREAD_READ_LIMIT:
                path = f"{base}/pulls/{int(number)}/reviews/{int(review.get('id') or 0)}/comments"
                found = self._call("GET", path, f"read the comments of review {review.get('id')} on #{number}")
                notes.extend(self._review_comment_note(c) for c in found or () if isinstance(c, dict))
        return bounded_thread(notes, self._text.scrub)

    @staticmethod
    def _login(user: Any) -> str | None:
        return (user.get("login") or user.get("username")) if isinstance(user, dict) else None

    def _comment_note(self, comment: dict[str, Any]) -> ThreadNote:
        return ThreadNote(
            id=str(comment.get("id") or ""),
            author=self._login(comment.get("user")),
            body=str(comment.get("body") or ""),
            created_at=comment.get("created_at"),
        )

    def _review_note(self, review: dict[str, Any], state: str) -> ThreadNote:
        """A review's own text; its verdict (REQUEST_CHANGES, COMMENT, APPROVED) leads the body."""
        return ThreadNote(
            id=str(review.get("id") or ""),
            author=self._login(review.get("user")),
            body=f"[review: {state.lower().replace('_', ' ') or 'comment'}]\n{review.get('body') or ''}",
            created_at=review.get("submitted_at") or review.get("updated_at"),
            kind="review",
        )

    def _review_comment_note(self, comment: dict[str, Any]) -> ThreadNote:
        """A line comment: `position` is the line in the new file, `original_position` in the old one."""
        line = comment.get("position") or comment.get("original_position")
        return ThreadNote(
            id=str(comment.get("id") or ""),
            author=self._login(comment.get("user")),
            body=str(comment.get("body") or ""),
            created_at=comment.get("created_at"),
            path=comment.get("path") or None,
            line=int(line) if isinstance(line, int) and line > 0 else None,
            resolved=comment.get("resolver") is not None,
            kind="diff_note",
        )

    def reply(self, project: str, number: int, body: str, discussion_id: str | None = None) -> None:
        """A comment on the pull request (Gitea's API has no replies in a review thread); posted once."""
        self.comment(project, number, body)

    def ci_failures(self, project: str, report: CiReport, tail_lines: int) -> list[CiJob]:
        """The commit's failing statuses (failure, error), the latest per context; a status has no log, so its
        description stands in for one."""
        sha = checked_sha(report.sha)
        what = f"read the statuses of {sha[:12]} in {project}"
        statuses = self._pages(f"{self._repo_path(project)}/commits/{sha}/statuses", what)
        latest: dict[str, dict[str, Any]] = {}
        for status in sorted(statuses, key=lambda s: (str(s.get("updated_at") or ""), int(s.get("id") or 0))):
            latest[str(status.get("context") or "")] = status
        failing = [s for s in latest.values() if self._state(s) in FAILING_STATUSES]
        failing.sort(key=lambda s: int(s.get("id") or 0))
        return [
            CiJob(
                id=str(s.get("id") or ""),
                name=self._text.scrub(str(s.get("context") or "")),
                status=self._state(s),
                url=s.get("target_url") or None,
                log_tail=self._text.scrub(log_tail(str(s.get("description") or ""), tail_lines)),
            )
            for s in failing[:CI_JOB_LIMIT]
        ]

    @staticmethod
    def _state(status: dict[str, Any]) -> str:
        """Gitea names a commit status's state `status` in the API (`state` in the webhook)."""
        return str(status.get("status") or status.get("state") or "").lower()

    def git_auth_header(self) -> str:
        """HTTP Basic with the token as user name and `x-oauth-basic` as password.

        Gitea (every version since the Gogs days) takes the user name as the token when the
        password is empty or `x-oauth-basic`, so no account name is needed.
        """
        return basic_auth_header(self._token, "x-oauth-basic")

    # -- shapes ----------------------------------------------------------------------------

    @staticmethod
    def _is_ours(pull: dict[str, Any], source_branch: str) -> bool:
        """An open PR from `source_branch` of this same repository (not from a fork with that name)."""
        head, base = pull.get("head") or {}, pull.get("base") or {}
        # `label` is the branch name; `ref` falls back to refs/pull/N/head when the branch is gone.
        if source_branch not in (head.get("ref"), head.get("label")) or pull.get("state", "open") != "open":
            return False
        head_repo, base_repo = head.get("repo_id"), base.get("repo_id")
        return head_repo is None or base_repo is None or head_repo == base_repo

    def _mr(self, data: Any) -> MergeRequest:
        if not isinstance(data, dict):
            raise ForgeError("Gitea answered a pull request request with something that is not an object")
        title = str(data.get("title") or "")
        draft = data.get("draft")
        if not isinstance(draft, bool):  # Gitea 1.16-1.21: no `draft` field
            draft = gitea_wip_title(title, self._wip_prefixes)
        head, base = data.get("head") or {}, data.get("base") or {}
        verdict: MrVerdict = (
            "merged" if data.get("merged") is True else "closed" if data.get("state") == "closed" else "open"
        )
        return MergeRequest(
            id=int(data.get("id") or 0),
            number=int(data.get("number") or 0),
            web_url=str(data.get("html_url") or ""),
            draft=bool(draft),
            source_branch=str(head.get("ref") or ""),
            target_branch=str(base.get("ref") or ""),
            title=title,
            description=str(data.get("body") or ""),
            state=str(data.get("state") or ""),
            head_sha=head.get("sha") or None,
            author=self._login(data.get("user")),
            verdict=verdict,
            conflicts=gitea_conflicts(data.get("mergeable"), open_=verdict == "open", draft=bool(draft)),
            # `base.sha`: the target branch's head when Gitea answered (see gitea_conflicts), not the
            # merge base, which Gitea reports apart as `merge_base`.
            target_sha=full_sha(base.get("sha")),
        )
