"""Signed pipeline jobs for the attestation tests: one way to give the worker a key, one signed review round."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.attestations import keys
from tests.conftest import configure
from tests.pipeline.conftest import World
from worker.tasks import run_job


def signing_key(world: World, tmp_path: Path) -> tuple[Path, str]:
    """A new key pair: the private key configured as FROGFIX_ATTESTATION_KEY, the public one trusted; (the private
    key's file, the key id)."""
    from app.settings import get_settings

    private = tmp_path / "keys" / "frogfix.key"
    configure(world.env["monkeypatch"], attestation_key=str(private))
    return private, keys.keygen(private, get_settings().resolved_trusted_keys())


def signed_round(client: Any, world: World, tmp_path: Path) -> tuple[Any, Any, str]:
    """A GitLab MR FrogFix opened and signed, then a review round it ran and signed: (the MR, the round's job, the
    MR's head the round built on)."""
    from tests.pipeline.test_rounds_e2e import GitLabMr, newest_round, round_script, triage

    signing_key(world, tmp_path)
    mr = GitLabMr(client, world)
    before = mr.sync_head()
    world.model.add(*round_script())
    assert triage(mr.comment("/frogfix please document mul() too")["request_id"]) == "accepted"
    round_job = newest_round(mr.thread_id)
    assert run_job(round_job.id) == "done"
    return mr, round_job, before
