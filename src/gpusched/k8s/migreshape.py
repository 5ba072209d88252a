"""The scheduler asks a node agent to re-cut a GPU's MIG geometry when MIG pods fit nowhere (issue 31 item 3).

For a pod whose MIG slices find no free instance, ``MigReshapes.consider`` takes it with the other pending MIG
pods that fit nowhere (the queue's, in its order: priority, then age) as one batch and plans, on every node
with a known geometry, one re-cut of one GPU that serves as many of them as it can in that order
(``core.mig.reshape.plan_node_batch``), in the scope of the node's way (its label
``gpusched.io/mig-reshape-way``: ``nvml``, or none, re-cuts free slices next to the instances pods hold;
``mig-manager`` re-cuts only a GPU no pod holds anything of, as a whole; ``off``, never). The node whose
re-cut serves the first pod of the batch, then the most pods, then destroys the fewest instances (then its
name) is asked (``gpusched.io/mig-reshape``), and so on for the pods left (one request per node, at most
``MAX_ASKS`` per try). While the agent has not answered, the books place nothing on that GPU
(``NodeMig.reshaping``, read from the Node by ``k8s/migconvert.py``); its answer
(``gpusched.io/mig-reshape-status``) and the new geometry come back through the Node, and the pods are tried
again. A request the agent answers ``failed`` (it rolled back) or does not answer in time (``timeout_s``;
``manager_timeout_s`` on a mig-manager node, whose agent waits for mig-manager; then withdrawn) leaves a
``MIGReshapeFailed`` Warning event on each pod it was for. One request per pod and per node at a time. Only a
pod whose slices find no free instance on any node its ``nodeSelector`` matches is considered (one kept off
by a taint or CPU is not); its other constraints (taints, affinity) are not checked on the node re-cut: a
re-cut they forbid is wasted, never wrong.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpusched.core.cluster import ClusterState
from gpusched.core.errors import GpuschedError
from gpusched.core.mig.books import demand_of
from gpusched.core.mig.measure import DemandMix
from gpusched.core.mig.reshape import GpuRecut, ReshapeWay, plan_node_batch
from gpusched.core.model import PodSpec
from gpusched.core.names import ANN_MIG_RESHAPE, ANN_MIG_RESHAPE_STATUS, LABEL_MIG_RESHAPE_WAY
from gpusched.k8s.state import LiveCluster

log = logging.getLogger(__name__)

REASON = "MIGReshapeFailed"
MAX_BATCH = 32  # pods planned together per node (one GPU hosts at most 7 slices on an A100)
MAX_PEERS = 256  # pending pods that fit nowhere taken into one consider, in the queue's order
MAX_ASKS = 4  # requests written by one consider (the pods left ask when they are tried)


class Warner(Protocol):
    def failed(
        self, pod: Mapping[str, Any], message: str, reason: str = ..., condition: bool = ...
    ) -> bool: ...


class Queued(Protocol):
    """A pending pod of the scheduling queue (``k8s.queue.QueuedPod``)."""

    @property
    def key(self) -> str: ...

    @property
    def order(self) -> tuple[int, str, int]: ...

    @property
    def obj(self) -> Mapping[str, Any]: ...

    def spec(self) -> PodSpec: ...


class PendingPods(Protocol):
    """The scheduling queue: the pods pending now (``k8s.queue.SchedulingQueue``)."""

    def pending(self) -> Sequence[Queued]: ...


@dataclass
class _Asked:
    rid: str
    node: str
    gpu: int
    pod: Mapping[str, Any]
    at: float
    timeout_s: float


@dataclass(frozen=True)
class _Waiting:
    spec: PodSpec
    obj: Mapping[str, Any]
    nodes: tuple[int, ...]  # the nodes with a MIG geometry its nodeSelector matches


_Plans = dict[int, "tuple[GpuRecut, tuple[str, ...]] | None"]  # node -> its re-cut, the pods it serves


def node_way(labels: Mapping[str, str]) -> ReshapeWay | None:
    """The node's reshape way by its label (none: ``nvml``); None for a value that is no way (logged)."""
    value = labels.get(LABEL_MIG_RESHAPE_WAY)
    try:
        return ReshapeWay.NVML if value is None else ReshapeWay.parse(value, f"label {LABEL_MIG_RESHAPE_WAY}")
    except GpuschedError as e:
        log.warning("no MIG re-cut on a node: %s", e)
        return None


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
        pending: PendingPods | None = None,
        timeout_s: float = 120.0,
        manager_timeout_s: float = 660.0,  # the agent waits 600 s for mig-manager by default
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nodes, self.cluster, self.events, self.pending = nodes, cluster, events, pending
        self.timeout_s, self.manager_timeout_s, self.clock = timeout_s, manager_timeout_s, clock
        self._asked: dict[str, _Asked] = {}  # pod key -> its outstanding request
        self._lock = threading.Lock()

    def consider(self, pod: PodSpec, obj: Mapping[str, Any]) -> str:
        """For an unschedulable pod: settle the requests answered or overdue, then ask for re-cuts for it and
        the other pending MIG pods that fit nowhere and have none outstanding. Returns a note for its
        FailedScheduling message."""
        if not pod.mig:
            return ""
        self.settle()
        with self._lock:
            if pod.key in self._asked:
                a = self._asked[pod.key]
                return f"; waiting for the re-cut of GPU {a.gpu} of node {a.node}"
            busy = {a.node for a in self._asked.values()}
            asked = set(self._asked)
        peers = self._peers(asked)
        asks: list[tuple[str, GpuRecut, list[_Waiting], float]] = []
        with self.cluster.live_books() as snap:
            me = self._waiting(snap, pod, obj)
            if me is None:
                return ""  # its slices find instances: something else keeps it off (a taint, CPU...)
            batch: list[_Waiting] = []
            nowhere: dict[tuple[tuple[tuple[str, str], ...], tuple[str, ...]], tuple[int, ...] | None] = {}
            for spec, o in peers:
                if spec.key == pod.key:
                    batch.append(me)
                    continue
                like = (tuple(sorted(spec.node_selector.items())), spec.mig)  # pods alike fit alike
                if like not in nowhere:
                    nowhere[like] = self._nowhere(snap, spec)
                mine = nowhere[like]
                if mine is not None and spec.key not in snap.allocations:
                    batch.append(_Waiting(spec, o, mine))
                    if len(batch) >= MAX_PEERS:
                        break
            if not any(w is me for w in batch):
                batch.insert(0, me)  # not in the queue (being decided): first
            demand = demand_of(snap.mig_demand, [p for w in batch for p in w.spec.mig])
            plans: _Plans = {}
            while batch and len(asks) < MAX_ASKS:
                best = self._best(snap, batch, busy, demand, plans)
                if best is None:
                    break
                node, plan, served, timeout = best
                asks.append((node, plan, [batch[k] for k in served], timeout))
                busy.add(node)
                batch = [w for k, w in enumerate(batch) if k not in served]
        note = ""
        for node, plan, pods, timeout in asks:
            if self._ask(node, plan, pods, timeout) and any(w.spec.key == pod.key for w in pods):
                made = ", ".join(f"{i.profile} at {i.start}" for i in plan.create)
                others = f"; {len(pods) - 1} other pod(s) wait for it too" if len(pods) > 1 else ""
                note = f"; re-cutting GPU {plan.gpu} of node {node} for it ({made}){others}"
        return note

    def _peers(self, asked: set[str]) -> list[tuple[PodSpec, Mapping[str, Any]]]:
        """The pending MIG pods without a request outstanding (``key``'s own entry too), in the queue's order
        (priority, then age)."""
        out = []
        for q in sorted(self.pending.pending() if self.pending is not None else (), key=lambda q: q.order):
            if q.key in asked or (q.obj.get("spec") or {}).get("schedulingGates"):
                continue
            try:
                spec = q.spec()
            except GpuschedError:
                continue  # told elsewhere (InvalidGPURequest)
            if spec.mig:
                out.append((spec, q.obj))
        return out

    @classmethod
    def _waiting(cls, snap: ClusterState, pod: PodSpec, obj: Mapping[str, Any]) -> _Waiting | None:
        """The pod as a member of the batch: unbooked, its slices find no free instance on any node its
        nodeSelector matches (None otherwise)."""
        mine = cls._nowhere(snap, pod)
        return None if mine is None or pod.key in snap.allocations else _Waiting(pod, obj, mine)

    @staticmethod
    def _nowhere(snap: ClusterState, pod: PodSpec) -> tuple[int, ...] | None:
        """The nodes with a MIG geometry that the pod's nodeSelector matches, when its slices find no free
        instance on any of them; None when they do."""
        mine = tuple(
            n
            for n, nd in enumerate(snap.nodes)
            if nd.mig is not None and all(nd.labels.get(k) == v for k, v in pod.node_selector.items())
        )
        return None if any(snap.mig_fits(pod, n) for n in mine) else mine

    def _best(
        self, snap: ClusterState, batch: list[_Waiting], busy: set[str], demand: DemandMix, plans: _Plans
    ) -> tuple[str, GpuRecut, tuple[int, ...], float] | None:
        """The node whose one re-cut serves the first pod of ``batch`` it can, then the most, then destroys
        the fewest instances, then by name; with that re-cut, the pods it serves and the answer's timeout.
        ``plans``: each node's re-cut and the pods it serves, kept across the calls of one ``consider`` (a
        node's stays right while none of its pods is served elsewhere: the others were refused already)."""
        at = {w.spec.key: k for k, w in enumerate(batch)}
        best: tuple[tuple[int, int, int, str], str, GpuRecut, tuple[int, ...], float] | None = None
        for n, nd in enumerate(snap.nodes):
            if nd.mig is None or nd.name in busy:
                continue
            way = node_way(nd.labels)
            if way is None or way.scope is None:
                continue
            had = plans.get(n)
            if n not in plans or (had is not None and any(k not in at for k in had[1])):
                plans[n] = self._plan(snap, n, batch, demand, way)
            got = plans[n]
            if got is None:
                continue
            plan, served = got[0], tuple(at[k] for k in got[1])
            key = (served[0], -len(served), len(plan.destroy), nd.name)
            if best is None or key < best[0]:
                timeout = self.manager_timeout_s if way is ReshapeWay.MIG_MANAGER else self.timeout_s
                best = (key, nd.name, plan, served, timeout)
        return None if best is None else best[1:]

    @staticmethod
    def _plan(
        snap: ClusterState, n: int, batch: list[_Waiting], demand: DemandMix, way: ReshapeWay
    ) -> tuple[GpuRecut, tuple[str, ...]] | None:
        """Node ``n``'s one re-cut for the pods of ``batch`` it may host, and the pods (keys) it serves."""
        nd = snap.nodes[n]
        members = [k for k, w in enumerate(batch) if n in w.nodes][:MAX_BATCH]
        if nd.mig is None or way.scope is None or not members:
            return None
        found = plan_node_batch(
            nd.mig, snap.mig_books[n], [batch[k].spec.mig for k in members], demand, way.scope
        )
        return None if found is None else (found[0], tuple(batch[members[i]].spec.key for i in found[1]))

    def _ask(self, node: str, plan: GpuRecut, served: list[_Waiting], timeout_s: float) -> bool:
        first = served[0].spec
        rid = f"{first.uid or first.key}-{uuid.uuid4().hex[:8]}"  # new after a restart too
        pods = ",".join(w.spec.key for w in served)
        try:
            self.nodes.patch_node(
                node, {"metadata": {"annotations": {ANN_MIG_RESHAPE: request_json(rid, plan, pods)}}}
            )
        except Exception as e:  # the API may be unreachable: tried again with the pod
            log.warning("could not ask node %s for a MIG re-cut for %s: %s", node, pods, e)
            return False
        now = self.clock()
        with self._lock:
            for w in served:
                self._asked[w.spec.key] = _Asked(rid, node, plan.gpu, w.obj, now, timeout_s)
        made = ", ".join(f"{i.profile} at {i.start}" for i in plan.create)
        log.info("asked node %s to re-cut GPU %d for %s: %s (request %s)", node, plan.gpu, pods, made, rid)
        return True

    def settle(self) -> None:
        """Forget the requests the agents answered (a failure leaves an event on each pod it was for) and
        withdraw those overdue (an event too)."""
        with self._lock:
            asked = list(self._asked.items())
        nodes: dict[str, Mapping[str, Any] | None] = {}
        withdrawn: set[str] = set()
        for key, a in asked:
            if a.node not in nodes:
                nodes[a.node] = self._read(a)
            node = nodes[a.node]
            if node is None:
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
            elif self.clock() - a.at > a.timeout_s:
                if a.rid not in withdrawn:
                    withdrawn.add(a.rid)
                    self._withdraw(a)
                self.events.failed(
                    a.pod,
                    f"the MIG re-cut of GPU {a.gpu} of node {a.node} was not done within {a.timeout_s:.0f} s "
                    "(the node's agent does not answer): withdrawn",
                    reason=REASON,
                    condition=False,
                )
            else:
                continue
            with self._lock:
                self._asked.pop(key, None)

    def _read(self, a: _Asked) -> Mapping[str, Any] | None:
        try:
            return dict(json.loads(self.nodes.read_node(a.node, _preload_content=False).data))
        except Exception as e:
            log.warning("could not read node %s for the MIG re-cut %s: %s", a.node, a.rid, e)
            return None

    def _withdraw(self, a: _Asked) -> None:
        try:
            self.nodes.patch_node(a.node, {"metadata": {"annotations": {ANN_MIG_RESHAPE: None}}})
        except Exception as e:
            log.warning("could not withdraw the MIG re-cut %s on node %s: %s", a.rid, a.node, e)
