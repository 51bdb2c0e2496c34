"""Attestations: a signed, replayable record of every change FrogFix publishes (issue 41).

- `keys.py`: the installation's Ed25519 key pair (`manage.py attest keygen`), the folder of trusted
  public keys (rotation keeps old ones) and `revoked.json`; a key id is the sha256 of the raw public key.
- `statement.py`: the in-toto Statement v1 (subjects: the commit and the patch) with FrogFix's predicate,
  and the digest chain over a trajectory's messages.
- `signing.py`: the DSSE envelope around a statement, signed and verified with securesystemslib (no crypto
  of our own).
- `store.py`: where envelopes live (the data folder, per job), the append-only hash-chained log, and the
  bundle `/api/jobs/{id}/attestations` serves and `manage.py verify` reads.
- `verify.py`: the checks `manage.py verify` runs, one result a line.

Standard library, securesystemslib and cryptography only: no database, no worker, no web.
"""
