"""What a setup sandbox built, brought to the host: streamed out of a pod, read from a local sandbox's root.

Why it is its own module: what comes out of a setup sandbox was written by build code (the
project's own install, a package's build; a pod may run the repository's own image), so it is
read as hostile, by both backends the same way (locally PACK runs on the host over
/proc/<pid>/root/<folder> of the sandbox, once every process of the build is gone).
Not as a tar: tarfile's extraction filters have had bypasses, and its headers (PAX, long names)
are read whole into memory. The stream is FrogFix's own, one JSON header line per entry, the
file's bytes after it, and `receive_environment` builds the tree itself:
- only folders, regular files and symbolic links (a venv's `bin/python` is an absolute link to
  the image's interpreter, so link targets are kept as they are and never followed here);
- an entry's parent must be a folder this stream created, so no path passes through a link;
  files are created with O_EXCL|O_NOFOLLOW, folders and links fail if the name exists;
- at most FROGFIX_ENVIRONMENT_SIZE bytes (each entry counts HEADER_COST more), MAX_ENTRIES
  entries, MAX_HEADER bytes a header; any error refuses the whole environment.
The job pods' copy goes in with the workspace as a tar (the host's trusted tree; sandbox/kubernetes.py).
"""

from __future__ import annotations

import json
import os
import stat
from typing import Any, Protocol

from sandbox.base import SandboxError

ENVIRONMENT_VOLUME = "environment"
MAX_HEADER = 16 * 1024
MAX_ENTRIES = 500_000
MAX_NAME = 4096
HEADER_COST = 512
CHUNK = 1024 * 1024

# Stdlib, run inside a setup pod, or on the host over a local sandbox's /proc/<pid>/root/<folder>
# (argv[1]): that folder as the stream above, on stdout, then the end mark. It walks by descriptors:
# each folder and file is opened relative to its parent's descriptor with O_NOFOLLOW, so no path is
# ever resolved again by name (on the host, an absolute link met by name would lead into the host's
# own root, and a folder swapped for a link mid-walk fails the walk instead of being followed).
PACK = r"""
import json, os, stat, sys
root, out = sys.argv[1], sys.stdout.buffer
FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
def emit(header):
    out.write(json.dumps(header).encode() + b"\n")
def walk(folder, rel):
    for name in sorted(os.listdir(folder)):
        path = name if rel == "." else rel + "/" + name
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            emit({"p": path, "t": "l", "to": os.readlink(name, dir_fd=folder)})
        elif stat.S_ISDIR(st.st_mode):
            inner = os.open(name, FLAGS | os.O_DIRECTORY, dir_fd=folder)
            try:
                emit({"p": path, "t": "d"})
                walk(inner, path)
            finally:
                os.close(inner)
        elif stat.S_ISREG(st.st_mode):
            with os.fdopen(os.open(name, FLAGS, dir_fd=folder), "rb") as source:
                st = os.fstat(source.fileno())
                if not stat.S_ISREG(st.st_mode):
                    continue
                size = st.st_size
                emit({"p": path, "t": "f", "x": bool(st.st_mode & 0o100), "n": size})
                while size > 0:
                    chunk = source.read(min(size, 1 << 20)) or bytes(min(size, 1 << 20))
                    out.write(chunk)
                    size -= len(chunk)
top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
walk(top, ".")
emit({"end": True})
out.flush()
"""


class EnvironmentRefused(SandboxError):
    """What the setup pod sent is not an environment FrogFix will keep."""


class Source(Protocol):
    def read(self, size: int = -1) -> bytes: ...


class _Reader:
    """Lines and exact byte counts over a `read(size)` source, never holding more than a chunk."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self.buffer = bytearray()

    def line(self) -> bytes:
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_HEADER:
                raise EnvironmentRefused(f"an entry header is longer than {MAX_HEADER} bytes")
            chunk = self.source.read(MAX_HEADER)
            if not chunk:
                raise EnvironmentRefused("the environment stream ended early")
            self.buffer += chunk
        index = self.buffer.index(b"\n")
        if index > MAX_HEADER:
            raise EnvironmentRefused(f"an entry header is longer than {MAX_HEADER} bytes")
        line = bytes(self.buffer[:index])
        del self.buffer[: index + 1]
        return line

    def copy(self, size: int, fd: int) -> None:
        while size > 0:
            if not self.buffer:
                chunk = self.source.read(min(size, CHUNK))
                if not chunk:
                    raise EnvironmentRefused("the environment stream ended inside a file")
                self.buffer += chunk
            take = min(size, len(self.buffer))
            view = memoryview(self.buffer)[:take]
            written = 0
            while written < take:
                written += os.write(fd, view[written:])
            view.release()
            del self.buffer[:take]
            size -= take

    def rest(self, limit: int) -> int:
        """Bytes after the end mark (read and dropped, up to `limit` + one chunk)."""
        extra = len(self.buffer)
        self.buffer.clear()
        while extra <= limit:
            chunk = self.source.read(CHUNK)
            if not chunk:
                break
            extra += len(chunk)
        return extra


def receive_environment(source: Source, dest: str, limit_bytes: int) -> int:
    """Build the setup pod's stream into `dest` (an empty folder); returns the entry count."""
    try:
        return _receive(_Reader(source), dest, limit_bytes)
    except EnvironmentRefused:
        raise
    except (OSError, ValueError, TypeError, KeyError, OverflowError, RecursionError) as exc:
        raise EnvironmentRefused(f"the built environment is refused: {type(exc).__name__}: {exc}") from None


def _receive(reader: _Reader, dest: str, limit_bytes: int) -> int:
    folders = {""}  # what this stream created: the only parents an entry may have
    total = count = 0
    while True:
        header = json.loads(reader.line())
        if not isinstance(header, dict):
            raise EnvironmentRefused("an entry header is not an object")
        if header.get("end") is True:
            break
        path = _relative(header.get("p"))
        parent = os.path.dirname(path)
        if parent not in folders:
            raise EnvironmentRefused(f"{path!r}: its parent is not a folder of the environment")
        kind, size = header.get("t"), header.get("n", 0) if header.get("t") == "f" else 0
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise EnvironmentRefused(f"{path!r}: a bad size")
        count += 1
        total += HEADER_COST + size
        if count > MAX_ENTRIES:
            raise EnvironmentRefused(f"the built environment has more than {MAX_ENTRIES} entries")
        if total > limit_bytes:
            raise EnvironmentRefused(f"the built environment is over FROGFIX_ENVIRONMENT_SIZE ({limit_bytes} bytes)")
        full = os.path.join(dest, path)
        if kind == "d":
            os.mkdir(full, 0o755)
            folders.add(path)
        elif kind == "l":
            target = header.get("to")
            if not isinstance(target, str) or not target or "\0" in target or len(target) > MAX_NAME:
                raise EnvironmentRefused(f"{path!r}: a bad link target")
            os.symlink(target, full)
        elif kind == "f":
            mode = 0o755 if header.get("x") is True else 0o644
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
            try:
                reader.copy(size, fd)
            finally:
                os.close(fd)
        else:
            raise EnvironmentRefused(f"{path!r}: an entry of kind {kind!r} (folders, files and links only)")
    if reader.rest(0):
        raise EnvironmentRefused("the setup pod sent more after the environment's end")
    return count


def _relative(value: Any) -> str:
    """A plain relative path: no empty, `.` or `..` part, no NUL, not absolute."""
    if not isinstance(value, str) or not value or "\0" in value or len(value) > MAX_NAME or value.startswith("/"):
        raise EnvironmentRefused(f"a bad entry name {str(value)[:200]!r}")
    parts = value.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise EnvironmentRefused(f"a bad entry name {value[:200]!r}")
    return value


def folder_bytes(folder: str) -> int:
    """Bytes of the regular files under `folder` (links not followed)."""
    total = 0
    for path, _, names in os.walk(folder):
        for name in names:
            st = os.lstat(os.path.join(path, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total
