"""What a Kubernetes sandbox is made of: the pod's and its NetworkPolicy's manifests, their labels and names.

Pure functions of the settings and the job's labels (no API calls), so the shape of every pod
FrogFix creates can be read, and tested, in one place; kubernetes.py creates them. See its
docstring for why the pod is built this way.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sandbox.base import (
    ENV_DIR,
)
from sandbox.environment_stream import (
    ENVIRONMENT_VOLUME,
)
from sandbox.quantity import format_quantity, parse_quantity

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "frogfix-sandboxes"
DEFAULT_IMAGE = "frogfix-sandbox:latest"
CONTAINER = "sandbox"
WORKSPACE = "/workspace"
RUNNER_DIR = "/frogfix"
RUNNER_PATH = f"{RUNNER_DIR}/runner.py"
HOME = "/tmp/home"
HOSTNAME = "frogfix-sandbox"
SANDBOX_UID = 1000
RUNNER_DIR_SIZE = "16Mi"
LABEL_PREFIX = "frogfix/"
LABEL_SANDBOX = "frogfix/sandbox"
ANNOTATION_DEADLINE = "frogfix/deadline"
COMMON_LABELS = {"app.kubernetes.io/name": "frogfix-sandbox", "app.kubernetes.io/managed-by": "frogfix"}
SECCOMP = {"type": "RuntimeDefault"}
FORBIDDEN_ENV_PREFIXES = ("FROGFIX_", "GITLAB_", "GITEA_", "FORGEJO_")

# The pod's main process: an init that reaps orphans (exec'd processes re-parent to it) and
# exits on SIGTERM. Any image with python3 can run it; nothing is baked into the image. It makes
# itself non-dumpable first (prctl PR_SET_DUMPABLE 0, as the runner does), so no command in the
# pod, which runs under the same uid, can open, read or ptrace pid 1 either.
INIT = (
    "import ctypes, os, signal\n"
    "if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:\n"
    "    raise SystemExit('frogfix init: cannot make itself non-dumpable')\n"
    "wanted = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, wanted)\n"
    "while signal.sigwait(wanted) == signal.SIGCHLD:\n"
    "    try:\n"
    "        while os.waitpid(-1, os.WNOHANG)[0] > 0:\n"
    "            pass\n"
    "    except ChildProcessError:\n"
    "        pass\n"
)


def network_policy_manifest(name: str, namespace: str, labels: Mapping[str, str], deadline: str) -> dict[str, Any]:
    """Deny all ingress and egress for the pods of one sandbox (selected by `frogfix/sandbox`)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": {ANNOTATION_DEADLINE: deadline},
        },
        "spec": {
            "podSelector": {"matchLabels": {LABEL_SANDBOX: labels[LABEL_SANDBOX]}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [],
            "egress": [],
        },
    }


@dataclass(frozen=True)
class KubernetesOptions:
    """What only the Kubernetes backend has, beside `base.SandboxOptions` (which both backends share).

    `configuration` is a `kubernetes.client.Configuration`; without it the in-cluster service account
    is used, else `kubeconfig`/`context` (or ~/.kube/config). `memory` is the pod's memory when
    FROGFIX_SANDBOX_MEMORY is set (None: the spec's `limits.memory_bytes`). `environment_size`
    (FROGFIX_ENVIRONMENT_SIZE) bounds the job pods' ENV_DIR volume. `python` is the image's interpreter
    for the init, the copy-in and the runner. `reclaim` lets the runner kill every other process in
    the pod when a fork bomb has used up the pod's pids (never in a setup pod: it would kill the
    tunnel). A broken exec stream is recovered at most `max_recoveries` times (kubernetes_recovery.py).
    The rest shapes the pod where the operator wants it (pull secrets, service account, runtime and
    priority classes, node selector, tolerations).
    """

    namespace: str = DEFAULT_NAMESPACE
    default_image: str = DEFAULT_IMAGE
    configuration: Any = None
    kubeconfig: str | None = None
    context: str | None = None
    memory: str | None = None
    ephemeral_storage: str = "6Gi"
    environment_size: str = "2Gi"
    python: str = "python3"
    reclaim: bool = True
    run_as_user: int = SANDBOX_UID
    image_pull_policy: str = "IfNotPresent"
    image_pull_secrets: Sequence[str] = ()
    service_account: str | None = None
    runtime_class: str | None = None
    priority_class: str | None = None
    node_selector: Mapping[str, str] | None = None
    tolerations: Sequence[Mapping[str, Any]] = ()
    api_timeout_s: float = 30.0
    delete_wait_s: float = 30.0
    max_recoveries: int = 2


@dataclass(frozen=True)
class PodShape:
    """What one sandbox's pods are made of besides the backend's options: its image, labels, env,
    deadline, resources and volume sizes (a recreated pod has the same shape, a shorter deadline).

    `environment_size`: a size-limited emptyDir at ENV_DIR for the job's test environment (copied
    in with the workspace) or, in a setup pod, for the one it builds."""

    image: str
    labels: Mapping[str, str]
    env: Mapping[str, str]
    deadline: str
    resources: Mapping[str, str]
    workspace_size: str
    tmp_size: str
    runner_dir_size: str = RUNNER_DIR_SIZE
    environment_size: str | None = None


def pod_manifest(name: str, options: KubernetesOptions, shape: PodShape, active_deadline_s: int) -> dict[str, Any]:
    """The sandbox pod: see the module docstring for why each field is what it is."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": dict(shape.labels),
            "annotations": {ANNOTATION_DEADLINE: shape.deadline},
        },
        "spec": _pod_spec(options, shape, active_deadline_s),
    }


def _pod_spec(options: KubernetesOptions, shape: PodShape, active_deadline_s: int) -> dict[str, Any]:
    """No host namespace, token or service link; non-root and restricted; DNS that fails at once."""
    uid = options.run_as_user
    restricted = {"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": uid}
    container = _container(shape, options.image_pull_policy, options.python, restricted)
    spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "shareProcessNamespace": False,
        "restartPolicy": "Never",
        "activeDeadlineSeconds": int(active_deadline_s),
        "terminationGracePeriodSeconds": 1,
        "hostname": HOSTNAME,
        "dnsPolicy": "None",
        "dnsConfig": {"nameservers": ["127.0.0.1"]},
        "securityContext": {**restricted, "fsGroup": uid, "seccompProfile": SECCOMP},
        "containers": [container],
        "volumes": [
            {"name": "workspace", "emptyDir": {"sizeLimit": shape.workspace_size}},
            {"name": "tmp", "emptyDir": {"sizeLimit": shape.tmp_size}},
            {"name": "frogfix", "emptyDir": {"sizeLimit": shape.runner_dir_size}},
        ],
    }
    if shape.environment_size is not None:
        spec["volumes"].append({"name": ENVIRONMENT_VOLUME, "emptyDir": {"sizeLimit": shape.environment_size}})
        container["volumeMounts"].append({"name": ENVIRONMENT_VOLUME, "mountPath": ENV_DIR})
    return spec | _placement(options)


def _placement(options: KubernetesOptions) -> dict[str, Any]:
    """The pod's fields that only an operator's options set: what it runs as and where it may run."""
    fields: dict[str, Any] = {}
    if options.service_account:
        fields["serviceAccountName"] = options.service_account
    if options.image_pull_secrets:
        fields["imagePullSecrets"] = [{"name": secret} for secret in options.image_pull_secrets]
    if options.runtime_class:
        fields["runtimeClassName"] = options.runtime_class
    if options.priority_class:
        fields["priorityClassName"] = options.priority_class
    if options.node_selector:
        fields["nodeSelector"] = dict(options.node_selector)
    if options.tolerations:
        fields["tolerations"] = [dict(toleration) for toleration in options.tolerations]
    return fields


def _container(shape: PodShape, pull_policy: str, python: str, restricted: Mapping[str, Any]) -> dict[str, Any]:
    """The pod's one container: the reaping init as its main process, nothing writable but the
    size-limited emptyDirs, no privilege of any kind."""
    return {
        "name": CONTAINER,
        "image": shape.image,
        "imagePullPolicy": pull_policy,
        "command": [python, "-I", "-S", "-B", "-c", INIT],
        "workingDir": WORKSPACE,
        "env": [{"name": key, "value": value} for key, value in shape.env.items()],
        "resources": {"requests": dict(shape.resources), "limits": dict(shape.resources)},
        "securityContext": {
            **restricted,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": SECCOMP,
        },
        "volumeMounts": [
            {"name": "workspace", "mountPath": WORKSPACE},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "frogfix", "mountPath": RUNNER_DIR},
        ],
    }


def pod_env(extra: Mapping[str, str]) -> dict[str, str]:
    """HOME and LANG plus what the job allows; never a FrogFix setting or a forge variable."""
    env = {"HOME": HOME, "LANG": "C.UTF-8"}
    for key, value in extra.items():
        if not re.fullmatch(r"[-._a-zA-Z][-._a-zA-Z0-9]*", key or ""):
            raise ValueError(f"invalid environment variable for the sandbox: {key!r}")
        if key.upper().startswith(FORBIDDEN_ENV_PREFIXES):
            raise ValueError(f"{key}: FrogFix settings and forge variables (tokens, secrets) never enter a sandbox")
        if "\0" in str(value):
            raise ValueError(f"invalid value for {key}: NUL byte")
        env[key] = str(value)
    return env


def job_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """The job's labels for the pod and policy: a key without a prefix gets `frogfix/`."""
    out = {}
    for key, value in labels.items():
        full = key if "/" in key else LABEL_PREFIX + key
        prefix, _, name = full.rpartition("/")
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?", prefix) or not re.fullmatch(
            r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", name
        ):
            raise ValueError(f"invalid label key for a sandbox: {key!r}")
        out[full] = label_value(str(value))
    return out


def label_value(value: str) -> str:
    """Any text as a valid label value (63 chars of [A-Za-z0-9._-], alphanumeric at both ends)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", value)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)


def sandbox_name(labels: Mapping[str, str]) -> str:
    """`frogfix-<job>-<attempt>-<random>`: a DNS label with room for a `-r<n>` recovery suffix."""
    parts = ["frogfix"]
    for key in ("job", "attempt"):
        value = next((v for k, v in labels.items() if k.rpartition("/")[2] == key), None)
        if value:
            parts.append(re.sub(r"[^a-z0-9]+", "-", str(value).lower()).strip("-")[:16])
    suffix = secrets.token_hex(4)
    base = "-".join(p for p in parts if p)[: 63 - 4 - len(suffix) - 1].strip("-")
    return f"{base}-{suffix}"


def check_storage(workspace_bytes: int, tmp_bytes: int, ephemeral_storage: str) -> None:
    """The emptyDirs (workspace, /tmp, the runner's folder) must fit the pod's ephemeral storage."""
    needed = workspace_bytes + tmp_bytes + parse_quantity(RUNNER_DIR_SIZE)
    if needed > parse_quantity(ephemeral_storage):
        raise ValueError(
            f"workspace_size {format_quantity(workspace_bytes)} + tmp_size {format_quantity(tmp_bytes)} + "
            f"{RUNNER_DIR_SIZE} exceed ephemeral_storage {ephemeral_storage}"
        )


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def login_profile(env: Mapping[str, str]) -> bytes:
    """HOME's .bash_profile: the Bash tool's `bash -lc` reads the image's /etc/profile, which on
    Debian-based images resets PATH; this puts back the PATH the pod was started with (a built
    environment's bin first). Nothing when the job sets no PATH."""
    if "PATH" not in env:
        return b""
    return (
        "# FrogFix: a login shell keeps the PATH the sandbox was started with.\n"
        f"export PATH={shlex.quote(env['PATH'])}\n"
    ).encode()


def in_runner_dir(path: str) -> str:
    """The copy-in tar's name for a path under RUNNER_DIR (its members go under `frogfix/`)."""
    return "frogfix/" + os.path.relpath(path, RUNNER_DIR)


def tar_entry(info: tarfile.TarInfo, uid: int) -> tarfile.TarInfo | None:
    """Owned by the sandbox user; folders stay writable to it; no device files."""
    if info.ischr() or info.isblk():
        return None
    info.uid = info.gid = uid
    info.uname = info.gname = ""
    if info.isdir():
        info.mode |= 0o700
    return info
