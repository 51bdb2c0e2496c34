"""Doctor's sandbox checks: a real local sandbox is started and probed, or the Kubernetes side is read.

Local: bubblewrap is installed; inside a started sandbox a connection to a listener the check
opens on the host's 127.0.0.1 fails, and writing outside the workspace fails while writing inside
works; each sandbox can get its own memory, pids and CPU cgroup (a warning when not: the sandbox
then has per-process rlimits only). Kubernetes: the namespace exists, the worker's
RBAC allows pods, pods/exec and networkpolicies (SelfSubjectAccessReview), and a deny-all
NetworkPolicy is in place.
"""

from __future__ import annotations

import select
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from app.settings import Settings
from worker.commands.doctor.results import CheckResult, DoctorOptions, failed, passed, skipped

PROBE_TIMEOUT_S = 30.0
API_TIMEOUT_S = 10.0
BWRAP_FIX = "apt-get install bubblewrap (FrogFix never runs a job unsandboxed)"
DEPLOY = "deploy/kubernetes/base"
# What the worker does in the sandbox namespace (deploy/kubernetes/base/rbac.yaml grants it).
RBAC_NEEDS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("", "pods", "", ("create", "get", "list", "delete")),
    ("", "pods", "exec", ("create", "get")),
    ("networking.k8s.io", "networkpolicies", "", ("create", "get", "list", "delete")),
)


# ----------------------------------------------------------------------------- local


def check_local(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        why = "not checked: bubblewrap is missing"
        return [
            failed("sandbox.bubblewrap", "bubblewrap (bwrap) is not installed", BWRAP_FIX),
            skipped("sandbox.network", why),
            skipped("sandbox.filesystem", why),
            cgroup_line(),
        ]
    return [passed("sandbox.bubblewrap", f"bubblewrap at {bwrap}"), *_isolation_lines(settings), cgroup_line()]


PROBE_SCRIPT = """\
if (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null; then echo NET=open; else echo NET=closed; fi
for p in {paths}; do if (echo probe > "$p") 2>/dev/null; then echo "WROTE=$p"; fi; done
if (echo probe > doctor-probe) 2>/dev/null; then echo INSIDE=ok; fi
"""


def _isolation_lines(settings: Settings) -> list[CheckResult]:
    """Start a sandbox on a scratch workspace and try to get out of it."""
    from sandbox import SandboxError, SandboxLimits, SandboxSpec, open_sandbox

    scratch = Path(tempfile.mkdtemp(prefix="doctor-", dir=settings.resolved_workspace_dir()))
    scratch.chmod(0o711)  # as the workspaces folder: the sandbox's uid may pass through, not list
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        workspace, outside = scratch / "workspace", scratch / "outside"
        workspace.mkdir()
        outside.mkdir()
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        targets = [str(outside / "probe"), "/etc/frogfix-doctor-probe", "/usr/frogfix-doctor-probe"]
        script = PROBE_SCRIPT.format(port=listener.getsockname()[1], paths=" ".join(targets))
        spec = SandboxSpec(workspace=str(workspace), limits=SandboxLimits(wall_seconds=PROBE_TIMEOUT_S * 2))
        try:
            box = open_sandbox(spec, "local")
            try:
                log = box.run_command(script, PROBE_TIMEOUT_S).log
            finally:
                box.close()
        except SandboxError as exc:
            why = "not checked: the sandbox did not start"
            return [failed("sandbox.network", f"cannot start a sandbox: {exc}"[:400], start_failure_fix(str(exc))),
                    skipped("sandbox.filesystem", why)]
        reached = bool(select.select([listener], [], [], 0)[0])
        wrote = [t for t in targets if f"WROTE={t}" in log or Path(t).exists()]
        return [_network_line(log, reached), _filesystem_line(log, wrote)]
    finally:
        listener.close()
        shutil.rmtree(scratch, ignore_errors=True)


# sandbox/runner.py's words when its python3 has no ctypes (it refuses to serve over a reachable channel).
NO_CTYPES = "cannot make itself non-dumpable"


def start_failure_fix(reason: str) -> str:
    """What to change when the probe sandbox did not start, from the reason it gave."""
    if NO_CTYPES in reason:
        return ("give the sandbox a python3 with its standard library, ctypes included (Debian: the python3 "
                "package; python3-minimal alone is not enough): the runner needs it to hide its channel")
    return ("make FROGFIX_WORKSPACE_DIR and every folder above it searchable (o+x) by the sandbox's uid, "
            "and let bwrap create user namespaces (kernel.unprivileged_userns_clone=1, or AppArmor's "
            "bwrap profile)")


def _network_line(log: str, reached: bool) -> CheckResult:
    if "NET=closed" in log and not reached:
        return passed("sandbox.network", "no network: a listener on the host's 127.0.0.1 was out of reach")
    return failed("sandbox.network", "the sandbox reached a listener on the host's 127.0.0.1",
                  "run the worker where bwrap --unshare-net works (user namespaces enabled)")


def _filesystem_line(log: str, wrote: list[str]) -> CheckResult:
    if wrote:
        return failed("sandbox.filesystem", f"the sandbox wrote outside its workspace: {', '.join(wrote)}",
                      "do not run the worker with a bubblewrap that ignores --ro-bind (check `bwrap --version`)")
    if "INSIDE=ok" not in log:
        return failed("sandbox.filesystem", "the sandbox could not write its own workspace",
                      "make FROGFIX_WORKSPACE_DIR a local file system that the sandbox's uid may write")
    return passed("sandbox.filesystem", "only the workspace is writable (host paths, /etc and /usr refused)")


def cgroup_line(mountinfo: str = "/proc/self/mountinfo", proc_cgroup: str = "/proc/self/cgroup") -> CheckResult:
    """Whether this process can give each local sandbox its own memory, pids and CPU cgroup
    (sandbox/cgroups.py decides, by making and removing a probe cgroup where it would)."""
    from sandbox.cgroups import DELEGATION_FIX, detect

    support = detect(mountinfo, proc_cgroup)
    if not support.missing:
        return passed("sandbox.cgroups", support.describe())
    return failed("sandbox.cgroups", support.describe(), DELEGATION_FIX, severity="warning")


# ----------------------------------------------------------------------------- kubernetes


def check_kubernetes(settings: Settings, options: DoctorOptions) -> list[CheckResult]:
    from kubernetes import client

    from sandbox import SandboxUnavailable
    from sandbox.kubernetes_cluster import make_api_client

    ns = settings.sandbox_namespace
    try:
        api = make_api_client(settings.kubeconfig or None, settings.kube_context or None)
    except SandboxUnavailable as exc:
        return _api_down(f"no Kubernetes API to talk to: {exc}",
                         "run the worker in the cluster, or set FROGFIX_KUBECONFIG (and FROGFIX_KUBE_CONTEXT)")
    with api:
        core: Any = client.CoreV1Api(api)
        try:
            namespace = _namespace_line(core, ns)
        except Exception as exc:  # urllib3's connection errors have no common base with ApiException
            return _api_down(f"the Kubernetes API does not answer: {type(exc).__name__}: {exc}"[:400],
                             "check FROGFIX_KUBECONFIG / FROGFIX_KUBE_CONTEXT and that the API server is reachable")
        return [namespace, _rbac_line(client, api, ns), _deny_line(client.NetworkingV1Api(api), ns)]


def _api_down(detail: str, fix: str) -> list[CheckResult]:
    why = "not checked: no Kubernetes API"
    return [failed("sandbox.namespace", detail, fix), skipped("sandbox.rbac", why), skipped("sandbox.deny_policy", why)]


def _namespace_line(core: Any, ns: str) -> CheckResult:
    from kubernetes.client.exceptions import ApiException

    try:
        core.read_namespace(ns, _request_timeout=API_TIMEOUT_S)
    except ApiException as exc:
        if exc.status == 404:
            return failed("sandbox.namespace", f"namespace {ns} does not exist",
                          f"kubectl apply -k {DEPLOY} (it creates {ns}), or set FROGFIX_SANDBOX_NAMESPACE")
        if exc.status == 403:
            return skipped("sandbox.namespace", f"the worker may not read namespaces; the policy check covers {ns}")
        if exc.status == 401:
            return failed("sandbox.namespace", "the Kubernetes API refused the credentials (HTTP 401)",
                          "renew the token in FROGFIX_KUBECONFIG, or the worker's service account token")
        raise
    return passed("sandbox.namespace", f"namespace {ns} exists")


def _rbac_line(client: Any, api: Any, ns: str) -> CheckResult:
    authz: Any = client.AuthorizationV1Api(api)
    denied = []
    for group, resource, sub, verbs in RBAC_NEEDS:
        for verb in verbs:
            attributes = client.V1ResourceAttributes(
                namespace=ns, verb=verb, group=group, resource=resource, subresource=sub or None
            )
            review = client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
            )
            try:
                answer = authz.create_self_subject_access_review(review, _request_timeout=API_TIMEOUT_S)
            except Exception as exc:  # no common base for urllib3's errors and ApiException: one line, its fix
                return failed("sandbox.rbac", f"cannot ask the API what the worker may do: {type(exc).__name__}: "
                              f"{exc}"[:400], "the worker's service account needs to create selfsubjectaccessreviews "
                              "(every authenticated user may by default); check the API server is reachable")
            if not (answer.status and answer.status.allowed):
                denied.append(f"{verb} {resource}{'/' + sub if sub else ''}")
    if not denied:
        return passed("sandbox.rbac", f"the worker may manage pods, pods/exec and networkpolicies in {ns}")
    return failed("sandbox.rbac", f"RBAC denies in {ns}: {', '.join(denied)}",
                  f"apply {DEPLOY}/rbac.yaml (Role frogfix-sandbox-manager, bound to the worker's service account)")


def is_deny_all(policy: dict[str, Any]) -> bool:
    """Selects every pod, covers ingress and egress, and allows nothing."""
    spec = policy.get("spec") or {}
    selector = spec.get("podSelector") or {}
    every_pod = not selector.get("matchLabels") and not selector.get("matchExpressions")
    both = {"Ingress", "Egress"} <= set(spec.get("policyTypes") or ())
    return every_pod and both and not spec.get("ingress") and not spec.get("egress")


def _deny_line(net: Any, ns: str) -> CheckResult:
    from kubernetes.client.exceptions import ApiException

    fix = f"kubectl apply -f {DEPLOY}/sandbox-namespace.yaml (the default-deny NetworkPolicy)"
    try:
        listed = net.list_namespaced_network_policy(ns, _request_timeout=API_TIMEOUT_S)
    except ApiException as exc:
        return failed("sandbox.deny_policy", f"cannot list network policies in {ns} (HTTP {exc.status})", fix)
    policies = [net.api_client.sanitize_for_serialization(p) for p in listed.items]
    deny = [p["metadata"]["name"] for p in policies if is_deny_all(p)]
    if deny:
        return passed("sandbox.deny_policy", f"deny-all NetworkPolicy {deny[0]} in {ns} "
                      "(enforced where the cluster's network plugin supports NetworkPolicy)")
    return failed("sandbox.deny_policy", f"no deny-all NetworkPolicy in {ns}", fix)

