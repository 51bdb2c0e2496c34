"""A model double that applies a task's upstream fix through the Leaf tools.

It writes each file fix.patch changes, whole, with one `Write` call per file (absolute paths in
the sandbox's workspace), then gives a final answer: the agent side of a real run is then
known-good, so a realrepos test judges only what FrogFix does around it (environment, tests,
evidence, secrets). The new contents come from `git apply` of the real patch, never from a copy.
"""

from __future__ import annotations

import re
import subprocess
import tarfile
import tempfile
from functools import cache
from pathlib import Path, PurePosixPath

from tests.doubles.openai_server import Reply, ScriptedOpenAIServer, assistant, tool_call
from tests.realrepos import Task

WORKSPACE = PurePosixPath("/workspace")  # where both sandboxes mount the repository (sandbox/local.py MOUNT_POINT)
DIFF_HEADER = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.M)
UNSUPPORTED = re.compile(r"^(deleted file mode|rename from|copy from|old mode|new mode|GIT binary patch|Binary files)",
                         re.M)


def changed_paths(patch: str) -> list[str]:
    """The files a patch touches, in patch order; refuses what `Write` cannot reproduce."""
    if found := UNSUPPORTED.search(patch):
        raise ValueError(f"fix.patch has {found.group(1)!r}: the Write-only double cannot apply it")
    paths = []
    for old, new in DIFF_HEADER.findall(patch):
        if old != new:
            raise ValueError(f"fix.patch renames {old} to {new}: the Write-only double cannot apply it")
        paths.append(new)
    return paths


@cache
def fixed_files(task: Task) -> dict[str, str]:
    """Each changed file's full text after the upstream fix, by relative path.

    Only those files are taken out of the base tarball (rich's is 15 MB), then `git apply` runs
    on them outside any repository, as `patch` would.
    """
    patch = task.fix_patch.read_text()
    paths = changed_paths(patch)
    with tempfile.TemporaryDirectory(prefix="frogfix-fix-double-") as tmp:
        root = Path(tmp)
        with tarfile.open(task.folder / "base.tar.gz") as archive:
            names = set(archive.getnames())
            archive.extractall(root, members=[archive.getmember(p) for p in paths if p in names], filter="data")
        subprocess.run(["git", "apply", "--whitespace=nowarn", str(task.fix_patch)], cwd=root, check=True,
                       capture_output=True, text=True)
        files: dict[str, str] = {}
        for path in paths:
            data = (root / path).read_bytes()
            try:
                files[path] = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path} after the fix is not UTF-8 text: Write cannot carry it") from exc
        return files


def fixing_script(task: Task, workspace: PurePosixPath = WORKSPACE) -> list[Reply]:
    """One Write reply per changed file, then the final answer (so `usage.calls` = files + 1)."""
    replies = [
        assistant(None, reasoning=f"Apply the upstream change to {path}.",
                  tool_calls=[tool_call("Write", {"file_path": str(workspace / path), "content": content})])
        for path, content in fixed_files(task).items()
    ]
    replies.append(assistant(f"Applied the upstream fix ({task.data['fix'][:12]}): {task.data['fix_subject']}."))
    return replies


def no_patch_script() -> list[Reply]:
    """A final answer at once: a run whose cost is FrogFix's own (environment and base tests)."""
    return [assistant("I could not find the bug.")]


def fix_double(task: Task) -> ScriptedOpenAIServer:
    """The scripted server for `task`, not started (use it as a context manager)."""
    return ScriptedOpenAIServer(fixing_script(task), model="scripted")
