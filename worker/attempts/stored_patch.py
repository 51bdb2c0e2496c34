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

The patch text is bounded, but what git inflates it to is not (a `GIT binary patch` literal of
compressible text grows ~1000-fold, and git's diff of the result needs ~20 times that in memory),
and this git runs in the worker, beside the database, with no sandbox wall. So before any diff,
the new blobs' sizes are read (`diff-tree --raw`, `cat-file --batch-check`, which read no content)
and refused when one is larger than the sandbox could have written or they grow absurdly; and
every git call here runs under a memory bound of its own (`EvidenceLimits`, `EVIDENCE_MEMORY_BYTES`).

What is read per file is read in batches (one `cat-file --batch` for every symlink target), so the
number of git processes does not grow with the patch: 4,000 links once cost two processes each.
A patch of more than `EvidenceLimits.max_files` files is refused before anything is read per file.
When the patch touches a symlink, every symlink of the base and the patched tree is read too, so the
review rules can resolve a link through the others (a chain of inward-looking links can lead out).
Both trees' build code (worker/environment/build_code.py: setup.py and what it imports, an in-tree
backend, build hooks) is found from one `ls-tree -r` per tree and one `cat-file --batch` process
that both trees' reads share, so a patch rewriting it is flagged like a dependency file.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from app.patches import shown_path
from sandbox.base import SandboxLimits
from worker.attempts.ci_config import MAX_CI_FILE_BYTES, CiPaths, CiUnreadable, ci_paths
from worker.environment.build_code import build_code_paths
from worker.environment.declared import MAX_DECLARATION_BYTES, is_dependency_file
from worker.git.gitcalls import (
    LOCAL_TIMEOUT,
    RepoError,
    check_sha,
    git_argv,
    git_dir_args,
    git_environment,
    reading_lock,
    run_git,
)

MAX_LINK_TARGET_BYTES = 4096  # PATH_MAX: a longer "symlink" is no symlink any system makes
# What a target longer than that reads as: absolute, so the review rules refuse a link to it.
LONG_LINK_TARGET = f"/(a target longer than {MAX_LINK_TARGET_BYTES} bytes)"
# No person reviews more files than this in one MR; the evidence reads each file, so it is refused first.
MAX_PATCH_FILES = 5_000
_LINK_MODE = "120000"
_FILE_MODES = ("100644", "100755")
_REGENERATE = (
    "diff", "--binary", "--full-index", "--no-renames", "--no-ext-diff", "--no-textconv", "--no-color",
    "--src-prefix=a/", "--dst-prefix=b/",
)  # fmt: skip
_STATUS = {"A": "added", "D": "deleted", "M": "modified", "T": "type changed"}
# A text change grows the files by at most its own size (every added byte is in it); deflate and
# binary deltas do better, but nothing a person would review grows more than this many times.
MAX_INFLATION = 64
MIN_GROWTH_BOUND = 1024 * 1024  # below this, growth is never called absurd (small binary files)
# git maps pack files in windows of up to 1 GiB; smaller ones fit under the memory bound.
_MAP_CONFIG = (("core.packedGitWindowSize", "32m"), ("core.packedGitLimit", "256m"))
_DEFAULT_SANDBOX = SandboxLimits()
# The evidence's own memory bound per git call (prlimit --as), never above the sandbox's memory. Why not
# the sandbox's 4 GiB: this git runs in the worker, whose pod has 2 GiB and runs several jobs, so 4 GiB a
# call is no wall there. A patch of at most FROGFIX_MAX_PATCH_BYTES whose growth is capped at 64x before
# any diff (`_refuse_inflated`), with pack windows of 32m/256m, needs far less than this.
EVIDENCE_MEMORY_BYTES = 1024**3


@dataclass(frozen=True)
class EvidenceLimits:
    """What git may make of a patch in the worker: the job's own bounds, so nothing here is looser."""

    max_patch_bytes: int = 1024 * 1024  # git's regeneration (FROGFIX_MAX_PATCH_BYTES)
    max_file_bytes: int = _DEFAULT_SANDBOX.file_size_bytes  # the sandbox's per-file limit: no file it wrote is larger
    # address space of each git call (prlimit --as)
    max_memory_bytes: int = min(_DEFAULT_SANDBOX.memory_bytes, EVIDENCE_MEMORY_BYTES)
    max_files: int = MAX_PATCH_FILES  # files one patch may change (a move counts twice)

    @classmethod
    def for_job(cls, max_patch_bytes: int, sandbox: SandboxLimits) -> EvidenceLimits:
        """The job sandbox's per-file limit, and the smaller of its memory and EVIDENCE_MEMORY_BYTES."""
        memory = min(sandbox.memory_bytes, EVIDENCE_MEMORY_BYTES)
        return cls(max_patch_bytes, sandbox.file_size_bytes, memory)


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
        return self.new_mode == _LINK_MODE

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
    # Every symlink (path, target) of the patched and of the base tree, read only when the patch
    # touches a symlink: a link is judged by where it leads through all the others.
    links: tuple[tuple[str, str], ...] = ()
    base_links: tuple[tuple[str, str], ...] = ()
    # The build code of the base and of the patched tree (worker/environment/build_code.py), one union:
    # the files the project's install runs, flagged by review_flags like a dependency file.
    build_code: tuple[str, ...] = ()

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    def diffstat(self) -> list[tuple[str, int, int]]:
        """(path, lines added, lines removed) per file, for the MR's file table."""
        return [(f.path, f.added, f.removed) for f in self.files]


def take_evidence(source: Path, base: str, patch: str, scratch: Path, *, limits: EvidenceLimits) -> PatchEvidence:
    """Apply `patch` to `base` of `source` (a mirror or a checkout) with git, privately; see the module.

    Raises PatchRefused when git cannot apply it (with git's reason), when what it stores is over
    `limits`, or when git's regeneration is larger than `limits.max_patch_bytes`; RepoError when
    git itself fails. `scratch` is removed after.
    """
    check_sha(base)
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="evidence-", dir=scratch))
    try:
        repo = _private_repo(Path(source), work, limits.max_memory_bytes)
        with reading_lock(Path(source)):
            return _evidence(repo, base, patch.encode("utf-8", "surrogateescape"), limits)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _private_repo(source: Path, work: Path, max_memory: int) -> _Git:
    """A bare repository of our own whose object store borrows the source's (read only) as alternates."""
    env = git_environment(_MAP_CONFIG)
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
    return _Git(private, env, max_memory)


@dataclass(frozen=True)
class _Git:
    """Git calls against the private repository: the isolated environment, its private index, the memory bound."""

    repo: Path
    env: dict[str, str]
    max_memory: int

    def __call__(self, *args: str, what: str, stdin: bytes | None = None, check: bool = True) -> bytes:
        done = run_git(
            [f"--git-dir={self.repo}", *args],
            env=self.env, what=what, timeout=LOCAL_TIMEOUT, stdin=stdin, check=check, max_memory=self.max_memory,
        )  # fmt: skip
        return done.stdout

    def applies(self, patch: bytes) -> str | None:
        """None once git has applied `patch` to the index; else git's complaint."""
        done = run_git(
            [f"--git-dir={self.repo}", "apply", "--cached", "--binary", "--whitespace=nowarn", "-"],
            env=self.env, what="git apply", timeout=LOCAL_TIMEOUT, stdin=patch, check=False,
            max_memory=self.max_memory,
        )  # fmt: skip
        if done.returncode == 0:
            return None
        return done.stderr.decode("utf-8", "replace").strip()[:1000] or f"git apply exited {done.returncode}"

    def bounded(self, args: tuple[str, ...], limit: int) -> bytes | None:
        """`git <args>`'s output, or None as soon as it passes `limit` bytes (git is stopped there)."""
        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(
                git_argv([f"--git-dir={self.repo}", *args], self.max_memory),
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


def _evidence(git: _Git, base: str, patch: bytes, limits: EvidenceLimits) -> PatchEvidence:
    git("read-tree", base, what="git read-tree")
    problem = git.applies(patch)
    if problem is not None:
        raise PatchRefused(f"git cannot apply the patch to the base commit: {problem}")
    tree = git("write-tree", what="git write-tree").decode().strip()
    changes = _raw_changes(git, base, tree)
    if len(changes) > limits.max_files:
        raise PatchRefused(
            f"the patch changes {len(changes)} files, more than {limits.max_files}: too many to review in one MR"
        )
    sizes = _blob_sizes(git, changes)
    _refuse_inflated(changes, sizes, len(patch), limits)
    max_bytes = limits.max_patch_bytes
    regenerated = git.bounded((*_REGENERATE, base, tree), max_bytes)
    if regenerated is None:
        raise PatchRefused(f"the patch as git stores it is larger than {max_bytes} bytes (FROGFIX_MAX_PATCH_BYTES)")
    touches_links = any(_LINK_MODE in (c.old_mode, c.new_mode) for c in changes)
    base_entries, entries = _tree_entries(git, base), _tree_entries(git, tree)
    base_links, links = (_links(base_entries), _links(entries)) if touches_links else ([], [])
    targets = _link_targets(git, {blob for _, blob in base_links + links})  # the changed links' among them
    files = _changed_files(git, base, tree, changes, sizes, targets)
    ci = ci_paths(_reader(git, base), "base") + ci_paths(_reader(git, tree), "patched")
    return PatchEvidence(
        base, tree, regenerated.decode("utf-8", "surrogateescape"), files, ci,
        links=tuple((path, targets[blob]) for path, blob in links),
        base_links=tuple((path, targets[blob]) for path, blob in base_links),
        build_code=_build_code(git, (base_entries, entries)),
    )  # fmt: skip


@dataclass(frozen=True)
class _Raw:
    """One record of `diff-tree -r -z --raw`: git's own account of a changed path, no content read."""

    old_mode: str
    new_mode: str
    old_blob: str
    new_blob: str
    status: str
    path: bytes


def _raw_changes(git: _Git, base: str, tree: str) -> list[_Raw]:
    raw = git("diff-tree", "-r", "-z", "--raw", "--no-renames", base, tree, what="git diff-tree").split(b"\0")
    changes = []
    for meta, path in zip(raw[0::2], raw[1::2], strict=False):
        if meta.startswith(b":"):
            old_mode, new_mode, old_blob, new_blob, status = meta[1:].decode().split(" ")
            changes.append(_Raw(old_mode, new_mode, old_blob, new_blob, status, path))
    return changes


def _is_blob(mode: str) -> bool:
    return mode not in ("000000", "160000")  # no file on that side, or a submodule's commit


def _blob_sizes(git: _Git, changes: list[_Raw]) -> dict[str, int]:
    """Both sides' blob sizes (see `_sizes`)."""
    return _sizes(
        git,
        {c.old_blob for c in changes if _is_blob(c.old_mode)} | {c.new_blob for c in changes if _is_blob(c.new_mode)},
    )


def _sizes(git: _Git, objects: set[str]) -> dict[str, int]:
    """Objects' sizes from one `cat-file --batch-check`, which reads each object's header, not its content."""
    blobs = sorted(objects)
    if not blobs:
        return {}
    batch = "--batch-check=%(objectname) %(objectsize)"
    out = git("cat-file", batch, what="git cat-file", stdin="\n".join(blobs).encode() + b"\n")
    sizes = {}
    for line in out.decode().splitlines():
        name, _, size = line.partition(" ")
        if not size.isdigit():
            raise RepoError(f"git cat-file cannot size {name[:80]!r}: {size[:80]!r}")
        sizes[name] = int(size)
    return sizes


def _refuse_inflated(changes: list[_Raw], sizes: dict[str, int], patch_bytes: int, limits: EvidenceLimits) -> None:
    """PatchRefused when a file git stored is larger than the sandbox could write, or the files grow
    absurdly for the patch's size: decided from object headers, before any diff reads content."""
    growth = 0
    for change in changes:
        new_size = sizes.get(change.new_blob, 0) if _is_blob(change.new_mode) else 0
        if new_size > limits.max_file_bytes:
            shown = shown_path(change.path.decode("utf-8", "surrogateescape"))
            raise PatchRefused(
                f"git would store {shown} as {new_size} bytes, more than the sandbox's limit of"
                f" {limits.max_file_bytes} bytes per file: the sandbox cannot have written it"
            )
        growth += max(0, new_size - (sizes.get(change.old_blob, 0) if _is_blob(change.old_mode) else 0))
    bound = max(MIN_GROWTH_BOUND, MAX_INFLATION * patch_bytes)
    if growth > bound:
        raise PatchRefused(
            f"the patch ({patch_bytes} bytes) grows the files by {growth} bytes once git inflates it,"
            f" more than {MAX_INFLATION} times its size: refused before git diffs it"
        )


def _changed_files(
    git: _Git, base: str, tree: str, changes: list[_Raw], sizes: dict[str, int], targets: dict[str, str]
) -> tuple[ChangedFile, ...]:
    """Each changed path from `diff-tree --raw` and `--numstat`, with sizes and link targets (`targets`, by blob)."""
    numstat = git("diff-tree", "-r", "-z", "--numstat", "--no-renames", base, tree, what="git diff-tree")
    counts = {}
    for record in numstat.split(b"\0"):
        added, _, rest = record.partition(b"\t")
        removed, _, path = rest.partition(b"\t")
        if path:
            counts[path] = (added, removed)
    files = []
    for change in changes:
        added, removed = counts.get(change.path, (b"0", b"0"))
        binary = added == b"-"
        files.append(
            ChangedFile(
                path=change.path.decode("utf-8", "surrogateescape"),
                status=_STATUS.get(change.status[:1], "modified"),
                old_mode=change.old_mode,
                new_mode=change.new_mode,
                added=0 if binary else int(added),
                removed=0 if binary else int(removed),
                binary=binary,
                size=sizes.get(change.new_blob, 0) if _is_blob(change.new_mode) else 0,
                link_target=targets[change.new_blob] if change.new_mode == _LINK_MODE else None,
            )
        )
    return tuple(files)


def _size(git: _Git, blob: str) -> int:
    return int(git("cat-file", "-s", blob, what="git cat-file"))


def _tree_entries(git: _Git, treeish: str) -> dict[str, tuple[str, str]]:
    """Every file of `treeish` as path -> (mode, blob), from one `ls-tree -r` (no content read)."""
    entries = {}
    for entry in git("ls-tree", "-r", "-z", "--full-tree", treeish, what="git ls-tree").split(b"\0"):
        meta, _, path = entry.partition(b"\t")
        mode, _, rest = meta.partition(b" ")
        if path:
            entries[path.decode("utf-8", "surrogateescape")] = (mode.decode(), rest.rpartition(b" ")[2].decode())
    return entries


def _links(entries: dict[str, tuple[str, str]]) -> list[tuple[str, str]]:
    """Every symlink of a tree (`_tree_entries`) as (path, blob)."""
    return [(path, blob) for path, (mode, blob) in entries.items() if mode == _LINK_MODE]


def _build_code(git: _Git, trees: tuple[dict[str, tuple[str, str]], ...]) -> tuple[str, ...]:
    """The union of the trees' build code (`build_code_paths`), each blob read from one shared `cat-file --batch`.

    Only regular files are read (a symlink, a submodule or a folder reads as absent), each up to
    MAX_DECLARATION_BYTES, as `read_from_folder` reads a checkout.
    """
    found: set[str] = set()
    with _Blobs(git) as blobs:
        for entries in trees:

            def read(path: str, entries: dict[str, tuple[str, str]] = entries) -> str | None:
                mode, blob = entries.get(path, ("", ""))
                return blobs.text(blob) if mode in _FILE_MODES else None

            requirements = [path for path in entries if path.endswith(".txt") and is_dependency_file(path)]
            found.update(build_code_paths(read, requirements))
    return tuple(sorted(found))


class _Blobs:
    """Blobs' text through one `git cat-file --batch`, started at the first read and killed past LOCAL_TIMEOUT."""

    def __init__(self, git: _Git) -> None:
        self._git = git
        self._proc: subprocess.Popen[bytes] | None = None
        self._timer: threading.Timer | None = None

    def __enter__(self) -> _Blobs:
        return self

    def __exit__(self, *exc: object) -> None:
        proc = self._proc
        if proc is None:
            return
        assert proc.stdin is not None and proc.stdout is not None
        with contextlib.suppress(OSError):  # git stopped already: its exit code says why
            proc.stdin.close()
        proc.stdout.close()
        code = proc.wait()
        assert self._timer is not None
        self._timer.cancel()
        if code != 0 and exc == (None, None, None):
            raise RepoError(f"git cat-file --batch exited {code} reading the build code")

    def text(self, blob: str) -> str | None:
        """The blob's text (UTF-8, undecodable bytes replaced); None when larger than MAX_DECLARATION_BYTES."""
        proc = self._start()
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(blob.encode() + b"\n")
            proc.stdin.flush()
        except OSError as exc:
            raise RepoError(f"git cat-file stopped reading the build code: {exc}") from None
        header = proc.stdout.readline().decode("utf-8", "replace")
        if not header:
            raise RepoError(f"git cat-file stopped reading the build code (failed, or ran past {LOCAL_TIMEOUT:.0f}s)")
        name, kind, size = [*header.split(), "", "", ""][:3]
        if name != blob or kind != "blob" or not size.isdigit():
            raise RepoError(f"git cat-file cannot read {blob[:80]!r}: {header.strip()[:80]!r}")
        kept, left = int(size) <= MAX_DECLARATION_BYTES, int(size) + 1  # the content, then a newline
        data = b""
        while left:  # a larger blob is read past in bounded pieces, never held
            piece = proc.stdout.read(left if kept else min(left, 1 << 20))
            if not piece:
                raise RepoError(f"git cat-file stopped in the middle of {blob[:80]!r}")
            data, left = (data + piece if kept else b""), left - len(piece)
        return data[:-1].decode("utf-8", "replace") if kept else None

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            git = self._git
            self._proc = subprocess.Popen(
                git_argv([f"--git-dir={git.repo}", "cat-file", "--batch"], git.max_memory),
                env=git.env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            self._timer = threading.Timer(LOCAL_TIMEOUT, self._proc.kill)
            self._timer.daemon = True
            self._timer.start()
        return self._proc


def _link_targets(git: _Git, blobs: set[str]) -> dict[str, str]:
    """Each symlink blob's target exactly as git stores it (every byte, `\\r` and newlines included).

    Two git processes for any number of links (`--batch-check` for the sizes, then `--batch` for
    those no longer than MAX_LINK_TARGET_BYTES); a longer one reads as LONG_LINK_TARGET.
    """
    sizes = _sizes(git, blobs)
    targets = {blob: LONG_LINK_TARGET for blob, size in sizes.items() if size > MAX_LINK_TARGET_BYTES}
    wanted = sorted(blob for blob, size in sizes.items() if size <= MAX_LINK_TARGET_BYTES)
    if not wanted:
        return targets
    out = git("cat-file", "--batch", what="git cat-file", stdin="\n".join(wanted).encode() + b"\n")
    at = 0
    for blob in wanted:  # each answer: "<name> <type> <size>\n<content>\n", in the order asked
        end = out.find(b"\n", at)
        header = out[at:end].decode("utf-8", "replace") if end >= 0 else ""
        name, _, rest = header.partition(" ")
        kind, _, size = rest.partition(" ")
        if name != blob or kind != "blob" or not size.isdigit():
            raise RepoError(f"git cat-file cannot read the symlink {blob[:80]!r}: {header[:80]!r}")
        start = end + 1
        targets[blob] = out[start : start + int(size)].decode("utf-8", "surrogateescape")
        at = start + int(size) + 1
    return targets


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
