"""What a setup phase reports: the environment line, `fix --json`'s `environment`, and why it failed.

Its own module so each ecosystem's builder (builder.py for Python, javascript.py) reports the same way
without importing the other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOG_TAIL_CHARS = 4_000


class EnvironmentUnusable(Exception):
    """The job's tests cannot run: the environment could not be built, or the tests could not start."""

    def __init__(self, report: EnvironmentReport) -> None:
        super().__init__(report.reason)
        self.report = report


@dataclass
class EnvironmentReport:
    """What `fix --json` calls `environment`, the job page and `show` print, and the issue comment says."""

    ok: bool
    built: bool = False  # False: no environment applies (no mirror set, or not a Python repository)
    cached: bool = False
    seconds: float = 0.0
    reason: str = ""
    log_tail: str = ""
    detected: list[str] = field(default_factory=list)
    key: str = ""
    project_seconds: float = 0.0  # the project's own install, which runs again in every job
    path: Path | None = None  # the environment's host folder (ENV_DIR); never reported
    project: Path | None = None  # the job's project layer (PROJECT_DIR), where the project is installed
    tests_unstartable: bool = False  # built (or none needed), yet the tests could not start on the base commit
    note: str = ""  # what the environment line adds (JavaScript: the sandbox's Node, and a mismatch with the asked one)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"ok": self.ok, "built": self.built, "cached": self.cached}
        data["seconds"] = round(self.seconds, 3)
        if self.project_seconds:
            data["project_seconds"] = round(self.project_seconds, 3)
        if self.detected:
            data["detected"] = self.detected
        if self.key:
            data["key"] = self.key[:16]
        if self.note:
            data["note"] = self.note
        if not self.ok or self.reason:
            data["reason"] = self.reason
        if not self.ok:
            data["log_tail"] = self.log_tail
        return data

    def line(self) -> str:
        """One line for `fix`'s stdout, `show` and the timeline."""
        if not self.ok:
            return f"environment error: {self.reason}"
        if not self.built:
            return f"environment: none built ({self.reason})"
        own = f" (the project's own install {self.project_seconds:.1f}s)" if self.project is not None else ""
        note = f"; {self.note}" if self.note else ""
        return f"environment: {'cached' if self.cached else 'built'} in {self.seconds:.1f}s{own}{note}"


def failed(reason: str, log: str = "", *, built: bool = True, tests_unstartable: bool = False) -> EnvironmentReport:
    return EnvironmentReport(
        False, built=built, reason=reason, log_tail=_tail(log), tests_unstartable=tests_unstartable
    )


def _tail(text: str) -> str:
    return text if len(text) <= LOG_TAIL_CHARS else "[...]\n" + text[-LOG_TAIL_CHARS:]


class StepFailed(Exception):
    """One step of the setup phase failed; `report` says why."""

    def __init__(self, report: EnvironmentReport) -> None:
        super().__init__(report.reason)
        self.report = report
