"""doctor's attestation line: fails without a key, with a key it does not trust, with a revoked key; passes
with a trusted one; never prints the key."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

from app.attestations import keys
from app.settings import Settings
from worker.commands.doctor.attestation import check_attestation
from worker.commands.doctor.results import DoctorOptions


def settings(tmp_path: Path, **values: object) -> Settings:
    return Settings(data_dir=tmp_path / "data", **values)  # type: ignore[arg-type]


def test_the_attestation_line(tmp_path: Path) -> None:
    [none, log] = check_attestation(settings(tmp_path), DoctorOptions())
    assert log.outcome == "pass" and "0 statement(s)" in log.detail
    assert none.outcome == "fail" and "unsigned" in none.detail and "attest keygen" in none.fix
    [required, _] = check_attestation(settings(tmp_path, require_attestation=True), DoctorOptions())
    assert "nothing can be published" in required.detail

    private = tmp_path / "k" / "frogfix.key"
    kid = keys.keygen(private, tmp_path / "elsewhere")
    [untrusted, _] = check_attestation(settings(tmp_path, attestation_key=private), DoctorOptions())
    assert untrusted.outcome == "fail" and untrusted.name == "attestation.trusted"

    s = settings(tmp_path, attestation_key=private)
    s.resolved_trusted_keys().mkdir(parents=True)
    shutil.copy(tmp_path / "elsewhere" / f"{kid}.pub", s.resolved_trusted_keys())  # as an operator trusts a key
    [ok, _] = check_attestation(s, DoctorOptions())
    assert ok.outcome == "pass" and kid[:16] in ok.detail and private.read_text() not in ok.detail

    keys.revoke(s.resolved_trusted_keys(), kid, datetime.now(UTC))
    [revoked, _] = check_attestation(s, DoctorOptions())
    assert revoked.outcome == "fail" and "revoked" in revoked.detail

    (tmp_path / "bad.key").write_text("-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    [bad, _] = check_attestation(settings(tmp_path, attestation_key=tmp_path / "bad.key"), DoctorOptions())
    assert bad.outcome == "fail" and "nope" not in bad.detail


def test_the_log_line_fails_for_an_entry_removed_from_the_log(tmp_path: Path) -> None:
    from app.attestations import signing, statement, store

    private = tmp_path / "k" / "frogfix.key"
    keys.keygen(private, tmp_path / "trusted")
    data = tmp_path / "data"
    for n in range(3):
        envelope = signing.sign(statement.statement("1" * 40, f"diff {n}", {}), keys.load_signer(private))
        store.save(data, 1, envelope, kind="change", patch=f"diff {n}")
    [_, ok] = check_attestation(settings(tmp_path), DoctorOptions())
    assert ok.outcome == "pass" and "3 statement(s)" in ok.detail
    log = data / "attestations" / "log.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], lines[2]]) + "\n")
    [_, broken] = check_attestation(settings(tmp_path), DoctorOptions())
    assert broken.outcome == "fail" and "entry 3 does not follow" in broken.detail
