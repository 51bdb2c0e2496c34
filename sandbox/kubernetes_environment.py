"""Test environments across pods: a setup pod's ENV_DIR streamed to the host, and the host's copy into job pods.

Why it is its own module: what comes out of a setup pod was written by the repository's own
build code, so it is read as hostile. `receive_environment` takes files, folders and symbolic
links only (a venv's `bin/python` is an absolute link to the image's interpreter, so link
targets are kept), refuses any name that would land outside the destination (also through a
link extracted earlier), hard links, devices and set-id bits, and stops at the size the setup
phase was given. The job pods' copy goes in with the workspace (sandbox/kubernetes.py).
"""

from __future__ import annotations

import os
import stat
import tarfile
from typing import BinaryIO

from sandbox.base import ENV_DIR, GENERATED_DIR, SandboxError

ENVIRONMENT_VOLUME = "environment"
GENERATED_IN_ENV = os.path.relpath(GENERATED_DIR, ENV_DIR)
ARCHIVE_TOP = "env"

# Runs inside the setup pod (stdlib): ENV_DIR (argv[1]) as one tar stream on stdout, links kept as links.
PACK = (
    "import sys, tarfile\n"
    "with tarfile.open(fileobj=sys.stdout.buffer, mode='w|', format=tarfile.PAX_FORMAT) as archive:\n"
    f"    archive.add(sys.argv[1], arcname={ARCHIVE_TOP!r})\n"
)


class EnvironmentRefused(SandboxError):
    """What the setup pod sent is not an environment FrogFix will keep."""


def receive_environment(source: BinaryIO, dest: str, limit_bytes: int) -> int:
    """Extract the setup pod's tar stream into `dest` (an empty folder); returns the member count."""
    total = count = 0
    uid, gid = os.getuid(), os.getgid()
    with tarfile.open(fileobj=source, mode="r|") as archive:
        for member in archive:
            top, _, rest = member.name.partition("/")
            if top != ARCHIVE_TOP:
                raise EnvironmentRefused(f"the environment stream holds {member.name!r}, outside {ARCHIVE_TOP}/")
            if not rest:
                continue
            if not (member.isfile() or member.isdir() or member.issym()):
                kind = "a hard link" if member.islnk() else "a device or special file"
                raise EnvironmentRefused(f"the built environment holds {kind} ({rest!r}): not kept")
            total += member.size
            if total > limit_bytes:
                raise EnvironmentRefused(
                    f"the built environment is larger than FROGFIX_ENVIRONMENT_SIZE ({limit_bytes} bytes)"
                )
            member.name, member.uid, member.gid, member.uname, member.gname = rest, uid, gid, "", ""
            try:
                archive.extract(member, dest, filter="tar")
            except tarfile.FilterError as exc:
                raise EnvironmentRefused(f"the built environment is refused: {exc}") from None
            count += 1
    return count


def folder_bytes(folder: str) -> int:
    """Bytes of the regular files under `folder` (links not followed)."""
    total = 0
    for path, _, names in os.walk(folder):
        for name in names:
            st = os.lstat(os.path.join(path, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total
