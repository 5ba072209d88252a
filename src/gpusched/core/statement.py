"""Statement: tentative changes to a snapshot, kept or undone as one (after Volcano's Statement).

Multi-pod decisions — a gang that must land all-or-nothing, a preemption that evicts victims
and then places the preemptor, an extender asking "would the pod fit if these pods left?" —
are a sequence of ``assume`` and ``evict`` operations that must either all stay or all go.
A ``Statement`` records each operation as it is applied to the snapshot (so later decisions
in the same statement see the earlier ones) and then either

- ``commit()``: keeps them and returns the operations, in order, for the front end to carry
  out (bind the assumed pods, delete the evicted ones); or
- ``discard()``: undoes them in reverse order, restoring every free amount, allocation and
  per-node pod set exactly (generation counters move forward, so score caches recompute), and
  unreserving what the Reserve plugins took for the pods it scheduled (``scheduler.undo``: a
  gang's DRA devices go back to the front end's ledger).

Used as a context manager a statement that is neither committed nor discarded when the block
ends is discarded, so an exception half-way through a gang never leaves half a gang booked.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType

from gpusched.core.cluster import I64, AccountingError, ClusterState
from gpusched.core.devices import fitting_gpus, pick_gpus
from gpusched.core.framework import Profile
from gpusched.core.mig.books import MigSlot
from gpusched.core.model import Allocation, PodSpec
from gpusched.core.scheduler import ScheduleResult, schedule_one, undo
from gpusched.core.status import Code, Status


class OpKind(enum.Enum):
    ASSUME = "assume"
    EVICT = "evict"


@dataclass(frozen=True, slots=True)
class Operation:
    kind: OpKind
    allocation: Allocation
    scheduled: ScheduleResult | None = None
    """An ASSUME made by ``Statement.schedule``: its cycle's result (what Reserve took)."""


class StatementClosed(RuntimeError):
    """An operation on a statement that was already committed or discarded."""


class Statement:
    def __init__(self, snap: ClusterState) -> None:
        self.snap = snap
        self._ops: list[Operation] = []
        self._open = True

    # --------------------------------------------------------------- operations
    def assume(
        self,
        pod: PodSpec,
        node: int,
        gpus: Sequence[int],
        *,
        check: bool = True,
        mig: Sequence[MigSlot] | None = None,
    ) -> Allocation:
        """Book ``pod`` on ``node``/``gpus`` within the statement (AccountingError if it does not fit;
        ``check=False``: booked even beyond what is free, as ``ClusterState.assume`` says; ``mig``: its
        MIG slices, None places them by the measure)."""
        self._check_open()
        alloc = self.snap.assume(pod, node, gpus, check=check, mig=mig)
        self._ops.append(Operation(OpKind.ASSUME, alloc))
        return alloc

    def evict(self, pod_key: str) -> Allocation:
        """Release what ``pod_key`` holds within the statement (a preemption victim)."""
        self._check_open()
        alloc = self.snap.forget(pod_key)
        self._ops.append(Operation(OpKind.EVICT, alloc))
        return alloc

    def schedule(
        self,
        profile: Profile,
        pod: PodSpec,
        *,
        tiebreak: I64 | None = None,
        diagnose_failures: bool = False,
        leaving: frozenset[str] = frozenset(),
        nodes: I64 | None = None,
    ) -> ScheduleResult:
        """One ``schedule_one`` cycle (among ``nodes``, default every node) whose booking belongs to
        this statement."""
        self._check_open()
        r = schedule_one(
            profile,
            pod,
            self.snap,
            tiebreak=tiebreak,
            diagnose_failures=diagnose_failures,
            nodes=nodes,
            leaving=leaving,
        )
        if r.scheduled:  # schedule_one assumed it
            self._ops.append(Operation(OpKind.ASSUME, self.snap.allocations[pod.key], r))
        return r

    # --------------------------------------------------------------- outcome
    @property
    def operations(self) -> tuple[Operation, ...]:
        return tuple(self._ops)

    @property
    def open(self) -> bool:
        return self._open

    def commit(self) -> tuple[Operation, ...]:
        """Keep every operation; return them in the order they were applied."""
        self._check_open()
        self._open = False
        return tuple(self._ops)

    def discard(self) -> None:
        """Undo every operation, newest first. The snapshot's books end exactly as they began."""
        self._check_open()
        self._open = False
        for op in reversed(self._ops):
            a = op.allocation
            if op.scheduled is not None:
                undo(self.snap, op.scheduled)
            elif op.kind is OpKind.ASSUME:
                self.snap.forget(a.pod.key)
            else:  # what it held: a fact, restored as it was (a held room may overbook its GPUs)
                self.snap.assume(a.pod, a.node, a.gpus, check=False, mig=a.mig)
        self._ops.clear()

    def _check_open(self) -> None:
        if not self._open:
            raise StatementClosed("statement already committed or discarded")

    def __enter__(self) -> Statement:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._open:
            self.discard()


@dataclass(frozen=True, slots=True)
class GroupResult:
    """The outcome of scheduling pods all-or-nothing."""

    status: Status
    results: tuple[ScheduleResult, ...]
    """One per pod tried, in order; on failure the last one is the pod that did not fit."""

    @property
    def scheduled(self) -> bool:
        return self.status.ok

    @property
    def placed(self) -> tuple[ScheduleResult, ...]:
        """The pods that stay assumed (none on failure)."""
        return tuple(r for r in self.results if r.scheduled) if self.status.ok else ()

    @property
    def left_out(self) -> tuple[str, ...]:
        """Keys of the pods tried that did not fit though the group was placed (beyond
        ``min_count``); they stay pending."""
        return tuple(r.pod.key for r in self.results if not r.scheduled) if self.status.ok else ()


def schedule_all(
    profile: Profile,
    pods: Sequence[PodSpec],
    snap: ClusterState,
    *,
    tiebreak: I64 | None = None,
    min_count: int | None = None,
    diagnose_failures: bool = True,
    leaving: frozenset[str] = frozenset(),
    nodes: I64 | None = None,
) -> GroupResult:
    """Place every pod of ``pods`` or none of them (gang semantics).

    Pods are placed one after another, each seeing the ones before it. If one does not fit,
    everything placed so far is undone and the status names that pod and why; ``snap`` is
    then exactly as it was. On success every pod stays assumed in ``snap``.

    With ``min_count`` (a gang's minimum member count, 0..len(pods)) a pod that does not fit is
    left out and the rest are tried, as long as ``min_count`` can still be reached; the group is
    placed when at least ``min_count`` fit at once (``GroupResult.left_out`` names the others),
    and otherwise nothing stays booked. The profile's PostFilters (preemption) run for pods that
    do not fit as in ``schedule_one``; gangs pass a profile without them. Without
    ``diagnose_failures`` the reason says less (no per-node reasons) and costs less. ``nodes``:
    only these snapshot indices are candidates (default every node).
    """
    keys = [p.key for p in pods]
    if len(set(keys)) != len(keys):
        dup = next(k for k in keys if keys.count(k) > 1)
        raise AccountingError(f"pod {dup} appears twice in one group")
    need = len(pods) if min_count is None else min_count
    if not 0 <= need <= len(pods):
        raise AccountingError(f"min_count {min_count} outside 0..{len(pods)} for a group of {len(pods)}")
    results: list[ScheduleResult] = []
    placed = 0
    with Statement(snap) as st:
        for i, pod in enumerate(pods):
            r = st.schedule(
                profile,
                pod,
                tiebreak=tiebreak,
                diagnose_failures=diagnose_failures,
                nodes=nodes,
                leaving=leaving,
            )
            results.append(r)
            if r.scheduled:
                placed += 1
                continue
            if placed + (len(pods) - i - 1) >= need:
                continue  # left out: the minimum can still be reached without it
            why = r.diagnosis.message() if r.diagnosis else r.status.message()
            code = r.status.code if r.status.code != Code.SUCCESS else Code.UNSCHEDULABLE
            if min_count is None:
                msg = f"pod {pod.key} ({len(results)} of {len(pods)}) does not fit: {why}"
            else:
                msg = (
                    f"{placed} of at least {need} pods fit at once (of {len(pods)}); "
                    f"pod {pod.key} does not fit: {why}"
                )
            return GroupResult(Status(code, (msg,), "Statement"), tuple(results))
        st.commit()
    return GroupResult(Status.success(), tuple(results))


@contextmanager
def holding(
    snap: ClusterState,
    nominated: Sequence[tuple[PodSpec, int]],
    priority: int,
    *,
    skip: Collection[str] = (),
    leaving: Collection[str] = (),
) -> Iterator[int]:
    """The one rule for nominated pods' rooms (every unit ``core.batch.run_cycle`` decides, through
    the front end's ``Hold``; preemption's what-ifs): within the block
    each nominated pod (pod, node index) of at least ``priority``, not in ``skip`` and not booked
    yet, is booked on its node *whether it fits there yet or not*, as kube-scheduler adds nominated
    pods to a node when it filters pods of lower priority (``RunFilterPluginsWithNominatedPods``).

    A preemptor's room is free only once its victims are gone: booked unchecked (free amounts
    may go below zero) on ``room_gpus``, each GPU a victim frees is held for it the moment it is
    free, and the victims' replacements cannot take it; a what-if that evicts lower-priority pods
    sees the room taken. Higher priorities are booked first. Yields how many rooms are held;
    afterwards ``snap`` is exactly as it was. ``leaving``: keys of pods known to be leaving (the
    victims, terminating pods), whose GPUs a room takes before others'."""
    held_n = 0
    with Statement(snap) as held:
        for other, node in sorted(nominated, key=lambda pn: -pn[0].priority):
            if other.priority < priority or other.key in skip or other.key in snap.allocations:
                continue
            if not 0 <= node < len(snap):
                continue
            held.assume(other, node, room_gpus(snap, other, node, leaving), check=False)
            held_n += 1
        yield held_n


def room_gpus(snap: ClusterState, pod: PodSpec, node: int, leaving: Collection[str] = ()) -> tuple[int, ...]:
    """The GPUs of ``node`` that nominated ``pod``'s room is: where it fits now, the GPUs
    ``pick_gpus`` gives it; otherwise the GPUs it fits on now first, then those only ``leaving``
    pods of lower priority hold (its victims on their way out), then those only lower-priority
    pods hold (what preemption would free), then the rest; the most free first, then index."""
    if pod.num_gpu == 0:
        return ()
    try:
        return pick_gpus(snap, pod, node)
    except ValueError:
        pass
    holders: dict[int, list[PodSpec]] = {}
    for key in snap.node_pods[node]:
        a = snap.allocations[key]
        for g in a.gpus:
            holders.setdefault(g, []).append(a.pod)
    fit = fitting_gpus(snap, pod, node)

    def rank(g: int) -> tuple[bool, bool, bool, bool, int, int]:
        on = holders.get(g, [])
        lower = all(p.priority < pod.priority for p in on)
        going = bool(on) and lower and all(p.key in leaving for p in on)
        free = int(snap.gpu_free[node, g])
        return (not snap.gpu_exists[node, g], not fit[g], not going, not lower, -free, g)

    order = sorted(range(int(snap.gpu_count[node])), key=rank)
    return tuple(sorted(order[: pod.num_gpu]))
