"""Multi-tenant replay: tenant queues with quotas and gangs against a plain priority queue.

The workload's GPU pods (a trace, or the seeded synthetic default) become the jobs of three or
more tenants, in trace time:

- **tenants**: each job goes to a tenant drawn with weights that swing over time (tenant ``i``'s
  weight follows a sine of period ``period_s`` shifted by ``i/n`` of a period), so tenants take
  turns being busy and idle, which is when borrowing and reclaim matter. Each tenant has a
  nominal quota of GPU milli (its share of the cluster), a borrowing limit (``borrow_pct`` % of
  its quota) and a weight;
- **gangs**: a whole-GPU job becomes, with probability ``gang_pct`` %, a gang of 2 to
  ``max_gang`` copies of its pod (``min_member`` all of them), as a multi-pod training job; its
  pods start together and leave together.

Two schedulers replay the same jobs on the same cluster:

- ``queues``: gpusched's batch cycle (``core.batch.run_cycle``): gangs as units, quota admission
  with borrowing, surplus by weighted DRF, reclaim of lent quota (victims requeued as new jobs of
  the same length);
- ``plain``: a plain priority queue as kube-scheduler has it: pods one at a time in pending
  order, no quotas, no gangs: a gang's job starts when its last pod binds and its earlier pods
  hold GPUs idle meanwhile.

Both run on ``sim.machine``'s machine: arrivals, departures and reclaimed jobs' returns are event
kinds; each wakes the machine, whose kick runs one cycle per instant while a job waits.

Per tenant: pending time p50/p99 (arrival to bind), GPU-hours used against the fair share (the
weighted max-min division of the cluster by demand at every moment, ``fairshare.water_fill``),
reclaims suffered and made, quota violations (a tenant over its quota plus borrowing limit after a
cycle: 0 for ``queues`` by construction) and the GPU-hours held idle by partly bound gangs.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gpusched.core.batch import Outcome, run_cycle
from gpusched.core.cluster import ClusterState
from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.gang import GangSpec, Unit
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.queues import QueueBook, QueueSpec, QueueTree, Quota
from gpusched.core.queues.fairshare import water_fill
from gpusched.core.queues.usage import charge_of
from gpusched.sim.engine import Priority
from gpusched.sim.machine import ARRIVE, DEPART, Kind, Machine
from gpusched.sim.traces import TracePod
from gpusched.sim.workload import compress_arrivals

MODES = ("queues", "plain")
REQUEUE = Kind("requeue", Priority.RETRY)
"""A reclaimed job back in the queue, at the instant it was reclaimed (after its arrivals)."""


@dataclass(frozen=True)
class TenantConfig:
    """The scenario: tenants (names, quota shares in %, weights), gangs, time swing, seed."""

    tenants: tuple[str, ...] = ("research", "prod", "batch")
    shares_pct: tuple[int, ...] = (50, 30, 20)
    weights: tuple[int, ...] = (1, 1, 1)
    borrow_pct: int = 50
    """How much beyond its quota a tenant may borrow, in % of its quota."""
    gang_pct: int = 30
    max_gang: int = 8
    period_s: int = 0
    """Period of the tenants' swing in seconds; 0: a quarter of the replay's span."""
    load: float = 1.3
    """Offered GPU load the arrivals are brought to (GPU-seconds asked / GPU-seconds in the span),
    by moving arrivals closer together (lifetimes kept); 0: arrivals as they are."""
    seed: int = 0
    policy: str = "bestfit"
    max_jobs: int = 0
    """Replay only the first this many GPU pods of the workload (by arrival); 0: all."""
    max_nodes: int = 0
    """Replay on the first this many nodes only (a slice of a trace's cluster); 0: all."""

    def __post_init__(self) -> None:
        n = len(self.tenants)
        if n < 1 or len(set(self.tenants)) != n:
            raise InvalidInput("tenants: give one or more distinct names")
        if len(self.shares_pct) != n or len(self.weights) != n:
            raise InvalidInput(f"tenants: {n} names need {n} shares and {n} weights")
        if any(s < 0 for s in self.shares_pct) or sum(self.shares_pct) > 100:
            raise InvalidInput(f"shares_pct must be >= 0 and sum to at most 100, got {self.shares_pct}")
        if any(w < 1 for w in self.weights):
            raise InvalidInput(f"weights must be >= 1, got {self.weights}")
        for name, v, lo, hi in (
            ("borrow_pct", self.borrow_pct, 0, 10_000),
            ("gang_pct", self.gang_pct, 0, 100),
            ("max_gang", self.max_gang, 2, 64),
            ("period_s", self.period_s, 0, 1 << 40),
        ):
            if not lo <= v <= hi:
                raise InvalidInput(f"{name} must be in {lo}..{hi}, got {v}")
        if self.max_jobs < 0 or self.max_nodes < 0:
            raise InvalidInput(f"max_jobs and max_nodes must be >= 0, got {self.max_jobs}, {self.max_nodes}")
        if not 0 <= self.load <= 100:
            raise InvalidInput(f"load must be in 0..100, got {self.load}")

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def tree(self, total_milli: int) -> QueueTree:
        specs = [QueueSpec("cluster")]
        for name, share, w in zip(self.tenants, self.shares_pct, self.weights, strict=True):
            nominal = total_milli * share // 100
            specs.append(
                QueueSpec(
                    name,
                    "cluster",
                    Quota(gpu_milli=nominal),
                    borrowing_limit=Quota(gpu_milli=nominal * self.borrow_pct // 100),
                    weight=w,
                )
            )
        return QueueTree(specs)


def parse_tenants(text: str) -> tuple[tuple[str, ...], tuple[int, ...], tuple[int, ...]]:
    """``name:quota%[:weight],...`` -> names, quota shares, weights (InvalidInput naming the part)."""
    names, shares, weights = [], [], []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        bits = part.split(":")
        try:
            if len(bits) not in (2, 3) or not bits[0]:
                raise ValueError
            names.append(bits[0])
            shares.append(int(bits[1]))
            weights.append(int(bits[2]) if len(bits) == 3 else 1)
        except ValueError:
            raise InvalidInput(f"tenants: {part!r} is not name:quota%[:weight] with integers") from None
    if len(names) < 3:
        raise InvalidInput(
            f"tenants: give 3 or more as name:quota%[:weight], comma-separated; got {len(names)}"
        )
    return tuple(names), tuple(shares), tuple(weights)


@dataclass(frozen=True, slots=True)
class Job:
    """One tenant's job: its pods (a gang when more than one), arrival, duration."""

    key: str
    tenant: str
    pods: tuple[PodSpec, ...]
    arrival: int
    duration: int

    @property
    def milli(self) -> int:
        return sum(p.gpu_demand_milli for p in self.pods)


def offered_load(pods: Sequence[TracePod], gpu_milli: int) -> float:
    """GPU-seconds the pods ask for over the GPU-seconds of the cluster in their arrival span."""
    times = [tp.created or 0 for tp in pods]
    span = max(times, default=0) - min(times, default=0)
    asked = sum(tp.spec.gpu_demand_milli * _life(tp) for tp in pods)
    return asked / (gpu_milli * span) if span and gpu_milli else 0.0


def _life(tp: TracePod) -> int:
    t = tp.created or 0
    return max(1, (tp.deleted - t) if tp.deleted is not None else 3600)


def make_jobs(pods: Sequence[TracePod], cfg: TenantConfig, gpu_milli: int) -> list[Job]:
    """The workload's GPU pods as tenants' jobs (see the module doc), in arrival order, their
    arrivals compressed to ``cfg.load`` on a cluster of ``gpu_milli``."""
    rng = np.random.default_rng([cfg.seed, 13])
    n = len(cfg.tenants)
    base = np.array([max(s, 1) for s in cfg.shares_pct], dtype=float)
    gpu_pods = sorted((tp for tp in pods if tp.spec.num_gpu), key=lambda tp: (tp.created or 0, tp.spec.name))
    if cfg.max_jobs:
        gpu_pods = gpu_pods[: cfg.max_jobs]
    now = offered_load(gpu_pods, gpu_milli)
    if cfg.load and now:
        gpu_pods = compress_arrivals(gpu_pods, cfg.load / now)
    times = [tp.created or 0 for tp in gpu_pods]
    period = cfg.period_s or max(1, (max(times, default=0) - min(times, default=0)) // 4)
    jobs: list[Job] = []
    for tp in gpu_pods:
        p = tp.spec
        t, life = tp.created or 0, _life(tp)
        phase = np.array([math.sin(2 * math.pi * (t / period + i / n)) for i in range(n)])
        w = base * (1.0 + 0.95 * phase)
        tenant = cfg.tenants[int(rng.choice(n, p=w / w.sum()))]
        size = 1
        if p.is_whole and rng.random() * 100 < cfg.gang_pct:
            size = int(rng.integers(2, cfg.max_gang + 1))
        key = f"{tenant}/{p.name}"
        gang = p.name if size > 1 else ""
        members = tuple(
            replace(
                p, name=f"{p.name}-{k}" if size > 1 else p.name, namespace=tenant, queue=tenant, gang=gang
            )
            for k in range(size)
        )
        jobs.append(Job(key, tenant, members, t, life))
    jobs.sort(key=lambda j: (j.arrival, j.key))
    return jobs


@dataclass
class TenantStats:
    waits: list[int] = field(default_factory=list)
    gpu_milli_s: int = 0
    fair_milli_s: int = 0
    reclaims_made: int = 0
    pods_reclaimed: int = 0
    idle_milli_s: int = 0
    violations: int = 0
    unfinished: int = 0

    def to_row(self, name: str) -> dict[str, object]:
        w = np.array(self.waits or [0])
        used, fair = self.gpu_milli_s / GPU_MILLI / 3600, self.fair_milli_s / GPU_MILLI / 3600
        return {
            "tenant": name,
            "pods_bound": len(self.waits),
            "pending_p50_s": int(np.percentile(w, 50)),
            "pending_p99_s": int(np.percentile(w, 99)),
            "gpu_hours": round(used, 1),
            "fair_gpu_hours": round(fair, 1),
            "of_fair_pct": round(100 * used / fair, 1) if fair else 0.0,
            "reclaims_made": self.reclaims_made,
            "pods_reclaimed": self.pods_reclaimed,
            "quota_violations": self.violations,
            "partial_gang_idle_gpu_hours": round(self.idle_milli_s / GPU_MILLI / 3600, 2),
            "still_pending": self.unfinished,
        }


@dataclass(frozen=True)
class TenantResult:
    mode: str
    rows: list[dict[str, object]]
    cycles: int
    horizon_s: int

    def to_dict(self) -> dict[str, object]:
        return {"mode": self.mode, "cycles": self.cycles, "horizon_s": self.horizon_s, "tenants": self.rows}


class TenantReplay:
    """One mode's replay of ``jobs`` on ``nodes``."""

    def __init__(self, nodes: Sequence[NodeSpec], jobs: Sequence[Job], cfg: TenantConfig, mode: str) -> None:
        if mode not in MODES:
            raise InvalidInput(f"mode {mode!r}: use one of {', '.join(MODES)}")
        self.mode, self.cfg, self.jobs = mode, cfg, list(jobs)
        self.snap = ClusterState(nodes)
        specs = [p for j in jobs for p in j.pods]
        ctx = PolicyContext(
            TargetWorkload.from_pods(specs or [PodSpec("w", 1, 1)]), np.random.default_rng(cfg.seed)
        )
        self.profile = make_profile(cfg.policy, ctx)
        self.ranks = np.random.default_rng(cfg.seed).permutation(len(self.snap))
        self.tree = cfg.tree(self.snap.total_gpu_milli)
        self.book = QueueBook(self.tree)  # enforced (queues) or a shadow that only counts (plain)
        self.stats = {t: TenantStats() for t in cfg.tenants}
        # pending jobs in arrival order (then key); a cycle at every instant something happened
        self.m = Machine(self._cycle)
        self.m.on(ARRIVE, self._arrive)
        self.m.on(REQUEUE, self._arrive)
        self.m.on(DEPART, self._depart)
        self.m.meter(self._account)
        self.running: dict[int, int] = {}  # job index -> epoch (a requeued job gets a new one)
        self.runs: list[tuple[int, int]] = []  # (job index, epoch) of each start: a departure's item
        self.bound_at: dict[int, dict[str, int]] = {}  # plain: pods bound so far, bind time
        self.epoch: dict[int, int] = {}
        self.cycles = 0
        self.last_t = 0
        self.done = 0
        self.on_progress: Callable[[int, int], None] | None = None

    @property
    def now(self) -> int:
        return self.m.now

    # ------------------------------------------------------------------ time
    def _account(self, now: int) -> None:
        dt = now - self.last_t
        if dt <= 0:
            return
        cap = self.snap.total_gpu_milli
        demand = dict.fromkeys(self.cfg.tenants, 0)
        used = dict.fromkeys(self.cfg.tenants, 0)
        for i in self.running:
            used[self.jobs[i].tenant] += self.jobs[i].milli
        for i in self.m.pending:
            demand[self.jobs[i].tenant] += self.jobs[i].milli
        for i, bound in self.bound_at.items():  # plain: partly bound gangs hold GPUs idle
            if i not in self.running and bound:
                j = self.jobs[i]
                held = sum(p.gpu_demand_milli for p in j.pods if p.key in bound)
                self.stats[j.tenant].idle_milli_s += held * dt
                used[j.tenant] += held
        guaranteed = {q: self.book.cap[q][k].subtree for q in self.cfg.tenants for k in self.book.cap[q]}
        weights = dict(zip(self.cfg.tenants, self.cfg.weights, strict=True))
        fair = water_fill(cap, {t: demand[t] + used[t] for t in demand}, guaranteed, weights)
        for t in self.cfg.tenants:
            self.stats[t].gpu_milli_s += used[t] * dt
            self.stats[t].fair_milli_s += fair[t] * dt
        self.last_t = now

    # ------------------------------------------------------------------ run
    def run(self, on_progress: Callable[[int, int], None] | None = None) -> TenantResult:
        self.on_progress = on_progress
        for i, j in enumerate(self.jobs):
            self.m.schedule(ARRIVE, j.arrival, i)
        self.m.run()
        for i in self.m.pending:
            self.stats[self.jobs[i].tenant].unfinished += len(self.jobs[i].pods)
        rows = [self.stats[t].to_row(t) for t in self.cfg.tenants]
        return TenantResult(self.mode, rows, self.cycles, self.last_t)

    def _arrive(self, i: int) -> None:
        """Job ``i`` arrives (or comes back, reclaimed): it waits for the instant's cycle."""
        self.epoch[i] = self.epoch.get(i, 0) + 1
        self.m.enqueue(i, (self.now, self.jobs[i].key, i))
        self.m.wake()

    def _depart(self, r: int) -> None:
        """Start ``r`` ends: its job finishes unless it was reclaimed (and restarted) since."""
        i, epoch = self.runs[r]
        if self.running.get(i) == epoch:
            self._finish(i)
            self.done += 1
            if self.on_progress:
                self.on_progress(self.done, len(self.jobs))
        self.m.wake()

    def _finish(self, i: int) -> None:
        del self.running[i]
        self.bound_at.pop(i, None)
        for p in self.jobs[i].pods:
            self.snap.forget(p.key)
            if p.key in self.book.charged:
                self.book.release(p.key)

    def _start(self, i: int, now: int) -> None:
        self.running[i] = self.epoch[i]
        self.runs.append((i, self.epoch[i]))
        self.m.schedule(DEPART, now + self.jobs[i].duration, len(self.runs) - 1)

    def _cycle(self) -> None:
        """The machine's retry: one scheduling cycle over the pending jobs."""
        now = self.now
        self.cycles += 1
        if self.mode == "queues":
            self._queues_cycle(now)
        else:
            self._plain_cycle(now)
        over = {v.split(":")[0].removeprefix("queue ") for v in self.book.violations()}
        for t in over & set(self.stats):
            self.stats[t].violations += 1

    def _queues_cycle(self, now: int) -> None:
        by_key = {self.jobs[i].key: i for i in self.m.pending}
        units = []
        for i in self.m.pending.order():
            j = self.jobs[i]
            g = GangSpec(j.pods[0].gang, j.tenant, len(j.pods)) if len(j.pods) > 1 else None
            units.append(Unit(j.key, j.pods, len(j.pods), g))
        owner = {p.key: i for i in self.running for p in self.jobs[i].pods}
        for out in run_cycle(
            self.profile,
            self.snap,
            units,
            book=self.book,
            tiebreak=self.ranks,
            evict_now=True,
            diagnose=False,
        ):
            if out.outcome is not Outcome.PLACED:
                continue
            i = by_key[out.unit.key]
            self.stats[self.jobs[i].tenant].waits.extend([now - self.m.pending.remove(i)] * len(out.placed))
            if out.victims:
                self.stats[self.jobs[i].tenant].reclaims_made += 1
                for v in sorted({owner[k] for k in out.victims if k in owner}):
                    self._requeue(v, now)
            for p in out.placed:
                owner[p.pod.key] = i
            self._start(i, now)

    def _requeue(self, i: int, now: int) -> None:
        """A reclaimed job: its pods are gone (``run_cycle`` evicted them); it starts over."""
        j = self.jobs[i]
        self.stats[j.tenant].pods_reclaimed += len(j.pods)
        del self.running[i]
        for p in j.pods:
            if p.key in self.snap.allocations:  # a gang member run_cycle did not name cannot be
                self.snap.forget(p.key)
                self.book.release(p.key)
        self.m.schedule(REQUEUE, now, i)

    def _plain_cycle(self, now: int) -> None:
        order = sorted(
            (
                (i, p)
                for i in self.m.pending
                for p in self.jobs[i].pods
                if p.key not in self.bound_at.get(i, {})
            ),
            key=lambda ip: (-ip[1].priority, self.m.pending.since(ip[0]), ip[1].key),
        )
        failed: set[tuple[object, ...]] = set()
        for i, p in order:
            if p.shape() in failed:
                continue
            (out,) = run_cycle(
                self.profile, self.snap, [Unit(p.key, (p,), 1)], tiebreak=self.ranks, diagnose=False
            )
            if out.outcome is not Outcome.PLACED:
                failed.add(p.shape())
                continue
            node = out.placed[0].node
            self.book.charge(p.key, p.queue, charge_of(p, self.snap.nodes[node].gpu_model))
            bound = self.bound_at.setdefault(i, {})
            bound[p.key] = now
            j = self.jobs[i]
            if len(bound) == len(j.pods):
                waits = [now - self.m.pending.remove(i)] * len(j.pods)  # the job starts with its last pod
                self.stats[j.tenant].waits.extend(waits)
                self._start(i, now)


def run_tenants(
    nodes: Sequence[NodeSpec],
    pods: Sequence[TracePod],
    cfg: TenantConfig,
    modes: Sequence[str] = MODES,
    on_progress: Callable[[str, int, int], None] | None = None,
) -> list[TenantResult]:
    """Replay the same tenants' jobs under each mode; one result per mode, in order."""
    if cfg.max_nodes:
        nodes = list(nodes)[: cfg.max_nodes]
    jobs = make_jobs(pods, cfg, sum(n.gpu_count for n in nodes) * GPU_MILLI)
    if not jobs:
        raise InvalidInput("the workload has no GPU pods to give the tenants")
    out = []
    for m in modes:
        cb = (lambda a, b, m=m: on_progress(m, a, b)) if on_progress else None
        out.append(TenantReplay(nodes, jobs, cfg, m).run(cb))
    return out
