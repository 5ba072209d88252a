"""Keeping the node's ResourceSlice in the API equal to what the agent would publish now.

As upstream's resource-slice controller does: the slice is owned by the Node (deleted with it), a change to
the pool's devices raises ``pool.generation`` (schedulers use only the newest generation of a pool), an
unchanged pool is not written, and on an orderly shutdown the slice is deleted (the kubelet also deletes a
driver's slices on its node when the driver stays unregistered, after a crash). Other slices of the same
driver on this node (an older agent's names) are deleted so that one pool has one slice.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from gpusched.agent.dra.claims import ClaimNotFound, ClaimSource
from gpusched.agent.dra.slices import NodeSlice

log = logging.getLogger(__name__)

API_VERSION = "resource.k8s.io/v1"


class SliceApi(Protocol):
    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        """The ResourceSlices of ``driver`` on ``node`` (selected by driver and node)."""
        ...

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def delete_slice(self, name: str) -> None: ...

    def node_uid(self, node: str) -> str | None:
        """The Node's UID (the slice's owner), None when there is no Node of that name."""
        ...


class DraApi(SliceApi, ClaimSource, Protocol):
    """What the DRA driver needs of the API: its slices and the claims it prepares."""


def _comparable(spec: Mapping[str, Any]) -> str:
    s = json.loads(json.dumps(spec))
    s.get("pool", {}).pop("generation", None)
    return json.dumps(s, sort_keys=True)


class SlicePublisher:
    def __init__(self, api: SliceApi) -> None:
        self.api = api
        self.writes = 0
        # slice name -> (resourceVersion, spec without generation) of this publisher's last write: the
        # apiserver normalises what it stores (quantities, defaults): an unchanged slice is known by version
        self._written: dict[str, tuple[str, str]] = {}

    def sync(self, want: NodeSlice) -> bool:
        """Makes the API's slices of the pool ``want``; True when something was written. A pool is written
        whole: when one of its slices changes, all are written with the next generation (schedulers use only
        a pool's newest generation, and only when all its slices are there)."""
        parts = want.specs(0)
        names = {name for name, _ in parts}
        have: dict[str, dict[str, Any]] = {}
        wrote = False
        for s in self.api.list_slices(want.driver, want.node):
            name = str((s.get("metadata") or {}).get("name"))
            if name in names:
                have[name] = s
            else:
                log.info("deleting ResourceSlice %s (not a slice of this agent's pool)", name)
                self.api.delete_slice(name)
                wrote = True
        desired = {name: _comparable(spec) for name, spec in parts}
        if not wrote and all(self._unchanged(have.get(n), n, desired[n]) for n in names):
            return False
        generation = 1 + max(
            (int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0) for s in have.values()),
            default=0,
        )
        uid = self.api.node_uid(want.node)
        for name, spec in want.specs(generation):
            body: dict[str, Any] = {
                "apiVersion": API_VERSION,
                "kind": "ResourceSlice",
                "metadata": {"name": name},
            }
            if uid:
                body["metadata"]["ownerReferences"] = [
                    {"apiVersion": "v1", "kind": "Node", "name": want.node, "uid": uid, "controller": True}
                ]
            body["spec"] = spec
            mine = have.get(name)
            if mine is None:
                stored = self.api.create_slice(body)
                log.info("created ResourceSlice %s (generation %d)", name, generation)
            else:
                body["metadata"]["resourceVersion"] = (mine.get("metadata") or {}).get("resourceVersion")
                stored = self.api.replace_slice(name, body)
                log.info("updated ResourceSlice %s to generation %d", name, generation)
            self._written[name] = (str((stored.get("metadata") or {}).get("resourceVersion")), desired[name])
            self.writes += 1
        return True

    def _unchanged(self, stored: Mapping[str, Any] | None, name: str, desired: str) -> bool:
        if stored is None:
            return False
        rv = str((stored.get("metadata") or {}).get("resourceVersion"))
        return self._written.get(name) == (rv, desired) or _comparable(stored.get("spec") or {}) == desired

    def delete(self, want: NodeSlice) -> None:
        for s in self.api.list_slices(want.driver, want.node):
            name = str((s.get("metadata") or {}).get("name"))
            self.api.delete_slice(name)
            log.info("deleted ResourceSlice %s", name)


class MemorySlices:
    """A SliceApi in memory (tests, ``--no-api``)."""

    def __init__(self, node_uids: Mapping[str, str] | None = None) -> None:
        self.slices: dict[str, dict[str, Any]] = {}
        self.claims: dict[tuple[str, str], dict[str, Any]] = {}
        self.node_uids = dict(node_uids or {})
        self._rv = 0

    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        return [
            json.loads(json.dumps(s))
            for s in self.slices.values()
            if s["spec"].get("driver") == driver and s["spec"].get("nodeName") == node
        ]

    def _store(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._rv += 1
        s: dict[str, Any] = json.loads(json.dumps(body))
        s["metadata"]["resourceVersion"] = str(self._rv)
        self.slices[s["metadata"]["name"]] = s
        return s

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        if body["metadata"]["name"] in self.slices:
            raise KeyError(f"ResourceSlice {body['metadata']['name']} exists")
        return self._store(body)

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        have = self.slices.get(name)
        if have is None or have["metadata"]["resourceVersion"] != body["metadata"].get("resourceVersion"):
            raise KeyError(f"ResourceSlice {name}: conflict")
        return self._store(body)

    def delete_slice(self, name: str) -> None:
        self.slices.pop(name, None)

    def node_uid(self, node: str) -> str | None:
        return self.node_uids.get(node)

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        c = self.claims.get((namespace, name))
        if c is None:
            raise ClaimNotFound(f"ResourceClaim {namespace}/{name} not found")
        return dict(json.loads(json.dumps(c)))


class KubeSlices:
    """SliceApi and ClaimSource over the Kubernetes API (``resource.k8s.io/v1``)."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self._api = api_client(kubeconfig, qps_pool=4)
        self._resource = client.ResourceV1Api(self._api)
        self._core = client.CoreV1Api(self._api)

    def list_slices(self, driver: str, node: str) -> list[dict[str, Any]]:
        resp: Any = self._resource.list_resource_slice(
            field_selector=f"spec.driver={driver},spec.nodeName={node}", _preload_content=False
        )
        return list(json.loads(resp.data).get("items") or [])

    def create_slice(self, body: Mapping[str, Any]) -> dict[str, Any]:
        resp: Any = self._resource.create_resource_slice(
            dict(body),  # type: ignore[arg-type]
            _preload_content=False,
        )
        return dict(json.loads(resp.data))

    def replace_slice(self, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        resp: Any = self._resource.replace_resource_slice(
            name,
            dict(body),  # type: ignore[arg-type]
            _preload_content=False,
        )
        return dict(json.loads(resp.data))

    def delete_slice(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._resource.delete_resource_slice(name, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise

    def node_uid(self, node: str) -> str | None:
        from kubernetes.client.exceptions import ApiException

        try:
            resp: Any = self._core.read_node(node, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return str(json.loads(resp.data)["metadata"]["uid"])

    def get_claim(self, namespace: str, name: str) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            resp: Any = self._resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                raise ClaimNotFound(f"ResourceClaim {namespace}/{name} not found") from None
            raise
        return dict(json.loads(resp.data))
