"""A stateful Gitea REST API double on 127.0.0.1, built from the shapes of real Gitea payloads.

Same plumbing as the GitLab double (tests/doubles/gitlab_api.py: a real HTTP server, every
request recorded, fault injection). Users, repositories, issues, pull requests and comments are
made from the captured Gitea webhook objects in ../shared/fixtures/forge (they are the API's
own structs serialised), with the fields that matter replaced by the double's state.

Like real Gitea, issues and pull requests share one number sequence per repository, a pull
request is a draft when its title starts with a WORK_IN_PROGRESS_PREFIX (`WIP:`, `[WIP]`, case
folded, the title's leading spaces kept), and only a repository admin may read another user's
permission. Gitea 1.22+ reports `draft` on the pull request and under the issue view's
`pull_request.draft`; `draft_field=False` answers as 1.16-1.21 do, with neither.

Listings page as Gitea pages them: `limit` is capped at `max_response_items` ([api]
MAX_RESPONSE_ITEMS, default 50; 30 when no limit is given), the pull request list answers `[]`
past the end with a Link header and the total in X-Total-Count, and the issue timeline answers
`null` past the end, with no Link header and X-Total-Count counting only the page.

Review rounds: pull request comments (`add_pr_comment`), reviews and their line comments (`add_review`,
shaped like gitea/jenkins-x_go-scm/api_responses/reviews.json; line comments as Gitea's
PullReviewComment: `position` the new line, `original_position` the old one, `resolver` when resolved),
commit statuses per sha (`add_status`, gitea/go-scm/api_responses/statuses.json: the state is named
`status`), a pull's head sha (`set_pull_head`) and a human marking it ready (`set_pull_ready`).

Merge status (issue 25): once `link_repository` ties a repository to its bare git repository, every open
pull of it is answered from the repository at that moment: `head.sha`, `base.sha` (the base branch's
head, as Gitea's ToAPIPullRequest reads it from the branch when it answers), `merge_base`, and
`mergeable`, which is Gitea's PullRequest.Mergeable(): false while the conflict check runs
(`set_mergeable_unknown`), when the pull conflicts (`git merge-tree`), or when it is work in progress.

Organisation teams (`add_team`) carry `units_map` as Gitea 1.17+ lists them: a "general access"
team grants its modes per unit, and the repository-level permission of its members reads the
team's lowest unit mode (so `read` for a team with write on code and read on the wiki).
"""

from __future__ import annotations

import copy
import itertools
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from tests.doubles.gitlab_api import FIXTURES, JSON_NULL, Answer, JsonApiDouble, load_fixture, merge_view

WIP_PREFIXES = ("WIP:", "[WIP]")  # Gitea's default [repository.pull-request] WORK_IN_PROGRESS_PREFIXES
NOT_FOUND = {"errors": None, "message": "The target couldn't be found.", "url": ""}
MODES = ("none", "read", "write", "admin", "owner")  # Gitea's AccessMode, lowest first
DEFAULT_PAGING_NUM = 30  # Gitea's [api] DEFAULT_PAGING_NUM: the page size when no limit is given


def gitea_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class GiteaDouble(JsonApiDouble):
    """Gitea API v1 for one token (owned by `bot_login`).

    State tests assert on: `pulls` (dict (repo, number) -> PR dict, API shape), `comments`
    (list of comment dicts with `repo` and `issue` added), `requests` (every Recorded request).
    """

    def __init__(
        self,
        token: str = "gitea-double-token",
        *,
        fixtures: Path = FIXTURES,
        bot_login: str = "frogfix-bot",
        draft_field: bool = True,
        max_response_items: int = 50,
    ) -> None:
        self.token = token
        self.draft_field = draft_field  # False: a 1.16-1.21 server, which reports no `draft`
        self.max_response_items = max_response_items  # the instance's [api] MAX_RESPONSE_ITEMS
        self.bot_repo_admin = True  # set False to see Gitea's 403 on reading others' permissions
        self.bot_org_owner = True  # set False to see Gitea's 403 on reading a team's members
        self.wip_prefixes = WIP_PREFIXES  # the instance's WORK_IN_PROGRESS_PREFIXES
        event = load_fixture(fixtures, "gitea/go-playground_webhooks/issue-label-event.json")
        self._user_template = event["sender"]
        self._repo_template = event["repository"]
        self._issue_template = event["issue"]
        self._label_template = event["issue"]["labels"][0]
        self._pull_template = load_fixture(fixtures, "gitea/go-playground_webhooks/pull-request-event.json")[
            "pull_request"
        ]
        self._comment_template = load_fixture(fixtures, "gitea/go-playground_webhooks/issue-comment-event.json")[
            "comment"
        ]
        self.users: dict[str, dict[str, Any]] = {}
        self.repos: dict[str, dict[str, Any]] = {}
        self.permissions: dict[tuple[str, str], str] = {}
        self.teams: dict[int, dict[str, Any]] = {}  # id -> API shape plus `org`, `repos`, `members`
        self.issues: dict[tuple[str, int], dict[str, Any]] = {}
        self.pulls: dict[tuple[str, int], dict[str, Any]] = {}
        self.timeline: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.comments: list[dict[str, Any]] = []
        self.reviews: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.statuses: dict[tuple[str, str], list[dict[str, Any]]] = {}
        self.linked: dict[str, Path] = {}  # repository -> the bare git repository its pulls are computed from
        self.mergeable_unknown: set[tuple[str, int]] = set()  # pulls whose conflict check is still running
        self._review_template = load_fixture(fixtures, "gitea/jenkins-x_go-scm/api_responses/reviews.json")[0]
        self._closed_hook = load_fixture(fixtures, "gitea/woodpecker/HookPullRequestClosed.json")
        self._status_template = load_fixture(fixtures, "gitea/go-scm/api_responses/statuses.json")[0]
        self._ids = itertools.count(100)
        super().__init__()
        self.bot = self.add_user(bot_login)

    def authorized(self, headers: dict[str, str]) -> bool:
        value = headers.get("authorization", "")
        return value in (f"token {self.token}", f"Bearer {self.token}")

    def unauthorized(self) -> Answer:
        return Answer(401, {"message": "token is required", "url": f"{self.base_url}/api/swagger"})

    # -- building state --------------------------------------------------------------------

    def add_user(self, login: str) -> dict[str, Any]:
        user = copy.deepcopy(self._user_template)
        user.update(
            id=next(self._ids),
            login=login,
            username=login,
            full_name=login.title(),
            email=f"{login}@example.invalid",
            avatar_url=f"{self.base_url}/avatars/{login}",
        )
        self.users[login] = user
        return user

    def add_repo(
        self,
        full_name: str,
        *,
        default_branch: str = "main",
        clone_url: str | None = None,
        private: bool = True,
        empty: bool = False,
    ) -> dict[str, Any]:
        """A repository owned by its owner (who gets `owner`); `clone_url` may point at a git_http double.

        An `empty` one (no commits yet) still names its default branch, as Gitea's does.
        """
        owner_login, name = full_name.split("/")
        owner = self.users.get(owner_login) or self.add_user(owner_login)
        repo = copy.deepcopy(self._repo_template)
        repo.update(
            id=next(self._ids),
            owner=copy.deepcopy(owner),
            name=name,
            full_name=full_name,
            empty=empty,
            private=private,
            html_url=f"{self.base_url}/{full_name}",
            ssh_url=f"git@127.0.0.1:{full_name}.git",
            clone_url=clone_url or f"{self.base_url}/{full_name}.git",
            default_branch=default_branch,
            created_at=gitea_time(),
            updated_at=gitea_time(),
        )
        self.repos[full_name] = repo
        self.permissions[(full_name, owner_login)] = "owner"
        self.permissions.setdefault((full_name, self.bot["login"]), "admin")
        return repo

    def set_permission(self, repo: str, login: str, permission: str) -> None:
        """`permission` is what Gitea reports: none, read, write, admin or owner."""
        if login not in self.users:
            self.add_user(login)
        self.permissions[(repo, login)] = permission

    def add_team(
        self,
        org: str,
        name: str,
        *,
        repos: tuple[str, ...] = (),
        members: tuple[str, ...] = (),
        units_map: dict[str, str] | None = None,
        permission: str | None = None,
    ) -> dict[str, Any]:
        """A team of organisation `org` with access to `repos`.

        With `units_map` it is a "general access" team, whose `permission` Gitea derives as its
        lowest unit mode; `permission="admin"` (or "owner") is an admin team with every unit.
        """
        units = dict(units_map or {})
        mode = permission or min(units.values(), key=MODES.index, default="none")
        if mode in ("admin", "owner"):
            units = dict.fromkeys(units or ("repo.code", "repo.issues", "repo.pulls"), mode)
        team: dict[str, Any] = {
            "id": next(self._ids),
            "name": name,
            "description": "",
            "organization": None,
            "includes_all_repositories": False,
            "permission": mode,
            "units": sorted(units),
            "units_map": units,
            "can_create_org_repo": False,
        }
        for login in members:
            if login not in self.users:
                self.add_user(login)
        self.teams[team["id"]] = {**team, "org": org, "repos": set(repos), "members": set(members)}
        return team

    def _team_mode(self, repo: str, login: str) -> str:
        """The repository-level mode a user's teams give (Gitea's `access` table): their highest."""
        modes = [t["permission"] for t in self.teams.values() if repo in t["repos"] and login in t["members"]]
        return max(modes, key=MODES.index, default="none")

    def _next_index(self, repo: str) -> int:
        return 1 + max([n for (r, n) in self.issues if r == repo] or [0])

    def add_issue(
        self,
        repo: str,
        *,
        title: str = "Crash on empty input",
        body: str = "Steps to reproduce...",
        labels: tuple[str, ...] = (),
        author: str = "reporter",
        state: str = "open",
    ) -> dict[str, Any]:
        number = self._next_index(repo)
        user = self.users.get(author) or self.add_user(author)
        issue = copy.deepcopy(self._issue_template)
        issue.update(
            id=next(self._ids),
            url=f"{self.base_url}/api/v1/repos/{repo}/issues/{number}",
            html_url=f"{self.base_url}/{repo}/issues/{number}",
            number=number,
            user=copy.deepcopy(user),
            title=title,
            body=body,
            labels=[],
            assignee=None,
            assignees=None,
            state=state,
            comments=0,
            created_at=gitea_time(),
            updated_at=gitea_time(),
            pull_request=None,
            repository={
                "id": self.repos[repo]["id"],
                "name": repo.split("/")[1],
                "owner": repo.split("/")[0],
                "full_name": repo,
            },
        )
        self.issues[(repo, number)] = issue
        self.timeline[(repo, number)] = []
        for label in labels:
            self.add_label(repo, number, label, by=author)
        return issue

    def add_label(self, repo: str, number: int, label: str, *, by: str) -> None:
        """`by` adds `label`: the issue carries it and the timeline gets a `label` entry with body "1"."""
        issue = self.issues[(repo, number)]
        if all(existing["name"] != label for existing in issue["labels"]):
            issue["labels"].append(self._label(repo, label))
        self._timeline_label(repo, number, label, by, added=True)

    def remove_label(self, repo: str, number: int, label: str, *, by: str) -> None:
        issue = self.issues[(repo, number)]
        issue["labels"] = [existing for existing in issue["labels"] if existing["name"] != label]
        self._timeline_label(repo, number, label, by, added=False)

    def add_timeline_comment(self, repo: str, number: int, body: str, *, by: str) -> None:
        """A plain comment in the timeline (type `comment`), to show the client skips it."""
        self.timeline[(repo, number)].append(self._timeline_entry(repo, number, "comment", by, body))

    def add_review_comment(self, repo: str, number: int, body: str, *, by: str) -> None:
        """A code review comment: stored in the timeline, but Gitea leaves it out of the answer after paging."""
        self.timeline[(repo, number)].append(self._timeline_entry(repo, number, "code", by, body))

    def _label(self, repo: str, name: str) -> dict[str, Any]:
        label = copy.deepcopy(self._label_template)
        label.update(id=abs(hash(name)) % 10**6, name=name, url=f"{self.base_url}/api/v1/repos/{repo}/labels/{name}")
        return label

    def _timeline_label(self, repo: str, number: int, label: str, by: str, *, added: bool) -> None:
        entry = self._timeline_entry(repo, number, "label", by, "1" if added else "")
        entry["label"] = self._label(repo, label)
        self.timeline[(repo, number)].append(entry)

    def _timeline_entry(self, repo: str, number: int, kind: str, by: str, body: str) -> dict[str, Any]:
        user = self.users.get(by) or self.add_user(by)
        entry_id = next(self._ids)
        return {
            "id": entry_id,
            "type": kind,
            "html_url": f"{self.base_url}/{repo}/issues/{number}#issuecomment-{entry_id}",
            "pull_request_url": "",
            "issue_url": f"{self.base_url}/{repo}/issues/{number}",
            "user": copy.deepcopy(user),
            "body": body,
            "created_at": gitea_time(),
            "updated_at": gitea_time(),
            "old_project_id": 0,
            "project_id": 0,
            "old_milestone": None,
            "milestone": None,
            "tracked_time": None,
            "old_title": "",
            "new_title": "",
            "old_ref": "",
            "new_ref": "",
            "ref_issue": None,
            "ref_comment": None,
            "ref_action": "",
            "ref_commit_sha": "",
            "review_id": 0,
            "label": None,
            "assignee": None,
            "assignee_team": None,
            "removed_assignee": False,
            "resolve_doer": None,
            "dependent_issue": None,
        }

    def add_pull(self, repo: str, head: str, base: str = "main", title: str = "x") -> dict[str, Any]:
        """A pull request that already exists (e.g. from an earlier run)."""
        return self._create_pull(repo, head, base, title, "")

    def set_pull_state(self, repo: str, number: int, state: str) -> dict[str, Any]:
        """A human merged (`merged`) or closed (`closed`) a pull, as Gitea then reports it.

        Closed unmerged is the real gitea/woodpecker/HookPullRequestClosed.json shape (state closed,
        merged false, closed_at set); merged is state closed with merged true, merged_at, merged_by and
        merge_commit_sha. The issue view's `pull_request.merged` follows.
        """
        pull = self.pulls[(repo, number)]
        when = gitea_time()
        pull.update(state="closed", closed_at=when, updated_at=when)
        if state == "merged":
            merger = copy.deepcopy(self.bot)
            pull.update(merged=True, merged_at=when, merged_by=merger, merge_commit_sha=f"{number:040x}")
        elif state != "closed":
            raise ValueError(f"the double sets a pull merged or closed, not {state!r}")
        self.issues[(repo, number)]["pull_request"].update(merged=pull["merged"], merged_at=pull["merged_at"])
        self.issues[(repo, number)]["state"] = "closed"
        return pull

    def merge_pull(self, repo: str, number: int, *, by: str, squash: bool = False) -> dict[str, Any]:
        """A person merges a linked repository's pull: git merges it in the bare repository (a merge commit,
        or a squash), the pull turns merged, and the `pull_request` delivery Gitea sends is returned (the
        shape of gitea/woodpecker/HookPullRequestClosed.json: action closed, with merged true, merged_by,
        merged_at and merge_commit_sha, the commit the merge made, as a merged pull reports them)."""
        from tests.doubles.bare_merge import merge_in_bare

        pull = self.pulls[(repo, number)]
        head, merged = merge_in_bare(self.linked[repo], pull["head"]["ref"], pull["base"]["ref"], squash=squash, by=by)
        pull["head"]["sha"] = head
        self.set_pull_state(repo, number, "merged")
        user = copy.deepcopy(self.users[by])
        pull.update(merged_by=user, merge_commit_sha=merged)
        hook = copy.deepcopy(self._closed_hook)
        hook.update(action="closed", number=number, sender=copy.deepcopy(user), commit_id=head)
        hook["repository"] = {**hook["repository"], "full_name": repo}
        hook["pull_request"] = copy.deepcopy(pull)
        return dict(hook)

    # -- review rounds ---------------------------------------------------------------------

    def set_pull_head(self, repo: str, number: int, sha: str) -> dict[str, Any]:
        """The pull's head branch now ends at `sha` (tests pass the bare git repository's branch head)."""
        pull = self.pulls[(repo, number)]
        pull["head"]["sha"] = sha
        pull["updated_at"] = gitea_time()
        return pull

    def link_repository(self, project: str, bare: Path) -> None:
        """From now on the repository's pulls are answered from the real bare repository `bare` (the one the
        git_http double serves): heads, merge base and `mergeable` are read from it at each request, so a
        push to either branch shows in the next answer (`set_pull_head` is then not needed)."""
        if project not in self.repos:
            raise KeyError(project)
        self.linked[project] = bare

    def set_mergeable_unknown(self, repo: str, number: int, unknown: bool = True) -> dict[str, Any]:
        """Gitea is still checking the pull for conflicts (its status CHECKING, after a push to either branch).

        What Gitea then sends is `"mergeable": false`: the API's `mergeable` is a plain bool, always
        present (modules/structs/pull.go), set from PullRequest.Mergeable() (services/convert/pull.go),
        which is false while the status is CHECKING. So a client cannot tell it from a conflict."""
        key = (repo, number)
        if unknown:
            self.mergeable_unknown.add(key)
        else:
            self.mergeable_unknown.discard(key)
        return self._fresh(repo, self.pulls[key])

    def _fresh(self, repo: str, pull: dict[str, Any]) -> dict[str, Any]:
        """The pull as Gitea would answer it now (changed in place, and returned).

        For an open pull: `mergeable` is Gitea's PullRequest.Mergeable() (models/issues/pull.go): false while
        the conflict check runs, when it found conflicts, or when the title has a WIP prefix. For a linked
        repository also `head.sha` when the branch exists, `base.sha` (the base branch's head) and
        `merge_base`. The field names are Gitea's API ones, as in the shared fixtures
        gitea/go-playground_webhooks/pull-request-event.json (the template: `mergeable`, `merge_base`) and
        forgejo/woodpecker/HookPullRequestEdited.json (`mergeable`, `merge_base`, `base` {ref, sha}).
        A closed or merged pull is left as it was.
        """
        if pull["state"] != "open":
            return pull
        clean: bool | None = True  # an unlinked pull merges cleanly, as the template says
        bare = self.linked.get(repo)
        if bare is not None:
            view = merge_view(bare, pull["head"]["ref"], pull["base"]["ref"])
            if view.source is not None:
                pull["head"]["sha"] = view.source
            if view.target is not None:
                pull["base"]["sha"] = view.target
            if view.base is not None:
                pull["merge_base"] = view.base
            clean = None if view.conflicts is None else not view.conflicts
        title = pull["title"].upper()
        wip = any(title.startswith(prefix.upper()) for prefix in self.wip_prefixes)
        checking = (repo, pull["number"]) in self.mergeable_unknown
        pull["mergeable"] = clean is True and not checking and not wip
        return pull

    def set_pull_ready(self, repo: str, number: int) -> dict[str, Any]:
        """A human marks the pull ready: Gitea drops the title's WIP prefix."""
        pull = self.pulls[(repo, number)]
        title = pull["title"]
        for prefix in self.wip_prefixes:
            if title.upper().startswith(prefix.upper()):
                title = title[len(prefix) :].lstrip()
        pull["title"] = self.issues[(repo, number)]["title"] = title
        self._set_draft(repo, pull)
        return pull

    def add_pr_comment(self, repo: str, number: int, body: str, *, by: str) -> dict[str, Any]:
        """`by` comments on pull `number` (an issue comment, as Gitea stores it)."""
        user = self.users.get(by) or self.add_user(by)
        return self._store_comment(repo, self.issues[(repo, number)], body, user)

    def add_issue_comment(
        self, repo: str, number: int, body: str, *, by: str, created_at: str | None = None
    ) -> dict[str, Any]:
        """`by` comments on issue `number`; `created_at` in the API's form (`gitea_time()`), now by default."""
        user = self.users.get(by) or self.add_user(by)
        return self._store_comment(repo, self.issues[(repo, number)], body, user, created_at=created_at)

    def add_review(
        self,
        repo: str,
        number: int,
        *,
        by: str,
        type: str,
        body: str = "",
        comments: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
    ) -> dict[str, Any]:
        """`by` submits a review: `type` is Gitea's state (REQUEST_CHANGES, COMMENT, APPROVED, PENDING);
        `comments` are line comments {path, line, body} (a negative line is on the old side)."""
        user = self.users.get(by) or self.add_user(by)
        pull = self._fresh(repo, self.pulls[(repo, number)])
        review = copy.deepcopy(self._review_template)
        review_id = next(self._ids)
        review.update(
            id=review_id,
            user=copy.deepcopy(user),
            team=None,
            state=type.upper(),
            body=body,
            commit_id=pull["head"]["sha"],
            stale=False,
            official=False,
            dismissed=False,
            comments_count=len(comments),
            submitted_at=gitea_time(),
            updated_at=gitea_time(),
            html_url=f"{pull['html_url']}#issuecomment-{review_id}",
            pull_request_url=pull["html_url"],
            _comments=[self._review_comment(pull, review_id, user, c) for c in comments],
        )
        self.reviews.setdefault((repo, number), []).append(review)
        return review

    def _review_comment(
        self, pull: dict[str, Any], review_id: int, user: dict[str, Any], spec: dict[str, Any]
    ) -> dict[str, Any]:
        comment_id = next(self._ids)
        line = int(spec.get("line") or 0)
        return {
            "id": comment_id,
            "body": spec["body"],
            "user": copy.deepcopy(user),
            "resolver": None,
            "pull_request_review_id": review_id,
            "created_at": gitea_time(),
            "updated_at": gitea_time(),
            "path": spec["path"],
            "commit_id": pull["head"]["sha"],
            "original_commit_id": pull["head"]["sha"],
            "diff_hunk": "",
            "position": line if line > 0 else 0,
            "original_position": -line if line < 0 else 0,
            "html_url": f"{pull['html_url']}/files#issuecomment-{comment_id}",
            "pull_request_url": pull["html_url"],
        }

    def resolve_review_comment(self, repo: str, number: int, comment_id: int, *, by: str) -> None:
        """`by` marks a line comment's conversation resolved: Gitea then names them as its `resolver`."""
        for review in self.reviews.get((repo, number), []):
            for comment in review["_comments"]:
                if comment["id"] == comment_id:
                    comment["resolver"] = copy.deepcopy(self.users[by])

    def add_status(
        self, repo: str, sha: str, context: str, state: str, description: str = "", target_url: str = ""
    ) -> dict[str, Any]:
        """A CI system reports `state` (pending, success, error, failure, warning) for `context` on `sha`."""
        status = copy.deepcopy(self._status_template)
        status_id = next(self._ids)
        status.update(
            id=status_id,
            status=state,
            context=context,
            description=description,
            target_url=target_url,
            url=f"{self.base_url}/api/v1/repos/{repo}/statuses/{sha}",
            creator=copy.deepcopy(self.bot),
            created_at=gitea_time(),
            updated_at=gitea_time(),
        )
        self.statuses.setdefault((repo, sha), []).append(status)
        return status

    def pr_comments(self, repo: str, number: int) -> list[dict[str, Any]]:
        """The comments on pull `number`, oldest first (what the bot posted included)."""
        return [c for c in self.comments if c["repo"] == repo and c["issue"] == number]

    def open_pulls(self, repo: str) -> list[dict[str, Any]]:
        return [p for (r, _), p in sorted(self.pulls.items()) if r == repo and p["state"] == "open"]

    # -- the API ---------------------------------------------------------------------------

    def route(self, method: str, segments: list[str], query: dict[str, list[str]], body: Any) -> Answer:
        if segments[:3] == ["api", "v1", "teams"] and len(segments) == 6 and segments[4] == "members":
            return self._team_member(segments[3], segments[5]) if method == "GET" else self._not_found()
        if segments[2:] == ["user"] and method == "GET":  # the token's own account
            return Answer(200, self.bot)
        if segments[2:] == ["repos", "search"] and method == "GET":
            return self._search(query)
        if segments[:3] != ["api", "v1", "repos"] or len(segments) < 5:
            return self._not_found()
        repo_name, rest = f"{segments[3]}/{segments[4]}", segments[5:]
        repo = self.repos.get(repo_name)
        if repo is None:
            return self._not_found()
        if not rest and method == "GET":
            return Answer(200, self._as_seen_by_bot(repo_name))
        if rest[:1] == ["collaborators"] and rest[2:] == ["permission"] and method == "GET":
            return self._permission(repo_name, rest[1])
        if rest == ["teams"] and method == "GET":
            return self._repo_teams(repo_name)
        if rest[:1] == ["issues"] and len(rest) >= 2 and rest[1].isdigit():
            issue = self.issues.get((repo_name, int(rest[1])))
            if issue is None:
                return self._not_found()
            if len(rest) == 2 and method == "GET":
                return Answer(200, issue)
            if rest[2:] == ["timeline"] and method == "GET":
                return self._timeline_page(self.timeline[(repo_name, issue["number"])], query)
            if rest[2:] == ["comments"] and method == "POST":
                return self._comment(repo_name, issue, body)
            if rest[2:] == ["comments"] and method == "GET":  # oldest first, all of them (`since` filters)
                since = (query.get("since") or [""])[0]
                found = [
                    {k: v for k, v in c.items() if k not in ("repo", "issue")}
                    for c in self.comments
                    if c["repo"] == repo_name and c["issue"] == issue["number"] and c["updated_at"] >= since
                ]
                return Answer(200, found)
        if rest[:1] == ["commits"] and rest[2:] == ["statuses"] and method == "GET":
            newest_first = sorted(self.statuses.get((repo_name, rest[1].lower()), []), key=lambda x: -x["id"])
            return self._page(newest_first, query, rest, repo_name)
        if rest[:1] == ["pulls"] and len(rest) >= 3 and rest[1].isdigit() and rest[2] == "reviews":
            return self._reviews(repo_name, int(rest[1]), method, rest, query)
        if rest == ["pulls"] and method == "GET":
            state = (query.get("state") or ["open"])[0]
            found = [p for (r, _), p in sorted(self.pulls.items(), reverse=True) if r == repo_name]
            if state != "all":
                found = [p for p in found if p["state"] == state]
            return self._page([self._fresh(repo_name, p) for p in found], query, rest, repo_name)
        if rest == ["pulls"] and method == "POST":
            return self._post_pull(repo_name, body)
        if rest[:1] == ["pulls"] and len(rest) == 2 and rest[1].isdigit():
            pull = self.pulls.get((repo_name, int(rest[1])))
            if pull is None:
                return self._not_found()
            if method == "GET":
                return Answer(200, self._fresh(repo_name, pull))
            if method == "PATCH":
                return self._patch_pull(repo_name, pull, body)
        return self._not_found()

    def _reviews(self, repo: str, number: int, method: str, rest: list[str], query: dict[str, list[str]]) -> Answer:
        """GET a pull's reviews (paged), one review, or one review's line comments (not paged, as Gitea)."""
        if method != "GET" or (repo, number) not in self.pulls:
            return self._not_found()
        reviews = self.reviews.get((repo, number), [])
        shown = [{k: v for k, v in r.items() if k != "_comments"} for r in reviews]
        if len(rest) == 3:
            return self._page(shown, query, rest, repo)
        found = next((r for r in reviews if str(r["id"]) == rest[3]), None)
        if found is None:
            return self._not_found()
        if len(rest) == 4:
            return Answer(200, {k: v for k, v in found.items() if k != "_comments"})
        if rest[4:] == ["comments"]:
            return Answer(200, found["_comments"])
        return self._not_found()

    def _as_seen_by_bot(self, repo_name: str) -> dict[str, Any]:
        """A repository with `permissions` for the token's own account, as Gitea answers it."""
        mode = max(self.permissions.get((repo_name, self.bot["login"]), "none"),
                   self._team_mode(repo_name, self.bot["login"]), key=MODES.index)
        rank = MODES.index(mode)
        permissions = {"admin": rank >= MODES.index("admin"), "push": rank >= MODES.index("write"), "pull": rank >= 1}
        return {**self.repos[repo_name], "permissions": permissions}

    def _search(self, query: dict[str, list[str]]) -> Answer:
        """GET /repos/search: the repositories the token may see, `{"ok": true, "data": [...]}`, paged."""
        page, limit = self._page_bounds(query)
        visible = [self._as_seen_by_bot(name) for name in sorted(self.repos)]
        visible = [r for r in visible if r["permissions"]["pull"] or not r["private"]]
        chunk = visible[(page - 1) * limit : page * limit]
        return Answer(200, {"ok": True, "data": chunk}, {"X-Total-Count": str(len(visible))})

    def _not_found(self) -> Answer:
        return Answer(404, {**NOT_FOUND, "url": f"{self.base_url}/api/swagger"})

    def _page_bounds(self, query: dict[str, list[str]]) -> tuple[int, int]:
        """Gitea's GetListOptions: page 1 at least; a missing or 0 limit is 30, any limit at most the cap."""
        page = max(1, int((query.get("page") or ["1"])[0] or 1))
        limit = int((query.get("limit") or ["0"])[0] or 0)
        limit = DEFAULT_PAGING_NUM if limit <= 0 else limit
        return page, min(limit, self.max_response_items)

    def _timeline_page(self, items: list[Any], query: dict[str, list[str]]) -> Answer:
        """ListIssueCommentsAndTimeline: `null` for an empty page, no Link, a per-page X-Total-Count."""
        page, limit = self._page_bounds(query)
        chunk = [e for e in items[(page - 1) * limit : page * limit] if e["type"] != "code"]
        return Answer(200, chunk or JSON_NULL, {"X-Total-Count": str(len(chunk))})

    def _page(self, items: list[Any], query: dict[str, list[str]], rest: list[str], repo: str) -> Answer:
        page, limit = self._page_bounds(query)
        chunk = items[(page - 1) * limit : page * limit]
        headers = {"X-Total-Count": str(len(items))}
        if page * limit < len(items):
            flat = {k: v[-1] for k, v in query.items()}
            flat.update(page=str(page + 1), limit=str(limit))
            path = f"/api/v1/repos/{repo}/" + "/".join(rest)
            headers["Link"] = f'<{self.base_url}{path}?{urlencode(flat)}>; rel="next"'
        return Answer(200, chunk, headers)

    def _permission(self, repo: str, login: str) -> Answer:
        if login.lower() != self.bot["login"].lower() and not self.bot_repo_admin:
            return Answer(
                403,
                {
                    "message": "Only admins can query all permissions, repo admins can query all repo permissions, "
                    "collaborators can query only their own",
                    "url": f"{self.base_url}/api/swagger",
                },
            )
        user = self.users.get(login)
        if user is None:
            return Answer(404, {"message": f"user redirect does not exist [name: {login}]", "url": ""})
        default = "none" if self.repos[repo]["private"] else "read"
        direct = self.permissions.get((repo, login), default)
        permission = max(direct, self._team_mode(repo, login), key=MODES.index)
        return Answer(200, {"permission": permission, "role_name": permission, "user": user})

    def _repo_teams(self, repo: str) -> Answer:
        """GET /repos/{owner}/{repo}/teams: 405 for a user's repository, else every team with access."""
        org = repo.split("/")[0]
        if all(t["org"] != org for t in self.teams.values()):
            return Answer(405, {"message": "repo is not owned by an organization", "url": ""})
        found = [t for t in self.teams.values() if repo in t["repos"]]
        return Answer(200, [{k: v for k, v in t.items() if k not in ("org", "repos", "members")} for t in found])

    def _team_member(self, team_id: str, login: str) -> Answer:
        """GET /teams/{id}/members/{username}: the user, or 404; 403 when the token may not look."""
        team = self.teams.get(int(team_id)) if team_id.isdigit() else None
        if team is None:
            return self._not_found()
        if not self.bot_org_owner and self.bot["login"] not in team["members"]:
            return Answer(403, {"message": "Must be a team member", "url": f"{self.base_url}/api/swagger"})
        if login not in team["members"]:
            return self._not_found()
        return Answer(200, self.users[login])

    def _comment(self, repo: str, issue: dict[str, Any], body: Any) -> Answer:
        text = body.get("body") if isinstance(body, dict) else None
        if not text:
            return Answer(422, {"message": "[Body]: Required", "url": f"{self.base_url}/api/swagger"})
        return Answer(201, self._store_comment(repo, issue, text, self.bot))

    def _store_comment(
        self, repo: str, issue: dict[str, Any], text: str, user: dict[str, Any], *, created_at: str | None = None
    ) -> dict[str, Any]:
        comment = copy.deepcopy(self._comment_template)
        comment_id = next(self._ids)
        at = created_at or gitea_time()
        comment.update(
            id=comment_id,
            html_url=f"{issue['html_url']}#issuecomment-{comment_id}",
            issue_url=issue["html_url"],
            user=copy.deepcopy(user),
            body=text,
            created_at=at,
            updated_at=at,
        )
        issue["comments"] += 1
        self.comments.append({**comment, "repo": repo, "issue": issue["number"]})
        self.timeline[(repo, issue["number"])].append(
            {**self._timeline_entry(repo, issue["number"], "comment", user["login"], text), "id": comment_id}
        )
        return comment

    def _post_pull(self, repo: str, body: Any) -> Answer:
        body = body if isinstance(body, dict) else {}
        for key in ("head", "base", "title"):
            if not body.get(key):
                return Answer(422, {"message": f"[{key.title()}]: Required", "url": f"{self.base_url}/api/swagger"})
        for (r, _), pull in self.pulls.items():
            same_targets = pull["head"]["ref"] == body["head"] and pull["base"]["ref"] == body["base"]
            if r == repo and pull["state"] == "open" and same_targets:
                return Answer(
                    409,
                    {
                        "message": f"pull request already exists for these targets [id: {pull['id']}, "
                        f"issue_id: {pull['id']}, head_repo_id: {self.repos[repo]['id']}, "
                        f"base_repo_id: {self.repos[repo]['id']}, head_branch: {body['head']}, "
                        f"base_branch: {body['base']}]",
                        "url": f"{self.base_url}/api/swagger",
                    },
                )
        pull = self._create_pull(repo, body["head"], body["base"], body["title"], body.get("body") or "")
        return Answer(201, self._fresh(repo, pull))

    def _create_pull(self, repo_name: str, head: str, base: str, title: str, text: str) -> dict[str, Any]:
        repo = self.repos[repo_name]
        number = self._next_index(repo_name)
        pull = copy.deepcopy(self._pull_template)
        pull.update(
            id=next(self._ids),
            url=f"{self.base_url}/{repo_name}/pulls/{number}",
            number=number,
            user=copy.deepcopy(self.bot),
            title=title,
            body=text,
            labels=[],
            state="open",
            html_url=f"{self.base_url}/{repo_name}/pulls/{number}",
            diff_url=f"{self.base_url}/{repo_name}/pulls/{number}.diff",
            patch_url=f"{self.base_url}/{repo_name}/pulls/{number}.patch",
            merged=False,
            merged_at=None,
            merge_commit_sha=None,
            created_at=gitea_time(),
            updated_at=gitea_time(),
            closed_at=None,
        )
        sha = f"{number:040x}"
        pull["base"] = {"label": base, "ref": base, "sha": sha, "repo_id": repo["id"], "repo": copy.deepcopy(repo)}
        pull["head"] = {"label": head, "ref": head, "sha": sha, "repo_id": repo["id"], "repo": copy.deepcopy(repo)}
        issue = self.add_issue(repo_name, title=title, body=text, author=self.bot["login"])
        issue.update(html_url=pull["html_url"], pull_request={"merged": False, "merged_at": None, "html_url": ""})
        self.pulls[(repo_name, number)] = pull
        self._set_draft(repo_name, pull)
        return pull

    def _patch_pull(self, repo: str, pull: dict[str, Any], body: Any) -> Answer:
        body = body if isinstance(body, dict) else {}
        for key in ("title", "body"):
            if key in body:
                pull[key] = body[key]
                self.issues[(repo, pull["number"])][key] = body[key]
        if body.get("state") in ("open", "closed"):
            pull["state"] = body["state"]
        pull["updated_at"] = gitea_time()
        self._set_draft(repo, pull)
        return Answer(201, self._fresh(repo, pull))

    def _set_draft(self, repo: str, pull: dict[str, Any]) -> None:
        """Gitea's HasWorkInProgressPrefix, reported (1.22+) on the pull request and its issue view."""
        title = pull["title"].upper()
        draft = any(title.startswith(prefix.upper()) for prefix in self.wip_prefixes)
        meta = self.issues[(repo, pull["number"])]["pull_request"]
        meta.update(html_url=pull["html_url"])
        if self.draft_field:
            pull["draft"] = meta["draft"] = draft
        else:
            pull.pop("draft", None)
            meta.pop("draft", None)
