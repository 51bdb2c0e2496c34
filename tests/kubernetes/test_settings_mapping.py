"""FROGFIX_SANDBOX_* settings reach the backends' options: all of them for Kubernetes, the sizes and CPUs for local."""

from __future__ import annotations

import inspect

import pytest

from app.settings import Settings
from sandbox.kubernetes import KubernetesSandbox
from sandbox.local import LocalSandbox
from worker.wiring import sandbox_options


def test_kubernetes_settings_map_onto_backend_options(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "SANDBOX": "kubernetes",
        "SANDBOX_NAMESPACE": "sbx",
        "SANDBOX_IMAGE": "registry.local/sbx:1",
        "SANDBOX_CPU": "3",
        "SANDBOX_MEMORY": "6Gi",
        "SANDBOX_EPHEMERAL_STORAGE": "10Gi",
        "SANDBOX_WORKSPACE_SIZE": "6Gi",
        "SANDBOX_TMP_SIZE": "2Gi",
        "SANDBOX_RUNTIME_CLASS": "gvisor",
        "KUBECONFIG": "/etc/frogfix/kubeconfig",
        "KUBE_CONTEXT": "prod",
    }.items():
        monkeypatch.setenv(f"FROGFIX_{key}", value)
    options = sandbox_options(Settings())
    assert options == {
        "namespace": "sbx",
        "default_image": "registry.local/sbx:1",
        "cpu": "3",
        "memory": "6Gi",
        "ephemeral_storage": "10Gi",
        "workspace_size": "6Gi",
        "tmp_size": "2Gi",
        "runtime_class": "gvisor",
        "kubeconfig": "/etc/frogfix/kubeconfig",
        "context": "prod",
        "start_timeout_s": 300.0,
    }
    accepted = set(inspect.signature(KubernetesSandbox.__init__).parameters)
    assert set(options) <= accepted


def test_local_backend_takes_the_same_sizes_and_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROGFIX_SANDBOX", "local")
    monkeypatch.setenv("FROGFIX_SANDBOX_WORKSPACE_SIZE", "1.5Gi")
    monkeypatch.setenv("FROGFIX_SANDBOX_TMP_SIZE", "256Mi")
    monkeypatch.setenv("FROGFIX_SANDBOX_CPU", "500m")
    options = sandbox_options(Settings())
    assert options == {
        "workspace_size_bytes": 3 * 512 * 1024**2,
        "tmp_size_bytes": 256 * 1024**2,
        "cpus": 0.5,
        "start_timeout_s": 300.0,
    }
    assert set(options) <= set(inspect.signature(LocalSandbox.__init__).parameters)


@pytest.mark.parametrize(("name", "value"), [("SANDBOX_WORKSPACE_SIZE", "4 gigs"), ("SANDBOX_CPU", "two")])
def test_a_bad_quantity_is_refused_when_settings_load(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(f"FROGFIX_{name}", value)
    with pytest.raises(ValueError, match="write it like"):
        Settings()
