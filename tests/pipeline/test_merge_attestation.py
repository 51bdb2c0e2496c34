"""The merge statement (issue 41's human end) on a signed job's real branch: a merge commit and a squash
merge match the attested patch by patch id and verify; a commit someone pushed onto the branch makes
`verify` fail with a line naming it; a close is signed without a merged change."""

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
from app.settings import get_settings
from tests.conftest import ADMIN_TOKEN
from tests.pipeline.conftest import PROJECT, World
from tests.pipeline.test_verify_replay import _signed_bundle
from worker.commands.cli import cli
from worker.job.merge_attesting import MergeFacts, attest_merge


def _git(cwd: Path, *args: str) -> str:
    who = ["-c", "user.name=Rita Reviewer", "-c", "user.email=rita@example.com"]
    return subprocess.run(["git", *who, *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def _merge(bare: Path, tmp_path: Path, branch: str, how: str, extra: bool = False) -> tuple[str, str]:
    """Merge `branch` into main in the bare repository as a person would: (the MR's head, the merged commit)."""
    work = tmp_path / f"clone-{how}"
    subprocess.run(["git", "clone", "-q", str(bare), str(work)], check=True)
    if extra:  # someone pushes onto FrogFix's branch
        _git(work, "checkout", "-q", branch)
        (work / "NOTES.md").write_text("a reviewer's own change\n")
        _git(work, "add", "NOTES.md")
        _git(work, "commit", "-qm", "reviewer's commit")
        _git(work, "push", "-q", "origin", branch)
        _git(work, "checkout", "-q", "main")
    head = _git(work, "rev-parse", f"origin/{branch}")
    if how == "rebase":  # the target moved; the MR's commits are rebased onto it and fast-forwarded
        (work / "CHANGELOG.md").write_text("someone else's change on main\n")
        _git(work, "add", "CHANGELOG.md")
        _git(work, "commit", "-qm", "main moved")
        _git(work, "checkout", "-q", "-b", "rebased", f"origin/{branch}")
        _git(work, "rebase", "-q", "main")
        _git(work, "checkout", "-q", "main")
        _git(work, "merge", "-q", "--ff-only", "rebased")
    elif how == "squash":
        _git(work, "merge", "-q", "--squash", f"origin/{branch}")
        _git(work, "commit", "-qm", "squashed")
    else:
        _git(work, "merge", "-q", "--no-ff", "-m", "merge", f"origin/{branch}")
    _git(work, "push", "-q", "origin", "main")
    return head, _git(work, "rev-parse", "HEAD")


def _merged_bundle(client: Any, world: World, tmp_path: Path, how: str, extra: bool = False) -> tuple[Path, int]:
    bundle = _signed_bundle(client, world, tmp_path)
    job_id = int(bundle["job"])
    with session_scope() as session:
        branch = str(records.get_job(session, job_id).branch)
    bare = world.bare("gitlab")
    head, merged = _merge(bare, tmp_path, branch, how, extra)
    facts = MergeFacts("gitlab", PROJECT, 1, "merged", "rita", "2026-12-05T22:00:00+00:00", head, merged)
    entry = attest_merge(get_settings(), bare, facts, job_id, [job_id])
    assert entry is not None and entry["kind"] == "merge"
    r = client.get(f"/api/jobs/{job_id}/attestations", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(r.json()))
    return path, job_id


@pytest.mark.parametrize("how", ["merge", "squash", "rebase"])
def test_a_merge_is_signed_names_the_merger_and_matches_the_attested_patch(
    client: Any, world: World, tmp_path: Path, how: str
) -> None:
    path, _ = _merged_bundle(client, world, tmp_path, how)
    change, merge = json.loads(path.read_text())["attestations"]
    _, document = signing.read(merge["envelope"])
    predicate = document["predicate"]
    assert document["predicateType"] == MERGE_PREDICATE_TYPE and predicate["by"] == "rita"
    attested = signing.read(change["envelope"])[1]["subject"][0]["digest"]["gitCommit"]
    assert predicate["attested_head"]["commit"] == attested and predicate["unattested"] == []
    assert predicate["patch_id"]["matches"] is True

    out = CliRunner().invoke(cli, ["verify", str(path), "--checkout", str(world.bare("gitlab"))])

    assert out.exit_code == 0, out.output
    assert "PASS attestation 2 (merge) merged change: merged by rita" in out.output
    assert "PASS attestation 2 (merge) commits: all 1 commit(s) on the MR were attested" in out.output
    assert "PASS attestation 2 (merge) commit:" in out.output and "PASS log: all 2 attestation(s)" in out.output


def test_a_merge_with_a_commit_frogfix_did_not_attest_fails_verify_naming_it(
    client: Any, world: World, tmp_path: Path
) -> None:
    path, _ = _merged_bundle(client, world, tmp_path, "squash", extra=True)
    [_, merge] = json.loads(path.read_text())["attestations"]
    [pushed] = signing.read(merge["envelope"])[1]["predicate"]["unattested"]

    out = CliRunner().invoke(cli, ["verify", str(path)])

    assert out.exit_code == 1, out.output
    assert "FAIL attestation 2 (merge) commits: 1 commit(s) on the MR were not attested by FrogFix" in out.output
    assert pushed[:12] in out.output
    assert "FAIL attestation 2 (merge) merged change" in out.output  # the squash holds the reviewer's file too
