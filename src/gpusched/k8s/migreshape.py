"""The scheduler asks a node agent to re-cut a GPU's free MIG slices when a MIG pod fits nowhere (issue 31
item 3, way (a)).

For a pod whose MIG slices find no free instance, ``MigReshapes.consider`` plans a re-cut on every node with
a known geometry whose labels the pod's ``nodeSelector`` matches (``core.mig.reshape.plan_node``: only free
slices, the instances pods hold stay), takes the one that serves all its slices with the fewest instances
destroyed (then the node name), and writes the request on that Node (``gpusched.io/mig-reshape``). While the
agent has not answered, the books place nothing on that GPU (``NodeMig.reshaping``, read from the Node by
``k8s/migconvert.py``); its answer (``gpusched.io/mig-reshape-status``) and the new geometry come back through
the Node, and the pod is tried again. A request the agent answers ``failed`` (it rolled back) or does not
answer within ``timeout_s`` (withdrawn) leaves a ``MIGReshapeFailed`` Warning event on the pod. One request
per pod and per node at a time. Only a pod whose slices find no free instance on any node its
``nodeSelector`` matches is considered (one kept off by a taint or CPU is not); its other constraints
(taints, affinity) are not checked on the node re-cut: a re-cut they forbid is wasted, never wrong.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpusched.core.mig.books import demand_of
from gpusched.core.mig.reshape import GpuRecut, plan_node
from gpusched.core.model import PodSpec
from gpusched.core.names import ANN_MIG_RESHAPE, ANN_MIG_RESHAPE_STATUS
from gpusched.k8s.state import LiveCluster

log = logging.getLogger(__name__)

REASON = "MIGReshapeFailed"


class Warner(Protocol):
    def failed(
        self, pod: Mapping[str, Any], message: str, reason: str = ..., condition: bool = ...
    ) -> bool: ...


@dataclass
class _Asked:
    rid: str
    node: str
    gpu: int
    pod: Mapping[str, Any]
    at: float


def request_json(rid: str, plan: GpuRecut, pod: str = "") -> str:
    def places(xs: tuple[Any, ...]) -> list[dict[str, Any]]:
        return [{"profile": i.profile, "start": i.start} for i in xs]

    doc = {
        "id": rid,
        "gpu": plan.gpu,
        "destroy": places(plan.destroy),
        "create": places(plan.create),
        "for": pod,
    }
    return json.dumps(doc, separators=(",", ":"))


class MigReshapes:
    def __init__(
        self,
        nodes: Any,  # kubernetes.client.CoreV1Api: read_node, patch_node
        cluster: LiveCluster,
        events: Warner,
        *,
        timeout_s: float = 120.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nodes, self.cluster, self.events = nodes, cluster, events
        self.timeout_s, self.clock = timeout_s, clock
        self._asked: dict[str, _Asked] = {}  # pod key -> its outstanding request
        self._lock = threading.Lock()

    def consider(self, pod: PodSpec, obj: Mapping[str, Any]) -> str:
        """For an unschedulable pod: settle the requests answered or overdue, then ask for a re-cut for this
        one if it has none outstanding and one serves it. Returns a note for its FailedScheduling message."""
        if not pod.mig:
            return ""
        self.settle()
        with self._lock:
            if pod.key in self._asked:
                a = self._asked[pod.key]
                return f"; waiting for the re-cut of GPU {a.gpu} of node {a.node}"
            busy = {a.node for a in self._asked.values()}
        best: tuple[tuple[int, str], str, GpuRecut] | None = None
        with self.cluster.live_books() as snap:
            demand = demand_of(snap.mig_demand, pod.mig)
            mine = [
                n
                for n, nd in enumerate(snap.nodes)
                if nd.mig is not None and all(nd.labels.get(k) == v for k, v in pod.node_selector.items())
            ]
            if any(snap.mig_fits(pod, n) for n in mine):
                return ""  # its slices find instances: something else keeps it off (a taint, CPU...)
            for n in mine:
                nd = snap.nodes[n]
                if nd.name in busy or nd.mig is None:
                    continue
                plan = plan_node(nd.mig, snap.mig_books[n], pod.mig, demand)
                if plan is None or sorted(plan.serves) != list(pod.mig):
                    continue
                key = (len(plan.destroy), nd.name)
                if best is None or key < best[0]:
                    best = (key, nd.name, plan)
        if best is None:
            return ""
        _k, node, plan = best
        rid = f"{pod.uid or pod.key}-{uuid.uuid4().hex[:8]}"  # new after a restart too
        try:
            self.nodes.patch_node(
                node, {"metadata": {"annotations": {ANN_MIG_RESHAPE: request_json(rid, plan, pod.key)}}}
            )
        except Exception as e:  # the API may be unreachable: tried again with the pod
            log.warning("could not ask node %s for a MIG re-cut for %s: %s", node, pod.key, e)
            return ""
        with self._lock:
            self._asked[pod.key] = _Asked(rid, node, plan.gpu, obj, self.clock())
        made = ", ".join(f"{i.profile} at {i.start}" for i in plan.create)
        log.info("asked node %s to re-cut GPU %d for %s: %s (request %s)", node, plan.gpu, pod.key, made, rid)
        return f"; re-cutting GPU {plan.gpu} of node {node} for it ({made})"

    def settle(self) -> None:
        """Forget the requests the agents answered (a failure leaves an event on the pod) and withdraw those
        overdue (an event too)."""
        with self._lock:
            asked = list(self._asked.items())
        for key, a in asked:
            try:
                node = json.loads(self.nodes.read_node(a.node, _preload_content=False).data)
            except Exception as e:
                log.warning("could not read node %s for the MIG re-cut %s: %s", a.node, a.rid, e)
                continue
            ann = (node.get("metadata") or {}).get("annotations") or {}
            try:
                status = json.loads(ann.get(ANN_MIG_RESHAPE_STATUS) or "{}")
            except ValueError:
                status = {}
            if isinstance(status, dict) and status.get("id") == a.rid:
                if status.get("state") != "success":
                    self.events.failed(
                        a.pod,
                        f"the MIG re-cut of GPU {a.gpu} of node {a.node} failed and was rolled back: "
                        f"{status.get('message', '')}",
                        reason=REASON,
                        condition=False,
                    )
            elif self.clock() - a.at > self.timeout_s:
                self._withdraw(a)
            else:
                continue
            with self._lock:
                self._asked.pop(key, None)

    def _withdraw(self, a: _Asked) -> None:
        try:
            self.nodes.patch_node(a.node, {"metadata": {"annotations": {ANN_MIG_RESHAPE: None}}})
        except Exception as e:
            log.warning("could not withdraw the MIG re-cut %s on node %s: %s", a.rid, a.node, e)
        self.events.failed(
            a.pod,
            f"the MIG re-cut of GPU {a.gpu} of node {a.node} was not done within {self.timeout_s:.0f} s "
            "(the node's agent does not answer): withdrawn",
            reason=REASON,
            condition=False,
        )
