"""What a doctor check reports: its result type, the options a run may tune, and the few ways a line ends.

Every check module imports this and nothing else of the doctor; the runner (`checks.py`) imports
the check modules, so the doctor's imports run one way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

Outcome = Literal["pass", "fail", "skip", "warn"]  # warn: worth fixing, but not a failure (exit code 0)
Severity = Literal["error", "warning"]
DEFAULT_MIN_FREE_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class CheckResult:
    """One line of the report. `fix` says what to do when `outcome` is `fail` or `warn` (empty otherwise).

    `severity` means something only for those: a `fail` is an `error` or a `warning` (a `warning`
    fails too, but FrogFix can still run jobs), a `warn` is a `warning`; a passed or skipped check
    has none (None, `null` in `--json`).
    """

    name: str
    outcome: Outcome
    detail: str
    fix: str = ""
    severity: Severity | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def passed(name: str, detail: str) -> CheckResult:
    return CheckResult(name, "pass", detail)


def failed(name: str, detail: str, fix: str, severity: Severity = "error") -> CheckResult:
    return CheckResult(name, "fail", detail, fix, severity)


def warned(name: str, detail: str, fix: str) -> CheckResult:
    """A setting worth changing that FrogFix runs without (the operator's choice): shown, but doctor still exits 0."""
    return CheckResult(name, "warn", detail, fix, "warning")


def skipped(name: str, detail: str) -> CheckResult:
    return CheckResult(name, "skip", detail)


@dataclass(frozen=True)
class DoctorOptions:
    """What a run of doctor may tune: the free-disk threshold (`--min-free-gib`)."""

    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES
