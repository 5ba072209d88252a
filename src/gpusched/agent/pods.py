"""The agent's access to Kubernetes, behind small interfaces so that tests give fakes."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

log = logging.getLogger(__name__)


class PodSource(Protocol):
    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        """The pods bound to ``node`` (any phase), as v1.Pod dicts."""
        ...

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None: ...

    def warn(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        """Record a Warning event on the pod."""
        ...


@runtime_checkable
class PodWatch(Protocol):
    def watch_pods(self, node: str, on_pod: Callable[[Mapping[str, Any]], None]) -> Callable[[], None]:
        """Calls ``on_pod`` with every pod bound to ``node`` as it is listed, added or changed (from
        another thread), until the returned function is called."""
        ...


class NodeWriter(Protocol):
    def get_node(self, name: str) -> dict[str, Any]: ...

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None: ...


class MemoryPods:
    """An in-memory PodSource and NodeWriter (tests, benchmarks, ``gpusched agent run --fake-pods``)."""

    def __init__(
        self, pods: list[dict[str, Any]] | None = None, nodes: dict[str, dict[str, Any]] | None = None
    ):
        self.pods = list(pods or [])
        self.nodes = dict(nodes or {})
        self.events: list[tuple[str, str, str]] = []
        self.node_patches: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        self._watchers: list[tuple[str, Callable[[Mapping[str, Any]], None]]] = []

    def watch_pods(self, node: str, on_pod: Callable[[Mapping[str, Any]], None]) -> Callable[[], None]:
        w = (node, on_pod)
        self._watchers.append(w)
        for p in self.pods_on_node(node):
            on_pod(p)
        return lambda: self._watchers.remove(w)

    def bind(self, pod: dict[str, Any]) -> None:
        """A pod bound (added): watchers of its node see it."""
        with self._lock:
            self.pods.append(pod)
        node = (pod.get("spec") or {}).get("nodeName")
        for n, on_pod in list(self._watchers):
            if n == node:
                on_pod(pod)

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        with self._lock:
            return [p for p in self.pods if (p.get("spec") or {}).get("nodeName") == node]

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        with self._lock:
            for p in self.pods:
                m = p.setdefault("metadata", {})
                if m.get("namespace", "default") == namespace and m.get("name") == name:
                    m.setdefault("annotations", {}).update(annotations)

    def warn(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        m = pod.get("metadata") or {}
        self.events.append((f"{m.get('namespace', 'default')}/{m.get('name')}", reason, message))

    def get_node(self, name: str) -> dict[str, Any]:
        return self.nodes.setdefault(name, {"metadata": {"name": name}})

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        node = self.get_node(name)
        self.node_patches.append((name, json.loads(json.dumps(patch))))
        _merge(node, patch)


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        elif isinstance(v, Mapping) and isinstance(target.get(k), dict):
            _merge(target[k], v)
        else:
            target[k] = json.loads(json.dumps(v))


class KubePods:
    """PodSource and NodeWriter over the Kubernetes API (kubeconfig or in-cluster)."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self._api = api_client(kubeconfig, qps_pool=4)
        self._core = client.CoreV1Api(self._api)

    def pods_on_node(self, node: str) -> list[dict[str, Any]]:
        resp = self._core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        return list(json.loads(resp.data).get("items") or [])  # type: ignore[attr-defined]

    def watch_pods(self, node: str, on_pod: Callable[[Mapping[str, Any]], None]) -> Callable[[], None]:
        from gpusched.k8s.informer import Handlers, Reflector

        r = Reflector(
            f"pods-on-{node}",
            self._core.list_pod_for_all_namespaces,
            Handlers(on_pod, lambda _obj: None),
            field_selector=f"spec.nodeName={node}",
        ).start()
        return r.stop

    def annotate_pod(self, namespace: str, name: str, annotations: Mapping[str, str]) -> None:
        self._core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": dict(annotations)}})

    def warn(self, pod: Mapping[str, Any], reason: str, message: str) -> None:
        from kubernetes import client

        m = pod.get("metadata") or {}
        ns = m.get("namespace", "default")
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{m.get('name')}.", namespace=ns),
            involved_object=client.V1ObjectReference(
                kind="Pod", namespace=ns, name=m.get("name"), uid=m.get("uid")
            ),
            reason=reason,
            message=message[:1024],
            type="Warning",
            source=client.V1EventSource(component="gpusched-agent"),
        )
        try:
            self._core.create_namespaced_event(ns, body)
        except Exception as e:  # an event is best effort
            log.warning("could not record event on %s/%s: %s", ns, m.get("name"), e)

    def get_node(self, name: str) -> dict[str, Any]:
        resp = self._core.read_node(name, _preload_content=False)
        return dict(json.loads(resp.data))  # type: ignore[attr-defined]

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> None:
        # a JSON merge patch: null removes an annotation, and spec.taints is replaced whole
        self._core.patch_node(name, dict(patch), _content_type="application/merge-patch+json")
