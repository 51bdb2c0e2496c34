"""The trajectory document: where its file lives, how it is written, how it is read back.

One home for a format four readers share (the dashboard, `manage.py show`, replay and the
replay model) and one writer produces (worker/leaf/trajectory_writer.py). Standard library only, so
worker/leaf may import it without pulling in the database or the web layer.

Paths are stored relative to the data folder (`trajectories/job-7-run-1-2.json`), so a data
folder that is moved or restored elsewhere keeps working. Older versions stored absolute paths;
`resolve` still finds those files by mapping their `trajectories/...` tail onto the current data
folder. Nothing outside the data folder is ever read.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from datetime import UTC, datetime
from pathlib import Path, PurePath
from typing import Any, Final

TRAJECTORY_FORMAT: Final = "leaf-function-calling"
FORMAT_VERSION: Final = 1
DIRECTORY: Final = "trajectories"  # under the data folder
REPLAYS: Final = f"{DIRECTORY}/replays"
# The id an older version gave a local (`manage.py fix`) job, before local jobs were rows (app/jobs/local.py
# imports them, keeping the id): also its files' name, so it may hold no path separator. Those ids start
# with the UTC second they were made: `local-YYYYMMDD-HHMMSS-<hex>`.
LOCAL_ID: Final = re.compile(r"local-[A-Za-z0-9][A-Za-z0-9._-]{0,120}")
_LOCAL_STAMP: Final = re.compile(r"local-(\d{8}-\d{6})(?:-|$)")


def local_id_time(local_id: str) -> datetime | None:
    """When an older local job started, from its id's stamp; None for an id without one."""
    stamp = _LOCAL_STAMP.match(local_id)
    if stamp is None:
        return None
    try:
        return datetime.strptime(stamp.group(1), "%Y%m%d-%H%M%S").replace(tzinfo=UTC)
    except ValueError:
        return None


class TrajectoryError(ValueError):
    """A trajectory cannot be used: the message says which file and why, for an operator."""


class TrajectoryMissing(TrajectoryError):
    """There is no file (yet): none was recorded, or the worker has not saved a step."""


class OutsideDataFolder(TrajectoryError):
    """The stored path leads out of the data folder; it is refused, never read."""


# -- where the file lives ----------------------------------------------------------------------


def attempt_path(job_id: int, run: int, attempt: int) -> str:
    """A forge job's attempt, relative to the data folder (what the job records)."""
    return f"{DIRECTORY}/job-{int(job_id)}-run-{int(run)}-{int(attempt)}.json"


def local_path(local_id: str, attempt: int = 1) -> str:
    """A local job's trajectory of one attempt, relative to the data folder; the id must be a local id.

    The first attempt's file is named after the job alone (as before jobs had several)."""
    if not LOCAL_ID.fullmatch(local_id):
        raise TrajectoryError(f"{local_id[:80]!r} is not a local job id")
    suffix = "" if int(attempt) == 1 else f".attempt-{int(attempt)}"
    return f"{DIRECTORY}/{local_id}{suffix}.json"


def replay_path(recorded: str | PurePath, mode: str, now: datetime | None = None) -> str:
    """A new replay's file, relative to the data folder, named after the recording it replays.

    The time stamp and a random suffix keep two replays of one recording apart.
    """
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,40}", mode):
        raise TrajectoryError(f"{mode[:40]!r} is not a replay mode")
    return f"{REPLAYS}/{PurePath(recorded).stem}.{mode}-{stamp}-{secrets.token_hex(2)}.json"


def resolve(data_dir: Path, stored: str | None) -> Path:
    """The file a job's stored path names, under the current data folder (it may not exist yet).

    Accepts the relative form and the absolute form older versions stored. An absolute path
    outside the current data folder is taken to be from a data folder that has since moved: its
    `trajectories/...` tail is looked up here. Anything that still leads out (`..`, a symlink,
    a path with no such tail) raises OutsideDataFolder.
    """
    if not stored:
        raise TrajectoryMissing("this attempt has no trajectory file")
    root = Path(os.path.realpath(data_dir))
    lexical = Path(os.path.normpath(stored))
    if not lexical.is_absolute():
        candidate = Path(os.path.realpath(root / lexical))
    else:
        candidate = Path(os.path.realpath(lexical))
        if root not in candidate.parents:
            candidate = Path(os.path.realpath(_moved(lexical, root)))
    if root not in candidate.parents:
        raise OutsideDataFolder(f"{stored} is outside this server's data folder ({data_dir})")
    return candidate


def _moved(stored: Path, root: Path) -> Path:
    """An old absolute path's `trajectories/...` tail under `root`; `stored` itself when it has none."""
    parts = stored.parts
    if DIRECTORY not in parts[1:-1]:
        return stored
    last = len(parts) - 2 - parts[-2::-1].index(DIRECTORY)  # the innermost folder of that name
    return root.joinpath(*parts[last:])


def existing(data_dir: Path, stored: str | None) -> Path:
    """`resolve`, and the file must be there as a regular file."""
    path = resolve(data_dir, stored)
    if not path.is_file():
        raise TrajectoryMissing(f"{stored} is not on this server (is the data folder shared with the worker?)")
    return path


# -- writing -----------------------------------------------------------------------------------


def write_atomic(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace `path` with `data` whole: a reader (or a crash) sees the old file or the new one.

    Temporary file beside it, flushed and fsynced, then renamed over it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")  # one per writer thread
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


# -- reading -----------------------------------------------------------------------------------


def load(path: Path) -> dict[str, Any]:
    """The file's JSON object, unchecked beyond that: for readers that tolerate partial files."""
    try:
        data = json.loads(Path(path).read_bytes())
    except FileNotFoundError as exc:
        raise TrajectoryMissing(f"the trajectory {path} could not be read: {exc}") from exc
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise TrajectoryError(f"the trajectory {path} could not be read: {exc}") from exc
    if not isinstance(data, dict):
        raise TrajectoryError(f"{path} is not a Leaf trajectory")
    return data


def amend(path: Path, fields: dict[str, Any]) -> None:
    """Add top-level fields to a finished trajectory, whole (a caller's verdict that came after the run).

    `fields` are written as given: the caller redacts them, as the writer redacts what it writes.
    """
    document = load(path)
    document.update(fields)
    document["updated_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    write_atomic(path, json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def validate(document: dict[str, Any], where: str | PurePath) -> dict[str, Any]:
    """The document, when it can be replayed: the Leaf format, starting with the system prompt and the task."""
    if document.get("trajectory_format") != TRAJECTORY_FORMAT:
        raise TrajectoryError(f"{where} is not a Leaf trajectory")
    messages = document.get("messages")
    if (
        not isinstance(messages, list)
        or len(messages) < 2
        or not isinstance(messages[0], dict)
        or not isinstance(messages[1], dict)
        or messages[0].get("role") != "system"
        or messages[1].get("role") != "user"
    ):
        raise TrajectoryError(f"{where} does not start with the system prompt and the task")
    return document


def read(path: Path) -> dict[str, Any]:
    """The file's document, checked as replay needs it (`load` then `validate`)."""
    return validate(load(path), path)
