"""Pick a sandbox backend by name (the `FROGFIX_SANDBOX` setting): `local` or `kubernetes`."""

from __future__ import annotations

from typing import Any

from sandbox.base import Sandbox, SandboxSpec, SandboxUnavailable

BACKENDS = ("local", "kubernetes")


def open_sandbox(spec: SandboxSpec, backend: str = "local", **options: Any) -> Sandbox:
    """Start a sandbox for `spec`; `options` go to the backend (see LocalSandbox's arguments).

    Raises SandboxUnavailable when the backend cannot run here; there is no unsandboxed fallback.
    """
    if backend == "local":
        from sandbox.local import LocalSandbox

        return LocalSandbox(spec, **options)
    if backend == "kubernetes":
        raise SandboxUnavailable("the kubernetes sandbox backend is not implemented yet; use FROGFIX_SANDBOX=local")
    raise ValueError(f"unknown sandbox backend {backend!r}; expected one of {', '.join(BACKENDS)}")
