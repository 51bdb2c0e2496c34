"""A person's merge of an MR's branch into its target in a double's bare repository, as the forge's merge
button does it: a merge commit (`--no-ff`), or a squash (one new commit on the target). The doubles'
`merge_mr` / `merge_pull` use it, then report the merge with the commit it made."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path


def _git(cwd: Path, *args: str, name: str) -> str:
    who = ["-c", f"user.name={name}", "-c", f"user.email={name}@example.com", "-c", "commit.gpgsign=false"]
    done = subprocess.run(["git", *who, *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=60)
    return done.stdout.strip()


def merge_in_bare(bare: Path, source: str, target: str, *, squash: bool, by: str) -> tuple[str, str]:
    """Merge `source` into `target` in `bare` and push it there: (the source's head, the target's new commit)."""
    with tempfile.TemporaryDirectory(prefix="double-merge-") as folder:
        work = Path(folder) / "work"
        subprocess.run(["git", "clone", "-q", "-b", target, str(bare), str(work)], check=True, timeout=60)
        head = _git(work, "rev-parse", f"origin/{source}", name=by)
        if squash:
            _git(work, "merge", "-q", "--squash", f"origin/{source}", name=by)
            _git(work, "commit", "-qm", f"Squashed {source}", name=by)
        else:
            _git(work, "merge", "-q", "--no-ff", "-m", f"Merge branch '{source}'", f"origin/{source}", name=by)
        _git(work, "push", "-q", "origin", target, name=by)
        return head, _git(work, "rev-parse", "HEAD", name=by)
