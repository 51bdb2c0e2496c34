"""`manage.py verify BUNDLE --replay` (issue 41): a signed pipeline job's bundle replays from its recorded
replies with no model server (the scripted model has nothing left to say), at the base commit from
--checkout or fetched from the repository; a trajectory whose tool result was changed fails the replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from tests.conftest import ADMIN_TOKEN
from tests.pipeline.conftest import World
from tests.pipeline.signed import signed_round, signing_key
from tests.pipeline.test_attestation_e2e import _start
from worker.commands.cli import cli
from worker.tasks import run_job


def _signed_bundle(client: Any, world: World, tmp_path: Path, forge: str = "gitlab") -> dict[str, Any]:
    signing_key(world, tmp_path)
    job_id = _start(client, world, forge)
    assert run_job(job_id) == "done"
    r = client.get(f"/api/jobs/{job_id}/attestations", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_verify_replay_reproduces_the_signed_job_and_a_changed_trajectory_fails(
    client: Any, world: World, tmp_path: Path
) -> None:
    bundle = _signed_bundle(client, world, tmp_path)
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle))
    replies = len(world.model.requests)

    out = CliRunner().invoke(cli, ["verify", str(path), "--replay", "--checkout", str(world.bare("gitlab"))])

    assert out.exit_code == 0, out.output
    assert "PASS attestation 1 (change) replay: reproduced with no model server" in out.output
    assert len(world.model.requests) == replies  # the model server was never asked
    # Without --checkout the base commit comes from the repository the statement names.
    fetched = CliRunner().invoke(cli, ["verify", str(path), "--replay"])
    assert fetched.exit_code == 0, fetched.output
    assert "PASS attestation 1 (change) replay" in fetched.output

    [item] = bundle["attestations"]
    tool = next(m for m in item["trajectory"]["messages"] if m.get("role") == "tool")
    tool["content"] = str(tool["content"]) + "\nsomething the sandbox never printed"
    path.write_text(json.dumps(bundle))
    changed = CliRunner().invoke(cli, ["verify", str(path), "--replay", "--checkout", str(world.bare("gitlab"))])

    assert changed.exit_code == 1, changed.output
    assert "FAIL attestation 1 (change) replay: diverged" in changed.output
    assert "FAIL attestation 1 (change) trajectory" in changed.output


def test_verify_replay_says_why_it_cannot_replay(client: Any, world: World, tmp_path: Path) -> None:
    bundle = _signed_bundle(client, world, tmp_path)
    bundle["attestations"][0]["trajectory"] = None
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(bundle))
    out = CliRunner().invoke(cli, ["verify", str(path), "--replay"])
    assert out.exit_code == 1
    assert "FAIL attestation 1 (change) replay: cannot replay: the bundle has no trajectory to replay" in out.output


def test_verify_replay_replays_a_review_round_from_the_head_it_built_on(
    client: Any, world: World, tmp_path: Path
) -> None:
    _, round_job, _ = signed_round(client, world, tmp_path)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    path = tmp_path / "round.json"
    path.write_text(json.dumps(client.get(f"/api/jobs/{round_job.id}/attestations", headers=auth).json()))
    asked = len(world.model.requests)

    out = CliRunner().invoke(cli, ["verify", str(path), "--replay"])

    assert out.exit_code == 0, out.output
    assert "PASS attestation 1 (change) replay: reproduced with no model server" in out.output
    assert len(world.model.requests) == asked
