"""Pick a sandbox backend by name (the `FROGFIX_SANDBOX` setting): `local` or `kubernetes`."""

from __future__ import annotations

from typing import Any

from sandbox.base import Sandbox, SandboxSpec, SandboxUnavailable

BACKENDS = ("local", "kubernetes")


def open_sandbox(spec: SandboxSpec, backend: str = "local", **options: Any) -> Sandbox:
    """Start a sandbox for `spec`; `options` go to the backend (LocalSandbox's or
    KubernetesSandbox's keyword arguments, e.g. `namespace=`, `default_image=` for Kubernetes).

    Raises SandboxUnavailable when the backend cannot run here; there is no unsandboxed fallback.
    """
    if backend == "local":
        from sandbox.local import LocalSandbox

        return LocalSandbox(spec, **options)
    if backend == "kubernetes":
        try:
            from sandbox.kubernetes import KubernetesSandbox
        except ImportError as exc:  # the `kubernetes` client is a dependency; say so if it is missing
            raise SandboxUnavailable(f"the kubernetes sandbox needs the kubernetes client: {exc}") from exc

        return KubernetesSandbox(spec, **options)
    raise ValueError(f"unknown sandbox backend {backend!r}; expected one of {', '.join(BACKENDS)}")
