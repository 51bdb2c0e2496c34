"""A stateful GitLab REST API double on 127.0.0.1, built from the shapes of real GitLab answers.

It is a real HTTP/1.1 server (stdlib, a thread per connection), so the real python-gitlab client
talks to it over the wire. The JSON it answers is made from the captured fixtures in
../shared/fixtures/forge (an API merge request, an API issue, API users), with the fields that
matter replaced by the double's state. It records every request, checks PRIVATE-TOKEN, and can
be told to misbehave for the next calls (429 with Retry-After, 5xx, or hang).

`JsonApiDouble` (the server, recording and fault injection) is shared with the Gitea double.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from tests.doubles.git_http import git

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "forge"


def load_fixture(root: Path, relative: str) -> Any:
    path = root / relative
    if not path.is_file():
        raise FileNotFoundError(f"forge fixture {path} is missing; the doubles take their shapes from ../shared")
    return json.loads(path.read_text(encoding="utf-8"))


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


# ---------------------------------------------------------------------------------------------
# The shared HTTP plumbing
# ---------------------------------------------------------------------------------------------


@dataclass
class Recorded:
    """One request as the double received it."""

    method: str
    path: str  # decoded path, without the query
    raw_path: str  # as sent, percent-encoding kept
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: Any  # parsed JSON when it was JSON, else the text
    raw_body: bytes = b""


@dataclass
class Fault:
    """One scripted misbehaviour for a matching request, consumed when used."""

    status: int = 503
    retry_after: str | None = None
    hang_s: float = 0.0
    after: bool = False  # do the work first, then answer the fault (a proxy failing after the forge acted)
    method: str | None = None
    path_contains: str | None = None
    body: Any = field(default_factory=lambda: {"message": "injected fault"})

    def matches(self, method: str, path: str) -> bool:
        if self.method is not None and self.method.upper() != method:
            return False
        return self.path_contains is None or self.path_contains in path


JSON_NULL = object()  # an Answer body sent as the JSON literal `null` (None sends no body at all)


@dataclass
class Answer:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


class JsonApiDouble:
    """A JSON API on 127.0.0.1:<ephemeral port>: records requests, injects faults, routes to `route`."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.requests: list[Recorded] = []
        self.faults: list[Fault] = []
        self.first_fault: Fault | None = None
        self.first_seen: set[tuple[str, str, str]] = set()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name=type(self).__name__, daemon=True
        )
        self._thread.start()

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> JsonApiDouble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- fault injection -------------------------------------------------------------------

    def fail_next(
        self,
        count: int = 1,
        status: int = 503,
        *,
        retry_after: str | float | None = None,
        method: str | None = None,
        path_contains: str | None = None,
        after: bool = False,
        body: Any = None,
    ) -> None:
        """The next `count` matching requests answer `status` (with Retry-After if given).

        With `after=True` the request is carried out first and only the answer is lost, as when a
        proxy times out after the forge acted: a client that simply retries a POST would act twice.
        """
        with self.lock:
            for _ in range(count):
                self.faults.append(
                    Fault(
                        status=status,
                        retry_after=None if retry_after is None else str(retry_after),
                        after=after,
                        method=method,
                        path_contains=path_contains,
                        body=body if body is not None else {"message": f"{status} injected by the double"},
                    )
                )

    def hang_next(
        self,
        count: int = 1,
        seconds: float = 5.0,
        *,
        method: str | None = None,
        path_contains: str | None = None,
        after: bool = False,
    ) -> None:
        """The next `count` matching requests get no answer for `seconds` (the client must time out).

        With `after=True` the forge acts first and then goes silent: the client never learns it did.
        """
        with self.lock:
            for _ in range(count):
                self.faults.append(
                    Fault(status=504, hang_s=seconds, method=method, path_contains=path_contains, after=after)
                )

    def fail_each_first(self, fault: Fault | None) -> None:
        """Every distinct request (method, path, query) gets `fault` the first time it is made.

        One job then meets the fault at every forge call in turn, and each call's retry succeeds.
        `None` switches this off.
        """
        with self.lock:
            self.first_fault = fault
            self.first_seen.clear()

    def _take_fault(self, method: str, path: str, query: str = "") -> Fault | None:
        with self.lock:
            for i, fault in enumerate(self.faults):
                if fault.matches(method, path):
                    return self.faults.pop(i)
            key = (method, path, query)
            if self.first_fault is not None and key not in self.first_seen:
                self.first_seen.add(key)
                return replace(self.first_fault)
        return None

    # -- what tests assert on --------------------------------------------------------------

    def calls(self, method: str | None = None, path_contains: str | None = None) -> list[Recorded]:
        with self.lock:
            return [
                r
                for r in self.requests
                if (method is None or r.method == method.upper()) and (path_contains is None or path_contains in r.path)
            ]

    def sent_text(self) -> str:
        """Everything clients sent in bodies and URLs, as one string: for canary checks."""
        with self.lock:
            return "\n".join(r.raw_path + "\n" + r.raw_body.decode("utf-8", "replace") for r in self.requests)

    # -- to be provided by a forge double --------------------------------------------------

    def authorized(self, headers: dict[str, str]) -> bool:
        raise NotImplementedError

    def unauthorized(self) -> Answer:
        return Answer(401, {"message": "401 Unauthorized"})

    def route(self, method: str, segments: list[str], query: dict[str, list[str]], body: Any) -> Answer:
        raise NotImplementedError

    # -- the HTTP side ---------------------------------------------------------------------

    def _dispatch(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        split = urlsplit(handler.path)
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body: Any = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        headers = {k.lower(): v for k, v in handler.headers.items()}
        path = unquote(split.path)
        query = parse_qs(split.query, keep_blank_values=True)
        with self.lock:
            self.requests.append(Recorded(method, path, split.path, query, headers, body, raw))

        fault = self._take_fault(method, path, split.query)
        if fault is not None and not fault.after:
            if fault.hang_s:
                self._stopping.wait(fault.hang_s)
            answer = self._fault_answer(fault)
        elif not self.authorized(headers):
            answer = self.unauthorized()
        else:
            segments = [unquote(s) for s in split.path.split("/") if s]
            try:
                with self.lock:
                    answer = self.route(method, segments, query, body)
            except Exception as exc:  # a bug in the double must show up as a 500, not a hung client
                answer = Answer(500, {"message": f"double error: {type(exc).__name__}: {exc}"})
            if fault is not None:
                if fault.hang_s:
                    self._stopping.wait(fault.hang_s)
                answer = self._fault_answer(fault)
        self._send(handler, answer)

    @staticmethod
    def _fault_answer(fault: Fault) -> Answer:
        extra = {"Retry-After": fault.retry_after} if fault.retry_after is not None else {}
        return Answer(fault.status, fault.body, extra)

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, answer: Answer) -> None:
        raw = isinstance(answer.body, bytes)  # a plain-text answer (a job trace), sent as it is
        payload = (
            answer.body
            if isinstance(answer.body, bytes)
            else b"null"
            if answer.body is JSON_NULL
            else b""
            if answer.body is None
            else json.dumps(answer.body).encode()
        )
        try:
            handler.send_response(answer.status)
            handler.send_header("Content-Type", "text/plain; charset=utf-8" if raw else "application/json")
            handler.send_header("Content-Length", str(len(payload)))
            for key, value in answer.headers.items():
                handler.send_header(key, value)
            handler.end_headers()
            handler.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (a hang fault): nothing to answer

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as two writes: with Nagle on, the body waits for the client's
            # delayed ACK of the headers, ~40 ms a call that no real forge adds.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                double._dispatch(self, "GET")

            def do_POST(self) -> None:
                double._dispatch(self, "POST")

            def do_PUT(self) -> None:
                double._dispatch(self, "PUT")

            def do_PATCH(self) -> None:
                double._dispatch(self, "PATCH")

            def do_DELETE(self) -> None:
                double._dispatch(self, "DELETE")

        return Handler


def paginate(
    items: list[Any], query: dict[str, list[str]], base_url: str, path: str, *, default_per_page: int = 20
) -> Answer:
    """GitLab-style offset pagination: X-Page/X-Total headers and a Link rel="next"."""
    page = max(1, int((query.get("page") or ["1"])[0] or 1))
    per_page = min(100, max(1, int((query.get("per_page") or [str(default_per_page)])[0] or default_per_page)))
    total_pages = max(1, -(-len(items) // per_page))
    chunk = items[(page - 1) * per_page : page * per_page]
    headers = {
        "X-Page": str(page),
        "X-Per-Page": str(per_page),
        "X-Total": str(len(items)),
        "X-Total-Pages": str(total_pages),
        "X-Prev-Page": str(page - 1) if page > 1 else "",
        "X-Next-Page": str(page + 1) if page < total_pages else "",
    }
    if page < total_pages:
        flat = {k: v[-1] for k, v in query.items()}
        flat.update(page=str(page + 1), per_page=str(per_page))
        headers["Link"] = f'<{base_url}{path}?{urlencode(flat)}>; rel="next"'
    return Answer(200, chunk, headers)


# ---------------------------------------------------------------------------------------------
# The shared git side: what a forge computes from the repository behind a linked project
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeView:
    """An MR's branches as the repository has them now: the source and target heads, their merge base,
    and whether merging the source into the target conflicts (None when a branch is missing or git
    could not say, e.g. unrelated histories)."""

    source: str | None
    target: str | None
    base: str | None
    conflicts: bool | None


def _git_out(bare: Path, *args: str) -> str | None:
    done = git("--git-dir", str(bare), *args)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


@lru_cache(maxsize=1024)
def _merge_conflicts(bare: str, target: str, source: str) -> bool | None:
    """`git merge-tree --write-tree` (git 2.38+): exit 0 merges cleanly, 1 conflicts, anything else unknown.

    Commit ids name their content, so one answer per (repository, target, source) holds for good."""
    done = git("--git-dir", bare, "merge-tree", "--write-tree", "--no-messages", target, source)
    return {0: False, 1: True}.get(done.returncode)


def merge_view(bare: Path, source_branch: str, target_branch: str) -> MergeView:
    """What a forge would compute for an MR from `source_branch` into `target_branch` of the bare repository."""
    source = _git_out(bare, "rev-parse", "--verify", "--quiet", f"refs/heads/{source_branch}^{{commit}}")
    target = _git_out(bare, "rev-parse", "--verify", "--quiet", f"refs/heads/{target_branch}^{{commit}}")
    if source is None or target is None:
        return MergeView(source, target, None, None)
    base = _git_out(bare, "merge-base", target, source)
    return MergeView(source, target, base, _merge_conflicts(str(bare), target, source))


# ---------------------------------------------------------------------------------------------
# GitLab
# ---------------------------------------------------------------------------------------------

GITLAB_DRAFT = re.compile(r"^\s*(\[draft\]|\(draft\)|draft:)", re.I)  # GitLab's MergeRequest::DRAFT_REGEX
DESCRIPTION_LIMIT = 1_048_576  # GitLab rejects longer MR descriptions
NOTE_LIMIT = 1_000_000  # and longer notes


class GitLabDouble(JsonApiDouble):
    """GitLab API v4 for one token: projects, issues, label events, members, merge requests, notes.

    State tests assert on: `mrs` (list of MR dicts, API shape), `notes` (list of issue note dicts with
    `project_id` and `noteable_iid`), `discussions` (the MR threads; `mr_notes` flattens them),
    `pipelines` and `jobs` (with their traces), `requests` (every Recorded request).

    Review rounds: MR discussions and notes (individual notes, threads, DiffNotes with a position) in
    the shape of GitLab's discussions API (gitlab/docs/api_responses/list_merge_request_discussions*.json),
    pipelines and their jobs (get_single_pipeline.json, list_pipeline_jobs.json) with a `scope[]`
    filter, and job traces answered as plain text, as GitLab does.

    Merge status (issue 25): once `link_repository` ties a project to its bare git repository, every MR
    of it that is open is answered as GitLab computes it from the repository at that moment: `sha` and
    `diff_refs` (head_sha, start_sha = the target's head, base_sha = the merge base), `has_conflicts`,
    `merge_status` and `detailed_merge_status` (from `git merge-tree`). `set_merge_checking` plays
    GitLab's asynchronous mergeability check.
    """

    def __init__(self, token: str = "glpat-double-token", *, fixtures: Path = FIXTURES) -> None:
        self.token = token
        self._mr_template = load_fixture(fixtures, "gitlab/go-gitlab/api_responses/get_merge_request.json")
        self._issue_template = load_fixture(fixtures, "gitlab/go-gitlab/api_responses/issue_move.json")
        self._user_template = self._mr_template["author"]
        self._hook_project = load_fixture(fixtures, "gitlab/docs/issue_hook.json")["project"]
        self._merge_hook = load_fixture(fixtures, "gitlab/docs/merge_request_hook.json")
        docs = "gitlab/docs/api_responses/"
        self._note_template = load_fixture(fixtures, docs + "list_merge_request_discussions.json")[0]["notes"][0]
        self._position_template = load_fixture(fixtures, docs + "list_merge_request_discussions_diff_note.json")[0][
            "notes"
        ][0]["position"]
        self._pipeline_template = load_fixture(fixtures, docs + "get_single_pipeline.json")
        self._job_template = load_fixture(fixtures, docs + "list_pipeline_jobs.json")[0]
        self._commit_template = load_fixture(fixtures, "gitlab/go-gitlab/api_responses/get_branch.json")["commit"]
        self.commits: dict[tuple[int, str], dict[str, Any]] = {}
        self.discussions: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self.pipelines: dict[int, dict[str, Any]] = {}
        self.jobs: dict[int, dict[str, Any]] = {}
        self.traces: dict[int, str] = {}
        self.projects: dict[int, dict[str, Any]] = {}
        self.users: dict[str, dict[str, Any]] = {}
        self.members: dict[tuple[int, int], int] = {}
        self.issues: dict[tuple[int, int], dict[str, Any]] = {}
        self.label_events: dict[tuple[int, int], list[dict[str, Any]]] = {}
        self.mrs: list[dict[str, Any]] = []
        self.notes: list[dict[str, Any]] = []
        self.linked: dict[int, Path] = {}  # project id -> the bare repository its MRs are computed from
        self.merge_checking: set[tuple[int, int]] = set()  # (project id, iid) GitLab is still checking
        self._ids = iter(range(1000, 10**9))
        super().__init__()
        self.bot = self.add_user("frogfix-bot", name="FrogFix")

    def authorized(self, headers: dict[str, str]) -> bool:
        return headers.get("private-token") == self.token or headers.get("authorization") == f"Bearer {self.token}"

    # -- building state --------------------------------------------------------------------

    def add_user(self, username: str, *, name: str | None = None) -> dict[str, Any]:
        user = copy.deepcopy(self._user_template)
        user.update(
            id=next(self._ids),
            username=username,
            name=name or username.title(),
            state="active",
            web_url=f"{self.base_url}/{username}",
        )
        self.users[username] = user
        return user

    def add_project(
        self, path: str, *, default_branch: str | None = "main", clone_url: str | None = None
    ) -> dict[str, Any]:
        """A project (API shape); `clone_url` may point at a git_http double."""
        namespace, _, name = path.rpartition("/")
        hook = self._hook_project
        project = {
            "id": next(self._ids),
            "description": hook["description"],
            "name": name,
            "name_with_namespace": f"{namespace} / {name}",
            "path": name,
            "path_with_namespace": path,
            "created_at": now_iso(),
            "default_branch": default_branch,
            "ssh_url_to_repo": f"git@127.0.0.1:{path}.git",
            "http_url_to_repo": clone_url or f"{self.base_url}/{path}.git",
            "web_url": f"{self.base_url}/{path}",
            "avatar_url": hook["avatar_url"],
            "visibility": "private",
            "namespace": {"id": next(self._ids), "name": namespace, "path": namespace, "full_path": namespace},
        }
        self.projects[project["id"]] = project
        return project

    def add_member(self, project: str, username: str, access_level: int) -> None:
        user = self.users.get(username) or self.add_user(username)
        self.members[(self._project(project)["id"], user["id"])] = access_level

    def add_issue(
        self,
        project: str,
        iid: int | None = None,
        *,
        title: str = "Crash on empty input",
        description: str = "Steps to reproduce...",
        labels: tuple[str, ...] = (),
        author: str = "reporter",
        state: str = "opened",
    ) -> dict[str, Any]:
        pid = self._project(project)["id"]
        iid = iid or 1 + max([i for (p, i) in self.issues if p == pid] or [0])
        user = self.users.get(author) or self.add_user(author)
        issue = copy.deepcopy(self._issue_template)
        issue.update(
            id=next(self._ids),
            iid=iid,
            project_id=pid,
            title=title,
            description=description,
            state=state,
            labels=list(labels),
            author=copy.deepcopy(user),
            assignee=None,
            assignees=[],
            created_at=now_iso(),
            updated_at=now_iso(),
            web_url=f"{self.projects[pid]['web_url']}/-/issues/{iid}",
        )
        issue["_links"] = {
            "self": f"{self.base_url}/api/v4/projects/{pid}/issues/{iid}",
            "notes": f"{self.base_url}/api/v4/projects/{pid}/issues/{iid}/notes",
            "award_emoji": f"{self.base_url}/api/v4/projects/{pid}/issues/{iid}/award_emoji",
            "project": f"{self.base_url}/api/v4/projects/{pid}",
        }
        self.issues[(pid, iid)] = issue
        self.label_events[(pid, iid)] = []
        for label in labels:
            self._label_event(pid, iid, label, author, "add")
        return issue

    def add_label(self, project: str, iid: int, label: str, *, by: str) -> None:
        """`by` adds `label` to the issue: the label appears and a resource label event is recorded."""
        pid = self._project(project)["id"]
        issue = self.issues[(pid, iid)]
        if label not in issue["labels"]:
            issue["labels"].append(label)
        self._label_event(pid, iid, label, by, "add")

    def remove_label(self, project: str, iid: int, label: str, *, by: str) -> None:
        pid = self._project(project)["id"]
        issue = self.issues[(pid, iid)]
        if label in issue["labels"]:
            issue["labels"].remove(label)
        self._label_event(pid, iid, label, by, "remove")

    def set_confidential(
        self,
        project: str,
        iid: int,
        confidential: bool = True,
        *,
        title: str | None = None,
        description: str | None = None,
    ) -> None:
        """Someone marks the issue confidential (or public again), maybe rewriting it at the same time.

        Tests call it between stages (after the webhook, during the agent's run) to see each check."""
        issue = self.issues[(self._project(project)["id"], iid)]
        issue["confidential"] = confidential
        issue["updated_at"] = now_iso()
        if title is not None:
            issue["title"] = title
        if description is not None:
            issue["description"] = description

    def _label_event(self, pid: int, iid: int, label: str, by: str, action: str) -> None:
        user = self.users.get(by) or self.add_user(by)
        self.label_events[(pid, iid)].append(
            {
                "id": next(self._ids),
                "user": {k: user[k] for k in ("id", "name", "username", "state", "avatar_url", "web_url")},
                "created_at": now_iso(),
                "resource_type": "Issue",
                "resource_id": self.issues[(pid, iid)]["id"],
                "label": {"id": abs(hash(label)) % 10**6, "name": label, "color": "#428BCA", "description": None},
                "action": action,
            }
        )

    def add_mr(self, project: str, source_branch: str, target_branch: str = "main", title: str = "x") -> dict:
        """An MR that already exists (opened by someone, e.g. an earlier run)."""
        return self._create_mr(self._project(project), source_branch, target_branch, title, "", self.bot)

    def set_mr_state(self, project: str, iid: int, state: str, *, by: str | None = None) -> dict[str, Any]:
        """A human merged (`merged`) or closed (`closed`) an MR, with the fields GitLab then reports.

        The closed shape is the real closed MR in gitlab/atlantis/api_responses/get_merge_request_pull-request.json
        (closed_by, closed_at, detailed_merge_status `not_open`); a merged one sets merged_by/merge_user,
        merged_at and merge_commit_sha instead.
        """
        pid = self._project(project)["id"]
        mr = next(m for m in self.mrs if m["project_id"] == pid and m["iid"] == iid)
        user = copy.deepcopy(self.users[by] if by else self.bot)
        when = now_iso()
        mr.update(state=state, updated_at=when, detailed_merge_status="not_open")
        if state == "merged":
            mr.update(merged_by=user, merge_user=user, merged_at=when, merge_commit_sha=f"{iid:040x}")
        elif state == "closed":
            mr.update(closed_by=user, closed_at=when)
        else:
            raise ValueError(f"the double sets an MR merged or closed, not {state!r}")
        return mr

    def merge_mr(self, project: str, iid: int, *, by: str, squash: bool = False) -> dict[str, Any]:
        """A person presses Merge on a linked project's MR: git merges it in the bare repository (a merge
        commit, or a squash), the MR turns merged, and the Merge Request Hook GitLab sends is returned (the
        shape of gitlab/docs/merge_request_hook.json, with action `merge`, state `merged`, last_commit, and
        merge_commit_sha or, for a squash without a merge commit, squash_commit_sha)."""
        from tests.doubles.bare_merge import merge_in_bare

        pid = self._project(project)["id"]
        mr = next(m for m in self.mrs if m["project_id"] == pid and m["iid"] == iid)
        head, merged = merge_in_bare(self.linked[pid], mr["source_branch"], mr["target_branch"], squash=squash, by=by)
        self.set_mr_state(project, iid, "merged", by=by)
        mr.update(sha=head, merge_commit_sha=None if squash else merged, squash_commit_sha=merged if squash else None)
        hook = copy.deepcopy(self._merge_hook)
        hook["user"] = self._user_ref(self.users[by])
        hook["project"]["path_with_namespace"] = project
        attrs = hook["object_attributes"]
        attrs.update(iid=iid, action="merge", state="merged", source_branch=mr["source_branch"],
                     target_branch=mr["target_branch"], merge_commit_sha=mr["merge_commit_sha"],
                     squash_commit_sha=mr["squash_commit_sha"], squash=squash, updated_at=mr["merged_at"])
        attrs["last_commit"] = {**attrs["last_commit"], "id": head}
        return dict(hook)

    # -- review rounds: MR state, notes and threads, pipelines -------------------------------

    def mr(self, project: str, iid: int) -> dict[str, Any]:
        """The MR as the API would answer it now (a linked project's MR read afresh from its repository)."""
        pid = self._project(project)["id"]
        with self.lock:
            return self._fresh(next(m for m in self.mrs if m["project_id"] == pid and m["iid"] == iid))

    def set_mr_head(self, project: str, iid: int, sha: str) -> dict[str, Any]:
        """The MR's source branch now ends at `sha` (tests pass the bare git repository's branch head)."""
        mr = self.mr(project, iid)
        mr["sha"] = sha
        mr["diff_refs"] = {**(mr.get("diff_refs") or {}), "head_sha": sha}
        mr["updated_at"] = now_iso()
        return mr

    def link_repository(self, project: str, bare: Path) -> None:
        """From now on the project's MRs are answered from the real bare repository `bare` (the one the
        git_http double serves): heads, merge base and conflicts are read from it at each request, so a
        push to either branch shows in the next answer (`set_mr_head` is then not needed)."""
        self.linked[self._project(project)["id"]] = bare

    def set_merge_checking(self, project: str, iid: int, checking: bool = True) -> dict[str, Any]:
        """GitLab is (re)checking whether the MR merges, as it does asynchronously after a push to either
        branch: `merge_status` and `detailed_merge_status` answer `checking` and `has_conflicts` keeps its
        last value until this is set False again. Then a linked MR's status comes from its repository, an
        unlinked one's from its `has_conflicts`."""
        mr = self.mr(project, iid)
        key = (mr["project_id"], iid)
        if checking:
            self.merge_checking.add(key)
        else:
            self.merge_checking.discard(key)
            if mr["project_id"] not in self.linked and mr["state"] == "opened":
                self._set_merge_status(mr, bool(mr.get("has_conflicts")))
        return self._fresh(mr)

    def _fresh(self, mr: dict[str, Any]) -> dict[str, Any]:
        """The MR as GitLab would answer it now (changed in place, and returned).

        For a linked project's open MR: the source head (`sha`, `diff_refs.head_sha`) when the branch
        exists, the target's head (`diff_refs.start_sha`), the merge base (`diff_refs.base_sha`), and the
        merge status. The field names are those of GitLab's API, as in the shared fixture
        gitlab/go-gitlab/api_responses/get_merge_request.json (has_conflicts, merge_status,
        detailed_merge_status, diff_refs) and gitlab/go-gitlab/note_merge_request.json (`"merge_status":
        "cannot_be_merged"`, `"detailed_merge_status": "checking"`). A closed or merged MR is left as it was.
        """
        if mr["state"] != "opened":
            return mr
        checking = (mr["project_id"], mr["iid"]) in self.merge_checking
        bare = self.linked.get(mr["project_id"])
        if bare is not None:
            view = merge_view(bare, mr["source_branch"], mr["target_branch"])
            if view.source is not None:
                mr["sha"] = view.source
            refs = {**(mr.get("diff_refs") or {}), "head_sha": mr["sha"]}
            if view.target is not None:
                refs["start_sha"] = view.target
            if view.base is not None:
                refs["base_sha"] = view.base
            mr["diff_refs"] = refs
            if view.conflicts is not None and not checking:
                self._set_merge_status(mr, view.conflicts)
        if checking:
            mr.update(merge_status="checking", detailed_merge_status="checking")
        return mr

    @staticmethod
    def _set_merge_status(mr: dict[str, Any], conflicts: bool) -> None:
        """GitLab's verdict once its check is done. `detailed_merge_status` is the first failing of
        MergeRequest.all_mergeability_checks, whose draft check comes before the conflict check: a draft
        says `draft_status` whatever its conflicts, and only `has_conflicts` tells them."""
        detailed = "draft_status" if mr.get("draft") else "conflict" if conflicts else "mergeable"
        mr.update(
            has_conflicts=conflicts,
            merge_status="cannot_be_merged" if conflicts else "can_be_merged",
            detailed_merge_status=detailed,
        )

    def set_mr_ready(self, project: str, iid: int) -> dict[str, Any]:
        """A human marks the MR ready: GitLab drops the title's draft prefix."""
        mr = self.mr(project, iid)
        mr["title"] = GITLAB_DRAFT.sub("", mr["title"]).lstrip()
        self._set_draft(mr)
        return mr

    def set_mr_draft(self, project: str, iid: int) -> dict[str, Any]:
        mr = self.mr(project, iid)
        if not GITLAB_DRAFT.match(mr["title"]):
            mr["title"] = "Draft: " + mr["title"]
        self._set_draft(mr)
        return mr

    def add_mr_note(
        self,
        project: str,
        iid: int,
        body: str,
        *,
        by: str,
        position: dict[str, Any] | None = None,
        discussion_id: str | None = None,
        system: bool = False,
    ) -> dict[str, Any]:
        """`by` comments on the MR: a plain note (its own discussion), a DiffNote (`position` with at least
        new_path and new_line: a resolvable thread), or a reply in thread `discussion_id`. Returns the note."""
        mr = self.mr(project, iid)
        user = self.users.get(by) or self.add_user(by)
        threads = self.discussions.setdefault((mr["project_id"], iid), [])
        if discussion_id is not None:
            thread = next(d for d in threads if d["id"] == discussion_id)
            first = thread["notes"][0]
            position = first.get("position")
            kind = first["type"] if first["type"] == "DiffNote" else "DiscussionNote"
            thread["individual_note"] = False
        else:
            kind = "DiffNote" if position else None
            thread = {"id": f"{next(self._ids):040x}", "individual_note": position is None, "notes": []}
            threads.append(thread)
        note = self._mr_note(mr, body, user, kind=kind, position=position, system=system)
        if thread["notes"] and thread["notes"][0].get("resolvable"):  # a reply in a thread shares its state
            note.update(resolvable=True, resolved=thread["notes"][0].get("resolved", False), resolved_by=None)
        thread["notes"].append(note)
        mr["user_notes_count"] = int(mr.get("user_notes_count") or 0) + (0 if system else 1)
        return note

    def resolve_discussion(self, project: str, iid: int, discussion_id: str, *, by: str) -> None:
        """`by` resolves a thread: every resolvable note of it says so."""
        mr = self.mr(project, iid)
        user = self.users[by]
        for thread in self.discussions.get((mr["project_id"], iid), []):
            if thread["id"] == discussion_id:
                for note in thread["notes"]:
                    if note.get("resolvable"):
                        note.update(resolved=True, resolved_by=self._user_ref(user), resolved_at=now_iso())

    def mr_notes(self, project: str, iid: int) -> list[dict[str, Any]]:
        """Every note on the MR, oldest first, each with its `discussion_id` added (what the bot posted included)."""
        pid = self._project(project)["id"]
        found = [
            {**note, "discussion_id": thread["id"]}
            for thread in self.discussions.get((pid, iid), [])
            for note in thread["notes"]
        ]
        return sorted(found, key=lambda n: n["id"])

    def _user_ref(self, user: dict[str, Any]) -> dict[str, Any]:
        return {k: user[k] for k in ("id", "name", "username", "state", "avatar_url", "web_url")}

    def _mr_note(
        self,
        mr: dict[str, Any],
        body: str,
        user: dict[str, Any],
        *,
        kind: str | None,
        position: dict[str, Any] | None,
        system: bool = False,
    ) -> dict[str, Any]:
        note = copy.deepcopy(self._note_template)
        note.update(
            id=next(self._ids),
            type=kind,
            body=body,
            author=self._user_ref(user),
            created_at=now_iso(),
            updated_at=now_iso(),
            system=system,
            noteable_id=mr["id"],
            noteable_type="MergeRequest",
            project_id=mr["project_id"],
            noteable_iid=mr["iid"],
        )
        if kind == "DiffNote" and position is not None:
            note["position"] = {
                **copy.deepcopy(self._position_template),
                "head_sha": mr.get("sha"),
                "old_path": position.get("new_path"),
                "old_line": None,
                **position,
            }
            note["commit_id"] = mr.get("sha")
            note.update(resolvable=True, resolved=False, resolved_by=None, resolved_at=None)
        else:
            note.update(resolvable=False)
            for key in ("resolved", "resolved_by", "resolved_at"):
                note.pop(key, None)
        return note

    def add_pipeline(
        self,
        project: str,
        *,
        sha: str,
        ref: str,
        status: str,
        jobs: list[dict[str, Any]] | tuple[dict[str, Any], ...] = (),
        source: str = "push",
    ) -> dict[str, Any]:
        """A finished pipeline on `sha` with `jobs` ({name, stage, status, trace, allow_failure}); returns it."""
        pid = self._project(project)["id"]
        pipeline = copy.deepcopy(self._pipeline_template)
        pipeline_id = next(self._ids)
        web = self.projects[pid]["web_url"]
        pipeline.update(
            id=pipeline_id,
            iid=1 + sum(1 for p in self.pipelines.values() if p["project_id"] == pid),
            project_id=pid,
            sha=sha,
            ref=ref,
            status=status,
            source=source,
            created_at=now_iso(),
            updated_at=now_iso(),
            web_url=f"{web}/-/pipelines/{pipeline_id}",
        )
        self.pipelines[pipeline_id] = pipeline
        for spec in jobs:
            self._add_job(pipeline, spec)
        return pipeline

    def _add_job(self, pipeline: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
        job = copy.deepcopy(self._job_template)
        job_id = next(self._ids)
        status = spec.get("status", "failed")
        job.update(
            id=job_id,
            name=spec["name"],
            stage=spec.get("stage", "test"),
            status=status,
            allow_failure=bool(spec.get("allow_failure", False)),
            failure_reason="script_failure" if status == "failed" else None,
            ref=pipeline["ref"],
            pipeline={k: pipeline[k] for k in ("id", "project_id", "ref", "sha", "status")},
            web_url=f"{self.projects[pipeline['project_id']]['web_url']}/-/jobs/{job_id}",
            created_at=now_iso(),
        )
        job["commit"] = {**job["commit"], "id": pipeline["sha"], "short_id": pipeline["sha"][:8]}
        self.jobs[job_id] = job
        self.traces[job_id] = str(spec.get("trace") or "")
        return job

    def add_commit(self, project: str, sha: str, *, parents: list[str], title: str = "a commit") -> dict[str, Any]:
        """A commit the API shows (GET repository/commits/:sha), e.g. the merge commit GitLab makes for a
        merged results pipeline: `parents` = [the target's head, the MR's head]."""
        pid = self._project(project)["id"]
        commit = copy.deepcopy(self._commit_template)
        commit.update(id=sha, short_id=sha[:8], title=title, message=title, parent_ids=list(parents))
        self.commits[(pid, sha)] = commit
        return commit

    # -- lookups ---------------------------------------------------------------------------

    def _project(self, ref: str | int) -> dict[str, Any]:
        for project in self.projects.values():
            if str(project["id"]) == str(ref) or project["path_with_namespace"] == ref:
                return project
        raise KeyError(ref)

    def open_mrs(self, project: str) -> list[dict[str, Any]]:
        pid = self._project(project)["id"]
        return [m for m in self.mrs if m["project_id"] == pid and m["state"] == "opened"]

    # -- the API ---------------------------------------------------------------------------

    def route(self, method: str, segments: list[str], query: dict[str, list[str]], body: Any) -> Answer:
        if segments[:2] != ["api", "v4"]:
            return Answer(404, {"message": "404 Not Found"})
        seg = segments[2:]
        if seg == ["users"] and method == "GET":
            name = (query.get("username") or [""])[0]
            found = [u for u in self.users.values() if u["username"].lower() == name.lower()] if name else []
            return paginate(found, query, self.base_url, "/api/v4/users")
        if seg == ["user"] and method == "GET":  # the token's own account
            return Answer(200, self.bot)
        if seg == ["projects"] and method == "GET":
            return paginate(self._visible_projects(query), query, self.base_url, "/api/v4/projects")
        if not seg or seg[0] != "projects" or len(seg) < 2:
            return Answer(404, {"message": "404 Not Found"})
        try:
            project = self._project(seg[1])
        except KeyError:
            return Answer(404, {"message": "404 Project Not Found"})
        pid, rest = project["id"], seg[2:]
        base_path = "/api/v4/projects/" + str(pid)

        if not rest and method == "GET":
            return Answer(200, {**project, "permissions": self._bot_permissions(pid)})
        if rest[:2] == ["members", "all"] and len(rest) == 3 and method == "GET":
            return self._member(pid, rest[2])
        if rest[:1] == ["issues"] and len(rest) >= 2:
            issue = self.issues.get((pid, int(rest[1]))) if rest[1].isdigit() else None
            if issue is None:
                return Answer(404, {"message": "404 Issue Not Found"})
            if len(rest) == 2 and method == "GET":
                return Answer(200, issue)
            if rest[2:] == ["resource_label_events"] and method == "GET":
                events = self.label_events[(pid, issue["iid"])]
                return paginate(
                    events, query, self.base_url, f"{base_path}/issues/{issue['iid']}/resource_label_events"
                )
            if rest[2:] == ["notes"] and method == "POST":
                return self._note(pid, issue, body)
            if rest[2:] == ["notes"] and method == "GET":  # GitLab's default order: newest first
                found = [n for n in self.notes if n["project_id"] == pid and n["noteable_iid"] == issue["iid"]]
                found.sort(key=lambda n: n["id"], reverse=(query.get("sort") or ["desc"])[0] != "asc")
                return paginate(found, query, self.base_url, f"{base_path}/issues/{issue['iid']}/notes")
        if rest == ["merge_requests"] and method == "GET":
            found = [m for m in self.mrs if m["project_id"] == pid]
            for key in ("state", "source_branch", "target_branch"):
                wanted = (query.get(key) or [None])[0]
                if wanted and not (key == "state" and wanted == "all"):
                    found = [m for m in found if m[key] == wanted]
            found.sort(key=lambda m: m["created_at"], reverse=True)
            return paginate([self._fresh(m) for m in found], query, self.base_url, f"{base_path}/merge_requests")
        if rest == ["merge_requests"] and method == "POST":
            return self._post_mr(project, body)
        if rest[:1] == ["merge_requests"] and len(rest) >= 3 and rest[1].isdigit():
            return self._mr_threads(pid, int(rest[1]), method, rest[2:], query, body)
        if rest[:1] == ["pipelines"] or rest[:1] == ["jobs"]:
            return self._ci(pid, method, rest, query)
        if rest[:2] == ["repository", "commits"] and len(rest) == 3 and method == "GET":
            commit = self.commits.get((pid, rest[2]))
            return Answer(200, commit) if commit is not None else Answer(404, {"message": "404 Commit Not Found"})
        if rest[:1] == ["merge_requests"] and len(rest) == 2 and rest[1].isdigit():
            mr = next((m for m in self.mrs if m["project_id"] == pid and m["iid"] == int(rest[1])), None)
            if mr is None:
                return Answer(404, {"message": "404 Not found"})
            if method == "GET":
                return Answer(200, self._fresh(mr))
            if method == "PUT":
                return self._put_mr(mr, body)
        return Answer(404, {"message": "404 Not Found"})

    def _mr_threads(
        self, pid: int, iid: int, method: str, rest: list[str], query: dict[str, list[str]], body: Any
    ) -> Answer:
        """MR notes and discussions: list, read one thread, start a note, reply in a thread (as the bot)."""
        mr = next((m for m in self.mrs if m["project_id"] == pid and m["iid"] == iid), None)
        if mr is None:
            return Answer(404, {"message": "404 Not found"})
        base_path = f"/api/v4/projects/{pid}/merge_requests/{iid}/" + "/".join(rest)
        threads = self.discussions.setdefault((pid, iid), [])
        text = str(body.get("body") or "") if isinstance(body, dict) else ""
        if method == "POST" and not text:
            return Answer(400, {"message": {"note": ["can't be blank"]}})
        if method == "POST" and len(text) > NOTE_LIMIT:
            return Answer(400, {"message": {"note": ["is too long (maximum is 1000000 characters)"]}})
        project = self.projects[pid]["path_with_namespace"]
        if rest == ["discussions"] and method == "GET":
            return paginate(threads, query, self.base_url, base_path)
        if rest == ["discussions"] and method == "POST":
            note = self.add_mr_note(project, iid, text, by=self.bot["username"], position=body.get("position"))
            return Answer(201, next(d for d in threads if d["notes"][-1] is note))
        if rest[:1] == ["discussions"] and len(rest) in (2, 3):
            thread = next((d for d in threads if d["id"] == rest[1]), None)
            if thread is None:
                return Answer(404, {"message": "404 Discussion Not Found"})
            if len(rest) == 2 and method == "GET":
                return Answer(200, thread)
            if rest[2:] == ["notes"] and method == "POST":
                return Answer(201, self.add_mr_note(project, iid, text, by=self.bot["username"], discussion_id=rest[1]))
        if rest == ["notes"] and method == "GET":  # GitLab's default order: newest first
            notes = [n for d in threads for n in d["notes"]]
            notes.sort(key=lambda n: n["id"], reverse=(query.get("sort") or ["desc"])[0] != "asc")
            return paginate(notes, query, self.base_url, base_path)
        if rest == ["notes"] and method == "POST":
            return Answer(201, self.add_mr_note(project, iid, text, by=self.bot["username"]))
        return Answer(404, {"message": "404 Not Found"})

    def _ci(self, pid: int, method: str, rest: list[str], query: dict[str, list[str]]) -> Answer:
        """Pipelines, a pipeline's jobs (`scope[]` filters by status), a job, and a job's trace as plain text."""
        if method != "GET" or len(rest) < 2 or not rest[1].isdigit():
            return Answer(404, {"message": "404 Not Found"})
        base_path = f"/api/v4/projects/{pid}/" + "/".join(rest)
        if rest[0] == "pipelines":
            pipeline = self.pipelines.get(int(rest[1]))
            if pipeline is None or pipeline["project_id"] != pid:
                return Answer(404, {"message": "404 Not found"})
            if len(rest) == 2:
                return Answer(200, pipeline)
            if rest[2:] == ["jobs"]:
                scope = set(query.get("scope[]") or []) | set(query.get("scope") or [])
                found = [j for j in self.jobs.values() if j["pipeline"]["id"] == pipeline["id"]]
                found = [j for j in found if not scope or j["status"] in scope]
                return paginate(found, query, self.base_url, base_path)
        job = self.jobs.get(int(rest[1])) if rest[0] == "jobs" else None
        if job is None or job["pipeline"]["project_id"] != pid:
            return Answer(404, {"message": "404 Not found"})
        if len(rest) == 2:
            return Answer(200, job)
        if rest[2:] == ["trace"] and job["id"] in self.traces:  # a test pops a trace to erase it
            return Answer(200, self.traces[job["id"]].encode())
        return Answer(404, {"message": "404 Not Found"})

    def _bot_permissions(self, pid: int) -> dict[str, Any]:
        """A project's `permissions` as GitLab reports them for the token's own account."""
        level = self.members.get((pid, self.bot["id"]))
        access = {"access_level": level, "notification_level": 3} if level is not None else None
        return {"project_access": access, "group_access": None}

    def _visible_projects(self, query: dict[str, list[str]]) -> list[dict[str, Any]]:
        """GET /projects: `membership=true` keeps the bot's projects, `min_access_level` its level and up."""
        found = sorted(self.projects.values(), key=lambda p: p["id"])
        if (query.get("membership") or ["false"])[0] == "true":
            found = [p for p in found if (p["id"], self.bot["id"]) in self.members]
        least = int((query.get("min_access_level") or ["0"])[0] or 0)
        if least:
            found = [p for p in found if self.members.get((p["id"], self.bot["id"]), 0) >= least]
        return found

    def _member(self, pid: int, user_ref: str) -> Answer:
        user = next((u for u in self.users.values() if str(u["id"]) == user_ref), None)
        level = self.members.get((pid, user["id"])) if user else None
        if user is None or level is None:
            return Answer(404, {"message": "404 Not found"})
        member = {k: user[k] for k in ("id", "username", "name", "state", "avatar_url", "web_url")}
        member.update(access_level=level, created_at=now_iso(), expires_at=None, membership_state="active")
        return Answer(200, member)

    def _note(self, pid: int, issue: dict[str, Any], body: Any) -> Answer:
        text = (body or {}).get("body") if isinstance(body, dict) else None
        if not text:
            return Answer(400, {"message": {"note": ["can't be blank"]}})
        if len(text) > NOTE_LIMIT:
            return Answer(400, {"message": {"note": ["is too long (maximum is 1000000 characters)"]}})
        return Answer(201, self._issue_note(pid, issue, text, self.bot))

    def _issue_note(
        self,
        pid: int,
        issue: dict[str, Any],
        text: str,
        user: dict[str, Any],
        *,
        system: bool = False,
        internal: bool = False,
        created_at: str | None = None,
    ) -> dict[str, Any]:
        """An issue note in the shape of GitLab's notes API (GET /projects/:id/issues/:iid/notes)."""
        at = created_at or now_iso()
        note = {
            "id": next(self._ids),
            "type": None,
            "body": text,
            "attachment": None,
            "author": copy.deepcopy(user),
            "created_at": at,
            "updated_at": at,
            "system": system,
            "noteable_id": issue["id"],
            "noteable_type": "Issue",
            "project_id": pid,
            "noteable_iid": issue["iid"],
            "resolvable": False,
            "confidential": internal,
            "internal": internal,
        }
        self.notes.append(note)
        return note

    def add_issue_note(
        self,
        project: str,
        iid: int,
        body: str,
        *,
        by: str,
        system: bool = False,
        internal: bool = False,
        created_at: str | None = None,
    ) -> dict[str, Any]:
        """`by` comments on issue `iid` (a system note is GitLab's own record of a change; an internal note
        only members see); `created_at` in the API's form (`now_iso()`), now by default."""
        pid = self._project(project)["id"]
        user = self.users.get(by) or self.add_user(by)
        return self._issue_note(pid, self.issues[(pid, iid)], body, user, system=system, internal=internal,
                                created_at=created_at)

    def _post_mr(self, project: dict[str, Any], body: Any) -> Answer:
        body = body if isinstance(body, dict) else {}
        missing = [k for k in ("source_branch", "target_branch", "title") if not body.get(k)]
        if missing:
            return Answer(400, {"error": f"{', '.join(missing)} is missing"})
        if len(str(body.get("description") or "")) > DESCRIPTION_LIMIT:
            return Answer(400, {"message": {"description": ["is too long (maximum is 1048576 characters)"]}})
        for mr in self.mrs:
            if (
                mr["project_id"] == project["id"]
                and mr["state"] == "opened"
                and mr["source_branch"] == body["source_branch"]
                and mr["target_branch"] == body["target_branch"]
            ):
                return Answer(
                    409,
                    {"message": [f"Another open merge request already exists for this source branch: !{mr['iid']}"]},
                )
        mr = self._create_mr(
            project,
            body["source_branch"],
            body["target_branch"],
            body["title"],
            body.get("description") or "",
            self.bot,
        )
        return Answer(201, self._fresh(mr))

    def _create_mr(
        self, project: dict[str, Any], source: str, target: str, title: str, description: str, author: dict[str, Any]
    ) -> dict[str, Any]:
        pid = project["id"]
        iid = 1 + max([m["iid"] for m in self.mrs if m["project_id"] == pid] or [0])
        mr = copy.deepcopy(self._mr_template)
        mr.update(
            id=next(self._ids),
            iid=iid,
            project_id=pid,
            source_project_id=pid,
            target_project_id=pid,
            title=title,
            description=description,
            state="opened",
            source_branch=source,
            target_branch=target,
            created_at=now_iso(),
            updated_at=now_iso(),
            author=copy.deepcopy(author),
            assignee=None,
            assignees=[],
            reviewers=[],
            labels=[],
            milestone=None,
            user_notes_count=0,
            upvotes=0,
            merged_by=None,
            merged_at=None,
            pipeline=None,
            head_pipeline=None,
            has_conflicts=False,
            first_contribution=False,
            changes_count=None,
            reference=f"!{iid}",
            web_url=f"{project['web_url']}/-/merge_requests/{iid}",
            detailed_merge_status="checking",
            merge_status="checking",
        )
        mr["sha"] = f"{mr['id']:040x}"  # until a test says where the branch is (`set_mr_head`)
        mr["diff_refs"] = {**(mr.get("diff_refs") or {}), "head_sha": mr["sha"]}
        self._set_draft(mr)
        self.mrs.append(mr)
        return mr

    def _put_mr(self, mr: dict[str, Any], body: Any) -> Answer:
        body = body if isinstance(body, dict) else {}
        if len(str(body.get("description") or "")) > DESCRIPTION_LIMIT:
            return Answer(400, {"message": {"description": ["is too long (maximum is 1048576 characters)"]}})
        for key in ("title", "description", "target_branch"):
            if key in body:
                mr[key] = body[key]
        if body.get("state_event") == "close":
            mr["state"] = "closed"
        mr["updated_at"] = now_iso()
        self._set_draft(mr)
        return Answer(200, self._fresh(mr))

    @staticmethod
    def _set_draft(mr: dict[str, Any]) -> None:
        draft = bool(GITLAB_DRAFT.match(mr["title"]))
        mr["draft"] = draft
        mr["work_in_progress"] = draft


def iter_json_values(value: Any) -> Iterator[str]:
    """Every string inside a JSON value (for canary checks on what was posted)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from iter_json_values(v)
    elif isinstance(value, list):
        for v in value:
            yield from iter_json_values(v)
