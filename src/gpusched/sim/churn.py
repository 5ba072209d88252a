"""Protocol 3, "churn": a busy shared cluster in steady state, with and without defragmentation.

Pods are drawn (seeded, with replacement) from a workload's pod mix — the synthetic default or
an Alibaba trace — and arrive as a Poisson stream whose rate makes the offered load ρ (GPU milli
× lifetime per second, over the cluster's GPU milli) the one asked for. Each pod lives:

- ``lifetime="trace"``: its own trace lifetime (``deleted - created`` of the row drawn, so size
  and lifetime keep their joint distribution), capped at ``max_lifetime_s``;
- ``lifetime="lognormal"``: a seeded log-normal with median ``median_lifetime_s`` (σ 1.8, the
  synthetic default's shape), capped the same way.

A pod that does not fit waits in a pending queue (kube-scheduler's order, ``core.pending``),
retried as the replay does (after departures and every ``retry_interval_s``, a failed shape
skipping its twins in the pass); with ``max_pending_s`` a pod gives up after waiting that long.
The run lasts ``horizon_s``; the first ``warmup_s`` are not measured.

Defragmentation (``DefragConfig``), always within a move budget — moves so far ≤
``move_budget`` × pods arrived so far, each pod moved at most ``max_moves_per_pod`` times:

- ``off``;
- ``triggered``: at each periodic retry, for the pods pending longer than ``wait_threshold_s``
  (queue order, at most ``plans_per_tick``), ``core.defrag.plan_for`` plans the fewest moves
  that make room; a plan is carried out at once (``apply_plan`` on a ``Statement``: every
  moved pod evicted and booked at its destination, then the pending pod on its node — the
  nominated node is reserved, nothing else takes the room between);
- ``periodic``: every ``period_s``, ``core.defrag.consolidate`` proposes up to
  ``consolidation_moves`` moves that most reduce FGD fragmentation for the target workload,
  carried out at once, and the queue is retried.

A moved pod keeps its departure time plus ``restart_penalty_s`` (work lost to the restart). The
run is a use of ``sim.machine``'s machine (its kick and tick are the retries above; the
consolidation is an event kind of its own); nothing reads a clock.

Measured over the steady window [warmup, horizon]: allocation (time-weighted mean, mean while a
GPU pod is pending — "under saturation" —, peak, and a sample every ``sample_every_s``); pending
time p50/p99 by request size for the pods that arrived in the window (a pod that gave up or is
still pending counts with the time it waited, a lower bound); GPU-hours stranded, two ways:
idle GPU while a GPU pod waits, and the FGD fragmentation for the target workload (sampled);
moves (count, distinct pods, fraction of the pods that arrived).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.defrag import (
    Method,
    Move,
    PriorityRule,
    Rules,
    WorkBudget,
    apply_plan,
    consolidate,
    plan_for,
)
from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload, cluster_fragmentation
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.pending import pending_order
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.protocol import tie_ranks
from gpusched.core.scheduler import schedule_one
from gpusched.core.statement import Statement
from gpusched.sim.engine import Priority
from gpusched.sim.machine import ARRIVE, DEPART, TIME_OUT, Kind, Machine, retry_pass
from gpusched.sim.replay import by_class, percentiles
from gpusched.sim.synthetic import LIFETIME_SIGMA
from gpusched.sim.traces import TracePod

CONSOLIDATE = Kind("consolidate", Priority.RETRY)
"""The periodic consolidation (``DefragConfig.mode`` ``periodic``)."""
MODES = ("off", "triggered", "periodic")
LIFETIMES = ("trace", "lognormal")


@dataclass(frozen=True)
class ChurnConfig:
    load: float = 1.0
    horizon_s: int = 86_400
    warmup_s: int = 21_600
    seed: int = 0
    policy: str = "default"
    lifetime: str = "trace"
    median_lifetime_s: int = 540
    max_lifetime_s: int = 21_600
    retry_interval_s: int = 60
    max_pending_s: int | None = None
    sample_every_s: int = 600

    def __post_init__(self) -> None:
        checks = (
            ("load", 0 < self.load <= 10, "must be in (0, 10]"),
            ("horizon_s", self.horizon_s > 0, "must be > 0"),
            ("warmup_s", 0 <= self.warmup_s < self.horizon_s, "must be in [0, horizon_s)"),
            ("lifetime", self.lifetime in LIFETIMES, f"must be one of {', '.join(LIFETIMES)}"),
            ("median_lifetime_s", self.median_lifetime_s > 0, "must be > 0"),
            ("max_lifetime_s", self.max_lifetime_s > 0, "must be > 0"),
            ("retry_interval_s", self.retry_interval_s > 0, "must be > 0"),
            ("max_pending_s", self.max_pending_s is None or self.max_pending_s > 0, "must be > 0"),
            ("sample_every_s", self.sample_every_s > 0, "must be > 0"),
        )
        for name, ok, why in checks:
            if not ok:
                raise InvalidInput(f"ChurnConfig.{name} {why}, got {getattr(self, name)!r}")


@dataclass(frozen=True)
class DefragConfig:
    mode: str = "off"
    move_budget: float = 0.02
    wait_threshold_s: int = 600
    plans_per_tick: int = 2
    replan_after_s: int = 600
    max_moves_per_plan: int = 8
    max_moves_per_pod: int = 1
    period_s: int = 3600
    consolidation_moves: int = 16
    restart_penalty_s: int = 0
    priority: PriorityRule = PriorityRule.NOT_HIGHER
    work: WorkBudget = field(default_factory=lambda: WorkBudget(max_work=200))

    def __post_init__(self) -> None:
        checks = (
            ("mode", self.mode in MODES, f"must be one of {', '.join(MODES)}"),
            ("move_budget", 0 <= self.move_budget <= 1, "must be in [0, 1]"),
            ("wait_threshold_s", self.wait_threshold_s >= 0, "must be >= 0"),
            ("plans_per_tick", self.plans_per_tick > 0, "must be > 0"),
            ("replan_after_s", self.replan_after_s >= 0, "must be >= 0"),
            ("max_moves_per_plan", self.max_moves_per_plan > 0, "must be > 0"),
            ("max_moves_per_pod", self.max_moves_per_pod > 0, "must be > 0"),
            ("period_s", self.period_s > 0, "must be > 0"),
            ("consolidation_moves", self.consolidation_moves > 0, "must be > 0"),
            ("restart_penalty_s", self.restart_penalty_s >= 0, "must be >= 0"),
        )
        for name, ok, why in checks:
            if not ok:
                raise InvalidInput(f"DefragConfig.{name} {why}, got {getattr(self, name)!r}")

    @property
    def label(self) -> str:
        if self.mode == "off":
            return "off"
        return f"{self.mode} ({100 * self.move_budget:g} % budget)"


@dataclass
class ChurnResult:
    """One churn run's figures (see the module doc); ``to_dict`` gives plain values."""

    mode: str
    label: str
    move_budget: float
    seed: int
    load: float
    policy: str
    lifetime: str
    pods_arrived: int
    pods_measured: int
    mean_alloc_pct: float
    saturated_alloc_pct: float
    saturated_time_pct: float
    peak_alloc_pct: float
    pending: dict[str, dict[str, float]]
    stranded_idle_gpu_hours: float
    stranded_frag_gpu_hours: float
    moves: int
    pods_moved: int
    moved_pct: float
    plans: dict[str, int]
    samples: list[tuple[int, float, int]] = field(default_factory=list)
    """(time s, allocation %, pending pods) every ``sample_every_s``."""

    def to_dict(self, samples: bool = True) -> dict[str, object]:
        d = asdict(self)
        d["samples"] = [[int(t), float(a), int(n)] for t, a, n in self.samples] if samples else []
        return d


def draw_pods(
    pool: Sequence[TracePod], nodes: Sequence[NodeSpec], cfg: ChurnConfig
) -> tuple[list[PodSpec], list[int], list[int]]:
    """The run's pods, their arrival times and lifetimes (seconds), seeded by ``cfg.seed``.

    Sizes (and, for ``lifetime="trace"``, lifetimes) are drawn from ``pool`` with replacement;
    the Poisson rate makes the offered load ``cfg.load`` of the cluster's GPU milli."""
    if not pool:
        raise InvalidInput("churn: the workload has no pods to draw from")
    cap = sum(n.gpu_count for n in nodes) * 1000
    if cap == 0:
        raise InvalidInput("churn: the cluster has no GPUs")
    rng = np.random.default_rng([cfg.seed, 0xC4A2])
    if cfg.lifetime == "trace":
        missing = [tp.spec.key for tp in pool if tp.created is None or tp.deleted is None]
        if missing:
            raise InvalidInput(
                f"churn: lifetime 'trace' needs creation and deletion times; pod {missing[0]} "
                f"(and {len(missing) - 1} more) lacks them: use lifetime 'lognormal'"
            )
        life_pool = np.array([max(1, int(tp.deleted or 0) - int(tp.created or 0)) for tp in pool])
    demand = np.array([tp.spec.gpu_demand_milli for tp in pool], dtype=np.float64)

    def lifetimes(idx: np.ndarray, r: np.random.Generator) -> np.ndarray:
        if cfg.lifetime == "trace":
            life = life_pool[idx]
        else:
            life = np.rint(cfg.median_lifetime_s * np.exp(LIFETIME_SIGMA * r.standard_normal(len(idx))))
        out: np.ndarray = np.clip(life, 1, cfg.max_lifetime_s).astype(np.int64)
        return out

    probe_rng = np.random.default_rng([cfg.seed, 0xE57])
    probe = probe_rng.integers(0, len(pool), size=200_000)
    mean_work = float(np.mean(demand[probe] * lifetimes(probe, probe_rng)))
    if mean_work <= 0:
        raise InvalidInput("churn: no pod of the workload asks for a GPU")
    rate = cfg.load * cap / mean_work  # pods per second
    expected = int(rate * cfg.horizon_s * 1.2) + 100
    gaps = rng.exponential(1 / rate, size=expected)
    times = np.cumsum(gaps)
    while times[-1] < cfg.horizon_s:
        times = np.concatenate([times, times[-1] + np.cumsum(rng.exponential(1 / rate, size=expected))])
    times = times[times < cfg.horizon_s].astype(np.int64)
    idx = rng.integers(0, len(pool), size=len(times))
    life = lifetimes(idx, rng)
    width = len(str(len(times)))
    specs = [replace(pool[j].spec, name=f"c{i:0{width}d}-{pool[j].spec.name}") for i, j in enumerate(idx)]
    return specs, [int(t) for t in times], [int(v) for v in life]


class Churn:
    """One churn run: the books, the queue, the event heap, the defragmenter and the tallies."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        pool: Sequence[TracePod],
        cfg: ChurnConfig,
        defrag: DefragConfig,
        *,
        workload: TargetWorkload | None = None,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.cfg, self.defrag, self.on_progress = cfg, defrag, on_progress
        self.specs, self.created, self.life = draw_pods(pool, nodes, cfg)
        self.snap = ClusterState(nodes)
        self.tw = workload or TargetWorkload.from_pods([tp.spec for tp in pool])
        ctx = PolicyContext(workload=self.tw, rng=np.random.default_rng([cfg.seed, 0xD0]))
        self.profile = make_profile(cfg.policy, ctx)
        self.ranks = tie_ranks(nodes, cfg.seed)
        self.shapes = [s.shape() for s in self.specs]
        self.keys = [pending_order(s.priority, self.created[i], i) for i, s in enumerate(self.specs)]
        self.index = {s.key: i for i, s in enumerate(self.specs)}
        n = len(self.specs)
        self.running = [False] * n
        self.depart_at = [0] * n
        self.waited: dict[int, int] = {}
        self.gave_up: dict[int, int] = {}
        self.m = Machine(self._retry_pass, retry_interval_s=cfg.retry_interval_s, after_tick=self._after_tick)
        self.m.on(ARRIVE, self._arrive)
        self.m.on(DEPART, self._depart)
        self.m.on(TIME_OUT, self._time_out)
        self.m.on(CONSOLIDATE, self._consolidate_every)
        self.m.meter(self._advance)
        for i in range(n):
            self.m.schedule(ARRIVE, self.created[i], i)
        if defrag.mode == "periodic":
            self.m.schedule(CONSOLIDATE, defrag.period_s)
        self.arrived = 0
        self.alloc = 0
        self.peak = 0
        self.cap = self.snap.total_gpu_milli
        self.gpu_pending = 0  # GPU pods in the queue
        # integrals over the steady window
        self.int_alloc = 0
        self.int_alloc_sat = 0
        self.sat_time = 0
        self.int_idle_pending = 0
        self.samples: list[tuple[int, float, int]] = []
        self.frag_samples: list[float] = []
        self.next_sample = 0
        # defragmentation
        self.moves = 0
        self.moved: dict[str, int] = {}
        self.last_plan: dict[int, int] = {}
        self.plans: dict[str, int] = {
            "attempted": 0,
            "carried_out": 0,
            "no_plan": 0,
            "fits_now": 0,
            "milp": 0,
            "greedy": 0,
            "optimal": 0,
            "failed_apply": 0,
            "consolidations": 0,
            "work": 0,
        }

    @property
    def now(self) -> int:
        return self.m.now

    # ---------------------------------------------------------------------------- the run
    def run(self, audit: bool = False) -> ChurnResult:
        self.m.run(self.cfg.horizon_s, after_event=self._audit if audit else None)
        if errs := self.snap.verify():
            raise AssertionError(f"accounting broken after the churn run: {errs}")
        return self._result()

    def _audit(self) -> None:
        if errs := self.snap.verify():
            raise AssertionError(f"accounting broken at t={self.now}: {errs}")

    def _advance(self, t: int) -> None:
        """The meter: integrate from ``now`` to ``t`` (the state is constant in between), sampling
        on the way."""
        while self.next_sample <= t and self.next_sample < self.cfg.horizon_s:
            self.samples.append((self.next_sample, self._pct(), len(self.m.pending)))
            if self.next_sample >= self.cfg.warmup_s:
                self.frag_samples.append(cluster_fragmentation(self.snap, self.tw))
            self.next_sample += self.cfg.sample_every_s
        lo = max(self.now, self.cfg.warmup_s)
        if t > lo:
            dt = t - lo
            self.int_alloc += self.alloc * dt
            if self.gpu_pending:
                self.int_alloc_sat += self.alloc * dt
                self.sat_time += dt
                self.int_idle_pending += (self.cap - self.alloc) * dt

    def _pct(self) -> float:
        return 100.0 * self.alloc / self.cap if self.cap else 0.0

    # ---------------------------------------------------------------------------- handlers
    def _arrive(self, i: int) -> None:
        self.arrived += 1
        if not self._try_place(i):
            self._enqueue(i)
        if self.on_progress is not None and self.arrived % 500 == 0:
            self.on_progress(self.arrived, len(self.specs))

    def _depart(self, i: int) -> None:
        if not self.running[i] or self.depart_at[i] != self.now:
            return  # moved since (its departure was scheduled again)
        self.snap.forget(self.specs[i].key)
        self.running[i] = False
        self.alloc -= self.specs[i].gpu_demand_milli
        self.m.wake()

    def _time_out(self, i: int) -> None:
        if i in self.m.pending:
            self._unqueue(i)
            self.gave_up[i] = self.now - self.created[i]

    def _consolidate_every(self, _item: int) -> None:
        self._consolidate()
        self.m.schedule(CONSOLIDATE, self.now + self.defrag.period_s)

    def _after_tick(self) -> None:
        if self.defrag.mode == "triggered" and self.m.pending:
            self._triggered()

    # ---------------------------------------------------------------------------- helpers
    def _enqueue(self, i: int) -> None:
        if self.specs[i].num_gpu:
            self.gpu_pending += 1
        give_up = None if self.cfg.max_pending_s is None else self.created[i] + self.cfg.max_pending_s
        self.m.enqueue(i, self.keys[i], give_up)

    def _unqueue(self, i: int) -> None:
        self.m.pending.remove(i)
        if self.specs[i].num_gpu:
            self.gpu_pending -= 1

    def _started(self, i: int) -> None:
        self.running[i] = True
        self.alloc += self.specs[i].gpu_demand_milli
        self.peak = max(self.peak, self.alloc) if self.now >= self.cfg.warmup_s else self.peak
        self.waited[i] = self.now - self.created[i]
        self.depart_at[i] = self.now + self.life[i]
        self.m.schedule(DEPART, self.depart_at[i], i)

    def _try_place(self, i: int) -> bool:
        r = schedule_one(self.profile, self.specs[i], self.snap, tiebreak=self.ranks, diagnose_failures=False)
        if r.scheduled:
            self._started(i)
        return r.scheduled

    def _retry_pass(self) -> None:
        retry_pass(self.m.pending.order(), self.shapes, self._try_place, self._unqueue)

    def _budget_left(self) -> int:
        return int(self.defrag.move_budget * self.arrived) - self.moves

    def _rules(self, max_moves: int) -> Rules:
        return Rules(
            priority=self.defrag.priority,
            max_moves=max_moves,
            max_moves_per_pod=self.defrag.max_moves_per_pod,
            moved=self.moved,
        )

    def _triggered(self) -> None:
        d = self.defrag
        tried_shapes: set[tuple[object, ...]] = set()
        plans = 0
        for i in self.m.pending.order():
            if plans >= d.plans_per_tick:
                break
            if i not in self.m.pending or self.now - self.created[i] < d.wait_threshold_s:
                continue
            if self.shapes[i] in tried_shapes:
                continue
            if self.now - self.last_plan.get(i, -(1 << 40)) < d.replan_after_s:
                continue
            left = self._budget_left()
            if left <= 0:
                return
            tried_shapes.add(self.shapes[i])
            self.last_plan[i] = self.now
            plans += 1
            self.plans["attempted"] += 1
            spec = self.specs[i]
            plan = plan_for(
                self.profile,
                self.snap,
                spec,
                self._rules(min(left, d.max_moves_per_plan)),
                d.work,
                tiebreak=self.ranks,
            )
            self.plans["work"] += plan.work
            if not plan.feasible:
                self.plans["no_plan"] += 1
                continue
            if plan.method is Method.FITS_NOW:
                self.plans["fits_now"] += 1
            elif plan.method is Method.MILP:
                self.plans["milp"] += 1
            else:
                self.plans["greedy"] += 1
            self.plans["optimal"] += int(plan.optimal)
            with Statement(self.snap) as st:
                why = apply_plan(st, self.profile, plan, {spec.key: spec})
                if why is not None:
                    self.plans["failed_apply"] += 1
                    continue  # discarded on leaving the block
                st.commit()
            self.plans["carried_out"] += 1
            self._moved(plan.moves)
            self._unqueue(i)
            self._started(i)

    def _moved(self, moves: Sequence[Move]) -> None:
        for mv in moves:
            self.moves += 1
            self.moved[mv.pod] = self.moved.get(mv.pod, 0) + 1
            j = self.index[mv.pod]
            if self.defrag.restart_penalty_s:
                self.depart_at[j] += self.defrag.restart_penalty_s
                self.m.schedule(DEPART, self.depart_at[j], j)
        if moves:
            self.m.dirty = True

    def _consolidate(self) -> None:
        left = self._budget_left()
        if left <= 0:
            return
        k = min(left, self.defrag.consolidation_moves)
        self.plans["consolidations"] += 1
        plan = consolidate(self.profile, self.snap, self.tw, k, self._rules(k), self.defrag.work)
        self.plans["work"] += plan.work
        if not plan.moves:
            return
        with Statement(self.snap) as st:
            why = apply_plan(st, self.profile, plan)
            if why is not None:
                self.plans["failed_apply"] += 1
                return
            st.commit()
        self._moved(plan.moves)
        if self.m.pending:
            self._retry_pass()
            self.m.dirty = False

    def _result(self) -> ChurnResult:
        cfg = self.cfg
        window = cfg.horizon_s - cfg.warmup_s
        measured = [i for i in range(len(self.specs)) if cfg.warmup_s <= self.created[i] < cfg.horizon_s]
        pending: dict[str, dict[str, float]] = {}
        for cls, idx in by_class(self.specs, measured).items():
            # a pod that gave up or is still pending counts what it waited (censored at the horizon)
            w = [self.waited.get(i, self.gave_up.get(i, cfg.horizon_s - self.created[i])) for i in idx]
            row: dict[str, float] = {"pods": len(idx)}
            row["placed"] = sum(1 for i in idx if i in self.waited)
            row["gave_up"] = sum(1 for i in idx if i in self.gave_up)
            row["still_pending"] = sum(1 for i in idx if i in self.m.pending)
            row.update(zip(("p50_s", "p90_s", "p99_s", "max_s"), percentiles(w), strict=True))
            pending[cls] = row
        frag_hours = float(np.mean(self.frag_samples)) * window / 3600 / 1000 if self.frag_samples else 0.0
        return ChurnResult(
            mode=self.defrag.mode,
            label=self.defrag.label,
            move_budget=self.defrag.move_budget,
            seed=cfg.seed,
            load=cfg.load,
            policy=cfg.policy,
            lifetime=cfg.lifetime,
            pods_arrived=self.arrived,
            pods_measured=len(measured),
            mean_alloc_pct=100.0 * self.int_alloc / (self.cap * window),
            saturated_alloc_pct=100.0 * self.int_alloc_sat / (self.cap * self.sat_time)
            if self.sat_time
            else 0.0,
            saturated_time_pct=100.0 * self.sat_time / window,
            peak_alloc_pct=100.0 * self.peak / self.cap,
            pending=pending,
            stranded_idle_gpu_hours=self.int_idle_pending / 1000 / 3600,
            stranded_frag_gpu_hours=frag_hours,
            moves=self.moves,
            pods_moved=len(self.moved),
            moved_pct=100.0 * self.moves / max(self.arrived, 1),
            plans=dict(self.plans),
            samples=self.samples,
        )


def run_churn(
    nodes: Sequence[NodeSpec],
    pool: Sequence[TracePod],
    cfg: ChurnConfig,
    defrag: DefragConfig | None = None,
    *,
    workload: TargetWorkload | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    audit: bool = False,
) -> ChurnResult:
    """One churn run (see the module doc)."""
    return Churn(nodes, pool, cfg, defrag or DefragConfig(), workload=workload, on_progress=on_progress).run(
        audit
    )


@dataclass
class ChurnReport:
    """Churn runs side by side: per seed, the run without defragmentation and the runs with it."""

    workload: str
    config: dict[str, object]
    results: list[ChurnResult]
    plots: list[str] = field(default_factory=list)

    def baseline(self, seed: int) -> ChurnResult:
        (r,) = (r for r in self.results if r.seed == seed and r.mode == "off")
        return r

    def gains(self) -> list[dict[str, object]]:
        """Per run with defragmentation, the change against the same seed's run without it."""
        out: list[dict[str, object]] = []
        for r in self.results:
            if r.mode == "off":
                continue
            b = self.baseline(r.seed)
            row: dict[str, object] = {
                "label": r.label,
                "mode": r.mode,
                "move_budget": r.move_budget,
                "seed": r.seed,
                "alloc_gain_pts": round(r.mean_alloc_pct - b.mean_alloc_pct, 3),
                "saturated_alloc_gain_pts": round(r.saturated_alloc_pct - b.saturated_alloc_pct, 3),
                "moved_pct": round(r.moved_pct, 3),
                "stranded_idle_gpu_hours_change": round(
                    r.stranded_idle_gpu_hours - b.stranded_idle_gpu_hours, 2
                ),
            }
            for cls in ("4 GPUs", "8 GPUs"):
                if cls in r.pending and cls in b.pending:
                    before, after = b.pending[cls]["p99_s"], r.pending[cls]["p99_s"]
                    row[f"p99_{cls.split()[0]}gpu_ratio"] = round(after / before, 3) if before else None
            out.append(row)
        return out

    def to_dict(self, samples: bool = False) -> dict[str, object]:
        return {
            "workload": self.workload,
            "protocol": "churn",
            "config": self.config,
            "results": [r.to_dict(samples) for r in self.results],
            "gains": self.gains(),
            "plots": list(self.plots),
        }
