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
    [none] = check_attestation(settings(tmp_path), DoctorOptions())
    assert none.outcome == "fail" and "unsigned" in none.detail and "attest keygen" in none.fix
    [required] = check_attestation(settings(tmp_path, require_attestation=True), DoctorOptions())
    assert "nothing can be published" in required.detail

    private = tmp_path / "k" / "frogfix.key"
    kid = keys.keygen(private, tmp_path / "elsewhere")
    [untrusted] = check_attestation(settings(tmp_path, attestation_key=private), DoctorOptions())
    assert untrusted.outcome == "fail" and untrusted.name == "attestation.trusted"

    s = settings(tmp_path, attestation_key=private)
    s.resolved_trusted_keys().mkdir(parents=True)
    shutil.copy(tmp_path / "elsewhere" / f"{kid}.pub", s.resolved_trusted_keys())  # as an operator trusts a key
    [ok] = check_attestation(s, DoctorOptions())
    assert ok.outcome == "pass" and kid[:16] in ok.detail and private.read_text() not in ok.detail

    keys.revoke(s.resolved_trusted_keys(), kid, datetime.now(UTC))
    [revoked] = check_attestation(s, DoctorOptions())
    assert revoked.outcome == "fail" and "revoked" in revoked.detail

    (tmp_path / "bad.key").write_text("-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n")
    [bad] = check_attestation(settings(tmp_path, attestation_key=tmp_path / "bad.key"), DoctorOptions())
    assert bad.outcome == "fail" and "nope" not in bad.detail
