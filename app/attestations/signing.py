"""The DSSE envelope around a statement: signed and read with securesystemslib's Envelope (its PAE), never
with crypto of our own."""

from __future__ import annotations

import json
from typing import Any

from securesystemslib.dsse import Envelope
from securesystemslib.signer import Key, Signer

from app.attestations.statement import PAYLOAD_TYPE, canonical, sha256


def sign(document: dict[str, Any], signer: Signer) -> dict[str, Any]:
    """The statement in a DSSE envelope (payloadType application/vnd.in-toto+json) signed by `signer`, as JSON."""
    envelope = Envelope(canonical(document), PAYLOAD_TYPE, {})
    envelope.sign(signer)
    return envelope.to_dict()


def envelope_digest(envelope: dict[str, Any]) -> str:
    """What the MR and the log name: sha256 over the envelope's canonical JSON."""
    return sha256(canonical(envelope))


def read(envelope: dict[str, Any]) -> tuple[Envelope, dict[str, Any]]:
    """The envelope and its statement, unverified (ValueError when it is not a DSSE in-toto envelope)."""
    try:
        parsed = Envelope.from_dict(json.loads(json.dumps(envelope)))  # from_dict rewrites its argument
        document = json.loads(parsed.payload)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a DSSE envelope: {exc}") from None
    if parsed.payload_type != PAYLOAD_TYPE or not isinstance(document, dict):
        raise ValueError(f"the envelope's payloadType is {parsed.payload_type!r}, not {PAYLOAD_TYPE}")
    return parsed, document


def verified_key(envelope: Envelope, keys: list[Key]) -> str:
    """The key id of the trusted key whose signature over the PAE verifies; raises securesystemslib's
    VerificationError (or ValueError for no keys) otherwise."""
    return next(iter(envelope.verify(keys, 1)))
