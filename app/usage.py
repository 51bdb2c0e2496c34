"""What a run cost: tokens, model calls, steps, model and sandbox seconds. One type, every reader.

The loop fills it from the server's `usage` reports, an attempt adds its test runs' sandbox
time, the database keeps it per attempt and (summed) per job, and `fix --json`, the API, `show`,
the job page and /metrics print it through `to_dict` (app/answers.py `UsageAnswer` types that
shape). Standard library only, so worker/leaf may use it without pulling in the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Final

# The columns migration 0005 added to both `jobs` and `job_attempts` (`steps` was there before).
USAGE_COLUMNS: Final[tuple[str, ...]] = (
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "model_calls",
    "model_seconds",
    "sandbox_seconds",
)


@dataclass(frozen=True)
class UsageFigures:
    """Sums over model replies (tokens, calls, steps) and wall time (model calls, sandbox work).

    `cached_tokens` is what the server reported in `usage.prompt_tokens_details.cached_tokens`;
    a server started without `--enable-cache-report` reports none, which counts as 0 here.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    model_calls: int = 0
    steps: int = 0
    model_seconds: float = 0.0
    sandbox_seconds: float = 0.0

    def __add__(self, other: UsageFigures) -> UsageFigures:
        return UsageFigures(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def cached_share(self) -> float | None:
        """The share of prompt tokens the server's prefix cache served; None before any prompt."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def columns(self) -> dict[str, Any]:
        """The database columns these figures are stored in (`steps` is written with the step count)."""
        return {name: getattr(self, name) for name in USAGE_COLUMNS}

    def to_dict(self) -> dict[str, Any]:
        """The one JSON shape of usage (`fix --json`, the API, `show --json`, trajectories)."""
        share = self.cached_share
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "cached_share": None if share is None else round(share, 4),
            "calls": self.model_calls,
            "steps": self.steps,
            "model_seconds": round(self.model_seconds, 3),
            "sandbox_seconds": round(self.sandbox_seconds, 3),
        }

    @classmethod
    def of(cls, row: Any) -> UsageFigures:
        """A `jobs` or `job_attempts` row's figures (NULLs, from rows written before 0005, read as 0)."""
        return cls(
            prompt_tokens=int(getattr(row, "prompt_tokens", 0) or 0),
            completion_tokens=int(getattr(row, "completion_tokens", 0) or 0),
            cached_tokens=int(getattr(row, "cached_tokens", 0) or 0),
            model_calls=int(getattr(row, "model_calls", 0) or 0),
            steps=int(getattr(row, "steps", 0) or 0),
            model_seconds=float(getattr(row, "model_seconds", 0.0) or 0.0),
            sandbox_seconds=float(getattr(row, "sandbox_seconds", 0.0) or 0.0),
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> UsageFigures:
        """Read `to_dict`'s shape back (a trajectory's summary); missing or odd values are 0."""
        data = data or {}

        def number(key: str) -> float:
            value = data.get(key)
            return value if isinstance(value, int | float) and not isinstance(value, bool) else 0

        return cls(
            int(number("prompt_tokens")), int(number("completion_tokens")), int(number("cached_tokens")),
            int(number("calls")), int(number("steps")), float(number("model_seconds")),
            float(number("sandbox_seconds")),
        )


def usage_table(rows: list[tuple[str, UsageFigures]]) -> str:
    """A plain-text table of labelled figures, for `fix`, `demo` and `show`."""
    head = ("", "prompt", "cached", "share", "completion", "calls", "steps", "model s", "sandbox s")
    lines = [head]
    for label, u in rows:
        share = u.cached_share
        lines.append((
            label, str(u.prompt_tokens), str(u.cached_tokens), "-" if share is None else f"{share:.0%}",
            str(u.completion_tokens), str(u.model_calls), str(u.steps), f"{u.model_seconds:.2f}",
            f"{u.sandbox_seconds:.2f}",
        ))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]

    def row(line: tuple[str, ...]) -> str:
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))]
        return "  ".join(cells).rstrip()

    return "\n".join(row(line) for line in lines)
