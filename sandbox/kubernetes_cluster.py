"""The cluster side of the Kubernetes backend: the API client FrogFix uses, and the reaper of what a
dead worker left behind (pods and NetworkPolicies past their deadline). kubernetes.py makes and
drives sandboxes with these; the worker's beat runs `reap`.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

from sandbox.base import (
    SandboxUnavailable,
)
from sandbox.kubernetes_manifests import (
    ANNOTATION_DEADLINE,
    DEFAULT_NAMESPACE,
    LABEL_SANDBOX,
)
from sandbox.kubernetes_stream import (
    describe_api_error,
)

log = logging.getLogger(__name__)

_CONFIG_LOCK = threading.Lock()

_CONFIGS: dict[tuple[str | None, str | None], Any] = {}


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

    api_client = api if isinstance(api, client.ApiClient) else configured_api_client(api, None, None)
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
                    log.warning("reaper: cannot delete pod %s: %s", pod.metadata.name, describe_api_error(exc))
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
                log.warning("reaper: cannot delete network policy %s: %s", meta.name, describe_api_error(exc))
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


def configured_api_client(configuration: Any, kubeconfig: str | None, context: str | None) -> Any:
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
                            f"kubeconfig): {describe_api_error(exc)}"
                        ) from None
                _CONFIGS[key] = configuration
    return client.ApiClient(configuration)


def _parse_time(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


def make_api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """An ApiClient for the reaper and operators' commands: in-cluster, else the kubeconfig given or found."""
    return configured_api_client(None, kubeconfig, context)
