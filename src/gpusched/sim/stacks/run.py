"""One stack on the churn protocol (``sim.churn``): the same pods, arrivals and lifetimes as any
other stack at that load and seed (``draw_pods`` on the physical cluster), placed by the stack's
scheduler on the nodes as it sees them, measured by ``meter`` in the pods' own terms."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import NodeSpec
from gpusched.core.policies import PolicyContext
from gpusched.sim.churn import Churn, ChurnConfig, DefragConfig
from gpusched.sim.replay import CLASS_ORDER, request_class
from gpusched.sim.stacks.catalog import Stack
from gpusched.sim.stacks.meter import StackMeter
from gpusched.sim.traces import TracePod

ALL_GPU = "all GPU pods"
GROWTH_LIMIT = 0.02
"""The queue grows without bound when the work waiting grows faster than this share of the
cluster's GPU-hours per hour, over the measured window (least squares)."""


@dataclass
class StackResult:
    stack: str
    load: float
    seed: int
    gpus: int
    pods_arrived: int
    pods_measured: int
    work_pct: float
    """GPU-hours of the pods running (their own request) / GPU-hours of the cluster, in the window."""
    booked_pct: float
    """GPU the scheduler booked (whole GPUs for shares, replicas / R), same window: what it believes."""
    completed_per_h: float
    never_ran: int
    """Pods that arrived in the window and were still pending at its end."""
    never_ran_pct: float
    oom_risk_pod_h: float
    oom_risk_pods_pct: float
    backlog_growth: float
    """Least-squares growth of the work waiting, in cluster GPU-hours per hour (0.05 = 5 %)."""
    stable: bool
    pending: dict[str, dict[str, float]]
    moves: int

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class StackChurn(Churn):
    """``Churn`` with the stack's view of pods and nodes, its profile, and the meter."""

    def __init__(
        self,
        stack: Stack,
        nodes: Sequence[NodeSpec],
        pool: Sequence[TracePod],
        cfg: ChurnConfig,
        workload: TargetWorkload,
    ) -> None:
        defrag = DefragConfig(mode="triggered") if stack.defrag else DefragConfig()
        # the draw and the books of the base class; the profile is replaced below ("random" is cheap)
        super().__init__(nodes, pool, replace(cfg, policy="random"), defrag, workload=workload)
        self.stack = stack
        self.asked = self.specs  # the pods' own requests
        self.specs = [stack.placement_spec(s) for s in self.asked]
        self.shapes = [s.shape() for s in self.specs]
        self.rest = [replace(s, cpu_milli=0, memory_mib=0).shape() for s in self.specs]
        self.snap = ClusterState(stack.placement_nodes(nodes))
        self.cap = self.snap.total_gpu_milli
        ctx = PolicyContext(workload=self.tw, rng=np.random.default_rng([cfg.seed, 0xD0]))
        self.profile = stack.profile(ctx)
        self.physical_milli = sum(n.gpu_count for n in nodes) * 1000
        phys = {k: n.gpu_count for k, n in enumerate(nodes)} if stack.replicas > 1 else {}
        self.meter = StackMeter(cfg.warmup_s, cfg.horizon_s, cfg.sample_every_s, physical_gpus=phys)

    def _advance(self, t: int) -> None:
        self.meter.advance(t)
        super()._advance(t)

    def _started(self, i: int) -> None:
        super()._started(i)
        a = self.snap.allocations[self.specs[i].key]
        self.meter.start(i, a.node, self.asked[i].num_gpu, self.asked[i].gpu_milli)

    def _depart(self, i: int) -> None:
        ends = self.running[i] and self.depart_at[i] == self.now
        super()._depart(i)
        if ends:
            self.meter.stop(i, completed=True)

    def _enqueue(self, i: int) -> None:
        super()._enqueue(i)
        self.meter.queued(self._work(i))

    def _unqueue(self, i: int) -> None:
        super()._unqueue(i)
        self.meter.queued(-self._work(i))

    def _retry_pass(self) -> None:
        """``machine.retry_pass`` with a stronger skip, same placements: feasibility only grows
        with a pod's CPU and memory requests, so once a pod fails, a later pod in the pass that
        asks the same in everything else and at least as much CPU and memory fails too."""
        failed: dict[tuple[object, ...], list[tuple[int, int]]] = {}
        for i in self.m.pending.order():
            sp = self.specs[i]
            rest = self.rest[i]
            if any(c <= sp.cpu_milli and m <= sp.memory_mib for c, m in failed.get(rest, ())):
                continue
            if self._try_place(i):
                self._unqueue(i)
            else:
                failed.setdefault(rest, []).append((sp.cpu_milli, sp.memory_mib))

    def _work(self, i: int) -> int:
        return self.asked[i].gpu_demand_milli * self.life[i]

    def stack_result(self) -> StackResult:
        self.run()
        cfg, m = self.cfg, self.meter
        window = cfg.horizon_s - cfg.warmup_s
        measured = [i for i in range(len(self.specs)) if cfg.warmup_s <= self.created[i] < cfg.horizon_s]
        never = sum(1 for i in measured if i in self.m.pending)
        return StackResult(
            stack=self.stack.name,
            load=cfg.load,
            seed=cfg.seed,
            gpus=self.physical_milli // 1000,
            pods_arrived=self.arrived,
            pods_measured=len(measured),
            work_pct=100.0 * m.work / (self.physical_milli * window),
            booked_pct=100.0 * self.int_alloc / (self.cap * window),
            completed_per_h=m.completed * 3600 / window,
            never_ran=never,
            never_ran_pct=100.0 * never / max(len(measured), 1),
            oom_risk_pod_h=m.risk_pod_s / 3600,
            oom_risk_pods_pct=100.0 * m.share_at_risk,
            backlog_growth=self._growth(),
            stable=self._growth() <= GROWTH_LIMIT,
            pending=self._pending(measured),
            moves=self.moves,
        )

    def _growth(self) -> float:
        pts = [(t, b) for t, b in self.meter.backlog_samples if t >= self.cfg.warmup_s]
        if len(pts) < 3:
            return 0.0
        t = np.array([p[0] for p in pts], dtype=np.float64) / 3600
        b = np.array([p[1] for p in pts], dtype=np.float64) / 3600 / self.physical_milli  # cluster-hours
        return float(np.polyfit(t, b, 1)[0])

    def _pending(self, measured: list[int]) -> dict[str, dict[str, float]]:
        """Per size class of the pods' own request: pending p50/p99 (a pod still waiting counts
        what it waited until the horizon, a lower bound) and how many never ran."""
        groups: dict[str, list[int]] = {}
        for i in measured:
            w = self.waited.get(i, self.cfg.horizon_s - self.created[i])
            groups.setdefault(request_class(self.asked[i]), []).append(w)
            if self.asked[i].num_gpu:
                groups.setdefault(ALL_GPU, []).append(w)
        out: dict[str, dict[str, float]] = {}
        for cls in (*CLASS_ORDER, ALL_GPU):
            if cls in groups:
                arr = np.asarray(groups[cls], dtype=np.float64)
                p50, p99 = (float(v) for v in np.percentile(arr, [50, 99]))
                out[cls] = {"pods": len(arr), "p50_s": p50, "p99_s": p99}
        return out


def run_stack(
    stack: Stack,
    nodes: Sequence[NodeSpec],
    pool: Sequence[TracePod],
    cfg: ChurnConfig,
    workload: TargetWorkload | None = None,
) -> StackResult:
    """One stack at ``cfg.load`` and ``cfg.seed`` (see the module doc)."""
    tw = workload or TargetWorkload.from_pods([tp.spec for tp in pool])
    return StackChurn(stack, nodes, pool, cfg, tw).stack_result()
