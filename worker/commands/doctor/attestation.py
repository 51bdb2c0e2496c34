"""The attestation key: present, an Ed25519 private key, and its public key among the trusted ones, so what
FrogFix signs verifies. Without a key changes are published "unsigned": a failure here, not a warning."""

from __future__ import annotations

from app.attestations import keys, store
from app.attestations.verify import verify_full_log
from app.settings import Settings
from worker.commands.doctor.results import CheckResult, DoctorOptions, failed, passed

KEYGEN_FIX = "run `manage.py attest keygen` with FROGFIX_ATTESTATION_KEY set to where the private key goes"


def check_attestation(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    """The key, then the log's chain."""
    return [*check_key(settings), check_log(settings)]


def check_log(settings: Settings) -> CheckResult:
    """The append-only log links entry to entry from its first: an entry removed or altered shows here."""
    try:
        entries = store.read_log(settings.data_dir)
    except (OSError, ValueError) as exc:
        return failed("attestation.log", f"the attestation log cannot be read: {exc}", "restore it from a backup")
    chain = verify_full_log(entries, {})[0]  # its first line is the chain
    if chain.outcome == "fail":
        return failed("attestation.log", chain.detail, "restore the log from a backup; compare it with bundles")
    return passed("attestation.log", f"{len(entries)} statement(s) in the log, each linked to the one before")


def check_key(settings: Settings) -> list[CheckResult]:
    """Never prints the key: its path, its key id and the trusted folder only."""
    path = settings.attestation_key
    if path is None:
        why = "FROGFIX_ATTESTATION_KEY is not set, so every change is published unsigned"
        if settings.require_attestation:
            why = "FROGFIX_ATTESTATION_KEY is not set and FROGFIX_REQUIRE_ATTESTATION is on: nothing can be published"
        return [failed("attestation.key", why, KEYGEN_FIX)]
    try:
        signer = keys.load_signer(path)
    except keys.AttestationKeyError as exc:
        return [failed("attestation.key", str(exc), KEYGEN_FIX)]
    kid, trusted = signer.public_key.keyid, settings.resolved_trusted_keys()
    try:
        known = keys.trusted_keys(trusted)
        revoked = keys.revocations(trusted)
    except (keys.AttestationKeyError, ValueError) as exc:
        return [failed("attestation.trusted", f"the trusted keys in {trusted} cannot be read: {exc}",
                       "remove or fix the file named")]  # fmt: skip
    if kid not in known:
        return [failed("attestation.trusted", f"key {kid[:16]}… is not in {trusted}, so its statements do not verify",
                       "copy its public key there as <key id>.pub (attest keygen does this)")]  # fmt: skip
    if kid in revoked:
        return [failed("attestation.key", f"key {kid[:16]}… was revoked at {revoked[kid].isoformat()}",
                       KEYGEN_FIX + ", then point FROGFIX_ATTESTATION_KEY at the new key")]  # fmt: skip
    return [passed("attestation.key", f"changes are signed with key {kid[:16]}… (trusted in {trusted})")]
