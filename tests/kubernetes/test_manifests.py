"""Every manifest in deploy/ and every pod and policy the backend generates validates offline with
kubernetes-validate in strict mode (unknown fields are errors) for each supported cluster version;
plus the properties an operator relies on (RBAC scope, no Secret in the repository, probes, GPU)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sandbox.base import SandboxLimits
from sandbox.kubernetes import KubernetesSandbox
from sandbox.kubernetes_manifests import (
    DEFAULT_NAMESPACE,
    KubernetesOptions,
    PodShape,
    network_policy_manifest,
    pod_manifest,
)
from sandbox.quantity import parse_quantity
from tests.doubles.kubernetes_api import KubernetesApiDouble
from tests.kubernetes.conftest import MakeSandbox

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is a dev dependency: pip install -e .[dev]"
)
ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
MANIFESTS = DEPLOY / "kubernetes"
# The cluster versions FrogFix supports (docs/OPERATING.md): the oldest still maintained upstream
# when this was written, up to the newest kubernetes-validate knows and we have looked at.
SUPPORTED = ["1.30", "1.31", "1.32", "1.33", "1.34", "1.35"]
KUSTOMIZE_KINDS = {"Kustomization", "Component"}
KUBECTL = shutil.which("kubectl")


def resource_files() -> list[Path]:
    """Every YAML file that holds whole resources (kustomizations and patches hold none)."""
    return sorted(
        path
        for path in MANIFESTS.rglob("*.yaml")
        if path.name != "kustomization.yaml" and "patches" not in path.relative_to(MANIFESTS).parts
    )


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def validate_strict(doc: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        where = "/".join(str(p) for p in exc.path)
        name = doc.get("metadata", {}).get("name")
        pytest.fail(f"{doc['kind']} {name} is invalid for Kubernetes {version} at {where}: {exc.message}")


def build(target: str) -> list[dict[str, Any]]:
    if KUBECTL is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    return copy.deepcopy(_built(target))


@functools.cache
def _built(target: str) -> list[dict[str, Any]]:
    done = subprocess.run(
        [KUBECTL or "kubectl", "kustomize", str(MANIFESTS / target)], capture_output=True, text=True, check=True
    )
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module")
def built() -> list[dict[str, Any]]:
    return build("overlays/example")


def containers(docs: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for doc in docs:
        template = doc.get("spec", {}).get("template", {}).get("spec")
        if template:
            for container in template.get("initContainers", []) + template["containers"]:
                yield doc, container


# ------------------------------------------------------------------------------ validation


def test_the_validator_is_strict() -> None:
    bogus = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "x"},
        "spec": {"containers": [{"name": "a", "bogus": 1}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bogus, SUPPORTED[0], strict=True)


@pytest.mark.parametrize("version", SUPPORTED)
@pytest.mark.parametrize("path", resource_files(), ids=lambda p: str(p.relative_to(MANIFESTS)))
def test_every_manifest_in_deploy_validates(path: Path, version: str) -> None:
    docs = documents(path)
    assert docs, f"{path} holds no resources"
    for doc in docs:
        assert doc["kind"] not in KUSTOMIZE_KINDS
        validate_strict(doc, version)


@pytest.mark.parametrize("version", SUPPORTED)
@pytest.mark.parametrize("target", ["base", "overlays/example"])
def test_the_kustomize_builds_validate(target: str, version: str) -> None:
    docs = build(target)
    assert len(docs) >= 15
    for doc in docs:
        validate_strict(doc, version)


SHAPE = PodShape(
    image="registry.example.com/frogfix-sandbox:py3.12",
    labels={"frogfix/sandbox": "frogfix-42-1-abcd", "frogfix/job": "42", "frogfix/attempt": "1"},
    env={"HOME": "/tmp/home", "LANG": "C.UTF-8"},
    deadline="2030-01-01T00:00:00Z",
    resources={"cpu": "2", "memory": "4Gi", "ephemeral-storage": "6Gi"},
    workspace_size="4Gi",
    tmp_size="1Gi",
)
EVERYTHING = KubernetesOptions(
    image_pull_secrets=("registry",),
    service_account="sandbox",
    runtime_class="gvisor",
    priority_class="frogfix-sandbox",
    node_selector={"frogfix.example.com/sandbox": "true"},
    tolerations=({"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"},),
)


def generated_pods() -> list[dict[str, Any]]:
    # the third: a setup pod, or a job pod with a built environment: an ENV_DIR volume nested in the runner's
    with_environment = dataclasses.replace(SHAPE, environment_size="2Gi", runner_dir_size="64Mi")
    return [
        pod_manifest("frogfix-42-1-abcd", KubernetesOptions(), SHAPE, 10_800),
        pod_manifest("frogfix-42-1-abcd-r1", EVERYTHING, SHAPE, 10_800),
        pod_manifest("frogfix-42-1-efgh", KubernetesOptions(), with_environment, 10_800),
    ]


def test_the_operators_pod_options_reach_the_pod() -> None:
    """Each of KubernetesOptions' pod fields lands where the cluster reads it (and nowhere without it)."""
    plain, everything, _ = generated_pods()
    assert plain["metadata"]["namespace"] == everything["metadata"]["namespace"] == DEFAULT_NAMESPACE
    placement = {"serviceAccountName", "imagePullSecrets", "runtimeClassName", "priorityClassName", "nodeSelector"}
    assert set(everything["spec"]) - set(plain["spec"]) == {*placement, "tolerations"}
    spec = everything["spec"]
    assert spec["serviceAccountName"] == "sandbox" and spec["imagePullSecrets"] == [{"name": "registry"}]
    assert spec["runtimeClassName"] == "gvisor" and spec["priorityClassName"] == "frogfix-sandbox"
    assert spec["nodeSelector"] == {"frogfix.example.com/sandbox": "true"}
    assert spec["tolerations"] == [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}]
    other = KubernetesOptions(namespace="sbx", run_as_user=2000, python="/opt/bin/python3", image_pull_policy="Never")
    pod = pod_manifest("frogfix-42-1-abcd", other, SHAPE, 60)
    container = pod["spec"]["containers"][0]
    assert pod["metadata"]["namespace"] == "sbx" and pod["spec"]["activeDeadlineSeconds"] == 60
    assert pod["spec"]["securityContext"]["runAsUser"] == pod["spec"]["securityContext"]["fsGroup"] == 2000
    assert container["securityContext"]["runAsUser"] == 2000 and container["imagePullPolicy"] == "Never"
    assert container["command"][0] == "/opt/bin/python3"


@pytest.mark.parametrize("version", SUPPORTED)
def test_generated_pods_and_policies_validate(version: str) -> None:
    labels = {"frogfix/sandbox": "frogfix-42-1-abcd", "frogfix/job": "42"}
    for doc in [*generated_pods(), network_policy_manifest("frogfix-42-1-abcd", DEFAULT_NAMESPACE, labels, "x")]:
        validate_strict(doc, version)


def test_what_a_sandbox_actually_sent_validates(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    sb = make_k8s(workspace, labels={"frogfix/job": "7", "frogfix/attempt": "3"}, runtime_class="gvisor")
    kube.break_streams()  # a recreated pod too
    sb.ping()
    sent = kube.received
    assert [kind for kind, _ in sent] == ["networkpolicies", "pods", "pods"]
    for version in SUPPORTED:
        for _, doc in sent:
            validate_strict(doc, version)


# ------------------------------------------------------------------------------ properties


def test_no_secret_is_kept_in_the_manifests(built: list[dict[str, Any]]) -> None:
    assert not [doc for doc in built if doc["kind"] == "Secret"]
    for doc, container in containers(built):
        for item in container.get("env", []):
            if any(word in item["name"].upper() for word in ("TOKEN", "SECRET", "PASSWORD", "KEY", "DATABASE_URL")):
                assert "valueFrom" in item, f"{doc['metadata']['name']}: {item['name']} must come from a Secret"
        for source in container.get("envFrom", []):
            assert set(source) <= {"configMapRef", "secretRef"}
    config = next(d for d in built if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "frogfix-config")
    assert not [k for k in config["data"] if any(w in k for w in ("TOKEN", "SECRET", "PASSWORD", "DATABASE_URL"))]


def test_the_worker_role_only_manages_sandbox_pods_exec_and_policies(built: list[dict[str, Any]]) -> None:
    roles = [d for d in built if d["kind"] in ("Role", "ClusterRole")]
    assert [(r["kind"], r["metadata"]["namespace"]) for r in roles] == [("Role", DEFAULT_NAMESPACE)]
    resources = {(group, res) for rule in roles[0]["rules"] for group in rule["apiGroups"] for res in rule["resources"]}
    assert resources == {("", "pods"), ("", "pods/exec"), ("networking.k8s.io", "networkpolicies")}
    assert not [d for d in built if d["kind"] == "ClusterRoleBinding"]
    binding = next(d for d in built if d["kind"] == "RoleBinding")
    assert binding["metadata"]["namespace"] == DEFAULT_NAMESPACE
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "frogfix", "namespace": "frogfix"}]
    tokens = {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"].get("automountServiceAccountToken")
        for doc in built
        if doc["kind"] in ("Deployment", "StatefulSet")
    }
    assert [name for name, mounted in tokens.items() if mounted is not False] == ["frogfix-worker"]


def test_the_sandbox_namespace_is_closed_and_bounded(built: list[dict[str, Any]]) -> None:
    in_ns = {
        (d["kind"], d["metadata"]["name"]): d for d in built if d["metadata"].get("namespace") == DEFAULT_NAMESPACE
    }
    deny = in_ns[("NetworkPolicy", "default-deny")]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    assert ("ResourceQuota", "sandboxes") in in_ns and ("LimitRange", "sandboxes") in in_ns
    namespace = next(d for d in built if d["kind"] == "Namespace" and d["metadata"]["name"] == DEFAULT_NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    # A sandbox pod with the backend's defaults fits the LimitRange (and its settings match the ConfigMap).
    limits = {item["type"]: item for item in in_ns[("LimitRange", "sandboxes")]["spec"]["limits"]}["Container"]["max"]
    config = next(d for d in built if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "frogfix-config")["data"]
    assert config["FROGFIX_SANDBOX"] == "kubernetes"
    assert config["FROGFIX_SANDBOX_NAMESPACE"] == DEFAULT_NAMESPACE
    assert parse_quantity(config["FROGFIX_SANDBOX_MEMORY"]) <= parse_quantity(limits["memory"])
    assert parse_quantity(config["FROGFIX_SANDBOX_EPHEMERAL_STORAGE"]) <= parse_quantity(limits["ephemeral-storage"])
    assert float(config["FROGFIX_SANDBOX_CPU"]) <= float(limits["cpu"])


def test_probes_gpu_and_parsers(built: list[dict[str, Any]]) -> None:
    api = next(c for d, c in containers(built) if d["metadata"]["name"] == "frogfix-api" and c["name"] == "api")
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    sglang = next(c for d, c in containers(built) if d["metadata"]["name"] == "sglang")
    command = " ".join(sglang["command"])
    assert "--tool-call-parser qwen3_coder" in command and "--reasoning-parser qwen3" in command
    assert "--enable-cache-report" in sglang["command"]  # else usage carries no cached tokens (issue 13)
    assert sglang["resources"]["limits"]["nvidia.com/gpu"] == "1"
    services = {d["metadata"]["name"] for d in built if d["kind"] == "Service"}
    assert {"frogfix-api", "sglang", "redis", "postgres"} <= services
    kinds = {(d["kind"], d["metadata"]["name"]) for d in built}
    assert {("Deployment", "frogfix-api"), ("Deployment", "frogfix-worker"), ("StatefulSet", "postgres")} <= kinds


def test_the_generated_pod_is_what_the_backend_sends(
    kube: KubernetesApiDouble, make_k8s: MakeSandbox, workspace: Path
) -> None:
    sb: KubernetesSandbox = make_k8s(workspace, limits=SandboxLimits(wall_seconds=600))
    sent_pod = next(body for kind, body in kube.received if kind == "pods")
    assert sent_pod["spec"] == sb.pod_manifest(sb.pod_name)["spec"] | {"activeDeadlineSeconds": 600}


# ------------------------------------------------------------------------------ compose and images


def test_compose_gives_a_working_stack_with_healthchecks() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"api", "worker", "redis", "postgres", "sglang"}
    assert all("healthcheck" in service for service in services.values())
    assert services["sglang"]["profiles"] == ["gpu"]
    command = " ".join(services["sglang"]["command"])
    assert "--tool-call-parser qwen3_coder" in command and "--reasoning-parser qwen3" in command
    assert "--enable-cache-report" in services["sglang"]["command"]
    for name in ("api", "worker"):
        assert services[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}
        secrets = {k: v for k, v in services[name]["environment"].items() if "TOKEN" in k or "SECRET" in k}
        # A secret only passes through, from .env or the shell (`${NAME:-}`); its value is never in this file.
        assert secrets == {"FROGFIX_METRICS_TOKEN": "${FROGFIX_METRICS_TOKEN:-}"}
        assert services[name]["env_file"] == [{"path": ".env", "required": False}]
    # The api's published port is the webhook port: /metrics must be closable there (final review S1).
    env_example = (ROOT / "docs" / "OPERATING.md").read_text().split("### On Kubernetes")[0]
    assert "FROGFIX_METRICS_TOKEN=<random" in env_example


def test_the_images_are_described() -> None:
    frogfix = (DEPLOY / "Dockerfile").read_text()
    sandbox = (DEPLOY / "sandbox" / "Dockerfile").read_text()
    assert "USER 10001" in frogfix
    # pid 1 reaps: each local sandbox's watchdog is re-parented to it when it exits
    assert " tini " in frogfix and 'ENTRYPOINT ["/usr/bin/tini", "--"]' in frogfix
    assert "FROM python:3.12" in sandbox and "git" in sandbox and "pytest" in sandbox and "USER 1000" in sandbox
    # Node LTS and npm in both: JavaScript repositories run in the local sandbox (the worker's /usr) and in pods
    for image in (frogfix, sandbox):
        assert "FROM node:22-bookworm-slim AS node" in image and "COPY --from=node /usr/local/bin/node " in image
        assert "/usr/local/bin/npm" in image and "node --version && npm --version" in image


def _ingress_routes(built: list[dict[str, Any]], path: str) -> bool:
    """Whether the Ingress sends `path` to the API Service (Kubernetes' Exact and Prefix rules)."""
    for doc in built:
        if doc["kind"] != "Ingress":
            continue
        for rule in doc["spec"]["rules"]:
            for route in rule["http"]["paths"]:
                want = route["path"]
                if route["pathType"] == "Exact" and path == want:
                    return True
                if route["pathType"] == "Prefix" and (path == want or path.startswith(want.rstrip("/") + "/")):
                    return True
    return False


def test_the_ingress_routes_what_the_app_serves_publicly_and_not_metrics(built: list[dict[str, Any]]) -> None:
    """/metrics names every project and its token use: Prometheus scrapes the Service in-cluster instead."""
    from app.web import api, dashboard, health, webhooks

    closed = {"/metrics", "/healthz", "/readyz"}
    served = {route.path.replace("{job_id}", "1").replace("{attempt_id}", "2")  # type: ignore[attr-defined]
              for module in (api, dashboard, health, webhooks) for route in module.router.routes}
    assert closed <= served and "/usage" in served
    for path in [*sorted(served - closed), "/static/app.css"]:
        assert _ingress_routes(built, path), f"the example Ingress does not route {path}"
    for path in ("/metrics", "/metrics/", "/healthz", "/readyz", "/openapi.json", "/docs"):
        assert not _ingress_routes(built, path), f"the example Ingress routes {path}"


def test_operating_lists_the_paths_the_example_ingress_routes(built: list[dict[str, Any]]) -> None:
    """docs/OPERATING.md names the dashboard's paths the example Ingress routes; the list is the Ingress's own."""
    import re

    text = " ".join((Path(__file__).resolve().parents[2] / "docs" / "OPERATING.md").read_text().split())
    found = re.search(r"the example Ingress routes only `/webhooks`, `/api` and the dashboard's paths "
                      r"\(([^)]*)\)", text)
    assert found is not None
    listed = set(re.findall(r"`(/[^`]*)`", found.group(1)))
    routed = {route["path"] for doc in built if doc["kind"] == "Ingress" for rule in doc["spec"]["rules"]
              for route in rule["http"]["paths"]}
    assert listed == routed - {"/webhooks", "/api"}, (listed, routed)
    assert "/evaluations" in listed
