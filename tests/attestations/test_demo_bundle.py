"""Issue 41's last line: `verify --replay` on the demo's bundle reproduces it with no model server.

The real `manage.py demo` runs in a temp data folder with no attestation key configured: it signs with a
throwaway key pair of its own in that folder, writes the job's bundle and names both. `manage.py verify
BUNDLE --key DEMO_PUB --replay` then passes every check, the replay among them, with no model server (the
sample repository, deleted by the demo, is made again at the same commit); one changed byte in the
bundle's trajectory makes it fail.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.attestations.statement import sha256, subject_digest
from worker.commands.demo import make_sample_repo

pytestmark = pytest.mark.bwrap

ROOT = Path(__file__).resolve().parents[2]
NO_MODEL = "http://127.0.0.1:9/v1"  # the discard port: nothing answers there, so no model can be asked


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "manage.py"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_verify_replay_reproduces_the_demos_bundle(local_env: dict[str, Any], tmp_path: Path) -> None:
    data_dir: Path = local_env["data_dir"]
    env = {**os.environ, "FROGFIX_MODEL_BASE_URL": NO_MODEL}
    assert "FROGFIX_ATTESTATION_KEY" not in env

    demo = manage("demo", "--json", env=env)
    assert demo.returncode == 0, demo.stderr[-3000:]
    answer = json.loads(demo.stdout)
    bundle_path, command = Path(answer["attestation_bundle"]), answer["verify"]
    assert answer["status"] == "fixed" and bundle_path.is_file()
    key = Path(command.split(" --key ")[1].split()[0])
    assert command == f"./manage.py verify {bundle_path} --key {key} --replay"
    assert key.is_file() and key.is_relative_to(data_dir / "demo-attestation")  # the demo's own, in its folder
    assert not list((data_dir / "attestation-keys").glob("*.pub"))  # never trusted by the installation

    bundle = json.loads(bundle_path.read_text())
    (item,) = bundle["attestations"]
    statement = json.loads(base64.b64decode(item["envelope"]["payload"]))
    predicate = statement["predicate"]
    assert predicate["forge"] == "local" and predicate["commit"]["made"] is False
    assert subject_digest(statement, "gitCommit") == predicate["base_commit"] == item["trajectory"]["base_commit"]
    assert subject_digest(statement, "sha256") == sha256(answer["patch"].encode())

    verified = manage("verify", str(bundle_path), "--key", str(key), "--replay", env=env)
    assert verified.returncode == 0, verified.stdout + verified.stderr[-2000:]
    lines = verified.stdout.splitlines()
    assert any(line.startswith("PASS attestation 1 (change) replay: reproduced with no model server") for line in lines)
    assert not [line for line in lines if line.startswith("FAIL")]

    # With a checkout (the sample made again): the commit subject is the base, as no commit was made.
    checkout = make_sample_repo(tmp_path / "again")
    checked = manage("verify", str(bundle_path), "--key", str(key), "--checkout", str(checkout), env=env)
    assert checked.returncode == 0, checked.stdout
    assert "PASS attestation 1 (change) commit: no commit was made (a local job)" in checked.stdout

    # One changed byte in the trajectory's recorded answer: its digest chain no longer matches, and verify fails.
    text = bundle_path.read_text()
    tampered = text.replace("The issue says add() subtracts.", "The issue says add() subtracts!", 1)
    assert tampered != text
    changed = bundle_path.with_name("tampered.json")
    changed.write_text(tampered)
    failed = manage("verify", str(changed), "--key", str(key), "--replay", env=env)
    assert failed.returncode != 0
    assert any(line.startswith("FAIL attestation 1 (change) trajectory") for line in failed.stdout.splitlines()), (
        failed.stdout
    )
