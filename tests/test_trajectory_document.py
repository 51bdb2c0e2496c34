"""app/trajectory.py: where a trajectory lives (relative to the data folder), how it is written and read."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from app import trajectory
from app.trajectory import OutsideDataFolder, TrajectoryError, TrajectoryMissing

GOOD = {
    "trajectory_format": "leaf-function-calling",
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "t"}],
}


def test_paths_are_relative_to_the_data_folder() -> None:
    assert trajectory.attempt_path(7, 2, 3) == "trajectories/job-7-run-2-3.json"
    assert trajectory.local_path("local-20260101-120000-abc123") == "trajectories/local-20260101-120000-abc123.json"
    for bad in ("local-../x", "../local-x", "local-a/b", "job-1"):
        with pytest.raises(TrajectoryError, match="not a local job id"):
            trajectory.local_path(bad)
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    name = trajectory.replay_path("/old/data/trajectories/job-7-run-2-3.json", "live", when)
    assert name.startswith("trajectories/replays/job-7-run-2-3.live-20260102-030405-") and name.endswith(".json")
    assert trajectory.replay_path(trajectory.attempt_path(7, 2, 3), "replay", when) != trajectory.replay_path(
        trajectory.attempt_path(7, 2, 3), "replay", when
    )
    with pytest.raises(TrajectoryError):
        trajectory.replay_path("x.json", "../live")


def test_resolve_takes_the_relative_form_and_the_absolute_form_of_a_moved_data_folder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "trajectories" / "replays").mkdir(parents=True)
    here = (data / "trajectories" / "job-1-run-1-1.json").resolve()
    assert trajectory.resolve(data, "trajectories/job-1-run-1-1.json") == here
    assert trajectory.resolve(data, str(here)) == here  # absolute, in this data folder
    assert trajectory.resolve(data, "/srv/old/data/trajectories/job-1-run-1-1.json") == here  # moved since
    replay = (data / "trajectories" / "replays" / "r.json").resolve()
    assert trajectory.resolve(data, "/srv/old/trajectories/data/trajectories/replays/r.json") == replay
    # It names where the file would be; whether it is there is `existing`'s question.
    with pytest.raises(TrajectoryMissing, match="not on this server"):
        trajectory.existing(data, "trajectories/job-1-run-1-1.json")
    here.write_text("{}")
    assert trajectory.existing(data, "/srv/old/data/trajectories/job-1-run-1-1.json") == here
    with pytest.raises(TrajectoryMissing, match="no trajectory file"):
        trajectory.resolve(data, None)
    with pytest.raises(TrajectoryMissing, match="no trajectory file"):
        trajectory.resolve(data, "")


def test_nothing_outside_the_data_folder_is_resolved(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "trajectories").mkdir(parents=True)
    secret = tmp_path / "secret.json"
    secret.write_text("{}")
    (data / "trajectories" / "link.json").symlink_to(secret)
    (tmp_path / "trajectories").mkdir()
    for stored in (
        str(secret),
        "../secret.json",
        "trajectories/../../secret.json",
        "trajectories/link.json",
        str(data / "trajectories" / "link.json"),
        "/srv/old/data/trajectories/link.json",  # moved, but the file here is a link out
        "/srv/old/data/trajectories/../../../secret.json",
        "/etc/passwd",
        ".",
    ):
        with pytest.raises(OutsideDataFolder, match="outside this server's data folder"):
            trajectory.resolve(data, stored)


def test_read_checks_what_replay_needs_and_load_only_that_it_is_an_object(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(json.dumps(GOOD))
    assert trajectory.read(path) == GOOD
    cases = {
        "{not json": "could not be read",
        "[1, 2]": "is not a Leaf trajectory",
        json.dumps({**GOOD, "trajectory_format": "other"}): "is not a Leaf trajectory",
        json.dumps({**GOOD, "messages": GOOD["messages"][::-1]}): "does not start with the system prompt",
        json.dumps({**GOOD, "messages": [{"role": "system"}]}): "does not start with the system prompt",
        json.dumps({"trajectory_format": "leaf-function-calling"}): "does not start with the system prompt",
    }
    for text, message in cases.items():
        path.write_text(text)
        with pytest.raises(TrajectoryError, match=message):
            trajectory.read(path)
    partial = {"messages": [], "partial": True}
    path.write_text(json.dumps(partial))
    assert trajectory.load(path) == partial
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(TrajectoryError, match="could not be read"):
        trajectory.load(path)
    with pytest.raises(TrajectoryMissing):
        trajectory.load(tmp_path / "none.json")


def test_write_atomic_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "trajectories" / "t.json"
    trajectory.write_atomic(path, b'{"a": 1}')
    trajectory.write_atomic(path, b'{"a": 2}', fsync=False)
    assert json.loads(path.read_text()) == {"a": 2}
    assert os.listdir(path.parent) == ["t.json"]
    assert path.stat().st_mode & 0o777 == 0o640


def test_amend_adds_fields_to_the_whole_document(tmp_path: Path) -> None:
    path = tmp_path / "trajectories" / "local-x.json"
    trajectory.write_atomic(path, json.dumps({"trajectory_format": "leaf-function-calling", "messages": []}).encode())
    trajectory.amend(path, {"fix": {"status": "no_fix"}})
    data = json.loads(path.read_text())
    assert data["fix"] == {"status": "no_fix"} and data["trajectory_format"] == "leaf-function-calling"
    assert "updated_at" in data and [p.name for p in path.parent.iterdir()] == ["local-x.json"]
    with pytest.raises(TrajectoryMissing):
        trajectory.amend(tmp_path / "trajectories" / "gone.json", {"fix": {}})
