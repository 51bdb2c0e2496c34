"""`manage.py reap-sandboxes` with a kubeconfig that points at the Kubernetes API double."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.doubles.kubernetes_api import KubernetesApiDouble
from tests.kubernetes.conftest import NAMESPACE
from tests.kubernetes.test_reaper import pod, policy

ROOT = Path(__file__).resolve().parents[2]


def test_reap_sandboxes_command_deletes_stale_sandboxes(kube: KubernetesApiDouble, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "double",
                "clusters": [{"name": "double", "cluster": {"server": kube.url}}],
                "users": [{"name": "bot", "user": {"token": kube.token}}],
                "contexts": [{"name": "double", "context": {"cluster": "double", "user": "bot"}}],
            }
        )
    )
    now = time.time()
    kube.add("pods", NAMESPACE, pod("stale", {"frogfix/sandbox": "stale"}, deadline=now - 3600))
    kube.add("networkpolicies", NAMESPACE, policy("stale", "stale", deadline=now - 3600))
    kube.add("pods", NAMESPACE, pod("live", {"frogfix/sandbox": "live"}, deadline=now + 3600))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FROGFIX_")}
    env.update(
        {
            "FROGFIX_SANDBOX": "kubernetes",
            "FROGFIX_KUBECONFIG": str(kubeconfig),
            "FROGFIX_SANDBOX_NAMESPACE": NAMESPACE,
            "FROGFIX_DATA_DIR": str(tmp_path / "data"),
        }
    )
    run = [sys.executable, str(ROOT / "manage.py"), "reap-sandboxes"]

    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)

    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pod/stale", "networkpolicy/stale"]
    assert kube.names("pods", NAMESPACE) == ["live"]
    refused = subprocess.run([*run, "--older-than", "60"], env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "would delete live sandboxes" in refused.stderr
