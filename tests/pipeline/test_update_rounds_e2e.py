"""Update rounds end to end (issue 25), on GitLab and Gitea: the MR's target branch moved, and FrogFix
merges it into its branch as one merge commit, never a force push, verified against the new target.

Everything is real but the forges' APIs (doubles that compute an MR's conflicts from the real git
repository behind them, as the real APIs report them) and the model (scripted): the webhook, the
triage, git over HTTP, bubblewrap sandboxes and the tests of the sample repository.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from app.db import session_scope
from app.jobs import rounds
from app.models import Job, RoundRequest, utcnow
from app.settings import get_settings
from tests.conftest import configure
from tests.doubles.openai_server import assistant, text_call, tool_call
from tests.pipeline.conftest import PROJECT, World
from tests.pipeline.test_rounds_e2e import (
    GiteaPr,
    GitLabMr,
    branch_head,
    commit_to,
    first_user_message,
    git,
    job,
    newest_round,
    requests,
    thread,
    triage,
)
from worker.tasks import check_update_task, run_job

FIXED = "    return a + b\n"


def main_push(world: World, forge: str, files: dict[str, str], message: str = "work on main") -> str:
    """A maintainer pushes a commit to the target branch `main` (writing `files`); its sha."""
    return commit_to(world, forge, "main", files, message, who="Maintainer")


def calc_on(world: World, forge: str, ref: str) -> str:
    return git(world.bare(forge), "show", f"{ref}:calc.py") + "\n"  # `git` strips the last newline


# main renames add()'s parameters: the fix's line and main's change meet, so git cannot merge them.
RENAMED = '''"""A tiny calculator."""


def add(x: int, y: int) -> int:
    return x - y


def mul(a: int, b: int) -> int:
    return a * b
'''
RESOLVED = RENAMED.replace("return x - y", "return x + y")


def resolving_script(text: str = RESOLVED) -> list[Any]:
    """The agent reads the conflicted file, writes it resolved, runs the tests, says how."""
    return [
        assistant(None, tool_calls=[tool_call("Read", {"file_path": "calc.py"})]),
        assistant(text_call("Write", file_path="calc.py", content=text)),
        assistant(None, tool_calls=[tool_call("Bash", {"command": "python3 -m pytest -q"})]),
        assistant("calc.py: kept main's parameter names x and y, with the fix's addition."),
    ]


def linked(world: World) -> World:
    """The forge doubles report each MR's heads and conflicts from the real repositories."""
    world.gitlab.link_repository(PROJECT, world.bare("gitlab"))
    world.gitea.link_repository(PROJECT, world.bare("gitea"))
    return world


def merge_parents(world: World, forge: str, commit: str) -> list[str]:
    return git(world.bare(forge), "rev-list", "--parents", "-n", "1", commit).split()[1:]


# ----------------------------------------------------------------------------------------------
# GitLab
# ----------------------------------------------------------------------------------------------


def test_gitlab_rebase_command_merges_a_clean_target_as_one_merge_commit(client: Any, world: World) -> None:
    mr = GitLabMr(client, linked(world))
    before = branch_head(world, "gitlab", mr.branch)
    target = main_push(world, "gitlab", {"NEWS.md": "main moved on\n"})
    calls = world.model.count

    answer = mr.comment("/frogfix rebase")
    assert answer["outcome"] == "round_request", answer
    with session_scope() as s:
        assert s.get(RoundRequest, answer["request_id"]).kind == "update"
    assert triage(answer["request_id"]) == "accepted"
    update = newest_round(mr.thread_id)
    assert update.round == 1 and update.round_kind == "update" and update.trigger_user == "dev"
    assert run_job(update.id) == "done", job(update.id).error

    after = branch_head(world, "gitlab", mr.branch)
    assert merge_parents(world, "gitlab", after) == [before, target]  # one merge: the old head first
    assert git(world.bare("gitlab"), "rev-list", "--count", f"{before}..{after}", "--first-parent") == "1"
    assert FIXED in calc_on(world, "gitlab", after) and "main moved on" in git(
        world.bare("gitlab"), "show", f"{after}:NEWS.md"
    )
    assert world.model.count == calls  # a clean merge needs no model
    [push] = [p for p in world.git_gitlab.pushes if any(u[1] == after for u in p.updates)]
    assert push.updates == [(before, after, f"refs/heads/{mr.branch}")] and push.options == ["ci.skip"]
    assert "[skip ci]" in git(world.bare("gitlab"), "log", "-1", "--format=%B", after)
    done = job(update.id)
    assert done.start_commit == before and done.base_commit == target and done.pushed_commit == after
    [reply] = mr.bot_notes()
    assert "merged `main`" in reply["body"] and target[:12] in reply["body"] and "cleanly" in reply["body"]
    assert "failed_before" in reply["body"] or "reproduced" in reply["body"]  # the tests on the new target
    description = mr.mr()["description"]
    assert "| update |" in description  # the rounds section gains the row
    assert mr.mr()["has_conflicts"] is False


def test_gitlab_conflict_is_resolved_by_the_agent_and_verified(client: Any, world: World) -> None:
    mr = GitLabMr(client, linked(world))
    before = branch_head(world, "gitlab", mr.branch)
    target = main_push(world, "gitlab", {"calc.py": RENAMED}, "rename add()'s parameters")
    assert mr.mr()["has_conflicts"] is True
    world.model.add(*resolving_script())

    answer = mr.comment("/frogfix update please")
    assert triage(answer["request_id"]) == "accepted"
    update = newest_round(mr.thread_id)
    assert run_job(update.id) == "done", job(update.id).error

    after = branch_head(world, "gitlab", mr.branch)
    assert merge_parents(world, "gitlab", after) == [before, target]
    assert calc_on(world, "gitlab", after) == RESOLVED
    task = first_user_message(world)
    assert "calc.py" in task and "<<<UNTRUSTED_COMMITS_BEGIN>>>" in task and "rename add()'s parameters" in task
    assert "return a + b" in task  # the MR's own diff
    [reply] = mr.bot_notes()
    assert "Conflicts resolved (1)" in reply["body"] and "`calc.py`: combined both sides" in reply["body"]
    assert "kept main's parameter names" in reply["body"]  # the agent's words, fenced
    with session_scope() as s:
        done = s.get(Job, update.id)
        assert done is not None and done.round_input["merge"]["conflicted"] == ["calc.py"]


def test_gitlab_resolution_that_leaves_markers_is_refused_with_a_reply(client: Any, world: World) -> None:
    mr = GitLabMr(client, linked(world))
    before = branch_head(world, "gitlab", mr.branch)
    main_push(world, "gitlab", {"calc.py": RENAMED})
    world.model.add(
        assistant(text_call("Write", file_path="NOTES.md", content="looked at it\n")),
        assistant("Done."),
    )
    answer = mr.comment("/frogfix rebase")
    assert triage(answer["request_id"]) == "accepted"
    update = newest_round(mr.thread_id)
    assert run_job(update.id) == "no_fix"
    assert branch_head(world, "gitlab", mr.branch) == before  # nothing pushed
    [reply] = mr.bot_notes()
    assert "update round 1" in reply["body"] and "conflict markers are left in calc.py" in reply["body"]


def test_gitlab_resolution_that_drops_the_fix_is_refused(client: Any, world: World) -> None:
    mr = GitLabMr(client, linked(world))
    before = branch_head(world, "gitlab", mr.branch)
    main_push(world, "gitlab", {"calc.py": RENAMED})
    world.model.add(*resolving_script(RENAMED))  # main's side taken whole: the fix is gone
    answer = mr.comment("/frogfix rebase")
    assert triage(answer["request_id"]) == "accepted"
    assert run_job(newest_round(mr.thread_id).id) == "no_fix"
    assert branch_head(world, "gitlab", mr.branch) == before
    [reply] = mr.bot_notes()
    assert "drops the fix's own change to calc.py" in reply["body"]


def test_gitlab_bug_already_fixed_on_the_target_pushes_nothing_and_says_so(client: Any, world: World) -> None:
    mr = GitLabMr(client, linked(world))
    before = branch_head(world, "gitlab", mr.branch)
    fixed_upstream = calc_on(world, "gitlab", before)  # main takes the very same fix
    main_push(world, "gitlab", {"calc.py": fixed_upstream, "NEWS.md": "fixed add()\n"}, "fix add() upstream")
    answer = mr.comment("/frogfix rebase")
    assert triage(answer["request_id"]) == "accepted"
    update = newest_round(mr.thread_id)
    assert run_job(update.id) == "no_fix"
    assert branch_head(world, "gitlab", mr.branch) == before
    [reply] = mr.bot_notes()
    assert "The fix no longer applies" in reply["body"] and reply["body"].lower().count("nothing was pushed") == 1


def test_gitlab_a_proven_fix_must_be_proven_again_on_the_new_target(client: Any, world: World) -> None:
    """Round 0 proved its fix (test_add failed before it). main then fixes add() its own way, in lines the
    fix also changed: the agent resolves the conflict into code that passes, but on the new main the test
    no longer fails without the fix, so nothing proves it: FrogFix pushes nothing and says the bug looks
    fixed there."""
    mr = GitLabMr(client, linked(world))
    before = branch_head(world, "gitlab", mr.branch)
    main_push(world, "gitlab", {"calc.py": RENAMED.replace("return x - y", "return y + x")}, "fix add() upstream")
    world.model.add(*resolving_script())
    assert triage(mr.comment("/frogfix rebase")["request_id"]) == "accepted"
    update = newest_round(mr.thread_id)
    assert run_job(update.id) == "no_fix", job(update.id).error
    assert branch_head(world, "gitlab", mr.branch) == before
    [reply] = mr.bot_notes()
    assert "The fix no longer applies: it was proven (failed_before) before" in reply["body"]
    assert "the bug looks fixed there already" in reply["body"]


def test_gitlab_a_resolution_that_changes_other_files_is_refused(client: Any, world: World) -> None:
    mr = GitLabMr(client, linked(world))
    before = branch_head(world, "gitlab", mr.branch)
    main_push(world, "gitlab", {"calc.py": RENAMED})
    world.model.add(
        assistant(text_call("Write", file_path="calc.py", content=RESOLVED)),
        assistant(text_call("Write", file_path="tests/test_calc.py", content="def test_none() -> None:\n    pass\n")),
        assistant("Resolved, and simplified the tests."),
    )
    assert triage(mr.comment("/frogfix rebase")["request_id"]) == "accepted"
    assert run_job(newest_round(mr.thread_id).id) == "no_fix"
    assert branch_head(world, "gitlab", mr.branch) == before
    [reply] = mr.bot_notes()
    assert "changes files that did not conflict: tests/test_calc.py" in reply["body"]


def test_gitlab_a_humans_commit_on_the_branch_is_kept(client: Any, world: World) -> None:
    from tests.pipeline.test_rounds_e2e import human_push

    mr = GitLabMr(client, linked(world))
    theirs = human_push(world, "gitlab", mr.branch, "NOTES.md", "a reviewer's notes\n")
    target = main_push(world, "gitlab", {"NEWS.md": "main moved on\n"})
    answer = mr.comment("/frogfix rebase")
    assert triage(answer["request_id"]) == "accepted"
    assert run_job(newest_round(mr.thread_id).id) == "done"
    after = branch_head(world, "gitlab", mr.branch)
    assert merge_parents(world, "gitlab", after) == [theirs, target]
    assert git(world.bare("gitlab"), "show", f"{after}:NOTES.md") == "a reviewer's notes"


def test_gitlab_nothing_to_merge_says_so(client: Any, world: World) -> None:
    mr = GitLabMr(client, linked(world))
    before = branch_head(world, "gitlab", mr.branch)
    answer = mr.comment("/frogfix rebase")
    assert triage(answer["request_id"]) == "accepted"
    assert run_job(newest_round(mr.thread_id).id) == "no_fix"
    assert branch_head(world, "gitlab", mr.branch) == before
    [reply] = mr.bot_notes()
    assert "already contains main" in reply["body"]


def test_gitlab_update_rounds_have_their_own_cap(client: Any, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    configure(monkeypatch, max_update_rounds="1")
    mr = GitLabMr(client, linked(world))
    main_push(world, "gitlab", {"NEWS.md": "one\n"})
    assert triage(mr.comment("/frogfix rebase")["request_id"]) == "accepted"
    assert run_job(newest_round(mr.thread_id).id) == "done"
    main_push(world, "gitlab", {"NEWS.md": "two\n"})
    assert triage(mr.comment("/frogfix rebase")["request_id"]) == "ignored"
    assert any("FROGFIX_MAX_UPDATE_ROUNDS (1)" in n["body"] for n in mr.bot_notes())
    assert triage(mr.comment("/frogfix please add a docstring")["request_id"]) == "accepted"  # review rounds apart


def test_gitlab_auto_update_starts_once_per_target_head_and_never_loops(
    client: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    mr = GitLabMr(client, linked(world))
    assert check_update_task.run(mr.thread_id) == "nothing"  # FROGFIX_AUTO_UPDATE is off by default
    configure(monkeypatch, auto_update="true")
    assert check_update_task.run(mr.thread_id) == "nothing"  # no conflict: nothing to do
    main_push(world, "gitlab", {"calc.py": RENAMED})
    world.model.add(
        assistant(text_call("Write", file_path="NOTES.md", content="not a resolution\n")), assistant("Done.")
    )
    world.gitlab.set_merge_checking(PROJECT, mr.iid, True)
    assert check_update_task.run(mr.thread_id) == "nothing"  # GitLab is still checking: wait
    world.gitlab.set_merge_checking(PROJECT, mr.iid, False)

    started = check_update_task.run(mr.thread_id)
    assert started.startswith("round ")
    update = newest_round(mr.thread_id)
    assert update.round_kind == "update" and update.trigger_user == "dev"  # acts for who started the thread
    assert check_update_task.run(mr.thread_id) == "nothing"  # the same head again: no second request
    assert run_job(update.id) == "no_fix"  # the resolution left markers
    # The MR still conflicts at the same target head: FrogFix does not try it again, by sweep or comment.
    assert check_update_task.run(mr.thread_id) == "nothing"
    assert triage(mr.comment("looks odd", by="dev")["request_id"]) == "ignored"
    assert len([j for j in thread(mr.thread_id) if j.round_kind == "update"]) == 1
    # The target moves again: one more try, on the new head, which the agent resolves.
    target = main_push(world, "gitlab", {"NEWS.md": "and more\n"})
    world.model.add(*resolving_script())
    assert check_update_task.run(mr.thread_id).startswith("round ")
    second = newest_round(mr.thread_id)
    assert run_job(second.id) == "done", job(second.id).error
    assert merge_parents(world, "gitlab", branch_head(world, "gitlab", mr.branch))[1] == target
    assert check_update_task.run(mr.thread_id) == "nothing"  # merged: no conflict left, no loop
    keys = [r.dedupe_key for r in requests(mr.thread_id) if r.kind == "update"]
    assert len(keys) == 2 and all(k.startswith(rounds.AUTO_UPDATE_PREFIX) for k in keys)


def test_auto_update_check_after_a_comment_and_the_sweeps_candidates(
    client: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.sweep import send_update_checks

    mr = GitLabMr(client, linked(world))
    configure(monkeypatch, auto_update="true")
    main_push(world, "gitlab", {"calc.py": RENAMED})
    with session_scope() as s:
        assert rounds.threads_to_check(s, utcnow()) == [mr.thread_id]
    # a comment arrives (not addressed to FrogFix): its triage also looks for a moved target
    assert triage(mr.comment("a note to a colleague", by="dev")["request_id"]) == "ignored"
    update = newest_round(mr.thread_id)
    assert update.round_kind == "update" and update.status == "queued"
    with session_scope() as s:
        thread_job = s.get(Job, mr.thread_id)
        assert thread_job is not None and thread_job.mr_state == "open" and thread_job.update_checked_at is not None
        assert rounds.threads_to_check(s, utcnow()) == []  # an issue's job is active
    # the sweep sends checks only for open MRs not checked lately, and none while the issue has a job
    assert send_update_checks(timedelta(seconds=get_settings().auto_update_check_seconds)) == 0


def test_a_forge_outage_during_the_update_check_is_logged_not_fatal(
    client: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    mr = GitLabMr(client, linked(world))
    configure(monkeypatch, auto_update="true")
    main_push(world, "gitlab", {"calc.py": RENAMED})
    world.gitlab.fail_next(20, status=503, path_contains=f"/merge_requests/{mr.iid}")
    assert check_update_task.run(mr.thread_id) == "deferred"
    assert [r for r in requests(mr.thread_id) if r.kind == "update"] == []  # nothing recorded: asked again later
    with session_scope() as s:
        thread_job = s.get(Job, mr.thread_id)
        assert thread_job is not None and thread_job.mr_state is None


# ----------------------------------------------------------------------------------------------
# Gitea
# ----------------------------------------------------------------------------------------------


def test_gitea_update_command_merges_cleanly(client: Any, world: World) -> None:
    pr = GiteaPr(client, linked(world))
    before = branch_head(world, "gitea", pr.branch)
    target = main_push(world, "gitea", {"NEWS.md": "main moved on\n"})
    answer = pr.comment("/frogfix update")
    assert triage(answer["request_id"]) == "accepted"
    update = newest_round(pr.thread_id)
    assert update.round_kind == "update"
    assert run_job(update.id) == "done", job(update.id).error
    after = branch_head(world, "gitea", pr.branch)
    assert merge_parents(world, "gitea", after) == [before, target]
    [push] = [p for p in world.git_gitea.pushes if any(u[1] == after for u in p.updates)]
    assert push.updates == [(before, after, f"refs/heads/{pr.branch}")]
    assert any("merged `main`" in c["body"] for c in pr.bot_comments())


def test_gitea_auto_update_resolves_a_conflict_the_api_reports(
    client: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    pr = GiteaPr(client, linked(world))
    configure(monkeypatch, auto_update="true")
    before = branch_head(world, "gitea", pr.branch)
    target = main_push(world, "gitea", {"calc.py": RENAMED})
    world.model.add(*resolving_script())
    assert check_update_task.run(pr.thread_id).startswith("round ")
    update = newest_round(pr.thread_id)
    assert run_job(update.id) == "done", job(update.id).error
    after = branch_head(world, "gitea", pr.branch)
    assert merge_parents(world, "gitea", after) == [before, target]
    assert calc_on(world, "gitea", after) == RESOLVED
    replies = [c["body"] for c in pr.bot_comments()]
    assert any("Conflicts resolved (1)" in body for body in replies)
    assert check_update_task.run(pr.thread_id) == "nothing"


def test_an_update_round_replays_from_its_conflicted_start_even_from_a_fresh_mirror(
    client: Any, world: World
) -> None:
    import shutil

    from worker.commands.replay import replay_job
    from worker.git import gitcalls, mirrors

    mr = GitLabMr(client, linked(world))
    main_push(world, "gitlab", {"calc.py": RENAMED})
    world.model.add(*resolving_script())
    assert triage(mr.comment("/frogfix rebase")["request_id"]) == "accepted"
    update = newest_round(mr.thread_id)
    assert run_job(update.id) == "done", job(update.id).error

    report = replay_job(update.id)
    assert report.status == "reproduced", report.message
    start = report.start_commit
    assert start is not None and start != job(update.id).start_commit  # the private conflicted merge
    assert report.patch and "x + y" in report.patch and "<<<<<<<" in report.patch  # markers resolved away

    # The mirror made again from the forge lacks that never-pushed commit: replay makes it again.
    mirror = mirrors.RepoCache(get_settings().data_dir / "mirrors").path_for(gitcalls.mirror_key("gitlab", PROJECT))
    shutil.rmtree(mirror)
    progress: list[str] = []
    again = replay_job(update.id, progress=progress.append)
    assert again.status == "reproduced", again.message
    assert again.start_commit == start
    assert any("made again from its merge" in line for line in progress)

    # Live, the model runs again and its resolution is judged as the round judged it: on the target.
    world.model.add(*resolving_script())
    live = replay_job(update.id, live=True)
    assert live.status == "live" and live.outcome == "verified", live.message
    world.model.add(assistant(text_call("Write", file_path="NOTES.md", content="no resolution\n")), assistant("Done."))
    refused = replay_job(update.id, live=True)
    assert refused.outcome == "refused" and "conflict markers are left in calc.py" in (refused.message or "")


def test_a_clean_update_round_says_there_is_nothing_to_replay(client: Any, world: World) -> None:
    from worker.commands.replay import ReplayError, replay_job

    mr = GitLabMr(client, linked(world))
    main_push(world, "gitlab", {"NEWS.md": "moved\n"})
    assert triage(mr.comment("/frogfix rebase")["request_id"]) == "accepted"
    update = newest_round(mr.thread_id)
    assert run_job(update.id) == "done"
    with pytest.raises(ReplayError, match="update round that ran no model"):
        replay_job(update.id)
