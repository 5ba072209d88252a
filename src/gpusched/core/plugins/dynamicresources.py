"""DynamicResources: a pod's ResourceClaims must be allocatable on the node (kube-scheduler's plugin
of that name, with its allocator: ``gpusched.core.dra``).

PreFilter checks what no node changes (an unknown or missing DeviceClass, a CEL selector that does
not compile, a claim over the device limit): such a pod is unschedulable and unresolvable, with the
allocator's message naming the claim, request and expression. Filter runs the allocator on each node
asked about, against the devices other claims hold (``PodClaims.inventory``), and keeps each node's
outcome in the cycle state; ``explain`` reads it back. Reserve hands the chosen node's allocation to
the front end's ``ClaimLedger`` (its devices are held from then on; the front end writes
``status.allocation`` before binding), Unreserve takes it back. In preemption's what-if (``LEAVING``
in the cycle state: the victims) the devices of claims whose every consumer is leaving count as free
(``ClaimLedger.allocated_without``); a shared claim another pod still uses stays held. A pod
without claims passes everywhere. A node that also serves GPUs through the device plugin
(``NodeSpec.gpu_count``, booked by the GPU books) gets no claim for a GPU driver's devices: the two
books are separate, and a GPU would be given twice (issue 32 item 4).

Prefer (better choices than first-fit, issue 32 item 2, the node level): nodes are ranked by the
score of the solution the allocator chose on each (``core/dra/score.py``: alignment, counter
fragmentation, best fit of shares, free connected groups), i.e. by what each node would be left with,
then by how used their DRA devices are once the claims are placed there; the best rate 100, the worst
0. Claims pack onto partly used nodes and GPUs (a MIG placement onto a GPU whose counter set is partly
consumed, a share onto a device already shared), keeping whole nodes and whole GPUs free for the
claims that need them. kube-scheduler scores no devices (KEP-4970 is open). On the chosen node the
devices are the best of the solutions the inventory's ``SearchBudget`` enumerates (``SCORED``).
"""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.dra.allocator import DoesNotFit, Fits, Outcome
from gpusched.core.dra.inventory import PodClaims
from gpusched.core.dra.model import AllocatedState, ClaimAllocation, DeviceId, Node, qualify
from gpusched.core.dra.score import Score
from gpusched.core.dra.selector import DraError
from gpusched.core.framework import F64, LEAVING, CycleState, StateKey
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Status

NAME = "DynamicResources"


class _Outcomes:
    """Per node index: the allocator's outcome, or the DraError it raised there."""

    def __init__(self, claims: PodClaims, pod: str, leaving: frozenset[str] = frozenset()) -> None:
        self.claims = claims
        # read once per cycle; a what-if frees what only leavers hold, and the pod's own room (a
        # preemptor's devices held while its victims leave) is its own to take
        self.allocated = claims.inventory.ledger.allocated_without(leaving | {pod})
        self.by_node: dict[int, Outcome | DraError] = {}

    def at(self, snap: ClusterState, n: int) -> Outcome | DraError:
        hit = self.by_node.get(n)
        if hit is None:
            spec = snap.nodes[n]
            node = Node(spec.name, spec.labels)
            if not self.claims.reaches(node):
                hit = DoesNotFit("the pod's allocated claims are not reachable from the node")
            else:
                try:
                    hit = self.claims.allocate(node, self.allocated)
                except DraError as e:
                    hit = e
                if isinstance(hit, Fits) and spec.gpu_count and _takes_gpus(hit):
                    hit = DoesNotFit(MIXED)
            self.by_node[n] = hit
        return hit


OUTCOMES: StateKey[_Outcomes] = StateKey(NAME)

GPU_DRIVERS = frozenset({"gpu.nvidia.com"})
"""DRA drivers whose devices are the GPUs a device plugin may also serve (NVIDIA's)."""
MIXED = (
    "the node also serves GPUs through the device plugin (nvidia.com/gpu), booked apart from DRA:"
    " GPU claims are not allocated there, so no GPU is given twice (docs/dra.md)"
)


def chosen(state: CycleState, node: int) -> tuple[DeviceId, ...]:
    """The devices the pod's claims were given on ``node`` in the cycle of ``state`` (after
    Reserve), in result order; () when it has no claims or they did not fit there."""
    outcomes = state.read(OUTCOMES)
    out = outcomes.by_node.get(node) if outcomes is not None else None
    if not isinstance(out, Fits):
        return ()
    return tuple(r.device_id for a in out.allocations for r in a.results)


def decided(state: CycleState, node: int) -> tuple[ClaimAllocation, ...] | None:
    """The allocations the pod's claims were given on ``node`` in the cycle of ``state``; None when
    it has no claims to allocate or they did not fit there."""
    outcomes = state.read(OUTCOMES)
    out = outcomes.by_node.get(node) if outcomes is not None else None
    return out.allocations if isinstance(out, Fits) else None


def _takes_gpus(fits: Fits) -> bool:
    return any(r.driver in GPU_DRIVERS for a in fits.allocations for r in a.results)


class DynamicResources:
    name = NAME

    def pre_filter(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> Status:
        if pod.claims is None:
            return Status.success()
        try:
            pod.claims.check()
        except DraError as e:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, (str(e),), NAME)
        state.write(OUTCOMES, _Outcomes(pod.claims, pod.key, state.read(LEAVING) or frozenset()))
        return Status.success()

    def _outcomes(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> _Outcomes:
        return state.read_or_fill(OUTCOMES, lambda: self._fill(state, pod, snap))

    def _fill(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> None:
        assert pod.claims is not None
        state.write(OUTCOMES, _Outcomes(pod.claims, pod.key, state.read(LEAVING) or frozenset()))

    def filter(
        self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64 | None = None
    ) -> BoolArr:
        if pod.claims is None:
            return snap.everywhere if nodes is None else snap.everywhere[nodes]
        outcomes = self._outcomes(state, pod, snap)
        idx = range(len(snap)) if nodes is None else nodes.tolist()
        return np.fromiter((isinstance(outcomes.at(snap, n), Fits) for n in idx), dtype=bool, count=len(idx))

    def explain(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> tuple[str, Code]:
        if pod.claims is None:
            return "", Code.SUCCESS
        out = self._outcomes(state, pod, snap).at(snap, node)
        if isinstance(out, DraError):
            return f"cannot allocate the pod's claims: {out}", Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        if isinstance(out, DoesNotFit):  # no node name: nodes failing alike count as one reason
            reason = out.reason.replace(f" on node {snap.names[node]}", "")
            return f"cannot allocate all claims ({reason})", Code.UNSCHEDULABLE
        return "", Code.SUCCESS

    def reserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> Status:
        if pod.claims is None or not pod.claims.to_allocate:
            return Status.success()
        out = self._outcomes(state, pod, snap).at(snap, node)
        if not isinstance(out, Fits):
            return Status(Code.UNSCHEDULABLE, (f"claims no longer fit on node {snap.names[node]}",), NAME)
        if out.allocations:  # none: its claims are a gang member's shared ones, allocated before it
            pod.claims.inventory.ledger.reserve(pod.key, snap.names[node], out.allocations)
        return Status.success()

    def unreserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> None:
        if pod.claims is not None and pod.claims.to_allocate:
            pod.claims.inventory.ledger.unreserve(pod.key)

    def prefer(self, state: CycleState, pod: PodSpec, snap: ClusterState, nodes: I64) -> F64 | None:
        if pod.claims is None or not pod.claims.to_allocate or len(nodes) < 2:
            return None
        outcomes = self._outcomes(state, pod, snap)
        keys = [_rank_key(outcomes, snap, n) for n in nodes.tolist()]
        levels = sorted(set(keys))
        if len(levels) < 2:
            return None  # no node is better: no preference
        rank = {k: i for i, k in enumerate(levels)}
        top = len(levels) - 1
        return np.array([100.0 * (top - rank[k]) / top for k in keys], dtype=np.float64)


def _rank_key(outcomes: _Outcomes, snap: ClusterState, n: int) -> tuple[Score, float]:
    """Lower is better: the chosen solution's score, then the packing (more used first)."""
    out = outcomes.at(snap, n)
    score = out.score if isinstance(out, Fits) and out.score is not None else Score()
    return score, -round(_packing(outcomes, snap, n), 9)


def _packing(outcomes: _Outcomes, snap: ClusterState, n: int) -> float:
    """How used the DRA devices that reach node ``n`` are once the pod's claims are placed there (0-1):
    the mean over its counter sets (the share of each counter consumed) and its devices that consume
    no counters (1 when held whole, the share of capacity consumed when shared)."""
    out = outcomes.at(snap, n)
    if not isinstance(out, Fits):
        return 0.0
    held = outcomes.allocated
    taken = {r.device_id for a in out.allocations for r in a.results if not r.admin_access}
    extra: dict[DeviceId, dict[str, int]] = {}
    for a in out.allocations:
        for r in a.results:
            if r.shared:
                book = extra.setdefault(r.device_id, {})
                for name, v in r.consumed_capacity.items():
                    book[name] = book.get(name, 0) + v
    spec = snap.nodes[n]
    units: list[float] = []
    for pool in outcomes.claims.inventory.pools(Node(spec.name, spec.labels)):
        used: dict[str, dict[str, int]] = {}
        for cand in pool.every_device:
            did = DeviceId(cand.driver, cand.pool, cand.device.name)
            if _in_use(did, held, taken):
                for use in cand.device.consumes_counters:
                    book = used.setdefault(use.counter_set, {})
                    for name, v in use.counters.items():
                        book[name] = book.get(name, 0) + v
        for cset in pool.counter_sets.values():
            fracs = [
                min(1.0, used.get(cset.name, {}).get(c, 0) / v) for c, v in cset.counters.items() if v > 0
            ]
            if fracs:
                units.append(sum(fracs) / len(fracs))
        for cand in pool.devices:
            if cand.device.consumes_counters:
                continue
            did = DeviceId(cand.driver, cand.pool, cand.device.name)
            if did in held.devices or (did in taken and did not in extra):
                units.append(1.0)
            elif did in held.consumed or did in extra:
                caps = {qualify(cand.driver, k): c.value for k, c in cand.device.capacity.items()}
                fracs = [
                    min(1.0, (held.consumed.get(did, {}).get(k, 0) + extra.get(did, {}).get(k, 0)) / v)
                    for k, v in caps.items()
                    if v > 0
                ]
                units.append(sum(fracs) / len(fracs) if fracs else 1.0)
            else:
                units.append(0.0)
    return sum(units) / len(units) if units else 0.0


def _in_use(did: DeviceId, held: AllocatedState, taken: set[DeviceId]) -> bool:
    return did in held.devices or did in held.consumed or did in taken
