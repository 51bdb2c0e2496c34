"""The shipped worker is not root: as an unprivileged user, keygen writes a 0600 key that user owns, it
signs, and the statement verifies; a key file another user owns and keeps 0600 is refused with its path."""

from __future__ import annotations

import os
from pathlib import Path

from tests.nonroot import NonRoot

SCRIPT = '''
import json, os, sys
from pathlib import Path
from app.attestations import keys, signing, statement
folder = Path(sys.argv[1])
kid = keys.keygen(folder / "k" / "frogfix.key", folder / "trusted")
info = os.stat(folder / "k" / "frogfix.key")
envelope = signing.sign(statement.statement("1" * 40, "diff", {}), keys.load_signer(folder / "k" / "frogfix.key"))
parsed, _ = signing.read(envelope)
ok = signing.verified_key(parsed, list(keys.trusted_keys(folder / "trusted").values())) == kid
refused = ""
try:
    keys.load_signer(Path(sys.argv[2]))
except keys.AttestationKeyError as exc:
    refused = str(exc)
print(json.dumps({"uid": os.getuid(), "mode": info.st_mode & 0o777, "owner": info.st_uid, "verified": ok,
                  "refused": refused}))
'''


def test_keygen_sign_and_verify_as_an_unprivileged_worker(nonroot: NonRoot, tmp_path: Path) -> None:
    theirs = tmp_path / "root.key"
    theirs.write_text("secret material")
    theirs.chmod(0o600)
    if os.geteuid() != 0:  # the other owner is only there when the test runs as root
        theirs.chmod(0o000)
    out = nonroot.run_json(nonroot.script(SCRIPT), str(nonroot.folder("keys-")), str(theirs))
    assert out["mode"] == 0o600 and out["owner"] == nonroot.uid and out["verified"] is True
    assert "cannot be read" in out["refused"] and str(theirs) in out["refused"]
    assert "secret material" not in out["refused"]
