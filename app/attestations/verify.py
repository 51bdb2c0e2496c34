"""The checks `manage.py verify` runs on a bundle, one result a line: signature and key id, the key not
revoked when it signed, the subjects against the patch, the trajectory against its digest chain, the log's
chain. (The checkout's commit is checked by the command, which has git: worker/commands/verify.py.)"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import Key, SSlibKey

from app.attestations import signing
from app.attestations.statement import (
    MERGE_PREDICATE_TYPE,
    patch_bytes,
    sha256,
    subject_digest,
    trajectory_chain,
)
from app.attestations.store import entry_digest

Outcome = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class Check:
    name: str
    outcome: Outcome
    detail: str

    def line(self) -> str:
        return f"{self.outcome.upper()} {self.name}: {self.detail}"


def exit_code(checks: list[Check]) -> int:
    """Like doctor's: 1 exactly when a check failed."""
    return 1 if any(c.outcome == "fail" for c in checks) else 0


def verify_bundle(bundle: dict[str, Any], keys: dict[str, SSlibKey], revoked: dict[str, datetime]) -> list[Check]:
    """Every check of every attestation in the bundle, then the log's."""
    checks: list[Check] = []
    items = bundle.get("attestations") or []
    if not items:
        return [Check("bundle", "fail", "the bundle holds no attestation")]
    for number, item in enumerate(items, 1):
        checks += verify_item(f"attestation {number} ({item.get('kind', '?')})", item, keys, revoked)
    checks += verify_log(bundle.get("log") or {}, [signing.envelope_digest(i["envelope"]) for i in items])
    return checks


def statement_of(item: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return signing.read(item["envelope"])[1]
    except (KeyError, ValueError):
        return None


def verify_item(
    label: str, item: dict[str, Any], keys: dict[str, SSlibKey], revoked: dict[str, datetime]
) -> list[Check]:
    """One attestation: its signature, its key's revocation, its patch and its trajectory."""
    try:
        envelope, document = signing.read(item["envelope"])
    except (KeyError, ValueError) as exc:
        return [Check(f"{label} signature", "fail", f"the envelope cannot be read: {exc}")]
    checks = [_signature(label, envelope, keys, revoked, document)]
    want = subject_digest(document, "sha256")
    got = sha256(patch_bytes(item.get("patch") or ""))
    checks.append(
        Check(f"{label} patch", "pass", f"sha256 {got[:16]}… is the attested patch's") if want == got
        else Check(f"{label} patch", "fail", f"the patch's sha256 {got[:16]}… is not the attested {str(want)[:16]}…")
    )
    if document.get("predicateType") == MERGE_PREDICATE_TYPE:
        return checks + merge_checks(label, document.get("predicate") or {})
    checks.append(_trajectory(label, item.get("trajectory"), document))
    return checks


def merge_checks(label: str, predicate: dict[str, Any]) -> list[Check]:
    """A merge statement's: the merged change is the attested change (patch id), and every commit on the
    MR was attested by FrogFix (one that was not fails, by name: someone pushed onto the branch)."""
    who = f"{predicate.get('action', '?')} by {predicate.get('by') or '?'} at {predicate.get('at') or '?'}"
    ids = predicate.get("patch_id") or {}
    if predicate.get("action") != "merged":
        checks = [Check(f"{label} merged change", "skip", f"{who}: nothing was merged")]
    elif ids.get("matches") is True:
        checks = [Check(f"{label} merged change", "pass",
                        f"{who}: the merged change has the attested patch id {str(ids.get('merged'))[:12]}")]
    else:
        checks = [Check(f"{label} merged change", "fail", f"{who}: the merged change's patch id "
                        f"{str(ids.get('merged'))[:12]} is not the attested {str(ids.get('attested'))[:12]}")]
    unattested = [str(c) for c in predicate.get("unattested") or []]
    commits = predicate.get("commits") or []
    if unattested:
        named = ", ".join(c[:12] for c in unattested)
        checks.append(Check(f"{label} commits", "fail", f"{len(unattested)} commit(s) on the MR were not "
                            f"attested by FrogFix (pushed onto its branch by someone else): {named}"))
    else:
        checks.append(Check(f"{label} commits", "pass", f"all {len(commits)} commit(s) on the MR were attested"))
    return checks


def _signature(
    label: str, envelope: Any, keys: dict[str, SSlibKey], revoked: dict[str, datetime], document: dict[str, Any]
) -> Check:
    """The signature by a trusted key, and that key not revoked when it signed."""
    named = sorted(envelope.signatures)
    trusted: list[Key] = [keys[kid] for kid in named if kid in keys]
    if not trusted:
        signers = ", ".join(k[:16] for k in named)
        return Check(f"{label} signature", "fail", f"signed by key {signers}…, not a trusted key")
    try:
        kid = signing.verified_key(envelope, trusted)
    except (VerificationError, ValueError):
        return Check(f"{label} signature", "fail", f"the signature does not verify with key {trusted[0].keyid[:16]}…")
    signed_at = str((document.get("predicate") or {}).get("signed_at") or "")
    if kid in revoked:
        try:
            when = datetime.fromisoformat(signed_at)
        except ValueError:
            when = revoked[kid]
        if when >= revoked[kid]:
            return Check(f"{label} key", "fail",
                         f"key {kid[:16]}… was revoked at {revoked[kid].isoformat()}, before it signed ({signed_at})")
    return Check(f"{label} signature", "pass", f"signed by trusted key {kid[:16]}… at {signed_at}")


def _trajectory(label: str, document: Any, statement: dict[str, Any]) -> Check:
    want = ((statement.get("predicate") or {}).get("trajectory") or {}).get("chain")
    if not isinstance(document, dict):
        return Check(f"{label} trajectory", "fail" if want else "skip", "the bundle has no trajectory")
    got = trajectory_chain(document)
    if want == got:
        return Check(f"{label} trajectory", "pass", f"{got['messages']} messages match the digest chain")
    return Check(f"{label} trajectory", "fail", f"the trajectory does not match its digest chain ({got['messages']} "
                 f"messages, head {got['head'][:16]}…; attested {(want or {}).get('head', '?')[:16]}…)")


def verify_log(log: dict[str, Any], digests: list[str]) -> list[Check]:
    """The log's stretch links entry to entry, and holds every envelope of the bundle."""
    entries = log.get("entries") or []
    if not entries:
        return [Check("log", "skip", "the bundle carries no log")]
    previous = str(log.get("previous") or "")
    for entry in entries:
        if entry.get("prev") != previous:
            return [Check("log chain", "fail", f"entry {entry.get('seq')} does not follow the one before it "
                          "(an entry was removed or altered)")]
        previous = entry_digest(entry)
    logged = {entry.get("envelope") for entry in entries}
    missing = [d for d in digests if d not in logged]
    checks = [Check("log chain", "pass", f"{len(entries)} entries link one to the next")]
    if missing:
        first = missing[0][:16]
        checks.append(Check("log", "fail", f"{len(missing)} attestation(s) are not in the log (first {first}…)"))
    else:
        checks.append(Check("log", "pass", f"all {len(digests)} attestation(s) are in the log"))
    return checks


def verify_full_log(entries: list[dict[str, Any]], bundle: dict[str, Any]) -> list[Check]:
    """The installation's whole log (`attestations/log.jsonl`, given to `verify --log`): linked from its
    first entry on, and holding the bundle's stretch entry for entry (so a bundle cut from an altered log,
    or a log rewritten after the bundle was taken, shows)."""
    from app.attestations.statement import CHAIN_START

    previous = CHAIN_START
    for entry in entries:
        if entry.get("prev") != previous:
            return [Check("log file chain", "fail", f"entry {entry.get('seq')} does not follow the one before it "
                          "(an entry was removed or altered)")]
        previous = entry_digest(entry)
    known = {entry_digest(entry) for entry in entries}
    stretch = (bundle.get("log") or {}).get("entries") or []
    missing = [e.get("seq") for e in stretch if entry_digest(e) not in known]
    checks = [Check("log file chain", "pass", f"{len(entries)} entries link one to the next from the first")]
    if missing:
        checks.append(Check("log file", "fail", f"the bundle's log entries {missing[:5]} are not in the log file"))
    else:
        checks.append(Check("log file", "pass", f"the bundle's {len(stretch)} log entries are in the log file"))
    return checks
