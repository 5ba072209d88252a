"""Device assignment: which GPUs of the chosen node a pod takes."""

from __future__ import annotations

import numpy as np

from gpusched.core.cluster import BoolArr, ClusterState
from gpusched.core.model import PodSpec


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
    """
    if pod.num_gpu == 0:
        return ()
    ok = fitting_gpus(snap, pod, node)
    if pod.num_gpu == 1 and hint >= 0 and ok[hint]:
        return (hint,)
    idx = np.flatnonzero(ok)
    if len(idx) < pod.num_gpu:
        raise ValueError(f"pod {pod.key} does not fit on node {snap.names[node]}: {len(idx)} fitting GPUs")
    order = np.lexsort((idx, snap.gpu_mem_free[node, idx], snap.gpu_free[node, idx]))
    return tuple(sorted(int(g) for g in idx[order[: pod.num_gpu]]))
