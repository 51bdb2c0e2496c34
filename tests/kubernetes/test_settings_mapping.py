"""FROGFIX_SANDBOX_* settings reach the Kubernetes backend's options; the local backend gets none."""

from __future__ import annotations

import inspect

import pytest

from app.settings import Settings
from sandbox.kubernetes import KubernetesSandbox
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


def test_local_backend_takes_no_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROGFIX_SANDBOX", "local")
    assert sandbox_options(Settings()) == {}
