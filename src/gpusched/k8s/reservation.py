"""Room kept for a pending pod that defragmentation is making room for.

The defragmentation controller (``gpusched defrag run``) nominates the node where the pending pod
is to land (``status.nominatedNodeName``) and names the GPUs there in the annotation
``gpusched.io/defrag-room`` (``{"node": "n1", "gpus": [0, 1]}``) before it evicts the first pod.
Until the pod is bound (or gone, or the annotation removed), the standalone scheduler keeps that
room from every pod of lower or equal priority (``Reservations.hold``): if the pod fits there now,
it is booked there for the cycle (as ``core.statement.schedule_with_nominated`` does for a
preemptor); while it does not fit yet (the evictions are under way), the free part of each of its
GPUs there is booked, so that a recreated pod never takes back the room its eviction freed.
Pods of higher priority are not held back (kube-scheduler's nomination rule).

The annotation may also say where the plan puts the pods it moves (``"steer": [{"namespace":
..., "labels": {...}, "node": ...}]``): a pod created while the room is held whose namespace and
labels are those of a moved pod (its owner recreated it from the same template) gets a preferred
node affinity for the plan's node (weight 100) for its cycle, so the scheduler places it there
when it fits, elsewhere when not.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.selectors import NODE_NAME_FIELD, NodeSelectorTerm, PreferredNodeTerm, SelectorRequirement
from gpusched.core.statement import Statement
from gpusched.k8s.convert import InvalidRequest, pod_from_k8s
from gpusched.k8s.state import TERMINAL, pod_key

log = logging.getLogger(__name__)

ANN_ROOM = "gpusched.io/defrag-room"
ROOM_SUFFIX = "#room"
"""Names the placeholder bookings of held GPUs (``<pod key>#room<gpu>``)."""


@dataclass(frozen=True, slots=True)
class Steer:
    """A pod of ``namespace`` with exactly ``labels`` is preferred onto ``node``."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    node: str


def room_annotation(node: str, gpus: tuple[int, ...], steer: Sequence[Steer] = ()) -> str:
    data: dict[str, Any] = {"node": node, "gpus": list(gpus)}
    if steer:
        data["steer"] = [{"namespace": s.namespace, "labels": dict(s.labels), "node": s.node} for s in steer]
    return json.dumps(data, separators=(",", ":"))


def _steer(s: Mapping[str, Any]) -> Steer:
    labels = tuple(sorted((str(k), str(v)) for k, v in s["labels"].items()))
    return Steer(str(s["namespace"]), labels, str(s["node"]))


def parse_room(obj: Mapping[str, Any]) -> tuple[str, tuple[int, ...], tuple[Steer, ...]] | None:
    """(node, GPUs, steers) of a pod's room annotation when its ``status.nominatedNodeName`` is
    that node; None when either is absent. Raises InvalidRequest for an annotation that cannot be
    read."""
    meta = obj.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(ANN_ROOM)
    nominated = (obj.get("status") or {}).get("nominatedNodeName")
    if raw is None or not nominated:
        return None
    try:
        data = json.loads(raw)
        node, gpus = str(data["node"]), tuple(int(g) for g in data["gpus"])
        steer = tuple(
            Steer(
                str(s["namespace"]),
                tuple(sorted((str(k), str(v)) for k, v in s["labels"].items())),
                str(s["node"]),
            )
            for s in data.get("steer") or ()
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        raise InvalidRequest(f"pod {pod_key(obj)}: annotation {ANN_ROOM} is not valid: {raw!r}") from None
    return (node, gpus, steer) if node == nominated else None


@dataclass(frozen=True, slots=True)
class Reservation:
    pod: PodSpec
    node: str
    gpus: tuple[int, ...]
    steer: tuple[Steer, ...] = ()


class Reservations:
    """The rooms held now, fed by the scheduler's pod informer (``observe``). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: dict[str, Reservation] = {}

    def observe(self, obj: Mapping[str, Any], deleted: bool = False) -> None:
        key = pod_key(obj)
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        done = (
            deleted
            or bool(spec.get("nodeName"))
            or bool(meta.get("deletionTimestamp"))
            or (obj.get("status") or {}).get("phase") in TERMINAL
        )
        res: Reservation | None = None
        if not done:
            try:
                room = parse_room(obj)
                if room is not None:
                    res = Reservation(pod_from_k8s(obj), *room)
            except InvalidRequest as e:
                log.warning("%s", e)
        with self._lock:
            if res is None:
                self._held.pop(key, None)
            else:
                self._held[key] = res

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    @contextmanager
    def hold(self, snap: ClusterState, pod: PodSpec) -> Iterator[PodSpec]:
        """Within the block, ``snap`` holds the rooms that ``pod`` must leave alone; afterwards it
        is as it was. Yields the pod to schedule: ``pod``, or ``pod`` steered to where a plan put
        the pod it replaces."""
        with self._lock:
            rooms = [r for k, r in self._held.items() if k != pod.key and r.pod.priority >= pod.priority]
        if not rooms:
            yield pod
            return
        with Statement(snap) as st:
            for r in rooms:
                _hold(st, r)
            yield _steered(pod, rooms)


def _steered(pod: PodSpec, rooms: Sequence[Reservation]) -> PodSpec:
    if not pod.labels:
        return pod
    labels = tuple(sorted(pod.labels.items()))
    for r in rooms:
        for s in r.steer:
            if s.namespace == pod.namespace and s.labels == labels:
                term = NodeSelectorTerm(match_fields=(SelectorRequirement(NODE_NAME_FIELD, "In", (s.node,)),))
                prefer = (*pod.preferred_node_affinity, PreferredNodeTerm(100, term))
                return replace(pod, preferred_node_affinity=prefer)
    return pod


def _hold(st: Statement, r: Reservation) -> None:
    snap = st.snap
    n = snap.index.get(r.node)
    if n is None or r.pod.key in snap.allocations:
        return
    try:
        st.assume(r.pod, n, r.gpus)  # it fits there now: keep its whole room
        return
    except (AccountingError, ValueError):
        pass
    free = snap.node_gpu_free(n)
    want = GPU_MILLI if r.pod.is_whole else r.pod.gpu_milli
    for g in r.gpus:
        if not 0 <= g < len(free) or free[g] <= 0:
            continue
        milli = min(free[g], want or free[g])
        hold = PodSpec(
            f"{r.pod.name}{ROOM_SUFFIX}{g}",
            num_gpu=1,
            gpu_milli=milli,
            namespace=r.pod.namespace,
            priority=r.pod.priority,
            movable=False,
        )
        try:
            st.assume(hold, n, (g,))
        except (AccountingError, ValueError):
            continue
