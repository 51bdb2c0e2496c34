"""A Kubernetes API server double on 127.0.0.1 that the real `kubernetes` client talks to.

Why our own and not kmock: the Kubernetes sandbox lives on `pods/exec` over WebSocket, and that
exec has to really run something, so that the tool-level suite goes through the stream end to
end. Here a pod's "container" is a temp folder: each of its volume mounts is a sub-folder, and an
exec runs its argv as a local subprocess (as the pod's runAsUser when the double runs as root),
with every absolute path under a mount (in argv, in env values, the workingDir) mapped into that
folder. Everything else is the host's. It is a test double, not a sandbox: nothing is isolated,
and it refuses the runner's `--reclaim` (kill every process in the pid namespace), because here
that namespace is the host's.

What it serves, with the real API's shapes (JSON, Status errors, 201/409/404/422):
- core/v1 pods: create, get, list (labelSelector: `k=v`, `k!=v`, `k`, `!k`), delete;
- networking.k8s.io/v1 networkpolicies: the same;
- core/v1 namespaces: get (those in `namespaces`); authorization.k8s.io/v1 selfsubjectaccessreviews:
  create (allowed unless `(verb, resource, subresource)` is in `denied`);
- pods/exec over WebSocket: subprotocols v5.channel.k8s.io and v4.channel.k8s.io; each
  message starts with its channel byte (0 stdin, 1 stdout, 2 stderr, 3 the exit Status as JSON,
  255 = v5 "close channel"); an empty stdout message says the stream is open, as the kubelet does;
- optional bearer-token auth; optional TLS (a throw-away self-signed certificate, for the bench).

What tests assert on: `events` / `verbs()` (every API call in order: create/get/list/delete/exec,
plus `vanish` when a pod is finally gone), `received` (each created object exactly as the client
sent it), `execs` (argv, subprotocol, stdin bytes, exit code), `get()`, `objects()`, `names()`,
`pod_path()` (a path inside a pod, on this machine), `live_processes()`, and `counters` (TCP
connections, HTTP requests, client messages on exec streams).

Faults and knobs: `fail_next()` (one API verb answers an error), `image_errors` (pods with that
image stay Pending with a waiting reason), `pending_polls` (GETs before a pod is Running),
`terminating_polls` (GETs a deleted pod stays Terminating), `break_streams()` (cut live exec
connections without a close frame), `age()` (move a creationTimestamp back), `latency_s` (delay
before every connection, request and client stream message: a stand-in for network distance).
A pod whose `activeDeadlineSeconds` has passed turns Failed (DeadlineExceeded) and its processes die.
`real_paths=True` runs each exec in a bubblewrap mount namespace where the pod's volumes are at
their real paths instead of mapping paths (for a virtual environment built in one pod and used in
another; see `_in_mount_namespace`).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any
from urllib.parse import parse_qs, urlsplit

WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
V5 = "v5.channel.k8s.io"
V4 = "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, STATUS, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA
MARKER = "KUBE_API_DOUBLE_POD"
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
KINDS = {"pods": ("v1", "Pod"), "networkpolicies": ("networking.k8s.io/v1", "NetworkPolicy")}
NAMESPACE_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)$")
ACCESS_REVIEW_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
ROUTES = [
    (re.compile(r"^/api/v1/namespaces/([^/]+)/(pods)(?:/([^/]+))?(?:/(exec))?$"), "core"),
    (re.compile(r"^/apis/networking\.k8s\.io/v1/namespaces/([^/]+)/(networkpolicies)(?:/([^/]+))?()$"), "net"),
]


@dataclass(frozen=True)
class ApiEvent:
    """One API call the double served (or a pod finally vanishing), in order."""

    verb: str
    kind: str
    namespace: str
    name: str
    at: float = field(default_factory=time.monotonic, compare=False)


@dataclass
class ExecRecord:
    """One exec stream: what ran, over which subprotocol, how it ended."""

    namespace: str
    pod: str
    argv: list[str]
    protocol: str
    stdin_bytes: int = 0
    exit_code: int | None = None
    broken: bool = False


@dataclass
class _Fault:
    verb: str
    kind: str
    status: int
    reason: str


class _Pod:
    """The double's runtime side of one pod: its folder, mounts and running exec processes."""

    def __init__(self, uid: str, root: Path, mounts: list[str]) -> None:
        self.uid = uid
        self.root = root
        self.mounts = sorted(mounts, key=len, reverse=True)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.streams: list[_WebSocket] = []
        self.pending_left = 0
        self.terminating_left = 0
        self.dead = False

    def map_path(self, value: str) -> str:
        for mount in self.mounts:
            if value == mount or value.startswith(mount.rstrip("/") + "/"):
                return str(self.root) + value
        return value


class _WebSocket:
    """The server side of RFC 6455, just enough for the exec channels."""

    def __init__(self, sock: socket.socket, rfile: IO[bytes]) -> None:
        self.sock = sock
        self.rfile = rfile
        self._send_lock = threading.Lock()
        self.closed = False

    def send(self, opcode: int, payload: bytes) -> bool:
        size = len(payload)
        if size < 126:
            header = struct.pack("!BB", 0x80 | opcode, size)
        elif size < 1 << 16:
            header = struct.pack("!BBH", 0x80 | opcode, 126, size)
        else:
            header = struct.pack("!BBQ", 0x80 | opcode, 127, size)
        with self._send_lock:
            if self.closed:
                return False
            try:
                self.sock.sendall(header + payload)
            except OSError:
                self.closed = True
                return False
        return True

    def send_channel(self, channel: int, data: bytes) -> bool:
        return self.send(OP_BINARY, bytes([channel]) + data)

    def close(self, code: int = 1000) -> None:
        self.send(OP_CLOSE, struct.pack("!H", code))
        with self._send_lock:
            self.closed = True

    def cut(self) -> None:
        """Drop the connection without a close frame, as a dying proxy or API server would."""
        with self._send_lock:
            self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _read(self, size: int) -> bytes:
        data = self.rfile.read(size)
        if len(data) < size:
            raise EOFError
        return data

    def recv(self) -> tuple[int, bytes] | None:
        """The next data or close message (pings answered here); None when the peer is gone."""
        parts: list[bytes] = []
        first_opcode = None
        try:
            while True:
                b1, b2 = self._read(2)
                fin, opcode = b1 & 0x80, b1 & 0x0F
                size = b2 & 0x7F
                if size == 126:
                    size = struct.unpack("!H", self._read(2))[0]
                elif size == 127:
                    size = struct.unpack("!Q", self._read(8))[0]
                mask = self._read(4) if b2 & 0x80 else b""
                payload = _unmask(self._read(size), mask) if mask else self._read(size)
                if opcode == OP_PING:
                    self.send(OP_PONG, payload)
                    continue
                if opcode == OP_PONG:
                    continue
                if opcode == OP_CLOSE:
                    return OP_CLOSE, payload
                if opcode != OP_CONT:
                    first_opcode = opcode
                parts.append(payload)
                if fin:
                    return first_opcode or OP_BINARY, b"".join(parts)
        except (EOFError, OSError, ValueError):
            return None


def _unmask(data: bytes, mask: bytes) -> bytes:
    size = len(data)
    key = (mask * (size // 4 + 1))[:size]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(size, "little")


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def _exit_status(code: int) -> dict[str, Any]:
    """What the kubelet sends on channel 3 when the exec'd process exits."""
    if code == 0:
        return {"metadata": {}, "status": "Success"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: exit status {code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def _selector_matches(selector: str, labels: dict[str, str]) -> bool:
    for term in (t.strip() for t in selector.split(",") if t.strip()):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


class KubernetesApiDouble:
    """The API server. Use as a context manager; `configuration()` gives a client Configuration."""

    def __init__(
        self,
        *,
        token: str | None = "kube-double-token",
        protocols: tuple[str, ...] = (V5, V4),
        latency_s: float = 0.0,
        tls: bool = False,
        real_paths: bool = False,
    ) -> None:
        self.token = token
        self.real_paths = real_paths
        self.protocols = protocols
        self.latency_s = latency_s
        self.pending_polls = 0
        self.terminating_polls = 0
        self.image_errors: dict[str, str] = {}
        self.events: list[ApiEvent] = []
        self.execs: list[ExecRecord] = []
        self.received: list[tuple[str, dict[str, Any]]] = []  # (kind, body) of every create, as sent
        self._uids: dict[tuple[str, str], str] = {}
        self.counters = {"connections": 0, "requests": 0, "stream_messages": 0}
        self.lock = threading.RLock()
        self._objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._created: dict[tuple[str, str, str], float] = {}
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._faults: list[_Fault] = []
        self._rv = 1000
        self._base = Path(tempfile.mkdtemp(prefix="kube-api-double-"))
        self._base.chmod(0o755)
        self.ca_file: str | None = None
        self.namespaces: set[str] = set()  # what GET /api/v1/namespaces/<name> finds (nothing else checks it)
        self.denied: set[tuple[str, str, str]] = set()  # (verb, resource, subresource) a SelfSubjectAccessReview denies
        self.access_review_error: int | None = None  # an HTTP status every SelfSubjectAccessReview answers instead
        self._server = _Server(("127.0.0.1", 0), _handler_class(self))
        self._server.double = self
        self._server.daemon_threads = True
        if tls:
            self._server.socket = self._tls_context().wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{'https' if self.ca_file else 'http'}://{host}:{port}"

    def configuration(self, token: str | None = None) -> Any:
        """A `kubernetes.client.Configuration` for this server (the token it expects by default)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        bearer = token if token is not None else self.token
        if bearer:
            cfg.api_key = {"authorization": bearer}
            cfg.api_key_prefix = {"authorization": "Bearer"}
        if self.ca_file:
            cfg.ssl_ca_cert = self.ca_file
            cfg.verify_ssl = True
        return cfg

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        with self.lock:
            pods = list(self._pods.values())
        for pod in pods:
            self._kill(pod)
        shutil.rmtree(self._base, ignore_errors=True)

    def __enter__(self) -> KubernetesApiDouble:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what tests look at --------------------------------------------------------------------

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            obj = self._objects.get((kind, namespace, name))
            return json.loads(json.dumps(obj)) if obj is not None else None

    def objects(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return [
                json.loads(json.dumps(obj))
                for (k, ns, _), obj in sorted(self._objects.items())
                if k == kind and (namespace is None or ns == namespace)
            ]

    def names(self, kind: str, namespace: str | None = None) -> list[str]:
        return [obj["metadata"]["name"] for obj in self.objects(kind, namespace)]

    def pod_path(self, namespace: str, name: str, path: str = "/workspace") -> Path:
        """Where `path` inside the pod's container lies on this machine."""
        with self.lock:
            pod = self._pods[(namespace, name)]
        mapped = pod.map_path(path)
        if mapped == path:
            raise KeyError(f"{path} is not under a volume mount of pod {name}")
        return Path(mapped)

    def verbs(self, kind: str | None = None) -> list[tuple[str, str, str]]:
        """(verb, kind, name) for every recorded event, optionally of one kind."""
        with self.lock:
            return [(e.verb, e.kind, e.name) for e in self.events if kind is None or e.kind == kind]

    def live_processes(self, namespace: str, name: str) -> int:
        """How many processes started by execs in this pod (even a deleted one) are still alive."""
        with self.lock:
            uid = self._uids.get((namespace, name))
        return 0 if uid is None else len(_marked_pids(uid))

    # -- faults --------------------------------------------------------------------------------

    def fail_next(self, verb: str, kind: str, status: int = 500, reason: str = "InternalError") -> None:
        """The next `verb` (create/get/list/delete/exec) on `kind` answers `status` instead."""
        with self.lock:
            self._faults.append(_Fault(verb, kind, status, reason))

    def break_streams(self, namespace: str | None = None, pod: str | None = None) -> int:
        """Cut every live exec connection (of one pod); returns how many were cut."""
        with self.lock:
            targets = [
                stream
                for (ns, name), runtime in self._pods.items()
                if (namespace is None or ns == namespace) and (pod is None or name == pod)
                for stream in runtime.streams
                if not stream.closed
            ]
        for stream in targets:
            stream.cut()
        return len(targets)

    def age(self, kind: str, namespace: str, name: str, seconds: float) -> None:
        """Make an object `seconds` older (its creationTimestamp moves back)."""
        with self.lock:
            key = (kind, namespace, name)
            self._created[key] -= seconds
            self._objects[key]["metadata"]["creationTimestamp"] = _stamp(self._created[key])

    def add(self, kind: str, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object directly (as if another client had), without recording an event."""
        answer, body = self._create(kind, namespace, obj, record=False)
        if answer != 201:
            raise ValueError(body)
        return body

    # -- the API -------------------------------------------------------------------------------

    def serve_doctor(self, method: str, path: str, raw: bytes) -> tuple[int, Any] | None:
        """A namespace read and a SelfSubjectAccessReview (what `manage.py doctor` asks); None: not these."""
        match = NAMESPACE_PATH.match(path)
        if match and method == "GET":
            name = match.group(1)
            if name not in self.namespaces:
                return 404, _status(404, "NotFound", f'namespaces "{name}" not found', name=name, kind="namespaces")
            meta = {"name": name, "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, name)), "resourceVersion": "1"}
            return 200, {"kind": "Namespace", "apiVersion": "v1", "metadata": meta, "status": {"phase": "Active"}}
        if path == ACCESS_REVIEW_PATH and method == "POST":
            if self.access_review_error is not None:
                code = self.access_review_error
                return code, _status(code, "InternalError", "the double refuses access reviews", name="",
                                     kind="selfsubjectaccessreviews")
            review = json.loads(raw or b"{}")
            attrs = (review.get("spec") or {}).get("resourceAttributes") or {}
            key = (attrs.get("verb", ""), attrs.get("resource", ""), attrs.get("subresource") or "")
            allowed = key not in self.denied
            status = {"allowed": allowed} if allowed else {"allowed": False, "reason": "denied by the double"}
            return 201, {**review, "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                         "status": status}
        return None

    def _take_fault(self, verb: str, kind: str) -> _Fault | None:
        with self.lock:
            for i, fault in enumerate(self._faults):
                if fault.verb == verb and fault.kind == kind:
                    return self._faults.pop(i)
        return None

    def _record(self, verb: str, kind: str, namespace: str, name: str) -> None:
        with self.lock:
            self.events.append(ApiEvent(verb, kind, namespace, name))

    def handle(
        self, method: str, kind: str, namespace: str, name: str, query: dict[str, list[str]], body: Any
    ) -> tuple[int, Any]:
        verb = {"POST": "create", "DELETE": "delete"}.get(method, "get" if name else "list")
        if method not in ("GET", "POST", "DELETE") or (method == "POST" and name) or (method == "DELETE" and not name):
            return 405, _status(405, "MethodNotAllowed", f"{method} is not supported here")
        if query.get("watch", ["false"])[0] in ("true", "1"):
            return 400, _status(400, "BadRequest", "the double does not serve watches")
        if not name and isinstance(body, dict):
            name = str((body.get("metadata") or {}).get("name", ""))
        self._record(verb, kind, namespace, name)
        fault = self._take_fault(verb, kind)
        if fault is not None:
            return fault.status, _status(fault.status, fault.reason, f"{fault.reason} injected by the double")
        if verb == "create":
            return self._create(kind, namespace, body)
        if verb == "list":
            return 200, self._list(kind, namespace, query.get("labelSelector", [""])[0])
        if verb == "get":
            return self._read(kind, namespace, name)
        return self._delete(kind, namespace, name)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _create(self, kind: str, namespace: str, body: Any, record: bool = True) -> tuple[int, Any]:
        if not isinstance(body, dict):
            return 400, _status(400, "BadRequest", "the body is not a JSON object")
        if record:
            with self.lock:
                self.received.append((kind, json.loads(json.dumps(body))))
        meta = body.setdefault("metadata", {})
        name = meta.get("name", "")
        problems = self._invalid(kind, namespace, body)
        if problems:
            return 422, _status(422, "Invalid", "; ".join(problems), name=name, kind=KINDS[kind][1])
        key = (kind, namespace, name)
        with self.lock:
            if key in self._objects:
                return 409, _status(409, "AlreadyExists", f'{kind} "{name}" already exists', name=name)
            api_version, kind_name = KINDS[kind]
            body["apiVersion"], body["kind"] = api_version, kind_name
            meta.update(namespace=namespace, uid=str(uuid.uuid4()), resourceVersion=self._next_rv())
            created = time.time()
            meta["creationTimestamp"] = _stamp(created)
            self._created[key] = created
            if kind == "pods":
                self._start_pod(namespace, name, body)
            self._objects[key] = body
            return 201, json.loads(json.dumps(body))

    def _invalid(self, kind: str, namespace: str, body: dict[str, Any]) -> list[str]:
        meta = body["metadata"]
        problems = []
        if not DNS_SUBDOMAIN.match(meta.get("name") or "") or len(meta.get("name", "")) > (
            63 if kind == "pods" else 253
        ):
            problems.append(f"metadata.name: Invalid value: {meta.get('name')!r}")
        if meta.get("namespace") not in (None, namespace):
            problems.append("metadata.namespace: does not match the namespace of the request")
        for key, value in (meta.get("labels") or {}).items():
            if (
                not LABEL_NAME.match(key.rsplit("/", 1)[-1])
                or not isinstance(value, str)
                or not LABEL_VALUE.match(value)
            ):
                problems.append(f"metadata.labels: Invalid value: {key}={value!r}")
        spec = body.get("spec") or {}
        if kind == "pods":
            containers = spec.get("containers") or []
            if not containers or any(not c.get("name") or not c.get("image") for c in containers):
                problems.append("spec.containers: every container needs a name and an image")
        elif "podSelector" not in spec:
            problems.append("spec.podSelector: Required value")
        return problems

    def _start_pod(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        container = body["spec"]["containers"][0]
        mounts = [m["mountPath"] for m in container.get("volumeMounts") or []]
        root = self._base / f"{namespace}.{name}"
        root.mkdir()
        for mount in mounts:
            (root / mount.lstrip("/")).mkdir(parents=True, exist_ok=True)
            (root / mount.lstrip("/")).chmod(0o777)
        runtime = _Pod(body["metadata"]["uid"], root, mounts)
        self._uids[(namespace, name)] = runtime.uid
        runtime.pending_left = self.pending_polls
        self._pods[(namespace, name)] = runtime
        body["status"] = {"phase": "Pending", "qosClass": "Guaranteed"}
        self._refresh(namespace, name, body, polled=False)

    def _refresh(self, namespace: str, name: str, body: dict[str, Any], polled: bool) -> None:
        """Move a pod along: Pending -> Running, Running -> Failed at its deadline."""
        runtime = self._pods[(namespace, name)]
        status = body["status"]
        container = body["spec"]["containers"][0]
        waiting = self.image_errors.get(container["image"])
        if status["phase"] == "Pending":
            if waiting:
                status["containerStatuses"] = [
                    self._container_status(
                        container, {"waiting": {"reason": waiting, "message": f"{waiting} (double)"}}
                    )
                ]
                return
            if runtime.pending_left > 0:
                runtime.pending_left -= 1 if polled else 0
                status["containerStatuses"] = [
                    self._container_status(container, {"waiting": {"reason": "ContainerCreating"}})
                ]
                return
            started = _now()
            status.update(
                phase="Running",
                startTime=started,
                podIP="10.0.0.1",
                conditions=[{"type": "Ready", "status": "True"}],
                containerStatuses=[self._container_status(container, {"running": {"startedAt": started}}, ready=True)],
            )
        deadline = body["spec"].get("activeDeadlineSeconds")
        age = time.time() - self._created[("pods", namespace, name)]
        if status["phase"] == "Running" and deadline is not None and age > float(deadline):
            status.update(
                phase="Failed",
                reason="DeadlineExceeded",
                message="Pod was active on the node longer than the specified deadline",
            )
            status["containerStatuses"] = [
                self._container_status(container, {"terminated": {"exitCode": 137, "reason": "Error"}})
            ]
            runtime.dead = True
            threading.Thread(target=self._kill, args=(runtime,), daemon=True).start()

    @staticmethod
    def _container_status(container: dict[str, Any], state: dict[str, Any], ready: bool = False) -> dict[str, Any]:
        return {
            "name": container["name"],
            "image": container["image"],
            "imageID": "",
            "ready": ready,
            "restartCount": 0,
            "state": state,
        }

    def _read(self, kind: str, namespace: str, name: str) -> tuple[int, Any]:
        key = (kind, namespace, name)
        with self.lock:
            obj = self._objects.get(key)
            if obj is None:
                return 404, _status(404, "NotFound", f'{kind} "{name}" not found', name=name, kind=kind)
            if kind == "pods":
                runtime = self._pods[(namespace, name)]
                if obj["metadata"].get("deletionTimestamp"):
                    runtime.terminating_left -= 1
                    if runtime.terminating_left < 0:
                        self._forget(namespace, name)
                        return 404, _status(404, "NotFound", f'pods "{name}" not found', name=name, kind=kind)
                else:
                    self._refresh(namespace, name, obj, polled=True)
            return 200, json.loads(json.dumps(obj))

    def _list(self, kind: str, namespace: str, selector: str) -> dict[str, Any]:
        with self.lock:
            items = [
                json.loads(json.dumps(obj))
                for (k, ns, _), obj in sorted(self._objects.items())
                if k == kind and ns == namespace and _selector_matches(selector, obj["metadata"].get("labels") or {})
            ]
            return {
                "kind": KINDS[kind][1] + "List",
                "apiVersion": KINDS[kind][0],
                "metadata": {"resourceVersion": self._next_rv()},
                "items": items,
            }

    def _delete(self, kind: str, namespace: str, name: str) -> tuple[int, Any]:
        key = (kind, namespace, name)
        with self.lock:
            obj = self._objects.get(key)
            if obj is None:
                return 404, _status(404, "NotFound", f'{kind} "{name}" not found', name=name, kind=kind)
            if kind != "pods":
                del self._objects[key]
                return 200, {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {"name": name, "kind": kind},
                }
            runtime = self._pods[(namespace, name)]
            runtime.dead = True
            if self.terminating_polls > 0 and not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = _now()
                runtime.terminating_left = self.terminating_polls
                answer = json.loads(json.dumps(obj))
            else:
                answer = json.loads(json.dumps(obj))
                self._forget(namespace, name)
        self._kill(runtime)
        return 200, answer

    def _forget(self, namespace: str, name: str) -> None:
        """The pod is gone from the API (its processes were killed when it was deleted)."""
        self._objects.pop(("pods", namespace, name), None)
        self._created.pop(("pods", namespace, name), None)
        self._pods.pop((namespace, name), None)
        self.events.append(ApiEvent("vanish", "pods", namespace, name))

    def _kill(self, runtime: _Pod) -> None:
        """What the kubelet does when a container stops: every process in it dies (open exec
        streams then end with exit code 137, as on a real cluster)."""
        for proc in list(runtime.procs):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for _ in range(50):
            pids = _marked_pids(runtime.uid)
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        for proc in list(runtime.procs):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)

    # -- exec ----------------------------------------------------------------------------------

    def exec_stream(
        self, handler: BaseHTTPRequestHandler, namespace: str, name: str, query: dict[str, list[str]]
    ) -> None:
        self._record("exec", "pods", namespace, name)
        argv = query.get("command", [])
        fault = self._take_fault("exec", "pods")
        with self.lock:
            obj = self._objects.get(("pods", namespace, name))
            runtime = self._pods.get((namespace, name))
            if obj is not None and runtime is not None and not obj["metadata"].get("deletionTimestamp"):
                self._refresh(namespace, name, obj, polled=False)
        if fault is not None:
            return _send_json(handler, fault.status, _status(fault.status, fault.reason, "injected by the double"))
        if obj is None or runtime is None:
            return _send_json(handler, 404, _status(404, "NotFound", f'pods "{name}" not found'))
        if obj["status"]["phase"] != "Running" or runtime.dead:
            return _send_json(handler, 400, _status(400, "BadRequest", f"pod {name} is not running"))
        container = obj["spec"]["containers"][0]
        if query.get("container", [container["name"]])[0] != container["name"]:
            return _send_json(handler, 400, _status(400, "BadRequest", "container not found"))
        if not argv:
            return _send_json(handler, 400, _status(400, "BadRequest", "you must specify at least 1 command"))
        if "--reclaim" in argv:
            message = "the double runs execs on the host: it refuses --reclaim (kill(-1) would reach host processes)"
            return _send_json(handler, 400, _status(400, "BadRequest", message))
        offered = [p.strip() for p in handler.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        protocol = next((p for p in self.protocols if p in offered), None)
        key = handler.headers.get("Sec-WebSocket-Key")
        if handler.headers.get("Upgrade", "").lower() != "websocket" or not key or protocol is None:
            return _send_json(
                handler, 400, _status(400, "BadRequest", "a WebSocket upgrade with a channel protocol is required")
            )
        accept = base64.b64encode(hashlib.sha1((key + WS_GUID).encode()).digest()).decode()
        handler.send_response(101, "Switching Protocols")
        handler.send_header("Upgrade", "websocket")
        handler.send_header("Connection", "Upgrade")
        handler.send_header("Sec-WebSocket-Accept", accept)
        handler.send_header("Sec-WebSocket-Protocol", protocol)
        handler.end_headers()
        handler.wfile.flush()
        handler.close_connection = True
        ws = _WebSocket(handler.connection, handler.rfile)
        record = ExecRecord(namespace, name, list(argv), protocol)
        with self.lock:
            self.execs.append(record)
            runtime.streams.append(ws)
        self._run_exec(ws, runtime, obj["spec"], container, argv, query, record)

    def _run_exec(
        self,
        ws: _WebSocket,
        runtime: _Pod,
        pod_spec: dict[str, Any],
        container: dict[str, Any],
        argv: list[str],
        query: dict[str, list[str]],
        record: ExecRecord,
    ) -> None:
        want = {
            ch: query.get(name, ["false"])[0] in ("true", "1")
            for ch, name in ((STDIN, "stdin"), (STDOUT, "stdout"), (STDERR, "stderr"))
        }
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), MARKER: runtime.uid}
        if self.real_paths:
            command, cwd = _in_mount_namespace(runtime, container.get("workingDir") or "/") + argv, str(runtime.root)
            for item in container.get("env") or []:
                env[item["name"]] = str(item.get("value", ""))
        else:
            command = [runtime.map_path(arg) for arg in argv]
            for item in container.get("env") or []:
                env[item["name"]] = runtime.map_path(str(item.get("value", "")))
            cwd = runtime.map_path(container.get("workingDir") or "/")
            if cwd == "/":
                cwd = str(runtime.root)
        try:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE if want[STDIN] else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=env,
                start_new_session=True,
                **_identity(pod_spec, container),
            )
        except OSError as exc:
            record.exit_code = 126
            ws.send_channel(STATUS, json.dumps(_status(500, "InternalError", f"exec failed: {exc}")).encode())
            ws.close()
            return
        with self.lock:
            runtime.procs.append(proc)
        ws.send_channel(STDOUT if want[STDOUT] else STDERR, b"")
        assert proc.stdout is not None and proc.stderr is not None
        pumps = [
            threading.Thread(target=self._pump, args=(proc.stdout, ws, STDOUT if want[STDOUT] else None), daemon=True),
            threading.Thread(target=self._pump, args=(proc.stderr, ws, STDERR if want[STDERR] else None), daemon=True),
        ]
        for pump in pumps:
            pump.start()
        done, reader_done = threading.Event(), threading.Event()
        finisher = threading.Thread(target=self._finish, args=(proc, pumps, ws, record, done, reader_done), daemon=True)
        finisher.start()
        message: tuple[int, bytes] | None = None
        try:
            while True:
                message = ws.recv()
                if message is None or message[0] == OP_CLOSE:
                    break
                data = message[1]
                if not data:
                    continue
                with self.lock:
                    self.counters["stream_messages"] += 1
                if self.latency_s:
                    time.sleep(self.latency_s)
                channel, payload = data[0], data[1:]
                if channel == STDIN and proc.stdin is not None:
                    record.stdin_bytes += len(payload)
                    with contextlib.suppress(OSError, ValueError):
                        proc.stdin.write(payload)
                        proc.stdin.flush()
                elif channel == CLOSE and record.protocol == V5 and payload[:1] == bytes([STDIN]) and proc.stdin:
                    with contextlib.suppress(OSError):
                        proc.stdin.close()
            if not done.is_set():
                record.broken = message is None
        finally:
            reader_done.set()
            if proc.stdin is not None:
                with contextlib.suppress(OSError, ValueError):
                    proc.stdin.close()
            with self.lock:
                if ws in runtime.streams:
                    runtime.streams.remove(ws)

    @staticmethod
    def _pump(stream: IO[bytes], ws: _WebSocket, channel: int | None) -> None:
        while True:
            try:
                chunk = os.read(stream.fileno(), 65536)
            except OSError:
                break
            if not chunk:
                break
            if channel is not None:
                ws.send_channel(channel, chunk)
        stream.close()

    @staticmethod
    def _finish(
        proc: subprocess.Popen[bytes],
        pumps: list[threading.Thread],
        ws: _WebSocket,
        record: ExecRecord,
        done: threading.Event,
        reader_done: threading.Event,
    ) -> None:
        """When the process has exited and its output is sent: the exit Status, then close."""
        code = proc.wait()
        for pump in pumps:
            pump.join()
        record.exit_code = code
        ws.send_channel(STATUS, json.dumps(_exit_status(code if code >= 0 else 128 - code)).encode())
        ws.close()
        done.set()
        if not reader_done.wait(timeout=5):  # the client never answered the close frame
            ws.cut()

    # -- TLS (bench) ---------------------------------------------------------------------------

    def _tls_context(self) -> ssl.SSLContext:
        cert, key = self._base / "tls.crt", self._base / "tls.key"
        subprocess.run(
            [
                "openssl",
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                str(key),
                "-out",
                str(cert),
                "-days",
                "1",
                "-subj",
                "/CN=127.0.0.1",
                "-addext",
                "subjectAltName=IP:127.0.0.1",
            ],
            check=True,
            capture_output=True,
        )
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        self.ca_file = str(cert)
        return context


def _in_mount_namespace(runtime: _Pod, working_dir: str) -> list[str]:
    """bwrap argv that shows the pod's volumes at their real paths (`real_paths=True`).

    Absolute paths written inside a pod (a virtual environment's scripts and `.pth` files) then
    mean the same in every pod, as in a cluster. The host's top-level folders are bound as they
    are, less those a volume replaces; nothing else is isolated (same network, same pids).
    """
    tops = {mount.strip("/").split("/")[0] for mount in runtime.mounts}
    argv = ["bwrap"]
    for entry in sorted(os.listdir("/")):
        path = "/" + entry
        if entry in tops:
            continue
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--dev-bind", path, path]
    for mount in sorted(runtime.mounts, key=len):  # parents before the volumes nested in them
        argv += ["--bind", str(runtime.root) + mount, mount]
    return [*argv, "--chdir", working_dir, "--"]


def _identity(pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """Run as the pod's runAsUser/runAsGroup (and fsGroup) when the double can, i.e. as root."""
    if os.geteuid() != 0:
        return {}
    pod_ctx, ctx = pod_spec.get("securityContext") or {}, container.get("securityContext") or {}
    uid = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
    if uid is None:
        return {}
    gid = ctx.get("runAsGroup", pod_ctx.get("runAsGroup", uid))
    extra = [pod_ctx["fsGroup"]] if pod_ctx.get("fsGroup") is not None else []
    return {"user": int(uid), "group": int(gid), "extra_groups": extra}


def _marked_pids(uid: str) -> list[int]:
    """Processes whose environment carries this pod's marker (exec'd processes and their children)."""
    needle = f"{MARKER}={uid}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if needle in handle.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def _send_json(handler: BaseHTTPRequestHandler, code: int, body: Any) -> None:
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class _Server(ThreadingHTTPServer):
    double: KubernetesApiDouble

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        # Headers and body leave in separate writes: without this, Nagle and delayed ACKs add 40 ms.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.double.lock:
            self.double.counters["connections"] += 1
        if self.double.latency_s:
            time.sleep(self.double.latency_s)
        return sock, address


def _handler_class(double: KubernetesApiDouble) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_DELETE(self) -> None:
            self._serve("DELETE")

        def do_PUT(self) -> None:
            self._serve("PUT")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def _serve(self, method: str) -> None:
            with double.lock:
                double.counters["requests"] += 1
            if double.latency_s:
                time.sleep(double.latency_s)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if double.token and self.headers.get("Authorization") != f"Bearer {double.token}":
                return _send_json(self, 401, _status(401, "Unauthorized", "Unauthorized"))
            split = urlsplit(self.path)
            query = parse_qs(split.query, keep_blank_values=True)
            answered = double.serve_doctor(method, split.path, raw)
            if answered is not None:
                return _send_json(self, *answered)
            for pattern, _ in ROUTES:
                match = pattern.match(split.path)
                if match:
                    break
            else:
                return _send_json(self, 404, _status(404, "NotFound", f"the double does not serve {split.path}"))
            namespace, kind, name, sub = match.group(1), match.group(2), match.group(3) or "", match.group(4)
            if sub == "exec":
                if method not in ("GET", "POST"):
                    return _send_json(self, 405, _status(405, "MethodNotAllowed", "exec is GET or POST"))
                return double.exec_stream(self, namespace, name, query)
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                return _send_json(self, 400, _status(400, "BadRequest", "the body is not JSON"))
            code, answer = double.handle(method, kind, namespace, name, query, body)
            _send_json(self, code, answer)

    return Handler
