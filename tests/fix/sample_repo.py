"""The demo's sample repository (a real bug with a failing test), made fresh for each test."""

from __future__ import annotations

import subprocess
from pathlib import Path

from worker.commands.demo import ISSUE_BODY, ISSUE_TITLE, make_sample_repo

ISSUE = f"{ISSUE_TITLE}\n\n{ISSUE_BODY}\n"
__all__ = ["ISSUE", "git", "make_sample_repo"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout
