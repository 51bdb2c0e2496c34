"""The human end of the chain (issue 41): when a person merges or closes an MR FrogFix opened, a second
signed statement (`MERGE_PREDICATE_TYPE`) names who did it, when, the MR head FrogFix attested, the MR's
head as merged and the merged result.

A squash or rebase merge makes commits FrogFix never signed, so the merged change is compared with the
attested change by git's stable patch id: a merge commit's change against its first parent (the target);
a single-parent result against its parent (a squash) or against the commit before the MR's commits (a
rebase or fast-forward). Every commit on the MR's first-parent line is listed with the statement that
attested it, and those FrogFix never attested (someone pushed onto the branch) are named: `verify` fails
on them. The statement goes into the thread's job folder, the same log and the same bundle.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.attestations import keys, signing, statement, store
from app.db import session_scope
from app.forge.api import Forge
from app.jobs import rounds
from app.jobs.records import add_event
from app.settings import Settings
from worker.git import gitcalls, mirrors
from worker.git.patch_ids import change_between, first_parent_commits, parents, patch_id


@dataclass(frozen=True)
class MergeFacts:
    """What the forge's merge (or close) webhook says: `action` is `merged` or `closed`; `mr_head` the MR's
    head when it was merged; `merged_commit` the target's new commit (None when closed)."""

    forge: str
    project: str
    mr: int
    action: str
    by: str | None
    at: str | None
    mr_head: str
    merged_commit: str | None = None


@dataclass(frozen=True)
class Attested:
    """One change statement of the MR's thread: its commit, the commit it built on, its envelope digest."""

    commit: str
    base: str
    digest: str


def attested_changes(data_dir: Path, job_ids: list[int]) -> list[Attested]:
    """The thread's change statements, oldest first (the jobs in thread order)."""
    found = []
    for job_id in job_ids:
        for record in store.records(data_dir, job_id):
            if record.get("kind") != "change":
                continue
            _, document = signing.read(record["envelope"])
            commit = statement.subject_digest(document, "gitCommit")
            base = str((document.get("predicate") or {}).get("base_commit") or "")
            if commit and base:
                found.append(Attested(commit, base, str(record["digest"])))
    return found


def merged_change(repo: Path, merged: str, commits: int, attested_id: str | None) -> tuple[str, bytes]:
    """The commit the merged change starts from, and the change: a merge commit's against its first parent;
    a single-parent result's against its parent (squash) or the commit `commits` back (rebase), whichever
    has the attested patch id (the squash's when neither)."""
    above = parents(repo, merged)
    if len(above) != 1 or commits <= 1:
        start = above[0] if above else merged
        return start, change_between(repo, start, merged)
    squashed = change_between(repo, above[0], merged)
    if patch_id(repo, squashed) == attested_id:
        return above[0], squashed
    back = parents(repo, merged)[0]
    for _ in range(commits - 1):
        back = (parents(repo, back) or [back])[0]
    rebased = change_between(repo, back, merged)
    return (back, rebased) if patch_id(repo, rebased) == attested_id else (above[0], squashed)


def merge_predicate(repo: Path, facts: MergeFacts, thread_id: int, attested: list[Attested]
                    ) -> tuple[dict[str, Any], bytes]:  # fmt: skip
    """The merge statement's predicate, and the merged change it signs as its patch subject."""
    head = attested[-1]
    base = attested[0].base
    signed = {a.commit: a.digest for a in attested}
    on_mr = first_parent_commits(repo, base, facts.mr_head)
    attested_id = patch_id(repo, change_between(repo, base, head.commit))
    change, merged_id, start = b"", None, None
    if facts.action == "merged" and facts.merged_commit:
        start, change = merged_change(repo, facts.merged_commit, len(on_mr), attested_id)
        merged_id = patch_id(repo, change)
    predicate = {
        "forge": facts.forge, "project": facts.project, "mr": facts.mr, "job": {"id": thread_id},
        "action": facts.action, "by": facts.by, "at": facts.at,
        "attested_head": {"commit": head.commit, "statement": head.digest},
        "mr_head": facts.mr_head, "base_commit": base,
        "merged": {"commit": facts.merged_commit, "from": start} if facts.merged_commit else None,
        "patch_id": {"attested": attested_id, "merged": merged_id,
                     "matches": merged_id is not None and merged_id == attested_id},
        "commits": [{"commit": c, "statement": signed.get(c)} for c in on_mr],
        "unattested": [c for c in on_mr if c not in signed],
    }  # fmt: skip
    return predicate, change


def attest_merge(settings: Settings, repo: Path, facts: MergeFacts, thread_id: int, job_ids: list[int]
                 ) -> dict[str, Any] | None:  # fmt: skip
    """Sign and keep the merge statement of the thread; its log entry, or None when there is no key or
    FrogFix attested nothing on this MR (an unsigned MR gets no signed merge either)."""
    attested = attested_changes(settings.data_dir, job_ids)
    if not attested or settings.attestation_key is None:
        return None
    signer = keys.load_signer(settings.attestation_key)
    predicate, change = merge_predicate(repo, facts, thread_id, attested)
    subject = facts.merged_commit if facts.action == "merged" and facts.merged_commit else facts.mr_head
    document = statement.statement(subject, change, predicate, predicate_type=statement.MERGE_PREDICATE_TYPE)
    envelope = signing.sign(document, signer)
    return store.save(settings.data_dir, thread_id, envelope, kind="merge",
                      patch=change.decode("utf-8", "surrogateescape"))  # fmt: skip


def attest_thread_merge(settings: Settings, thread_id: int, merge: dict[str, Any], forge: Forge) -> str:
    """The worker's half of a merge or close webhook (app/jobs/intake.py `_merged`): the mirror brought up to
    date from the forge, the merge statement signed and kept, and the thread's timeline told; its outcome."""
    with session_scope() as session:
        job_ids = [job.id for job in rounds.thread_jobs(session, thread_id)]
    attested = attested_changes(settings.data_dir, job_ids)
    if not attested:
        return "unsigned"
    project = str(merge["project"])
    facts = MergeFacts(
        str(merge["forge"]), project, int(merge["mr"]), str(merge["action"]), merge.get("by"), merge.get("at"),
        str(merge.get("head") or attested[-1].commit), merge.get("merged_commit"),
    )  # fmt: skip
    try:
        info = forge.project_info(project)
        cache = mirrors.RepoCache.in_data_dir(settings.data_dir)
        mirror = cache.mirror(gitcalls.mirror_key(forge.kind, project), info.clone_url, forge.git_auth_header())
        entry = attest_merge(settings, mirror, facts, thread_id, job_ids)
    except (gitcalls.RepoError, keys.AttestationKeyError) as exc:
        with session_scope() as session:
            add_event(session, thread_id, "merge_unattested", f"the {facts.action} MR was not attested: {exc}"[:2000])
        return "failed"
    if entry is None:
        return "unsigned"
    with session_scope() as session:
        add_event(session, thread_id, "merge_attested",
                  f"signed the statement that {facts.by or 'someone'} {facts.action} the MR ({entry['envelope'][:12]})",
                  {"attestation": entry["envelope"], "log_seq": entry["seq"]})  # fmt: skip
    return "signed"
