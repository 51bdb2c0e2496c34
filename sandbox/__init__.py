"""Isolated workspaces for FrogFix jobs: the Sandbox protocol and its two backends.

What is inside:
- `base.py`: the `Sandbox` protocol, its data types (`SandboxSpec`, `SandboxLimits`,
  `SandboxOptions`: what both backends take from settings, `CommandResult`) and errors
  (`SandboxError`, `SandboxUnavailable`, `PatchTooLarge`).
- `runner.py`: the stdlib-only program that runs *inside* a sandbox (Leaf's tools, pipeline
  commands, the patch) and answers JSON lines; its error replies carry a `code`.
- `runner_client.py`: FrogFix's side of that protocol, once for both backends: `RunnerClient`
  over a one-method `RunnerChannel`.
- `local.py`: `LocalSandbox`, bubblewrap around one runner, its channel over bwrap's pipes, and
  `LocalOptions` (what only it takes);
  `namespace_limits.py`: the limits bwrap cannot set (tmpfs inodes, System V IPC) and the helper
  script that sets them.
- `cgroups.py`: the local sandbox's own cgroup (memory, pids, CPU of all its processes): where this
  host lets the worker make one (`detect`), making, killing and reaping them; `cgroup_enter.py` is
  the stdlib-only exec wrapper that joins it before bwrap runs, and with `--serve` the launcher
  that forks it; `launcher.py` is the worker's side of that launcher (one per worker process).
- `polling.py`: stdlib only: `poll_until`, the one wait until something is true (the pause doubling
  to a cap, within a bound) for the Kubernetes backend, the cgroups and the worker's mirror lock.
- `quantity.py`: stdlib only: the size syntax (`4Gi`, `500m`) both backends and the settings read,
  and `check_local_memory`, the rule that a local sandbox's tmpfs fit in its memory.
- `kubernetes.py`: `KubernetesSandbox`, one pod per attempt; `kubernetes_manifests.py` (the pod's
  and its NetworkPolicy's manifests, labels and names, and `KubernetesOptions`, what only that
  backend takes; pure), `kubernetes_cluster.py` (the API client, and `reap()` for leftovers),
  `kubernetes_stream.py` (the exec stream and the channel over it) and `kubernetes_recovery.py`
  (the journal that rebuilds a pod after a broken stream) serve it.
- `factory.py`: `open_sandbox(spec, backend, options, backend_options)`.

What may import what: this package imports nothing else of FrogFix (the worker and the agent loop
import it, never the reverse; `app/settings.py` imports `quantity` alone). Inside, `quantity`,
`cgroup_enter` and `runner` import only the stdlib (`runner` is copied into sandboxes,
`cgroup_enter` runs as a script), and so does `polling`; `base` imports only `quantity`; `cgroups`
imports `base` and `polling`;
`runner_client` imports `base` and `runner`; `launcher` imports `base` and `cgroups`; the backends
import `runner_client`, `base` and `quantity` (`kubernetes` also `polling`), and `local` also `cgroups`, `launcher` and
`namespace_limits` (stdlib and `quantity` only);
`kubernetes*` modules and `websocket`/`kubernetes` are
imported only when the Kubernetes backend is asked for. Callers use this package's names (or `sandbox.base`)
and start a sandbox with `open_sandbox`.
"""

from sandbox.base import (
    CommandResult,
    PatchTooLarge,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxOptions,
    SandboxSpec,
    SandboxUnavailable,
)
from sandbox.factory import open_sandbox

__all__ = [
    "CommandResult",
    "PatchTooLarge",
    "Sandbox",
    "SandboxError",
    "SandboxLimits",
    "SandboxOptions",
    "SandboxSpec",
    "SandboxUnavailable",
    "open_sandbox",
]
