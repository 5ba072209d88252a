"""``gpusched bench gang-topology``: how often gangs land within one clique, rack and block.

The measure: of the gangs of two or more members placed (after a warm-up), the fraction whose
members all share one domain at each level (clique, rack, block), and the fraction placed at
their *ideal* level: within the narrowest level whose domains are large enough for the gang.

Protocol, per seed: a cluster of ``blocks`` blocks x ``racks`` racks x ``cliques`` NVLink cliques x
``nodes`` nodes of ``gpus`` GPUs, labelled ``nvidia.com/gpu.clique``, ``gpusched.io/rack`` and
``gpusched.io/block`` (the default levels). A stream of ``arrivals`` units (``MIX``: single 1-GPU
pods, and gangs of 2 to 16 members of 2 or 4 GPUs) arriving as a Poisson process, each staying an
exponential time (mean 1), the rate set so that the offered GPU load is ``load`` x the cluster's
GPUs. Departures are processed before each arrival; a unit that does not fit is dropped (no queue).
Every unit goes through the core's ``place_gang`` (policy ``policy``). The same stream runs on
fresh clusters in each of ``CHOICES``:

- topology-blind: no request (the gang placement as before this work);
- preferred: every gang ``topology-preferred: nvidia.com/gpu.clique`` (one clique, else one rack,
  else one block, else anywhere);
- required: every gang ``topology-required`` at its ideal level (the narrowest whose domains hold
  its GPUs); such a gang is dropped rather than split.

The first ``WARMUP`` of the arrivals fill the cluster and are not counted.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.gang import GangSpec, Unit, place_gang
from gpusched.core.gangtopology import Mode, TopologyLevels
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.core.names import LABEL_BLOCK, LABEL_CLIQUE, LABEL_RACK
from gpusched.core.protocol import paper_profile

WARMUP = 0.2
LEVEL_NAMES = ("clique", "rack", "block")
BLIND, PREFERRED, REQUIRED = "topology-blind", "preferred clique", "required at its ideal level"
CHOICES = (BLIND, PREFERRED, REQUIRED)

MIX: tuple[tuple[int, int, float], ...] = (
    (1, 1, 0.25),
    (2, 2, 0.15),
    (2, 4, 0.2),
    (4, 4, 0.2),
    (8, 4, 0.12),
    (16, 4, 0.08),
)
"""(members, GPUs per member, share of arrivals); one member of one GPU is a single pod."""


@dataclass(frozen=True)
class Shape:
    blocks: int = 2
    racks: int = 2
    """Racks per block."""
    cliques: int = 2
    """NVLink cliques per rack."""
    nodes: int = 4
    """Nodes per clique."""
    gpus: int = 4
    """GPUs per node."""

    @property
    def sizes(self) -> tuple[int, int, int]:
        """GPUs in one clique, rack, block."""
        c = self.nodes * self.gpus
        return c, c * self.cliques, c * self.cliques * self.racks

    def node_specs(self) -> list[NodeSpec]:
        out = []
        for b in range(self.blocks):
            for r in range(self.racks):
                for c in range(self.cliques):
                    for n in range(self.nodes):
                        labels = {
                            LABEL_CLIQUE: f"b{b}r{r}c{c}",
                            LABEL_RACK: f"b{b}r{r}",
                            LABEL_BLOCK: f"b{b}",
                        }
                        out.append(
                            NodeSpec(
                                f"b{b}r{r}c{c}n{n}",
                                cpu_milli=144_000,
                                memory_mib=1 << 20,
                                gpu_count=self.gpus,
                                gpu_model="B200",
                                gpu_memory_mib=184_320,
                                labels=labels,
                            )
                        )
        return out


@dataclass(frozen=True)
class GangTopologyRun:
    choice: str
    seed: int
    arrivals: int
    """Units counted (after the warm-up)."""
    placed: int
    gangs: int
    """Gangs of two or more members counted."""
    gangs_placed: int
    within: tuple[int, int, int]
    """Placed gangs within one clique, rack, block."""
    ideal: int
    """Placed gangs within one domain of their ideal level."""
    gpu_placed: int
    gpu_offered: int
    seconds: float


def stream(shape: Shape, arrivals: int, load: float, seed: int) -> list[tuple[float, float, int, int]]:
    """(arrival, departure, members, GPUs per member) for ``arrivals`` units at offered ``load``."""
    rng = np.random.default_rng([seed, 0x6A6E])
    weights = np.array([w for _, _, w in MIX])
    kinds = rng.choice(len(MIX), size=arrivals, p=weights / weights.sum())
    mean_gpus = sum(m * g * w for m, g, w in MIX) / weights.sum()
    total = shape.blocks * shape.sizes[2]
    rate = load * total / mean_gpus
    t = np.cumsum(rng.exponential(1 / rate, size=arrivals))
    stay = rng.exponential(1.0, size=arrivals)
    return [(float(t[i]), float(t[i] + stay[i]), MIX[k][0], MIX[k][1]) for i, k in enumerate(kinds.tolist())]


def ideal_level(shape: Shape, gpus: int) -> int:
    """The narrowest level (0 clique, 1 rack, 2 block) whose domains hold ``gpus``; 3: none."""
    return next((i for i, s in enumerate(shape.sizes) if gpus <= s), 3)


def run_one(
    shape: Shape, choice: str, seed: int, *, arrivals: int, load: float, policy: str
) -> GangTopologyRun:
    snap = ClusterState(shape.node_specs())
    units = stream(shape, arrivals, load, seed)
    tw = TargetWorkload.from_pods(
        [
            PodSpec("w", cpu_milli=1000, memory_mib=1024, num_gpu=g, gpu_milli=GPU_MILLI)
            for _, _, _, g in units[:500]
        ]
    )
    profile = paper_profile(policy, tw, seed)
    levels = TopologyLevels()
    ranks = np.random.default_rng([seed, 0x5EED]).permutation(len(snap)).astype(np.int64)
    leaving: list[tuple[float, int]] = []
    keys_of: dict[int, list[str]] = {}
    warm = int(arrivals * WARMUP)
    counted = placed = gangs = gangs_placed = ideal = gpu_placed = gpu_offered = 0
    within = [0, 0, 0]
    t0 = time.perf_counter()
    for i, (at, until, members, per) in enumerate(units):
        while leaving and leaving[0][0] <= at:
            for k in keys_of.pop(heapq.heappop(leaving)[1]):
                snap.forget(k)
        name = f"u{i}"
        pods = tuple(
            PodSpec(f"{name}-{m}", cpu_milli=1000, memory_mib=1024, num_gpu=per, gpu_milli=GPU_MILLI,
                    gang=name if members > 1 else "")
            for m in range(members)
        )  # fmt: skip
        level = ideal_level(shape, members * per)
        topo = None
        if members > 1 and choice == PREFERRED:
            topo = levels.request(Mode.PREFERRED, levels.keys[0])
        elif members > 1 and choice == REQUIRED and level < 3:
            topo = levels.request(Mode.REQUIRED, levels.keys[level])
        gang = GangSpec(name, min_member=members, topology=topo) if members > 1 else None
        r = place_gang(
            profile, Unit(f"default/{name}", pods, members, gang), snap, tiebreak=ranks, diagnose=False
        )
        if r.scheduled:
            keys_of[i] = [p.key for p in pods]
            heapq.heappush(leaving, (until, i))
        if i < warm:
            continue
        counted += 1
        gpu_offered += members * per
        gangs += members > 1
        if not r.scheduled:
            continue
        placed += 1
        gpu_placed += members * per
        if members > 1:
            gangs_placed += 1
            nodes = [snap.nodes[x.node] for x in r.placed]
            for lv, key in enumerate((LABEL_CLIQUE, LABEL_RACK, LABEL_BLOCK)):
                one = len({nd.labels[key] for nd in nodes}) == 1
                within[lv] += one
                if lv == level:
                    ideal += one
            if level == 3:
                ideal += 1  # no domain holds it: wherever it lands is ideal
    return GangTopologyRun(
        choice, seed, counted, placed, gangs, gangs_placed, (within[0], within[1], within[2]), ideal,
        gpu_placed, gpu_offered, time.perf_counter() - t0,
    )  # fmt: skip


def gang_topology_report(
    seeds: Sequence[int],
    *,
    shape: Shape,
    arrivals: int,
    load: float,
    policy: str,
    on_done: Callable[[str], None] = lambda _m: None,
) -> tuple[dict[str, object], list[dict[str, object]]]:
    """(report header, one row per choice: the measures summed over ``seeds``, per seed too)."""
    if not load > 0:
        raise InvalidInput(f"load must be above 0, got {load}")
    if min(shape.blocks, shape.racks, shape.cliques, shape.nodes, shape.gpus) < 1 or arrivals < 1:
        raise InvalidInput("blocks, racks, cliques, nodes, GPUs and arrivals must each be at least 1")
    rows: list[dict[str, object]] = []
    runs: list[GangTopologyRun] = []
    for choice in CHOICES:
        mine = []
        for seed in seeds:
            mine.append(run_one(shape, choice, seed, arrivals=arrivals, load=load, policy=policy))
            on_done(f"{choice} seed {seed}")
        runs += mine
        gp = sum(r.gangs_placed for r in mine)

        def pct(num: int, den: int) -> float:
            return 100 * num / den if den else 0.0

        rows.append(
            {
                "choice": choice,
                **{
                    f"within_{n}_pct": pct(sum(r.within[lv] for r in mine), gp)
                    for lv, n in enumerate(LEVEL_NAMES)
                },
                "ideal_pct": pct(sum(r.ideal for r in mine), gp),
                "ideal_pct_per_seed": [round(pct(r.ideal, r.gangs_placed), 2) for r in mine],
                "gangs_placed_pct": pct(gp, sum(r.gangs for r in mine)),
                "placed_pct": pct(sum(r.placed for r in mine), sum(r.arrivals for r in mine)),
                "gpu_placed_pct": pct(sum(r.gpu_placed for r in mine), sum(r.gpu_offered for r in mine)),
                "gangs_placed": gp,
                "seconds": sum(r.seconds for r in mine) / len(mine),
            }
        )
    c, rk, b = shape.sizes
    header: dict[str, object] = {
        "title": (
            f"Gangs within one topology domain ({shape.blocks} blocks x {shape.racks} racks x "
            f"{shape.cliques} cliques x {shape.nodes} nodes x {shape.gpus} GPUs: "
            f"clique {c}, rack {rk}, block {b} GPUs; "
            f"policy {policy}, load {load:g}, {arrivals} arrivals, seeds {', '.join(map(str, seeds))})"
        ),
        "shape": asdict(shape),
        "mix": [{"members": m, "gpus_per_member": g, "share": w} for m, g, w in MIX],
        "warmup": WARMUP,
        "runs": [asdict(r) for r in runs],
    }
    return header, rows
