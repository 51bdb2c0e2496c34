"""The attestation core: keys, the in-toto statement in its DSSE envelope, the log, and verify's checks
catching each kind of tampering with a line that names it."""

from __future__ import annotations

import base64
import copy
import json
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from app.attestations import keys, signing, statement, store
from app.attestations.verify import Check, exit_code, verify_bundle

PATCH = "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-return a - b\n+return a + b\n"
COMMIT = "1" * 40
TRAJECTORY = {"trajectory_format": "leaf-function-calling",
              "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "fix add()"},
                           {"role": "assistant", "content": "done"}]}  # fmt: skip


def make_key(tmp_path: Path) -> tuple[Path, Path, str]:
    private, trusted = tmp_path / "secret" / "frogfix.key", tmp_path / "trusted"
    return private, trusted, keys.keygen(private, trusted)


def attested(tmp_path: Path, private: Path, data_dir: Path, job_id: int = 7, round_number: int = 0) -> dict[str, Any]:
    """One signed statement kept with job `job_id`, its trajectory in the data folder; the job's bundle."""
    stored = f"trajectories/job-{job_id}-run-1-1.json"
    (data_dir / "trajectories").mkdir(parents=True, exist_ok=True)
    (data_dir / stored).write_text(json.dumps(TRAJECTORY))
    predicate = {"round": round_number, "issue": {"number": 3, "text_sha256": statement.issue_digest("t", "b")},
                 "trajectory": {"path": stored, "chain": statement.trajectory_chain(TRAJECTORY)}}  # fmt: skip
    envelope = signing.sign(statement.statement(COMMIT, PATCH, predicate), keys.load_signer(private))
    store.save(data_dir, job_id, envelope, kind="change", patch=PATCH, trajectory_path=stored)
    return store.bundle(data_dir, job_id)


def lines(checks: list[Check]) -> list[str]:
    return [c.line() for c in checks if c.outcome == "fail"]


@pytest.fixture
def signed(tmp_path: Path) -> tuple[dict[str, Any], Path, Path]:
    private, trusted, _ = make_key(tmp_path)
    return attested(tmp_path, private, tmp_path / "data"), trusted, private


def test_keygen_writes_a_private_key_0600_and_a_public_key_named_by_its_sha256(tmp_path: Path) -> None:
    private, trusted, kid = make_key(tmp_path)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    public = load_pem_public_key((trusted / f"{kid}.pub").read_bytes())
    assert isinstance(public, Ed25519PublicKey) and keys.key_id(public) == kid and len(kid) == 64
    assert b"PRIVATE" not in (trusted / f"{kid}.pub").read_bytes()
    with pytest.raises(FileExistsError):
        keys.keygen(private, trusted)  # never over a key
    assert keys.load_signer(private).public_key.keyid == kid
    (tmp_path / "rsa.key").write_text("not a key")
    with pytest.raises(keys.AttestationKeyError, match="not an unencrypted PEM"):
        keys.load_signer(tmp_path / "rsa.key")


def test_the_envelope_verifies_with_the_library_alone_following_the_dsse_spec(
    signed: tuple[dict[str, Any], Path, Path],
) -> None:
    """Independent of FrogFix's code: base64 payload, PAE by hand from the DSSE spec, Ed25519 from cryptography."""
    bundle, trusted, _ = signed
    envelope = bundle["attestations"][0]["envelope"]
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    payload = base64.b64decode(envelope["payload"])
    pae = b"DSSEv1 %d %s %d %s" % (len(b"application/vnd.in-toto+json"), b"application/vnd.in-toto+json",
                                   len(payload), payload)  # fmt: skip
    [sig] = envelope["signatures"]
    public = load_pem_public_key((trusted / f"{sig['keyid']}.pub").read_bytes())
    assert isinstance(public, Ed25519PublicKey)
    public.verify(base64.b64decode(sig["sig"]), pae)  # raises when it does not verify
    with pytest.raises(InvalidSignature):
        public.verify(base64.b64decode(sig["sig"]), pae.replace(b"DSSEv1", b"DSSEv2"))
    document = json.loads(payload)
    assert document["_type"] == "https://in-toto.io/Statement/v1"
    assert document["predicateType"].startswith("https://")
    digests = [s["digest"] for s in document["subject"]]
    import hashlib

    assert {"gitCommit": COMMIT} in digests and {"sha256": hashlib.sha256(PATCH.encode()).hexdigest()} in digests


def test_an_untouched_bundle_passes_every_check(signed: tuple[dict[str, Any], Path, Path]) -> None:
    bundle, trusted, _ = signed
    checks = verify_bundle(bundle, keys.trusted_keys(trusted), keys.revocations(trusted))
    assert lines(checks) == [] and exit_code(checks) == 0
    assert {c.name for c in checks} >= {"attestation 1 (change) signature", "attestation 1 (change) patch",
                                        "attestation 1 (change) trajectory", "log chain", "log"}  # fmt: skip


A = "attestation 1 (change) "


def _flip(text: str, at: int) -> str:
    return text[:at] + ("x" if text[at] != "x" else "y") + text[at + 1 :]


def _tamper_statement(bundle: dict[str, Any], field: str) -> None:
    envelope = bundle["attestations"][0]["envelope"]
    document = json.loads(base64.b64decode(envelope["payload"]))
    if field == "issue":
        document["predicate"]["issue"]["text_sha256"] = _flip(document["predicate"]["issue"]["text_sha256"], 0)
    else:
        document["predicate"]["signed_at"] = "2020-01-01T00:00:00+00:00"
    envelope["payload"] = base64.b64encode(statement.canonical(document)).decode()


@pytest.mark.parametrize(
    ("tamper", "failing"),
    [
        (lambda b: b["attestations"][0].update(patch=_flip(b["attestations"][0]["patch"], 60)), [f"{A}patch"]),
        (lambda b: _tamper_statement(b, "issue"), [f"{A}signature", "log"]),
        (lambda b: _tamper_statement(b, "time"), [f"{A}signature", "log"]),
        (lambda b: b["attestations"][0]["trajectory"]["messages"][2].update(content="done!"), [f"{A}trajectory"]),
        (lambda b: b["attestations"][0]["trajectory"]["messages"].pop(), [f"{A}trajectory"]),
    ],
    ids=["patch byte", "issue text digest", "statement time", "trajectory edit", "trajectory step removed"],
)
def test_each_tampering_fails_with_a_line_naming_it(
    signed: tuple[dict[str, Any], Path, Path], tamper: Any, failing: list[str]
) -> None:
    """A changed statement is also a changed envelope, which the log does not hold."""
    bundle, trusted, _ = signed
    bundle = copy.deepcopy(bundle)
    tamper(bundle)
    checks = verify_bundle(bundle, keys.trusted_keys(trusted), keys.revocations(trusted))
    assert exit_code(checks) == 1
    assert [line.split(":")[0] for line in lines(checks)] == [f"FAIL {name}" for name in failing]


def test_a_wrong_key_fails_the_signature(signed: tuple[dict[str, Any], Path, Path], tmp_path: Path) -> None:
    bundle, _, _ = signed
    _, other, other_id = make_key(tmp_path / "other")
    checks = verify_bundle(bundle, keys.trusted_keys(other), {})
    assert lines(checks) and lines(checks)[0].startswith("FAIL attestation 1 (change) signature")
    assert "not a trusted key" in lines(checks)[0]
    # the other key claiming the signer's key id still fails: the signature itself does not verify
    [sig] = bundle["attestations"][0]["envelope"]["signatures"]
    impostor = keys.trusted_keys(other)[other_id]
    impostor.keyid = sig["keyid"]
    checks = verify_bundle(bundle, {sig["keyid"]: impostor}, {})
    assert "does not verify" in lines(checks)[0]


def test_a_revoked_key_fails_from_its_revocation_on(signed: tuple[dict[str, Any], Path, Path]) -> None:
    bundle, trusted, _ = signed
    [sig] = bundle["attestations"][0]["envelope"]["signatures"]
    keys.revoke(trusted, sig["keyid"], datetime.now(UTC) - timedelta(hours=1))  # revoked before it signed
    checks = verify_bundle(bundle, keys.trusted_keys(trusted), keys.revocations(trusted))
    assert [line.split(":")[0] for line in lines(checks)] == ["FAIL attestation 1 (change) key"]
    assert "revoked" in lines(checks)[0]
    keys.revoke(trusted, sig["keyid"], datetime.now(UTC) + timedelta(hours=1))  # revoked after: still good
    assert lines(verify_bundle(bundle, keys.trusted_keys(trusted), keys.revocations(trusted))) == []


def test_the_log_chains_entries_and_a_removed_one_shows(tmp_path: Path) -> None:
    private, trusted, _ = make_key(tmp_path)
    data = tmp_path / "data"
    for job, round_number in ((1, 0), (2, 0), (1, 1)):
        attested(tmp_path, private, data, job, round_number)
    log = store.read_log(data)
    assert [e["seq"] for e in log] == [1, 2, 3] and log[0]["prev"] == statement.CHAIN_START
    assert all(log[i]["prev"] == store.entry_digest(log[i - 1]) for i in (1, 2))
    bundle = store.bundle(data, 1)
    assert len(bundle["attestations"]) == 2 and len(bundle["log"]["entries"]) == 3
    good = verify_bundle(bundle, keys.trusted_keys(trusted), {})
    assert lines(good) == []
    removed = copy.deepcopy(bundle)
    del removed["log"]["entries"][1]  # job 2's statement, between job 1's two
    assert [line.split(":")[0] for line in lines(verify_bundle(removed, keys.trusted_keys(trusted), {}))] == [
        "FAIL log chain"
    ]
    dropped = copy.deepcopy(bundle)
    dropped["log"]["entries"] = dropped["log"]["entries"][:1]
    assert "not in the log" in lines(verify_bundle(dropped, keys.trusted_keys(trusted), {}))[0]
