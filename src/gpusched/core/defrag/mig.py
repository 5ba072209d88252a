"""Defragmentation that moves MIG slices: a running MIG pod is moved (evicted and recreated, as any move) to a
*free instance of its profile* on another GPU or node, when that

- frees a whole GPU (``free_a_gpu``): every slice held on it moves off, so the GPU is idle and can be
  re-cut as a whole (mig-manager's way) or serve anything its geometry can; or
- makes room for a pending MIG pod (``room_for``): the pod's profile gets a free instance (the mover held it),
  or the GPU's free slices, once the movers are gone, can be re-cut by the scheduler's own planner
  (``core.mig.reshape.plan_node``) into the instance the pod needs.

Every move is booked on a copy of the books as it is chosen (``ClusterState.assume`` with the target slice):
the copy refuses a slice that is held or not present, so no two moves take one instance and no move takes an
instance a pod holds. A plan is checked once more, step by step, on a fresh copy (``replay``) before it is
returned. Only pods that may move (``core.defrag.units.eligibility``: a recreating controller, priority,
budgets, the move cap) and that hold exactly one MIG slice are moved. Pure: no I/O, no clock.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.defrag.types import Method, Move, Placement, Plan, Rules
from gpusched.core.defrag.units import BudgetTally, Eligibility, eligibility
from gpusched.core.framework import Profile
from gpusched.core.mig.books import MigSlot, demand_of
from gpusched.core.mig.geometry import Instance, MigGpu, free_slices
from gpusched.core.mig.profiles import MigError
from gpusched.core.mig.reshape import GpuRecut, plan_node
from gpusched.core.mig.whatif import MIG_RESOURCE_PREFIX, recut, with_node_mig
from gpusched.core.model import Allocation, PodSpec
from gpusched.core.scheduler import feasible, fits

MAX_HELD_TRIED = 7
"""Held slices of one GPU whose subsets ``room_for`` tries (all of them on an 8-slice GPU)."""


@dataclass(frozen=True)
class MigRoom:
    """``room_for``'s answer: the plan (moves, and the pending pod's slice when an instance of its profile is
    freed) and, when the freed slices must be re-cut first, that re-cut (GPU index on ``node``)."""

    plan: Plan
    node: str = ""
    recut: GpuRecut | None = None


class _Work:
    """The copy of the books a plan is built on, with an undo log, and the instances free when it began, per
    profile (a move's candidates: those still free in the copy)."""

    def __init__(self, snap: ClusterState) -> None:
        self.snap = snap.copy()
        self._log: list[tuple[Allocation, Allocation]] = []
        self.free: dict[str, list[tuple[int, int, Instance]]] = {}
        self._on: Counter[tuple[int, int, str]] = Counter()
        for n, nd in enumerate(snap.nodes):
            nm = nd.mig
            if nm is None:
                continue
            for i, g in zip(nm.indices, nm.gpus, strict=True):
                if i in nm.reshaping or not g.mig_enabled:
                    continue
                held = snap.mig_books[n][i].instances
                for x in g.instances:
                    if x not in held:
                        self.free.setdefault(x.profile, []).append((n, i, x))
                        self._on[(n, i, x.profile)] += 1
        self._total = Counter({p: len(xs) for p, xs in self.free.items()})

    def free_count(self, profile: str, avoid: tuple[int, int]) -> int:
        """Instances of ``profile`` free when the work began, outside GPU ``avoid`` ((node, GPU index))."""
        return self._total[profile] - self._on[(*avoid, profile)]

    def move(self, profile: Profile, key: str, avoid: set[tuple[int, int]]) -> Move | None:
        """Move pod ``key`` (one MIG slice) to a free instance of its profile on a GPU outside ``avoid``
        ((node, GPU index)) where the filters pass; the target where the GPU is fullest afterwards (best fit:
        it leaves whole GPUs free), then node name, GPU and start. None when there is none."""
        snap = self.snap
        old = snap.allocations[key]
        (slot,) = old.mig
        best: tuple[tuple[int, str, int, int], int, MigSlot] | None = None
        for n, i, x in self.free.get(slot.profile, ()):
            if (n, i) in avoid:
                continue
            held = snap.mig_books[n][i]
            if x in held.instances:
                continue  # taken by an earlier move of this plan
            after = held.place(x.profile, x.start)
            rank = (free_slices(held.geometry, after.code), snap.names[n], i, x.start)
            if best is None or rank < best[0]:
                best = (rank, n, MigSlot(i, x.start, x.profile))
        if best is None:
            return None
        _r, to, target = best
        snap.forget(key)
        if not fits(profile, old.pod, snap, to):
            snap.assume(old.pod, old.node, old.gpus, mig=old.mig, check=False)
            return None
        new = snap.assume(old.pod, to, (), mig=(target,))  # raises on a held or absent slice: never here
        self._log.append((old, new))
        return Move(key, snap.names[old.node], old.gpus, snap.names[to], (), 0, old.mig, (target,))

    def undo(self, to: int = 0) -> None:
        while len(self._log) > to:
            old, new = self._log.pop()
            self.snap.forget(new.pod.key)
            self.snap.assume(old.pod, old.node, old.gpus, mig=old.mig, check=False)

    @property
    def depth(self) -> int:
        return len(self._log)


def _slices_on(snap: ClusterState, el: Eligibility, n: int, gpu: int) -> tuple[list[str], list[str]]:
    """The pods holding slices of GPU ``gpu`` of node ``n`` (by key): those that may move (movable, not in a
    gang, one MIG slice and no GPU) and those that stay."""
    movable: list[str] = []
    stuck: list[str] = []
    for key in sorted(snap.node_pods[n]):
        a = snap.allocations[key]
        if not any(s.gpu == gpu for s in a.mig):
            continue
        ui = el.unit_of.get(key)
        ok = ui is not None and el.units[ui].size == 1 and len(a.mig) == 1 and not a.gpus
        (movable if ok else stuck).append(key)
    return movable, stuck


def replay(profile: Profile, snap: ClusterState, moves: Sequence[Move]) -> ClusterState:
    """``moves`` carried out on a copy of ``snap``, each checked: the pod is where the move says, the target
    slice is present and free at that step (the books refuse it otherwise), and the filters pass there.
    Raises AccountingError naming the first step that does not hold."""
    out = snap.copy()
    for k, mv in enumerate(moves, 1):
        a = out.allocations.get(mv.pod)
        if a is None or out.names[a.node] != mv.from_node or a.mig != mv.from_mig:
            raise AccountingError(f"move {k}: pod {mv.pod} is not on {mv.from_node} {list(mv.from_mig)}")
        to = out.index[mv.to_node]
        out.forget(mv.pod)
        if not fits(profile, a.pod, out, to):
            raise AccountingError(f"move {k}: pod {mv.pod} does not pass the filters on {mv.to_node}")
        out.assume(a.pod, to, (), mig=mv.to_mig)
    return out


# ------------------------------------------------------------------------------------------ free a GPU
def free_a_gpu(profile: Profile, snap: ClusterState, rules: Rules) -> Plan:
    """The fewest moves (within ``rules``) after which one MIG GPU that holds slices holds none: each slice
    moved to a free instance of its profile on another GPU. GPUs with the fewest held slices are tried first,
    then by node name and index. Infeasible (``reason``) when none can be emptied."""
    el = eligibility(snap, rules)
    work = _Work(snap)
    tried = []
    for n, nd in enumerate(snap.nodes):
        nm = nd.mig
        if nm is None:
            continue
        for i in nm.indices:
            held = len(snap.mig_books[n][i].instances)
            if held and i not in nm.reshaping:
                tried.append((held, snap.names[n], i, n))
    for held, name, i, n in sorted(tried):
        if held > rules.max_moves:
            continue
        keys, stuck = _slices_on(snap, el, n, i)
        need = Counter(snap.allocations[k].mig[0].profile for k in keys)
        if stuck or any(work.free_count(p, (n, i)) < c for p, c in need.items()):
            continue  # a pod that stays, or too few free instances elsewhere even before any move
        tally = BudgetTally(rules)
        units = [el.units[el.unit_of[k]] for k in keys]
        if not tally.allows(units):
            continue
        moves = []
        for k in keys:
            mv = work.move(profile, k, {(n, i)})
            if mv is None:
                break
            moves.append(mv)
        if len(moves) == len(keys):
            tally.charge(units)
            replay(profile, snap, moves)  # checked once more on a fresh copy
            return Plan(
                (), True, Method.GREEDY, tuple(moves), reason=f"frees GPU {i} of node {name}",
                budgets_used=tally.report(),
            )  # fmt: skip
        work.undo()
    return Plan(
        (), False, Method.NONE, reason="no MIG GPU can be emptied by moving its slices to free instances"
    )


# ------------------------------------------------------------------------------------ room for a pod
def without_slices(pod: PodSpec) -> PodSpec:
    """``pod`` asking for everything but its MIG slices."""
    ext = {k: v for k, v in pod.extended.items() if not k.startswith(MIG_RESOURCE_PREFIX)}
    return replace(pod, mig=(), extended=ext)


def _lands(profile: Profile, pod: PodSpec, snap: ClusterState, n: int) -> tuple[bool, GpuRecut | None]:
    """Whether ``pod`` lands on node ``n`` of ``snap`` as it is (True, None), after the scheduler's re-cut of
    one GPU's free slices (True, the re-cut), or not at all."""
    if fits(profile, pod, snap, n):
        return True, None
    nm = snap.nodes[n].mig
    if nm is None:
        return False, None
    plan = plan_node(nm, snap.mig_books[n], pod.mig, demand_of(snap.mig_demand, pod.mig))
    if plan is None or sorted(plan.serves) != list(pod.mig):
        return False, None
    try:
        after = with_node_mig(snap, n, recut(nm, plan))
    except MigError:
        return False, None
    return fits(profile, pod, after, n), plan


def room_for(profile: Profile, snap: ClusterState, pod: PodSpec, rules: Rules) -> MigRoom:
    """The fewest moves of MIG pods (within ``rules``, of the pod's priority or below as ``rules.priority``
    says) after which ``pod`` (asking for MIG slices) lands on a node: on a freed instance of its profile, or
    after the scheduler re-cuts the GPU's free slices. Per node the pod may use but for its slices, per GPU,
    every subset of its held slices, smallest first. A plan of no moves (``Method.FITS_NOW``, as the
    planner's) when the pod lands as things are; infeasible when no subset within ``rules.max_moves`` makes
    room."""
    if not pod.mig:
        return MigRoom(Plan((pod.key,), False, Method.NONE, reason="the pod asks for no MIG slice"))
    ok = feasible(profile, without_slices(pod), snap).indices().tolist()
    nodes = [n for n in ok if snap.nodes[n].mig is not None]
    if any(_lands(profile, pod, snap, n)[0] for n in nodes):
        return MigRoom(Plan((pod.key,), True, Method.FITS_NOW, reason="it lands without moving a slice"))
    el = eligibility(snap, rules, pod.priority, (pod.key,))
    work = _Work(snap)
    best: tuple[tuple[int, int, str, int], MigRoom] | None = None
    for n in nodes:
        nm = snap.nodes[n].mig
        assert nm is not None
        for i, g in zip(nm.indices, nm.gpus, strict=True):
            if i in nm.reshaping or not g.mig_enabled or not set(pod.mig) & set(g.geometry.kinds):
                continue
            keys, _stuck = _slices_on(snap, el, n, i)
            keys = [k for k in keys if work.free_count(snap.allocations[k].mig[0].profile, (n, i))]
            if not keys or len(keys) > MAX_HELD_TRIED:
                continue
            for size in range(1, min(len(keys), rules.max_moves) + 1):
                if best is not None and size > best[0][0]:
                    break
                found = _try_subsets(profile, snap, work, el, rules, pod, n, i, keys, size)
                if found is not None:
                    rank = (size, int(found.recut is not None), snap.names[n], i)
                    if best is None or rank < best[0]:
                        best = (rank, found)
                    break
    if best is None:
        return MigRoom(
            Plan(
                (pod.key,),
                False,
                Method.NONE,
                reason=f"no move of at most {rules.max_moves} MIG pods makes room",
            )
        )
    return best[1]


def _try_subsets(
    profile: Profile,
    snap: ClusterState,
    work: _Work,
    el: Eligibility,
    rules: Rules,
    pod: PodSpec,
    n: int,
    gpu: int,
    keys: list[str],
    size: int,
) -> MigRoom | None:
    nm = snap.nodes[n].mig
    assert nm is not None
    g = nm.gpu(gpu)
    assert g is not None
    held = snap.mig_books[n][gpu]
    for subset in itertools.combinations(keys, size):
        gone = {snap.allocations[k].mig[0] for k in subset}
        rest = [x for x in held.instances if MigSlot(gpu, x.start, x.profile) not in gone]
        freed = {s.profile for s in gone}
        left = MigGpu(g.name, g.geometry, True, tuple(rest))
        if not any(p in freed or left.free_starts(p) for p in set(pod.mig) if p in g.geometry.kinds):
            continue  # neither a freed instance of its profile nor room to cut one: skip the booking
        units = [el.units[el.unit_of[k]] for k in subset]
        tally = BudgetTally(rules)
        if not tally.allows(units):
            continue
        moves = []
        for k in subset:
            mv = work.move(profile, k, {(n, gpu)})
            if mv is None:
                break
            moves.append(mv)
        if len(moves) == size:
            lands, cut = _lands(profile, pod, work.snap, n)
            if lands:
                after = replay(profile, snap, moves)  # checked once more on a fresh copy
                tally.charge(units)
                placements: tuple[Placement, ...] = ()
                if cut is None:
                    a = after.assume(pod, n, ())
                    placements = (Placement(pod.key, snap.names[n], (), a.mig),)
                what = f"GPU {gpu} of node {snap.names[n]}"
                reason = f"room on {what}" + (f" after re-cutting it ({_cut_text(cut)})" if cut else "")
                plan = Plan(
                    (pod.key,), True, Method.GREEDY, tuple(moves), placements, reason=reason,
                    budgets_used=tally.report(),
                )  # fmt: skip
                work.undo()
                return MigRoom(plan, snap.names[n], cut)
        work.undo()
    return None


def _cut_text(cut: GpuRecut | None) -> str:
    if cut is None:
        return ""

    def names(xs: tuple[Instance, ...]) -> str:
        return ", ".join(f"{x.profile} at {x.start}" for x in xs) or "nothing"

    return f"destroy {names(cut.destroy)}; create {names(cut.create)}"
