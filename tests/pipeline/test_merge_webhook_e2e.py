"""The human end of the chain through the webhook, on the GitLab and Gitea doubles: a person merges a signed
FrogFix MR (a merge commit, and a squash), the double's merge webhook reaches FrogFix, the worker signs the
merge statement, and the job's bundle then verifies with it: the merging user, the attested head, and the
merged change matching the attested patch by patch id; a close is signed without a merged change."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.attestations import signing
from app.attestations.statement import MERGE_PREDICATE_TYPE
from app.db import session_scope
from app.jobs import records
from tests.conftest import ADMIN_TOKEN
from tests.pipeline.conftest import GITEA_SECRET, PROJECT, World
from tests.pipeline.test_verify_replay import _signed_bundle
from tests.webhook_requests import gitea_headers, gitlab_headers
from worker.commands.cli import cli
from worker.tasks import attest_merge_task


def _deliver(client: Any, world: World, forge: str, hook: dict[str, Any]) -> dict[str, Any]:
    raw = json.dumps(hook).encode()
    if forge == "gitlab":
        headers = gitlab_headers(event="Merge Request Hook")
    else:
        headers = gitea_headers(raw, event="pull_request", event_type="pull_request", secret=GITEA_SECRET)
    r = client.post(f"/webhooks/{forge}", content=raw, headers=headers)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _merged_via_webhook(client: Any, world: World, tmp_path: Path, forge: str, squash: bool,
                        monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:  # fmt: skip
    sent: list[tuple[int, dict[str, Any]]] = []
    monkeypatch.setattr("app.web.webhooks.send_attest_merge", lambda job, merge: sent.append((job, merge)) or True)
    bundle = _signed_bundle(client, world, tmp_path, forge)
    job_id = int(bundle["job"])
    with session_scope() as session:
        number = int(records.get_job(session, job_id).mr_number or 0)
    if forge == "gitlab":
        world.gitlab.link_repository(PROJECT, world.bare(forge))
        hook = world.gitlab.merge_mr(PROJECT, number, by="dev", squash=squash)
    else:
        world.gitea.link_repository(PROJECT, world.bare(forge))
        hook = world.gitea.merge_pull(PROJECT, number, by="dev", squash=squash)
    answer = _deliver(client, world, forge, hook)
    assert answer["outcome"] == "merge_noted" and answer["job_id"] == job_id
    [(thread, merge)] = sent
    assert merge["action"] == "merged" and merge["by"] == "dev"
    assert attest_merge_task(thread, merge) == "signed"
    r = client.get(f"/api/jobs/{job_id}/attestations", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    return dict(r.json())


@pytest.mark.parametrize("squash", [False, True], ids=["merge-commit", "squash"])
@pytest.mark.parametrize("forge", ["gitlab", "gitea"])
def test_a_merge_webhook_signs_who_merged_and_the_bundle_verifies(
    client: Any, world: World, tmp_path: Path, forge: str, squash: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = _merged_via_webhook(client, world, tmp_path, forge, squash, monkeypatch)
    change, merge = bundle["attestations"]
    assert merge["kind"] == "merge"
    _, document = signing.read(merge["envelope"])
    predicate = document["predicate"]
    attested = signing.read(change["envelope"])[1]["subject"][0]["digest"]["gitCommit"]
    assert document["predicateType"] == MERGE_PREDICATE_TYPE and predicate["by"] == "dev"
    assert predicate["attested_head"]["commit"] == attested == predicate["mr_head"]
    assert predicate["patch_id"]["matches"] is True and predicate["unattested"] == []
    merged = predicate["merged"]["commit"]
    assert document["subject"][0]["digest"]["gitCommit"] == merged != attested
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(bundle))

    out = CliRunner().invoke(cli, ["verify", str(path), "--checkout", str(world.bare(forge))])

    assert out.exit_code == 0, out.output
    assert "PASS attestation 2 (merge) merged change: merged by dev" in out.output
    assert "PASS attestation 2 (merge) commit:" in out.output and "makes the attested patch" in out.output
    with session_scope() as session:
        assert "merge_attested" in [e.kind for e in records.job_events(session, int(bundle["job"]))]


def test_a_merge_webhook_for_an_mr_frogfix_did_not_open_is_ignored(client: Any, world: World) -> None:
    world.gitlab.add_mr(PROJECT, "someone/else")
    hook = json.loads(json.dumps(world.gitlab._merge_hook))
    hook["project"]["path_with_namespace"] = PROJECT
    hook["object_attributes"].update(iid=1, action="merge", state="merged", source_branch="someone/else")
    answer = _deliver(client, world, "gitlab", hook)
    assert answer["outcome"] == "ignored" and "not an MR FrogFix opened" in answer["reason"]


def test_a_closed_pull_is_signed_without_a_merged_change(
    client: Any, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[int, dict[str, Any]]] = []
    monkeypatch.setattr("app.web.webhooks.send_attest_merge", lambda job, merge: sent.append((job, merge)) or True)
    bundle = _signed_bundle(client, world, tmp_path, "gitea")
    job_id = int(bundle["job"])
    with session_scope() as session:
        number = int(records.get_job(session, job_id).mr_number or 0)
    branch = world.gitea.pulls[(PROJECT, number)]["head"]["ref"]
    head = subprocess.run(["git", "--git-dir", str(world.bare("gitea")), "rev-parse", branch],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    world.gitea.set_pull_head(PROJECT, number, head)
    pull = world.gitea.set_pull_state(PROJECT, number, "closed")
    hook = json.loads(json.dumps(world.gitea._closed_hook))
    hook.update(number=number, pull_request=pull, sender={"login": "dev"})
    hook["repository"]["full_name"] = PROJECT
    assert _deliver(client, world, "gitea", hook)["outcome"] == "merge_noted"
    [(thread, merge)] = sent
    assert merge["action"] == "closed" and merge["merged_commit"] is None
    assert attest_merge_task(thread, merge) == "signed"
    bundle = client.get(f"/api/jobs/{job_id}/attestations", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).json()
    [_, closed] = bundle["attestations"]
    predicate = signing.read(closed["envelope"])[1]["predicate"]
    assert predicate["action"] == "closed" and predicate["by"] == "dev" and predicate["merged"] is None
    path = tmp_path / "closed.json"
    path.write_text(json.dumps(bundle))
    out = CliRunner().invoke(cli, ["verify", str(path), "--checkout", str(world.bare("gitea"))])
    assert out.exit_code == 0, out.output
    assert "SKIP attestation 2 (merge) merged change: closed by dev" in out.output
    assert "SKIP attestation 2 (merge) commit: the MR was closed without a merge" in out.output


def test_a_merge_after_a_review_round_names_the_rounds_head_and_every_commit_attested(
    client: Any, world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.pipeline.signed import signed_round

    sent: list[tuple[int, dict[str, Any]]] = []
    monkeypatch.setattr("app.web.webhooks.send_attest_merge", lambda job, merge: sent.append((job, merge)) or True)
    mr, round_job, _ = signed_round(client, world, tmp_path)
    world.gitlab.link_repository(PROJECT, world.bare("gitlab"))
    hook = world.gitlab.merge_mr(PROJECT, mr.iid, by="dev")
    assert _deliver(client, world, "gitlab", hook)["outcome"] == "merge_noted"
    [(thread, merge)] = sent
    assert thread == mr.thread_id and attest_merge_task(thread, merge) == "signed"

    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    [round_item] = client.get(f"/api/jobs/{round_job.id}/attestations", headers=auth).json()["attestations"]
    bundle = client.get(f"/api/jobs/{mr.thread_id}/attestations", headers=auth).json()
    [_, merged] = bundle["attestations"]
    predicate = signing.read(merged["envelope"])[1]["predicate"]
    assert predicate["attested_head"]["statement"] == signing.envelope_digest(round_item["envelope"])
    assert len(predicate["commits"]) == 2 and predicate["unattested"] == [] and predicate["patch_id"]["matches"]
    path = tmp_path / "thread.json"
    path.write_text(json.dumps(bundle))
    out = CliRunner().invoke(cli, ["verify", str(path), "--checkout", str(world.bare("gitlab"))])
    assert out.exit_code == 0, out.output
    assert "PASS attestation 2 (merge) commits: all 2 commit(s) on the MR were attested" in out.output
