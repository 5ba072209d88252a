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
``deleted`` time never departs. Time jumps from event to event (``engine.EventQueue``).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.sim.engine import EventQueue, Priority
from gpusched.sim.paper import tie_ranks
from gpusched.sim.traces import TracePod

_KICK = -1  # payload of the retry right after departures
_TICK = -2  # payload of the periodic retry

QueueKey = tuple[int, int, int]  # (-priority, created, pod index)


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


def _remove(queue: list[QueueKey], key: QueueKey) -> None:
    """Remove ``key`` from the sorted ``queue`` (the pending queue in retry order)."""
    i = bisect.bisect_left(queue, key)
    assert queue[i] == key, f"pod {key[2]} is not in the pending queue"
    del queue[i]


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


def _class_stats(
    specs: Sequence[PodSpec], waited: dict[int, int], outcome: dict[int, str]
) -> dict[str, dict[str, float]]:
    groups: dict[str, list[int]] = {}
    for i, sp in enumerate(specs):
        groups.setdefault(request_class(sp), []).append(i)
    rank = {c: k for k, c in enumerate(CLASS_ORDER)}
    out: dict[str, dict[str, float]] = {}
    for cls in sorted(groups, key=lambda c: (rank.get(c, len(rank)), c)):
        idx = groups[cls]
        w = [waited[i] for i in idx if i in waited]
        row: dict[str, float] = {"pods": len(idx), "scheduled": len(w)}
        for kind in ("expired", "timed_out", "never_scheduled"):
            row[kind] = sum(1 for i in idx if outcome.get(i) == kind)
        row.update(_waits(w))
        out[cls] = row
    return out


def _waits(values: list[int]) -> dict[str, float]:
    """p50/p90/p99/max of the pending times (numpy's linear percentile); zeros when empty."""
    arr = np.asarray(values or [0], dtype=np.float64)
    p50, p90, p99, mx = (float(v) for v in np.percentile(arr, [50, 90, 99, 100]))
    return {"pending_p50_s": p50, "pending_p90_s": p90, "pending_p99_s": p99, "pending_max_s": mx}


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
    after every arrival (a progress hook). ``audit`` checks the books after every event."""
    if retry_interval_s <= 0 or sample_every_s <= 0:
        raise InvalidInput("retry_interval_s and sample_every_s must be positive")
    if max_pending_s is not None and max_pending_s < 0:
        raise InvalidInput(f"max_pending_s must be non-negative, got {max_pending_s}")
    _validate(pods)
    t0 = clock() if clock else 0.0
    specs = [tp.spec for tp in pods]
    snap = ClusterState(nodes)
    tw = workload or TargetWorkload.from_pods(specs)
    profile = make_profile(policy, PolicyContext(workload=tw, rng=np.random.default_rng(seed)))
    ranks = tie_ranks(nodes, seed)
    shapes = [s.shape() for s in specs]
    created = [int(tp.created or 0) for tp in pods]
    keys: list[QueueKey] = [(-s.priority, created[i], i) for i, s in enumerate(specs)]
    running = [False] * len(pods)
    pending = [False] * len(pods)
    queue: list[QueueKey] = []  # sorted: the retry order
    eng: EventQueue[int] = EventQueue()
    for i in range(len(pods)):  # equal times pop in push order: input order
        eng.push(created[i], Priority.ARRIVAL, i)
    start = min(created, default=0)
    now, end, arrived = start, start, 0
    alloc = 0  # GPU milli held by running pods
    integral = 0  # GPU milli x seconds
    integral_arrivals, last_arrival = 0, start  # the same up to the last arrival
    peak = 0
    waited: dict[int, int] = {}  # pod index -> seconds pending before it was placed
    outcome: dict[int, str] = {}  # pod index -> expired / timed_out / never_scheduled
    expired = timed_out = 0
    dirty = False  # resources freed since the last retry pass
    tick_armed = False
    kick_pending = False  # a retry right after departures is already in the heap
    samples: list[tuple[int, float, int]] = []
    next_sample = start
    cap = snap.total_gpu_milli

    def pct() -> float:
        return 100.0 * alloc / cap if cap else 0.0

    def try_place(i: int) -> bool:
        nonlocal alloc, peak
        r = schedule_one(profile, specs[i], snap, tiebreak=ranks, diagnose_failures=False)
        if r.scheduled:
            running[i] = True
            alloc += specs[i].gpu_demand_milli
            peak = max(peak, alloc)
            waited[i] = now - created[i]
        return r.scheduled

    def unqueue(i: int) -> None:
        _remove(queue, keys[i])
        pending[i] = False

    def retry_pass() -> None:
        failed: set[tuple[object, ...]] = set()
        for key in list(queue):
            i = key[2]
            if shapes[i] in failed:
                continue
            if try_place(i):
                unqueue(i)
            else:
                failed.add(shapes[i])

    while eng:
        ev = eng.peek()
        assert ev is not None
        if ev.priority == Priority.RETRY and ev.payload == _TICK and len(eng) == 1:
            break  # only this tick is left: nothing can change any more
        while next_sample < ev.time:
            samples.append((next_sample, pct(), len(queue)))
            next_sample += sample_every_s
        eng.pop()
        integral += alloc * (ev.time - now)
        now, i = ev.time, ev.payload
        if ev.priority == Priority.ARRIVAL:
            end = last_arrival = now
            integral_arrivals = integral
            arrived += 1
            dl = pods[i].deleted
            if dl is not None:
                eng.push(dl, Priority.DEPARTURE, i)
            if not try_place(i):
                pending[i] = True
                bisect.insort(queue, keys[i])
                if max_pending_s is not None:
                    eng.push(created[i] + max_pending_s, Priority.TIMEOUT, i)
                if not tick_armed:
                    eng.push(now + retry_interval_s, Priority.RETRY, _TICK)
                    tick_armed = True
            if on_event is not None:
                on_event(arrived, len(pods))
        elif ev.priority == Priority.DEPARTURE:
            end = now
            if running[i]:
                snap.forget(specs[i].key)
                running[i] = False
                alloc -= specs[i].gpu_demand_milli
                dirty = True
                if queue and not kick_pending:
                    eng.push(now, Priority.RETRY, _KICK)
                    kick_pending = True
            elif pending[i]:
                unqueue(i)
                expired += 1
                outcome[i] = "expired"
        elif ev.priority == Priority.TIMEOUT:
            if pending[i]:
                end = now
                unqueue(i)
                timed_out += 1
                outcome[i] = "timed_out"
        else:  # RETRY
            if dirty and queue:
                retry_pass()
            dirty = False
            if i == _KICK:
                kick_pending = False
            else:
                tick_armed = bool(queue)
                if tick_armed:
                    eng.push(now + retry_interval_s, Priority.RETRY, _TICK)
        if audit and ((errs := snap.verify()) or alloc != snap.allocated_gpu_milli()):
            raise AssertionError(f"accounting broken at t={now}: {errs or 'alloc drift'}")
    integral -= alloc * (now - end)  # time past the last arrival/departure/timeout does not count
    while next_sample <= end:
        samples.append((next_sample, pct(), len(queue)))
        next_sample += sample_every_s
    if errs := snap.verify():
        raise AssertionError(f"accounting broken after replay: {errs}")
    horizon = end - start
    for key in queue:
        outcome[key[2]] = "never_scheduled"
    return ReplayResult(
        policy=policy,
        seed=seed,
        pods=len(pods),
        scheduled=len(waited),
        expired=expired,
        timed_out=timed_out,
        never_scheduled=len(queue),
        **_waits(list(waited.values())),
        mean_alloc_pct=100.0 * integral / (cap * horizon) if cap and horizon else 0.0,
        busy_alloc_pct=(
            100.0 * integral_arrivals / (cap * (last_arrival - start))
            if cap and last_arrival > start
            else 0.0
        ),
        peak_alloc_pct=100.0 * peak / cap if cap else 0.0,
        horizon_s=horizon,
        samples=samples,
        by_class=_class_stats(specs, waited, outcome),
        seconds=(clock() - t0) if clock else 0.0,
    )
