"""Device assignment: which GPUs of the chosen node a pod takes."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import BoolArr, ClusterState
from gpusched.core.model import PodSpec
from gpusched.core.topology import choose


def fitting_gpus(snap: ClusterState, pod: PodSpec, node: int) -> BoolArr:
    """GPUs of ``node`` with room for one unit of ``pod``'s per-GPU request (``gpu_room``: a
    whole GPU only where the GPU is entirely free and has at least ``gpu_memory_mib``)."""
    ok: BoolArr = snap.gpu_room(pod, slice(node, node + 1))[0]
    ok &= snap.gpu_exists[node]
    return ok


def pick_gpus(snap: ClusterState, pod: PodSpec, node: int, hint: int = -1) -> tuple[int, ...]:
    """The GPUs ``pod`` takes on ``node``.

    A valid ``hint`` (the GPU a score plugin chose for a share) is honoured. Otherwise the
    tightest fitting GPUs are taken (best fit: least free milli, then least free memory,
    then lowest index), which keeps whole GPUs free for whole-GPU pods.

    On a node with a GPU topology (``NodeSpec.gpu_topology``) the set follows
    ``core.topology.choose``: NVLink-complete and on one NUMA node when such a set fits, and
    one-GPU pods break the most broken NVLink island first. A hint on an untouched GPU is then
    read as "an untouched GPU" (all of a node's untouched GPUs are alike in the books) and the
    topology picks which.
    """
    if pod.num_gpu == 0:
        return ()
    ok = fitting_gpus(snap, pod, node)
    topo = snap.nodes[node].gpu_topology
    if pod.num_gpu == 1 and hint >= 0 and ok[hint]:
        if topo is None or not (untouched := _untouched(snap, node))[hint]:
            return (hint,)
        ok &= untouched  # the policy chose an untouched GPU: the topology picks which
    idx = np.flatnonzero(ok)
    if len(idx) < pod.num_gpu:
        raise ValueError(f"pod {pod.key} does not fit on node {snap.names[node]}: {len(idx)} fitting GPUs")
    if topo is not None:
        free, mem = snap.gpu_free[node], snap.gpu_mem_free[node]
        return tuple(sorted(choose(topo, ok, _untouched(snap, node), free, mem, pod.num_gpu)))
    order = np.lexsort((idx, snap.gpu_mem_free[node, idx], snap.gpu_free[node, idx]))
    return tuple(sorted(int(g) for g in idx[order[: pod.num_gpu]]))


def _untouched(snap: ClusterState, node: int) -> BoolArr:
    """GPUs of ``node`` with nothing booked on them (all milli and memory free) that can take a pod."""
    out: BoolArr = (
        (snap.gpu_free[node] == snap.gpu_cap[node])
        & (snap.gpu_mem_free[node] == snap.gpu_mem_cap[node])
        & snap.gpu_exists[node]
    )
    return out
