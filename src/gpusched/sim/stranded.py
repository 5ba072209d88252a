"""Where the free GPU capacity sits at the end of a run, by what holds each GPU.

A GPU that ends a run partly used strands its free milli unless a later pod fits beside what it
holds, so grouping free milli by the GPU's contents shows which request sizes waste capacity:
on the Alibaba default trace, a lone 810-milli share leaves 190 milli that almost no pod uses.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from gpusched.core.cluster import ClusterState
from gpusched.core.model import GPU_MILLI, PodSpec

IDLE = "idle"


def _piece(p: PodSpec) -> str:
    return str(p.gpu_milli) if p.gpu_milli else f"{p.gpu_memory_mib}MiB"


def _order(p: PodSpec) -> tuple[int, int]:
    return (p.gpu_milli, p.gpu_memory_mib)


def holder(pods: list[PodSpec]) -> str:
    """The label of a GPU holding ``pods``: their shares biggest first ("470+470"), or "idle"."""
    if not pods:
        return IDLE
    return "+".join(_piece(p) for p in sorted(pods, key=_order, reverse=True))


def free_by_holder(state: ClusterState) -> dict[str, int]:
    """Free GPU milli in ``state`` summed by the label of what holds each GPU (``holder``).
    Whole-GPU pods leave no free milli, so only shares and idle GPUs appear."""
    on: defaultdict[tuple[int, int], list[PodSpec]] = defaultdict(list)
    for a in state.allocations.values():
        for g in a.gpus:
            on[(a.node, g)].append(a.pod)
    free: Counter[str] = Counter()
    for node in range(len(state)):
        for g in range(int(state.gpu_count[node])):
            f = int(state.gpu_free[node, g])
            if f > 0:
                pods = on.get((node, g), [])
                free[IDLE if f == GPU_MILLI and not pods else holder(pods)] += f
    return dict(free)
