"""Signing what a job publishes (issue 41): the commit's `Assisted-by` trailer, the in-toto statement of the
change in its DSSE envelope (app/attestations), and keeping it with the job and in the append-only log.

The key is read here, from FROGFIX_ATTESTATION_KEY's file, only to sign: it never reaches a sandbox, the
trajectory, a log line or a statement. Without a usable key the change is published "unsigned" (the MR
says so, doctor fails), unless FROGFIX_REQUIRE_ATTESTATION makes the job end without publishing.
"""

from __future__ import annotations

from typing import Any, Protocol

from securesystemslib.signer import Signer

from app import trajectory
from app.attestations import keys, signing, statement, store
from app.endings import Ending, EndingKind
from app.redaction import redact_value
from app.settings import Settings
from app.statuses import JobStatus
from worker.attempts.attempt import AttemptResult, AttemptRunner
from worker.job.job_context import JobEnded
from worker.leaf.trajectory_writer import HARNESS_VERSION
from worker.texts.mr_text import assisted_by
from worker.wiring import sampling_from

REQUIRED_COMMENT = (
    "FrogFix found a fix but published nothing: FROGFIX_REQUIRE_ATTESTATION is on and no attestation key "
    "could sign the change. An operator can set FROGFIX_ATTESTATION_KEY (`manage.py attest keygen`) and retry."
)


class PublishingJob(Protocol):
    """What a publishing pipeline (worker/job/pipeline.py, mr_rounds.py) tells the statement."""

    s: Settings
    job_id: int
    run_number: int
    forge_kind: str
    project: str
    issue: int
    issue_url: str | None
    trigger_user: str | None
    round: int
    round_kind: str | None
    title: str
    body: str
    url: str | None
    selection: dict[str, Any]
    runner: AttemptRunner | None

    def redact(self, text: str) -> str: ...

    def event(self, kind: str, message: str, data: dict[str, Any] | None = None) -> None: ...


def signer_or_end(job: PublishingJob) -> Signer | None:
    """The installation's signer; None (noted on the timeline) when there is no usable key, or JobEnded
    under FROGFIX_REQUIRE_ATTESTATION. Called before anything is committed or pushed."""
    path = job.s.attestation_key
    if path is None:
        why = "FROGFIX_ATTESTATION_KEY is not set"
    else:
        try:
            return keys.load_signer(path)
        except keys.AttestationKeyError as exc:
            why = str(exc)
    if job.s.require_attestation:
        raise JobEnded(JobStatus.failed, f"no attestation key: {why}", REQUIRED_COMMENT,
                       ending=Ending(EndingKind.attestation_missing, why))  # fmt: skip
    job.event("unsigned", f"the change is published unsigned: {why}")
    return None


def local_signer(job: PublishingJob) -> Signer | None:
    """A local job's signer when a key is configured; a local job publishes nothing, so a missing or unusable
    key (noted on the timeline) never ends it, FROGFIX_REQUIRE_ATTESTATION or not."""
    if job.s.attestation_key is None:
        return None
    try:
        return keys.load_signer(job.s.attestation_key)
    except keys.AttestationKeyError as exc:
        job.event("unsigned", f"the patch is kept unsigned: {exc}")
        return None


def with_trailer(message: str, settings: Settings) -> str:
    """The commit message with its `Assisted-by: <model> (FrogFix <version>)` trailer."""
    return assisted_by(message, settings.model_name, statement.frogfix_version())


def predicate(job: PublishingJob, base: str, result: AttemptResult) -> dict[str, Any]:
    """What the statement says produced the change (app/attestations/statement.py lists it)."""
    s = job.s
    try:
        document: dict[str, Any] = trajectory.load(trajectory.existing(s.data_dir, result.trajectory))
        chain: dict[str, Any] | None = statement.trajectory_chain(document)
    except trajectory.TrajectoryError:  # not saved (a bug elsewhere): the statement says so, verify skips it
        document, chain = {}, None
    environment = job.runner.environment if job.runner is not None else None
    return {
        "forge": job.forge_kind, "project": job.project,
        "issue": {"number": job.issue, "url": job.issue_url,
                  "text_sha256": statement.issue_digest(job.title, job.body)},
        "trigger_user": job.trigger_user, "round": job.round, "round_kind": job.round_kind,
        "job": {"id": job.job_id, "run": job.run_number, "url": job.url},
        "base_commit": base,
        "frogfix": {"version": statement.frogfix_version(), "harness": HARNESS_VERSION},
        "model": {"name": s.model_name, "reported": document.get("model"),
                  "sampling": sampling_from(s).body_fields()},
        "sandbox": {"backend": s.sandbox, "image": result.config.image or s.sandbox_image},
        "environment": environment.to_dict() if environment is not None else None,
        "evidence": statement.evidence_summary(result.evidence.to_dict() if result.evidence else None),
        "review_flags": list(result.flags),
        "attempts": {"chosen": result.number, "selection": job.selection},
        "usage": result.usage.to_dict(),
        "trajectory": {"path": result.trajectory, "chain": chain},
    }  # fmt: skip


UNCOMMITTED = {
    "made": False,
    "subject": "base_commit",
    "why": "a local job commits nothing: the commit subject is the base commit the patch applies to",
}


def sign_change(
    job: PublishingJob, signer: Signer | None, base: str, commit: str | None, result: AttemptResult
) -> dict[str, Any] | None:
    """The change's statement signed in its envelope (None without a signer); made before the push, so a
    change that cannot be signed is never pushed. `commit` None: no commit was made (a local job), so the
    subjects are the base commit and the patch, and the predicate's `commit` says so."""
    if signer is None:
        return None
    said = redact_value(predicate(job, base, result), job.redact, keys=False)  # no configured secret is signed
    if commit is None:
        said["commit"], commit = dict(UNCOMMITTED), base
    document = statement.statement(commit, result.patch, said)
    return signing.sign(document, signer)


def keep(job: PublishingJob, envelope: dict[str, Any] | None, result: AttemptResult) -> str:
    """After the push: the envelope kept with the job and appended to the log; its digest ("" unsigned)."""
    if envelope is None:
        return ""
    entry = store.save(job.s.data_dir, job.job_id, envelope, kind="change", patch=result.patch,
                       trajectory_path=result.trajectory)  # fmt: skip
    job.event("attested", f"signed the change's statement ({entry['envelope'][:12]})",
              {"attestation": entry["envelope"], "log_seq": entry["seq"]})  # fmt: skip
    return str(entry["envelope"])
