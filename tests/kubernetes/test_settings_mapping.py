"""FROGFIX_SANDBOX_* settings reach the backends' options: all of them for Kubernetes; the sizes, CPUs and
memory for local, whose sizes must fit in its memory."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from app.settings import Settings
from sandbox.kubernetes import KubernetesSandbox
from sandbox.local import LocalSandbox
from sandbox.quantity import PROCESS_FLOOR_BYTES, SHM_SIZE_BYTES, parse_quantity
from worker.wiring import sandbox_options, sandbox_spec


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
        "environment_size": "2Gi",
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


def test_sandbox_memory_reaches_the_local_sandbox_as_its_total(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """FROGFIX_SANDBOX_MEMORY used to reach pods only; empty is the job's 4 GiB."""
    monkeypatch.setenv("FROGFIX_SANDBOX", "local")
    assert sandbox_spec(tmp_path, Settings()).limits.memory_bytes == 4 * 1024**3
    monkeypatch.setenv("FROGFIX_SANDBOX_MEMORY", "5Gi")
    assert sandbox_spec(tmp_path, Settings()).limits.memory_bytes == 5 * 1024**3


def test_the_default_sizes_fit_in_the_default_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    for backend in ("local", "kubernetes"):
        monkeypatch.setenv("FROGFIX_SANDBOX", backend)
        settings = Settings()
        files = parse_quantity(settings.sandbox_workspace_size) + parse_quantity(settings.sandbox_tmp_size)
        assert files + SHM_SIZE_BYTES + PROCESS_FLOOR_BYTES <= settings.sandbox_memory_bytes() == 4 * 1024**3


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SANDBOX_WORKSPACE_SIZE": "4Gi", "SANDBOX_TMP_SIZE": "1Gi"}, "FROGFIX_SANDBOX_WORKSPACE_SIZE 4Gi"),
        ({"SANDBOX_MEMORY": "2Gi"}, "FROGFIX_SANDBOX_MEMORY 2Gi"),
        ({"SANDBOX_MEMORY": "1Gi", "SANDBOX_WORKSPACE_SIZE": "256Mi", "SANDBOX_TMP_SIZE": "256Mi"}, "for processes"),
    ],
)
def test_local_sizes_that_do_not_fit_the_memory_are_refused_at_load(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], named: str
) -> None:
    """Tmpfs pages are the sandbox's memory: over-sized, a full workspace would OOM-kill the runner, not ENOSPC."""
    monkeypatch.setenv("FROGFIX_SANDBOX", "local")
    for key, value in env.items():
        monkeypatch.setenv(f"FROGFIX_{key}", value)
    with pytest.raises(ValueError, match="FROGFIX_SANDBOX_MEMORY") as refused:
        Settings()
    assert named in str(refused.value) and "FROGFIX_SANDBOX_TMP_SIZE" in str(refused.value)
    monkeypatch.setenv("FROGFIX_SANDBOX", "kubernetes")  # a pod's emptyDirs are disk: _check_storage's rule
    Settings()


def test_a_bad_sandbox_memory_is_refused_when_settings_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROGFIX_SANDBOX", "kubernetes")
    monkeypatch.setenv("FROGFIX_SANDBOX_MEMORY", "4 gigs")
    with pytest.raises(ValueError, match="write it like"):
        Settings()


def test_an_env_with_the_old_workspace_size_is_refused_with_the_upgrade_note(monkeypatch: pytest.MonkeyPatch) -> None:
    """Final review, S3: a compose .env that set the old documented 4Gi now stops the api and the worker from
    starting; the error says what changed, why, what to set, and that Kubernetes is not held to the rule."""
    monkeypatch.setenv("FROGFIX_SANDBOX", "local")
    monkeypatch.delenv("FROGFIX_SANDBOX_MEMORY", raising=False)
    monkeypatch.setenv("FROGFIX_SANDBOX_WORKSPACE_SIZE", "4Gi")
    with pytest.raises(ValueError) as refused:
        Settings()
    message = " ".join(str(refused.value).split())
    assert "FROGFIX_SANDBOX_WORKSPACE_SIZE 4Gi" in message
    assert "went from 4Gi and 1Gi to 2Gi and 512Mi" in message
    assert "raise FROGFIX_SANDBOX_MEMORY or lower the sizes" in message
    assert "applies only to the local backend: Kubernetes installs that want the old sizes set them explicitly" in (
        message
    )
    monkeypatch.setenv("FROGFIX_SANDBOX_MEMORY", "6Gi")  # what the note says to do: the old sizes then load
    monkeypatch.setenv("FROGFIX_SANDBOX_TMP_SIZE", "1Gi")
    Settings()
