"""`manage.py verify BUNDLE --replay`: each signed change replayed from the bundle alone, with no model server.

The bundle's trajectory is the recording (worker/commands/recorded.py's `Recording`): its recorded
replies drive the Leaf loop again through replay.py's plain replay, in a fresh sandbox at the attested
base commit (a round's start where the trajectory names one), taken from `--checkout` or else from the
repository the statement names (the mirror on disk, updated from the forge when it lacks the commit; a
local job's checkout where it still is, and the demo's sample made again, the same commit as its dates are fixed).
It passes when every tool result matches the recording and the replayed patch is the attested one
(the same git patch id: the replay has the sandbox's text of it, the statement git's regeneration).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from app.attestations.statement import PREDICATE_TYPE, patch_bytes
from app.attestations.verify import Check, statement_of
from app.redaction import SecretRedactor
from app.settings import Settings
from app.statuses import ReplayStatus
from worker.commands.recorded import Recording, ReplayError, RepoSource, repo_source, start_commit_of
from worker.commands.replay import replay_recorded
from worker.commands.verify import patch_id
from worker.git import gitcalls

_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


def recording_of(item: dict[str, Any], label: str) -> Recording:
    """The bundle item's trajectory as a recording, at the attested base commit (ReplayError: it cannot be)."""
    document = statement_of(item) or {}
    if document.get("predicateType") != PREDICATE_TYPE:
        raise ReplayError("not a change statement")
    data = item.get("trajectory")
    if not isinstance(data, dict) or not data.get("messages"):
        raise ReplayError("the bundle has no trajectory to replay")
    predicate = document.get("predicate") or {}
    base = data.get("base_commit") or predicate.get("base_commit")
    if not isinstance(base, str) or not _COMMIT.fullmatch(base):
        raise ReplayError("the trajectory names no base commit")
    job = predicate.get("job") or {}
    job_id: int = job["id"] if isinstance(job.get("id"), int) else 0
    recorded = data.get("output_patch")
    forge, project = predicate.get("forge"), predicate.get("project")
    repository = data.get("repository") if forge == "local" else None  # a local job's checkout; a demo's is remade
    return Recording(
        job_id, Path(f"bundle-job-{job_id}-{re.sub(r'[^a-z0-9]+', '-', label.lower()).strip('-')}.json"), data,
        base, recorded if isinstance(recorded, str) else None, job.get("run"), None,
        forge=forge if isinstance(forge, str) else None, project=project if isinstance(project, str) else None,
        start_commit=start_commit_of(data, None, base), repository=repository if isinstance(repository, str) else None,
    )  # fmt: skip


def _source(rec: Recording, settings: Settings, redactor: SecretRedactor, checkout: Path | None) -> RepoSource:
    if checkout is not None:
        return RepoSource("local", checkout)
    if rec.forge == "local" and rec.repository:  # its checkout where it still is; the demo's sample made again
        return repo_source(rec, settings, redactor.redact, lambda _m: None)
    if not rec.forge or not rec.project or rec.forge == "local":
        raise ReplayError("the statement names no forge repository to fetch the base commit from; use --checkout")
    return repo_source(rec, settings, redactor.redact, lambda _m: None)


def replay_item(item: dict[str, Any], label: str, settings: Settings, checkout: Path | None) -> Check:
    """One change replayed: pass when it reproduces the recording and the attested patch."""
    name = f"{label} replay"
    redactor = SecretRedactor(settings.secret_values())
    source: RepoSource | None = None
    try:
        rec = recording_of(item, label)
        attested_base = rec.base_commit
        source = _source(rec, settings, redactor, checkout)
        if rec.base_commit != attested_base:  # a demo's sample made again must be the very commit it signed
            raise ReplayError(f"the repository made again is at {rec.base_commit[:12]}, not the attested base "
                              f"{attested_base[:12]}")  # fmt: skip
        report = replay_recorded(rec, source, settings, redactor, lambda _m: None)
        # The replay has the sandbox's text of the patch; the attested one is git's regeneration of it.
        ours = patch_id(source.repository(), patch_bytes(report.patch or ""))
        attested = patch_id(source.repository(), patch_bytes(item.get("patch") or ""))
    except (ReplayError, gitcalls.RepoError) as exc:
        return Check(name, "fail", f"cannot replay: {exc}")
    finally:
        if source is not None:
            source.cleanup()
    if report.status != ReplayStatus.reproduced:
        return Check(name, "fail", f"{report.status}: {report.message}")
    if ours is None or ours != attested:
        return Check(name, "fail", "the replay reproduced the recording, but its patch is not the attested patch")
    return Check(name, "pass", f"reproduced with no model server: {report.message}")


def replay_checks(bundle: dict[str, Any], settings: Settings, checkout: Path | None) -> list[Check]:
    """A replay line for each change statement in the bundle (merge statements record no run)."""
    checks = []
    for number, item in enumerate(bundle.get("attestations") or [], 1):
        if item.get("kind") != "change":
            continue
        checks.append(replay_item(item, f"attestation {number} (change)", settings, checkout))
    return checks or [Check("replay", "fail", "the bundle holds no change statement to replay")]
