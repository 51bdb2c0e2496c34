"""Pick a sandbox backend by name (the `FROGFIX_SANDBOX` setting): `local` or `kubernetes`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sandbox.base import Sandbox, SandboxOptions, SandboxSpec, SandboxUnavailable

if TYPE_CHECKING:  # the backends' own options live beside them; kubernetes* is imported only when asked for
    from sandbox.kubernetes_manifests import KubernetesOptions
    from sandbox.local import LocalOptions

BACKENDS = ("local", "kubernetes")


def open_sandbox(
    spec: SandboxSpec,
    backend: str = "local",
    options: SandboxOptions | None = None,
    backend_options: LocalOptions | KubernetesOptions | None = None,
) -> Sandbox:
    """Start a sandbox for `spec` with the options both backends share and, optionally, the backend's
    own (`local.LocalOptions` or `kubernetes_manifests.KubernetesOptions`, matching `backend`).

    Raises SandboxUnavailable when the backend cannot run here; there is no unsandboxed fallback.
    """
    if backend == "local":
        from sandbox.local import LocalOptions, LocalSandbox

        if not isinstance(backend_options, LocalOptions | None):
            raise TypeError(f"the local backend takes LocalOptions, not {type(backend_options).__name__}")
        return LocalSandbox(spec, options, backend_options)
    if backend == "kubernetes":
        from sandbox.kubernetes_manifests import KubernetesOptions

        if not isinstance(backend_options, KubernetesOptions | None):
            raise TypeError(f"the kubernetes backend takes KubernetesOptions, not {type(backend_options).__name__}")
        try:
            from sandbox.kubernetes import KubernetesSandbox
        except ImportError as exc:  # the `kubernetes` client is a dependency; say so if it is missing
            raise SandboxUnavailable(f"the kubernetes sandbox needs the kubernetes client: {exc}") from exc

        return KubernetesSandbox(spec, options, backend_options)
    raise ValueError(f"unknown sandbox backend {backend!r}; expected one of {', '.join(BACKENDS)}")
