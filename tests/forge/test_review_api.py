"""The review-round side of both forge clients (issue 14) against the HTTP doubles: who the bot is, the MR
as it is now, the review thread, replies, CI failures, and update_mr keeping a ready MR ready."""

from __future__ import annotations

import json
import re

import pytest

from app.forge.api import (
    CI_JOB_LIMIT,
    THREAD_BODY_LIMIT,
    THREAD_NOTE_LIMIT,
    ForgeError,
    upsert_draft_mr,
)
from app.forge.gitea_api import GiteaForge
from app.forge.gitlab_api import GitLabForge
from app.forge.reviews import CiReport
from app.redaction import REDACTED
from app.retrying import RetryPolicy
from tests.conftest import shared_fixture
from tests.doubles.gitea_api import GiteaDouble
from tests.doubles.gitlab_api import GitLabDouble

P = "acme/widgets"
BRANCH = "frogfix/issue-1"
SHA = "3f1c0d9e8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e"
MARKER = re.compile(r"<!-- frogfix:[0-9a-f]{16} -->\n")


def gitlab(double: GitLabDouble, retry: RetryPolicy) -> GitLabForge:
    return GitLabForge(double.base_url, double.token, retry=retry, timeout=5.0)


def gitea(double: GiteaDouble, retry: RetryPolicy) -> GiteaForge:
    return GiteaForge(double.base_url, double.token, retry=retry, timeout=5.0)


# ---------------------------------------------------------------------------------------------
# GitLab
# ---------------------------------------------------------------------------------------------


def test_gitlab_bot_username_is_read_once(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = gitlab(gitlab_double, retry)
    assert forge.bot_username() == forge.bot_username() == "frogfix-bot"
    assert len(gitlab_double.calls("GET", "/api/v4/user")) == 1


def test_gitlab_get_mr_reads_head_author_and_verdict(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = gitlab(gitlab_double, retry)
    created = forge.create_draft_mr(P, BRANCH, "main", "Fix", "body")
    gitlab_double.set_mr_head(P, created.number, SHA)
    mr = forge.get_mr(P, created.number)
    assert (mr.head_sha, mr.author, mr.verdict, mr.draft) == (SHA, "frogfix-bot", "open", True)
    gitlab_double.set_mr_state(P, created.number, "merged", by="maint")
    assert forge.get_mr(P, created.number).verdict == "merged"


def test_gitlab_update_keeps_a_ready_mr_ready(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    """A human marked the MR ready: the next round's update must not make it a draft again."""
    forge = gitlab(gitlab_double, retry)
    mr, _ = upsert_draft_mr(forge, P, BRANCH, "main", "Fix crash (#1)", "round 0")
    gitlab_double.set_mr_ready(P, mr.number)
    again, created = upsert_draft_mr(forge, P, BRANCH, "main", "Fix crash (#1)", "round 1")
    assert not created and not again.draft and again.title == "Fix crash (#1)"
    put = gitlab_double.calls("PUT", "merge_requests")[-1].body
    assert put["title"] == "Fix crash (#1)" and "draft" not in put
    # and a draft stays a draft
    gitlab_double.set_mr_draft(P, mr.number)
    assert upsert_draft_mr(forge, P, BRANCH, "main", "Fix crash (#1)", "round 2")[0].draft


def test_gitlab_review_thread(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = gitlab(gitlab_double, retry)
    mr = gitlab_double.add_mr(P, BRANCH, title="Draft: Fix")
    gitlab_double.add_mr_note(P, mr["iid"], "/frogfix also round negative amounts", by="dev")
    line = gitlab_double.add_mr_note(
        P, mr["iid"], "off by one here", by="maint", position={"new_path": "calc.py", "new_line": 12}
    )
    thread = gitlab_double.mr_notes(P, mr["iid"])[-1]["discussion_id"]
    gitlab_double.add_mr_note(P, mr["iid"], "agreed", by="dev", discussion_id=thread)
    gitlab_double.add_mr_note(P, mr["iid"], "added 1 commit", by="dev", system=True)
    gitlab_double.add_mr_note(P, mr["iid"], f"my token? {gitlab_double.token}", by="rep")
    gitlab_double.resolve_discussion(P, mr["iid"], thread, by="maint")

    notes = forge.review_thread(P, mr["iid"])
    assert [(n.author, n.kind, n.path, n.line, n.resolved) for n in notes] == [
        ("dev", "note", None, None, None),
        ("maint", "diff_note", "calc.py", 12, True),
        ("dev", "diff_note", "calc.py", 12, True),
        ("rep", "note", None, None, None),
    ]
    assert notes[1].id == str(line["id"]) and notes[1].discussion_id == notes[2].discussion_id == thread
    assert notes[3].body == f"my token? {REDACTED}"  # the thread reaches the model: our token never does


def test_gitlab_review_thread_reads_every_page_and_is_bounded(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = gitlab(gitlab_double, retry)
    mr = gitlab_double.add_mr(P, BRANCH, title="Draft: Fix")
    for i in range(THREAD_NOTE_LIMIT + 30):
        gitlab_double.add_mr_note(P, mr["iid"], f"note {i}", by="dev")
    gitlab_double.add_mr_note(P, mr["iid"], "x" * (THREAD_BODY_LIMIT * 3), by="dev")
    notes = forge.review_thread(P, mr["iid"])
    assert len(notes) == THREAD_NOTE_LIMIT
    assert notes[-2].body == f"note {THREAD_NOTE_LIMIT + 29}"  # the newest are kept, oldest first
    assert len(notes[-1].body) <= THREAD_BODY_LIMIT and "trimmed by FrogFix" in notes[-1].body
    assert len(gitlab_double.calls("GET", "/discussions")) == 3  # 231 discussions at 100 a page


def test_gitlab_review_thread_of_a_real_discussions_answer(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    """The danger capture (9 discussions: system notes, individual notes, a DiffNote thread with a reply)."""
    real = json.loads(
        shared_fixture("gitlab/danger/api_responses/merge_request_1_discussions_response.json").read_text(
            encoding="utf-8"
        )
    )
    mr = gitlab_double.add_mr(P, BRANCH, title="Draft: Fix")
    gitlab_double.discussions[(mr["project_id"], mr["iid"])] = real
    notes = gitlab(gitlab_double, retry).review_thread(P, mr["iid"])
    human = [n for d in real for n in d["notes"] if not n["system"]]
    assert [n.id for n in notes] == [str(n["id"]) for n in sorted(human, key=lambda n: n["created_at"])]
    diff = [n for n in notes if n.kind == "diff_note"]
    assert diff and all(n.path and n.line and n.resolved is False for n in diff)
    assert {n.line for n in diff} == {9, 1}


def test_gitlab_reply_in_a_thread_and_on_the_mr(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    forge = gitlab(gitlab_double, retry)
    mr = gitlab_double.add_mr(P, BRANCH, title="Draft: Fix")
    gitlab_double.add_mr_note(P, mr["iid"], "rename this", by="dev", position={"new_path": "a.py", "new_line": 3})
    thread = gitlab_double.mr_notes(P, mr["iid"])[0]["discussion_id"]
    forge.reply(P, mr["iid"], f"Renamed it. {forge.git_auth_header()}", thread)
    forge.reply(P, mr["iid"], "Round 1 pushed.")
    mine = [n for n in gitlab_double.mr_notes(P, mr["iid"]) if n["author"]["username"] == "frogfix-bot"]
    assert [(n["discussion_id"] == thread, MARKER.sub("", n["body"])) for n in mine] == [
        (True, f"Renamed it. Basic {REDACTED}"),
        (False, "Round 1 pushed."),
    ]
    assert all(MARKER.match(n["body"]) for n in mine)
    assert not any(n.get("resolved") for n in gitlab_double.mr_notes(P, mr["iid"]))  # FrogFix resolves nothing
    assert gitlab_double.token not in gitlab_double.sent_text().replace("PRIVATE-TOKEN", "")


@pytest.mark.parametrize("discussion", ["f" * 40, "../../issues/1", ""], ids=["deleted", "hostile", "empty"])
def test_gitlab_reply_to_a_thread_that_is_not_there_goes_on_the_mr(
    gitlab_double: GitLabDouble, retry: RetryPolicy, discussion: str
) -> None:
    forge = gitlab(gitlab_double, retry)
    mr = gitlab_double.add_mr(P, BRANCH, title="Draft: Fix")
    forge.reply(P, mr["iid"], "Round 1 pushed.", discussion)
    [note] = gitlab_double.mr_notes(P, mr["iid"])
    assert MARKER.sub("", note["body"]) == "Round 1 pushed." and note["author"]["username"] == "frogfix-bot"
    assert not gitlab_double.notes  # nothing landed on an issue
    assert all("/issues/" not in r.path for r in gitlab_double.calls("POST"))


@pytest.mark.parametrize("thread", [True, False], ids=["in-thread", "on-mr"])
def test_gitlab_reply_whose_answer_was_lost_is_posted_once(
    gitlab_double: GitLabDouble, retry: RetryPolicy, thread: bool
) -> None:
    forge = gitlab(gitlab_double, retry)
    mr = gitlab_double.add_mr(P, BRANCH, title="Draft: Fix")
    gitlab_double.add_mr_note(P, mr["iid"], "please", by="dev", position={"new_path": "a.py", "new_line": 1})
    discussion = gitlab_double.mr_notes(P, mr["iid"])[0]["discussion_id"] if thread else None
    gitlab_double.fail_next(1, 502, method="POST", path_contains="/notes", after=True)
    forge.reply(P, mr["iid"], "done", discussion)
    assert [MARKER.sub("", n["body"]) for n in gitlab_double.mr_notes(P, mr["iid"])] == ["please", "done"]
    assert len(gitlab_double.calls("POST", "/notes")) == 1


def test_gitlab_ci_failures(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    """Failed jobs only (allow_failure left out), each with the cleaned tail of its trace, at most CI_JOB_LIMIT."""
    real_trace = shared_fixture("gitlab/gitlab-runner/job_trace_log-3.txt").read_text(encoding="utf-8")
    failing = "\x1b[31;1m$ pytest\x1b[0;m\n" + "".join(f"line {i}\n" for i in range(200)) + "FAILED test_calc.py\n"
    jobs = [
        {"name": "unit", "stage": "test", "status": "failed", "trace": failing + f"token={gitlab_double.token}\n"},
        {"name": "docs", "stage": "test", "status": "failed", "allow_failure": True, "trace": "optional"},
        {"name": "build", "stage": "build", "status": "success", "trace": real_trace},
        {"name": "real", "stage": "test", "status": "failed", "trace": real_trace},
    ] + [{"name": f"extra-{i}", "stage": "test", "status": "failed", "trace": ""} for i in range(25)]
    pipeline = gitlab_double.add_pipeline(P, sha=SHA, ref=BRANCH, status="failed", jobs=jobs)
    report = CiReport(system="gitlab_pipeline", id=str(pipeline["id"]), sha=SHA, status="failed", ref=BRANCH)

    found = gitlab(gitlab_double, retry).ci_failures(P, report, tail_lines=5)
    assert len(found) == CI_JOB_LIMIT
    assert [j.name for j in found[:3]] == ["unit", "real", "extra-0"]
    unit, real = found[0], found[1]
    assert unit.log_tail == f"line 197\nline 198\nline 199\nFAILED test_calc.py\ntoken={REDACTED}"
    assert (unit.status, unit.stage, unit.failure_reason) == ("failed", "test", "script_failure")
    assert unit.url and unit.url.endswith(f"/-/jobs/{unit.id}")
    assert "\x1b" not in real.log_tail and "section_" not in real.log_tail and real.log_tail.endswith("Job succeeded")
    asked = gitlab_double.calls("GET", f"/pipelines/{pipeline['id']}/jobs")
    assert asked and all(r.query.get("scope[]") == ["failed"] for r in asked) and len(asked) == 2  # 28 at 20 a page
    assert len(gitlab_double.calls("GET", "/trace")) == CI_JOB_LIMIT


def test_gitlab_ci_failures_without_a_trace(gitlab_double: GitLabDouble, retry: RetryPolicy) -> None:
    pipeline = gitlab_double.add_pipeline(
        P, sha=SHA, ref=BRANCH, status="failed", jobs=[{"name": "unit", "status": "failed", "trace": "boom"}]
    )
    gitlab_double.traces.clear()  # erased or expired: the listing still has the job, its log is gone
    report = CiReport(system="gitlab_pipeline", id=str(pipeline["id"]), sha=SHA, status="failed")
    [job] = gitlab(gitlab_double, retry).ci_failures(P, report, tail_lines=5)
    assert (job.name, job.log_tail) == ("unit", "")
    with pytest.raises(ForgeError, match="not a number"):
        gitlab(gitlab_double, retry).ci_failures(P, CiReport("gitlab_pipeline", "1/../x", SHA, "failed"), 5)


def test_gitlab_merge_source_is_the_second_parent_of_a_merge_commit(
    gitlab_double: GitLabDouble, retry: RetryPolicy
) -> None:
    forge = gitlab(gitlab_double, retry)
    merge, main = "8c2d4e6f10a3b5c7d9e1f20a4b6c8d0e2f4a6b81", "1" * 40
    gitlab_double.add_commit(P, merge, parents=[main, SHA], title="Merge branch 'frogfix/issue-1' into 'main'")
    gitlab_double.add_commit(P, main, parents=["2" * 40])
    assert forge.merge_source(P, merge) == SHA
    assert forge.merge_source(P, main) is None  # one parent: no merged result
    gitlab_double.add_commit(P, "3" * 40, parents=["1" * 40, "not a sha"])
    assert forge.merge_source(P, "3" * 40) is None
    with pytest.raises(ForgeError, match="not a commit id"):  # checked before it goes into the URL
        forge.merge_source(P, "../../../user")
    assert [c.path for c in gitlab_double.calls("GET", "/repository/commits/")] == [
        f"/api/v4/projects/{P}/repository/commits/{sha}" for sha in (merge, main, "3" * 40)
    ]


# ---------------------------------------------------------------------------------------------
# Gitea / Forgejo
# ---------------------------------------------------------------------------------------------


def test_gitea_bot_username_is_read_once(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    forge = gitea(gitea_double, retry)
    assert forge.bot_username() == forge.bot_username() == "frogfix-bot"
    assert len(gitea_double.calls("GET", "/api/v1/user")) == 1


def test_gitea_get_mr_reads_head_author_and_verdict(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    forge = gitea(gitea_double, retry)
    pull = gitea_double.add_pull(P, BRANCH, title="WIP: Fix")
    gitea_double.set_pull_head(P, pull["number"], SHA)
    mr = forge.get_mr(P, pull["number"])
    assert (mr.head_sha, mr.author, mr.verdict, mr.draft) == (SHA, "frogfix-bot", "open", True)
    gitea_double.set_pull_state(P, pull["number"], "closed")
    assert forge.get_mr(P, pull["number"]).verdict == "closed"


@pytest.mark.parametrize("draft_field", [False, True], ids=["gitea-1.16-1.21", "gitea-1.22+"])
def test_gitea_update_keeps_a_ready_pull_ready(
    gitea_double: GiteaDouble, retry: RetryPolicy, draft_field: bool
) -> None:
    gitea_double.draft_field = draft_field
    forge = gitea(gitea_double, retry)
    mr, _ = upsert_draft_mr(forge, P, BRANCH, "main", "Fix crash (#1)", "round 0")
    gitea_double.set_pull_ready(P, mr.number)
    again, created = upsert_draft_mr(forge, P, BRANCH, "main", "WIP: Fix crash (#1)", "round 1")
    assert not created and not again.draft and again.title == "Fix crash (#1)"
    assert gitea_double.calls("PATCH", "/pulls/")[-1].body["title"] == "Fix crash (#1)"


def test_gitea_review_thread(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    forge = gitea(gitea_double, retry)
    pull = gitea_double.add_pull(P, BRANCH, title="WIP: Fix")
    n = pull["number"]
    gitea_double.add_pr_comment(P, n, "/frogfix also round negative amounts", by="dev")
    review = gitea_double.add_review(
        P,
        n,
        by="boss",
        type="REQUEST_CHANGES",
        body="Not yet.",
        comments=[
            {"path": "calc.py", "line": 12, "body": "off by one"},
            {"path": "old.py", "line": -4, "body": "why removed?"},
        ],
    )
    gitea_double.resolve_review_comment(P, n, review["_comments"][1]["id"], by="boss")
    gitea_double.add_review(P, n, by="dev", type="PENDING", body="not submitted yet")
    gitea_double.add_review(P, n, by="dev", type="COMMENT", comments=[{"path": "calc.py", "line": 3, "body": "nit"}])

    notes = forge.review_thread(P, n)
    assert [(x.author, x.kind, x.path, x.line, x.resolved) for x in notes] == [
        ("dev", "note", None, None, None),
        ("boss", "review", None, None, None),
        ("boss", "diff_note", "calc.py", 12, False),
        ("boss", "diff_note", "old.py", 4, True),
        ("dev", "diff_note", "calc.py", 3, False),
    ]
    assert notes[1].body == "[review: request changes]\nNot yet."
    assert all("not submitted" not in x.body for x in notes)


def test_gitea_review_thread_of_a_real_review_listing(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    """jenkins-x's captured reviews answer (a PENDING review): nothing a reviewer submitted, so no note."""
    real = json.loads(shared_fixture("gitea/jenkins-x_go-scm/api_responses/reviews.json").read_text("utf-8"))
    pull = gitea_double.add_pull(P, BRANCH, title="WIP: Fix")
    gitea_double.reviews[(P, pull["number"])] = [{**r, "_comments": []} for r in real]
    assert gitea(gitea_double, retry).review_thread(P, pull["number"]) == []
    submitted = [{**r, "state": "REQUEST_CHANGES", "_comments": []} for r in real]
    gitea_double.reviews[(P, pull["number"])] = submitted
    [note] = gitea(gitea_double, retry).review_thread(P, pull["number"])
    assert (note.author, note.kind, note.body) == ("jcitizen", "review", "[review: request changes]\nThis is a review")


def test_gitea_reply_is_a_pull_comment_posted_once(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    forge = gitea(gitea_double, retry)
    pull = gitea_double.add_pull(P, BRANCH, title="WIP: Fix")
    gitea_double.fail_next(1, 502, method="POST", path_contains="/comments", after=True)
    forge.reply(P, pull["number"], f"Done. {gitea_double.token}", discussion_id="ignored-on-gitea")
    [comment] = gitea_double.pr_comments(P, pull["number"])
    assert comment["user"]["login"] == "frogfix-bot"
    assert MARKER.match(comment["body"]) and MARKER.sub("", comment["body"]) == f"Done. {REDACTED}"


def test_gitea_ci_failures_are_the_latest_failing_statuses(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    forge = gitea(gitea_double, retry)
    gitea_double.add_status(P, SHA, "ci/test", "pending", "running")
    gitea_double.add_status(P, SHA, "ci/test", "failure", "3 tests failed", "https://ci.example/1")
    gitea_double.add_status(P, SHA, "ci/lint", "failure", "lint failed")
    gitea_double.add_status(P, SHA, "ci/lint", "success", "lint passed")  # fixed since: not failing
    gitea_double.add_status(P, SHA, "ci/build", "error", f"runner crashed {gitea_double.token}")
    gitea_double.add_status(P, "0" * 40, "ci/other", "failure", "another commit")
    for i in range(60):  # more than a page
        gitea_double.add_status(P, SHA, f"ci/ok-{i}", "success")
    report = CiReport(system="gitea_status", id="ci/test", sha=SHA, status="failed")
    found = forge.ci_failures(P, report, tail_lines=10)
    assert [(j.name, j.status, j.log_tail, j.url) for j in found] == [
        ("ci/test", "failure", "3 tests failed", "https://ci.example/1"),
        ("ci/build", "error", f"runner crashed {REDACTED}", None),
    ]
    assert len(gitea_double.calls("GET", f"/commits/{SHA}/statuses")) >= 2


def test_gitea_ci_failures_of_a_real_statuses_answer(gitea_double: GiteaDouble, retry: RetryPolicy) -> None:
    """drone's captured statuses answer: one `status: success`, so nothing failed; a hostile sha is refused."""
    real = json.loads(shared_fixture("gitea/go-scm/api_responses/statuses.json").read_text("utf-8"))
    gitea_double.statuses[(P, SHA)] = real
    forge = gitea(gitea_double, retry)
    assert forge.ci_failures(P, CiReport("gitea_status", "ci", SHA, "failed"), 10) == []
    gitea_double.statuses[(P, SHA)] = [{**s, "status": "failure"} for s in real]
    [job] = forge.ci_failures(P, CiReport("gitea_status", "ci", SHA, "failed"), 10)
    assert (job.name, job.url) == ("continuous-integration/drone", "https://example.com")
    before = len(gitea_double.requests)
    with pytest.raises(ForgeError, match="not a commit id"):
        forge.ci_failures(P, CiReport("gitea_status", "ci", "../../admin", "failed"), 10)
    assert len(gitea_double.requests) == before
