"""The installation's signing key, the trusted public keys and their revocations.

The private key is a PEM (PKCS#8) file named by FROGFIX_ATTESTATION_KEY: read here only, to sign, and never
printed, logged or written anywhere else. The public keys `verify` trusts lie in one folder, one
`<key id>.pub` (PEM) each; rotating adds a key and keeps the old ones, so old statements still verify.
`revoked.json` beside them maps a key id to the UTC time it was revoked: a statement that key signed at or
after that time fails `verify`.
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
)
from securesystemslib.signer import CryptoSigner, SSlibKey

REVOKED = "revoked.json"


class AttestationKeyError(ValueError):
    """A key file that cannot be used: the message names the file and why, never the key."""


def key_id(public: Ed25519PublicKey) -> str:
    """The sha256 of the raw 32-byte public key, hex: what an envelope's `keyid` carries."""
    return hashlib.sha256(public.public_bytes(Encoding.Raw, PublicFormat.Raw)).hexdigest()


def sslib_key(public: Ed25519PublicKey) -> SSlibKey:
    """securesystemslib's public key object, under our key id."""
    return SSlibKey.from_crypto(public, keyid=key_id(public))


def keygen(private_path: Path, trusted: Path) -> str:
    """A new key pair: the private key written 0600 (never over an existing file), its public key into
    the trusted folder. Returns the key id."""
    private = Ed25519PrivateKey.generate()
    pem = private.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
    private_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    return add_trusted(trusted, private.public_key())


def add_trusted(trusted: Path, public: Ed25519PublicKey) -> str:
    """Put `public` in the trusted folder as `<key id>.pub`; its key id."""
    trusted.mkdir(parents=True, exist_ok=True)
    kid = key_id(public)
    (trusted / f"{kid}.pub").write_bytes(public.public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo))
    return kid


def load_signer(private_path: Path) -> CryptoSigner:
    """The signer for the key file; AttestationKeyError when it is missing or not an Ed25519 private key."""
    try:
        data = Path(private_path).read_bytes()
    except OSError as exc:
        why = exc.strerror or exc
        raise AttestationKeyError(f"the attestation key {private_path} cannot be read ({why})") from None
    try:
        private = load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise AttestationKeyError(f"the attestation key {private_path} is not an unencrypted PEM private key") from None
    if not isinstance(private, Ed25519PrivateKey):
        raise AttestationKeyError(f"the attestation key {private_path} is not an Ed25519 key")
    return CryptoSigner(private, sslib_key(private.public_key()))


def load_public(path: Path) -> SSlibKey:
    """A PEM public key file as securesystemslib's key; AttestationKeyError when it is not an Ed25519 public key."""
    try:
        public = load_pem_public_key(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise AttestationKeyError(f"{path} is not a readable PEM public key ({exc})") from None
    if not isinstance(public, Ed25519PublicKey):
        raise AttestationKeyError(f"{path} is not an Ed25519 public key")
    return sslib_key(public)


def trusted_keys(trusted: Path) -> dict[str, SSlibKey]:
    """Every `*.pub` of the trusted folder by key id (none when the folder is missing)."""
    found: dict[str, SSlibKey] = {}
    for path in sorted(Path(trusted).glob("*.pub")) if Path(trusted).is_dir() else []:
        key = load_public(path)
        found[key.keyid] = key
    return found


def revocations(trusted: Path) -> dict[str, datetime]:
    """`revoked.json`: key id to the aware UTC time it was revoked (none when there is no file)."""
    path = Path(trusted) / REVOKED
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return {str(kid): datetime.fromisoformat(str(when)) for kid, when in data.items()}


def revoke(trusted: Path, kid: str, when: datetime) -> None:
    """Record `kid` as revoked from `when` on (the public key stays, for what it signed before)."""
    data = {k: v.isoformat() for k, v in revocations(trusted).items()}
    data[kid] = when.isoformat()
    trusted.mkdir(parents=True, exist_ok=True)
    (Path(trusted) / REVOKED).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
