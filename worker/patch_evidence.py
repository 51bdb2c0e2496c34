"""What a sandbox's patch really does, as git stores it, taken outside the sandbox.

The patch text comes from the sandbox, so it is hostile input: a parser of our own would read it
differently from git (a second `---`/`+++`/`@@` section after a hunk that git applies; a `\\r` in a
symlink target that `str.splitlines` breaks on and git does not). So nothing judges the text.
`take_evidence` applies it with git itself, in the isolated git environment (no `FROGFIX_*`
variable, no global or system config, so no filter, hook or external driver of the host runs),
to a private index at the base commit in a private bare repository whose only objects are its
own, with the source repository's objects as alternates (nothing is written into a user's
checkout or the mirror). From the tree git wrote it takes, in git's own `-z` output, each
changed path, its modes, its size, git's binary verdict and a symlink's stored target; the review
rules, the diffstat and the MR's file table read that. The patch that is then stored, tested,
pushed and shown is the one git regenerates from the tree.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from worker.ci_config import MAX_CI_FILE_BYTES, CiPaths, CiUnreadable, ci_paths
from worker.repos import LOCAL_TIMEOUT, RepoError, check_sha, git_dir_args, git_environment, reading_lock, run_git

MAX_LINK_TARGET_BYTES = 4096  # PATH_MAX: a longer "symlink" is no symlink any system makes
_REGENERATE = (
    "diff", "--binary", "--full-index", "--no-renames", "--no-ext-diff", "--no-textconv", "--no-color",
    "--src-prefix=a/", "--dst-prefix=b/",
)  # fmt: skip
_STATUS = {"A": "added", "D": "deleted", "M": "modified", "T": "type changed"}


class PatchRefused(Exception):
    """Git cannot apply the patch, or what it stores is too large: the message is git's reason."""


@dataclass(frozen=True)
class ChangedFile:
    """One path the patch changes, as git stored it (`--no-renames`: a move is a delete and an add)."""

    path: str  # decoded as UTF-8 with surrogateescape, so odd bytes survive a round trip
    status: str = "modified"  # added, deleted, modified or type changed
    old_mode: str = "100644"
    new_mode: str = "100644"
    added: int = 0  # lines, from git's numstat; 0 for binary files
    removed: int = 0
    binary: bool = False  # git's own verdict (numstat `-`), the same that shapes the regenerated patch
    size: int = 0  # bytes of the new blob; 0 when deleted
    link_target: str | None = None  # the new side is a symlink: its target exactly as stored

    @property
    def symlink(self) -> bool:
        return self.new_mode == "120000"

    @property
    def submodule(self) -> bool:
        return self.new_mode == "160000"


@dataclass(frozen=True)
class PatchEvidence:
    """The changes of one patch on its base, from git's objects; `patch` is git's regeneration of them."""

    base: str
    tree: str
    patch: str
    files: tuple[ChangedFile, ...]
    ci: CiPaths = field(default_factory=CiPaths)  # fixed CI files, local includes at base and after

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    def diffstat(self) -> list[tuple[str, int, int]]:
        """(path, lines added, lines removed) per file, for the MR's file table."""
        return [(f.path, f.added, f.removed) for f in self.files]


def take_evidence(source: Path, base: str, patch: str, scratch: Path, *, max_bytes: int) -> PatchEvidence:
    """Apply `patch` to `base` of `source` (a mirror or a checkout) with git, privately; see the module.

    Raises PatchRefused when git cannot apply it (with git's reason) or when git's regeneration
    is larger than `max_bytes`, and RepoError when git itself fails. `scratch` is removed after.
    """
    check_sha(base)
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="evidence-", dir=scratch))
    try:
        repo = _private_repo(Path(source), work)
        with reading_lock(Path(source)):
            return _evidence(repo, base, patch.encode("utf-8", "surrogateescape"), max_bytes)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _private_repo(source: Path, work: Path) -> _Git:
    """A bare repository of our own whose object store borrows the source's (read only) as alternates."""
    env = git_environment()
    common = run_git(
        [*git_dir_args(source), "rev-parse", "--path-format=absolute", "--git-common-dir"],
        env=env, what="finding the repository", timeout=LOCAL_TIMEOUT,
    ).stdout.decode("utf-8", "surrogateescape").rstrip("\n")  # fmt: skip
    objects = Path(common) / "objects"
    if "\n" in str(objects) or not objects.is_dir():
        raise RepoError(f"the repository {source} has no usable object folder")
    private = work / "evidence.git"
    run_git(["init", "--quiet", "--bare", "--template=", str(private)], env=env, what="git init", timeout=LOCAL_TIMEOUT)
    (private / "objects" / "info").mkdir(parents=True, exist_ok=True)
    (private / "objects" / "info" / "alternates").write_text(f"{objects}\n", encoding="utf-8")
    env.update(GIT_INDEX_FILE=str(work / "evidence.index"), GIT_LITERAL_PATHSPECS="1")
    return _Git(private, env)


@dataclass(frozen=True)
class _Git:
    """Git calls against the private repository, each with the isolated environment and its private index."""

    repo: Path
    env: dict[str, str]

    def __call__(self, *args: str, what: str, stdin: bytes | None = None, check: bool = True) -> bytes:
        done = run_git(
            [f"--git-dir={self.repo}", *args], env=self.env, what=what, timeout=LOCAL_TIMEOUT, stdin=stdin, check=check
        )
        return done.stdout

    def applies(self, patch: bytes) -> str | None:
        """None once git has applied `patch` to the index; else git's complaint."""
        done = run_git(
            [f"--git-dir={self.repo}", "apply", "--cached", "--binary", "--whitespace=nowarn", "-"],
            env=self.env, what="git apply", timeout=LOCAL_TIMEOUT, stdin=patch, check=False,
        )  # fmt: skip
        if done.returncode == 0:
            return None
        return done.stderr.decode("utf-8", "replace").strip()[:1000] or f"git apply exited {done.returncode}"

    def bounded(self, args: tuple[str, ...], limit: int) -> bytes | None:
        """`git <args>`'s output, or None as soon as it passes `limit` bytes (git is stopped there)."""
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(
                ["git", f"--git-dir={self.repo}", *args],
                env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=errors,
            )  # fmt: skip
            assert proc.stdout is not None
            data = proc.stdout.read(limit + 1)
            if len(data) > limit:
                proc.kill()
            proc.stdout.close()
            code = proc.wait(LOCAL_TIMEOUT)
            if len(data) > limit:
                return None
            if code != 0:
                errors.seek(0)
                raise RepoError(f"git {args[0]} failed: {errors.read(500).decode('utf-8', 'replace').strip()}")
            return data


def _evidence(git: _Git, base: str, patch: bytes, max_bytes: int) -> PatchEvidence:
    git("read-tree", base, what="git read-tree")
    problem = git.applies(patch)
    if problem is not None:
        raise PatchRefused(f"git cannot apply the patch to the base commit: {problem}")
    tree = git("write-tree", what="git write-tree").decode().strip()
    regenerated = git.bounded((*_REGENERATE, base, tree), max_bytes)
    if regenerated is None:
        raise PatchRefused(f"the patch as git stores it is larger than {max_bytes} bytes (FROGFIX_MAX_PATCH_BYTES)")
    files = _changed_files(git, base, tree)
    ci = ci_paths(_reader(git, base), "base") + ci_paths(_reader(git, tree), "patched")
    return PatchEvidence(base, tree, regenerated.decode("utf-8", "surrogateescape"), files, ci)


def _changed_files(git: _Git, base: str, tree: str) -> tuple[ChangedFile, ...]:
    """Each changed path from `diff-tree -z --raw` and `--numstat`, with sizes and link targets from the blobs."""
    raw = git("diff-tree", "-r", "-z", "--raw", "--no-renames", base, tree, what="git diff-tree").split(b"\0")
    numstat = git("diff-tree", "-r", "-z", "--numstat", "--no-renames", base, tree, what="git diff-tree")
    counts = {}
    for record in numstat.split(b"\0"):
        added, _, rest = record.partition(b"\t")
        removed, _, path = rest.partition(b"\t")
        if path:
            counts[path] = (added, removed)
    files = []
    for meta, path in zip(raw[0::2], raw[1::2], strict=False):
        if not meta.startswith(b":"):
            continue
        old_mode, new_mode, _, new_blob, status = meta[1:].decode().split(" ")
        added, removed = counts.get(path, (b"0", b"0"))
        binary = added == b"-"
        deleted = status == "D"
        files.append(
            ChangedFile(
                path=path.decode("utf-8", "surrogateescape"),
                status=_STATUS.get(status[:1], "modified"),
                old_mode=old_mode,
                new_mode=new_mode,
                added=0 if binary else int(added),
                removed=0 if binary else int(removed),
                binary=binary,
                size=0 if deleted or new_mode == "160000" else _size(git, new_blob),
                link_target=_link_target(git, new_blob) if new_mode == "120000" else None,
            )
        )
    return tuple(files)


def _size(git: _Git, blob: str) -> int:
    return int(git("cat-file", "-s", blob, what="git cat-file"))


def _link_target(git: _Git, blob: str) -> str:
    """A symlink's target exactly as git stores it (every byte, `\\r` and newlines included)."""
    if _size(git, blob) > MAX_LINK_TARGET_BYTES:
        return f"/(a target longer than {MAX_LINK_TARGET_BYTES} bytes)"  # absolute, so the rules refuse it
    return git("cat-file", "blob", blob, what="git cat-file").decode("utf-8", "surrogateescape")


def _reader(git: _Git, treeish: str) -> Callable[[str], bytes | None]:
    """Reads a regular file of `treeish` (bounded), for the CI file's local includes; see `ci_paths`."""

    def read(path: str) -> bytes | None:
        listed = git("ls-tree", "-z", "--full-tree", treeish, "--", path, what="git ls-tree")
        meta, _, name = listed.rstrip(b"\0").partition(b"\t")
        parts = meta.split(b" ")
        if name != path.encode("utf-8", "surrogateescape") or len(parts) != 3:
            return None
        if parts[0] not in (b"100644", b"100755"):
            raise CiUnreadable("not a regular file")
        if _size(git, parts[2].decode()) > MAX_CI_FILE_BYTES:
            raise CiUnreadable(f"larger than {MAX_CI_FILE_BYTES} bytes")
        return git("cat-file", "blob", parts[2].decode(), what="git cat-file")

    return read
