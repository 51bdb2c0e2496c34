"""The saved trajectory: Leaf's `leaf-function-calling` JSON plus FrogFix's own fields.

Written atomically (app/trajectory.py's `write_atomic`: temporary file, fsync, rename) after
every step, so a crash or a kill leaves the last complete step on disk, never half a file. The
format, the file's place and its reading belong to app/trajectory.py; this module fills it in.
Everything saved passes through `redact` first, string by string, so a configured secret cannot
reach the file however it appears. Messages are append-only, so each one is redacted and
encoded once and the file is assembled from cached pieces: a write costs O(new messages) of
encoding plus the disk write.

Usage fields, so that no name means two figures: `steps[i].usage` is that reply's tokens
(`cached_tokens` included); `steps[i].tool_seconds` and the summary's `usage.tool_seconds` are
wall time inside the run's sandbox tool calls only. `sandbox_seconds` is the job's figure (tool
calls plus test runs) and appears only where the job's usage is, such as `manage.py fix`'s `fix.usage`.
Files written before this rule carry the loop's tool seconds as `usage.sandbox_seconds`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from app.redaction import redact_value
from app.trajectory import FORMAT_VERSION, TRAJECTORY_FORMAT, write_atomic
from worker.leaf.loop import LeafResult, StepRecord
from worker.leaf.tools import TOOL_SCHEMAS

__all__ = ["FORMAT_VERSION", "HARNESS_VERSION", "TRAJECTORY_FORMAT", "TrajectoryWriter"]

HARNESS_VERSION: Final = "frogfix-leaf/0.1.0"


def _identity(text: str) -> str:
    return text


def run_usage(result: LeafResult) -> dict[str, Any]:
    """The summary's `usage`: the loop's totals and app/usage.py's shape over the run's replies.

    The loop timed only its tool calls, so its seconds are `tool_seconds` here; `sandbox_seconds`
    (tool calls and test runs) is the job's figure, and the loop never knows it.
    """
    figures = result.figures().to_dict()
    figures["tool_seconds"] = figures.pop("sandbox_seconds")
    return {**result.usage.to_dict(), **figures}


def _encode(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class TrajectoryWriter:
    """Keeps one trajectory file up to date; `on_step` plugs straight into `run_leaf`.

    `fields` are extra top-level fields (issue, project, ...); they are redacted too.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        job_id: str | int | None,
        model: str,
        sampling: Mapping[str, Any],
        base_commit: str | None = None,
        harness_version: str = HARNESS_VERSION,
        tools: Sequence[Mapping[str, Any]] = TOOL_SCHEMAS,
        redact: Callable[[str], str] | None = None,
        fields: Mapping[str, Any] | None = None,
        fsync: bool = True,
    ) -> None:
        self.path = Path(path)
        self._redact = redact or _identity
        self._fsync = fsync
        self._meta: dict[str, Any] = {
            "trajectory_format": TRAJECTORY_FORMAT,
            "format_version": FORMAT_VERSION,
            "job_id": job_id,
            "model": model,
            "sampling": dict(sampling),
            "harness_version": harness_version,
            "base_commit": base_commit,
            "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
            **(dict(fields) if fields else {}),
        }
        self._tools = _encode(redact_value(list(tools), self._redact))
        self._state: dict[str, Any] = {
            "exit_reason": None, "partial": True, "error": None, "final_message": "",
        }
        self._steps: list[dict[str, Any]] = []
        self._messages: list[str] = []  # redacted, encoded; append-only like the history
        self._seen: list[Mapping[str, Any]] = []
        self._started = time.monotonic()
        self.writes = 0

    def on_step(self, record: StepRecord) -> None:
        """Record one step and rewrite the file."""
        self._steps.append(record.to_dict())
        self._take(record.history)
        self._state["n_steps"] = len(self._steps)
        self._state["context_tokens"] = record.context_tokens
        self.write()

    def finish(
        self, result: LeafResult, *, patch: str | None = None, fields: Mapping[str, Any] | None = None
    ) -> Path:
        """Record how the run ended (and the patch, when taken) and write the final file."""
        self._take(result.messages)
        self._state.update(
            exit_reason=result.exit_reason,
            partial=False,
            error=result.error,
            ending=result.failure.to_dict() if result.failure else None,  # the model's or sandbox's, typed
            final_message=result.final_answer,
            n_steps=result.steps,
            usage=run_usage(result),
            timings={
                "elapsed_s": round(result.elapsed_s, 3),
                "model_s": round(result.model_seconds, 3),
                "tools_s": round(result.tool_seconds, 3),
            },
        )
        if patch is not None:
            self._state["output_patch"] = patch
        if fields:
            self._state.update(fields)
        self.write()
        return self.path

    def _take(self, history: Sequence[Mapping[str, Any]]) -> None:
        """Encode the messages not yet seen. The history only grows; a rewrite is a bug."""
        seen = len(self._seen)
        if len(history) < seen or any(history[i] is not self._seen[i] for i in range(max(0, seen - 2), seen)):
            raise ValueError("trajectory history was rewritten; it must be append-only")
        for message in history[seen:]:
            self._seen.append(message)
            self._messages.append(_encode(redact_value(message, self._redact)))

    def document(self) -> dict[str, Any]:
        """The trajectory as a dict (what the file holds)."""
        data: dict[str, Any] = json.loads(self._render())
        return data

    def _render(self) -> str:
        head = dict(self._meta)
        head.update(self._state)
        head["updated_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        head.setdefault("timings", {"elapsed_s": round(time.monotonic() - self._started, 3)})
        head["steps"] = self._steps
        encoded_head = _encode(redact_value(head, self._redact))
        return (
            encoded_head[:-1]
            + ',"tools":' + self._tools
            + ',"messages":[' + ",".join(self._messages) + "]}"
        )

    def write(self) -> None:
        """Replace the file atomically: readers see the old or the new version, whole."""
        write_atomic(self.path, self._render().encode("utf-8"), fsync=self._fsync)
        self.writes += 1
