"""One node's reshape, end to end on the agent's side: its GPUs as the planner sees them (the caller says
which instances pods hold), the plan in the scope of the node's way, and the plan applied by that way. Used by
``gpusched agent mig-reshape``; the scheduler's request would use the same calls (docs/mig.md, "The seam")."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import Any

from gpusched.agent.inventory import Inventory
from gpusched.agent.reshape.apply import MigOps, ReshapeResult, apply_reshape, mig_gpu
from gpusched.agent.reshape.manager import ManagerResult, MigManagerWay
from gpusched.agent.reshape.way import ReshapeWay
from gpusched.core.errors import InvalidInput
from gpusched.core.mig.geometry import Instance
from gpusched.core.mig.measure import DemandMix
from gpusched.core.mig.reshape import GpuNow, ReshapePlan, plan_reshape

_IN_USE = re.compile(r"^(\d+):([0-9a-z.+]+)@(\d+)$")


def parse_in_use(text: str) -> tuple[int, Instance]:
    """``INDEX:PROFILE@START`` (``0:3g.40gb@4``): an instance a pod holds on GPU INDEX."""
    m = _IN_USE.match(text.strip())
    if m is None:
        raise InvalidInput(f"in use {text!r}: expected GPU INDEX:PROFILE@START, e.g. 0:3g.40gb@4")
    return int(m[1]), Instance(m[2], int(m[3]))


def node_gpus(node: str, inv: Inventory, in_use: Iterable[tuple[int, Instance]]) -> list[GpuNow]:
    """The node's MIG-capable GPUs, with the instances in use (MigPlacementError for one a GPU lacks)."""
    used: dict[int, set[Instance]] = {}
    for index, inst in in_use:
        used.setdefault(index, set()).add(inst)
    out = []
    for d in inv.devices:
        g = mig_gpu(node, d)
        if g is not None:
            out.append(GpuNow(g, frozenset(used.pop(d.index, set()))))
    if used:
        raise InvalidInput(f"in use: no MIG-capable GPU index {', '.join(map(str, sorted(used)))} on {node}")
    return out


def plan_node(
    node: str,
    inv: Inventory,
    pending: Sequence[str],
    in_use: Iterable[tuple[int, Instance]],
    way: ReshapeWay,
    demand: DemandMix | None = None,
) -> ReshapePlan:
    if way.scope is None:
        raise InvalidInput(f"node {node}: MIG reshaping is {way.value}")
    return plan_reshape(node_gpus(node, inv, in_use), pending, demand, way.scope)


def apply_plan(
    node: str, plan: ReshapePlan, way: ReshapeWay, ops: MigOps, manager: MigManagerWay | None = None
) -> list[ReshapeResult | ManagerResult]:
    """Way (a): each GPU's step through the backend. Way (b): the node's steps as one mig-manager config."""
    if not plan.steps:
        return []
    if way is ReshapeWay.NVML:
        return [apply_reshape(ops, s) for s in plan.steps]
    if way is ReshapeWay.MIG_MANAGER:
        if manager is None:
            raise InvalidInput(f"node {node}: the mig-manager way needs the Kubernetes API (--kubeconfig)")
        return [manager.apply(node, ops.inventory(), plan.steps)]
    raise InvalidInput(f"node {node}: MIG reshaping is {way.value}")


def report(
    node: str, way: ReshapeWay, plan: ReshapePlan, results: Sequence[ReshapeResult | ManagerResult]
) -> dict[str, Any]:
    """The plan and what became of it, as plain JSON values."""
    return {
        "node": node,
        "way": way.value,
        "plan": dataclasses.asdict(plan),
        "results": [
            {**dataclasses.asdict(r), "outcome": r.outcome.value, "ok": r.ok, "message": r.message}
            for r in results
        ],
    }
