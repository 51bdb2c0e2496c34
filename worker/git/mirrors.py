"""Bare mirrors of the forge's repositories on the worker, and what is read from them.

Layout under `RepoCache.root`: `<key>.git` (the bare mirror: branch heads only, no remote, no URL)
and `<key>.lock` (worker/git/gitcalls.py's flock). A fetch holds the lock exclusively; readers share it.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from app.forge.api import git_auth_env

# ---------------------------------------------------------------------------------------------
# Mirrors
# ---------------------------------------------------------------------------------------------
from worker.git.gitcalls import (
    FETCH_FLAGS,
    HEADS_REFSPEC,
    LOCAL_TIMEOUT,
    MIRROR_CONFIG,
    NETWORK_TIMEOUT,
    SHA,
    RepoError,
    check_key,
    check_sha,
    check_url,
    flock,
    git_dir_args,
    git_environment,
    lock_path,
    reading_lock,
    run_git,
    secret_forms,
)
from worker.git.workspace_pool import remove_workspace

MIRRORS_DIR = "mirrors"  # under the data folder: every forge mirror the worker keeps


class RepoCache:
    """Bare mirrors of forge repositories under `root`, one per key, updated in place."""

    def __init__(self, root: Path, *, timeout: float = NETWORK_TIMEOUT) -> None:
        self.root = Path(root)
        self.timeout = timeout

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> RepoCache:
        """The worker's mirrors, in the data folder (the pipeline, replay and the update check share them)."""
        return cls(data_dir / MIRRORS_DIR)

    def path_for(self, key: str) -> Path:
        return self.root / f"{check_key(key)}.git"

    def mirror(self, key: str, clone_url: str, auth_header: str | None) -> Path:
        """The mirror for `key`, created or brought up to date (heads only, pruned); its path.

        Holds the mirror's exclusive lock throughout, so concurrent callers fetch one at a time
        (the second one's fetch is then a cheap no-op).
        """
        path = self.path_for(key)
        check_url(clone_url)
        self.root.mkdir(parents=True, exist_ok=True)
        with flock(lock_path(path), exclusive=True):
            if (path / "HEAD").is_file() and (path / "objects").is_dir() and (path / "refs").is_dir():
                self._update(path, clone_url, auth_header)
            else:
                self._create(path, clone_url, auth_header)
        return path

    def _network_env(self, clone_url: str, auth_header: str | None) -> dict[str, str]:
        env = git_environment()
        return git_auth_env(auth_header, url=clone_url, base_env=env) if auth_header else env

    def _fetch(self, path: Path, clone_url: str, auth_header: str | None) -> None:
        run_git(
            [*git_dir_args(path), "fetch", *FETCH_FLAGS, "--prune", "--", clone_url, HEADS_REFSPEC],
            env=self._network_env(clone_url, auth_header),
            what="git fetch",
            timeout=self.timeout,
            secrets=secret_forms(auth_header),
            network=True,
        )

    def _set_head(self, path: Path, clone_url: str, auth_header: str | None) -> None:
        """Point the mirror's HEAD at the remote's default branch (one ls-remote)."""
        done = run_git(
            ["ls-remote", "--symref", "--", clone_url, "HEAD"],
            env=self._network_env(clone_url, auth_header),
            what="git ls-remote",
            timeout=self.timeout,
            secrets=secret_forms(auth_header),
            network=True,
            cwd=path,
        )
        match = re.search(rb"^ref: (refs/heads/\S+)\tHEAD$", done.stdout, re.M)
        if match is not None:
            run_git(
                [*git_dir_args(path), "symbolic-ref", "HEAD", match.group(1).decode()],
                env=git_environment(),
                what="git symbolic-ref",
                timeout=LOCAL_TIMEOUT,
            )

    def _create(self, path: Path, clone_url: str, auth_header: str | None) -> None:
        """init --bare + fetch in a side folder, renamed into place only once it worked."""
        staging = path.with_name(path.name + ".new")
        for leftover in (staging, path):
            if leftover.exists():
                remove_workspace(leftover)
        env = git_environment()
        run_git(
            ["init", "--quiet", "--bare", "--template=", str(staging)], env=env, what="git init", timeout=LOCAL_TIMEOUT
        )
        try:
            with (staging / "config").open("a", encoding="utf-8") as config:
                for key, value in MIRROR_CONFIG:
                    section, name = key.split(".")
                    config.write(f"[{section}]\n\t{name} = {value}\n")
            self._fetch(staging, clone_url, auth_header)
            self._set_head(staging, clone_url, auth_header)
            staging.rename(path)
        except BaseException:
            remove_workspace(staging)
            raise

    def _update(self, path: Path, clone_url: str, auth_header: str | None) -> None:
        _clear_stale_locks(path)
        self._fetch(path, clone_url, auth_header)
        head = run_git(
            [*git_dir_args(path), "rev-parse", "--verify", "--quiet", "HEAD"],
            env=git_environment(),
            what="git rev-parse",
            timeout=LOCAL_TIMEOUT,
            check=False,
        )
        if head.returncode != 0:  # the default branch was renamed or deleted upstream
            self._set_head(path, clone_url, auth_header)


def _clear_stale_locks(mirror: Path) -> None:
    """Remove ref lock files a killed fetch (timeout) left behind; they would fail every later fetch.

    Safe only under the mirror's exclusive flock: nothing else updates refs in our mirrors.
    """
    candidates = [mirror / name for name in ("packed-refs.lock", "HEAD.lock", "config.lock", "shallow.lock")]
    candidates += list((mirror / "refs").rglob("*.lock"))
    for lock in candidates:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()


def resolve(mirror: Path, ref: str) -> str:
    """The full commit id `ref` (a branch, `HEAD`, `refs/heads/x` or a sha) names in `mirror`."""
    if not ref or ref.startswith("-") or any(ch.isspace() or ord(ch) < 32 for ch in ref):
        raise RepoError(f"not a valid ref: {ref[:80]!r}")
    with reading_lock(mirror):
        done = run_git(
            [*git_dir_args(mirror), "rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"],
            env=git_environment(),
            what="git rev-parse",
            timeout=LOCAL_TIMEOUT,
            check=False,
        )
    if done.returncode != 0:
        raise RepoError(f"{ref[:80]!r} names no commit in the mirror")
    return done.stdout.decode().strip()


def describe(mirror: Path, commit: str) -> tuple[str, int] | None:
    """The last tag reachable from `commit` and how many commits lie past it, or None (no tag, a shallow
    history, or anything git will not say): what setuptools-scm and hatch-vcs would read from a full clone."""
    check_sha(commit)
    with reading_lock(mirror):
        done = run_git(
            [*git_dir_args(mirror), "describe", "--tags", "--long", "--end-of-options", commit],
            env=git_environment(),
            what="git describe",
            timeout=LOCAL_TIMEOUT,
            check=False,
        )
    match = re.fullmatch(r"(.+)-(\d+)-g[0-9a-f]+", done.stdout.decode("utf-8", "replace").strip())
    if done.returncode != 0 or match is None:
        return None
    return match.group(1), int(match.group(2))


def has_uncommitted_changes(checkout: Path) -> bool:
    """Whether a user's checkout differs from its HEAD (for a note only): isolated, and writes nothing there."""
    done = run_git(
        ["--no-optional-locks", "-C", str(checkout), "status", "--porcelain", "-z"],
        env=git_environment(),
        what="git status",
        timeout=LOCAL_TIMEOUT,
        check=False,
    )
    return done.returncode == 0 and bool(done.stdout.strip(b"\0"))



def merge_base(mirror: Path, one: str, other: str) -> str:
    """The best common ancestor of two commits (a round's base: where the bot's branch left the default branch)."""
    for commit in (one, other):
        check_sha(commit)
    with reading_lock(mirror):
        done = run_git(
            [*git_dir_args(mirror), "merge-base", one, other],
            env=git_environment(),
            what="git merge-base",
            timeout=LOCAL_TIMEOUT,
            check=False,
        )
    found = done.stdout.decode().strip()
    if done.returncode != 0 or not SHA.fullmatch(found):
        raise RepoError(f"{one[:12]} and {other[:12]} have no common ancestor in the mirror")
    return found


def diff_text(mirror: Path, base: str, head: str, *, limit: int = 40_000) -> str:
    """`git diff base head` as text (binary files named, not shown), cut to `limit` characters with a note."""
    for commit in (base, head):
        check_sha(commit)
    args = ["diff", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", base, head, "--"]
    with reading_lock(mirror):
        done = run_git(
            [*git_dir_args(mirror), *args], env=git_environment(), what="git diff", timeout=LOCAL_TIMEOUT,
            max_memory=1024**3,
        )
    text = done.stdout.decode("utf-8", "replace")
    if len(text) > limit:
        text = text[:limit] + f"\n[diff cut: {len(text) - limit} more characters]"
    return text
