"""MIG placement under churn: arrivals, departures and a queue, for the pending time (``bench mig``).

Requests arrive as a Poisson process whose rate makes the offered load ``load`` x the cluster's memory
slices (mean size x mean lifetime x rate / slices) and live an exponential time (mean ``life_s``). A request
that does not fit waits in a queue; after every departure the oldest waiting request of each profile is
retried, and the retries go on while they land. A request waits behind an older one of its own profile (FIFO
per profile). Pending time is placement time minus arrival; a request still waiting at the end counts with
its wait so far (so the p99 is a lower bound when the queue never drains). The first ``warmup`` of the
arrivals are not counted.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from dataclasses import asdict, dataclass

import numpy as np

from gpusched.core.errors import InvalidInput
from gpusched.core.mig.measure import DemandMix
from gpusched.core.mig.placement import MigPolicy
from gpusched.sim.mig import STATIC, MigCluster, MigWorkload, StaticBalanced
from gpusched.sim.mig_reshape import RESHAPE, ReshapingBooks


@dataclass(frozen=True)
class ChurnRun:
    workload: str
    policy: str
    seed: int
    load: float
    requests: int  # counted (after warm-up)
    placed_now_pct: float  # placed on arrival, without waiting
    pending_p99_s: float
    pending_mean_s: float
    still_pending: int  # at the end
    placed_after_waiting: int  # counted requests that waited, then landed
    used_slices_pct: float  # time average
    gpus_used_pct: float  # time average
    reshapes: int  # re-cuts of idle GPUs over the whole run (gpusched-reshape only)
    reshapes_per_hour: float
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class _Books:
    """Either a dynamic fleet (a core policy) or the static all-balanced cut, behind one interface."""

    def __init__(self, cluster: MigCluster, policy: str) -> None:
        self.reshaping = ReshapingBooks(cluster) if policy == RESHAPE else None
        self.static = StaticBalanced(cluster) if policy == STATIC else None
        dynamic = policy not in (STATIC, RESHAPE)
        self.fleet = cluster.fleet() if dynamic else None
        self.policy = MigPolicy(policy) if dynamic else None
        self.demand = DemandMix()

    def place(self, profile: str) -> tuple[int, int] | None:
        if self.reshaping is not None:
            return self.reshaping.take(profile, self.demand)
        if self.static is not None:
            gpu = self.static.take(profile)
            return None if gpu < 0 else (gpu, -1)
        assert self.fleet is not None and self.policy is not None
        pl = self.fleet.choose(profile, self.policy, self.demand)
        if pl is None:
            return None
        self.fleet.place(pl.gpu, profile, pl.start)
        return pl.gpu, pl.start

    def release(self, profile: str, where: tuple[int, int]) -> None:
        if self.reshaping is not None:
            self.reshaping.release(profile, *where)
        elif self.static is not None:
            self.static.release(where[0], profile)
        else:
            assert self.fleet is not None
            self.fleet.remove(where[0], profile, where[1])

    @property
    def reshapes(self) -> int:
        return 0 if self.reshaping is None else self.reshaping.reshapes

    def usage(self) -> tuple[int, int]:
        if self.reshaping is not None:
            return self.reshaping.used_slices, self.reshaping.gpus_used
        if self.static is not None:
            return self.static.used_slices, self.static.gpus_used
        assert self.fleet is not None
        return self.fleet.used_slices, self.fleet.gpus_used


def churn_run(
    cluster: MigCluster,
    workload: MigWorkload,
    policy: str,
    seed: int,
    load: float = 0.9,
    arrivals: int = 6000,
    life_s: float = 3600.0,
    warmup: float = 0.2,
) -> ChurnRun:
    if load <= 0 or arrivals <= 0 or life_s <= 0 or not 0 <= warmup < 1:
        raise InvalidInput(
            f"churn needs load, arrivals and lifetime > 0 and 0 <= warmup < 1; got load {load}, "
            f"arrivals {arrivals}, lifetime {life_s}, warmup {warmup}"
        )
    geom = cluster.gpus[0].geometry
    size = {p: geom.kind(p).mem_slices for p in set(workload.pool)}
    rng = np.random.default_rng(seed)
    p = None if workload.weights is None else np.array(workload.weights) / sum(workload.weights)
    picks = [workload.pool[i] for i in rng.choice(len(workload.pool), size=arrivals, p=p)]
    mean_size = float(np.mean([size[x] for x in picks]))
    rate = load * cluster.slices / (mean_size * life_s)
    times = np.cumsum(rng.exponential(1 / rate, size=arrivals))
    lives = rng.exponential(life_s, size=arrivals)
    t0 = time.perf_counter()
    books = _Books(cluster, policy)
    waiting: dict[str, deque[int]] = {}
    placed_at = np.full(arrivals, np.nan)
    departures: list[tuple[float, int, tuple[int, int]]] = []
    now = area_used = area_gpus = 0.0
    counted_from = times[int(warmup * arrivals)]

    def advance(t: float) -> None:
        nonlocal now, area_used, area_gpus
        if t > counted_from:
            used, gpus = books.usage()
            span = t - max(now, counted_from)
            area_used += used * span
            area_gpus += gpus * span
        now = t

    def start(i: int, t: float) -> bool:
        where = books.place(picks[i])
        if where is None:
            return False
        placed_at[i] = t
        heapq.heappush(departures, (t + lives[i], i, where))
        return True

    for i, t in enumerate(times):
        while departures and departures[0][0] <= t:
            dt, j, where = heapq.heappop(departures)
            advance(dt)
            books.release(picks[j], where)
            for prof in sorted(waiting, key=lambda q: waiting[q][0]):
                q = waiting[prof]
                while q and start(q[0], dt):
                    q.popleft()
            waiting = {k: v for k, v in waiting.items() if v}
        advance(t)
        books.demand.add(picks[i])
        if picks[i] in waiting or not start(i, t):
            waiting.setdefault(picks[i], deque()).append(i)
    end = float(times[-1])
    advance(end)
    first = int(warmup * arrivals)
    waits = np.where(np.isnan(placed_at), end, placed_at)[first:] - times[first:]
    span = float(end - counted_from)
    return ChurnRun(
        workload.name, policy, seed, load, arrivals - first,
        round(100 * float(np.mean(placed_at[first:] == times[first:])), 2),
        round(float(np.percentile(waits, 99)), 1),
        round(float(waits.mean()), 1), int(np.isnan(placed_at).sum()),
        int(np.sum(placed_at[first:] > times[first:])),
        round(100 * float(area_used) / (span * cluster.slices), 2) if span > 0 else 0.0,
        round(100 * float(area_gpus) / (span * len(cluster.gpus)), 2) if span > 0 else 0.0,
        books.reshapes,
        round(3600 * books.reshapes / float(end - times[0]), 2) if end > times[0] else 0.0,
        round(time.perf_counter() - t0, 2),
    )  # fmt: skip


def churn_rows(runs: list[ChurnRun]) -> list[dict[str, object]]:
    """One row per (workload, policy): means over the seeds, the per-seed pending p99."""
    rows: list[dict[str, object]] = []
    for wl, pol in dict.fromkeys((r.workload, r.policy) for r in runs):
        rs = [r for r in runs if (r.workload, r.policy) == (wl, pol)]
        rows.append(
            {
                "workload": wl,
                "policy": pol,
                "seeds": [r.seed for r in rs],
                "load": rs[0].load,
                "placed_on_arrival_pct": round(float(np.mean([r.placed_now_pct for r in rs])), 2),
                "pending_mean_s": round(float(np.mean([r.pending_mean_s for r in rs])), 1),
                "pending_p99_s": round(float(np.mean([r.pending_p99_s for r in rs])), 1),
                "pending_p99_s_per_seed": [r.pending_p99_s for r in rs],
                "still_pending": int(sum(r.still_pending for r in rs)),
                "used_slices_pct": round(float(np.mean([r.used_slices_pct for r in rs])), 2),
                "gpus_used_pct": round(float(np.mean([r.gpus_used_pct for r in rs])), 2),
                "reshapes_per_hour": round(float(np.mean([r.reshapes_per_hour for r in rs])), 2),
            }
        )
    return rows
