"""FROGFIX_SANDBOX_* settings reach the backends' options: all of them for Kubernetes; the sizes, CPUs and
memory for local, whose sizes must fit in its memory. And from the options to what each backend makes: the
local sandbox's tmpfs, rlimits and cgroup bounds, the pod's manifest."""

from __future__ import annotations

import shutil
import tempfile
from contextlib import closing
from pathlib import Path

import pytest

from app.settings import Settings
from sandbox.base import SandboxOptions
from sandbox.kubernetes import KubernetesSandbox
from sandbox.kubernetes_manifests import KubernetesOptions
from sandbox.local import LocalOptions, LocalSandbox
from sandbox.quantity import PROCESS_FLOOR_BYTES, SHM_SIZE_BYTES, format_cpus, parse_cpus, parse_quantity
from tests.doubles.kubernetes_api import KubernetesApiDouble
from tests.kubernetes.conftest import NAMESPACE, wire_to_double
from worker.wiring import backend_options, open_job_sandbox, sandbox_options, sandbox_spec

GiB, MiB = 1024**3, 1024**2


def set_env(monkeypatch: pytest.MonkeyPatch, values: dict[str, str]) -> None:
    for key, value in values.items():
        monkeypatch.setenv(f"FROGFIX_{key}", value)


def test_kubernetes_settings_map_onto_backend_options(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, {
        "SANDBOX": "kubernetes",
        "SANDBOX_NAMESPACE": "sbx",
        "SANDBOX_IMAGE": "registry.local/sbx:1",
        "SANDBOX_CPU": "3",
        "SANDBOX_MEMORY": "6Gi",
        "SANDBOX_EPHEMERAL_STORAGE": "10Gi",
        "SANDBOX_WORKSPACE_SIZE": "6Gi",
        "SANDBOX_TMP_SIZE": "2Gi",
        "SANDBOX_RUNTIME_CLASS": "gvisor",
        "SANDBOX_START_TIMEOUT_SECONDS": "90",
        "MAX_PATCH_BYTES": "4096",
        "KUBECONFIG": "/etc/frogfix/kubeconfig",
        "KUBE_CONTEXT": "prod",
    })  # fmt: skip
    settings = Settings()
    assert sandbox_options(settings) == SandboxOptions(
        cpus=3.0, workspace_size_bytes=6 * GiB, tmp_size_bytes=2 * GiB, start_timeout_s=90.0, max_patch_bytes=4096
    )
    assert backend_options(settings) == KubernetesOptions(
        namespace="sbx",
        default_image="registry.local/sbx:1",
        memory="6Gi",
        ephemeral_storage="10Gi",
        runtime_class="gvisor",
        kubeconfig="/etc/frogfix/kubeconfig",
        context="prod",
        environment_size="2Gi",
    )


def test_local_backend_takes_the_same_sizes_and_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    set_env(monkeypatch, {"SANDBOX": "local", "SANDBOX_WORKSPACE_SIZE": "1.5Gi", "SANDBOX_TMP_SIZE": "256Mi"})
    monkeypatch.setenv("FROGFIX_SANDBOX_CPU", "500m")
    settings = Settings()
    assert sandbox_options(settings) == SandboxOptions(
        cpus=0.5,
        workspace_size_bytes=3 * 512 * MiB,
        tmp_size_bytes=256 * MiB,
        start_timeout_s=300.0,
        max_patch_bytes=settings.max_patch_bytes,
    )
    assert backend_options(settings) == LocalOptions()


@pytest.mark.parametrize("cpus", ["2", "500m", "1500m", "1.5", "0.25", "16"])
def test_cpus_go_to_the_pod_as_the_quantity_they_were(cpus: str) -> None:
    """Settings' CPUs are a number in SandboxOptions; the pod gets them back as a quantity of the same value."""
    assert parse_cpus(format_cpus(parse_cpus(cpus))) == parse_cpus(cpus)
    assert format_cpus(parse_cpus(cpus)) == {"1.5": "1500m", "0.25": "250m"}.get(cpus, cpus)


CHANGED = {  # every setting a sandbox reads, away from its default (the local sizes fit in the memory)
    "SANDBOX_CPU": "1500m",
    "SANDBOX_MEMORY": "3Gi",
    "SANDBOX_WORKSPACE_SIZE": "1Gi",
    "SANDBOX_TMP_SIZE": "384Mi",
    "MAX_PATCH_BYTES": "5000",
    "JOB_TIMEOUT_SECONDS": "1234",
}


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="the local sandbox needs bubblewrap")
def test_changed_settings_reach_the_local_sandbox(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through wiring's options: the tmpfs sizes, the cgroup's memory total and CPUs, RLIMIT_AS, the patch bound."""
    base = Path(tempfile.mkdtemp(prefix="frogfix-settings-"))
    base.chmod(0o711)  # a root worker's sandbox uid must reach the workspace (pytest's folders are 0700)
    workspace = base / "ws"
    workspace.mkdir(mode=0o755)
    set_env(monkeypatch, {"SANDBOX": "local", **CHANGED})
    try:
        with closing(open_job_sandbox(workspace, Settings())) as sb:
            assert isinstance(sb, LocalSandbox)
            assert (sb.cgroup_limits.memory_bytes, sb.cgroup_limits.cpus) == (3 * GiB, 1.5)
            assert (sb.max_patch_bytes, sb.limits.wall_seconds) == (5000, 1234)
            out = sb.run_command("df -B1 --output=size /workspace /tmp | tail -n 2; ulimit -v", 30).log.split()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    assert [int(n) for n in out] == [1 * GiB, 384 * MiB, 3 * GiB // 1024]


def test_changed_settings_reach_the_pod(
    monkeypatch: pytest.MonkeyPatch, kube: KubernetesApiDouble, workspace: Path
) -> None:
    """Through wiring's options: namespace, image, runtime class, CPU, memory and storage, the emptyDirs' sizes."""
    set_env(monkeypatch, {
        **CHANGED,
        "SANDBOX": "kubernetes",
        "SANDBOX_NAMESPACE": NAMESPACE,
        "SANDBOX_IMAGE": "registry.local/sbx:2",
        "SANDBOX_EPHEMERAL_STORAGE": "7Gi",
        "SANDBOX_RUNTIME_CLASS": "gvisor",
    })  # fmt: skip
    wire_to_double(kube, monkeypatch)
    with closing(open_job_sandbox(workspace, Settings())) as sb:
        assert isinstance(sb, KubernetesSandbox)
        assert sb.max_patch_bytes == 5000
    pod = next(body for kind, body in kube.received if kind == "pods")
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert pod["metadata"]["namespace"] == NAMESPACE and container["image"] == "registry.local/sbx:2"
    assert spec["runtimeClassName"] == "gvisor" and 1200 <= spec["activeDeadlineSeconds"] <= 1234
    resources = {"cpu": "1500m", "memory": "3Gi", "ephemeral-storage": "7Gi"}
    assert container["resources"] == {"requests": resources, "limits": resources}
    sizes = {volume["name"]: volume["emptyDir"]["sizeLimit"] for volume in spec["volumes"]}
    assert (sizes["workspace"], sizes["tmp"]) == ("1Gi", "384Mi")


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
