"""An in-process sandbox double: Leaf's five tools over an in-memory file tree.

It imitates the shapes of the Leaf tool results closely enough for loop tests (the real
formats are the runner's business and are tested there). It records every call, can answer
Bash from a table, and can be told to fail like broken infrastructure (SandboxError).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandbox.base import CommandResult, SandboxError

BashHandler = Callable[[str], tuple[int, str, str]]


@dataclass
class SandboxDouble:
    """Files live in `files`; `bash` maps a command to (exit code, stdout, stderr)."""

    files: dict[str, str] = field(default_factory=dict)
    bash: dict[str, tuple[int, str, str]] | BashHandler = field(default_factory=dict)
    fail_on: set[str] = field(default_factory=set)  # tool names that raise SandboxError
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    closed: bool = False

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        self.calls.append((name, dict(arguments)))
        if name in self.fail_on:
            raise SandboxError(f"double: {name} lost its sandbox")
        if name not in {"Read", "Write", "Edit", "Glob", "Bash"}:
            return f"Unknown tool: {name}"
        handler = getattr(self, f"_tool_{name.lower()}", None)
        if handler is None:
            return f"Unknown tool: {name}"
        try:
            result: str = handler(**arguments)
            return result
        except TypeError as exc:  # wrong or missing arguments, as a real tool would report
            return f"TypeError: {exc}"
        except (KeyError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"

    def _tool_read(self, file_path: str, offset: int = 1, limit: int | None = None) -> str:
        if file_path not in self.files:
            raise KeyError(f"No such file: {file_path}")
        lines = self.files[file_path].splitlines()
        start = max(1, int(offset))
        chosen = lines[start - 1:] if limit is None else lines[start - 1:start - 1 + int(limit)]
        return "\n".join([file_path, *(f"{start + i}. {line}" for i, line in enumerate(chosen))])

    def _tool_write(self, file_path: str, content: str) -> str:
        self.files[file_path] = content
        return f"Wrote {file_path} ({len(content)} bytes)."

    def _tool_edit(self, file_path: str, old_string: str, new_string: str, replace_all: bool = False) -> str:
        text = self.files[file_path]
        count = text.count(old_string) if old_string else 0
        if count == 0:
            raise ValueError("old_string not found")
        if count > 1 and not replace_all:
            raise ValueError(f"old_string matched {count} times; pass replace_all")
        self.files[file_path] = text.replace(old_string, new_string, -1 if replace_all else 1)
        done = count if replace_all else 1
        return f"Edited {file_path} ({done} replacement{'s' if done != 1 else ''})."

    def _tool_glob(self, pattern: str, path: str | None = None) -> str:
        found = sorted(p for p in self.files if fnmatch.fnmatch(p, pattern.replace("**/", "*")))
        return "\n".join(found) if found else "No files matched."

    def _tool_bash(self, command: str, description: str = "", timeout: float = 120, timeout_ms: float = 0) -> str:
        if callable(self.bash):
            code, out, err = self.bash(command)
        else:
            code, out, err = self.bash.get(command, (0, "", ""))
        return f"Exit code: {code}\nSTDOUT:\n{out}\nSTDERR:\n{err}"

    def run_command(
        self, command: str, timeout: float, log_limit: int | None = None, results_limit: int = 0
    ) -> CommandResult:
        code, out, err = self.bash(command) if callable(self.bash) else self.bash.get(command, (0, "", ""))
        return CommandResult(command=command, exit_code=code, log=out + err)

    def patch(self, base_commit: str) -> str:
        return ""

    def close(self) -> None:
        self.closed = True
