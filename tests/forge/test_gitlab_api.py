"""GitLabForge (the real python-gitlab client) against the GitLab double over HTTP."""

from __future__ import annotations

import re

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
from app.forge.gitlab_api import GitLabForge
from app.retrying import RetryPolicy
from tests.doubles.gitlab_api import GitLabDouble, iter_json_values
from tests.forge.conftest import TRIGGER, FakeClock

P = "acme/widgets"


def make(double: GitLabDouble, retry: RetryPolicy, **kw: object) -> GitLabForge:
    kw.setdefault("timeout", 5.0)
    return GitLabForge(double.base_url, double.token, retry=retry, **kw)  # type: ignore[arg-type]


def test_satisfies_the_protocol(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    assert isinstance(make(gitlab_double, retry), Forge)


def test_reads_the_issue_and_its_labels(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    issue = make(gitlab_double, retry).get_issue(P, 1)
    assert issue.number == 1 and issue.title == "Crash on empty input"
    assert issue.state == "open"
    assert issue.labels == ("bug", TRIGGER)
    assert issue.author == "rep"
    assert issue.web_url.endswith("/acme/widgets/-/issues/1")
    # the project path was URL-encoded as GitLab requires
    assert gitlab_double.calls("GET")[-1].raw_path == "/api/v4/projects/acme%2Fwidgets/issues/1"


def test_closed_issue_and_numeric_project_id(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    gitlab_double.add_issue(P, title="old", state="closed")
    pid = str(gitlab_double._project(P)["id"])
    assert make(gitlab_double, retry).get_issue(pid, 2).state == "closed"


def test_label_adder_is_the_most_recent_adder(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = make(gitlab_double, retry)
    assert forge.label_adder(P, 1, TRIGGER) == "dev"
    gitlab_double.remove_label(P, 1, TRIGGER, by="maint")
    gitlab_double.add_label(P, 1, TRIGGER, by="rep")
    assert forge.label_adder(P, 1, TRIGGER) == "rep"
    assert forge.label_adder(P, 1, "never-added") is None


def test_label_adder_reads_every_page(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    for i in range(45):
        gitlab_double.add_label(P, 1, f"noise-{i}", by="rep")
    gitlab_double.add_label(P, 1, TRIGGER, by="maint")
    assert make(gitlab_double, retry).label_adder(P, 1, TRIGGER) == "maint"
    pages = gitlab_double.calls("GET", "resource_label_events")
    assert len(pages) >= 3


def test_permission_needs_developer_access(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = make(gitlab_double, retry)
    assert forge.can_trigger(P, "dev") is True
    assert forge.can_trigger(P, "maint") is True
    assert forge.can_trigger(P, "rep") is False  # reporter, 20
    assert forge.can_trigger(P, "stranger") is False  # not a member: 404 on members/all
    assert forge.can_trigger(P, "nobody-at-all") is False  # no such user


def test_project_info(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    info = make(gitlab_double, retry).project_info(P)
    assert info.default_branch == "main"
    assert info.path == P
    assert info.clone_url == f"{gitlab_double.base_url}/acme/widgets.git"
    assert info.web_url.endswith("/acme/widgets")


def test_draft_mr_is_created_once_then_updated(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = make(gitlab_double, retry)
    assert forge.find_open_mr(P, "frogfix/issue-1") is None
    mr, created = upsert_draft_mr(forge, P, "frogfix/issue-1", "main", "Fix crash on empty input (#1)", "first")
    assert created and mr.draft
    assert mr.title == "Draft: Fix crash on empty input (#1)"
    assert mr.source_branch == "frogfix/issue-1" and mr.target_branch == "main"
    assert mr.web_url.endswith(f"/-/merge_requests/{mr.number}")

    found = forge.find_open_mr(P, "frogfix/issue-1")
    assert found is not None and found.number == mr.number

    again, created = upsert_draft_mr(forge, P, "frogfix/issue-1", "main", "Draft: Fix crash (#1)", "second")
    assert not created and again.number == mr.number
    assert again.title == "Draft: Fix crash (#1)"  # the prefix is never doubled
    assert again.description == "second" and again.draft
    assert len(gitlab_double.open_mrs(P)) == 1
    assert len(gitlab_double.calls("POST", "merge_requests")) == 1
    assert len(gitlab_double.calls("PUT", "merge_requests")) == 1


def test_an_mr_from_another_branch_is_not_ours(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    gitlab_double.add_mr(P, "feature/other", title="Other work")
    assert make(gitlab_double, retry).find_open_mr(P, "frogfix/issue-1") is None


def test_lost_answer_to_create_does_not_open_a_second_mr(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    gitlab_double.fail_next(1, 502, method="POST", path_contains="merge_requests", after=True)
    mr = make(gitlab_double, retry).create_draft_mr(P, "frogfix/issue-1", "main", "Fix", "body")
    assert mr.draft
    assert len(gitlab_double.open_mrs(P)) == 1
    assert len(gitlab_double.calls("POST", "merge_requests")) == 1


def test_refuses_a_non_draft_answer(
    gitlab_double: GitLabDouble, retry: RetryPolicy, monkeypatch: pytest.MonkeyPatch
) -> None:
    def never_draft(mr: dict) -> None:
        mr["draft"] = mr["work_in_progress"] = False

    monkeypatch.setattr(gitlab_double, "_set_draft", never_draft)
    with pytest.raises(ForgeError, match="did not mark it as a draft"):
        make(gitlab_double, retry).create_draft_mr(P, "frogfix/issue-1", "main", "Fix", "body")


def test_comments(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    make(gitlab_double, retry).comment(P, 1, "FrogFix started working on this issue.")
    [(iid, body)] = [(n["noteable_iid"], n["body"]) for n in gitlab_double.notes]
    assert iid == 1 and re.fullmatch(r"<!-- frogfix:[0-9a-f]{16} -->\nFrogFix started working on this issue\.", body)


@pytest.mark.parametrize("after", [True, False])
def test_a_comment_whose_answer_was_lost_is_posted_once(
    gitlab_double: GitLabDouble, retry: RetryPolicy, after: bool
) -> None:
    """A proxy's 502 after GitLab stored the note (after=True) or before it (after=False): one note either way."""
    gitlab_double.fail_next(1, 502, method="POST", path_contains="/notes", after=after)
    forge = make(gitlab_double, retry)
    forge.comment(P, 1, "first")
    forge.comment(P, 1, "first")  # the same text again is a new comment, not a retry
    assert [n["body"].split("\n", 1)[1] for n in gitlab_double.notes] == ["first", "first"]
    assert len(gitlab_double.calls("POST", "/notes")) == (2 if after else 3)


def test_429_honours_retry_after(gitlab_double: GitLabDouble, retry: RetryPolicy, fake_clock: FakeClock) -> None:
    gitlab_double.fail_next(1, 429, retry_after=7)
    assert make(gitlab_double, retry).get_issue(P, 1).number == 1
    assert len(fake_clock.sleeps) == 1 and fake_clock.sleeps[0] >= 7


def test_5xx_then_success(gitlab_double: GitLabDouble, retry: RetryPolicy, fake_clock: FakeClock) -> None:
    gitlab_double.fail_next(2, 502)
    assert make(gitlab_double, retry).can_trigger(P, "dev") is True
    assert len(fake_clock.sleeps) == 2
    assert fake_clock.sleeps[1] > fake_clock.sleeps[0]  # backoff grows


def test_timeout_is_transient(gitlab_double: GitLabDouble, retry: RetryPolicy, fake_clock: FakeClock) -> None:
    gitlab_double.hang_next(1, seconds=3.0)
    assert make(gitlab_double, retry, timeout=1.0).project_info(P).default_branch == "main"
    assert len(fake_clock.sleeps) == 1


def test_budget_exhausted_raises_transient(
    gitlab_double: GitLabDouble, retry: RetryPolicy, fake_clock: FakeClock
) -> None:
    gitlab_double.fail_next(10, 503, retry_after=2)
    with pytest.raises(ForgeTransient) as caught:
        make(gitlab_double, retry).get_issue(P, 1)
    assert caught.value.status == 503 and caught.value.retry_after == 2
    assert "gave up after 4 attempts" in str(caught.value)
    assert len(gitlab_double.calls("GET", "issues")) == 4
    assert len(fake_clock.sleeps) == 3


def test_time_budget_stops_before_a_long_retry_after(gitlab_double: GitLabDouble, fake_clock: FakeClock) -> None:
    policy = RetryPolicy(attempts=10, budget_s=30, sleep=fake_clock.sleep, clock=fake_clock.clock)
    gitlab_double.fail_next(1, 429, retry_after=600)
    with pytest.raises(ForgeTransient) as caught:
        make(gitlab_double, policy).get_issue(P, 1)
    assert caught.value.retry_after == 600  # the caller can re-queue the job for later
    assert fake_clock.sleeps == []


def test_not_found(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = make(gitlab_double, retry)
    with pytest.raises(ForgeNotFound, match="404"):
        forge.get_issue(P, 99)
    with pytest.raises(ForgeNotFound):
        forge.project_info("acme/nope")


def test_bad_token_is_an_auth_error_without_the_token(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    wrong = "glpat-WRONG-token-000000"
    forge = GitLabForge(gitlab_double.base_url, wrong, retry=retry, timeout=5)
    with pytest.raises(ForgeAuthError) as caught:
        forge.get_issue(P, 1)
    assert caught.value.status == 401
    assert wrong not in str(caught.value)


def test_token_never_leaves_in_posts_or_errors(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    token = gitlab_double.token
    model_key = "sk-model-key-CANARY-42"
    forge = make(gitlab_double, retry, redact=lambda text: text.replace(model_key, "[REDACTED]"))
    forge.comment(P, 1, f"log: token={token} key={model_key}")
    mr = forge.create_draft_mr(P, "frogfix/issue-1", "main", f"Fix {token}", f"patch\n{token}\n{model_key}\n")
    forge.update_mr(P, mr, "Fix", f"again {forge.git_auth_header()}")
    sent = gitlab_double.sent_text()
    basic = forge.git_auth_header().split(" ", 1)[1]
    for secret in (token, model_key, basic):
        assert secret not in sent
        for value in [*gitlab_double.notes, *gitlab_double.mrs]:
            assert all(secret not in s for s in iter_json_values(value))
    assert "[REDACTED]" in gitlab_double.notes[0]["body"]

    # a forge error message that echoes the token is scrubbed before it reaches us
    gitlab_double.fail_next(1, 400, body={"message": f"bad request with {token}"})
    with pytest.raises(ForgeError) as caught:
        forge.get_issue(P, 1)
    assert token not in str(caught.value) and "[REDACTED]" in str(caught.value)


def test_oversized_description_is_trimmed(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = make(gitlab_double, retry)
    huge = "x" * 2_000_000
    mr = forge.create_draft_mr(P, "frogfix/issue-1", "main", "Fix", huge)
    assert len(mr.description) <= DEFAULT_TEXT_LIMIT
    assert "trimmed by FrogFix" in mr.description
    forge.comment(P, 1, huge)
    assert len(gitlab_double.notes[-1]["body"]) <= DEFAULT_TEXT_LIMIT
    long_title = forge.create_draft_mr(P, "frogfix/issue-2", "main", "y" * 1000, "d").title
    assert long_title.startswith("Draft: ") and len(long_title) <= 255


def test_git_auth_header_is_basic_oauth2(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    import base64

    header = make(gitlab_double, retry).git_auth_header()
    scheme, value = header.split(" ", 1)
    assert scheme == "Basic"
    assert base64.b64decode(value).decode() == f"oauth2:{gitlab_double.token}"


def test_mr_verdict_reads_merged_closed_and_open(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    """Eval's human verdicts: GitLab's MR `state`, and the MR number taken from the web_url a job stores."""
    from app.forge.api import mr_number_from_url

    forge = make(gitlab_double, retry)
    merged, closed, still_open = (gitlab_double.add_mr(P, f"frogfix/issue-{i}") for i in (1, 2, 3))
    gitlab_double.set_mr_state(P, merged["iid"], "merged", by="maint")
    gitlab_double.set_mr_state(P, closed["iid"], "closed", by="maint")
    numbers = [mr_number_from_url(m["web_url"]) for m in (merged, closed, still_open)]
    assert numbers == [merged["iid"], closed["iid"], still_open["iid"]]
    assert [forge.mr_verdict(P, n) for n in numbers if n] == ["merged", "closed", "open"]
    with pytest.raises(ForgeNotFound):
        forge.mr_verdict(P, 99)
    assert mr_number_from_url(None) is None and mr_number_from_url("https://x/-/issues/3") is None
