"""Fixtures for the Kubernetes sandbox tests: the API double on 127.0.0.1 and sandboxes on it.

The real `kubernetes` client talks HTTP and WebSocket to tests/doubles/kubernetes_api.py; an exec
there runs as a local subprocess in the pod's folder, so these tests drive the real runner over
the real exec stream. Nothing here needs a cluster, Docker or network beyond 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from app.settings import Settings
from sandbox.base import SandboxLimits, SandboxOptions, SandboxSpec
from sandbox.kubernetes import KubernetesSandbox
from sandbox.kubernetes_manifests import KubernetesOptions
from tests.doubles.kubernetes_api import KubernetesApiDouble
from tests.sandbox.support import ToolHarness, split_options
from worker import wiring

NAMESPACE = "frogfix-sandboxes"
# The runner's interpreter "in the pod". When the tests run as root the double runs execs as the
# pod's uid (1000), which must be able to execute it: prefer the system Python over a pyenv one.
PYTHON = next((p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.access(p, os.X_OK)), sys.executable)
TEST_LIMITS = SandboxLimits(
    wall_seconds=120.0,
    max_processes=64,
    memory_bytes=2 * 1024**3,
    file_size_bytes=8 * 1024**2,
    output_bytes=30_000,
    default_tool_timeout=20.0,
)
MakeSandbox = Callable[..., KubernetesSandbox]


@pytest.fixture
def kube() -> Iterator[KubernetesApiDouble]:
    with KubernetesApiDouble() as double:
        yield double


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "repo"
    path.mkdir()
    return path


def sandbox_options(kube: KubernetesApiDouble, **options: Any) -> tuple[SandboxOptions, KubernetesOptions]:
    """Backend options for the double: its API, our Python, short waits, no --reclaim; `options` override them."""
    defaults: dict[str, Any] = {
        "configuration": kube.configuration(),
        "namespace": NAMESPACE,
        "python": PYTHON,
        "reclaim": False,  # kill(-1) would reach host processes: the double refuses it
        "start_timeout_s": 20.0,
        "delete_wait_s": 5.0,
    }
    return split_options(KubernetesOptions, **{**defaults, **options})


def wire_to_double(kube: KubernetesApiDouble, monkeypatch: pytest.MonkeyPatch, start_timeout_s: float = 20.0) -> None:
    """worker/wiring's options as settings build them, the cluster's pointed at the double (its API, our
    Python, short waits, no --reclaim)."""
    shared, own = wiring.sandbox_options, wiring.backend_options

    def options(settings: Settings) -> SandboxOptions:
        return dataclasses.replace(shared(settings), start_timeout_s=start_timeout_s)

    def cluster(settings: Settings) -> KubernetesOptions:
        real = own(settings)
        assert isinstance(real, KubernetesOptions)
        return dataclasses.replace(
            real, configuration=kube.configuration(), python=PYTHON, reclaim=False, delete_wait_s=5.0
        )

    monkeypatch.setattr(wiring, "sandbox_options", options)
    monkeypatch.setattr(wiring, "backend_options", cluster)


@pytest.fixture
def make_k8s(kube: KubernetesApiDouble) -> Iterator[MakeSandbox]:
    opened: list[KubernetesSandbox] = []

    def make(
        workspace: Path,
        limits: SandboxLimits = TEST_LIMITS,
        env: dict[str, str] | None = None,
        image: str | None = None,
        labels: dict[str, str] | None = None,
        **options: Any,
    ) -> KubernetesSandbox:
        spec = SandboxSpec(workspace=str(workspace), env=env or {}, limits=limits, image=image, labels=labels or {})
        sandbox = KubernetesSandbox(spec, *sandbox_options(kube, **options))
        opened.append(sandbox)
        return sandbox

    yield make
    for sandbox in opened:
        sandbox.close()


class PodToolHarness(ToolHarness):
    """The tool suite's harness over a Kubernetes sandbox: files are put in the host workspace,
    which is copied into the pod on first use; from then on `root` is the pod's /workspace (its
    folder in the double), so the suite's checks on file contents look inside the pod."""

    def __init__(self, host_root: Path, opener: Callable[[Path], KubernetesSandbox], kube: KubernetesApiDouble) -> None:
        self._kube = kube
        self._pod_root: Path | None = None
        super().__init__("kubernetes", host_root, opener)

    @property
    def root(self) -> Path:
        return self._pod_root or self._host_root

    @root.setter
    def root(self, value: Path) -> None:
        self._host_root = value

    @property
    def inside_root(self) -> str:
        return str(self._open())

    def call(self, name: str, **arguments: Any) -> str:
        self._open()
        return super().call(name, **arguments)

    def _open(self) -> Path:
        if self._pod_root is None:
            assert self._opener is not None
            sandbox = self._opener(self._host_root)
            self._sandbox = sandbox
            self._pod_root = self._kube.pod_path(NAMESPACE, sandbox.pod_name)
        return self._pod_root


@pytest.fixture
def tools(workspace: Path, make_k8s: MakeSandbox, kube: KubernetesApiDouble) -> ToolHarness:
    """The tool-level suite of tests/sandbox, through a pod's runner stream."""
    return PodToolHarness(workspace, make_k8s, kube)
