"""DynamicResources: a pod's ResourceClaims must be allocatable on the node (kube-scheduler's plugin
of that name, with its allocator: ``gpusched.core.dra``).

PreFilter checks what no node changes (an unknown or missing DeviceClass, a CEL selector that does
not compile, a claim over the device limit): such a pod is unschedulable and unresolvable, with the
allocator's message naming the claim, request and expression. Filter runs the allocator on each node
asked about, against the devices other claims hold (``PodClaims.inventory``), and keeps each node's
outcome in the cycle state; ``explain`` reads it back. Reserve hands the chosen node's allocation to
the front end's ``ClaimLedger`` (its devices are held from then on; the front end writes
``status.allocation`` before binding), Unreserve takes it back. A pod without claims passes
everywhere.
"""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import I64, BoolArr, ClusterState
from gpusched.core.dra.allocator import DoesNotFit, Fits, Outcome
from gpusched.core.dra.inventory import PodClaims
from gpusched.core.dra.model import Node
from gpusched.core.dra.selector import DraError
from gpusched.core.framework import CycleState, StateKey
from gpusched.core.model import PodSpec
from gpusched.core.status import Code, Status

NAME = "DynamicResources"


class _Outcomes:
    """Per node index: the allocator's outcome, or the DraError it raised there."""

    def __init__(self, claims: PodClaims) -> None:
        self.claims = claims
        self.allocated = claims.inventory.ledger.allocated()  # once per cycle
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
            self.by_node[n] = hit
        return hit


OUTCOMES: StateKey[_Outcomes] = StateKey(NAME)


class DynamicResources:
    name = NAME

    def pre_filter(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> Status:
        if pod.claims is None:
            return Status.success()
        try:
            pod.claims.check()
        except DraError as e:
            return Status(Code.UNSCHEDULABLE_AND_UNRESOLVABLE, (str(e),), NAME)
        state.write(OUTCOMES, _Outcomes(pod.claims))
        return Status.success()

    def _outcomes(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> _Outcomes:
        return state.read_or_fill(OUTCOMES, lambda: self._fill(state, pod, snap))

    def _fill(self, state: CycleState, pod: PodSpec, snap: ClusterState) -> None:
        assert pod.claims is not None
        state.write(OUTCOMES, _Outcomes(pod.claims))

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
        pod.claims.inventory.ledger.reserve(pod.key, snap.names[node], out.allocations)
        return Status.success()

    def unreserve(self, state: CycleState, pod: PodSpec, snap: ClusterState, node: int) -> None:
        if pod.claims is not None and pod.claims.to_allocate:
            pod.claims.inventory.ledger.unreserve(pod.key)
