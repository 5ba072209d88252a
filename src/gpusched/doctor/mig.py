"""Doctor for MIG pods: which slice a pending pod waits for and why, and the re-cut that would host it.

Why, per profile, over the MIG nodes the pod could use but for its slices (its node selector, affinity,
taints, CPU and the rest pass there):

- ``mig-no-model``: no GPU model of those nodes has the profile;
- ``mig-reshaping``: a GPU that could serve it is being re-cut (``gpusched.io/mig-reshape``);
- ``mig-too-few``: fewer instances of it are present than it asks, even with nothing held;
- ``mig-all-held``: enough are present, but pods hold them.

What would make it fit (``mig_counterfactual``): the scheduler's own re-cut of one GPU
(``core.mig.reshape.plan_node``, the request ``k8s/migreshape.py`` writes: instances pods hold stay, free ones
may go), applied on a copy of the books (``core.mig.whatif``), and kept only when the scheduler's filters then
pass the pod on that node. Pure: core objects in, findings out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from gpusched.core.cluster import ClusterState
from gpusched.core.defrag import Rules
from gpusched.core.defrag.mig import room_for, without_slices
from gpusched.core.framework import Profile
from gpusched.core.mig.books import NodeMig, demand_of
from gpusched.core.mig.geometry import Instance
from gpusched.core.mig.profiles import MigError
from gpusched.core.mig.reshape import GpuRecut, plan_node
from gpusched.core.mig.whatif import recut, with_node_mig
from gpusched.core.model import PodSpec
from gpusched.core.scheduler import feasible
from gpusched.doctor.findings import Counterfactual, Finding

RECUT_COST = 2
"""A re-cut changes one GPU's geometry: more than a toleration (1), less than two moves."""
MAX_MOVES = 8
"""As doctor's other move plans (``doctor.counterfactual.MAX_MOVES``)."""


def candidate_nodes(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[int]:
    """The MIG nodes where the pod passes every filter but for its slices (all MIG nodes when none)."""
    mig = [n for n, nd in enumerate(snap.nodes) if nd.mig is not None]
    ok = set(feasible(profile, without_slices(pod), snap).indices().tolist())
    return [n for n in mig if n in ok] or mig


@dataclass(frozen=True)
class ProfileCount:
    """One profile over the candidate nodes: instances present (on GPUs in MIG mode), held by pods, free,
    and the GPUs being re-cut that hold or could hold it."""

    profile: str
    want: int
    models: tuple[str, ...]
    present: int
    held: int
    free: int
    most_present_on_a_node: int
    reshaping: tuple[tuple[str, int], ...]
    holders: tuple[str, ...]

    def evidence(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "asked": self.want,
            "present": self.present,
            "held": self.held,
            "free": self.free,
            "reshaping": [{"node": n, "gpu": g} for n, g in self.reshaping],
            "held_by": list(self.holders),
        }


def count_profile(snap: ClusterState, nodes: list[int], p: str, want: int) -> ProfileCount:
    models: set[str] = set()
    present = held = free = most = 0
    reshaping: list[tuple[str, int]] = []
    holders: list[str] = []
    for n in nodes:
        nm = _mig(snap, n)
        here = 0
        for i, g in zip(nm.indices, nm.gpus, strict=True):
            if p not in g.geometry.kinds:
                continue
            models.add(g.geometry.model)
            if i in nm.reshaping:
                reshaping.append((snap.names[n], i))
            if g.mig_enabled:
                here += sum(1 for x in g.instances if x.profile == p)
        present += here
        most = max(most, here)
        held += sum(1 for x in (x for g in snap.mig_books[n].values() for x in g.instances) if x.profile == p)
        free += max(0, snap.mig_free[n][p])
        for key in sorted(snap.node_pods[n]):
            if any(s.profile == p for s in snap.allocations[key].mig):
                holders.append(key)
    return ProfileCount(
        p, want, tuple(sorted(models)), present, held, free, most, tuple(reshaping), tuple(holders)
    )


def _shown(keys: tuple[str, ...], k: int = 3) -> str:
    return ", ".join(keys[:k]) + (f" and {len(keys) - k} more" if len(keys) > k else "")


def mig_findings(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[Finding]:
    """One finding per profile the pod waits for (none for a pod without slices or nodes with a geometry)."""
    if not pod.mig or not any(nd.mig is not None for nd in snap.nodes):
        return []
    nodes = candidate_nodes(profile, pod, snap)
    if any(snap.mig_fits(pod, n) for n in nodes):
        return []  # its slices find instances: something else keeps it off
    all_models = sorted({g.geometry.model for n in nodes for g in _mig(snap, n).gpus})
    out = []
    for p, want in sorted(Counter(pod.mig).items()):
        c = count_profile(snap, nodes, p, want)
        head = f"waits for {want} MIG {p} slice{'s' * (want != 1)}" if want > 1 else f"waits for a {p} slice"
        if not c.models:
            code = "mig-no-model"
            msg = (
                f"{head}: no GPU model of the {len(nodes)} MIG node(s) it may use has that profile "
                f"({', '.join(all_models)})"
            )
        elif c.free >= want:
            continue
        elif c.reshaping:
            code = "mig-reshaping"
            where = ", ".join(f"GPU {g} of node {n}" for n, g in c.reshaping[:3])
            verb = "is" if len(c.reshaping) == 1 else "are"
            msg = f"{head}: {where} {verb} being re-cut; it is tried again after"
        elif c.most_present_on_a_node < want:
            code = "mig-too-few"
            msg = (
                f"{head}: too few {p} instances present ({c.present} on {len(nodes)} MIG node(s), "
                f"at most {c.most_present_on_a_node} on one, {c.free} free)"
            )
        else:
            code = "mig-all-held"
            msg = f"{head}: all {c.present} {p} instance(s) present are held (by {_shown(c.holders)})"
        out.append(Finding("scheduling", "error", code, msg, c.evidence(), pod.key))
    return out


def _mig(snap: ClusterState, n: int) -> NodeMig:
    nm = snap.nodes[n].mig
    assert nm is not None  # only nodes with a geometry are asked
    return nm


def _layout(xs: tuple[Instance, ...]) -> str:
    return ", ".join(f"{x.profile} at {x.start}" for x in xs) or "nothing"


def mig_counterfactual(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[Counterfactual]:
    """The re-cut of one GPU after which the pod fits (the scheduler's planner, checked on a copy of the books
    by the scheduler's filters); the fewest free instances destroyed, then node order."""
    if not pod.mig:
        return []
    demand = demand_of(snap.mig_demand, pod.mig)
    best: tuple[tuple[int, str], int, GpuRecut] | None = None
    for n in candidate_nodes(profile, pod, snap):
        nm = _mig(snap, n)
        plan = plan_node(nm, snap.mig_books[n], pod.mig, demand)
        if plan is None or sorted(plan.serves) != list(pod.mig):
            continue
        key = (len(plan.destroy), snap.names[n])
        if best is None or key < best[0]:
            best = (key, n, plan)
    if best is None:
        return []
    _k, n, plan = best
    try:
        after = with_node_mig(snap, n, recut(_mig(snap, n), plan))
    except MigError:
        return []
    if n not in feasible(profile, pod, after).indices().tolist():
        return []  # the scheduler's filters still say no: not offered
    name = snap.names[n]
    in_use = snap.mig_books[n][plan.gpu].instances
    idle = "idle" if not in_use else f"beside {len(in_use)} slice(s) in use: {_layout(in_use)}"
    what = "+".join(sorted(set(pod.mig)))
    msg = (
        f"waits for a {what} slice: GPU {plan.gpu} of node {name} could host it after re-cutting its free "
        f"slices ({idle}): destroy {_layout(plan.destroy)}; create {_layout(plan.create)}"
    )
    change = {
        "node": name,
        "gpu": plan.gpu,
        "destroy": [{"profile": x.profile, "start": x.start} for x in plan.destroy],
        "create": [{"profile": x.profile, "start": x.start} for x in plan.create],
        "serves": list(plan.serves),
        "in_use": [{"profile": x.profile, "start": x.start} for x in in_use],
    }
    return [Counterfactual("mig-recut", msg, RECUT_COST, True, name, change)]


def mig_moves_counterfactual(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[Counterfactual]:
    """The fewest moves of MIG pods to free instances elsewhere after which the pod lands, on a freed instance
    or after a re-cut (``core.defrag.mig.room_for``, checked step by step on a copy of the books)."""
    if not pod.mig:
        return []
    room = room_for(profile, snap, pod, Rules(max_moves=MAX_MOVES))
    plan = room.plan
    if not plan.feasible or not plan.moves:
        return []
    n = len(plan.moves)
    where = ", ".join(
        f"{m.pod} to {m.to_mig[0].profile} at {m.to_mig[0].start} of GPU {m.to_mig[0].gpu} of {m.to_node}"
        for m in plan.moves
    )
    then = ""
    change: dict[str, Any] = {"plan": plan.to_dict(), "moves": n}
    if room.recut is not None:
        cut = room.recut
        then = (
            f", then GPU {cut.gpu} of {room.node} is re-cut (destroy {_layout(cut.destroy)}; create "
            f"{_layout(cut.create)})"
        )
        change["recut"] = {
            "gpu": cut.gpu,
            "destroy": [{"profile": x.profile, "start": x.start} for x in cut.destroy],
            "create": [{"profile": x.profile, "start": x.start} for x in cut.create],
        }
    msg = f"fits on {room.node} if MIG pods move ({n} move{'s' * (n != 1)}: {where}){then}"
    return [Counterfactual("moves", msg, n + (RECUT_COST if room.recut else 0), True, room.node, change)]


# ------------------------------------------------------------------------------------------- the GPU map
def mig_map(snap: ClusterState, node: int) -> list[dict[str, Any]]:
    """Per MIG GPU of ``node``: index, model, MIG mode, whether it is being re-cut, and its slices in start
    order (profile, start, memory slices, the pod holding it or None when free); empty for a node without a
    MIG geometry."""
    nm = snap.nodes[node].mig
    if nm is None:
        return []
    holder = {
        (s.gpu, s.start, s.profile): key for key in snap.node_pods[node] for s in snap.allocations[key].mig
    }
    return [
        {
            "index": i,
            "model": g.geometry.model,
            "mig_enabled": g.mig_enabled,
            "reshaping": i in nm.reshaping,
            "mem_slices": g.geometry.mem_slices,
            "slices": [
                {
                    "profile": x.profile,
                    "start": x.start,
                    "size": g.geometry.kind(x.profile).mem_slices,
                    "pod": holder.get((i, x.start, x.profile)),
                }
                for x in sorted(g.instances, key=lambda x: x.start)
            ],
        }
        for i, g in zip(nm.indices, nm.gpus, strict=True)
    ]
