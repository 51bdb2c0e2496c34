"""Where attestations live: with their job in the data folder, in the append-only log, and as one bundle.

`attestations/job-<id>/<n>.json` holds an envelope with what replay and `verify` need beside it (the
patch as pushed, the trajectory's path). `attestations/log.jsonl` is the installation's append-only log:
one canonical JSON line an entry, each naming the previous entry's digest, so an entry removed or altered
later breaks the chain. A bundle (`/api/jobs/{id}/attestations`) is a job's envelopes with their patches
and trajectories, and the stretch of the log that holds them.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from app import trajectory
from app.attestations.signing import envelope_digest
from app.attestations.statement import CHAIN_START, canonical, sha256

DIRECTORY: Final = "attestations"
LOG: Final = "log.jsonl"
BUNDLE_FORMAT: Final = "frogfix-attestations/1"


def job_folder(data_dir: Path, job_id: int) -> Path:
    return Path(data_dir) / DIRECTORY / f"job-{int(job_id)}"


def entry_digest(entry: dict[str, Any]) -> str:
    return sha256(canonical(entry))


@contextmanager
def _locked(data_dir: Path) -> Iterator[Path]:
    """The attestations folder under an exclusive lock: one writer of the log at a time, on any process."""
    folder = Path(data_dir) / DIRECTORY
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "log.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_log(data_dir: Path) -> list[dict[str, Any]]:
    path = Path(data_dir) / DIRECTORY / LOG
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def save(
    data_dir: Path, job_id: int, envelope: dict[str, Any], *, kind: str, patch: str = "", trajectory_path: str = ""
) -> dict[str, Any]:
    """Keep `envelope` with its job and append it to the log, under one lock; the log entry written."""
    digest = envelope_digest(envelope)
    with _locked(data_dir) as folder:
        entries = read_log(data_dir)
        previous = entry_digest(entries[-1]) if entries else CHAIN_START
        entry = {
            "seq": len(entries) + 1, "at": datetime.now(UTC).isoformat(timespec="seconds"), "job": int(job_id),
            "kind": kind, "envelope": digest, "prev": previous,
        }  # fmt: skip
        here = job_folder(data_dir, job_id)
        record = {"kind": kind, "digest": digest, "envelope": envelope, "patch": patch, "trajectory": trajectory_path}
        trajectory.write_atomic(here / f"{entry['seq']:06d}.json", canonical(record))
        with open(folder / LOG, "ab") as log:
            log.write(canonical(entry) + b"\n")
    return entry


def records(data_dir: Path, job_id: int) -> list[dict[str, Any]]:
    """The job's kept attestations, oldest first."""
    here = job_folder(data_dir, job_id)
    return [json.loads(path.read_bytes()) for path in sorted(here.glob("*.json"))] if here.is_dir() else []


def bundle(data_dir: Path, job_id: int) -> dict[str, Any]:
    """The job's envelopes with their patches and trajectories, and the log's stretch from its first entry
    to its last (so a removed or altered entry between them shows)."""
    items = []
    for record in records(data_dir, job_id):
        try:
            document: dict[str, Any] | None = trajectory.load(trajectory.existing(data_dir, record["trajectory"]))
        except trajectory.TrajectoryError:
            document = None
        items.append({"kind": record["kind"], "envelope": record["envelope"], "patch": record["patch"],
                      "trajectory": document})
    digests = {record["digest"] for record in records(data_dir, job_id)}
    log = read_log(data_dir)
    mine = [i for i, entry in enumerate(log) if entry.get("envelope") in digests]
    stretch = log[mine[0] : mine[-1] + 1] if mine else []
    before = entry_digest(log[mine[0] - 1]) if mine and mine[0] > 0 else CHAIN_START
    return {"format": BUNDLE_FORMAT, "job": int(job_id), "attestations": items,
            "log": {"previous": before, "entries": stretch}}
