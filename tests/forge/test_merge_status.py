"""What each forge says of merging the MR into its target (issue 25): `MergeRequest.conflicts` and `target_sha`.

The real clients talk over HTTP to the doubles, whose MR/PR answers are computed from a real bare git
repository (`link_repository`): pushing a commit to a branch there is what moves the forge's answer.
The parsing is also checked on the shared fixtures (real forge answers; skipped without ../shared) and
on hand-written answers for the cases the fixtures do not show.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from app.forge.gitea_api import GiteaForge, gitea_conflicts
from app.forge.gitlab_api import GitLabForge, gitlab_conflicts
from app.retrying import RetryPolicy
from tests.conftest import shared_fixture
from tests.doubles.git_http import bare_repo_from, git, make_worktree
from tests.doubles.gitea_api import GiteaDouble
from tests.doubles.gitlab_api import GitLabDouble

P = "acme/widgets"
BRANCH = "frogfix/issue-1"
BASE_FILES = {"calc.py": "def add(a, b):\n    return a - b\n", "README.md": "calc\n"}


@dataclass
class Repo:
    """A bare repository the doubles read, and a working clone that pushes to it."""

    bare: Path
    work: Path

    def head(self, branch: str) -> str:
        return self._git("rev-parse", f"refs/remotes/origin/{branch}")

    def commit(self, branch: str, files: dict[str, str], message: str, *, start: str | None = None) -> str:
        """Commit `files` on `branch` and push it (forced when `start` rebuilds it elsewhere); the new head.

        The commit goes on the branch's head, or on `start` (a remote branch name), or on main when new."""
        exists = git("rev-parse", "--verify", "--quiet", f"refs/remotes/origin/{branch}", cwd=self.work)
        base = start or (branch if exists.returncode == 0 else "main")
        self._git("checkout", "-q", "-B", branch, f"origin/{base}")
        for name, text in files.items():
            (self.work / name).write_text(text, encoding="utf-8")
        self._git("add", "-A")
        self._git("commit", "-q", "-m", message)
        self._git("push", "-q", "-f", "origin", f"HEAD:refs/heads/{branch}")
        self._git("fetch", "-q", "origin")
        return self.head(branch)

    def merge_base(self, one: str, other: str) -> str:
        return self._git("merge-base", one, other)

    def _git(self, *args: str) -> str:
        done = git(*args, cwd=self.work)
        if done.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} failed: {done.stderr}")
        return done.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    source = make_worktree(tmp_path / "src", BASE_FILES)
    bare = bare_repo_from(source, tmp_path / "git", f"{P}.git")
    work = tmp_path / "work"
    done = git("clone", "-q", str(bare), str(work))
    assert done.returncode == 0, done.stderr
    made = Repo(bare, work)
    made.commit(BRANCH, {"calc.py": "def add(a, b):\n    return a + b\n"}, "fix add")
    return made


def conflicting_main(repo: Repo) -> str:
    """Someone changes the same line on main: the fix branch no longer merges cleanly."""
    return repo.commit("main", {"calc.py": "def add(a, b):\n    return b - a\n"}, "rewrite add on main")


def unrelated_main(repo: Repo) -> str:
    """Main moves on elsewhere: the fix still merges cleanly."""
    return repo.commit("main", {"README.md": "calc, the calculator\n"}, "readme")


# ---------------------------------------------------------------------------------------------
# GitLab, through python-gitlab against the double
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def gitlab_forge(gitlab_double: GitLabDouble, retry: RetryPolicy) -> Iterator[GitLabForge]:
    forge = GitLabForge(gitlab_double.base_url, gitlab_double.token, retry=retry, timeout=5.0)
    try:
        yield forge
    finally:
        forge.close()


def test_gitlab_clean_merge(gitlab_double: GitLabDouble, gitlab_forge: GitLabForge, repo: Repo) -> None:
    gitlab_double.link_repository(P, repo.bare)
    created = gitlab_forge.create_draft_mr(P, BRANCH, "main", "Fix add", "body")
    main, head = repo.head("main"), repo.head(BRANCH)
    assert (created.conflicts, created.target_sha, created.head_sha) == (False, main, head)
    mr = gitlab_forge.get_mr(P, created.number)
    assert (mr.conflicts, mr.target_sha, mr.head_sha, mr.draft) == (False, main, head, True)
    raw = gitlab_double.mr(P, created.number)
    assert raw["diff_refs"] == {"base_sha": repo.merge_base(main, head), "head_sha": head, "start_sha": main}
    # A draft is `draft_status` (GitLab's draft check comes before its conflict check): has_conflicts tells.
    assert (raw["has_conflicts"], raw["merge_status"], raw["detailed_merge_status"]) == (
        False,
        "can_be_merged",
        "draft_status",
    )


def test_gitlab_target_moving_without_conflict(
    gitlab_double: GitLabDouble, gitlab_forge: GitLabForge, repo: Repo
) -> None:
    gitlab_double.link_repository(P, repo.bare)
    created = gitlab_forge.create_draft_mr(P, BRANCH, "main", "Fix add", "body")
    before = created.target_sha
    moved = unrelated_main(repo)
    mr = gitlab_forge.get_mr(P, created.number)
    assert (mr.conflicts, mr.target_sha) == (False, moved) and moved != before
    assert gitlab_double.mr(P, created.number)["diff_refs"]["base_sha"] == before  # the fork point stays


def test_gitlab_conflicting_commit_on_the_target(
    gitlab_double: GitLabDouble, gitlab_forge: GitLabForge, repo: Repo
) -> None:
    gitlab_double.link_repository(P, repo.bare)
    created = gitlab_forge.create_draft_mr(P, BRANCH, "main", "Fix add", "body")
    moved = conflicting_main(repo)
    mr = gitlab_forge.get_mr(P, created.number)
    assert (mr.conflicts, mr.target_sha, mr.head_sha) == (True, moved, repo.head(BRANCH))
    raw = gitlab_double.mr(P, created.number)
    assert (raw["has_conflicts"], raw["merge_status"], raw["detailed_merge_status"]) == (
        True,
        "cannot_be_merged",
        "draft_status",
    )
    gitlab_double.set_mr_ready(P, created.number)  # a ready MR names the conflict itself
    assert gitlab_double.mr(P, created.number)["detailed_merge_status"] == "conflict"
    assert gitlab_forge.get_mr(P, created.number).conflicts is True
    # the fix branch is rebuilt on the new main: clean again, and the listing says so too
    rebuilt = repo.commit(BRANCH, {"calc.py": "def add(a, b):\n    return a + b\n"}, "fix add again", start="main")
    found = gitlab_forge.find_open_mr(P, BRANCH)
    assert found is not None and (found.conflicts, found.target_sha, found.head_sha) == (False, moved, rebuilt)


def test_gitlab_still_checking_says_nothing(
    gitlab_double: GitLabDouble, gitlab_forge: GitLabForge, repo: Repo
) -> None:
    gitlab_double.link_repository(P, repo.bare)
    created = gitlab_forge.create_draft_mr(P, BRANCH, "main", "Fix add", "body")
    gitlab_double.set_merge_checking(P, created.number)
    moved = conflicting_main(repo)
    mr = gitlab_forge.get_mr(P, created.number)
    assert (mr.conflicts, mr.target_sha) == (None, moved)
    raw = gitlab_double.mr(P, created.number)
    # GitLab keeps the last verdict in has_conflicts while it checks: only the status says it is stale
    assert (raw["merge_status"], raw["detailed_merge_status"], raw["has_conflicts"]) == ("checking", "checking", False)
    gitlab_double.set_merge_checking(P, created.number, False)
    assert gitlab_forge.get_mr(P, created.number).conflicts is True


def test_gitlab_closed_or_merged_says_nothing(
    gitlab_double: GitLabDouble, gitlab_forge: GitLabForge, repo: Repo
) -> None:
    gitlab_double.link_repository(P, repo.bare)
    created = gitlab_forge.create_draft_mr(P, BRANCH, "main", "Fix add", "body")
    conflicting_main(repo)
    gitlab_double.set_mr_state(P, created.number, "closed", by="maint")
    assert gitlab_forge.get_mr(P, created.number).conflicts is None


def test_gitlab_unlinked_project_keeps_set_mr_head(gitlab_double: GitLabDouble, gitlab_forge: GitLabForge) -> None:
    """Without a repository the double answers as before: a new MR is still being checked."""
    created = gitlab_forge.create_draft_mr(P, BRANCH, "main", "Fix add", "body")
    sha = "3f1c0d9e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e"
    gitlab_double.set_mr_head(P, created.number, sha)
    mr = gitlab_forge.get_mr(P, created.number)
    assert (mr.head_sha, mr.conflicts) == (sha, None)
    gitlab_double.set_merge_checking(P, created.number, False)
    assert gitlab_forge.get_mr(P, created.number).conflicts is False


# ---------------------------------------------------------------------------------------------
# Gitea / Forgejo, through httpx against the double
# ---------------------------------------------------------------------------------------------


@pytest.fixture
def gitea_forge(gitea_double: GiteaDouble, retry: RetryPolicy) -> Iterator[GiteaForge]:
    forge = GiteaForge(gitea_double.base_url, gitea_double.token, retry=retry, timeout=5.0)
    try:
        yield forge
    finally:
        forge.close()


def test_gitea_clean_merge(gitea_double: GiteaDouble, gitea_forge: GiteaForge, repo: Repo) -> None:
    gitea_double.link_repository(P, repo.bare)
    pull = gitea_double.add_pull(P, BRANCH, title="Fix add")  # ready: no WIP prefix
    main, head = repo.head("main"), repo.head(BRANCH)
    mr = gitea_forge.get_mr(P, pull["number"])
    assert (mr.conflicts, mr.target_sha, mr.head_sha, mr.draft) == (False, main, head, False)
    raw = gitea_double.pulls[(P, pull["number"])]
    assert (raw["mergeable"], raw["base"]["sha"], raw["merge_base"]) == (True, main, repo.merge_base(main, head))
    moved = unrelated_main(repo)
    assert (gitea_forge.get_mr(P, pull["number"]).conflicts, raw["base"]["sha"]) == (False, moved)


def test_gitea_conflicting_commit_on_the_target(
    gitea_double: GiteaDouble, gitea_forge: GiteaForge, repo: Repo
) -> None:
    gitea_double.link_repository(P, repo.bare)
    pull = gitea_double.add_pull(P, BRANCH, title="Fix add")
    moved = conflicting_main(repo)
    mr = gitea_forge.get_mr(P, pull["number"])
    assert (mr.conflicts, mr.target_sha, mr.head_sha) == (True, moved, repo.head(BRANCH))
    found = gitea_forge.find_open_mr(P, BRANCH)
    assert found is not None and (found.conflicts, found.target_sha) == (True, moved)


def test_gitea_draft_is_never_mergeable(gitea_double: GiteaDouble, gitea_forge: GiteaForge, repo: Repo) -> None:
    """Gitea's Mergeable() is false for every work-in-progress pull: for a draft it says nothing of conflicts."""
    gitea_double.link_repository(P, repo.bare)
    created = gitea_forge.create_draft_mr(P, BRANCH, "main", "Fix add", "body")
    assert (created.draft, created.conflicts, created.target_sha) == (True, None, repo.head("main"))
    assert gitea_double.pulls[(P, created.number)]["mergeable"] is False
    gitea_double.set_pull_ready(P, created.number)
    assert gitea_forge.get_mr(P, created.number).conflicts is False


def test_gitea_cannot_tell_a_running_check_from_a_conflict(
    gitea_double: GiteaDouble, gitea_forge: GiteaForge, repo: Repo
) -> None:
    """While Gitea checks, `mergeable` is false (a plain bool, always sent): the client reads a conflict."""
    gitea_double.link_repository(P, repo.bare)
    pull = gitea_double.add_pull(P, BRANCH, title="Fix add")
    gitea_double.set_mergeable_unknown(P, pull["number"])
    mr = gitea_forge.get_mr(P, pull["number"])
    assert gitea_double.pulls[(P, pull["number"])]["mergeable"] is False  # what was answered: false, not absent
    assert (mr.conflicts, mr.target_sha) == (True, repo.head("main"))
    gitea_double.set_mergeable_unknown(P, pull["number"], False)
    assert gitea_forge.get_mr(P, pull["number"]).conflicts is False


@pytest.mark.parametrize("state", ["closed", "merged"])
def test_gitea_closed_or_merged_says_nothing(
    gitea_double: GiteaDouble, gitea_forge: GiteaForge, repo: Repo, state: str
) -> None:
    gitea_double.link_repository(P, repo.bare)
    pull = gitea_double.add_pull(P, BRANCH, title="Fix add")
    conflicting_main(repo)
    gitea_double.set_pull_state(P, pull["number"], state)
    mr = gitea_forge.get_mr(P, pull["number"])
    assert (mr.verdict, mr.conflicts) == (state, None)


def test_gitea_unlinked_repository_keeps_set_pull_head(gitea_double: GiteaDouble, gitea_forge: GiteaForge) -> None:
    pull = gitea_double.add_pull(P, BRANCH, title="Fix add")
    sha = "3f1c0d9e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e"
    gitea_double.set_pull_head(P, pull["number"], sha)
    mr = gitea_forge.get_mr(P, pull["number"])
    assert (mr.head_sha, mr.conflicts) == (sha, False)


# ---------------------------------------------------------------------------------------------
# The shared fixtures: real answers, parsed by `_mr`
# ---------------------------------------------------------------------------------------------


def _fixture(relative: str) -> Any:
    return json.loads(shared_fixture(relative).read_text(encoding="utf-8"))


def _gitea_mr(data: dict[str, Any]) -> Any:
    forge = GiteaForge("http://127.0.0.1:9", "token")  # never called: `_mr` only parses
    try:
        return forge._mr(data)
    finally:
        forge.close()


@pytest.mark.parametrize(
    ("relative", "key", "conflicts", "target_sha"),
    [
        # has_conflicts true (next to a stale can_be_merged/mergeable): conflicts
        (
            "gitlab/go-gitlab/api_responses/get_merge_request.json",
            None,
            True,
            "dd692733bb84bc3e9e862e66c099daec2fa00c83",
        ),
        # detailed_merge_status checking (merge_status cannot_be_merged from before): not known yet
        ("gitlab/go-gitlab/note_merge_request.json", "merge_request", None, None),
        # closed, detailed_merge_status not_open
        (
            "gitlab/atlantis/api_responses/get_merge_request_pull-request.json",
            None,
            None,
            "2608b60d023280134ca16252505ce307bf0eec97",
        ),
    ],
)
def test_gitlab_fixtures(relative: str, key: str | None, conflicts: bool | None, target_sha: str | None) -> None:
    data = _fixture(relative)
    mr = GitLabForge._mr(data[key] if key else data)
    assert (mr.conflicts, mr.target_sha) == (conflicts, target_sha)


@pytest.mark.parametrize(
    ("relative", "conflicts", "target_sha"),
    [
        ("forgejo/woodpecker/HookPullRequestEdited.json", False, "068aee163ffd44eef28a7f9ebd43e2c01774f0fa"),
        ("gitea/go-playground_webhooks/pull-request-event.json", False, "67b56589a45103f891bdee7c0546e5d40bc02001"),
        ("gitea/go-scm/pull_request_opened.json", False, "39af58f1eff02aa308e16913e887c8d50362b474"),
        ("gitea/go-scm/pull_request_closed.json", None, "39af58f1eff02aa308e16913e887c8d50362b474"),
        ("gitea/woodpecker/HookPullRequestClosed.json", None, "068aee163ffd44eef28a7f9ebd43e2c01774f0fa"),
    ],
)
def test_gitea_fixtures(relative: str, conflicts: bool | None, target_sha: str) -> None:
    mr = _gitea_mr(_fixture(relative)["pull_request"])
    assert (mr.conflicts, mr.target_sha) == (conflicts, target_sha)


# ---------------------------------------------------------------------------------------------
# Hand-written answers (no shared folder needed)
# ---------------------------------------------------------------------------------------------

SHA = "a" * 40


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"has_conflicts": False, "merge_status": "can_be_merged", "detailed_merge_status": "mergeable"}, False),
        ({"has_conflicts": True, "merge_status": "cannot_be_merged", "detailed_merge_status": "conflict"}, True),
        ({"has_conflicts": True, "merge_status": "cannot_be_merged", "detailed_merge_status": "draft_status"}, True),
        ({"has_conflicts": False, "merge_status": "can_be_merged", "detailed_merge_status": "draft_status"}, False),
        ({"has_conflicts": False, "merge_status": "can_be_merged", "detailed_merge_status": "ci_must_pass"}, False),
        ({"has_conflicts": False, "detailed_merge_status": "conflict"}, True),
        ({"has_conflicts": False, "merge_status": "checking", "detailed_merge_status": "checking"}, None),
        ({"has_conflicts": True, "merge_status": "cannot_be_merged_recheck"}, None),
        ({"has_conflicts": True, "detailed_merge_status": "unchecked"}, None),
        ({"has_conflicts": True, "merge_status": "cannot_be_merged", "detailed_merge_status": "preparing"}, None),
        ({"has_conflicts": False, "merge_status": "unchecked"}, None),
        ({"has_conflicts": True, "merge_status": "cannot_be_merged_rechecking"}, None),
        ({"has_conflicts": False, "merge_status": "preparing"}, None),
        ({"merge_status": "cannot_be_merged"}, True),  # GitLab before has_conflicts existed
        ({"merge_status": "can_be_merged"}, False),
        ({"detailed_merge_status": "mergeable"}, None),  # nothing says it: not known
        ({}, None),
        ({"state": "closed", "has_conflicts": True, "merge_status": "cannot_be_merged"}, None),
        ({"state": "merged", "has_conflicts": False, "merge_status": "can_be_merged"}, None),
        ({"has_conflicts": True, "detailed_merge_status": "not_open"}, None),
        ({"has_conflicts": "yes"}, None),
    ],
)
def test_gitlab_conflicts_rule(fields: dict[str, Any], expected: bool | None) -> None:
    data = {"state": "opened", **fields}
    assert gitlab_conflicts(data) is expected
    assert GitLabForge._mr({"iid": 1, **data}).conflicts is expected


@pytest.mark.parametrize(
    ("diff_refs", "expected"),
    [
        ({"base_sha": "b" * 40, "head_sha": "c" * 40, "start_sha": SHA}, SHA),
        ({"start_sha": SHA.upper()}, SHA),
        ({"start_sha": "e" * 64}, "e" * 64),  # a SHA-256 repository
        ({"start_sha": "abc123"}, None),  # not a whole commit id
        ({"start_sha": None}, None),
        ({"start_sha": 42}, None),
        (None, None),
        ("nonsense", None),
    ],
)
def test_gitlab_target_sha(diff_refs: Any, expected: str | None) -> None:
    assert GitLabForge._mr({"iid": 1, "state": "opened", "diff_refs": diff_refs}).target_sha == expected


def _pull(**fields: Any) -> dict[str, Any]:
    pull: dict[str, Any] = {
        "number": 2,
        "title": "Fix add",
        "state": "open",
        "merged": False,
        "mergeable": True,
        "merge_base": "b" * 40,
        "base": {"ref": "main", "sha": SHA},
        "head": {"ref": BRANCH, "sha": "c" * 40},
    }
    pull.update(fields)
    return pull


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, False),
        ({"mergeable": False}, True),
        ({"mergeable": False, "title": "WIP: Fix add"}, None),  # Gitea reports every WIP pull unmergeable
        ({"mergeable": False, "title": "[wip] Fix add"}, None),
        ({"mergeable": False, "draft": True}, None),
        ({"mergeable": True, "title": "WIP: Fix add"}, False),
        ({"mergeable": None}, None),
        ({"mergeable": "true"}, None),
        ({"state": "closed"}, None),
        ({"state": "closed", "merged": True, "mergeable": False}, None),
    ],
)
def test_gitea_conflicts_rule(fields: dict[str, Any], expected: bool | None) -> None:
    data = _pull(**fields)
    if "mergeable" in fields and fields["mergeable"] is None:
        del data["mergeable"]
    assert _gitea_mr(data).conflicts is expected


def test_gitea_conflicts_function() -> None:
    assert gitea_conflicts(True, open_=True, draft=False) is False
    assert gitea_conflicts(False, open_=True, draft=False) is True
    assert gitea_conflicts(False, open_=True, draft=True) is None
    assert gitea_conflicts(False, open_=False, draft=False) is None
    assert gitea_conflicts(None, open_=True, draft=False) is None


@pytest.mark.parametrize(
    ("base", "expected"),
    [
        ({"ref": "main", "sha": SHA}, SHA),
        ({"ref": "main", "sha": ""}, None),  # Gitea leaves it empty when the base branch is gone
        ({"ref": "main"}, None),
        (None, None),
    ],
)
def test_gitea_target_sha(base: Any, expected: str | None) -> None:
    assert _gitea_mr(_pull(base=base)).target_sha == expected
