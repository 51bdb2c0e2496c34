"""Issue 41 through the real pipeline on the GitLab and Gitea doubles: the pushed commit carries the
`Assisted-by` trailer, the MR names the signed statement, and the job's bundle from the API verifies
(signature, patch, trajectory, log, and the commit in the forge's repository); without a key the MR says
"unsigned", and FROGFIX_REQUIRE_ATTESTATION refuses to publish."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.attestations import signing
from app.db import session_scope
from app.jobs import records
from tests.conftest import ADMIN_TOKEN, configure
from tests.pipeline.conftest import GITEA_TOKEN, GITLAB_TOKEN, MODEL_KEY, PROJECT, TRIGGER, World
from tests.pipeline.signed import signed_round, signing_key
from worker.commands.cli import cli
from worker.tasks import run_job


def _commit_message(bare: Path, branch: str) -> str:
    return subprocess.run(["git", "--git-dir", str(bare), "log", "-1", "--format=%B", branch],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip


def _start(client: Any, world: World, forge: str) -> int:
    if forge == "gitlab":
        number = world.gitlab.add_issue(PROJECT, title="add() returns the difference", author="rep")["iid"]
        world.gitlab.add_label(PROJECT, number, TRIGGER, by="dev")
        body, headers = world.gitlab_webhook(number)
    else:
        number = world.gitea.add_issue(PROJECT, title="add() returns the difference", author="rep")["number"]
        world.gitea.add_label(PROJECT, number, TRIGGER, by="dev")
        body, headers = world.gitea_webhook(number)
    r = client.post(f"/webhooks/{forge}", content=body, headers=headers)
    assert r.status_code == 202, r.text
    return int(r.json()["job_id"])


def _description(world: World, forge: str) -> str:
    if forge == "gitlab":
        [mr] = world.gitlab.open_mrs(PROJECT)
        return str(mr["description"])
    [pr] = world.gitea.open_pulls(PROJECT)
    return str(pr["body"])


@pytest.mark.parametrize("forge", ["gitlab", "gitea"])
def test_a_published_change_is_signed_and_its_bundle_verifies(
    client: Any, world: World, tmp_path: Path, forge: str
) -> None:
    private, kid = signing_key(world, tmp_path)
    job_id = _start(client, world, forge)

    assert run_job(job_id) == "done"

    with session_scope() as session:
        job = records.get_job(session, job_id)
        branch, base, trigger = job.branch, job.base_commit, job.trigger_user
    message = _commit_message(world.bare(forge), branch)
    assert message.strip().splitlines()[-1] == "Assisted-by: scripted (FrogFix 0.1.0)"
    r = client.get(f"/api/jobs/{job_id}/attestations", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200, r.text
    bundle = r.json()
    [item] = bundle["attestations"]
    envelope = item["envelope"]
    assert envelope["signatures"][0]["keyid"] == kid
    assert f"`{signing.envelope_digest(envelope)}`" in _description(world, forge)
    _, document = signing.read(envelope)
    predicate = document["predicate"]
    assert predicate["forge"] == forge and predicate["base_commit"] == base and predicate["trigger_user"] == trigger
    assert predicate["evidence"]["before"]["exit_code"] == 1 and predicate["model"]["name"] == "scripted"
    assert predicate["evidence"]["after"] and all(run["exit_code"] == 0 for run in predicate["evidence"]["after"])
    served = json.dumps(bundle)
    for secret in (private.read_text(), GITLAB_TOKEN, GITEA_TOKEN, MODEL_KEY):  # never kept or served
        assert secret not in served
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle))

    out = CliRunner().invoke(cli, ["verify", str(path), "--checkout", str(world.bare(forge))])

    assert out.exit_code == 0, out.output
    assert "makes the attested patch" in out.output and "PASS log chain" in out.output
    item["trajectory"]["messages"][1]["content"] += " "  # one byte more in the task
    path.write_text(json.dumps(bundle))
    tampered = CliRunner().invoke(cli, ["verify", str(path)])
    assert tampered.exit_code == 1 and "FAIL attestation 1 (change) trajectory" in tampered.output


def test_without_a_key_it_publishes_unsigned_and_says_so(client: Any, world: World) -> None:
    job_id = _start(client, world, "gitlab")
    assert run_job(job_id) == "done"
    assert "attestation: unsigned" in _description(world, "gitlab")
    assert "Assisted-by: scripted" in _commit_message(world.bare("gitlab"), f"frogfix/issue-{1}")
    with session_scope() as session:
        assert "unsigned" in [e.kind for e in records.job_events(session, job_id)]


def test_require_attestation_without_a_key_publishes_nothing(client: Any, world: World, tmp_path: Path) -> None:
    configure(world.env["monkeypatch"], require_attestation="true", attestation_key=str(tmp_path / "missing.key"))
    job_id = _start(client, world, "gitlab")
    assert run_job(job_id) == "failed"
    with session_scope() as session:
        job = records.get_job(session, job_id)
        assert job.ending_kind == "attestation_missing" and job.mr_url is None
    assert world.gitlab.open_mrs(PROJECT) == []
    branches = subprocess.run(["git", "--git-dir", str(world.bare("gitlab")), "branch", "--list", "frogfix/*"],
                              capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert branches.strip() == ""
    assert any("FROGFIX_REQUIRE_ATTESTATION" in n["body"] for n in world.gitlab.notes)


def test_a_review_rounds_commit_is_signed_too(client: Any, world: World, tmp_path: Path) -> None:
    """Round 0 and round 1 each get a statement; round 1's names its round and the head it built on, and
    both commits verify against the forge's repository."""
    mr, round_job, before = signed_round(client, world, tmp_path)

    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    [first] = client.get(f"/api/jobs/{mr.thread_id}/attestations", headers=auth).json()["attestations"]
    bundle = client.get(f"/api/jobs/{round_job.id}/attestations", headers=auth).json()
    [second] = bundle["attestations"]
    predicate = signing.read(second["envelope"])[1]["predicate"]
    assert predicate["round"] == 1 and predicate["round_kind"] == "review" and predicate["base_commit"] == before
    assert signing.read(first["envelope"])[1]["predicate"]["round"] == 0
    assert "Assisted-by: scripted" in _commit_message(world.bare("gitlab"), mr.branch)
    [reply] = mr.bot_notes()  # the round's reply on the MR names its statement
    assert f"`{signing.envelope_digest(second['envelope'])}`" in reply["body"]
    path = tmp_path / "round.json"
    path.write_text(json.dumps(bundle))
    out = CliRunner().invoke(cli, ["verify", str(path), "--checkout", str(world.bare("gitlab"))])
    assert out.exit_code == 0, out.output
    assert "makes the attested patch" in out.output
