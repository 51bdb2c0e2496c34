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
  The one exception is a setup pod's built test environment, streamed out and read as hostile
  (environment_stream.py); its package traffic goes through an exec tunnel to the worker's
  index relay (kubernetes_tunnel.py), so even a setup pod keeps the deny-all policy.
- The runner (`runner.py`, the same JSON-lines protocol as the local backend) then runs as one
  exec whose WebSocket stays open: a tool call is one message out and one reply back, not a new
  exec (Leaf pays copy-in, check and a fresh Python start per call).
- A broken stream (API server restart, node trouble, proxy timeout) is recovered: the pod is
  recreated from the untouched host workspace and every recorded mutating call (Write, Edit,
  Bash, pipeline commands, patches) is replayed; each replayed result must match what the
  caller saw (Write/Edit: the exact text; Bash: its status line; commands: exit code; patch:
  its bytes), otherwise the sandbox fails instead of silently diverging. The call that was in
  flight is then sent again, once. That journal is `kubernetes_recovery.RecoveringChannel`; the
  exec stream under it is `kubernetes_stream`; the requests over both are `RunnerClient`'s,
  the same client the local backend uses. This module owns the cluster side only.
- Pods and the policy are deleted on `close()` whatever happened (also at interpreter exit);
  `reap()` deletes whatever a killed worker left, once it is past its deadline.

Each sandbox owns its own ApiClient: `kubernetes.stream.stream()` swaps the client's transport
for the duration of an exec call, which must not leak into another thread's API calls.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import tarfile
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any, cast

from sandbox.base import (
    ENV_DIR,
    PROJECT_DIR,
    PUMP_PORT,
    READY_FILE,
    RELAY_SOCKET,
    SETUP_FILES_DIR,
    TOOLS_DIR,
    SandboxError,
    SandboxOptions,
    SandboxSpec,
    SandboxUnavailable,
)
from sandbox.environment_stream import (
    PACK,
    folder_bytes,
    receive_environment,
)
from sandbox.kubernetes_cluster import configured_api_client
from sandbox.kubernetes_manifests import (
    COMMON_LABELS,
    CONTAINER,
    HOME,
    LABEL_SANDBOX,
    RUNNER_DIR,
    RUNNER_DIR_SIZE,
    RUNNER_PATH,
    WORKSPACE,
    KubernetesOptions,
    PodShape,
    check_storage,
    in_runner_dir,
    job_labels,
    login_profile,
    network_policy_manifest,
    pod_env,
    pod_manifest,
    rfc3339,
    sandbox_name,
    tar_entry,
)
from sandbox.kubernetes_recovery import RecoveringChannel
from sandbox.kubernetes_stream import (
    ExecReader,
    ExecStream,
    StdinWriter,
    StreamBroken,
    StreamChannel,
    describe_api_error,
)
from sandbox.kubernetes_tunnel import IndexTunnel
from sandbox.polling import poll_until
from sandbox.quantity import format_cpus, format_quantity, parse_quantity
from sandbox.runner_client import RunnerBroken, RunnerClient, read_runner_source

log = logging.getLogger(__name__)

# Waiting reasons that will not fix themselves: fail the start now instead of at the timeout.
FATAL_WAITING = frozenset(
    {"ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError", "CrashLoopBackOff"}
)
COLLECT_TIMEOUT_S = 900.0  # streaming a built environment out of its setup pod

# Runs inside the pod (Python 3.8+, stdlib): extracts the tar on stdin. Members under
# `workspace/` go to argv[1], under `frogfix/` to argv[2], under `home/` to argv[3] (HOME), under
# `env/` to argv[4] (a built test environment, when there is one).
EXTRACT = (
    "import os, sys, tarfile\n"
    "dest = dict(zip(('workspace', 'frogfix', 'home', 'env'), sys.argv[1:]))\n"
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


# ----------------------------------------------------------------------------- the backend


class KubernetesSandbox(RunnerClient):
    """One pod per sandbox, driven through one exec stream; implements `sandbox.base.Sandbox`.

    The runner protocol is `RunnerClient`'s, over a `RecoveringChannel` (journal and recovery)
    around a `StreamChannel` (the exec stream); this class owns the cluster side: the policy,
    the pod, the copy-in, restarting the pod for recovery, and deleting it all on `close()`.
    """

    def __init__(
        self, spec: SandboxSpec, options: SandboxOptions | None = None, kube: KubernetesOptions | None = None
    ) -> None:
        """Create the policy, then the pod; copy the workspace in; start the runner.

        Raises SandboxUnavailable when any of that fails (after deleting what was created).
        The pod's memory is `kube.memory`, else `spec.limits.memory_bytes`.

        `spec.environment` (a built test environment on the host) is copied into an ENV_DIR volume
        of `kube.environment_size` with the workspace, and `spec.project` (the job's project layer) into
        PROJECT_DIR; each pod has its own copy, so nothing a job does reaches the cache. `spec.setup`
        makes a setup pod: the build files and tools copied in, its empty `target` (an ENV_DIR volume
        of the setup's size, or PROJECT_DIR in a runner folder grown by that size), the index tunnel
        to the relay's socket where the setup has a relay (the pod's policy still denies all
        traffic), no `reclaim` (it would kill the tunnel) and no recovery (a broken build is built
        again by a later job).
        """
        self.options = options = options or SandboxOptions()
        self.kube = kube = kube or KubernetesOptions()
        super().__init__(spec.limits, options)
        self.spec = spec
        self.namespace = kube.namespace
        self.image = spec.image or kube.default_image
        self.python = kube.python
        self.start_timeout_s = options.start_timeout_s
        self.api_timeout_s = kube.api_timeout_s
        self._take_folders(spec)
        self.reclaim = kube.reclaim and self.setup is None
        if not self.image or any(ch.isspace() for ch in self.image):
            raise ValueError(f"invalid sandbox image {self.image!r}")
        self.env = pod_env(spec.env)
        self.name = sandbox_name(spec.labels)
        self.labels = {**COMMON_LABELS, **job_labels(spec.labels), LABEL_SANDBOX: self.name}
        wall = spec.limits.wall_seconds
        self._wall_s = wall if math.isfinite(wall) and wall > 0 else 7 * 24 * 3600.0
        self._deadline = time.monotonic() + self._wall_s
        self.deadline_at = rfc3339(time.time() + self._wall_s)
        self.pod_shape = self._shape()
        self.resources = dict(self.pod_shape.resources)
        self._runner_source = read_runner_source(options.runner_script)
        self.pod_name = ""
        self._generation = 0
        api = configured_api_client(kube.configuration, kube.kubeconfig, kube.context)
        self._res = _Resources(api, self.namespace, kube.delete_wait_s, kube.api_timeout_s)
        self._open(kube.max_recoveries if self.setup is None else 0)

    @property
    def recoveries(self) -> int:
        """How many times a broken stream was recovered (at most `max_recoveries`)."""
        return self._recovering.recoveries

    @property
    def max_recoveries(self) -> int:
        return self._recovering.max_recoveries

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

    def collect_environment(self) -> None:
        """A setup pod's `target`, streamed into the host's `spec.setup.out` (see environment_stream)."""
        if self.setup is None:
            raise SandboxError("only a setup sandbox has an environment to collect")
        with self._lock:
            self._check_usable()
            argv = [self.python, "-I", "-S", "-B", "-c", PACK, self.setup.target]
            stream = self._open_exec(self.pod_name, argv, stdin=False)
            try:
                deadline = min(time.monotonic() + COLLECT_TIMEOUT_S, self._deadline)
                reader = ExecReader(stream, deadline, lambda: self._res.cancelled)
                receive_environment(reader, self.setup.out, self.setup.env_size_bytes)  # reads to the exit too
                code = stream.wait_exit(deadline)
            except StreamBroken as exc:
                raise SandboxError(f"copying the built environment out of pod {self.pod_name} failed: {exc}") from None
            finally:
                stream.close()
            if code != 0:
                why = f"(exit {code}): {stream.err.text()}"
                raise SandboxError(f"copying the built environment out of pod {self.pod_name} failed {why}")

    def restart_pod(self) -> None:
        """Delete the current pod and start a fresh one from the untouched workspace, under the
        same policy (used by recovery; the caller replays the journal)."""
        old_stream, old_pod = self._res.stream, self.pod_name
        self._res.stream = None
        if old_stream is not None:
            old_stream.close()
        _delete_pod(self._res, old_pod)
        self._generation += 1
        self._start_pod()

    def __repr__(self) -> str:
        return f"<KubernetesSandbox {self.namespace}/{self.pod_name or self.name} {self._state()}>"

    # ------------------------------------------------------------------------- start

    def _take_folders(self, spec: SandboxSpec) -> None:
        """The host folders the pod gets copies of: the workspace, a built environment, the project layer."""
        self.workspace = os.path.realpath(spec.workspace)
        if not os.path.isdir(self.workspace):
            raise SandboxError(f"workspace {spec.workspace} is not a directory")
        self.setup = spec.setup
        self.project = os.path.realpath(spec.project) if spec.project is not None else None
        self.environment = os.path.realpath(spec.environment) if spec.environment is not None else None
        if self.environment is not None and not os.path.isdir(self.environment):
            raise SandboxError(f"the built environment {spec.environment} is not a directory")
        # A pod gets its own copy of the environment's checkout folders (node_modules), in its workspace: no
        # later job sees what this pod's processes write there, and Node finds them where it looks.
        self.checkout_binds = [
            (os.path.realpath(src), relative) for src, relative in spec.checkout_binds
            if not relative.startswith("/") and ".." not in relative.split("/") and os.path.isdir(src)
        ]

    def _shape(self) -> PodShape:
        """The pods' shape: the sizes from the options, the storage grown by what is copied into the
        runner's folder and the ENV_DIR volume, the memory from the limits unless the options set it."""
        options, kube = self.options, self.kube
        check_storage(options.workspace_size_bytes, options.tmp_size_bytes, kube.ephemeral_storage)
        env_volume, runner_dir = self._volume_sizes(kube.environment_size)
        extra = (parse_quantity(env_volume) if env_volume else 0) + parse_quantity(runner_dir)
        extra -= parse_quantity(RUNNER_DIR_SIZE)
        storage = kube.ephemeral_storage
        if extra:
            storage = format_quantity(parse_quantity(storage) + extra)
        memory = kube.memory or format_quantity(self.limits.memory_bytes)
        return PodShape(
            image=self.image,
            labels=self.labels,
            env=self.env,
            deadline=self.deadline_at,
            resources={"cpu": format_cpus(options.cpus), "memory": memory, "ephemeral-storage": storage},
            workspace_size=format_quantity(options.workspace_size_bytes),
            tmp_size=format_quantity(options.tmp_size_bytes),
            runner_dir_size=runner_dir,
            environment_size=env_volume,
        )

    def _volume_sizes(self, environment_size: str) -> tuple[str | None, str]:
        """(the ENV_DIR volume's size or None, the runner folder's size): a setup pod's holds its tools
        too, and the project layer it fills or a job pod's copy of it."""
        copied = folder_bytes(self.project) if self.project is not None else 0
        volume = None
        if self.setup is not None:
            copied += folder_bytes(self.setup.files) + sum(os.path.getsize(src) for _, src in self.setup.tools)
            if self.setup.target == ENV_DIR:
                volume = format_quantity(self.setup.env_size_bytes)
            else:
                copied += self.setup.env_size_bytes
        if self.environment is not None:
            limit = parse_quantity(environment_size)
            if folder_bytes(self.environment) > limit:
                raise SandboxError(f"the built environment is over FROGFIX_ENVIRONMENT_SIZE ({environment_size})")
            volume = environment_size
        runner = format_quantity(parse_quantity(RUNNER_DIR_SIZE) + -(-copied // 2**20) * 2**20)
        return volume, runner if copied else RUNNER_DIR_SIZE

    def _open(self, max_recoveries: int) -> None:
        """Wire the channels, then create the policy and the first pod (or clean up and raise)."""
        res = self._res
        self._stream_channel = StreamChannel(
            lambda: res.stream,
            lambda: res.cancelled,
            wall_deadline=self._deadline,
            reply_grace_s=self.reply_grace_s,
            wall_message=self._wall_message(),
        )
        self._recovering = RecoveringChannel(
            self._stream_channel,
            weakref.proxy(self),
            max_recoveries=max_recoveries,
            wall_deadline=self._deadline,
            wall_message=self._wall_message(),
            closed=lambda: res.cancelled,
        )
        self._channel = self._recovering
        # Runs once: on close(), or at interpreter exit if the caller never closed the sandbox.
        self._finalizer = weakref.finalize(self, _release, res)
        try:
            self._create_policy()
            self._start_pod()
        except BaseException as exc:
            self._closed = True
            self._finalizer()
            if isinstance(exc, RunnerBroken):
                raise self._broken(str(exc)) from None
            if isinstance(exc, SandboxError) or not isinstance(exc, Exception):
                raise
            raise SandboxUnavailable(f"cannot start the Kubernetes sandbox: {describe_api_error(exc)}") from exc

    def _release(self) -> None:
        """Cut the stream (a call blocked on it in another thread wakes up), then delete the
        pods and the policy; never raises."""
        self._res.cancelled = True
        stream = self._res.stream
        if stream is not None:
            stream.abort()
        self._finalizer()

    def pod_manifest(self, name: str | None = None) -> dict[str, Any]:
        """The pod this sandbox creates (now: the deadline shrinks for a recreated pod)."""
        remaining = max(1, math.ceil(self._deadline - time.monotonic()))
        return pod_manifest(name or self.name, self.kube, self.pod_shape, remaining)

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
            self.runner_info = self._stream_channel.exchange({"id": "start", "op": "ping"}, self.start_timeout_s)
        except StreamBroken as exc:
            raise SandboxUnavailable(f"the sandbox runner did not start in pod {name}: {exc}") from None
        if self.setup is not None and self.setup.relay is not None:
            self._start_tunnel(name)

    def _start_tunnel(self, name: str) -> None:
        """The setup pod's one way to the mirror: its 127.0.0.1:PUMP_PORT, over an exec stream to the relay."""
        assert self.setup is not None and self.setup.relay is not None
        pump = f"{SETUP_FILES_DIR}/index_pump.py"
        argv = [self.python, "-I", "-S", "-B", pump, "--tunnel", str(PUMP_PORT), READY_FILE]
        stream = self._open_exec(name, argv)
        try:
            tunnel = IndexTunnel(stream, os.path.join(self.setup.relay, RELAY_SOCKET))
        except OSError as exc:
            stream.close()
            raise SandboxUnavailable(f"the index relay's folder cannot be opened: {exc}") from None
        self._res.tunnel = tunnel
        try:
            tunnel.wait_ready(self.start_timeout_s)
        except StreamBroken as exc:
            raise SandboxUnavailable(str(exc)) from None

    def _rlimits(self) -> dict[str, int]:
        """No RLIMIT_NPROC or RLIMIT_AS here: in a pod they would count every container of the
        same uid on the node; the pod's pids limit and memory limit (cgroups) bound it instead."""
        rlimits = {"fsize": int(self.limits.file_size_bytes), "core": 0}
        if math.isfinite(self.limits.wall_seconds) and self.limits.wall_seconds > 0:
            rlimits["cpu"] = max(1, math.ceil(self.limits.wall_seconds))
        return rlimits

    def _wait_running(self, name: str) -> None:
        res = self._res
        last = "no status yet"

        def running() -> bool:
            nonlocal last
            if res.released:
                raise SandboxError("the sandbox is closed")
            with res.api_lock:
                pod = res.core.read_namespaced_pod(name, self.namespace, _request_timeout=self.api_timeout_s)
            status = pod.status
            phase = getattr(status, "phase", None)
            containers = [c for c in (getattr(status, "container_statuses", None) or []) if c.name == CONTAINER]
            state = containers[0].state if containers else None
            if phase == "Running" and state is not None and state.running is not None:
                return True
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
            return False

        if not poll_until(running, within_s=self.start_timeout_s, first_pause_s=0.05, max_pause_s=1.0):
            raise SandboxUnavailable(f"pod {name} did not start within {self.start_timeout_s:g}s ({last})")

    def _upload(self, name: str) -> None:
        """The workspace and the runner, as one tar stream into the pod's emptyDirs."""
        argv = [self.python, "-I", "-S", "-B", "-c", EXTRACT, WORKSPACE, RUNNER_DIR, HOME]
        if self.pod_shape.environment_size is not None:
            argv.append(ENV_DIR)
        stream = self._open_exec(name, argv)
        try:
            try:
                writer = StdinWriter(stream)
                uid = self.kube.run_as_user
                with tarfile.open(fileobj=cast(Any, writer), mode="w|", format=tarfile.PAX_FORMAT) as archive:
                    archive.add(self.workspace, arcname="workspace", filter=lambda info: tar_entry(info, uid))
                    for src, relative in self.checkout_binds:
                        archive.add(src, arcname=f"workspace/{relative}", filter=lambda info: tar_entry(info, uid))
                    self._add_environment(archive, uid)
                    profile = login_profile(self.env)
                    if profile:
                        info = tarfile.TarInfo("home/.bash_profile")
                        info.size, info.mode, info.mtime = len(profile), 0o644, int(time.time())
                        info.uid = info.gid = uid
                        archive.addfile(info, io.BytesIO(profile))
                    runner = tarfile.TarInfo("frogfix/runner.py")
                    runner.size, runner.mode, runner.mtime = len(self._runner_source), 0o444, int(time.time())
                    archive.addfile(runner, io.BytesIO(self._runner_source))
                writer.flush()
                stream.close_stdin()
            except StreamBroken:
                pass  # the extractor died early: its exit status and stderr say why
            code = stream.wait_exit(time.monotonic() + self.start_timeout_s)
        except StreamBroken as exc:
            raise SandboxUnavailable(f"copying the workspace into pod {name} failed: {exc}") from None
        finally:
            stream.close()
        if code != 0:
            detail = stream.err.text() or bytes(stream.out[-2000:]).decode("utf-8", "replace")
            raise SandboxUnavailable(f"copying the workspace into pod {name} failed (exit {code}): {detail}")

    def _add_environment(self, archive: tarfile.TarFile, uid: int) -> None:
        """A setup pod's build files and tools; the environment and the job's project layer."""
        owned = lambda info: tar_entry(info, uid)  # noqa: E731
        if self.setup is not None:
            archive.add(self.setup.files, arcname=in_runner_dir(SETUP_FILES_DIR), filter=owned)
            for tool, src in self.setup.tools:
                archive.add(src, arcname=f"{in_runner_dir(TOOLS_DIR)}/{tool}", filter=owned)
        if self.environment is not None:
            archive.add(self.environment, arcname="env", filter=owned)
        if self.project is not None:
            archive.add(self.project, arcname=in_runner_dir(PROJECT_DIR), filter=owned)

    def _open_exec(self, name: str, argv: list[str], stdin: bool = True) -> ExecStream:
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
            raise StreamBroken(f"cannot open an exec stream to pod {name}: {describe_api_error(exc)}") from None
        return ExecStream(ws)

    def _wall_message(self) -> str:
        return f"the sandbox reached its wall-clock limit of {self.limits.wall_seconds:g}s"

    def _broken(self, message: str) -> SandboxError:
        """Mark the sandbox unusable (its stream cut, the runner's stderr added) and build the
        error for the caller to raise."""
        stream = self._res.stream
        if stream is not None:
            tail = stream.err.text()
            if tail and "stderr:" not in message:
                message = f"{message}; stderr: {tail}"
            stream.abort()
        self._dead = message
        return SandboxError(message)


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
        self.stream: ExecStream | None = None
        self.tunnel: IndexTunnel | None = None  # a setup pod's way to the index relay
        self.api_lock = threading.RLock()  # stream() swaps the client's transport while it connects
        self.lock = threading.Lock()
        self.released = False
        self.cancelled = False  # set by close(): a reader waiting on the stream gives up


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
    if res.tunnel is not None:
        res.tunnel.close()
    try:
        for pod in pods:
            _delete_pod(res, pod)
        if _wait_gone(res, pods) and policy is not None:
            try:
                with res.api_lock:
                    res.net.delete_namespaced_network_policy(policy, res.namespace, _request_timeout=res.api_timeout_s)
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    reason = describe_api_error(exc)
                    log.warning("sandbox: cannot delete network policy %s/%s: %s", res.namespace, policy, reason)
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
            log.warning("sandbox: cannot delete pod %s/%s: %s", res.namespace, name, describe_api_error(exc))


def _wait_gone(res: _Resources, pods: Iterable[str]) -> bool:
    """True once none of `pods` exists any more (False after `delete_wait_s`)."""
    left = [pod for pod in pods if pod]

    def gone() -> bool:
        nonlocal left
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
        return not left

    return poll_until(gone, within_s=res.delete_wait_s, first_pause_s=0.05, max_pause_s=0.5)








# ----------------------------------------------------------------------------- helpers







def _pod_summary(phase: str | None, waiting: Any, conditions: Any) -> str:
    parts = [f"phase {phase or 'unknown'}"]
    if waiting is not None:
        parts.append(f"waiting: {waiting.reason}")
    for condition in conditions or []:
        if condition.status != "True" and condition.message:
            parts.append(f"{condition.type}: {condition.message}")
    return "; ".join(parts)

