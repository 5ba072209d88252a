"""The smallest change that makes a pending pod fit, each checked by running the core on a copy
of the books. Pure: core objects in, ``Counterfactual`` out; no I/O.

Tried, for a pod that fits nowhere now:

- a GPU model no node has: the models the cluster has, each checked;
- more GPU memory (or more GPUs) than any node's GPUs have: the largest figure that fits;
- untolerated taints: the tolerations of one node's taints, the set that opens most nodes;
- failed GPUs: the nodes where the pod fits once their GPUs are healthy again;
- fragmentation: the fewest moves of running pods (``core.defrag.plan_for``, moves to another GPU
  of the same node included) after which it lands; or, when none, the running pods that may not
  move (no controller would recreate them, opted out, a budget);
- MIG slices: the scheduler's re-cut of one GPU's free slices (``doctor.mig.mig_counterfactual``), else
  the fewest moves of MIG pods to free instances elsewhere that make room (``core.defrag.mig.room_for``);
- quotas: the pod's tenant queue refuses it: the smallest raise of the queue's quota
  (``doctor.queues.quota_counterfactual``, passed in as ``quota``), first, as the scheduler checks
  quota before placement.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.defrag import REFUSAL_TEXT, Refusal, Rules, WorkBudget, plan_for
from gpusched.core.framework import Profile
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec, Taint, Toleration
from gpusched.core.scheduler import feasible
from gpusched.core.status import Code, Diagnosis
from gpusched.doctor.findings import Counterfactual
from gpusched.doctor.mig import mig_counterfactual, mig_moves_counterfactual

MAX_MOVES = 8
TOLERATED_EFFECTS = ("NoSchedule", "NoExecute")


def feasible_nodes(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[int]:
    """The nodes where ``pod`` passes PreFilter and every Filter now (the core's ``feasible``)."""
    out: list[int] = feasible(profile, pod, snap).indices().tolist()
    return out


def _gib(mib: int) -> str:
    return f"{mib / 1024:g} GiB"


def _names(snap: ClusterState, nodes: list[int], k: int = 3) -> str:
    shown = ", ".join(snap.names[i] for i in nodes[:k])
    return shown + (f" and {len(nodes) - k} more" if len(nodes) > k else "")


def model_counterfactual(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[Counterfactual]:
    if not pod.gpu_models or set(pod.gpu_models) & set(snap.models):
        return []
    out = []
    for m in snap.models:
        fits = feasible_nodes(profile, replace(pod, gpu_models=frozenset({m})), snap)
        if fits:
            out.append(
                Counterfactual(
                    "gpu-model",
                    f"fits if gpu-models allows {m} (on {_names(snap, fits)})",
                    1,
                    True,
                    snap.names[fits[0]],
                    {"gpu_models": [m], "nodes": len(fits)},
                )
            )
    out.sort(key=lambda c: -int(c.change["nodes"]))
    return out[:1]


def memory_counterfactual(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[Counterfactual]:
    """Asks more GPU memory per GPU than any GPU (of its models) has: the largest figure that fits."""
    if not pod.gpu_memory_mib:
        return []
    sizes = sorted(
        {
            nd.gpu_memory_mib
            for nd in snap.nodes
            if nd.gpu_count and nd.gpu_memory_mib and (not pod.gpu_models or nd.gpu_model in pod.gpu_models)
        },
        reverse=True,
    )
    if not sizes or sizes[0] >= pod.gpu_memory_mib:
        return []
    for size in sizes:
        fits = feasible_nodes(profile, replace(pod, gpu_memory_mib=size), snap)
        if fits:
            return [
                Counterfactual(
                    "gpu-memory",
                    f"fits if gpu-memory ≤ {_gib(size)} (asks {_gib(pod.gpu_memory_mib)}; "
                    f"the largest GPU has {_gib(sizes[0])}; fits on {_names(snap, fits)})",
                    1,
                    True,
                    snap.names[fits[0]],
                    {"gpu_memory_mib": size, "asked_mib": pod.gpu_memory_mib},
                )
            ]
    return []


def count_counterfactual(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[Counterfactual]:
    most = int(snap.gpu_count.max()) if len(snap) else 0
    if not pod.is_whole or pod.num_gpu <= most or most == 0:
        return []
    for k in range(most, 0, -1):
        fits = feasible_nodes(profile, replace(pod, num_gpu=k), snap)
        if fits:
            return [
                Counterfactual(
                    "gpu-count",
                    f"fits if nvidia.com/gpu ≤ {k} (asks {pod.num_gpu}; no node has more than {most})",
                    1,
                    True,
                    snap.names[fits[0]],
                    {"num_gpu": k},
                )
            ]
    return []


def _untolerated(pod: PodSpec, taints: tuple[Taint, ...]) -> tuple[Taint, ...]:
    return tuple(
        t
        for t in taints
        if t.effect in TOLERATED_EFFECTS and not any(tol.tolerates(t) for tol in pod.tolerations)
    )


def toleration_counterfactual(
    profile: Profile, pod: PodSpec, snap: ClusterState, diag: Diagnosis
) -> list[Counterfactual]:
    tainted = [snap.index[f.node] for f in diag.failures if f.plugin == "TaintToleration"]
    groups = Counter(_untolerated(pod, snap.nodes[i].taints) for i in tainted)
    best: Counterfactual | None = None
    for taints, _n in groups.most_common(8):
        if not taints:
            continue
        tols = tuple(Toleration(t.key, "Equal", t.value, t.effect) for t in taints)
        fits = feasible_nodes(profile, replace(pod, tolerations=pod.tolerations + tols), snap)
        if fits and (best is None or len(fits) > int(best.change["nodes"])):
            shown = ", ".join(
                f"{t.key}={t.value}:{t.effect}" if t.value else f"{t.key}:{t.effect}" for t in taints
            )
            best = Counterfactual(
                "toleration",
                f"needs a toleration for {shown} (then fits on {_names(snap, fits)})",
                len(tols),
                True,
                snap.names[fits[0]],
                {
                    "tolerations": [
                        {"key": t.key, "operator": "Equal", "value": t.value, "effect": t.effect}
                        for t in taints
                    ],
                    "nodes": len(fits),
                },
            )
    return [best] if best else []


def healed(snap: ClusterState) -> ClusterState:
    """``snap`` with every GPU healthy: a copy of its arrays (``ClusterState.copy``) with every
    present GPU usable again, instead of books rebuilt pod by pod (at 5000 nodes that was 40000
    bookings). Unhealthy GPUs keep their capacity and their pods in the books, so only which GPUs
    may take a pod changes; ``ClusterState.__init__`` derives it the same way. GPUs held by DRA
    claims (``NodeSpec.claimed_gpus``) stay withheld: healing does not free them."""
    nodes = tuple(replace(n, unhealthy_gpus=frozenset()) if n.unhealthy_gpus else n for n in snap.nodes)
    return _with_nodes(snap, nodes)


def _with_nodes(snap: ClusterState, nodes: tuple[NodeSpec, ...]) -> ClusterState:
    """A copy of ``snap``'s arrays with ``nodes`` (the same nodes, some GPUs no longer withheld): which
    GPUs may take a pod derived again as ``ClusterState.__init__`` does (a GPU exists unless it is
    unhealthy or a DRA claim holds it)."""
    out = snap.copy()
    out.nodes = nodes
    out.gpu_exists = np.arange(snap.max_gpus)[None, :] < snap.gpu_count[:, None]
    for i, nd in enumerate(nodes):
        withheld = nd.unhealthy_gpus | nd.claimed_gpus
        if withheld:
            out.gpu_exists[i, list(withheld)] = False
    out.any_unhealthy = any(nd.unhealthy_gpus or nd.claimed_gpus for nd in nodes)
    return out


def healthy_counterfactual(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[Counterfactual]:
    """Nodes where the pod would fit were their failed GPUs healthy (on ``healed`` books)."""
    if not snap.any_unhealthy or not pod.num_gpu:
        return []
    fits = [i for i in feasible_nodes(profile, pod, healed(snap)) if snap.nodes[i].unhealthy_gpus]
    if not fits:
        return []
    nd = snap.nodes[fits[0]]
    bad = ", ".join(map(str, sorted(nd.unhealthy_gpus)))
    return [
        Counterfactual(
            "healthy-gpu",
            f"fits on {nd.name} once its GPU(s) {bad} are healthy again (repair or replace them, "
            f"then the agent clears gpusched.io/unhealthy-gpus)",
            1,
            True,
            nd.name,
            {
                "node": nd.name,
                "unhealthy": sorted(nd.unhealthy_gpus),
                "nodes": len(fits),
                "fits_on": [snap.names[i] for i in fits],
            },
        )
    ]


def unclaimed(snap: ClusterState) -> ClusterState:
    """``snap`` with the GPUs DRA claims hold (``NodeSpec.claimed_gpus``) usable again, unhealthy
    ones still withheld (as ``healed`` does the other way round)."""
    nodes = tuple(replace(n, claimed_gpus=frozenset()) if n.claimed_gpus else n for n in snap.nodes)
    return _with_nodes(snap, nodes)


def claimed_counterfactual(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[Counterfactual]:
    """Nodes where the pod would fit were the GPUs DRA claims hold there released (a mixed node:
    docs/dra.md)."""
    if not pod.num_gpu or not any(nd.claimed_gpus for nd in snap.nodes):
        return []
    fits = [i for i in feasible_nodes(profile, pod, unclaimed(snap)) if snap.nodes[i].claimed_gpus]
    if not fits:
        return []
    nd = snap.nodes[fits[0]]
    held = ", ".join(map(str, sorted(nd.claimed_gpus)))
    return [
        Counterfactual(
            "claimed-gpu",
            f"fits on {nd.name} once the ResourceClaims holding its GPU(s) {held} release them (a DRA "
            "driver publishes the same GPUs as gpusched's agent there; gpusched books claimed GPUs as taken)",
            1,
            True,
            nd.name,
            {
                "node": nd.name,
                "claimed": sorted(nd.claimed_gpus),
                "nodes": len(fits),
                "fits_on": [snap.names[i] for i in fits],
            },
        )
    ]


def moves_counterfactual(profile: Profile, pod: PodSpec, snap: ClusterState) -> list[Counterfactual]:
    """The fewest moves of running pods after which the pod lands (``core.defrag.plan_for``; a move
    to another GPU of the same node counts). Where no plan exists and running pods stay put because
    no controller would recreate them, a finding that names them (not verified: the change is to
    the workloads, not a move)."""
    if not pod.num_gpu:
        return []
    plan = plan_for(profile, snap, pod, Rules(max_moves=MAX_MOVES), WorkBudget())
    if not plan.feasible or not plan.moves or not plan.placements:
        kept = [(k, r) for k, r in plan.kept if r in (Refusal.NO_CONTROLLER, Refusal.NOT_RECREATED)]
        if plan.feasible or not kept:
            return []
        by: dict[Refusal, list[str]] = {}
        for k, r in kept[:4]:
            by.setdefault(r, []).append(k)
        shown = "; ".join(f"{', '.join(ks)} ({REFUSAL_TEXT[r.value]})" for r, ks in by.items())
        more = f" and {len(kept) - 4} more" if len(kept) > 4 else ""
        return [
            Counterfactual(
                "kept",
                f"no move plan within {MAX_MOVES} moves: defragmentation may not move {shown}{more}",
                1 << 19,
                False,
                change={"kept": [{"pod": k, "why": r.value} for k, r in kept]},
            )
        ]
    moved = [m.pod for m in plan.moves]
    kind = "shares" if all(0 < m.gpu_milli < GPU_MILLI for m in plan.moves) else "pods"
    where = plan.placements[0]
    n = len(moved)
    within = [m.pod for m in plan.moves if m.to_node == m.from_node]
    how = f" ({', '.join(within)} to another GPU of {where.node})" if within else ""
    return [
        Counterfactual(
            "moves",
            f"fits on {where.node} if {kind} {', '.join(moved)} move ({n} move{'s' * (n != 1)}){how}",
            n,
            True,
            where.node,
            {"plan": plan.to_dict(), "moves": n},
        )
    ]


def counterfactuals(
    profile: Profile,
    pod: PodSpec,
    snap: ClusterState,
    diag: Diagnosis | None,
    quota: Counterfactual | None = None,
) -> list[Counterfactual]:
    """Every change found (smallest first). ``quota``: the change the pod's queue needs when it
    refuses the pod; it comes first (the scheduler checks quota before placement), alone when the
    pod fits a node now, else followed by the changes that make it fit. ``snap`` is left as it was."""
    found = physical_counterfactuals(profile, pod, snap, diag)
    if quota is None:
        return found
    return [quota] if found[0].kind == "fits-now" else [quota, *found]


def physical_counterfactuals(
    profile: Profile, pod: PodSpec, snap: ClusterState, diag: Diagnosis | None
) -> list[Counterfactual]:
    """The changes after which the pod fits a node (quotas aside), smallest first."""
    fits = feasible_nodes(profile, pod, snap)
    if fits:
        return [
            Counterfactual(
                "fits-now",
                f"fits now on {_names(snap, fits)}: nothing to change; is its "
                "scheduler (spec.schedulerName) running?",
                0,
                True,
                snap.names[fits[0]],
                {"nodes": len(fits)},
            )
        ]
    out: list[Counterfactual] = []
    out += model_counterfactual(profile, pod, snap)
    out += memory_counterfactual(profile, pod, snap)
    out += count_counterfactual(profile, pod, snap)
    if diag is not None:
        out += toleration_counterfactual(profile, pod, snap, diag)
    out += healthy_counterfactual(profile, pod, snap)
    out += claimed_counterfactual(profile, pod, snap)
    out += mig_counterfactual(profile, pod, snap)
    if pod.mig and not any(c.kind == "mig-recut" for c in out):
        out += mig_moves_counterfactual(profile, pod, snap)
    resolvable = diag is None or any(f.code == Code.UNSCHEDULABLE for f in diag.failures)
    if resolvable and not any(c.kind in ("gpu-model", "gpu-memory", "gpu-count") for c in out):
        out += moves_counterfactual(profile, pod, snap)
    if not out:
        if pod.gpu_models and not set(pod.gpu_models) & set(snap.models):
            msg = (
                f"no node has this GPU model ({'|'.join(sorted(pod.gpu_models))}; the cluster has "
                f"{', '.join(snap.models) or 'none'}), and no other model fits either"
            )
        else:
            msg = f"no change found within {MAX_MOVES} moves: it needs more capacity (or fewer pods running)"
        out.append(Counterfactual("none", msg, 1 << 20, False))
    out.sort(key=lambda c: c.cost)
    return out


def changed_pod(pod: PodSpec, cf: Counterfactual) -> PodSpec:
    """``pod`` with the change of a counterfactual that changes the pod itself (toleration,
    gpu-model, gpu-memory, gpu-count); the pod unchanged for the others (moves and repairs change
    the cluster, not the pod)."""
    ch = cf.change
    if cf.kind == "toleration":
        tols = tuple(Toleration(t["key"], t["operator"], t["value"], t["effect"]) for t in ch["tolerations"])
        return replace(pod, tolerations=pod.tolerations + tols)
    if cf.kind == "gpu-model":
        return replace(pod, gpu_models=frozenset(ch["gpu_models"]))
    if cf.kind == "gpu-memory":
        return replace(pod, gpu_memory_mib=int(ch["gpu_memory_mib"]))
    if cf.kind == "gpu-count":
        return replace(pod, num_gpu=int(ch["num_gpu"]))
    return pod
