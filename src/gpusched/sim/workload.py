"""Where a simulation's cluster and pods come from: trace files or the synthetic default."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from gpusched.core.errors import InvalidInput
from gpusched.core.model import NodeSpec
from gpusched.sim.synthetic import SyntheticConfig, synthetic_workload
from gpusched.sim.traces import TracePod, read_nodes, read_pods


@dataclass(frozen=True)
class Workload:
    nodes: list[NodeSpec]
    pods: list[TracePod]
    label: str

    @property
    def gpus(self) -> int:
        return sum(n.gpu_count for n in self.nodes)


def load_workload(
    nodes: Path | None, pods: Path | None, synthetic: SyntheticConfig | None = None
) -> Workload:
    """Trace files when both paths are given, else the seeded synthetic workload."""
    if (nodes is None) != (pods is None):
        raise InvalidInput("give both --nodes and --pods (trace files), or neither for the synthetic default")
    if nodes is not None and pods is not None:
        ns = read_nodes(nodes, gpu_nodes_only=False)
        if not any(n.gpu_count for n in ns):
            raise InvalidInput(f"{nodes}: no node has a GPU")
        return Workload(ns, read_pods(pods), f"{pods.name} on {nodes.name}")
    cfg = synthetic or SyntheticConfig()
    ns, ps = synthetic_workload(cfg)
    return Workload(ns, ps, f"synthetic (seed {cfg.seed}, {len(ns)} nodes, {len(ps)} pods)")


def compress_arrivals(pods: list[TracePod], factor: float) -> list[TracePod]:
    """Bring arrivals ``factor`` times closer together, keeping each pod's lifetime: the
    offered load grows by about ``factor`` (the raw trace keeps its cluster about 1 % busy)."""
    if factor <= 0:
        raise InvalidInput(f"load factor must be positive, got {factor}")
    if factor == 1:
        return pods
    out = []
    for tp in pods:
        if tp.created is None:
            out.append(tp)
            continue
        c = int(tp.created / factor)
        d = None if tp.deleted is None else c + (tp.deleted - tp.created)
        out.append(replace(tp, created=c, deleted=d))
    return out
