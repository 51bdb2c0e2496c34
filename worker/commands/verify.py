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


def patch_id(repo: Path, diff: bytes) -> str | None:
    """git's stable patch id of a diff; None for a diff git finds no change in."""
    done = run_git([*git_dir_args(repo), "patch-id", "--stable"], env=git_environment(), what="git patch-id",
                   timeout=LOCAL_TIMEOUT, stdin=diff, check=False)  # fmt: skip
    words = done.stdout.decode("ascii", "replace").split()
    return words[0] if done.returncode == 0 and words else None


def commit_change(repo: Path, commit: str) -> bytes | None:
    """The diff `commit` makes to its first parent; None when the checkout does not have it."""
    env, where = git_environment(), git_dir_args(repo)
    have = run_git([*where, "cat-file", "-e", f"{commit}^{{commit}}"], env=env, what="git cat-file",
                   timeout=LOCAL_TIMEOUT, check=False)  # fmt: skip
    if have.returncode != 0:
        return None
    return run_git([*where, "diff-tree", "-p", "--binary", "--no-color", f"{commit}^", commit], env=env,
                   what="git diff-tree", timeout=LOCAL_TIMEOUT).stdout  # fmt: skip


def checkout_checks(bundle: dict[str, Any], checkout: Path) -> list[Check]:
    """Each attestation's commit subject against the checkout: present, and the attested patch."""
    checks = []
    for number, item in enumerate(bundle.get("attestations") or [], 1):
        label = f"attestation {number} ({item.get('kind', '?')}) commit"
        document = statement_of(item)
        commit = subject_digest(document or {}, "gitCommit")
        if not commit:
            checks.append(Check(label, "fail", "the statement names no commit"))
            continue
        change = commit_change(checkout, commit)
        if change is None:
            checks.append(Check(label, "fail", f"{commit[:12]} is not in the checkout {checkout}"))
            continue
        ours, theirs = patch_id(checkout, patch_bytes(item.get("patch") or "")), patch_id(checkout, change)
        if ours is not None and ours == theirs:
            checks.append(Check(label, "pass", f"{commit[:12]} is in the checkout and makes the attested patch"))
        else:
            checks.append(Check(label, "fail", f"{commit[:12]}'s change in the checkout is not the bundle's patch"))
    return checks


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
