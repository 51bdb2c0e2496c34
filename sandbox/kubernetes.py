"""The Kubernetes sandbox backend: one pod per attempt, driven over one long-lived exec stream.

Why it is built this way:
- The pod never has network, not even while it starts: a NetworkPolicy that selects it and
  denies all ingress and egress is created *before* the pod (the sandbox namespace also has a
  default-deny policy from deploy/). Exec and the workspace copy go through the API server and
  the kubelet, not through the pod's network, so they still work.
- The pod holds nothing it should not: no service-account token, no service links, no secrets,
  no FrogFix or forge variables; non-root, read-only root filesystem (the workspace, /tmp and the
  runner's folder are size-limited emptyDirs), no privilege escalation, every capability dropped,
  seccomp RuntimeDefault; requests equal limits (cpu, memory, ephemeral storage), so the pod is
  Guaranteed and cannot starve its node; `activeDeadlineSeconds` is the job's time limit; DNS
  points at 127.0.0.1 so a lookup fails at once instead of timing out.
- The workspace goes in as one tar stream over exec (with the runner beside it), extracted by
  the image's python3, so a target image needs only python3 (and git, bash) -- no tar, no
  baked-in FrogFix. Nothing is written back to the host: the patch is taken inside, by the runner.
- The runner (`runner.py`, the same JSON-lines protocol as the local backend) then runs as one
  exec whose WebSocket stays open: a tool call is one message out and one reply back, not a new
  exec (Leaf pays copy-in, check and a fresh Python start per call).
- A broken stream (API server restart, node trouble, proxy timeout) is recovered: the pod is
  recreated from the untouched host workspace and every recorded mutating call (Write, Edit,
  Bash, pipeline commands, patches) is replayed; each replayed result must match what the
  caller saw (Write/Edit: the exact text; Bash: its status line; commands: exit code; patch:
  its bytes), otherwise the sandbox fails instead of silently diverging. The call that was in
  flight is then sent again, once.
- Pods and the policy are deleted on `close()` whatever happened (also at interpreter exit);
  `reap()` deletes whatever a killed worker left, once it is past its deadline.

Each sandbox owns its own ApiClient: `kubernetes.stream.stream()` swaps the client's transport
for the duration of an exec call, which must not leak into another thread's API calls.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import logging
import math
import os
import re
import secrets
import socket
import tarfile
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, cast

from websocket import ABNF, WebSocketTimeoutException

from sandbox.base import CommandResult, SandboxError, SandboxSpec, SandboxUnavailable
from sandbox.runner import bash_timeout

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
MUTATING_TOOLS = frozenset({"Write", "Edit", "Bash"})
# Waiting reasons that will not fix themselves: fail the start now instead of at the timeout.
FATAL_WAITING = frozenset(
    {"ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError", "CrashLoopBackOff"}
)
FORBIDDEN_ENV_PREFIXES = ("FROGFIX_", "GITLAB_", "GITEA_", "FORGEJO_")
STDIN, STDOUT, STDERR, STATUS = 0, 1, 2, 3
V5_PROTOCOL = "v5.channel.k8s.io"
FRAME_BYTES = 256 * 1024
MAX_REPLY_BYTES = 512 * 1024**2
STDERR_TAIL_BYTES = 16 * 1024
POLL_SLICE_S = 0.5

# The pod's main process: an init that reaps orphans (exec'd processes re-parent to it) and
# exits on SIGTERM. Any image with python3 can run it; nothing is baked into the image.
INIT = (
    "import os, signal\n"
    "wanted = {signal.SIGCHLD, signal.SIGTERM, signal.SIGINT}\n"
    "signal.pthread_sigmask(signal.SIG_BLOCK, wanted)\n"
    "while signal.sigwait(wanted) == signal.SIGCHLD:\n"
    "    try:\n"
    "        while os.waitpid(-1, os.WNOHANG)[0] > 0:\n"
    "            pass\n"
    "    except ChildProcessError:\n"
    "        pass\n"
)

# Runs inside the pod (Python 3.8+, stdlib): extracts the tar on stdin. Members under
# `workspace/` go to argv[1], under `frogfix/` to argv[2]; argv[3] (HOME) is created too.
EXTRACT = (
    "import os, sys, tarfile\n"
    "dest = {'workspace': sys.argv[1], 'frogfix': sys.argv[2]}\n"
    "for folder in sys.argv[1:]:\n"
    "    os.makedirs(folder, exist_ok=True)\n"
    "kw = {'filter': 'tar'} if hasattr(tarfile, 'tar_filter') else {}\n"
    "count = 0\n"
    "with tarfile.open(fileobj=sys.stdin.buffer, mode='r|') as archive:\n"
    "    for member in archive:\n"
    "        top, _, rest = member.name.partition('/')\n"
    "        if top not in dest:\n"
    "            raise SystemExit('unexpected member %r' % member.name)\n"
    "        if not rest:\n"
    "            continue\n"
    "        member.name = rest\n"
    "        if member.islnk():\n"
    "            member.linkname = member.linkname.partition('/')[2]\n"
    "        archive.extract(member, dest[top], **kw)\n"
    "        count += 1\n"
    "print(count)\n"
)


class _StreamBroken(Exception):
    """The exec stream to the runner is gone (transport failure or the runner exited)."""


# ----------------------------------------------------------------------------- manifests


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


def pod_manifest(
    name: str,
    namespace: str,
    *,
    image: str,
    labels: Mapping[str, str],
    env: Mapping[str, str],
    deadline: str,
    active_deadline_s: int,
    resources: Mapping[str, str],
    workspace_size: str,
    tmp_size: str,
    python: str = "python3",
    run_as_user: int = SANDBOX_UID,
    image_pull_policy: str = "IfNotPresent",
    image_pull_secrets: Sequence[str] = (),
    service_account: str | None = None,
    runtime_class: str | None = None,
    priority_class: str | None = None,
    node_selector: Mapping[str, str] | None = None,
    tolerations: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The sandbox pod: see the module docstring for why each field is what it is."""
    restricted = {"runAsNonRoot": True, "runAsUser": run_as_user, "runAsGroup": run_as_user}
    seccomp = {"type": "RuntimeDefault"}
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
        "securityContext": {**restricted, "fsGroup": run_as_user, "seccompProfile": seccomp},
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "imagePullPolicy": image_pull_policy,
                "command": [python, "-I", "-S", "-B", "-c", INIT],
                "workingDir": WORKSPACE,
                "env": [{"name": key, "value": value} for key, value in env.items()],
                "resources": {"requests": dict(resources), "limits": dict(resources)},
                "securityContext": {
                    **restricted,
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": seccomp,
                },
                "volumeMounts": [
                    {"name": "workspace", "mountPath": WORKSPACE},
                    {"name": "tmp", "mountPath": "/tmp"},
                    {"name": "frogfix", "mountPath": RUNNER_DIR},
                ],
            }
        ],
        "volumes": [
            {"name": "workspace", "emptyDir": {"sizeLimit": workspace_size}},
            {"name": "tmp", "emptyDir": {"sizeLimit": tmp_size}},
            {"name": "frogfix", "emptyDir": {"sizeLimit": RUNNER_DIR_SIZE}},
        ],
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    if image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": secret} for secret in image_pull_secrets]
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if tolerations:
        spec["tolerations"] = [dict(toleration) for toleration in tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels),
            "annotations": {ANNOTATION_DEADLINE: deadline},
        },
        "spec": spec,
    }


# ----------------------------------------------------------------------------- the backend


@dataclass
class _Entry:
    """One mutating call already answered: what to send again and what it must answer."""

    label: str
    payload: dict[str, Any]
    timeout: float
    expected: str


class KubernetesSandbox:
    """One pod per sandbox, driven through one exec stream; implements `sandbox.base.Sandbox`."""

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        default_image: str = DEFAULT_IMAGE,
        configuration: Any = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        cpu: str = "2",
        memory: str | None = None,
        ephemeral_storage: str = "6Gi",
        workspace_size: str = "4Gi",
        tmp_size: str = "1Gi",
        image_pull_policy: str = "IfNotPresent",
        image_pull_secrets: Sequence[str] = (),
        service_account: str | None = None,
        runtime_class: str | None = None,
        priority_class: str | None = None,
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[Mapping[str, Any]] = (),
        run_as_user: int = SANDBOX_UID,
        python: str = "python3",
        reclaim: bool = True,
        start_timeout_s: float = 300.0,
        tool_timeout_s: float = 300.0,
        reply_grace_s: float = 30.0,
        api_timeout_s: float = 30.0,
        delete_wait_s: float = 30.0,
        max_patch_bytes: int = 64 * 1024**2,
        max_recoveries: int = 2,
        runner_script: str | None = None,
    ) -> None:
        """Create the policy, then the pod; copy the workspace in; start the runner.

        Raises SandboxUnavailable when any of that fails (after deleting what was created).
        `configuration` is a `kubernetes.client.Configuration`; without it the in-cluster
        service account is used, else `kubeconfig`/`context` (or ~/.kube/config).
        `memory` defaults to `spec.limits.memory_bytes`. `reclaim` lets the runner kill every
        other process in the pod when a fork bomb has used up the pod's pids.
        """
        self.spec = spec
        self.limits = spec.limits
        self.namespace = namespace
        self.image = spec.image or default_image
        self.python = python
        self.reclaim = reclaim
        self.start_timeout_s = start_timeout_s
        self.tool_timeout_s = tool_timeout_s
        self.reply_grace_s = reply_grace_s
        self.api_timeout_s = api_timeout_s
        self.max_patch_bytes = max_patch_bytes
        self.max_recoveries = max_recoveries
        self.recoveries = 0
        self.runner_info: dict[str, Any] = {}
        self.workspace = os.path.realpath(spec.workspace)
        if not os.path.isdir(self.workspace):
            raise SandboxError(f"workspace {spec.workspace} is not a directory")
        if not self.image or any(ch.isspace() for ch in self.image):
            raise ValueError(f"invalid sandbox image {self.image!r}")
        memory = memory or _quantity(spec.limits.memory_bytes)
        self.resources = {"cpu": cpu, "memory": memory, "ephemeral-storage": ephemeral_storage}
        if parse_quantity(workspace_size) + parse_quantity(tmp_size) + parse_quantity(RUNNER_DIR_SIZE) > parse_quantity(
            ephemeral_storage
        ):
            raise ValueError(
                f"workspace_size {workspace_size} + tmp_size {tmp_size} + {RUNNER_DIR_SIZE} exceed "
                f"ephemeral_storage {ephemeral_storage}"
            )
        self.env = pod_env(spec.env)
        self.name = sandbox_name(spec.labels)
        self.labels = {**COMMON_LABELS, **job_labels(spec.labels), LABEL_SANDBOX: self.name}
        wall = spec.limits.wall_seconds
        self._wall_s = wall if math.isfinite(wall) and wall > 0 else 7 * 24 * 3600.0
        self._deadline = time.monotonic() + self._wall_s
        self.deadline_at = _rfc3339(time.time() + self._wall_s)
        self._pod_options: dict[str, Any] = {
            "image": self.image,
            "labels": self.labels,
            "env": self.env,
            "deadline": self.deadline_at,
            "resources": self.resources,
            "workspace_size": workspace_size,
            "tmp_size": tmp_size,
            "python": python,
            "run_as_user": run_as_user,
            "image_pull_policy": image_pull_policy,
            "image_pull_secrets": tuple(image_pull_secrets),
            "service_account": service_account,
            "runtime_class": runtime_class,
            "priority_class": priority_class,
            "node_selector": node_selector,
            "tolerations": tuple(tolerations),
        }
        script = runner_script or os.path.join(os.path.dirname(os.path.abspath(__file__)), "runner.py")
        with open(script, "rb") as handle:
            self._runner_source = handle.read()
        self.pod_name = ""
        self._generation = 0
        self._seq = 0
        self._journal: list[_Entry] = []
        self._lock = threading.Lock()
        self._state_lock = threading.Lock()
        self._closed = False
        self._dead: str | None = None

        self._res = _Resources(_api_client(configuration, kubeconfig, context), namespace, delete_wait_s, api_timeout_s)
        # Runs once: on close(), or at interpreter exit if the caller never closed the sandbox.
        self._finalizer = weakref.finalize(self, _release, self._res)
        try:
            self._create_policy()
            self._start_pod()
        except BaseException as exc:
            self._closed = True
            self._finalizer()
            if isinstance(exc, SandboxError) or not isinstance(exc, Exception):
                raise
            raise SandboxUnavailable(f"cannot start the Kubernetes sandbox: {_describe(exc)}") from exc

    # ------------------------------------------------------------------------- the protocol

    def call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """Run one Leaf tool call; returns Leaf's exact text (a tool's own errors included)."""
        if name == "Bash" and isinstance(arguments, dict):
            try:
                timeout = bash_timeout(arguments, self.limits.default_tool_timeout)
            except ValueError:
                timeout = self.limits.default_tool_timeout
            deadline = timeout + self.reply_grace_s
        else:
            deadline = self.tool_timeout_s
        payload = {"op": "tool", "name": name, "arguments": _plain(arguments)}
        reply = self._request(payload, deadline)
        output = self._field(reply, "output", str)
        if name in MUTATING_TOOLS:
            self._record(f"{name} call", payload, deadline, _tool_outcome(name, output))
        return str(output)

    def run_command(self, command: str, timeout: float) -> CommandResult:
        """Run a pipeline command (tests, setup) with its own timeout; the log is head+tail bounded."""
        payload = {"op": "exec", "command": command, "timeout": timeout, "log_limit": self.limits.output_bytes}
        reply = self._request(payload, timeout + self.reply_grace_s)
        result = CommandResult(
            command=command,
            exit_code=self._field(reply, "exit_code", int),
            log=self._field(reply, "log", str),
            timed_out=self._field(reply, "timed_out", bool),
            duration_s=float(self._field(reply, "duration_s", (int, float))),
        )
        self._record("command", payload, timeout + self.reply_grace_s, _exec_outcome(reply))
        return result

    def patch(self, base_commit: str) -> str:
        """The patch as text; undecodable bytes are kept as surrogates (encode with
        'surrogateescape' to get the exact bytes back), or use `patch_bytes`."""
        return self.patch_bytes(base_commit).decode("utf-8", "surrogateescape")

    def patch_bytes(self, base_commit: str) -> bytes:
        """`git add -A` then `git diff --cached --binary <base_commit>`, taken inside the pod."""
        payload = {"op": "patch", "base": base_commit, "max_bytes": self.max_patch_bytes}
        reply = self._request(payload, 600.0 + self.reply_grace_s)
        encoded = self._field(reply, "patch_b64", str)
        try:
            patch = base64.b64decode(encoded, validate=True)
        except ValueError:
            raise self._fail("the runner sent a patch that is not base64") from None
        # `git add -A` changed the index, which later `git status`/`git diff` calls show.
        self._record("patch", payload, 600.0 + self.reply_grace_s, _patch_outcome(reply))
        return patch

    def ping(self) -> dict[str, Any]:
        """Round-trip a no-op; returns the runner's pid, uid and Python version."""
        return self._request({"op": "ping"}, self.tool_timeout_s)

    def exec_once(
        self, argv: list[str], stdin: bytes | None = None, timeout: float = 120.0
    ) -> tuple[int, bytes, bytes]:
        """One separate exec in the current pod: (exit code, stdout, stderr). This is Leaf's
        transport (a new exec per step); kept for diagnostics and for bench/sandbox.py."""
        with self._lock:
            self._check_usable()
            stream = self._open_exec(self.pod_name, argv, stdin=stdin is not None)
            try:
                if stdin:
                    stream.send(stdin)
                if stdin is not None:
                    stream.close_stdin()
                code = stream.wait_exit(time.monotonic() + timeout)
                return code, bytes(stream.out), stream.err.data()
            finally:
                stream.close()

    def close(self) -> None:
        """Stop the runner and delete the pods and the policy; idempotent, never raises."""
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        stream = self._res.stream
        if stream is not None:
            stream.abort()  # wakes a call blocked on the stream in another thread
        self._finalizer()

    def __enter__(self) -> KubernetesSandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else (self._dead or "open")
        return f"<KubernetesSandbox {self.namespace}/{self.pod_name or self.name} {state}>"

    # ------------------------------------------------------------------------- start

    def pod_manifest(self, name: str | None = None) -> dict[str, Any]:
        """The pod this sandbox creates (now: the deadline shrinks for a recreated pod)."""
        remaining = max(1, math.ceil(self._deadline - time.monotonic()))
        return pod_manifest(name or self.name, self.namespace, active_deadline_s=remaining, **self._pod_options)

    def policy_manifest(self) -> dict[str, Any]:
        return network_policy_manifest(self.name, self.namespace, self.labels, self.deadline_at)

    def _create_policy(self) -> None:
        res = self._res
        with res.lock:
            res.policy = self.name
        with res.api_lock:
            res.net.create_namespaced_network_policy(
                self.namespace, self.policy_manifest(), _request_timeout=self.api_timeout_s
            )

    def _start_pod(self) -> None:
        """Create the pod (policy already in place), wait for it, copy in, start the runner."""
        name = self.name if self._generation == 0 else f"{self.name}-r{self._generation}"
        res = self._res
        with res.lock:
            if res.released:
                raise SandboxError("the sandbox is closed")
            res.pods.append(name)
        manifest = self.pod_manifest(name)
        with res.api_lock:
            res.core.create_namespaced_pod(self.namespace, manifest, _request_timeout=self.api_timeout_s)
        if res.released:  # close() ran while we were creating: it may have missed this pod
            _delete_pod(res, name)
            raise SandboxError("the sandbox is closed")
        self.pod_name = name
        self._wait_running(name)
        self._upload(name)
        argv = [self.python, "-I", "-S", "-B", RUNNER_PATH, "--root", WORKSPACE]
        argv += [
            "--limits",
            json.dumps(self._rlimits()),
            "--default-timeout",
            repr(float(self.limits.default_tool_timeout)),
        ]
        if self.reclaim:
            argv.append("--reclaim")
        res.stream = self._open_exec(name, argv)
        try:
            self.runner_info = self._exchange({"op": "ping"}, self.start_timeout_s)
        except _StreamBroken as exc:
            raise SandboxUnavailable(f"the sandbox runner did not start in pod {name}: {exc}") from None

    def _rlimits(self) -> dict[str, int]:
        """No RLIMIT_NPROC or RLIMIT_AS here: in a pod they would count every container of the
        same uid on the node; the pod's pids limit and memory limit (cgroups) bound it instead."""
        rlimits = {"fsize": int(self.limits.file_size_bytes), "core": 0}
        if math.isfinite(self.limits.wall_seconds) and self.limits.wall_seconds > 0:
            rlimits["cpu"] = max(1, math.ceil(self.limits.wall_seconds))
        return rlimits

    def _wait_running(self, name: str) -> None:
        res = self._res
        deadline = time.monotonic() + self.start_timeout_s
        delay = 0.05
        last = "no status yet"
        while True:
            if res.released:
                raise SandboxError("the sandbox is closed")
            with res.api_lock:
                pod = res.core.read_namespaced_pod(name, self.namespace, _request_timeout=self.api_timeout_s)
            status = pod.status
            phase = getattr(status, "phase", None)
            containers = [c for c in (getattr(status, "container_statuses", None) or []) if c.name == CONTAINER]
            state = containers[0].state if containers else None
            if phase == "Running" and state is not None and state.running is not None:
                return
            if phase in ("Failed", "Succeeded"):
                raise SandboxUnavailable(
                    f"pod {name} ended before it started: {phase} {getattr(status, 'reason', '') or ''} "
                    f"{getattr(status, 'message', '') or ''}".strip()
                )
            waiting = state.waiting if state is not None else None
            if waiting is not None and waiting.reason in FATAL_WAITING:
                raise SandboxUnavailable(
                    f"pod {name} cannot start (image {self.image}): {waiting.reason}: {waiting.message or ''}".strip()
                )
            last = _pod_summary(phase, waiting, getattr(status, "conditions", None))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxUnavailable(f"pod {name} did not start within {self.start_timeout_s:g}s ({last})")
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 1.0)

    def _upload(self, name: str) -> None:
        """The workspace and the runner, as one tar stream into the pod's emptyDirs."""
        argv = [self.python, "-I", "-S", "-B", "-c", EXTRACT, WORKSPACE, RUNNER_DIR, HOME]
        stream = self._open_exec(name, argv)
        try:
            try:
                writer = _StdinWriter(stream)
                uid = int(self._pod_options["run_as_user"])
                with tarfile.open(fileobj=cast(Any, writer), mode="w|", format=tarfile.PAX_FORMAT) as archive:
                    archive.add(self.workspace, arcname="workspace", filter=lambda info: _tar_entry(info, uid))
                    runner = tarfile.TarInfo("frogfix/runner.py")
                    runner.size, runner.mode, runner.mtime = len(self._runner_source), 0o444, int(time.time())
                    archive.addfile(runner, io.BytesIO(self._runner_source))
                writer.flush()
                stream.close_stdin()
            except _StreamBroken:
                pass  # the extractor died early: its exit status and stderr say why
            code = stream.wait_exit(time.monotonic() + self.start_timeout_s)
        except _StreamBroken as exc:
            raise SandboxUnavailable(f"copying the workspace into pod {name} failed: {exc}") from None
        finally:
            stream.close()
        if code != 0:
            detail = stream.err.text() or bytes(stream.out[-2000:]).decode("utf-8", "replace")
            raise SandboxUnavailable(f"copying the workspace into pod {name} failed (exit {code}): {detail}")

    def _open_exec(self, name: str, argv: list[str], stdin: bool = True) -> _ExecStream:
        from kubernetes.stream import stream

        res = self._res
        try:
            with res.api_lock:
                ws = stream(
                    res.core.connect_get_namespaced_pod_exec,
                    name,
                    self.namespace,
                    command=argv,
                    container=CONTAINER,
                    stdin=stdin,
                    stdout=True,
                    stderr=True,
                    tty=False,
                    binary=True,
                    _preload_content=False,
                )
        except Exception as exc:
            raise _StreamBroken(f"cannot open an exec stream to pod {name}: {_describe(exc)}") from None
        return _ExecStream(ws)

    # ------------------------------------------------------------------------- requests

    def _request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        with self._lock:
            self._check_usable()
            retried = False
            while True:
                try:
                    reply = self._exchange(payload, timeout)
                except _StreamBroken as exc:
                    self._check_usable()
                    if time.monotonic() >= self._deadline:
                        raise self._fail(self._wall_message()) from None
                    if retried:
                        raise self._fail(f"the sandbox stream broke again on the same call ({exc})") from None
                    retried = True
                    self._recover(str(exc))
                    continue
                if reply.get("ok") is not True:
                    raise SandboxError(f"sandbox runner: {reply.get('error', 'unknown error')}")
                return reply

    def _exchange(self, payload: dict[str, Any], timeout: float) -> dict[str, Any]:
        """One request line out, one reply line in, on the current stream."""
        stream = self._res.stream
        if stream is None:
            raise _StreamBroken("no runner stream")
        self._seq += 1
        rid = self._seq
        line = json.dumps({"id": rid, **payload}, ensure_ascii=True, default=str).encode("ascii")
        stream.send(line + b"\n")
        wall = self._deadline + self.reply_grace_s
        limit = min(time.monotonic() + timeout, wall)
        raw = stream.read_line(limit, lambda: self._closed)
        if raw is None:
            if time.monotonic() >= self._deadline:
                raise self._fail(self._wall_message())
            raise self._fail(f"the sandbox runner did not answer within {timeout:.0f}s")
        try:
            reply = json.loads(raw)
        except ValueError:
            raise self._fail(f"the sandbox runner sent a line that is not JSON: {raw[:200]!r}") from None
        if not isinstance(reply, dict) or reply.get("id") != rid:
            raise self._fail(f"the sandbox runner sent an unexpected reply: {raw[:200]!r}")
        return reply

    def _recover(self, reason: str) -> None:
        """A fresh pod from the untouched workspace, then every recorded mutating call again."""
        while True:
            if self.recoveries >= self.max_recoveries:
                raise self._fail(
                    f"the sandbox stream broke ({reason}) and {self.max_recoveries} recoveries are used up"
                )
            self.recoveries += 1
            log.warning(
                "sandbox %s: stream to pod %s broke (%s); recreating it and replaying %d calls (recovery %d of %d)",
                self.name, self.pod_name, reason, len(self._journal), self.recoveries, self.max_recoveries,
            )  # fmt: skip
            old_stream, old_pod = self._res.stream, self.pod_name
            self._res.stream = None
            if old_stream is not None:
                old_stream.close()
            _delete_pod(self._res, old_pod)
            self._generation += 1
            try:
                self._start_pod()
                for index, entry in enumerate(self._journal, start=1):
                    reply = self._exchange(entry.payload, entry.timeout)
                    got = _outcome_of(entry, reply)
                    if got != entry.expected:
                        raise self._fail(
                            f"recovery replay diverged at mutating call {index} of {len(self._journal)} "
                            f"({entry.label}): expected {entry.expected[:200]!r}, got {got[:200]!r}"
                        )
                return
            except _StreamBroken as exc:
                reason = str(exc)
                self._check_usable()
            except SandboxError as exc:
                if self._dead is None and not self._closed:
                    raise self._fail(f"recovering the sandbox failed: {exc}") from None
                raise
            except Exception as exc:
                raise self._fail(f"recovering the sandbox failed: {_describe(exc)}") from None

    def _record(self, label: str, payload: dict[str, Any], timeout: float, expected: str) -> None:
        self._journal.append(_Entry(label, json.loads(json.dumps(payload, default=str)), timeout, expected))

    def _check_usable(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox is closed")
        if self._dead is not None:
            raise SandboxError(self._dead)

    def _wall_message(self) -> str:
        return f"the sandbox reached its wall-clock limit of {self.limits.wall_seconds:g}s"

    def _field(self, reply: dict[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
        value = reply.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self._fail(f"the sandbox runner sent a reply without a valid {key!r}")
        return value

    def _fail(self, message: str) -> SandboxError:
        """Mark the sandbox unusable and build the error for the caller to raise."""
        stream = self._res.stream
        if stream is not None:
            tail = stream.err.text()
            if tail and "stderr:" not in message:
                message = f"{message}; stderr: {tail}"
            stream.abort()
        self._dead = message
        return SandboxError(message)


# ----------------------------------------------------------------------------- the stream


class _ExecStream:
    """One exec's WebSocket: stdin frames out; stdout, stderr and the exit Status in.

    Frames are read straight off the client's socket with short timeouts (a partial frame is
    kept and resumed), so a reply of any size is assembled in one buffer and a reader can notice
    `close()` from another thread.
    """

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.sock = ws.sock
        self.v5 = getattr(ws, "subprotocol", None) == V5_PROTOCOL
        self.out = bytearray()
        self.err = _Tail(STDERR_TAIL_BYTES)
        self.status: dict[str, Any] | None = None
        self._scan = 0
        self._gone: str | None = None

    def send(self, data: bytes) -> None:
        if self._gone is not None:
            raise _StreamBroken(self._gone)
        try:
            for start in range(0, len(data), FRAME_BYTES):
                self.ws.write_channel(STDIN, data[start : start + FRAME_BYTES])
        except Exception as exc:
            self._gone = f"writing to the exec stream failed: {_describe(exc)}"
            raise _StreamBroken(self._gone) from None

    def close_stdin(self) -> None:
        """End of input (v5 only; over v4 the extractor stops at the tar's end marker)."""
        if self.v5 and self._gone is None:
            with contextlib.suppress(Exception):
                self.ws.close_channel(STDIN)

    def read_line(self, deadline: float, cancelled: Callable[[], bool]) -> bytes | None:
        """The next stdout line; None at the deadline; _StreamBroken when the stream ends."""
        while True:
            index = self.out.find(b"\n", self._scan)
            if index >= 0:
                line = bytes(self.out[:index])
                del self.out[: index + 1]
                self._scan = 0
                return line
            self._scan = len(self.out)
            if len(self.out) > MAX_REPLY_BYTES:
                raise _StreamBroken(f"the runner sent a reply line longer than {MAX_REPLY_BYTES} bytes")
            if self.status is not None:
                raise _StreamBroken(f"the runner exited ({_status_text(self.status)})")
            if cancelled():
                raise SandboxError("the sandbox is closed")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self._pump(min(remaining, POLL_SLICE_S))

    def wait_exit(self, deadline: float) -> int:
        """Read until the exit Status arrives; returns the exit code."""
        while self.status is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _StreamBroken("the command did not finish in time")
            self._pump(min(remaining, POLL_SLICE_S))
        return _exit_code(self.status)

    def _pump(self, timeout: float) -> None:
        """Take one frame off the socket, or return after `timeout`."""
        if self._gone is not None:
            raise _StreamBroken(self._gone)
        try:
            self.sock.settimeout(max(timeout, 0.001))
            opcode, frame = self.sock.recv_data_frame(True)
        except WebSocketTimeoutException:
            return
        except Exception as exc:
            self._gone = f"the exec stream broke: {_describe(exc)}"
            raise _StreamBroken(self._gone) from None
        if opcode == ABNF.OPCODE_CLOSE:
            self._gone = "the API server closed the exec stream"
            if self.status is not None:
                return
            raise _StreamBroken(self._gone)
        if opcode not in (ABNF.OPCODE_BINARY, ABNF.OPCODE_TEXT):
            return
        data = frame.data if isinstance(frame.data, bytes) else str(frame.data).encode("utf-8")
        if not data:
            return
        channel, payload = data[0], data[1:]
        if channel == STDOUT:
            self.out += payload
        elif channel == STDERR:
            self.err.add(payload)
        elif channel == STATUS and payload:
            try:
                status = json.loads(payload)
            except ValueError:
                status = {"status": "Failure", "message": payload.decode("utf-8", "replace")}
            self.status = status if isinstance(status, dict) else {"status": "Failure", "message": str(status)}

    def abort(self) -> None:
        """Cut the connection from any thread; a blocked reader wakes up with _StreamBroken."""
        self._gone = self._gone or "the exec stream was closed"
        raw = getattr(self.sock, "sock", None)
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._gone = self._gone or "the exec stream was closed"
        with contextlib.suppress(Exception):
            self.ws.close(timeout=1)


class _StdinWriter:
    """A file-like sink for tarfile that sends big stdin frames (tarfile writes 10 KiB records)."""

    def __init__(self, stream: _ExecStream) -> None:
        self.stream = stream
        self.buffer = bytearray()

    def write(self, data: bytes) -> int:
        self.buffer += data
        if len(self.buffer) >= FRAME_BYTES:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self.buffer:
            data, self.buffer = bytes(self.buffer), bytearray()
            self.stream.send(data)


class _Tail:
    """The last bytes of the runner's stderr, for error messages."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data = bytearray()

    def add(self, chunk: bytes) -> None:
        self._data += chunk
        del self._data[: -self.size]

    def data(self) -> bytes:
        return bytes(self._data)

    def text(self) -> str:
        return self._data.decode("utf-8", "replace").strip()


# ----------------------------------------------------------------------------- cluster side


class _Resources:
    """What a sandbox holds in the cluster; kept apart from the sandbox so a finalizer can free it."""

    def __init__(self, api: Any, namespace: str, delete_wait_s: float, api_timeout_s: float) -> None:
        from kubernetes import client

        self.api = api
        self.core: Any = client.CoreV1Api(api)
        self.net: Any = client.NetworkingV1Api(api)
        self.namespace = namespace
        self.delete_wait_s = delete_wait_s
        self.api_timeout_s = api_timeout_s
        self.policy: str | None = None
        self.pods: list[str] = []
        self.stream: _ExecStream | None = None
        self.api_lock = threading.RLock()  # stream() swaps the client's transport while it connects
        self.lock = threading.Lock()
        self.released = False


def _release(res: _Resources) -> None:
    """Delete every pod of the sandbox, wait until they are gone, then delete the policy.

    The policy goes last so that no pod of this sandbox is ever without it. If a pod is still
    terminating after `delete_wait_s`, the policy stays for `reap()` (and the namespace's
    default-deny policy still covers the pod).
    """
    with res.lock:
        if res.released:
            return
        res.released = True
        pods, policy = list(res.pods), res.policy
    if res.stream is not None:
        res.stream.abort()
        res.stream.close()
    try:
        for pod in pods:
            _delete_pod(res, pod)
        if _wait_gone(res, pods) and policy is not None:
            try:
                with res.api_lock:
                    res.net.delete_namespaced_network_policy(policy, res.namespace, _request_timeout=res.api_timeout_s)
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    log.warning(
                        "sandbox: cannot delete network policy %s/%s: %s", res.namespace, policy, _describe(exc)
                    )
        elif policy is not None:
            log.warning("sandbox: pods of %s are still terminating; the reaper will delete its policy", policy)
    finally:
        close = getattr(res.api, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                close()


def _delete_pod(res: _Resources, name: str) -> None:
    if not name:
        return
    try:
        with res.api_lock:
            res.core.delete_namespaced_pod(
                name, res.namespace, grace_period_seconds=0, propagation_policy="Background",
                _request_timeout=res.api_timeout_s,
            )  # fmt: skip
    except Exception as exc:
        if getattr(exc, "status", None) != 404:
            log.warning("sandbox: cannot delete pod %s/%s: %s", res.namespace, name, _describe(exc))


def _wait_gone(res: _Resources, pods: Iterable[str]) -> bool:
    """True once none of `pods` exists any more (False after `delete_wait_s`)."""
    left = [pod for pod in pods if pod]
    deadline = time.monotonic() + res.delete_wait_s
    delay = 0.05
    while left:
        still = []
        for pod in left:
            try:
                with res.api_lock:
                    res.core.read_namespaced_pod(pod, res.namespace, _request_timeout=res.api_timeout_s)
                still.append(pod)
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    still.append(pod)
        left = still
        if not left:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.5)
    return True


def reap(
    namespace: str = DEFAULT_NAMESPACE,
    older_than_s: float | None = None,
    api: Any = None,
    *,
    grace_s: float = 60.0,
    orphan_policy_s: float = 600.0,
    now: float | None = None,
) -> list[str]:
    """Delete sandbox pods and policies that a dead worker left behind; returns what went.

    An object (labelled `frogfix/sandbox`) goes once it is past its own deadline annotation plus
    `grace_s`, or older than `older_than_s` when that is given (a cap for objects without a
    usable annotation). A policy whose sandbox has no pod left also goes after `orphan_policy_s`.
    Pods go first, and a policy goes only when no live pod of its sandbox is left (a pod past its
    deadline has already been stopped by the kubelet: activeDeadlineSeconds). `api` is an
    ApiClient or a Configuration (default: in-cluster, else kubeconfig). Names come back as
    `pod/<name>` and `networkpolicy/<name>`.
    """
    from kubernetes import client

    api_client = api if isinstance(api, client.ApiClient) else _api_client(api, None, None)
    core: Any = client.CoreV1Api(api_client)
    net: Any = client.NetworkingV1Api(api_client)
    current = time.time() if now is None else now
    removed: list[str] = []
    pods = core.list_namespaced_pod(namespace, label_selector=LABEL_SANDBOX).items
    live_sandboxes = set()
    for pod in pods:
        if _stale(pod.metadata, current, older_than_s, grace_s):
            try:
                core.delete_namespaced_pod(
                    pod.metadata.name, namespace, grace_period_seconds=0, propagation_policy="Background"
                )
                removed.append(f"pod/{pod.metadata.name}")
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    log.warning("reaper: cannot delete pod %s: %s", pod.metadata.name, _describe(exc))
                    live_sandboxes.add((pod.metadata.labels or {}).get(LABEL_SANDBOX))
        else:
            live_sandboxes.add((pod.metadata.labels or {}).get(LABEL_SANDBOX))
    for policy in net.list_namespaced_network_policy(namespace, label_selector=LABEL_SANDBOX).items:
        meta = policy.metadata
        sandbox = (meta.labels or {}).get(LABEL_SANDBOX)
        orphan = sandbox not in live_sandboxes and _age(meta, current) > orphan_policy_s
        if sandbox in live_sandboxes or not (orphan or _stale(meta, current, older_than_s, grace_s)):
            continue
        try:
            net.delete_namespaced_network_policy(meta.name, namespace)
            removed.append(f"networkpolicy/{meta.name}")
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                log.warning("reaper: cannot delete network policy %s: %s", meta.name, _describe(exc))
    if api_client is not api:
        with contextlib.suppress(Exception):
            api_client.close()
    return removed


def _stale(meta: Any, now: float, older_than_s: float | None, grace_s: float) -> bool:
    if older_than_s is not None and _age(meta, now) > older_than_s:
        return True
    deadline = _parse_time((meta.annotations or {}).get(ANNOTATION_DEADLINE))
    return deadline is not None and now > deadline + grace_s


def _age(meta: Any, now: float) -> float:
    created = meta.creation_timestamp
    if isinstance(created, str):
        stamp = _parse_time(created)
        return 0.0 if stamp is None else now - stamp
    if isinstance(created, datetime):
        return now - created.timestamp()
    return 0.0


# ----------------------------------------------------------------------------- helpers

_CONFIG_LOCK = threading.Lock()
_CONFIGS: dict[tuple[str | None, str | None], Any] = {}


def _api_client(configuration: Any, kubeconfig: str | None, context: str | None) -> Any:
    """A new ApiClient over `configuration`, or over the loaded in-cluster/kubeconfig settings."""
    from kubernetes import client, config

    if configuration is None:
        key = (kubeconfig, context)
        with _CONFIG_LOCK:
            configuration = _CONFIGS.get(key)
            if configuration is None:
                configuration = client.Configuration()
                try:
                    if kubeconfig is not None or context is not None:
                        raise config.ConfigException("a kubeconfig was asked for")
                    config.load_incluster_config(client_configuration=configuration)
                except config.ConfigException:
                    try:
                        config.load_kube_config(
                            config_file=kubeconfig, context=context, client_configuration=configuration
                        )
                    except Exception as exc:
                        raise SandboxUnavailable(
                            "the kubernetes sandbox has no API to talk to (not in a cluster, and no usable "
                            f"kubeconfig): {_describe(exc)}"
                        ) from None
                _CONFIGS[key] = configuration
    return client.ApiClient(configuration)


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


_UNITS = {
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5,
    "k": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "P": 1000**5,
}  # fmt: skip


def parse_quantity(quantity: str) -> int:
    """A Kubernetes byte quantity ("4Gi", "500M", "1.5Gi", "1048576") in bytes."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?\s*", str(quantity))
    if not match:
        raise ValueError(f"not a byte quantity: {quantity!r}")
    return int(float(match.group(1)) * _UNITS.get(match.group(2) or "", 1))


def _quantity(size: int) -> str:
    for unit in ("Gi", "Mi", "Ki"):
        if size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(int(epoch), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def _tar_entry(info: tarfile.TarInfo, uid: int) -> tarfile.TarInfo | None:
    """Owned by the sandbox user; folders stay writable to it; no device files."""
    if info.ischr() or info.isblk():
        return None
    info.uid = info.gid = uid
    info.uname = info.gname = ""
    if info.isdir():
        info.mode |= 0o700
    return info


def _plain(arguments: Any) -> Any:
    """The arguments as they will travel (JSON), so the journal replays exactly what was sent."""
    return json.loads(json.dumps(arguments, default=str))


def _tool_outcome(name: str, output: str) -> str:
    """What a replayed call must reproduce: Bash output varies (timings), its status line must not."""
    if name == "Bash":
        return output.split("\n", 1)[0]
    return output


def _exec_outcome(reply: Mapping[str, Any]) -> str:
    return f"exit_code={reply.get('exit_code')} timed_out={reply.get('timed_out')}"


def _patch_outcome(reply: Mapping[str, Any]) -> str:
    return hashlib.sha256(str(reply.get("patch_b64", "")).encode()).hexdigest()


def _outcome_of(entry: _Entry, reply: Mapping[str, Any]) -> str:
    if reply.get("ok") is not True:
        return f"runner error: {reply.get('error')}"
    op = entry.payload.get("op")
    if op == "tool":
        return _tool_outcome(str(entry.payload.get("name")), str(reply.get("output")))
    if op == "exec":
        return _exec_outcome(reply)
    return _patch_outcome(reply)


def _exit_code(status: Mapping[str, Any]) -> int:
    if status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            with contextlib.suppress(TypeError, ValueError):
                return int(cause.get("message"))
    return -1


def _status_text(status: Mapping[str, Any]) -> str:
    if status.get("status") == "Success":
        return "exit code 0"
    return str(status.get("message") or status.get("reason") or "failed")


def _pod_summary(phase: str | None, waiting: Any, conditions: Any) -> str:
    parts = [f"phase {phase or 'unknown'}"]
    if waiting is not None:
        parts.append(f"waiting: {waiting.reason}")
    for condition in conditions or []:
        if condition.status != "True" and condition.message:
            parts.append(f"{condition.type}: {condition.message}")
    return "; ".join(parts)


def _describe(exc: BaseException) -> str:
    """An API error without its response headers and body noise."""
    status, reason = getattr(exc, "status", None), getattr(exc, "reason", None)
    if status is not None and reason is not None:
        body = getattr(exc, "body", None)
        message = ""
        if body:
            with contextlib.suppress(ValueError, TypeError):
                message = json.loads(body).get("message", "")
        return f"{status} {reason}{': ' + message if message else ''}"
    return f"{type(exc).__name__}: {exc}"


def make_api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An ApiClient for the reaper and operators' commands: in-cluster, else the kubeconfig given or found."""
    return _api_client(None, kubeconfig, context)
