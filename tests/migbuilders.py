"""MIG nodes and pods for the tests of doctor, metrics and defragmentation over MIG slices: A100 80GB GPUs
cut as given, the ``nvidia.com/mig-<profile>`` counts the device plugin would advertise, and pods holding
given slices."""

from __future__ import annotations

from typing import Any

from gpusched.core.cluster import ClusterState
from gpusched.core.mig.books import MigSlot, NodeMig
from gpusched.core.mig.geometry import Geometry, MigGpu
from gpusched.core.model import NodeSpec, PodSpec

A100 = Geometry.of("a100-80gb")
BALANCED = (("2g.20gb", 0), ("1g.10gb", 2), ("1g.10gb", 3), ("3g.40gb", 4))
HALVES = (("4g.40gb", 0), ("3g.40gb", 4))


def res(p: str) -> str:
    return "nvidia.com/mig-" + p.replace("+", ".")


def mig_node(name: str, *layouts: tuple[tuple[str, int], ...], **kw: Any) -> NodeSpec:
    gpus = []
    counts: dict[str, int] = {}
    for i, lay in enumerate(layouts):
        g = MigGpu(f"{name}/{i}", A100)
        for p, s in lay:
            g = g.place(p, s)
            counts[res(p)] = counts.get(res(p), 0) + 1
        gpus.append(g)
    reshaping = kw.pop("reshaping", frozenset())
    mig = NodeMig(tuple(gpus), tuple(range(len(layouts))), reshaping)
    return NodeSpec(name, 64000, 256000, extended=counts, mig=mig, **kw)


def mig_pod(name: str, *profiles: str, **kw: Any) -> PodSpec:
    ext: dict[str, int] = {}
    for p in profiles:
        ext[res(p)] = ext.get(res(p), 0) + 1
    return PodSpec(name, cpu_milli=100, mig=tuple(sorted(profiles)), extended=ext, **kw)


def held(snap: ClusterState, name: str, node: int, *slots: tuple[int, int, str], **kw: Any) -> None:
    """A pod ``name`` (``mig_pod``'s keywords: a controller, a priority...) holding ``slots`` on ``node``."""
    pod = mig_pod(name, *(p for _g, _s, p in slots), **kw)
    snap.assume(pod, node, (), mig=tuple(MigSlot(*s) for s in slots))
