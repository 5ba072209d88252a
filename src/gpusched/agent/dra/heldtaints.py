"""Mixed nodes, the other direction: GPUs that device-plugin pods hold are tainted for other DRA drivers.

Where gpusched's agent serves ``nvidia.com/gpu`` through the device plugin and another DRA driver (NVIDIA's)
publishes the same GPUs, kube-scheduler's DRA allocator does not read gpusched's books and could give a claim
a GPU a device-plugin pod holds. The agent closes that: for every GPU a live pod on its node holds (what the
agent handed it, ``gpusched.io/allocated``, or the scheduler's assignment not yet handed out), it writes one
``DeviceTaintRule`` (``resource.k8s.io/v1``) per device of any driver's ResourceSlice on the node whose
``uuid`` (or, for a MIG device, ``parentUUID``) is that GPU's: the selector names the device by driver, pool
and name (v1 selects devices only so), the taint is ``gpusched.io/held-by-device-plugin`` with effect
``NoSchedule``. kube-scheduler then allocates no new claim to it (claims already allocated stay: NoSchedule
evicts nothing). When the GPU is free again the rule is deleted. The rules carry the label
``gpusched.io/held-gpu-node=<node>``, so each agent finds and removes exactly its own.

When: at the event, and by a resync. The device plugin's Allocate is where the agent meets a pod bound to
its node with its assignment: before Allocate answers (so before the kubelet starts the container), the rules
of the GPUs it hands out are created (``HeldTaints.add``: the slices of the last resync, only rules not known
to exist, no list call; one create per device another driver publishes, none where no DRA driver publishes).
The resync (every 10 s, and at start) lists slices, pods and rules, creates what is missing (a pod bound but
not yet admitted by the kubelet: its assignment) and deletes the rules of GPUs no longer held.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpusched.agent.allocation import ANN_ASSIGNMENT, LIVE_DONE, AllocationError, holdings, parse_assignment
from gpusched.agent.inventory import Inventory
from gpusched.core.names import ANN_HELD_GPU, LABEL_HELD_GPU_NODE, TAINT_HELD_BY_DEVICE_PLUGIN

log = logging.getLogger(__name__)

TAINT_KEY = TAINT_HELD_BY_DEVICE_PLUGIN
LABEL_NODE = LABEL_HELD_GPU_NODE
ANN_GPU = ANN_HELD_GPU
API_VERSION = "resource.k8s.io/v1"


@dataclass(frozen=True)
class HeldDevice:
    """A device of some DRA driver that is (part of) a GPU a device-plugin pod holds."""

    driver: str
    pool: str
    device: str
    gpu_uuid: str


class TaintRuleApi(Protocol):
    def slices_on_node(self, node: str) -> list[dict[str, Any]]:
        """Every driver's ResourceSlices with ``spec.nodeName`` = ``node``."""
        ...

    def list_rules(self, node: str) -> list[dict[str, Any]]:
        """The DeviceTaintRules labelled ``LABEL_NODE=node``."""
        ...

    def create_rule(self, body: Mapping[str, Any]) -> None: ...

    def delete_rule(self, name: str) -> None: ...


def held_gpus(
    pods: Sequence[Mapping[str, Any]], node: str, inv: Inventory, unwritten: Mapping[str, str]
) -> set[str]:
    """The UUIDs of the GPUs live pods on ``node`` hold: what the agent handed them, and what the scheduler
    assigned to a pod not yet started (so the GPU is tainted from the binding on)."""
    held = {h.uuid for h in holdings(pods, node, "", unwritten)}
    for pod in pods:
        meta = pod.get("metadata") or {}
        if (pod.get("spec") or {}).get("nodeName") != node or (pod.get("status") or {}).get(
            "phase"
        ) in LIVE_DONE:
            continue
        if ANN_ASSIGNMENT not in (meta.get("annotations") or {}):
            continue
        try:
            a = parse_assignment(pod)
        except AllocationError:
            continue  # the device plugin refuses it with an event of its own
        held |= {d.uuid for d in inv.devices if d.index in a.gpus}
    return held


def _attr(attrs: Mapping[str, Any], driver: str, name: str) -> str | None:
    for key in (name, f"{driver}/{name}"):
        v = attrs.get(key)
        if isinstance(v, dict) and isinstance(v.get("string"), str):
            return str(v["string"])
    return None


def held_devices(slices: Sequence[Mapping[str, Any]], held: Collection[str]) -> list[HeldDevice]:
    """The devices of ``slices`` that are one of the ``held`` GPUs (by ``uuid``) or part of one (a MIG
    device's ``parentUUID``)."""
    out = []
    for s in slices:
        spec = s.get("spec") or {}
        driver, pool = str(spec.get("driver", "")), str((spec.get("pool") or {}).get("name", ""))
        for d in spec.get("devices") or []:
            attrs = d.get("attributes") or {}
            for key in ("uuid", "parentUUID"):
                u = _attr(attrs, driver, key)
                if u is not None and u in held:
                    out.append(HeldDevice(driver, pool, str(d.get("name")), u))
                    break
    return sorted(set(out), key=lambda h: (h.driver, h.pool, h.device))


def rule_name(node: str, d: HeldDevice) -> str:
    digest = hashlib.sha256(f"{d.driver}/{d.pool}/{d.device}".encode()).hexdigest()[:10]
    return f"gpusched-held-{node[:200].rstrip('.-')}-{digest}"


def rule(node: str, d: HeldDevice) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(node, d),
            "labels": {LABEL_NODE: node},
            "annotations": {ANN_GPU: d.gpu_uuid},
        },
        "spec": {
            "deviceSelector": {"driver": d.driver, "pool": d.pool, "device": d.device},
            "taint": {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"},
        },
    }


class HeldTaints:
    """Keeps this node's DeviceTaintRules equal to the GPUs its device-plugin pods hold."""

    def __init__(self, api: TaintRuleApi, node: str) -> None:
        self.api, self.node = api, node
        self._last_error = ""
        self._rules_left = True  # unknown at start: an earlier agent may have left rules
        self._slices: list[dict[str, Any]] = []  # the node's slices as the last resync read them
        self._have: set[str] = set()  # the rule names known to exist (last resync, and created since)
        self._seq = 0  # counts the event path's creations
        self._added: dict[str, int] = {}  # rule name -> its creation's number (the event path's)
        self._lock = threading.Lock()  # Allocate's threads and the resync

    def _failed(self, e: Exception) -> None:
        if str(e) != self._last_error:  # logged once while it repeats
            log.warning("could not keep the DeviceTaintRules of GPUs held on %s: %s", self.node, e)
        self._last_error = str(e)

    def slices(self) -> list[dict[str, Any]] | None:
        """The ResourceSlices on this node; None (logged) when the API did not answer."""
        try:
            slices = self.api.slices_on_node(self.node)
        except Exception as e:  # the API unreachable, resource.k8s.io not served, RBAC: retried
            self._failed(e)
            return None
        self._slices = slices
        return slices

    def add(self, gpus: Collection[str]) -> list[str]:
        """The event: ``gpus`` were just handed to a pod. Creates their rules not known to exist, against the
        slices the last resync read (no list call); deletes nothing. Returns the rule names created; API
        errors are logged (the resync retries)."""
        with self._lock:
            want = {rule_name(self.node, d): d for d in held_devices(self._slices, gpus)}
            created = []
            try:
                for name in sorted(set(want) - self._have):
                    self.api.create_rule(rule(self.node, want[name]))
                    self._have.add(name)
                    self._seq += 1
                    self._added[name] = self._seq
                    self._rules_left = True
                    d = want[name]
                    log.info(
                        "GPU %s handed to a device-plugin pod: tainted %s/%s/%s for DRA (DeviceTaintRule %s)",
                        d.gpu_uuid,
                        d.driver,
                        d.pool,
                        d.device,
                        name,
                    )
                    created.append(name)
            except Exception as e:
                self._failed(e)
            return created

    def needed(self, slices: Sequence[Mapping[str, Any]]) -> bool:
        """Whether a pass can change anything: a device on this node names a GPU, or rules are left. On a
        node no DRA driver publishes, the agent thus reads no pods and no rules for this."""
        return self._rules_left or self.published(slices)

    @staticmethod
    def published(slices: Sequence[Mapping[str, Any]]) -> bool:
        """Whether a device of ``slices`` names a GPU (``uuid`` or ``parentUUID``)."""
        return any(
            _attr(d.get("attributes") or {}, str((s.get("spec") or {}).get("driver", "")), k) is not None
            for s in slices
            for d in (s.get("spec") or {}).get("devices") or []
            for k in ("uuid", "parentUUID")
        )

    def mark(self) -> int:
        """Taken before the pods a resync reads are listed: rules the event path creates after it are not
        deleted by that resync (its pod list may predate their pod)."""
        with self._lock:
            return self._seq

    def sync(
        self,
        held: Collection[str],
        slices: Sequence[Mapping[str, Any]] | None = None,
        mark: int | None = None,
    ) -> tuple[list[str], list[str]]:
        """Creates the missing rules and deletes those of GPUs no longer held (``slices``: the node's, read
        now when not given; ``mark``: ``mark()`` before ``held`` was read); returns (created, deleted) rule
        names. API errors are logged (once while they repeat) and retried at the next call."""
        with self._lock:
            return self._sync(held, slices, self._seq if mark is None else mark)

    def _sync(
        self, held: Collection[str], slices: Sequence[Mapping[str, Any]] | None, mark: int
    ) -> tuple[list[str], list[str]]:
        try:
            if slices is None:
                slices = self.api.slices_on_node(self.node)
            self._slices = [dict(s) for s in slices]
            want = {rule_name(self.node, d): d for d in held_devices(slices, held)}
            have = {str((r.get("metadata") or {}).get("name")) for r in self.api.list_rules(self.node)}
            newer = {n for n, seq in self._added.items() if seq > mark}  # made after the pods were read
            created, deleted = [], []
            for name in sorted(set(want) - have):
                self.api.create_rule(rule(self.node, want[name]))
                d = want[name]
                log.info("GPU %s held by a device-plugin pod: tainted %s/%s/%s for DRA (DeviceTaintRule %s)",
                         d.gpu_uuid, d.driver, d.pool, d.device, name)  # fmt: skip
                created.append(name)
            for name in sorted(have - set(want) - newer):
                self.api.delete_rule(name)
                log.info("DeviceTaintRule %s deleted: its GPU is no longer held by a device-plugin pod", name)
                deleted.append(name)
        except Exception as e:
            self._failed(e)
            return [], []
        self._have = set(want) | (have & newer)
        self._added = {n: seq for n, seq in self._added.items() if seq > mark}
        self._last_error = ""
        self._rules_left = bool(self._have)
        return created, deleted


class MemoryTaintRules:
    """A TaintRuleApi in memory (tests)."""

    def __init__(self, slices: Sequence[Mapping[str, Any]] = ()) -> None:
        self.slices = [json.loads(json.dumps(s)) for s in slices]
        self.rules: dict[str, dict[str, Any]] = {}

    def slices_on_node(self, node: str) -> list[dict[str, Any]]:
        return [s for s in self.slices if (s.get("spec") or {}).get("nodeName") == node]

    def list_rules(self, node: str) -> list[dict[str, Any]]:
        return [r for r in self.rules.values() if r["metadata"]["labels"].get(LABEL_NODE) == node]

    def create_rule(self, body: Mapping[str, Any]) -> None:
        self.rules[body["metadata"]["name"]] = json.loads(json.dumps(body))

    def delete_rule(self, name: str) -> None:
        self.rules.pop(name, None)


class KubeTaintRules:
    """TaintRuleApi over the Kubernetes API (``resource.k8s.io/v1``)."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self._resource = client.ResourceV1Api(api_client(kubeconfig, qps_pool=2))

    def slices_on_node(self, node: str) -> list[dict[str, Any]]:
        resp: Any = self._resource.list_resource_slice(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        return list(json.loads(resp.data).get("items") or [])

    def list_rules(self, node: str) -> list[dict[str, Any]]:
        resp: Any = self._resource.list_device_taint_rule(
            label_selector=f"{LABEL_NODE}={node}", _preload_content=False
        )
        return list(json.loads(resp.data).get("items") or [])

    def create_rule(self, body: Mapping[str, Any]) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._resource.create_device_taint_rule(dict(body), _preload_content=False)  # type: ignore[arg-type]
        except ApiException as e:
            if e.status != 409:  # already there (written before a restart)
                raise

    def delete_rule(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self._resource.delete_device_taint_rule(name, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise
