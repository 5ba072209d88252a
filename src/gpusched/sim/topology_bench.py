"""``gpusched bench topology``: how often multi-GPU pods get an NVLink-complete, single-NUMA GPU set.

The measure: of the multi-GPU pods placed (after a warm-up), the fraction whose GPUs are all NVLink
peers of each other and on one NUMA node (``GpuTopology.is_complete``).

Protocol, per node shape and seed: ``nodes`` identical 8-GPU nodes of the shape; a stream of
``arrivals`` pods (shares of 250 or 500 milli, and 1-, 2- and 4-GPU pods, in ``MIX``'s proportions)
arriving as a Poisson process, each staying an exponential time (mean 1), the arrival rate set so
that the offered GPU load is ``load`` x the cluster's GPUs. Departures are processed before each
arrival; a pod that fits nowhere is dropped (no queue). Every pod goes through the core scheduler
(``schedule_one``, policy ``policy``). The same stream runs three times on fresh clusters (``CHOICES``):
with the nodes' topology unknown (``pick_gpus`` topology-blind: best fit, then lowest indices, as
before topology); known to ``pick_gpus`` only (the node chosen as blind, the GPU set on it
topology-aware); known to both (also the ``GpuTopology`` node preference: a multi-GPU pod prefers a
node where a complete set fits). The measure reads the shape's topology in all three. The first
``WARMUP`` of the arrivals fill the cluster and are not counted.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.core.plugins.gputopology import GpuTopologyPreference
from gpusched.core.protocol import paper_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.topology import GpuTopology

WARMUP = 0.2

BLIND, SET_ONLY, AWARE = "topology-blind best fit", "GPU set aware, node blind", "topology-aware"
CHOICES = (BLIND, SET_ONLY, AWARE)

MIX: tuple[tuple[int, int, float], ...] = (
    (1, 250, 0.15),
    (1, 500, 0.15),
    (1, 1000, 0.3),
    (2, 1000, 0.25),
    (4, 1000, 0.15),
)
"""(GPUs, milli per GPU, share of arrivals)."""


def _island_peers(islands: Sequence[Sequence[int]]) -> list[list[int]]:
    peers: list[list[int]] = [[] for _ in range(sum(len(i) for i in islands))]
    for isl in islands:
        for g in isl:
            peers[g] = [p for p in isl if p != g]
    return peers


SHAPES: dict[str, GpuTopology] = {
    # a PCIe box with NVLink bridges: 4 NVLink pairs, 2 pairs per socket
    "pcie-4x2-nvlink": GpuTopology.of(
        [0, 0, 0, 0, 1, 1, 1, 1], _island_peers([[0, 1], [2, 3], [4, 5], [6, 7]])
    ),
    # a 2-socket 8-GPU box: one NVLink island of 4 (all pairs) per socket
    "2-socket-2x4-nvlink": GpuTopology.of(
        [0, 0, 0, 0, 1, 1, 1, 1], _island_peers([[0, 1, 2, 3], [4, 5, 6, 7]])
    ),
}


@dataclass(frozen=True)
class TopologyRun:
    shape: str
    choice: str
    seed: int
    arrivals: int
    accepted: int
    multi_placed: int
    multi_complete: int
    multi_one_numa: int
    by_size: dict[str, tuple[int, int]]  # GPUs ("2", "4") -> (placed, complete)
    seconds: float

    @property
    def complete_pct(self) -> float:
        return 100 * self.multi_complete / self.multi_placed if self.multi_placed else 0.0


def stream(arrivals: int, load: float, gpus: int, seed: int) -> list[tuple[float, float, PodSpec]]:
    """(arrival time, departure time, pod) for ``arrivals`` pods, offered load ``load`` x ``gpus``."""
    rng = np.random.default_rng([seed, 0x70F0])
    weights = np.array([w for _, _, w in MIX])
    kinds = rng.choice(len(MIX), size=arrivals, p=weights / weights.sum())
    mean_gpus = sum(n * m / GPU_MILLI * w for n, m, w in MIX) / weights.sum()
    rate = load * gpus / mean_gpus  # arrivals per unit time, mean stay 1
    t = np.cumsum(rng.exponential(1 / rate, size=arrivals))
    stay = rng.exponential(1.0, size=arrivals)
    out = []
    for i in range(arrivals):
        n, milli, _ = MIX[kinds[i]]
        pod = PodSpec(f"p{i}", cpu_milli=1000, memory_mib=1024, num_gpu=n, gpu_milli=milli)
        out.append((float(t[i]), float(t[i] + stay[i]), pod))
    return out


def run_one(
    shape: str, choice: str, seed: int, *, nodes: int, arrivals: int, load: float, policy: str
) -> TopologyRun:
    topo = SHAPES[shape]
    specs = [
        NodeSpec(
            f"n{i:03d}",
            cpu_milli=256_000,
            memory_mib=1 << 20,
            gpu_count=topo.gpu_count,
            gpu_model="A100",
            gpu_memory_mib=81_920,
            gpu_topology=None if choice == BLIND else topo,
        )
        for i in range(nodes)
    ]
    snap = ClusterState(specs)
    pods = stream(arrivals, load, nodes * topo.gpu_count, seed)
    tw = TargetWorkload.from_pods([p for _, _, p in pods])
    profile = paper_profile(policy, tw, seed)
    if choice == SET_ONLY:
        prefs = tuple(p for p in profile.preferences if not isinstance(p.plugin, GpuTopologyPreference))
        profile = replace(profile, preferences=prefs)
    ranks = np.random.default_rng([seed, 0x5EED]).permutation(nodes).astype(np.int64)
    leaving: list[tuple[float, str]] = []
    accepted = placed = complete = one_numa = 0
    by_size: dict[int, list[int]] = {}
    warm = int(arrivals * WARMUP)
    t0 = time.perf_counter()
    for i, (at, until, pod) in enumerate(pods):
        while leaving and leaving[0][0] <= at:
            snap.forget(heapq.heappop(leaving)[1])
        r = schedule_one(profile, pod, snap, tiebreak=ranks, diagnose_failures=False)
        if not r.scheduled:
            continue
        heapq.heappush(leaving, (until, pod.key))
        if i < warm:
            continue
        accepted += 1
        if pod.num_gpu > 1:
            ok = topo.is_complete(r.gpus)
            placed += 1
            complete += ok
            one_numa += len({topo.numa[g] for g in r.gpus}) == 1
            c = by_size.setdefault(pod.num_gpu, [0, 0])
            c[0] += 1
            c[1] += ok
    return TopologyRun(
        shape,
        choice,
        seed,
        arrivals - warm,
        accepted,
        placed,
        complete,
        one_numa,
        {str(k): (v[0], v[1]) for k, v in sorted(by_size.items())},
        time.perf_counter() - t0,
    )


def topology_report(
    shapes: Sequence[str],
    seeds: Sequence[int],
    *,
    nodes: int,
    arrivals: int,
    load: float,
    policy: str,
    on_done: Callable[[str], None] = lambda _m: None,
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """(report header, one row per shape and mode: the measure averaged over ``seeds``, per seed too)."""
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        raise InvalidInput(f"unknown node shape(s) {unknown}; known: {sorted(SHAPES)}")
    rows: list[dict[str, object]] = []
    runs: list[TopologyRun] = []
    for shape in shapes:
        for choice in CHOICES:
            mine = []
            for seed in seeds:
                run = run_one(shape, choice, seed, nodes=nodes, arrivals=arrivals, load=load, policy=policy)
                mine.append(run)
                on_done(f"{shape} {choice} seed {seed}")
            runs += mine
            placed = sum(r.multi_placed for r in mine)
            sizes = sorted({k for r in mine for k in r.by_size})
            rows.append(
                {
                    "shape": shape,
                    "choice": choice,
                    "complete_pct": 100 * sum(r.multi_complete for r in mine) / placed if placed else 0.0,
                    "complete_pct_per_seed": [round(r.complete_pct, 2) for r in mine],
                    "complete_pct_by_size": {
                        k: 100
                        * sum(r.by_size.get(k, (0, 0))[1] for r in mine)
                        / max(1, sum(r.by_size.get(k, (0, 0))[0] for r in mine))
                        for k in sizes
                    },
                    "one_numa_pct": 100 * sum(r.multi_one_numa for r in mine) / placed if placed else 0.0,
                    "multi_placed": placed,
                    "accepted_pct": 100 * sum(r.accepted for r in mine) / sum(r.arrivals for r in mine),
                    "seconds": sum(r.seconds for r in mine) / len(mine),
                }
            )
    header: dict[str, object] = {
        "title": (
            f"Multi-GPU pods on an NVLink-complete, single-NUMA GPU set ({nodes} nodes per shape, "
            f"policy {policy}, load {load:g}, {arrivals} arrivals, seeds {', '.join(map(str, seeds))})"
        ),
        "mix": [{"gpus": n, "milli": m, "share": w} for n, m, w in MIX],
        "warmup": WARMUP,
        "runs": [asdict(r) for r in runs],
    }
    return header, rows
