"""`manage.py attest keygen` and `manage.py verify` as a user runs them: the lines, the exit codes, a checkout."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from app.attestations import keys, signing, statement, store
from tests.attestations.test_attestations import TRAJECTORY
from tests.conftest import configure
from worker.commands.cli import cli

BASE = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x",
           "HOME": str(repo), "PATH": "/usr/bin:/bin"}  # fmt: skip
    return subprocess.run(["git", "-C", str(repo), *args], input=stdin, env=env, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


def repository(tmp_path: Path) -> tuple[Path, str, str, str]:
    """A checkout with a base commit and the fix on top: (folder, base, fix commit, the fix's patch)."""
    repo = tmp_path / "checkout"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "calc.py").write_text(BASE)
    git(repo, "add", "calc.py")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD")
    (repo / "calc.py").write_text(FIXED)
    git(repo, "commit", "-q", "-am", "fix\n\nAssisted-by: scripted (FrogFix 0.1.0)")
    return repo, base, git(repo, "rev-parse", "HEAD"), git(repo, "diff", base, "HEAD") + "\n"


def bundle_file(tmp_path: Path, data_dir: Path, private: Path, commit: str, patch: str) -> Path:
    stored = "trajectories/job-5-run-1-1.json"
    (data_dir / "trajectories").mkdir(parents=True, exist_ok=True)
    (data_dir / stored).write_text(json.dumps(TRAJECTORY))
    predicate = {"trajectory": {"path": stored, "chain": statement.trajectory_chain(TRAJECTORY)}}
    envelope = signing.sign(statement.statement(commit, patch, predicate), keys.load_signer(private))
    store.save(data_dir, 5, envelope, kind="change", patch=patch, trajectory_path=stored)
    path = tmp_path / "bundle.json"
    path.write_text(json.dumps(store.bundle(data_dir, 5)))
    return path


def test_keygen_then_verify_with_and_without_a_checkout(frogfix_env: dict[str, Any], tmp_path: Path) -> None:
    private = tmp_path / "keys" / "frogfix.key"
    configure(frogfix_env["monkeypatch"], attestation_key=str(private))
    runner = CliRunner()
    made = runner.invoke(cli, ["attest", "keygen"])
    assert made.exit_code == 0, made.output
    kid = made.output.split()[2]
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and "PRIVATE" not in made.output
    assert private.read_text() not in made.output
    again = runner.invoke(cli, ["attest", "keygen"])
    assert again.exit_code == 2 and "never overwrites" in again.output

    repo, _base, commit, patch = repository(tmp_path)
    path = bundle_file(tmp_path, Path(frogfix_env["data_dir"]), private, commit, patch)
    ok = runner.invoke(cli, ["verify", str(path), "--checkout", str(repo)])
    assert ok.exit_code == 0, ok.output
    assert f"signed by trusted key {kid[:16]}" in ok.output and "makes the attested patch" in ok.output
    assert ok.output.strip().splitlines()[-1].endswith("0 failed")

    # an auditor's key that is not the signer's
    other = tmp_path / "other"
    other_id = keys.keygen(other / "k", other / "pub")
    wrong = runner.invoke(cli, ["verify", str(path), "--key", str(other / "pub" / f"{other_id}.pub")])
    assert wrong.exit_code == 1 and "FAIL attestation 1 (change) signature" in wrong.output

    # a checkout where the branch holds another change than the one attested
    (repo / "calc.py").write_text(FIXED + "# more\n")
    git(repo, "commit", "-q", "-am", "someone else's")
    other_commit = git(repo, "rev-parse", "HEAD")
    path2 = bundle_file(tmp_path, Path(frogfix_env["data_dir"]), private, other_commit, patch)
    moved = runner.invoke(cli, ["verify", str(path2), "--checkout", str(repo)])
    assert moved.exit_code == 1 and "is not the bundle's patch" in moved.output

    revoked = runner.invoke(cli, ["attest", "revoke", kid, "--at", "2000-01-01T00:00:00+00:00"])
    assert revoked.exit_code == 0
    late = runner.invoke(cli, ["verify", str(path)])
    assert late.exit_code == 1 and "FAIL attestation 1 (change) key" in late.output

    bad = runner.invoke(cli, ["verify", str(tmp_path / "missing.json")])
    assert bad.exit_code == 2


def test_verify_with_the_installations_whole_log(frogfix_env: dict[str, Any], tmp_path: Path) -> None:
    """--log checks the whole file from its first entry, and that the bundle's entries are in it: an entry
    removed from the file (or a file rewritten after the bundle was taken) fails `log file`."""
    private = tmp_path / "keys" / "frogfix.key"
    configure(frogfix_env["monkeypatch"], attestation_key=str(private))
    keys.keygen(private, Path(frogfix_env["data_dir"]) / "attestation-keys")
    _repo, _base, commit, patch = repository(tmp_path)
    data = Path(frogfix_env["data_dir"])
    path = bundle_file(tmp_path, data, private, commit, patch)
    log = data / "attestations" / "log.jsonl"
    runner = CliRunner()
    ok = runner.invoke(cli, ["verify", str(path), "--log", str(log)])
    assert ok.exit_code == 0, ok.output
    assert "PASS log file chain" in ok.output and "PASS log file:" in ok.output

    first_bundle = json.loads(path.read_text())
    bundle_file(tmp_path, data, private, commit, patch + "\n")  # a second statement appended to the log
    rewritten = tmp_path / "rewritten.jsonl"
    lines = log.read_text().splitlines()
    rewritten.write_text(lines[1] + "\n")  # the first entry removed
    path.write_text(json.dumps(first_bundle))
    cut = runner.invoke(cli, ["verify", str(path), "--log", str(rewritten)])
    assert cut.exit_code == 1 and "FAIL log file chain" in cut.output
    bad = runner.invoke(cli, ["verify", str(path), "--log", str(tmp_path / "none.jsonl")])
    assert bad.exit_code == 2
