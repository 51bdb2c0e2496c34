"""`sandbox.kubernetes_cluster.reap`: what a dead worker left behind goes once it is past its deadline."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sandbox.kubernetes_cluster import reap
from sandbox.kubernetes_manifests import ANNOTATION_DEADLINE, LABEL_SANDBOX, rfc3339
from tests.doubles.kubernetes_api import KubernetesApiDouble
from tests.kubernetes.conftest import NAMESPACE, MakeSandbox
from tests.servers import wait_until


def pod(name: str, labels: dict[str, str], deadline: float | None = None) -> dict[str, Any]:
    annotations = {ANNOTATION_DEADLINE: rfc3339(deadline)} if deadline is not None else {}
    return {
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "sandbox", "image": "img"}]},
    }


def policy(name: str, sandbox: str, deadline: float | None = None) -> dict[str, Any]:
    annotations = {ANNOTATION_DEADLINE: rfc3339(deadline)} if deadline is not None else {}
    return {
        "metadata": {"name": name, "labels": {LABEL_SANDBOX: sandbox}, "annotations": annotations},
        "spec": {"podSelector": {"matchLabels": {LABEL_SANDBOX: sandbox}}, "policyTypes": ["Ingress", "Egress"]},
    }


def test_reaper_removes_what_is_past_its_deadline_and_nothing_else(kube: KubernetesApiDouble) -> None:
    now = time.time()
    kube.add("pods", NAMESPACE, pod("stale", {LABEL_SANDBOX: "stale"}, deadline=now - 3600))
    kube.add("networkpolicies", NAMESPACE, policy("stale", "stale", deadline=now - 3600))
    kube.add("pods", NAMESPACE, pod("live", {LABEL_SANDBOX: "live"}, deadline=now + 3600))
    kube.add("networkpolicies", NAMESPACE, policy("live", "live", deadline=now + 3600))
    kube.add("pods", NAMESPACE, pod("in-grace", {LABEL_SANDBOX: "in-grace"}, deadline=now - 10))
    kube.add("pods", NAMESPACE, pod("not-ours", {"app": "other"}, deadline=now - 3600))
    kube.add("pods", "elsewhere", pod("other-namespace", {LABEL_SANDBOX: "x"}, deadline=now - 3600))
    kube.add("networkpolicies", NAMESPACE, policy("starting", "starting", deadline=now + 3600))  # pod not made yet

    removed = reap(NAMESPACE, None, kube.configuration())

    assert removed == ["pod/stale", "networkpolicy/stale"]
    assert kube.names("pods", NAMESPACE) == ["in-grace", "live", "not-ours"]
    assert kube.names("networkpolicies", NAMESPACE) == ["live", "starting"]
    assert kube.names("pods", "elsewhere") == ["other-namespace"]
    verbs = kube.verbs()
    assert verbs.index(("delete", "pods", "stale")) < verbs.index(("delete", "networkpolicies", "stale"))


def test_older_than_caps_objects_without_a_usable_deadline(kube: KubernetesApiDouble) -> None:
    kube.add("pods", NAMESPACE, pod("old", {LABEL_SANDBOX: "old"}))
    kube.add("pods", NAMESPACE, pod("young", {LABEL_SANDBOX: "young"}))
    kube.age("pods", NAMESPACE, "old", 7200)
    assert reap(NAMESPACE, older_than_s=3600, api=kube.configuration()) == ["pod/old"]
    assert kube.names("pods", NAMESPACE) == ["young"]


def test_orphan_policies_go_after_a_while(kube: KubernetesApiDouble) -> None:
    kube.add("networkpolicies", NAMESPACE, policy("orphan", "orphan"))
    kube.add("networkpolicies", NAMESPACE, policy("fresh-orphan", "fresh-orphan"))
    kube.age("networkpolicies", NAMESPACE, "orphan", 3600)
    assert reap(NAMESPACE, None, kube.configuration(), orphan_policy_s=600) == ["networkpolicy/orphan"]


def test_reaper_cleans_up_after_a_worker_that_died(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    sb = make_k8s(workspace)
    sb.call_tool("Bash", {"command": "sleep 600 >/dev/null 2>&1 &"})
    sb._finalizer.detach()  # the worker process is gone: nobody will ever call close()
    assert reap(NAMESPACE, None, kube.configuration()) == []  # still within its deadline
    later = time.time() + sb.limits.wall_seconds + 120
    assert reap(NAMESPACE, None, kube.configuration(), now=later) == [f"pod/{sb.name}", f"networkpolicy/{sb.name}"]
    assert kube.objects("pods", NAMESPACE) == [] and kube.objects("networkpolicies", NAMESPACE) == []
    # The deleted pod's processes are killed, then exit: wait for it (a loaded machine takes its time), never assume.
    wait_until(lambda: kube.live_processes(NAMESPACE, sb.name) == 0, timeout=60)
