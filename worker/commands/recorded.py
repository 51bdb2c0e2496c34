"""A recorded task: which attempt of a job to run again, its repository, and where its checkout starts.

A forge job's chosen attempt (or the one asked for) and a local job's trajectory file are found
here (`find_recording`), with the repository they ran on (`repo_source`: the mirror, made again from
the forge when it lacks the commit; a local checkout; the demo's sample made again). replay.py
compares a recording with a new run and evaluate.py scores a candidate model on it: both start here.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from app import trajectory
from app.db import session_scope
from app.jobs import local, records
from app.settings import Settings
from worker.git import gitcalls, merging, mirrors, workspace_pool
from worker.git.workspace_sources import CheckoutSource, MirrorSource
from worker.wiring import make_forge

Progress = Callable[[str], None]


class ReplayError(Exception):
    """The replay cannot run (no recording, repository gone, bad options); the message says why."""


def parse_job_id(value: int | str) -> int | str:
    """A forge job's number, or a local job's `local-...` id; anything else is an unknown job."""
    if isinstance(value, int):
        return value
    text = value.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    if trajectory.LOCAL_ID.fullmatch(text):
        return text
    raise records.UnknownJob(f"no job with id {text[:80]!r}")


@dataclass
class Recording:
    """One attempt's saved trajectory, and where its repository can be found again."""

    job_id: int | str
    path: Path
    data: dict[str, Any]
    base_commit: str
    patch: str | None
    run: int | None = None
    number: int | None = None
    forge: str | None = None
    project: str | None = None
    repository: str | None = None  # local jobs: the checkout `fix` ran on
    start_commit: str | None = None  # a review round's branch head; None: the attempt started at the base

    @property
    def checkout_commit(self) -> str:
        """The commit the attempt's workspace was made at, and its patch is against."""
        return self.start_commit or self.base_commit

    @property
    def messages(self) -> list[dict[str, Any]]:
        return [m for m in self.data.get("messages", []) if isinstance(m, dict)]

    @property
    def replies(self) -> int:
        return sum(1 for m in self.messages if m.get("role") == "assistant")

    @property
    def exit_reason(self) -> str | None:
        value = self.data.get("exit_reason")
        return value if isinstance(value, str) else None

    @property
    def n_steps(self) -> int:
        value = self.data.get("n_steps")
        return value if isinstance(value, int) else len(self.data.get("steps", []))


def _load_trajectory(path: Path) -> dict[str, Any]:
    try:
        return trajectory.read(path)
    except trajectory.TrajectoryError as exc:
        raise ReplayError(str(exc)) from exc


@dataclass
class _AttemptFile:
    run: int
    number: int
    path: Path
    patch: str | None


def _select_attempt(
    attempts: Sequence[_AttemptFile], attempt: int | str | None, job_id: int
) -> _AttemptFile | None:
    """`None`: the last attempt that has a trajectory; `N`: attempt N of the latest run that has
    one; `R.N`: attempt N of run R."""
    if attempt is None:
        return attempts[-1] if attempts else None
    text = str(attempt).strip()
    match = re.fullmatch(r"(?:(\d+)[.:])?(\d+)", text)
    if match is None:
        raise ReplayError(f"--attempt takes N or RUN.N, not {text!r}")
    run = int(match.group(1)) if match.group(1) else None
    number = int(match.group(2))
    chosen = [a for a in attempts if a.number == number and (run is None or a.run == run)]
    if not chosen:
        shown = ", ".join(f"{a.run}.{a.number}" for a in attempts) or "none"
        raise ReplayError(f"job {job_id} has no attempt {text} with a trajectory (attempts: {shown})")
    return chosen[-1]


def recording_from_file(job_id: int | str, stored: str, settings: Settings) -> Recording:
    """A live or `eval` attempt's own trajectory (under trajectories/replays/) as the recording to replay.

    The job's recording says where its repository is; the file says what the attempt did. The file
    must be in the data folder and belong to the job.
    """
    job_rec = find_recording(job_id, None, settings)
    try:
        path = trajectory.resolve(settings.data_dir, stored)
    except trajectory.TrajectoryError as exc:
        raise ReplayError(str(exc)) from exc
    if not path.is_file():
        raise ReplayError(f"no trajectory {stored[:200]!r} in the data folder")
    data = _load_trajectory(path)
    if str(data.get("job_id")) != str(job_id):
        raise ReplayError(f"{path.name} is not a trajectory of job {job_id}")
    base = data.get("base_commit")
    if not isinstance(base, str) or not base:
        raise ReplayError(f"{path} records no base commit")
    patch = data.get("output_patch")
    # What the job's recording says about its issue and checkout (a demo's sample is made again from it).
    known: dict[str, Any] = {k: job_rec.data[k] for k in ("issue", "repository", "kind") if k in job_rec.data}
    return replace(
        job_rec, path=path, data={**known, **data}, base_commit=base, patch=patch if isinstance(patch, str) else None,
        start_commit=start_commit_of(data, job_rec.start_commit, base),
    )


def find_recording(job_id: int | str, attempt: int | str | None, settings: Settings) -> Recording:
    """The trajectory to replay: a forge job's chosen attempt, or a local job's one file."""
    if isinstance(job_id, str):
        try:
            number = int(attempt) if attempt is not None else 1
        except ValueError as exc:
            raise ReplayError(f"--attempt must be a number, not {str(attempt)[:40]!r}") from exc
        path = settings.data_dir / trajectory.local_path(job_id, number)
        if number != 1 and not path.is_file():
            raise ReplayError(f"the local job {job_id} has no attempt {number} (no trajectory {path})")
        if not path.is_file():
            raise records.UnknownJob(f"no job with id {job_id} (no trajectory {path})")
        data = _load_trajectory(path)
        base = data.get("base_commit")
        if not isinstance(base, str) or not base:
            raise ReplayError(f"{path} records no base commit")
        patch = data.get("output_patch")
        repository = data.get("repository")
        return Recording(
            job_id, path, data, base, patch if isinstance(patch, str) else None,
            repository=repository if isinstance(repository, str) else None,
        )

    with session_scope() as session:
        job = records.get_job(session, job_id)
        forge, project, status, job_base = job.forge, job.project, job.status, job.base_commit
        job_start, clean_update = job.start_commit, job.round_kind == "update"
        rows = [
            (a.run, a.number, a.trajectory_path, a.patch) for a in records.job_attempts(session, job_id)
        ]

    with_files: list[_AttemptFile] = []
    for run, number, stored, patch in rows:
        # An attempt whose worker died has no stored path yet; its file is at the usual place.
        try:
            path = trajectory.resolve(settings.data_dir, stored or trajectory.attempt_path(job_id, run, number))
        except trajectory.TrajectoryError:  # a stored path out of the data folder is never read
            continue
        if path.is_file():
            with_files.append(_AttemptFile(run, number, path, patch))
    chosen = _select_attempt(with_files, attempt, job_id)
    if chosen is None:
        why = "it has no attempts" if not rows else "none of its attempts left a trajectory file"
        if clean_update and not rows:
            why = "it is an update round that ran no model (git merged the target cleanly; its page shows the tests)"
        raise ReplayError(f"job {job_id} ({status}) has nothing to replay: {why}")
    data = _load_trajectory(chosen.path)
    base = data.get("base_commit") or job_base
    if not isinstance(base, str) or not base:
        raise ReplayError(f"{chosen.path} records no base commit")
    recorded_patch = data.get("output_patch")
    if not isinstance(recorded_patch, str):
        recorded_patch = chosen.patch
    return Recording(
        job_id, chosen.path, data, base, recorded_patch, chosen.run, chosen.number, forge=forge, project=project,
        start_commit=start_commit_of(data, job_start, base), repository=project if forge == local.FORGE else None,
    )


def start_commit_of(data: dict[str, Any], job_start: str | None, base: str) -> str | None:
    """A review round's start: the trajectory's `start_commit`, else the job's column; None when it is the base.

    Only a full hex object name is taken from the file (it becomes a git argument).
    """
    recorded = data.get("start_commit")
    for start in (recorded if isinstance(recorded, str) else None, job_start):
        if start and _COMMIT.fullmatch(start):
            return None if start == base else start
    return None


_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")


class RepoSource:
    """Where fresh workspaces at the base commit come from: a forge mirror or a local checkout."""

    def __init__(self, kind: str, path: Path, *, temporary: Path | None = None, note: str | None = None) -> None:
        self.kind, self.path = kind, path
        self.temporary = temporary  # removed by `cleanup`
        self.note = note

    def cleanup(self) -> None:
        if self.temporary is not None:
            shutil.rmtree(self.temporary, ignore_errors=True)

    def checkout(self, dest: Path, commit: str) -> None:
        if self.kind == "mirror":
            MirrorSource(self.path).checkout(dest, commit)
            return
        try:
            CheckoutSource(self.path).checkout(dest, commit)
        except gitcalls.RepoError as exc:
            workspace_pool.remove_workspace(dest)
            raise ReplayError(f"cannot check out {commit[:12]} from {self.path}: {exc}") from exc

    def repository(self) -> Path:
        return self.path


def _is_demo(rec: Recording) -> bool:
    """A `manage.py demo` run, as its recording says (`kind`: its repository was a temporary sample
    that `make_sample_repo` can make again). Recordings made before they said so are known by the
    demo's issue title and temporary folder."""
    kind = rec.data.get("kind")
    if isinstance(kind, str):
        return kind == "demo"
    from worker.commands.demo import ISSUE_TITLE

    issue = rec.data.get("issue")
    title = issue.get("title") if isinstance(issue, dict) else None
    return bool(re.search(r"/frogfix-demo-[^/]+/calc$", rec.repository or "")) and title == ISSUE_TITLE


def _fresh_demo_repo(rec: Recording, progress: Progress) -> RepoSource:
    """The demo's sample repository made again. Its files are the same, but its commit is not (git
    stamps the time), so the replay starts from the new commit and the report says so."""
    import tempfile

    from worker.commands.demo import make_sample_repo

    folder = Path(tempfile.mkdtemp(prefix="frogfix-replay-demo-"))
    repo = make_sample_repo(folder)
    head = mirrors.resolve(repo, "HEAD")
    note = "the demo's repository was temporary; replayed on the same sample made again"
    if head != rec.base_commit:  # git stamps the time: usually another commit, said only when it is
        note += f" (commit {head[:12]} instead of {rec.base_commit[:12]})"
    progress(note)
    rec.base_commit = head
    return RepoSource("local", repo, temporary=folder, note=note)


def _has_commit(mirror: Path, commit: str) -> bool:
    if not (mirror / "HEAD").is_file():
        return False
    try:
        return gitcalls.has_commit(mirror, commit)
    except gitcalls.RepoError:  # not a commit id
        return False


def _update_heads(rec: Recording) -> tuple[str, str, str] | None:
    """An update round's attempt's merge as its trajectory records it (`update`): the branch's head, the
    target's head (full commit ids only: they become git arguments) and the target's name; None otherwise."""
    update = rec.data.get("update")
    if rec.start_commit is None or not isinstance(update, dict):
        return None
    head, target, name = update.get("head"), update.get("target"), update.get("target_branch")
    if not (isinstance(head, str) and isinstance(target, str)):
        return None
    if not (_COMMIT.fullmatch(head) and _COMMIT.fullmatch(target)):
        return None
    return head, target, name if isinstance(name, str) and name else "the target branch"


def resolution_of(rec: Recording, source: RepoSource) -> merging.Resolution | None:
    """An update round's merge as its attempt ran it, so a live run judges the resolution by the same
    rules; None for any other attempt, or a record that names no valid merge."""
    heads = _update_heads(rec)
    if heads is None:
        return None
    head, target, name = heads
    try:
        merge = merging.merge_trees(source.repository(), head, target)
        fork = mirrors.merge_base(source.repository(), head, target)
    except gitcalls.RepoError:
        return None
    return merging.Resolution(merge, fork, name)


def _update_start_made(mirror: Path, rec: Recording, progress: Progress) -> bool:
    """An update round's conflicted start (never pushed, so a fresh mirror lacks it) made again from the
    merge its trajectory records (`update`: the branch's head and the target's head); False when it cannot be."""
    heads = _update_heads(rec)
    if heads is None or rec.start_commit is None or not (mirror / "HEAD").is_file():
        return False
    try:
        made = merging.ensure_conflicted_commit(mirror, heads[0], heads[1], rec.start_commit)
    except gitcalls.RepoError:
        return False
    if made:
        progress(f"repository: the update round's conflicted start {rec.start_commit[:12]}, made again from its merge")
    return made


def repo_source(rec: Recording, settings: Settings, redact: Callable[[str], str], progress: Progress,
                repo_dir: Path | None = None) -> RepoSource:
    """The mirror on disk when it holds the commit the attempt started from, else the mirror updated
    from the forge; for a local job, its checkout (or `repo_dir`, where it lives now)."""
    base = rec.base_commit
    if isinstance(rec.job_id, str) or rec.forge == local.FORGE:
        where = repo_dir or (Path(rec.repository) if rec.repository else None)
        if where is None:
            raise ReplayError(f"the trajectory of {rec.job_id} does not say which repository it ran on; use --repo")
        if not (where / ".git").exists() and not (where / "HEAD").is_file():
            if repo_dir is None and _is_demo(rec):
                return _fresh_demo_repo(rec, progress)
            raise ReplayError(
                f"the repository {where} is gone (a demo's is temporary); "
                f"pass --repo DIR with a checkout that has commit {base[:12]}"
            )
        progress(f"repository: {where}")
        return RepoSource("local", where)

    assert rec.forge is not None and rec.project is not None
    cache = mirrors.RepoCache.in_data_dir(settings.data_dir)
    key = gitcalls.mirror_key(rec.forge, rec.project)
    mirror = cache.path_for(key)
    start = rec.checkout_commit
    if _has_commit(mirror, start) or _update_start_made(mirror, rec, progress):
        progress(f"repository: the mirror on disk has {start[:12]}")
        return RepoSource("mirror", mirror)
    progress(f"repository: updating the mirror of {rec.project} from {rec.forge}")
    forge = make_forge(rec.forge, settings, redact)
    try:
        info = forge.project_info(rec.project)
        mirror = cache.mirror(key, info.clone_url, forge.git_auth_header())
    finally:
        forge.close()
    if not _has_commit(mirror, start) and not _update_start_made(mirror, rec, progress):
        which = "start commit" if rec.start_commit else "base commit"
        raise ReplayError(f"the {which} {start[:12]} is no longer in {rec.project} (rewritten history?)")
    return RepoSource("mirror", mirror)
