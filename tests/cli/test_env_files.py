"""Where `.env` files are read from (issue 40): the checkout's, the data folder's and the current folder's, the
later winning, and the environment over all; so `manage.py` run from any folder finds the operator's `.env`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app import settings as settings_module
from app.settings import Settings, env_files

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    folders = {name: tmp_path / name for name in ("checkout", "data", "here")}
    for folder in folders.values():
        folder.mkdir()
    for key in list(os.environ):
        if key.startswith("FROGFIX_"):
            monkeypatch.delenv(key)
    monkeypatch.setattr(settings_module, "CHECKOUT", folders["checkout"])
    monkeypatch.setenv("FROGFIX_DATA_DIR", str(folders["data"]))
    monkeypatch.chdir(folders["here"])
    return folders


def loaded() -> Settings:
    return Settings(_env_file=env_files() or None)  # type: ignore[call-arg]


def test_each_place_is_read_and_the_nearer_one_wins(places: dict[str, Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    (places["checkout"] / ".env").write_text("FROGFIX_MODEL_NAME=from-checkout\nFROGFIX_TRIGGER_LABEL=checkout-label\n"
                                             "FROGFIX_ATTEMPTS=3\n")
    (places["data"] / ".env").write_text("FROGFIX_MODEL_NAME=from-data-folder\nFROGFIX_TRIGGER_LABEL=data-label\n")
    assert env_files() == (places["checkout"] / ".env", places["data"] / ".env")
    s = loaded()
    assert (s.model_name, s.trigger_label, s.attempts) == ("from-data-folder", "data-label", 3)

    (places["here"] / ".env").write_text("FROGFIX_MODEL_NAME=from-here\n")
    s = loaded()
    assert (s.model_name, s.trigger_label, s.attempts) == ("from-here", "data-label", 3)

    monkeypatch.setenv("FROGFIX_MODEL_NAME", "from-the-environment")
    assert loaded().model_name == "from-the-environment"


def test_none_is_needed(places: dict[str, Path]) -> None:
    assert env_files() == () and loaded().model_name == "FrogNano-4B-2609"


def test_manage_py_from_another_folder_reads_the_data_folders_env(tmp_path: Path) -> None:
    """A bad value in the data folder's `.env` is named by a command run elsewhere: the file was read."""
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    data.mkdir()
    elsewhere.mkdir()
    (data / ".env").write_text("FROGFIX_ATTEMPTS=0\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    done = subprocess.run([sys.executable, str(ROOT / "manage.py"), "jobs"], cwd=elsewhere, capture_output=True,
                          text=True, timeout=60, env={**env, "FROGFIX_DATA_DIR": str(data)})
    assert done.returncode == 2 and done.stderr.startswith("frogfix jobs: FROGFIX_ATTEMPTS: "), done.stderr
