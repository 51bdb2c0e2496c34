"""GiteaForge (httpx) against the Gitea double over HTTP."""

from __future__ import annotations

import base64
import re

import httpx
import pytest

from app.forge.api import (
    DEFAULT_TEXT_LIMIT,
    Forge,
    ForgeAuthError,
    ForgeError,
    ForgeNotFound,
    ForgeTransient,
    upsert_draft_mr,
)
from app.forge.gitea_api import GiteaForge
from app.retrying import RetryPolicy
from tests.doubles.gitea_api import GiteaDouble
from tests.doubles.gitlab_api import iter_json_values
from tests.forge.conftest import TRIGGER, FakeClock

P = "acme/widgets"


def make(double: GiteaDouble, retry: RetryPolicy, **kw: object) -> GiteaForge:
    kw.setdefault("timeout", 5.0)
    return GiteaForge(double.base_url, double.token, retry=retry, **kw)  # type: ignore[arg-type]


def test_satisfies_the_protocol(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    assert isinstance(make(gitea_double, retry), Forge)


def test_reads_the_issue_and_its_labels(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    issue = make(gitea_double, retry).get_issue(P, 1)
    assert issue.number == 1 and issue.title == "Crash on empty input"
    assert issue.state == "open"
    assert issue.labels == ("bug", TRIGGER)
    assert issue.author == "rep"
    assert issue.web_url.endswith("/acme/widgets/issues/1")
    assert gitea_double.calls("GET")[-1].headers["authorization"] == f"token {gitea_double.token}"


def test_a_pull_request_is_not_an_issue(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    pull = gitea_double.add_pull(P, "feature/x")
    with pytest.raises(ForgeNotFound, match="pull request"):
        make(gitea_double, retry).get_issue(P, pull["number"])


def test_label_adder_from_the_timeline(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    forge = make(gitea_double, retry)
    assert forge.label_adder(P, 1, TRIGGER) == "dev"
    gitea_double.add_timeline_comment(P, 1, "me too", by="rep")
    gitea_double.remove_label(P, 1, TRIGGER, by="boss")  # a removal (body "") is not an addition
    assert forge.label_adder(P, 1, TRIGGER) == "dev"
    gitea_double.add_label(P, 1, TRIGGER, by="rep")
    assert forge.label_adder(P, 1, TRIGGER) == "rep"
    assert forge.label_adder(P, 1, "never-added") is None


def test_label_adder_reads_every_page(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    for i in range(120):
        gitea_double.add_timeline_comment(P, 1, f"comment {i}", by="rep")
    gitea_double.add_label(P, 1, TRIGGER, by="boss")
    assert make(gitea_double, retry).label_adder(P, 1, TRIGGER) == "boss"
    # 122 entries: pages of 50, 50 and 22, then the `null` page that ends a Gitea timeline
    assert len(gitea_double.calls("GET", "/timeline")) == 4


def test_a_50_entry_timeline_ends_at_a_null_page(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    """Gitea answers an empty timeline page with `null`, no Link header and a per-page X-Total-Count."""
    for i in range(48):  # with the fixture's two label entries: exactly one full page
        gitea_double.add_timeline_comment(P, 1, f"comment {i}", by="rep")
    assert make(gitea_double, retry).label_adder(P, 1, TRIGGER) == "dev"
    assert [c.query["page"] for c in gitea_double.calls("GET", "/timeline")] == [["1"], ["2"]]
    headers = {"Authorization": f"token {gitea_double.token}"}
    url = f"{gitea_double.base_url}/api/v1/repos/{P}/issues/1/timeline"
    first = httpx.get(url, params={"page": 1, "limit": 50}, headers=headers)
    second = httpx.get(url, params={"page": 2, "limit": 50}, headers=headers)
    assert len(first.json()) == 50 and first.headers["X-Total-Count"] == "50" and "Link" not in first.headers
    assert second.text == "null" and second.headers["X-Total-Count"] == "0" and "Link" not in second.headers


def test_label_on_page_2_of_a_capped_timeline(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    """An instance whose MAX_RESPONSE_ITEMS is 10 gives pages of 10 whatever limit is asked."""
    gitea_double.max_response_items = 10
    for i in range(15):
        gitea_double.add_timeline_comment(P, 1, f"comment {i}", by="rep")
    gitea_double.add_label(P, 1, TRIGGER, by="boss")  # entry 18: on page 2
    assert make(gitea_double, retry).label_adder(P, 1, TRIGGER) == "boss"
    assert len(gitea_double.calls("GET", "/timeline")) == 3
    assert all(c.query["limit"] == ["50"] for c in gitea_double.calls("GET", "/timeline"))


def test_a_listing_past_the_page_bound_fails(
    gitea_double: GiteaDouble, retry: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never act on part of a timeline: the label adder could be an older one, with other rights."""
    monkeypatch.setattr("app.forge.gitea_api.MAX_PAGES", 3)
    gitea_double.max_response_items = 1
    gitea_double.add_label(P, 1, TRIGGER, by="boss")  # entry 3 of 3: the bound is not passed yet
    assert make(gitea_double, retry).label_adder(P, 1, TRIGGER) == "boss"
    gitea_double.add_label(P, 1, TRIGGER, by="rep")  # entry 4: past three pages of one
    with pytest.raises(ForgeError, match="more than 3 pages"):
        make(gitea_double, retry).label_adder(P, 1, TRIGGER)


def test_a_page_shortened_by_hidden_entries_is_not_the_end(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    """Gitea drops code review comments from the timeline after paging, so page 1 holds 49 of 50."""
    gitea_double.add_review_comment(P, 1, "nit", by="rep")
    for i in range(60):
        gitea_double.add_timeline_comment(P, 1, f"comment {i}", by="rep")
    gitea_double.add_label(P, 1, TRIGGER, by="boss")
    assert make(gitea_double, retry).label_adder(P, 1, TRIGGER) == "boss"


def test_open_pr_on_page_2_is_found_and_updated(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    """Capped pages of 10, ours the oldest of 13 open PRs (the list is newest first): no second PR, no 409."""
    gitea_double.max_response_items = 10
    ours = gitea_double.add_pull(P, "frogfix/issue-1", title="WIP: an earlier run")
    for i in range(12):
        gitea_double.add_pull(P, f"feature/{i}")
    forge = make(gitea_double, retry)
    mr, created = upsert_draft_mr(forge, P, "frogfix/issue-1", "main", "Fix (#1)", "again")
    assert not created and mr.number == ours["number"] and mr.description == "again"
    assert gitea_double.calls("POST", "/pulls") == []
    assert len([p for p in gitea_double.open_pulls(P) if p["head"]["ref"] == "frogfix/issue-1"]) == 1


def test_permission_needs_write(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    forge = make(gitea_double, retry)
    assert forge.can_trigger(P, "dev") is True  # write
    assert forge.can_trigger(P, "boss") is True  # admin
    assert forge.can_trigger(P, "acme") is True  # owner
    assert forge.can_trigger(P, "rep") is False  # read
    assert forge.can_trigger(P, "stranger") is False  # none (private repository)
    assert forge.can_trigger(P, "nobody-at-all") is False  # no such user: 404


GENERAL_ACCESS = {"repo.code": "write", "repo.issues": "write", "repo.wiki": "read"}  # a typical team


def test_write_through_a_general_access_team(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    """A team with write on code and issues but read on the wiki: the repository-level mode reads `read`."""
    gitea_double.add_repo("guild/app")
    for name, member, units in [
        ("General", "tess", GENERAL_ACCESS),
        ("Readers", "rita", {"repo.code": "read", "repo.issues": "read"}),
        ("Docs", "wren", {"repo.issues": "write", "repo.code": "read"}),
    ]:
        gitea_double.add_team("guild", name, repos=("guild/app",), members=(member,), units_map=units)
    gitea_double.add_team("guild", "Elsewhere", repos=("guild/other",), members=("otto",), units_map=GENERAL_ACCESS)
    headers = {"Authorization": f"token {gitea_double.token}"}
    mode = httpx.get(f"{gitea_double.base_url}/api/v1/repos/guild/app/collaborators/tess/permission", headers=headers)
    assert mode.json()["permission"] == "read"
    forge = make(gitea_double, retry)
    assert forge.can_trigger("guild/app", "tess") is True
    assert forge.can_trigger("guild/app", "rita") is False  # only read units
    assert forge.can_trigger("guild/app", "wren") is False  # writes issues, not code
    assert forge.can_trigger("guild/app", "otto") is False  # the team has no access to this repository


def test_team_membership_needs_an_org_owner_token(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    gitea_double.add_repo("guild/app")
    gitea_double.add_team("guild", "General", repos=("guild/app",), members=("tess",), units_map=GENERAL_ACCESS)
    gitea_double.bot_org_owner = False
    with pytest.raises(ForgeAuthError, match="own the organisation"):
        make(gitea_double, retry).can_trigger("guild/app", "tess")


def test_permission_check_needs_a_repo_admin_token(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    gitea_double.bot_repo_admin = False
    with pytest.raises(ForgeAuthError, match="needs admin"):
        make(gitea_double, retry).can_trigger(P, "dev")


def test_project_info(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    info = make(gitea_double, retry).project_info(P)
    assert info.default_branch == "main" and info.path == P
    assert info.clone_url == f"{gitea_double.base_url}/acme/widgets.git"


def test_an_empty_repository_says_so(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    """Gitea names a default branch even for a repository with no commits; `empty` tells."""
    gitea_double.add_repo("acme/fresh", empty=True)
    with pytest.raises(ForgeError, match="acme/fresh is empty: it has no commits yet"):
        make(gitea_double, retry).project_info("acme/fresh")


@pytest.mark.parametrize("draft_field", [False, True], ids=["gitea-1.16-1.21", "gitea-1.22+"])
def test_draft_pr_is_created_once_then_updated(
    gitea_double: GiteaDouble, retry: RetryPolicy, draft_field: bool
) -> None:
    gitea_double.draft_field = draft_field
    forge = make(gitea_double, retry)
    assert forge.find_open_mr(P, "frogfix/issue-1") is None
    mr, created = upsert_draft_mr(forge, P, "frogfix/issue-1", "main", "Fix crash on empty input (#1)", "first")
    assert created and mr.draft
    assert mr.title == "WIP: Fix crash on empty input (#1)"
    assert mr.source_branch == "frogfix/issue-1" and mr.target_branch == "main"
    posted = gitea_double.calls("POST", "/pulls")[0].body
    assert posted == {"head": "frogfix/issue-1", "base": "main", "title": mr.title, "body": "first"}
    # without a `draft` field the issue view of the PR is asked for Gitea's own verdict
    assert bool(gitea_double.calls("GET", f"/issues/{mr.number}")) is not draft_field

    again, created = upsert_draft_mr(forge, P, "frogfix/issue-1", "main", "WIP: Fix crash (#1)", "second")
    assert not created and again.number == mr.number
    assert again.title == "WIP: Fix crash (#1)" and again.description == "second" and again.draft
    assert len(gitea_double.open_pulls(P)) == 1
    assert len(gitea_double.calls("POST", "/pulls")) == 1
    assert len(gitea_double.calls("PATCH", "/pulls")) == 1


@pytest.mark.parametrize(
    ("title", "draft"),
    [("WIP: fix", True), ("wip: fix", True), ("[wip] fix", True), ("[WIP]fix", True), (" WIP: fix", False)],
)
def test_draft_from_the_title_on_gitea_before_1_22(
    gitea_double: GiteaDouble, retry: RetryPolicy, title: str, draft: bool
) -> None:
    """No `draft` field (1.16-1.21): Gitea's case-insensitive prefixes decide, on the title as it is."""
    gitea_double.draft_field = False
    gitea_double.add_pull(P, "frogfix/issue-1", title=title)
    mr = make(gitea_double, retry).find_open_mr(P, "frogfix/issue-1")
    assert mr is not None and mr.draft is draft
    assert "draft" not in gitea_double.pulls[(P, mr.number)]


def test_pr_from_another_branch_is_not_ours(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    gitea_double.add_pull(P, "feature/other")
    assert make(gitea_double, retry).find_open_mr(P, "frogfix/issue-1") is None


def test_lost_answer_to_create_does_not_open_a_second_pr(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    gitea_double.fail_next(1, 504, method="POST", path_contains="/pulls", after=True)
    mr = make(gitea_double, retry).create_draft_mr(P, "frogfix/issue-1", "main", "Fix", "body")
    assert mr.draft
    assert len(gitea_double.open_pulls(P)) == 1


def test_conflict_means_update_the_existing_pr(
    gitea_double: GiteaDouble, retry: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    forge = make(gitea_double, retry)
    existing = gitea_double.add_pull(P, "frogfix/issue-1", title="WIP: old")
    real_find = forge.find_open_mr
    calls = []

    def racy_find(project: str, branch: str):  # type: ignore[no-untyped-def]
        calls.append(branch)
        return None if len(calls) == 1 else real_find(project, branch)  # another worker opened it meanwhile

    monkeypatch.setattr(forge, "find_open_mr", racy_find)
    mr, created = upsert_draft_mr(forge, P, "frogfix/issue-1", "main", "Fix", "new body")
    assert not created and mr.number == existing["number"] and mr.description == "new body"
    assert len(gitea_double.open_pulls(P)) == 1


def test_refuses_a_non_draft_answer(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    gitea_double.wip_prefixes = ("[DRAFT]",)  # an instance configured without `WIP:`
    with pytest.raises(ForgeError, match="not a draft"):
        make(gitea_double, retry).create_draft_mr(P, "frogfix/issue-1", "main", "Fix", "body")


def test_comments(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    make(gitea_double, retry).comment(P, 1, "FrogFix started working on this issue.")
    [(number, body)] = [(c["issue"], c["body"]) for c in gitea_double.comments]
    assert number == 1 and re.fullmatch(r"<!-- frogfix:[0-9a-f]{16} -->\nFrogFix started working on this issue\.", body)


@pytest.mark.parametrize("after", [True, False])
def test_a_comment_whose_answer_was_lost_is_posted_once(
    gitea_double: GiteaDouble, retry: RetryPolicy, after: bool
) -> None:
    """A proxy's 502 after Gitea stored the comment (after=True) or before it (after=False): one comment either way."""
    gitea_double.fail_next(1, 502, method="POST", path_contains="/comments", after=after)
    forge = make(gitea_double, retry)
    forge.comment(P, 1, "first")
    forge.comment(P, 1, "first")  # the same text again is a new comment, not a retry
    assert [c["body"].split("\n", 1)[1] for c in gitea_double.comments] == ["first", "first"]
    assert len(gitea_double.calls("POST", "/comments")) == (2 if after else 3)


def test_429_honours_retry_after(gitea_double: GiteaDouble, retry: RetryPolicy, fake_clock: FakeClock) -> None:
    gitea_double.fail_next(1, 429, retry_after=7)
    assert make(gitea_double, retry).get_issue(P, 1).number == 1
    assert len(fake_clock.sleeps) == 1 and fake_clock.sleeps[0] >= 7


def test_retry_after_as_http_date(gitea_double: GiteaDouble, retry: RetryPolicy, fake_clock: FakeClock) -> None:
    gitea_double.fail_next(1, 503, retry_after="Wed, 21 Oct 2015 07:28:00 GMT")  # in the past: no extra wait
    assert make(gitea_double, retry).project_info(P).default_branch == "main"
    assert len(fake_clock.sleeps) == 1


def test_5xx_then_success(gitea_double: GiteaDouble, retry: RetryPolicy, fake_clock: FakeClock) -> None:
    gitea_double.fail_next(2, 500)
    assert make(gitea_double, retry).can_trigger(P, "dev") is True
    assert len(fake_clock.sleeps) == 2


def test_timeout_is_transient(gitea_double: GiteaDouble, retry: RetryPolicy, fake_clock: FakeClock) -> None:
    gitea_double.hang_next(1, seconds=3.0)
    assert make(gitea_double, retry, timeout=1.0).project_info(P).default_branch == "main"
    assert len(fake_clock.sleeps) == 1


def test_connection_refused_is_transient(retry: RetryPolicy) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    forge = GiteaForge("http://gitea.invalid", "tok-123456", retry=retry, transport=httpx.MockTransport(refuse))
    with pytest.raises(ForgeTransient, match="ConnectError"):
        forge.project_info(P)


def test_budget_exhausted_raises_transient(
    gitea_double: GiteaDouble, retry: RetryPolicy, fake_clock: FakeClock
) -> None:
    gitea_double.fail_next(10, 503, method="POST")
    with pytest.raises(ForgeTransient) as caught:
        make(gitea_double, retry).comment(P, 1, "hello")
    assert caught.value.status == 503
    assert len(gitea_double.calls("POST", "/comments")) == 4
    assert gitea_double.comments == []


def test_not_found(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    forge = make(gitea_double, retry)
    with pytest.raises(ForgeNotFound, match="404"):
        forge.get_issue(P, 99)
    with pytest.raises(ForgeNotFound):
        forge.project_info("acme/nope")
    with pytest.raises(ForgeError, match="owner/name"):
        forge.project_info("just-a-name")


def test_bad_token_is_an_auth_error_without_the_token(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    wrong = "gitea-WRONG-token-000000"
    with pytest.raises(ForgeAuthError) as caught:
        GiteaForge(gitea_double.base_url, wrong, retry=retry).get_issue(P, 1)
    assert caught.value.status == 401 and wrong not in str(caught.value)


def test_token_never_leaves_in_posts_or_errors(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    token = gitea_double.token
    model_key = "sk-model-key-CANARY-42"
    forge = make(gitea_double, retry, redact=lambda text: text.replace(model_key, "[REDACTED]"))
    forge.comment(P, 1, f"log: token={token} key={model_key}")
    mr = forge.create_draft_mr(P, "frogfix/issue-1", "main", f"Fix {token}", f"patch\n{token}\n{model_key}\n")
    forge.update_mr(P, mr, "Fix", f"again {forge.git_auth_header()}")
    basic = forge.git_auth_header().split(" ", 1)[1]
    sent = gitea_double.sent_text()
    for secret in (token, model_key, basic):
        assert secret not in sent
        for value in [*gitea_double.comments, *gitea_double.pulls.values()]:
            assert all(secret not in s for s in iter_json_values(value))

    gitea_double.fail_next(1, 422, body={"message": f"invalid {token}"})
    with pytest.raises(ForgeError) as caught:
        forge.get_issue(P, 1)
    assert token not in str(caught.value) and "[REDACTED]" in str(caught.value)


def test_oversized_description_is_trimmed(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    forge = make(gitea_double, retry)
    mr = forge.create_draft_mr(P, "frogfix/issue-1", "main", "Fix", "x" * 2_000_000)
    assert len(mr.description) <= DEFAULT_TEXT_LIMIT and "trimmed by FrogFix" in mr.description
    forge.comment(P, 1, "y" * 600_000)
    assert len(gitea_double.comments[-1]["body"]) <= DEFAULT_TEXT_LIMIT


def test_git_auth_header_uses_the_token_as_user(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    scheme, value = make(gitea_double, retry).git_auth_header().split(" ", 1)
    assert scheme == "Basic"
    assert base64.b64decode(value).decode() == f"{gitea_double.token}:x-oauth-basic"


def test_mr_verdict_reads_merged_closed_and_open(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    """Eval's human verdicts: a pull's `merged` flag first (a merged pull is also `closed`), then its `state`."""
    from app.forge.api import mr_number_from_url

    forge = make(gitea_double, retry)
    merged, closed, still_open = (gitea_double.add_pull(P, f"frogfix/issue-{i}") for i in (1, 2, 3))
    gitea_double.set_pull_state(P, merged["number"], "merged")
    gitea_double.set_pull_state(P, closed["number"], "closed")
    numbers = [mr_number_from_url(p["html_url"]) for p in (merged, closed, still_open)]
    assert numbers == [merged["number"], closed["number"], still_open["number"]]
    assert [forge.mr_verdict(P, n) for n in numbers if n] == ["merged", "closed", "open"]
    with pytest.raises(ForgeNotFound):
        forge.mr_verdict(P, 99)
