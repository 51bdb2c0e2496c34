"""Sandbox checks: a real bubblewrap sandbox, cgroup layouts, and Kubernetes through the API double."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.settings import get_settings
from sandbox.runner_client import RUNNER_SCRIPT
from tests.conftest import configure
from tests.doctor.conftest import by_name, free_port
from tests.doubles.kubernetes_api import KubernetesApiDouble
from worker.commands.doctor.results import DoctorOptions
from worker.commands.doctor.sandboxes import cgroup_line, check_kubernetes, check_local, is_deny_all, start_failure_fix

NS = "frogfix-sandboxes"
DENY_ALL = {"metadata": {"name": "default-deny"}, "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}}


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_local_sandbox_isolates(frogfix_env: dict[str, Any]) -> None:
    root = get_settings().resolved_workspace_dir()  # the default: reachable by the sandbox's uid
    before = set(root.glob("doctor-*"))
    lines = by_name(check_local(get_settings(), DoctorOptions()))
    assert lines["sandbox.bubblewrap"].outcome == "pass"
    assert lines["sandbox.network"].outcome == "pass", lines["sandbox.network"]
    assert lines["sandbox.filesystem"].outcome == "pass", lines["sandbox.filesystem"]
    assert lines["sandbox.cgroups"].outcome in ("pass", "fail")
    assert set(root.glob("doctor-*")) == before  # the scratch workspace is gone


@pytest.mark.bwrap
@pytest.mark.skipif(shutil.which("bwrap") is None or os.getuid() != 0, reason="needs bwrap, and root (uid 65534)")
def test_local_workspace_out_of_the_sandbox_uid_reach(frogfix_env: dict[str, Any], tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    configure(frogfix_env["monkeypatch"], workspace_dir=str(private / "ws"))
    lines = by_name(check_local(get_settings(), DoctorOptions()))
    assert lines["sandbox.network"].outcome == "fail" and "cannot start a sandbox" in lines["sandbox.network"].detail
    assert "FROGFIX_WORKSPACE_DIR" in lines["sandbox.network"].fix
    assert lines["sandbox.filesystem"].outcome == "skip"


def test_local_without_bubblewrap_fails_with_install(frogfix_env: dict[str, Any], monkeypatch: Any) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    lines = by_name(check_local(get_settings(), DoctorOptions()))
    line = lines["sandbox.bubblewrap"]
    assert line.outcome == "fail" and "apt-get install bubblewrap" in line.fix
    assert lines["sandbox.network"].outcome == "skip" and lines["sandbox.filesystem"].outcome == "skip"


def _mountinfo(tmp_path: Path, mounts: list[tuple[str, str, str]], own: str) -> tuple[str, str]:
    """A mountinfo (fstype, folder, super options per cgroup mount) and a /proc/self/cgroup for it."""
    lines = [f"{30 + i} 1 0:{40 + i} / {folder} rw - {fstype} cgroup {opts}" for i, (fstype, folder, opts) in
             enumerate(mounts)]
    lines.append("20 1 8:1 / / rw - ext4 /dev/vda rw")
    (tmp_path / "mountinfo").write_text("\n".join(lines) + "\n")
    (tmp_path / "self-cgroup").write_text(own)
    return str(tmp_path / "mountinfo"), str(tmp_path / "self-cgroup")


def test_cgroup_line_on_this_host_says_what_each_sandbox_gets() -> None:
    from sandbox.cgroups import host_support

    line = cgroup_line()
    support = host_support()
    assert line.outcome == ("pass" if not support.missing else "fail")
    for placement in support.placements:
        assert f"{placement.controller} (v{placement.version} under {placement.parent})" in line.detail


def test_no_cgroup_hierarchy_is_a_warning_that_names_the_fallback(tmp_path: Path) -> None:
    line = cgroup_line(*_mountinfo(tmp_path, [], "0::/\n"))
    assert (line.outcome, line.severity) == ("fail", "warning")
    assert "missing memory, pids, cpu" in line.detail and "no cgroup hierarchy carries it" in line.detail
    assert "Delegate=yes" in line.fix and "rlimits only" in line.fix


def test_cgroup_v2_with_controllers_not_enabled_for_children_is_a_warning(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    own = root / "system.slice" / "frogfix.service"
    own.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids\n")
    (own / "cgroup.subtree_control").write_text("")
    line = cgroup_line(*_mountinfo(tmp_path, [("cgroup2", str(root), "rw")], "0::/system.slice/frogfix.service\n"))
    assert (line.outcome, line.severity) == ("fail", "warning")
    assert "memory: not enabled for the children of" in line.detail, line.detail
    assert not list(root.rglob("frogfix-sandbox-*"))


def test_cgroup_v1_folder_that_is_not_a_cgroup_is_a_warning(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    (root / "memory" / "frogfix").mkdir(parents=True)
    (root / "pids" / "frogfix").mkdir(parents=True)
    mounts = [("cgroup", str(root / "memory"), "rw,memory"), ("cgroup", str(root / "pids"), "rw,pids")]
    line = cgroup_line(*_mountinfo(tmp_path, mounts, "5:memory:/frogfix\n6:pids:/frogfix\n"))
    assert (line.outcome, line.severity) == ("fail", "warning")
    assert "memory.limit_in_bytes is not writable" in line.detail and "cpu: no cgroup hierarchy" in line.detail
    assert not list(root.rglob("frogfix-sandbox-*"))  # the probe cgroups are gone


def test_deny_all_shape() -> None:
    assert is_deny_all(DENY_ALL)
    assert not is_deny_all({"spec": {"podSelector": {"matchLabels": {"a": "b"}}, "policyTypes": ["Ingress", "Egress"]}})
    assert not is_deny_all({"spec": {"podSelector": {}, "policyTypes": ["Ingress"]}})
    assert not is_deny_all({"spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "egress": [{}]}})


@pytest.fixture
def kube(frogfix_env: dict[str, Any], tmp_path: Path) -> Iterator[KubernetesApiDouble]:
    with KubernetesApiDouble() as double:
        _kube_env(frogfix_env, tmp_path, double.url, double.token or "")
        yield double


def _kube_env(env: dict[str, Any], folder: Path, server: str, token: str) -> None:
    config = folder / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: d\n"
        f"clusters: [{{name: d, cluster: {{server: '{server}'}}}}]\n"
        f"users: [{{name: d, user: {{token: '{token}'}}}}]\n"
        "contexts: [{name: d, context: {cluster: d, user: d}}]\n"
    )
    configure(env["monkeypatch"], sandbox="kubernetes", kubeconfig=str(config))


def test_kubernetes_ready_passes(kube: KubernetesApiDouble) -> None:
    kube.namespaces.add(NS)
    kube.add("networkpolicies", NS, DENY_ALL)
    lines = by_name(check_kubernetes(get_settings(), DoctorOptions()))
    assert {n: r.outcome for n, r in lines.items()} == {
        "sandbox.namespace": "pass",
        "sandbox.rbac": "pass",
        "sandbox.deny_policy": "pass",
    }, lines
    assert "default-deny" in lines["sandbox.deny_policy"].detail


def test_kubernetes_missing_pieces_fail_with_fixes(kube: KubernetesApiDouble) -> None:
    kube.denied.add(("create", "pods", "exec"))
    kube.add("networkpolicies", NS, {"metadata": {"name": "allow-dns"},
                                     "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}})
    lines = by_name(check_kubernetes(get_settings(), DoctorOptions()))
    assert lines["sandbox.namespace"].outcome == "fail" and "kubectl apply -k" in lines["sandbox.namespace"].fix
    assert lines["sandbox.rbac"].outcome == "fail" and lines["sandbox.rbac"].detail.endswith("create pods/exec")
    assert "rbac.yaml" in lines["sandbox.rbac"].fix
    assert lines["sandbox.deny_policy"].outcome == "fail" and "default-deny" in lines["sandbox.deny_policy"].fix


def test_kubernetes_access_reviews_that_fail_are_one_line_with_a_fix(kube: KubernetesApiDouble) -> None:
    """An API that refuses SelfSubjectAccessReview fails the RBAC line alone; the other lines are still checked."""
    kube.namespaces.add(NS)
    kube.add("networkpolicies", NS, DENY_ALL)
    kube.access_review_error = 500
    lines = by_name(check_kubernetes(get_settings(), DoctorOptions()))
    assert lines["sandbox.rbac"].outcome == "fail" and "selfsubjectaccessreviews" in lines["sandbox.rbac"].fix
    assert lines["sandbox.namespace"].outcome == "pass" and lines["sandbox.deny_policy"].outcome == "pass"


def test_kubernetes_api_down(frogfix_env: dict[str, Any], tmp_path: Path) -> None:
    _kube_env(frogfix_env, tmp_path, f"http://127.0.0.1:{free_port()}", "t")
    lines = by_name(check_kubernetes(get_settings(), DoctorOptions()))
    assert lines["sandbox.namespace"].outcome == "fail" and "does not answer" in lines["sandbox.namespace"].detail
    assert lines["sandbox.rbac"].outcome == "skip" and lines["sandbox.deny_policy"].outcome == "skip"


def test_escape_evidence_fails_the_lines() -> None:
    from worker.commands.doctor.sandboxes import _filesystem_line, _network_line

    assert _network_line("NET=open\nINSIDE=ok\n", reached=False).outcome == "fail"
    assert _network_line("NET=closed\n", reached=True).outcome == "fail"
    assert _network_line("", reached=False).outcome == "fail"  # a probe that did not run proves nothing
    assert _filesystem_line("INSIDE=ok\n", ["/etc/frogfix-doctor-probe"]).outcome == "fail"
    assert _filesystem_line("NET=closed\n", []).outcome == "fail"
    assert _filesystem_line("INSIDE=ok\n", []).outcome == "pass"


def test_a_sandbox_python_without_ctypes_is_named_in_the_fix(tmp_path: Path) -> None:
    """The runner refuses to serve without ctypes (python3-minimal images); doctor's fix must say that, from
    the runner's own words, not blame the workspace folder or user namespaces."""
    start = (f"import runpy, sys\nsys.modules['ctypes'] = None\nsys.argv[0] = {RUNNER_SCRIPT!r}\n"
             f"runpy.run_path({RUNNER_SCRIPT!r}, run_name='__main__')\n")  # fmt: skip
    argv = [sys.executable, "-I", "-S", "-B", "-c", start, "--root", str(tmp_path)]
    done = subprocess.run(argv, input=b'{"id": 1, "op": "ping"}\n', capture_output=True, timeout=30, check=False)
    assert done.returncode == 2
    assert "ctypes included" in start_failure_fix(f"runner exited: {done.stderr.decode()}")
    assert "searchable (o+x)" in start_failure_fix("bwrap: Can't find source path /x: Permission denied")
