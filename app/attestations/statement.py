"""The in-toto Statement (v1) FrogFix signs for a published change, and the digest chain over a trajectory.

The statement's subjects are the commit (`gitCommit`) and the patch (`sha256` of its bytes as pushed);
its predicate (`PREDICATE_TYPE`) says what produced them: the issue as read (its text's digest), who
triggered the job and the round, the base commit, FrogFix's version, the model and its sampling, the
sandbox, the environment as far as it is known, the evidence (in the spirit of in-toto's test-result
predicate, with FrogFix's reproduction and `tampered` beside it), the review flags, the attempts and
why one was chosen, usage, and the trajectory's digest chain: a trajectory edited later no longer matches.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from datetime import UTC, datetime
from typing import Any, Final

STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE: Final = "application/vnd.in-toto+json"
PREDICATE_TYPE: Final = "https://frogfix.dev/attestation/change/v1"
MERGE_PREDICATE_TYPE: Final = "https://frogfix.dev/attestation/merge/v1"
CHAIN_START: Final = hashlib.sha256(b"frogfix-trajectory-chain/v1").hexdigest()


def canonical(value: Any) -> bytes:
    """The one serialisation every digest here is taken over: sorted keys, no spaces, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def patch_bytes(patch: str | bytes) -> bytes:
    """The patch's bytes as the commit was made from them (worker/git/publishing.py encodes the same way)."""
    return patch.encode("utf-8", "surrogateescape") if isinstance(patch, str) else bytes(patch)


def issue_digest(title: str, body: str) -> str:
    """The issue text as FrogFix read it: sha256 over the canonical {"title", "body"}."""
    return sha256(canonical({"title": title, "body": body}))


def frogfix_version() -> str:
    try:
        return importlib.metadata.version("frogfix")
    except importlib.metadata.PackageNotFoundError:  # a checkout run in place, not installed
        return "0.1.0"


def trajectory_chain(document: dict[str, Any]) -> dict[str, Any]:
    """The digest chain over a trajectory's messages: each link is sha256(previous link + the message's
    canonical bytes), from CHAIN_START; the statement keeps the count and the last link."""
    link = CHAIN_START
    messages = document.get("messages")
    steps = messages if isinstance(messages, list) else []
    for message in steps:
        link = sha256(link.encode("ascii") + canonical(message))
    return {"algorithm": "sha256-chain/v1", "messages": len(steps), "head": link}


def run_summary(run: dict[str, Any] | None) -> dict[str, Any] | None:
    """One test run as the statement keeps it: exit code, counts per outcome, timed out, tampered."""
    if not isinstance(run, dict):
        return None
    tests = run.get("tests")
    counts = run.get("counts")
    if isinstance(tests, dict):
        counts = {}
        for outcome in tests.values():
            counts[str(outcome)] = counts.get(str(outcome), 0) + 1
    return {
        "exit_code": run.get("exit_code"),
        "counts": counts if isinstance(counts, dict) else None,
        "timed_out": bool(run.get("timed_out")),
        "tampered": str(run.get("tampered") or ""),
    }


def evidence_summary(tests: dict[str, Any] | None) -> dict[str, Any]:
    """The attempt's stored `tests` (worker/attempts/verifier.py TestEvidence.to_dict) as the statement keeps it."""
    tests = tests or {}
    found, runs = tests.get("evidence"), tests.get("after")
    verdict: dict[str, Any] = found if isinstance(found, dict) else {}
    after: list[Any] = runs if isinstance(runs, list) else []
    return {
        "command": tests.get("command"),
        "level": verdict.get("level"),
        "fail_to_pass": verdict.get("fail_to_pass"),
        "pass_to_fail": verdict.get("pass_to_fail"),
        "reproduction": run_summary(tests.get("reproduction")),
        "before": run_summary(tests.get("before")),
        "after": [run_summary(run) for run in after],
        "flaky": bool(tests.get("flaky")),
        "tampered": any((run_summary(r) or {}).get("tampered") for r in [tests.get("before"), *after]),
    }


def statement(commit: str, patch: str | bytes, predicate: dict[str, Any], *, predicate_type: str = PREDICATE_TYPE
              ) -> dict[str, Any]:
    """The in-toto Statement v1: the commit and the patch as subjects, `predicate` as given, stamped with
    the signing time (`signed_at`, UTC) that a key's revocation is judged against."""
    subjects = [
        {"name": f"commit:{commit}", "digest": {"gitCommit": commit}},
        {"name": "patch", "digest": {"sha256": sha256(patch_bytes(patch))}},
    ]
    body = {"signed_at": datetime.now(UTC).isoformat(timespec="seconds"), **predicate}
    return {"_type": STATEMENT_TYPE, "subject": subjects, "predicateType": predicate_type, "predicate": body}


def subject_digest(document: dict[str, Any], algorithm: str) -> str | None:
    """The first subject's digest under `algorithm` (`gitCommit`, `sha256`), or None."""
    for subject in document.get("subject") or []:
        value = (subject.get("digest") or {}).get(algorithm)
        if value:
            return str(value)
    return None
