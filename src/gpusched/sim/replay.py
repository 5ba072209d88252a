"""Protocol 2, "replay": the trace replayed in time, with departures and a pending queue.

Each pod arrives at ``created`` and tries one scheduling cycle at once. A pod that fits
nowhere waits in a pending queue ordered by priority (highest first), then arrival (FIFO),
like kube-scheduler's activeQ. The queue is retried in order right after every departure
(at the departure's time, once for all departures of that second) and every
``retry_interval_s`` while it is non-empty. In a pass, once a pod of some shape fails, the
other pods of that shape are skipped: resources only shrink during a pass, so they would
fail too. A periodic retry with nothing freed since the last pass is skipped as well: every
queued pod failed against a state with at least as much free room, so the pass would be a
no-op (feasibility does not depend on any random state).

A running pod is forgotten at ``deleted``; a pod still pending then leaves the queue as
*expired*. With ``max_pending_s`` a pod still pending that long after ``created`` is dropped
as *timed out* (a pod scheduled exactly at the limit counts as scheduled). A pod without a
``deleted`` time never departs. Time jumps from event to event (``sim.machine.Machine``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.pending import pending_order
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.protocol import tie_ranks
from gpusched.core.scheduler import schedule_one
from gpusched.sim.machine import ARRIVE, DEPART, TIME_OUT, Machine, retry_pass
from gpusched.sim.traces import TracePod

QueueKey = tuple[int, int, int]  # core.pending.pending_order(priority, created, pod index)


@dataclass
class ReplayResult:
    policy: str
    seed: int
    pods: int
    scheduled: int
    expired: int
    timed_out: int
    never_scheduled: int
    pending_p50_s: float
    pending_p90_s: float
    pending_p99_s: float
    pending_max_s: float
    mean_alloc_pct: float
    """GPU milli allocated, time-weighted from the first arrival to the last event, % of capacity.
    Long-lived pods stretch this horizon far past the arrivals (one pod of the Alibaba trace lives
    145 days), so ``busy_alloc_pct`` is the figure to compare policies by."""
    busy_alloc_pct: float = 0.0
    """The same, over the arrival window only (first to last arrival): while load is offered."""
    peak_alloc_pct: float = 0.0
    horizon_s: int = 0
    samples: list[tuple[int, float, int]] = field(default_factory=list)
    """(time_s, gpu_alloc_pct, pending_count) every ``sample_every_s`` from the first arrival."""
    by_class: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per request size (``request_class``): pods, scheduled, expired, timed_out, never_scheduled
    and pending p50/p90/p99/max of the scheduled ones. Shows whether big pods starve."""
    seconds: float = 0.0

    def to_dict(self) -> dict[str, object]:
        """Plain Python values only (JSON-ready); samples become lists."""
        d = asdict(self)
        d["samples"] = [[int(t), float(a), int(n)] for t, a, n in self.samples]
        return d


def _validate(pods: Sequence[TracePod]) -> None:
    seen: set[str] = set()
    for tp in pods:
        key = tp.spec.key
        if tp.created is None:
            raise InvalidInput(f"pod {key} has no creation time; a replay needs one for every pod")
        if tp.deleted is not None and tp.deleted < tp.created:
            raise InvalidInput(f"pod {key}: deletion time {tp.deleted} is before creation time {tp.created}")
        if key in seen:
            raise InvalidInput(f"pod {key} appears twice")
        seen.add(key)


CLASS_ORDER = ("cpu only", "share", "1 GPU", "2 GPUs", "4 GPUs", "8 GPUs")


def request_class(spec: PodSpec) -> str:
    """A pod's size class for the pending-time breakdown: CPU only, a GPU share, or N GPUs."""
    if spec.num_gpu == 0:
        return "cpu only"
    if spec.is_share:
        return "share"
    return "1 GPU" if spec.num_gpu == 1 else f"{spec.num_gpu} GPUs"


def by_class(specs: Sequence[PodSpec], indices: Iterable[int]) -> dict[str, list[int]]:
    """``indices`` grouped by their pod's request class (``request_class``), in ``CLASS_ORDER``."""
    groups: dict[str, list[int]] = {}
    for i in indices:
        groups.setdefault(request_class(specs[i]), []).append(i)
    rank = {c: k for k, c in enumerate(CLASS_ORDER)}
    return {c: groups[c] for c in sorted(groups, key=lambda c: (rank.get(c, len(rank)), c))}


def percentiles(values: Sequence[int]) -> tuple[float, float, float, float]:
    """p50, p90, p99 and max of ``values`` (numpy's linear percentile); zeros when empty."""
    arr = np.asarray(values or [0], dtype=np.float64)
    p50, p90, p99, mx = (float(v) for v in np.percentile(arr, [50, 90, 99, 100]))
    return p50, p90, p99, mx


def _class_stats(
    specs: Sequence[PodSpec], waited: dict[int, int], outcome: dict[int, str]
) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for cls, idx in by_class(specs, range(len(specs))).items():
        w = [waited[i] for i in idx if i in waited]
        row: dict[str, float] = {"pods": len(idx), "scheduled": len(w)}
        for kind in ("expired", "timed_out", "never_scheduled"):
            row[kind] = sum(1 for i in idx if outcome.get(i) == kind)
        row.update(_waits(w))
        out[cls] = row
    return out


def _waits(values: list[int]) -> dict[str, float]:
    names = ("pending_p50_s", "pending_p90_s", "pending_p99_s", "pending_max_s")
    return dict(zip(names, percentiles(values), strict=True))


class Replay:
    """One replay of a trace under one policy on a ``Machine``: the books and the tallies, with one
    handler per event kind: ``arrive``, ``depart`` and ``time_out`` (the machine's kick and tick
    run ``retry_pass``). ``run`` pops events until nothing can change any more."""

    def __init__(
        self,
        nodes: Sequence[NodeSpec],
        pods: Sequence[TracePod],
        policy: str,
        *,
        seed: int = 0,
        retry_interval_s: int = 60,
        max_pending_s: int | None = None,
        workload: TargetWorkload | None = None,
        on_event: Callable[[int, int], None] | None = None,
        sample_every_s: int = 3600,
    ) -> None:
        if retry_interval_s <= 0 or sample_every_s <= 0:
            raise InvalidInput("retry_interval_s and sample_every_s must be positive")
        if max_pending_s is not None and max_pending_s < 0:
            raise InvalidInput(f"max_pending_s must be non-negative, got {max_pending_s}")
        _validate(pods)
        self.policy, self.seed, self.pods = policy, seed, pods
        self.max_pending_s = max_pending_s
        self.sample_every_s, self.on_event = sample_every_s, on_event
        self.specs = [tp.spec for tp in pods]
        self.snap = ClusterState(nodes)
        tw = workload or TargetWorkload.from_pods(self.specs)
        self.profile = make_profile(policy, PolicyContext(workload=tw, rng=np.random.default_rng(seed)))
        self.ranks = tie_ranks(nodes, seed)
        self.shapes = [s.shape() for s in self.specs]
        self.created = [int(tp.created or 0) for tp in pods]
        self.keys: list[QueueKey] = [
            pending_order(s.priority, self.created[i], i) for i, s in enumerate(self.specs)
        ]
        self.running = [False] * len(pods)
        self.start = min(self.created, default=0)
        self.m = Machine(self._retry_pass, retry_interval_s=retry_interval_s, start=self.start)
        self.m.on(ARRIVE, self.arrive)
        self.m.on(DEPART, self.depart)
        self.m.on(TIME_OUT, self.time_out)
        self.m.meter(self._advance)
        for i in range(len(pods)):  # equal times pop in push order: input order
            self.m.schedule(ARRIVE, self.created[i], i)
        self.end = self.last_arrival = self.start
        self.arrived = 0
        self.alloc = 0  # GPU milli held by running pods
        self.integral = 0  # GPU milli x seconds
        self.integral_arrivals = 0  # the same up to the last arrival
        self.peak = 0
        self.waited: dict[int, int] = {}  # pod index -> seconds pending before it was placed
        self.outcome: dict[int, str] = {}  # pod index -> expired / timed_out / never_scheduled
        self.expired = self.timed_out = 0
        self.samples: list[tuple[int, float, int]] = []
        self.next_sample = self.start
        self.cap = self.snap.total_gpu_milli

    @property
    def now(self) -> int:
        return self.m.now

    # ------------------------------------------------------------------- the run
    def run(self, audit: bool = False) -> ReplayResult:
        """Pop events until only the periodic retry is left. ``audit`` checks the books after
        every event."""
        self.m.run(after_event=self._audit if audit else None)
        # time past the last arrival/departure/timeout does not count
        self.integral -= self.alloc * (self.now - self.end)
        self._sample_until(self.end, inclusive=True)
        if errs := self.snap.verify():
            raise AssertionError(f"accounting broken after replay: {errs}")
        return self._result()

    def _audit(self) -> None:
        if (errs := self.snap.verify()) or self.alloc != self.snap.allocated_gpu_milli():
            raise AssertionError(f"accounting broken at t={self.now}: {errs or 'alloc drift'}")

    def _advance(self, t: int) -> None:
        """The meter: samples before ``t``, and the allocation integrated up to it."""
        self._sample_until(t, inclusive=False)
        self.integral += self.alloc * (t - self.now)

    def _sample_until(self, t: int, inclusive: bool) -> None:
        while self.next_sample < t or (inclusive and self.next_sample == t):
            self.samples.append((self.next_sample, self._pct(), len(self.m.pending)))
            self.next_sample += self.sample_every_s

    def _pct(self) -> float:
        return 100.0 * self.alloc / self.cap if self.cap else 0.0

    # ---------------------------------------------------------------- handlers
    def arrive(self, i: int) -> None:
        """Pod ``i`` is created: its departure is booked; it is placed, or queued (with its
        timeout, and the periodic retry armed)."""
        self.end = self.last_arrival = self.now
        self.integral_arrivals = self.integral
        self.arrived += 1
        dl = self.pods[i].deleted
        if dl is not None:
            self.m.schedule(DEPART, dl, i)
        if not self._try_place(i):
            give_up = None if self.max_pending_s is None else self.created[i] + self.max_pending_s
            self.m.enqueue(i, self.keys[i], give_up)
        if self.on_event is not None:
            self.on_event(self.arrived, len(self.pods))

    def depart(self, i: int) -> None:
        """Pod ``i`` is deleted: a running pod frees its room (and a retry follows at once); a
        pending one leaves the queue as expired."""
        self.end = self.now
        if self.running[i]:
            self.snap.forget(self.specs[i].key)
            self.running[i] = False
            self.alloc -= self.specs[i].gpu_demand_milli
            self.m.wake()
        elif i in self.m.pending:
            self.m.pending.remove(i)
            self.expired += 1
            self.outcome[i] = "expired"

    def time_out(self, i: int) -> None:
        """Pod ``i`` has waited ``max_pending_s``: dropped if still pending."""
        if i in self.m.pending:
            self.end = self.now
            self.m.pending.remove(i)
            self.timed_out += 1
            self.outcome[i] = "timed_out"

    # ----------------------------------------------------------------- helpers
    def _try_place(self, i: int) -> bool:
        r = schedule_one(self.profile, self.specs[i], self.snap, tiebreak=self.ranks, diagnose_failures=False)
        if r.scheduled:
            self.running[i] = True
            self.alloc += self.specs[i].gpu_demand_milli
            self.peak = max(self.peak, self.alloc)
            self.waited[i] = self.now - self.created[i]
        return r.scheduled

    def _retry_pass(self) -> None:
        retry_pass(self.m.pending.order(), self.shapes, self._try_place, self.m.pending.remove)

    def _result(self) -> ReplayResult:
        cap, start = self.cap, self.start
        horizon = self.end - start
        for i in self.m.pending:
            self.outcome[i] = "never_scheduled"
        return ReplayResult(
            policy=self.policy,
            seed=self.seed,
            pods=len(self.pods),
            scheduled=len(self.waited),
            expired=self.expired,
            timed_out=self.timed_out,
            never_scheduled=len(self.m.pending),
            **_waits(list(self.waited.values())),
            mean_alloc_pct=100.0 * self.integral / (cap * horizon) if cap and horizon else 0.0,
            busy_alloc_pct=(
                100.0 * self.integral_arrivals / (cap * (self.last_arrival - start))
                if cap and self.last_arrival > start
                else 0.0
            ),
            peak_alloc_pct=100.0 * self.peak / cap if cap else 0.0,
            horizon_s=horizon,
            samples=self.samples,
            by_class=_class_stats(self.specs, self.waited, self.outcome),
        )


def run_replay(
    nodes: Sequence[NodeSpec],
    pods: Sequence[TracePod],
    policy: str,
    *,
    seed: int = 0,
    retry_interval_s: int = 60,
    max_pending_s: int | None = None,
    workload: TargetWorkload | None = None,
    on_event: Callable[[int, int], None] | None = None,
    sample_every_s: int = 3600,
    clock: Callable[[], float] | None = None,
    audit: bool = False,
) -> ReplayResult:
    """Replay ``pods`` on ``nodes`` under ``policy``. ``on_event(arrived, total)`` is called
    after every arrival (a progress hook). ``audit`` checks the books after every event;
    ``clock`` (if given) times the run into ``seconds``."""
    t0 = clock() if clock else 0.0
    replay = Replay(
        nodes,
        pods,
        policy,
        seed=seed,
        retry_interval_s=retry_interval_s,
        max_pending_s=max_pending_s,
        workload=workload,
        on_event=on_event,
        sample_every_s=sample_every_s,
    )
    result = replay.run(audit)
    result.seconds = (clock() - t0) if clock else 0.0
    return result
