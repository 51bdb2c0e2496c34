"""The Kubernetes backend's journal and recovery: a runner channel that survives a broken stream.

Why: an exec stream goes through the API server and the kubelet, and breaks when either restarts
or a proxy times it out. The pod's workspace is then unknown, but the host's copy is untouched,
so the sandbox can be rebuilt: a fresh pod from the same workspace (under the same policy), and
every mutating call the caller already saw answered (Write, Edit, Bash, pipeline commands,
patches) sent again, in order. Each replayed answer must match what the caller saw (Write/Edit:
the exact text; Bash: its status line, e.g. `Exit code: 0`; commands: exit code and timeout;
patch: its bytes), otherwise the sandbox fails instead of silently diverging. The call that was
in flight is then sent again, once.

`RecoveringChannel` wraps the plain `StreamChannel` and is what the `RunnerClient` talks to; its
fatal cases raise `RunnerBroken`, so the client marks the sandbox dead like any other failure.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sandbox.base import SandboxError
from sandbox.kubernetes_stream import StreamBroken, describe_api_error
from sandbox.runner_client import RunnerBroken, RunnerChannel

log = logging.getLogger("sandbox.kubernetes")

MUTATING_TOOLS = frozenset({"Write", "Edit", "Bash"})


@dataclass
class JournalEntry:
    """One mutating call already answered: what to send again and what it must answer."""

    label: str
    payload: dict[str, Any]
    timeout: float
    expected: str


class PodRestarter(Protocol):
    """What recovery needs of the sandbox: its names (for the log) and a fresh pod."""

    name: str
    pod_name: str

    def restart_pod(self) -> None:
        """Delete the current pod and start a new one from the untouched workspace, runner and
        stream included (raises SandboxError/StreamBroken/RunnerBroken when that fails)."""
        ...


class RecoveringChannel:
    """A `RunnerChannel` that records mutating calls and, when the stream breaks, rebuilds the
    pod, replays the journal and sends the call in flight once more."""

    def __init__(
        self,
        inner: RunnerChannel,
        pod: PodRestarter,
        *,
        max_recoveries: int,
        wall_deadline: float,
        wall_message: str,
        closed: Callable[[], bool],
    ) -> None:
        """`pod` should be a weak proxy: the sandbox owns this channel, not the other way round."""
        self._inner = inner
        self._pod = pod
        self.max_recoveries = max_recoveries
        self.recoveries = 0
        self.journal: list[JournalEntry] = []
        self._wall_deadline = wall_deadline
        self._wall_message = wall_message
        self._closed = closed

    def exchange(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """The reply to `request`, recovering from at most one broken stream on the way."""
        retried = False
        while True:
            try:
                reply = self._inner.exchange(request, timeout)
            except StreamBroken as exc:
                self._check_open()
                if time.monotonic() >= self._wall_deadline:
                    raise RunnerBroken(self._wall_message) from None
                if retried:
                    raise RunnerBroken(f"the sandbox stream broke again on the same call ({exc})") from None
                retried = True
                self._recover(str(exc))
                continue
            self._note(request, reply, timeout)
            return reply

    def _check_open(self) -> None:
        if self._closed():
            raise SandboxError("the sandbox is closed")

    def _note(self, request: dict[str, Any], reply: Mapping[str, Any], timeout: float) -> None:
        """Journal an answered mutating call with the outcome a replay must reproduce."""
        label = _mutating_label(request)
        if label is None or reply.get("ok") is not True:
            return
        payload = json.loads(json.dumps({k: v for k, v in request.items() if k != "id"}, default=str))
        self.journal.append(JournalEntry(label, payload, timeout, outcome(payload, reply)))

    def _recover(self, reason: str) -> None:
        """A fresh pod from the untouched workspace, then every recorded mutating call again."""
        while True:
            if self.recoveries >= self.max_recoveries:
                raise RunnerBroken(
                    f"the sandbox stream broke ({reason}) and {self.max_recoveries} recoveries are used up"
                )
            self.recoveries += 1
            log.warning(
                "sandbox %s: stream to pod %s broke (%s); recreating it and replaying %d calls (recovery %d of %d)",
                self._pod.name, self._pod.pod_name, reason, len(self.journal), self.recoveries, self.max_recoveries,
            )  # fmt: skip
            try:
                self._pod.restart_pod()
                self._replay()
                return
            except StreamBroken as exc:
                reason = str(exc)
                self._check_open()
            except RunnerBroken:
                raise
            except SandboxError as exc:
                if not self._closed():
                    raise RunnerBroken(f"recovering the sandbox failed: {exc}") from None
                raise
            except Exception as exc:
                raise RunnerBroken(f"recovering the sandbox failed: {describe_api_error(exc)}") from None

    def _replay(self) -> None:
        for index, entry in enumerate(self.journal, start=1):
            reply = self._inner.exchange({"id": f"replay-{index}", **entry.payload}, entry.timeout)
            got = outcome(entry.payload, reply)
            if got != entry.expected:
                raise RunnerBroken(
                    f"recovery replay diverged at mutating call {index} of {len(self.journal)} "
                    f"({entry.label}): expected {entry.expected[:200]!r}, got {got[:200]!r}"
                )


def _mutating_label(request: Mapping[str, Any]) -> str | None:
    """How the journal names a call that changes the pod's state; None for one that does not."""
    op = request.get("op")
    if op == "tool" and request.get("name") in MUTATING_TOOLS:
        return f"{request.get('name')} call"
    if op == "exec":
        return "command"
    if op == "patch":  # `git add -A` changed the index, which later `git status`/`git diff` calls show
        return "patch"
    return None


def outcome(payload: Mapping[str, Any], reply: Mapping[str, Any]) -> str:
    """What a replayed call must reproduce: Bash output varies (timings), its status line must
    not; a command its exit code and timeout; a patch its bytes (as a hash)."""
    if reply.get("ok") is not True:
        return f"runner error: {reply.get('error')}"
    op = payload.get("op")
    if op == "tool":
        output = str(reply.get("output"))
        return output.split("\n", 1)[0] if payload.get("name") == "Bash" else output
    if op == "exec":
        return f"exit_code={reply.get('exit_code')} timed_out={reply.get('timed_out')}"
    return hashlib.sha256(str(reply.get("patch_b64", "")).encode()).hexdigest()
