"""`manage.py verify`: a bundle's checks (app/attestations/verify.py), and with a checkout the subjects
against the repository: the attested commit is there, and its change is the attested patch (git's
`patch-id --stable`, which also matches the same change squashed or rebased)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.attestations import keys as attestation_keys
from app.attestations.statement import patch_bytes, subject_digest
from app.attestations.verify import Check, statement_of, verify_bundle, verify_full_log
from worker.git.gitcalls import LOCAL_TIMEOUT, git_dir_args, git_environment, run_git
from worker.git.patch_ids import patch_id


def commit_change(repo: Path, commit: str, start: str | None = None) -> bytes | None:
    """The diff `commit` makes to `start` (default its first parent); None when the checkout lacks either."""
    env, where = git_environment(), git_dir_args(repo)
    for needed in (commit, start) if start else (commit,):
        have = run_git([*where, "cat-file", "-e", f"{needed}^{{commit}}"], env=env, what="git cat-file",
                       timeout=LOCAL_TIMEOUT, check=False)  # fmt: skip
        if have.returncode != 0:
            return None
    return run_git([*where, "diff-tree", "-p", "--binary", "--no-color", start or f"{commit}^", commit], env=env,
                   what="git diff-tree", timeout=LOCAL_TIMEOUT).stdout  # fmt: skip


def checkout_checks(bundle: dict[str, Any], checkout: Path) -> list[Check]:
    """Each attestation's commit subject against the checkout: present, and the attested patch."""
    checks = []
    for number, item in enumerate(bundle.get("attestations") or [], 1):
        label = f"attestation {number} ({item.get('kind', '?')}) commit"
        document = statement_of(item)
        commit = subject_digest(document or {}, "gitCommit")
        merged = ((document or {}).get("predicate") or {}).get("merged") if item.get("kind") == "merge" else None
        if item.get("kind") == "merge" and not isinstance(merged, dict):
            checks.append(Check(label, "skip", "the MR was closed without a merge"))
            continue
        start = str(merged.get("from") or "") or None if isinstance(merged, dict) else None
        if not commit:
            checks.append(Check(label, "fail", "the statement names no commit"))
            continue
        if ((document or {}).get("predicate") or {}).get("commit", {}).get("made") is False:
            checks.append(_base_only(label, checkout, commit))
            continue
        change = commit_change(checkout, commit, start)
        if change is None:
            checks.append(Check(label, "fail", f"{commit[:12]} is not in the checkout {checkout}"))
            continue
        ours, theirs = patch_id(checkout, patch_bytes(item.get("patch") or "")), patch_id(checkout, change)
        if ours is not None and ours == theirs:
            checks.append(Check(label, "pass", f"{commit[:12]} is in the checkout and makes the attested patch"))
        else:
            checks.append(Check(label, "fail", f"{commit[:12]}'s change in the checkout is not the bundle's patch"))
    return checks


def _base_only(label: str, checkout: Path, base: str) -> Check:
    """A local job's statement: no commit was made, so its commit subject is the base its patch applies to."""
    have = run_git([*git_dir_args(checkout), "cat-file", "-e", f"{base}^{{commit}}"], env=git_environment(),
                   what="git cat-file", timeout=LOCAL_TIMEOUT, check=False)  # fmt: skip
    if have.returncode != 0:
        return Check(label, "fail", f"the base commit {base[:12]} is not in the checkout {checkout}")
    return Check(label, "pass", f"no commit was made (a local job); its base {base[:12]} is in the checkout")


def run_verify(
    bundle: dict[str, Any], trusted: Path, key: Path | None, checkout: Path | None, log: Path | None = None
) -> list[Check]:
    """Every check: with `key` only that public key is trusted (an auditor's), else the trusted folder's
    keys; revocations come from the trusted folder either way. `log`: the installation's whole log file.
    (`--replay`'s checks are worker/commands/bundle_replay.py's.)"""
    if key is not None:
        public = attestation_keys.load_public(key)
        keys = {public.keyid: public}
    else:
        keys = attestation_keys.trusted_keys(trusted)
    revoked = attestation_keys.revocations(trusted)
    if key is not None and (key.parent / attestation_keys.REVOKED).is_file():
        revoked |= attestation_keys.revocations(key.parent)
    checks = verify_bundle(bundle, keys, revoked)
    if checkout is not None:
        checks += checkout_checks(bundle, checkout)
    if log is not None:
        lines = log.read_text(encoding="utf-8").splitlines()
        checks += verify_full_log([json.loads(line) for line in lines if line.strip()], bundle)
    return checks
