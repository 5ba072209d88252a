"""The embedded default workload: a synthetic cluster and pod list, seeded and reproducible.

The distributions follow the *published statistics* of the Alibaba GPU trace v2023 ("openb",
Weng et al., ATC '23): the node shape mix by GPU model, the pod class mix (CPU-only, GPU
share, 1/2/4/8 GPUs), the most common share sizes, and the arrival span and median lifetime.
No trace rows are embedded; CPU and memory per pod come from small sets of typical ratios.

How the GPU demand target is met (by adjusting the pod count): ``pods`` pods are first drawn
with the class counts apportioned exactly from the published shares, in shuffled order. If
their GPU demand is above ``gpu_demand_pct`` of the cluster's GPUs (plus a slack of 1 % of
the target), pods are dropped from the end of the list; if it is below (minus the slack),
further GPU pods are drawn i.i.d. from the same mix, skipping any that would overshoot, until
it is within the slack, plus CPU-only pods in the mix's proportion to them; then all are
shuffled. So the count equals ``pods`` at the defaults (the trace's ratio of pods
to nodes) and scales with the cluster when ``nodes`` changes without ``pods``.

Every pod fits at least one node of the cluster when it is empty: GPU count, CPU and memory
are capped by the largest node that can hold the pod (of an allowed model when constrained).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpusched.core.errors import InvalidInput
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.sim.traces import GPU_MEMORY_MIB, SIM_CONTROLLER, TracePod

GIB = 1024
# Node shapes (model, GPUs, CPU cores, memory GiB, node count in the 1213-node GPU cluster).
NODE_SHAPES: tuple[tuple[str, int, int, int, int], ...] = (
    ("G2", 8, 96, 384, 549),
    ("T4", 2, 104, 512, 387),
    ("T4", 4, 96, 384, 17),
    ("P100", 2, 16, 120, 107),
    ("P100", 2, 64, 256, 22),
    ("P100", 1, 8, 60, 3),
    ("P100", 2, 8, 60, 2),
    ("G3", 8, 128, 768, 39),
    ("V100M16", 4, 32, 128, 28),
    ("V100M16", 1, 8, 32, 19),
    ("V100M16", 8, 64, 256, 8),
    ("V100M32", 8, 96, 768, 21),
    ("V100M32", 4, 48, 368, 9),
    ("A10", 1, 128, 1024, 2),
)
# Pod classes (num_gpu, share?) and their counts among 8152 pods; num_gpu 0 = CPU-only.
POD_CLASSES: tuple[tuple[int, bool, int], ...] = (
    (0, False, 1088),
    (1, True, 3078),
    (1, False, 3911),
    (2, False, 16),
    (4, False, 15),
    (8, False, 44),
)
# The most common gpu_milli among share pods and their counts; the other 401 of 3078 shares
# are drawn as 50 + 10*floor(95*U^2) (multiples of 10 in [50, 990], mean ~360).
SHARE_MILLI: tuple[tuple[int, int], ...] = (
    (810, 1078),
    (470, 750),
    (320, 328),
    (650, 253),
    (230, 140),
    (460, 128),
)
SHARE_TOTAL = 3078
CORES_PER_GPU = ((4, 6, 8, 12, 16, 32), (0.15, 0.10, 0.20, 0.40, 0.12, 0.03))
CORES_PER_GPU_MULTI = ((4, 6, 8, 12), (0.25, 0.25, 0.25, 0.25))
CORES_CPU_ONLY = ((1, 2, 4, 8, 12, 16, 32, 64), (0.03, 0.05, 0.10, 0.20, 0.25, 0.12, 0.22, 0.03))
GIB_PER_CORE = ((2, 3, 4, 6, 8), (0.25, 0.25, 0.35, 0.10, 0.05))
LIFETIME_SIGMA = 1.8  # log-normal shape: heavy tail (p99 ~ 100x the median)


@dataclass(frozen=True)
class SyntheticConfig:
    nodes: int = 1213  # cluster size; node shapes scale proportionally
    pods: int = 8152  # number of pods drawn before the demand adjustment (see module doc)
    seed: int = 0
    gpu_demand_pct: float = 98.0  # total GPU demand of the pods as % of the cluster's GPUs (approximate)
    horizon_s: int = 12_901_761  # creation times spread over [0, horizon_s]
    median_lifetime_s: int = 540  # lifetimes log-normal with this median (heavy tail)
    constrained_pct: float = 0.0  # % of GPU pods given a gpu_models constraint of 1-2 models

    def __post_init__(self) -> None:
        checks = (
            ("nodes", self.nodes > 0, "must be > 0"),
            ("pods", self.pods > 0, "must be > 0"),
            ("gpu_demand_pct", 0 < self.gpu_demand_pct <= 1000, "must be in (0, 1000]"),
            ("horizon_s", self.horizon_s >= 0, "must be >= 0"),
            ("median_lifetime_s", self.median_lifetime_s > 0, "must be > 0"),
            ("constrained_pct", 0 <= self.constrained_pct <= 100, "must be in [0, 100]"),
        )
        for name, ok, why in checks:
            if not ok:
                raise InvalidInput(f"SyntheticConfig.{name} {why}, got {getattr(self, name)!r}")


def _apportion(weights: Sequence[float], total: int) -> list[int]:
    """Largest-remainder split of ``total`` in proportion to ``weights`` (ties: first wins)."""
    w = np.asarray(weights, dtype=float)
    exact = w / w.sum() * total
    counts = np.floor(exact).astype(int)
    order = sorted(range(len(w)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: total - int(counts.sum())]:
        counts[i] += 1
    return [int(c) for c in counts]


def synthetic_cluster(cfg: SyntheticConfig) -> list[NodeSpec]:
    """``cfg.nodes`` nodes in the published shape mix; the seed shuffles which name gets which shape."""
    counts = _apportion([s[4] for s in NODE_SHAPES], cfg.nodes)
    shapes = [s for s, c in zip(NODE_SHAPES, counts, strict=True) for _ in range(c)]
    order = np.random.default_rng([cfg.seed, 1]).permutation(len(shapes))
    width = max(4, len(str(cfg.nodes - 1)))
    return [
        NodeSpec(
            name=f"syn-node-{i:0{width}d}",
            cpu_milli=cores * 1000,
            memory_mib=gib * GIB,
            gpu_count=gpus,
            gpu_model=model,
            gpu_memory_mib=GPU_MEMORY_MIB.get(model, 0),
        )
        for i, (model, gpus, cores, gib, _) in enumerate(shapes[j] for j in order)
    ]


class _Drawer:
    """Draws one pod's request (without name) from the published mix, fitted to ``nodes``."""

    def __init__(self, cfg: SyntheticConfig, nodes: Sequence[NodeSpec], rng: np.random.Generator) -> None:
        self.cfg, self.rng = cfg, rng
        self.gpus = np.array([n.gpu_count for n in nodes])
        self.cpu = np.array([n.cpu_milli for n in nodes])
        self.mem = np.array([n.memory_mib for n in nodes])
        self.model = np.array([n.gpu_model for n in nodes])
        self.models = sorted({n.gpu_model for n in nodes if n.gpu_count})
        self.model_gpus = np.array([self.gpus[self.model == m].sum() for m in self.models], dtype=float)
        self.share_values = [v for v, _ in SHARE_MILLI]
        counts = [c for _, c in SHARE_MILLI]
        self.share_p = np.array([*counts, SHARE_TOTAL - sum(counts)], dtype=float) / SHARE_TOTAL

    def _pick(self, table: tuple[tuple[int, ...], tuple[float, ...]]) -> int:
        return int(self.rng.choice(table[0], p=table[1]))

    def _share(self) -> int:
        k = int(self.rng.choice(len(self.share_p), p=self.share_p))
        if k < len(self.share_values):
            return self.share_values[k]
        return min(990, 50 + 10 * int(95 * self.rng.random() ** 2))

    def draw(self, cls: int) -> tuple[int, int, int, int, frozenset[str]]:
        num, share, _ = POD_CLASSES[cls]
        num = min(num, int(self.gpus.max()))
        num = 1 << (num.bit_length() - 1) if num else 0  # largest power of two that fits a node
        milli = self._share() if share else (GPU_MILLI if num else 0)
        models: frozenset[str] = frozenset()
        if num and self.rng.random() * 100 < self.cfg.constrained_pct:
            ok = [i for i, m in enumerate(self.models) if self.gpus[self.model == m].max() >= num]
            p = self.model_gpus[ok] / self.model_gpus[ok].sum()
            k = min(len(ok), 1 + int(self.rng.random() < 0.5))
            models = frozenset(
                self.models[ok[i]] for i in self.rng.choice(len(ok), size=k, replace=False, p=p)
            )
        if num == 0:
            cores = self._pick(CORES_CPU_ONLY)
        else:
            ratio = self._pick(CORES_PER_GPU_MULTI if num > 1 else CORES_PER_GPU)
            cores = max(1, round(ratio * num * milli / GPU_MILLI))
        mem = cores * self._pick(GIB_PER_CORE) * GIB
        eligible = self.gpus >= num
        if models:
            eligible &= np.isin(self.model, list(models))
        cpu = min(cores * 1000, int(self.cpu[eligible].max()))
        mem = min(mem, int(self.mem[eligible & (self.cpu >= cpu)].max()))
        return cpu, mem, num, milli, models


def synthetic_pods(cfg: SyntheticConfig, nodes: Sequence[NodeSpec] | None = None) -> list[TracePod]:
    """Pods for ``nodes`` (default: ``synthetic_cluster(cfg)``), sorted by creation time and name."""
    nodes = synthetic_cluster(cfg) if nodes is None else nodes
    capacity = sum(n.gpu_count for n in nodes) * GPU_MILLI
    if capacity == 0:
        raise InvalidInput("nodes: the cluster has no GPUs, so a GPU demand target cannot be met")
    rng = np.random.default_rng([cfg.seed, 2])
    drawer = _Drawer(cfg, nodes, rng)
    counts = _apportion([c[2] for c in POD_CLASSES], cfg.pods)
    classes = np.repeat(np.arange(len(POD_CLASSES)), counts)[rng.permutation(cfg.pods)]
    reqs = [drawer.draw(int(c)) for c in classes]
    target = cfg.gpu_demand_pct / 100 * capacity
    slack = max(25.0, 0.01 * target)  # 25 milli: half the smallest share
    demand = np.cumsum([r[2] * r[3] for r in reqs])
    keep = int(np.searchsorted(demand, target + slack, side="right"))  # longest prefix within the slack
    reqs, total, misses = reqs[:keep], int(demand[keep - 1]) if keep else 0, 0
    gpu_classes = [i for i, c in enumerate(POD_CLASSES) if c[0]]
    p = np.array([POD_CLASSES[i][2] for i in gpu_classes], dtype=float)
    added = 0
    while target - total > slack and misses < 100:  # top up with i.i.d. GPU pods from the mix
        r = drawer.draw(gpu_classes[int(rng.choice(len(p), p=p / p.sum()))])
        if total + r[2] * r[3] > target + slack:  # would overshoot: skip it
            misses += 1
            continue
        reqs.append(r)
        total, misses, added = total + r[2] * r[3], 0, added + 1
    cpu_only = POD_CLASSES[0][2] / p.sum()  # CPU-only pods per GPU pod in the mix
    reqs += [drawer.draw(0) for _ in range(round(added * cpu_only))]
    reqs = [reqs[i] for i in rng.permutation(len(reqs))]
    if not reqs:
        gpus = capacity // GPU_MILLI
        raise InvalidInput(f"gpu_demand_pct: {cfg.gpu_demand_pct} % of {gpus} GPUs is below every pod drawn")
    n = len(reqs)
    created = np.sort(rng.integers(0, cfg.horizon_s + 1, size=n))
    life = np.maximum(1, np.rint(cfg.median_lifetime_s * np.exp(LIFETIME_SIGMA * rng.standard_normal(n))))
    width = max(5, len(str(n - 1)))
    return [
        TracePod(
            PodSpec(
                name=f"syn-pod-{i:0{width}d}",
                cpu_milli=cpu,
                memory_mib=mem,
                num_gpu=num,
                gpu_milli=milli,
                gpu_models=models,
                controller=SIM_CONTROLLER,
            ),
            int(created[i]),
            int(created[i] + life[i]),
        )
        for i, (cpu, mem, num, milli, models) in enumerate(reqs)
    ]


def synthetic_workload(cfg: SyntheticConfig) -> tuple[list[NodeSpec], list[TracePod]]:
    nodes = synthetic_cluster(cfg)
    return nodes, synthetic_pods(cfg, nodes)
