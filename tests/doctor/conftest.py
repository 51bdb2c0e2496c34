"""Doctor tests: settings through `configure`, results by check name."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from worker.commands.doctor import CheckResult


def by_name(results: Sequence[CheckResult]) -> dict[str, CheckResult]:
    names = [r.name for r in results]
    assert len(names) == len(set(names)), f"duplicate check names: {names}"
    return {r.name: r for r in results}


def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
