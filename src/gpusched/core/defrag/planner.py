"""The planner for pending pods: the fewest moves of running pods that let a pod (or a gang) fit.

For one pending pod P:

1. If P fits now, no move is needed (``Method.FITS_NOW``).
2. Candidate nodes: those where P passes every filter but the resource ones (taints, affinity,
   spread) and where what is free plus what movable pods hold could take P. For each, a lower
   bound on the moves (per GPU, the fewest pods whose leaving frees enough, largest first; the
   num_gpu-th smallest of those; the same for CPU, memory and pod slots) and a greedy eviction
   set (the cheapest GPUs cleared largest-first, then CPU/memory deficits).
3. Greedy: candidates in order of greedy size, then bound; each is tried in a ``Statement``:
   P's GPUs on the target chosen with the set gone, then one by one each pod of the set evicted
   and placed where the profile would place it while P's room is held: on another node when one
   takes it, else on any node (the target and its own included) but not back on its own GPUs, so
   a move to another GPU of the same node is part of a plan; then P on the target (``fits``).
   It stops once the best plan found is no larger than every remaining bound, or when the work
   budget runs out.
4. Exact: unless the greedy plan is proven optimal (it meets the smallest bound of all), the
   MILP (``exact``) runs on the ``exact_targets`` best candidates below the greedy size, each
   moved pod with its ``exact_dests`` best destinations. Its plan answers when it is smaller.

Every answer is carried out step by step on the snapshot (``apply.apply_plan``, then undone)
before it is returned, so every moved pod passes every filter at its destination and nothing is
overcommitted at any step. A gang of pending pods is planned member by member on the books left
by the members before (each member's moves stay booked for the next); the whole gang gets a plan
or none.

The snapshot is left as it was.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpusched.core.cluster import I64, AccountingError, BoolArr, ClusterState
from gpusched.core.defrag.apply import apply_plan
from gpusched.core.defrag.exact import ExactAnswer, solve_exact
from gpusched.core.defrag.types import (
    REFUSAL_TEXT,
    Method,
    Move,
    Placement,
    Plan,
    PlanError,
    Refusal,
    Rules,
    WorkBudget,
)
from gpusched.core.defrag.units import BudgetTally, Eligibility, eligibility
from gpusched.core.framework import Profile
from gpusched.core.model import GPU_MILLI, Allocation, PodSpec
from gpusched.core.scheduler import choose_devices, feasible, fits, pick_host, score_nodes
from gpusched.core.statement import Statement

RESOURCE_FILTERS = frozenset({"NodeResourcesFit", "GPUFit"})
_NO_PLAN = 1 << 30


class _Work:
    def __init__(self, budget: WorkBudget) -> None:
        self.budget = budget
        self.used = 0

    def spend(self, n: int = 1) -> None:
        self.used += n

    @property
    def exhausted(self) -> bool:
        if self.used >= self.budget.max_work:
            return True
        stop = self.budget.should_stop
        return stop is not None and stop()


@dataclass(slots=True)
class _Candidate:
    node: int
    bound: int
    units: tuple[int, ...]
    size: int  # moves of the greedy set


@dataclass(slots=True)
class _Ctx:
    profile: Profile
    snap: ClusterState
    rules: Rules
    budget: WorkBudget
    work: _Work
    tally: BudgetTally
    tiebreak: I64 | None


def _static_mask(profile: Profile, pod: PodSpec, snap: ClusterState) -> BoolArr:
    """Nodes where ``pod`` passes the filters other than the resource ones."""
    rest = replace(profile, filters=tuple(f for f in profile.filters if f.name not in RESOURCE_FILTERS))
    return np.array(feasible(rest, pod, snap).passed, dtype=bool)


def _largest_first(amounts: Sequence[int], deficit: int) -> int:
    """The fewest of ``amounts`` that add up to ``deficit`` (largest first); _NO_PLAN if none do."""
    if deficit <= 0:
        return 0
    acc = 0
    for i, v in enumerate(sorted(amounts, reverse=True), 1):
        acc += v
        if acc >= deficit:
            return i
    return _NO_PLAN


def _analyse(ctx: _Ctx, el: Eligibility, pod: PodSpec, n: int) -> _Candidate | None:
    """Lower bound and greedy eviction set of node ``n`` for ``pod`` (None: cannot host it)."""
    snap = ctx.snap
    allocs = [snap.allocations[k] for k in sorted(snap.node_pods[n])]
    movable = [a for a in allocs if a.pod.key in el.unit_of]
    chosen: set[str] = set()
    bound = 0
    if pod.num_gpu:
        gm = int(snap.nodes[n].gpu_memory_mib)
        per_gpu: list[tuple[int, int, int, list[str]]] = []  # (count, bound, displaced milli, keys)
        for j in range(int(snap.gpu_count[n])):
            if not snap.gpu_exists[n, j] or snap.gpu_mem_cap[n, j] < pod.gpu_memory_mib:
                continue
            on_j = [a for a in allocs if j in a.gpus]
            mov_j = [a for a in on_j if a.pod.key in el.unit_of]
            if pod.is_whole:
                if len(mov_j) != len(on_j):
                    continue
                displaced = sum(a.pod.gpu_milli for a in on_j)
                per_gpu.append((len(on_j), len(on_j), displaced, [a.pod.key for a in on_j]))
                continue
            need_m = pod.gpu_milli - int(snap.gpu_free[n, j])
            need_g = pod.gpu_memory_mib - int(snap.gpu_mem_free[n, j])
            milli = [a.pod.gpu_milli for a in mov_j]
            gmem = [a.pod.gpu_memory_booked(gm) for a in mov_j]
            lb = max(_largest_first(milli, need_m), _largest_first(gmem, need_g))
            if lb >= _NO_PLAN:
                continue
            take: list[str] = []
            got_m = got_g = 0
            for a in sorted(mov_j, key=lambda a: (-a.pod.gpu_milli, -a.pod.gpu_memory_booked(gm), a.pod.key)):
                if got_m >= need_m and got_g >= need_g:
                    break
                take.append(a.pod.key)
                got_m += a.pod.gpu_milli
                got_g += a.pod.gpu_memory_booked(gm)
            per_gpu.append((len(take), lb, sum(snap.allocations[k].pod.gpu_milli for k in take), take))
        if len(per_gpu) < pod.num_gpu:
            return None
        lbs = sorted(g[1] for g in per_gpu)[: pod.num_gpu]
        # pods on one GPU each are distinct per GPU, so the bounds add up; a pod on several GPUs
        # could count for each, so then only the largest of the k smallest holds
        bound = sum(lbs) if all(len(a.gpus) <= 1 for a in allocs) else lbs[-1]
        for g in sorted(per_gpu, key=lambda g: (g[0], g[2]))[: pod.num_gpu]:
            chosen.update(g[3])
    units = {el.unit_of[k] for k in chosen}
    members_here = {k for u in units for k in el.units[u].members if snap.allocations[k].node == n}
    extras: list[tuple[str, int, int]] = [("cpu_free", pod.cpu_milli, 0), ("mem_free", pod.memory_mib, 1)]
    for attr, need, which in extras:
        free = int(getattr(snap, attr)[n])
        amounts = [(a.pod.cpu_milli if which == 0 else a.pod.memory_mib) for a in movable]
        bound = max(bound, _largest_first(amounts, need - free))
        got = free + sum(
            (snap.allocations[k].pod.cpu_milli if which == 0 else snap.allocations[k].pod.memory_mib)
            for k in members_here
        )
        for a in sorted(movable, key=lambda a: -(a.pod.cpu_milli if which == 0 else a.pod.memory_mib)):
            if got >= need:
                break
            if a.pod.key in members_here:
                continue
            u = el.unit_of[a.pod.key]
            units.add(u)
            for k in el.units[u].members:
                if snap.allocations[k].node == n and k not in members_here:
                    members_here.add(k)
                    got += (
                        snap.allocations[k].pod.cpu_milli
                        if which == 0
                        else snap.allocations[k].pod.memory_mib
                    )
        if got < need:
            return None
    if snap.pod_free[n] < 1:
        bound = max(bound, 1)
        if not members_here:
            if not movable:
                return None
            u = el.unit_of[min(movable, key=lambda a: (a.pod.gpu_demand_milli, a.pod.key)).pod.key]
            units.add(u)
            members_here.update(k for k in el.units[u].members if snap.allocations[k].node == n)
    for r, need in pod.extended.items():
        i = snap.ext_index.get(r)
        free = int(snap.ext_free[n, i]) if i is not None else 0
        amounts = [a.pod.extended.get(r, 0) for a in movable]
        bound = max(bound, _largest_first(amounts, need - free))
        got = free + sum(snap.allocations[k].pod.extended.get(r, 0) for k in members_here)
        for a in sorted(movable, key=lambda a: -a.pod.extended.get(r, 0)):
            if got >= need:
                break
            if a.pod.key in members_here or not a.pod.extended.get(r, 0):
                continue
            u = el.unit_of[a.pod.key]
            units.add(u)
            for k in el.units[u].members:
                if snap.allocations[k].node == n and k not in members_here:
                    members_here.add(k)
                    got += snap.allocations[k].pod.extended.get(r, 0)
        if got < need:
            return None
    size = sum(el.units[u].size for u in units)
    return _Candidate(n, bound, tuple(sorted(units)), size)


def _destination(
    ctx: _Ctx, pod: PodSpec, exclude: Sequence[int], was: tuple[int, tuple[int, ...]] | None = None
) -> tuple[int, tuple[int, ...]] | None:
    """Where the profile would place ``pod`` now, never on ``exclude``, nor back where it ``was``
    (its node and GPUs: its own node on other GPUs is a move within the node)."""
    snap, profile = ctx.snap, ctx.profile
    ctx.work.spend()
    f = feasible(profile, pod, snap)
    passed = np.array(f.passed, dtype=bool)  # a copy: nodes are struck off below
    passed[list(exclude)] = False
    for _ in range(2):
        nodes = np.flatnonzero(passed).astype(np.int64)
        if len(nodes) == 0:
            return None
        try:
            p = pick_host(f.state, profile, pod, snap, nodes, tiebreak=ctx.tiebreak)
        except ValueError:
            return None
        if was is None or (p.node, tuple(sorted(p.gpus))) != (was[0], tuple(sorted(was[1]))):
            return p.node, p.gpus
        passed[p.node] = False  # it would land where it is: not a move; the next best node
    return None


def _greedy_try(ctx: _Ctx, el: Eligibility, pod: PodSpec, cand: _Candidate) -> Plan | None:
    """Carry the candidate's eviction set out in a statement (undone after); its plan, or None.

    Where the pending pod lands (its GPUs) is chosen on the books without the set. Then, as the
    controller carries a plan out, one pod at a time: it is evicted and placed where the profile
    would place it while the pending pod's room is held (``_hold_room``, as the scheduler holds
    it): on a node other than the target and its own when one takes it, else on any node, the
    target and its own included, but never back on its own GPUs (a pod recreated on another GPU
    of its node is a move within the node). Then the pending pod must fit its room."""
    snap = ctx.snap
    units = [el.units[u] for u in cand.units]
    if not ctx.tally.allows(units):
        return None
    n = cand.node
    order = sorted(
        (k for u in units for k in u.members),
        key=lambda k: (-snap.allocations[k].pod.gpu_demand_milli, k),
    )
    with Statement(snap) as trial:
        for key in order:
            trial.evict(key)
        ctx.work.spend()
        here = feasible(ctx.profile, pod, snap, np.array([n], dtype=np.int64))
        if not here.passed[0]:
            return None
        try:
            gpus = choose_devices(here.state, ctx.profile, pod, snap, n)
        except ValueError:
            return None
    moves: list[Move] = []
    with Statement(snap) as st:
        for key in order:
            a = st.evict(key)
            with Statement(snap) as held:
                _hold_room(held, pod, n, gpus)
                # another node first (as before moves within a node were planned), else any node
                dest = _destination(ctx, a.pod, (n, a.node)) or _destination(ctx, a.pod, (), (a.node, a.gpus))
            if dest is None:
                return None
            d, to = dest
            st.assume(a.pod, d, to)
            moves.append(Move(key, snap.names[a.node], a.gpus, snap.names[d], to, a.pod.gpu_demand_milli))
        ctx.work.spend()
        if not fits(ctx.profile, pod, snap, n):
            return None
        try:
            st.assume(pod, n, gpus)
        except (AccountingError, ValueError):
            return None
    return Plan((pod.key,), True, Method.GREEDY, tuple(moves), (Placement(pod.key, snap.names[n], gpus),))


def _hold_room(st: Statement, pod: PodSpec, n: int, gpus: tuple[int, ...]) -> None:
    """Book ``pod``'s room on node ``n`` within ``st``: the pod itself when it fits there now, else
    the free part of each of its ``gpus`` (what ``k8s.reservation`` holds while a plan runs)."""
    snap = st.snap
    try:
        st.assume(pod, n, gpus)
        return
    except (AccountingError, ValueError):
        pass
    free = snap.node_gpu_free(n)
    want = GPU_MILLI if pod.is_whole else pod.gpu_milli
    for g in gpus:
        if free[g] <= 0:
            continue
        hold = PodSpec(
            f"{pod.name}#room{g}",
            namespace=pod.namespace,
            num_gpu=1,
            gpu_milli=min(int(free[g]), want or int(free[g])),
        )
        try:
            st.assume(hold, n, (g,))
        except (AccountingError, ValueError):
            continue


KEPT_SHOWN = 50
_KEPT_WHY = (Refusal.NO_CONTROLLER, Refusal.NOT_RECREATED, Refusal.OPTED_OUT, Refusal.BUDGET_EXHAUSTED)


def _kept(snap: ClusterState, el: Eligibility, mask: BoolArr) -> tuple[tuple[str, Refusal], ...]:
    """The running pods on the nodes that could take the pending pod (``mask``) that stay put for
    a reason of their own (no controller, not recreated, opted out, a budget), by key; at most
    ``KEPT_SHOWN``."""
    out = [(k, why) for k, why in el.refused.items() if why in _KEPT_WHY and mask[snap.allocations[k].node]]
    return tuple(sorted(out)[:KEPT_SHOWN])


def _kept_text(kept: Sequence[tuple[str, Refusal]], shown: int = 4) -> str:
    if not kept:
        return ""
    by: dict[Refusal, list[str]] = {}
    for k, r in kept[:shown]:
        by.setdefault(r, []).append(k)
    words = "; ".join(f"{', '.join(ks)}: {REFUSAL_TEXT[r.value]}" for r, ks in by.items())
    more = f"; and {len(kept) - shown} more" if len(kept) > shown else ""
    return f" (kept in place: {words}{more})"


def _verified(ctx: _Ctx, plan: Plan, pod: PodSpec) -> bool:
    with Statement(ctx.snap) as st:
        return apply_plan(st, ctx.profile, plan, {pod.key: pod}) is None


def _plan_one(ctx: _Ctx, pod: PodSpec, exclude: set[str]) -> Plan:
    snap, budget = ctx.snap, ctx.budget
    f = feasible(ctx.profile, pod, snap)
    nodes = f.indices()
    ctx.work.spend()
    if len(nodes):
        here = pick_host(f.state, ctx.profile, pod, snap, nodes, tiebreak=ctx.tiebreak)
        return Plan(
            (pod.key,), True, Method.FITS_NOW, (), (Placement(pod.key, here.node_name, here.gpus),), True
        )
    el = eligibility(snap, ctx.rules, pod.priority, exclude)
    mask = _static_mask(ctx.profile, pod, snap)
    if pod.num_gpu:
        mask &= snap.gpu_count >= pod.num_gpu
        if pod.gpu_models:
            ok_models = np.array([m in pod.gpu_models for m in snap.models] + [False])
            mask &= ok_models[snap.model_id]
    kept = _kept(snap, el, mask)
    cands = [c for n in np.flatnonzero(mask).tolist() if (c := _analyse(ctx, el, pod, int(n))) is not None]
    if not cands:
        why = "no node could take it even with every movable pod gone" + _kept_text(kept)
        return Plan(
            (pod.key,), False, Method.NONE, reason=f"pod {pod.key}: {why}", work=ctx.work.used, kept=kept
        )
    min_bound = min(c.bound for c in cands)
    rank = ctx.tiebreak if ctx.tiebreak is not None else np.arange(len(snap))
    cands.sort(key=lambda c: (c.size, c.bound, int(rank[c.node])))
    best: Plan | None = None
    for i, c in enumerate(cands):
        if best is not None and best.move_count <= min(x.bound for x in cands[i:]):
            break
        if c.size > ctx.rules.max_moves - ctx.tally.moves or (best is not None and c.size >= best.move_count):
            continue
        if ctx.work.exhausted or not budget.greedy:
            break
        p = _greedy_try(ctx, el, pod, c)
        if p is not None and (best is None or p.move_count < best.move_count):
            best = p
    greedy_moves = best.move_count if best is not None else None
    proven = best is not None and best.move_count <= min_bound
    answer = best
    method = Method.GREEDY
    exact_moves: int | None = None
    reason = ""
    if (budget.exact or not budget.greedy) and not proven and not ctx.work.exhausted:
        limit = best.move_count if best is not None else _NO_PLAN
        dest_cache: dict[str, list[int]] = {}
        truncated = [False]

        def destinations(a: Allocation) -> list[int]:
            got = dest_cache.get(a.pod.key)
            if got is None:
                got = _ranked_destinations(ctx, a, truncated)
                dest_cache[a.pod.key] = got
            return got

        def placeable(c: _Candidate) -> bool:
            """Every pod of its greedy set has somewhere to go (a pod with nowhere to go, such as
            a lone 8-GPU pod, would make the node's model infeasible)."""
            return all(destinations(snap.allocations[k]) for u in c.units for k in el.units[u].members)

        # the neighbourhood: the greedy plan's node (the model may find a smaller set there),
        # then the nodes whose greedy sets are smallest and placeable, among those whose bound
        # could beat it
        pool = sorted(
            (c for c in cands if c.bound < limit), key=lambda c: (c.size, c.bound, int(rank[c.node]))
        )
        targets = [snap.index[best.placements[0].node]] if best is not None else []
        for c in pool:
            if len(targets) >= budget.exact_targets or ctx.work.exhausted:
                break
            if c.node not in targets and placeable(c):
                targets.append(c.node)
        if targets:
            # the model keeps moved pods off their own node: where a pod with GPUs could move to
            # another GPU of its node (a node of several GPUs), its optimum is not the whole answer
            if any(
                snap.gpu_count[n] > 1
                and any(len(snap.allocations[k].gpus) for u in el.on_node[n] for k in el.units[u].members)
                for n in targets
            ):
                truncated[0] = True
            ctx.work.spend()
            ans = solve_exact(snap, pod, el, targets, destinations, ctx.rules, ctx.tally, budget)
            if isinstance(ans, ExactAnswer):
                exact_plan = Plan((pod.key,), True, Method.MILP, ans.moves, (ans.placement,))
                exact_moves = exact_plan.move_count
                if (best is None or exact_moves < best.move_count) and _verified(ctx, exact_plan, pod):
                    answer, method = exact_plan, Method.MILP
                if best is not None and exact_moves >= best.move_count:
                    method = Method.MILP  # the exact model confirmed the greedy plan's size
                outside = [c.bound for c in cands if c.node not in set(targets)]
                final = answer.move_count if answer is not None else _NO_PLAN
                # proven: the model's optimum over a complete neighbourhood that no node outside
                # could beat, or any plan that meets the smallest bound of all nodes
                proven = final <= min_bound or (
                    ans.solved_optimal and not truncated[0] and all(b >= final for b in outside)
                )
            else:
                reason = ans.reason
                if ans.infeasible and not truncated[0] and best is not None:
                    outside = [c.bound for c in cands if c.node not in set(targets)]
                    proven = all(b >= best.move_count for b in outside)
    if answer is None:
        why = reason or "no candidate's evictions could all be placed elsewhere"
        if ctx.work.exhausted:
            why = f"work budget spent ({ctx.work.used} units); {why}"
        return Plan(
            (pod.key,),
            False,
            Method.NONE,
            reason=f"pod {pod.key}: {why}{_kept_text(kept)}",
            work=ctx.work.used,
            kept=kept,
            greedy_moves=greedy_moves,
            exact_moves=exact_moves,
        )
    if not _verified(ctx, answer, pod):  # the greedy plans are built by the same steps: never expected
        return Plan((pod.key,), False, Method.NONE, reason=f"pod {pod.key}: plan failed verification")
    ctx.tally.charge({el.units[el.unit_of[m.pod]] for m in answer.moves})
    return replace(
        answer,
        kept=kept,
        method=method,
        optimal=proven,
        greedy_moves=greedy_moves,
        exact_moves=exact_moves,
        work=ctx.work.used,
    )


def _ranked_destinations(ctx: _Ctx, a: Allocation, truncated: list[bool]) -> list[int]:
    """The nodes other than its own where the running pod ``a`` passes every filter now, best
    scored first, at most ``exact_dests`` of them (``truncated[0]`` set when there were more)."""
    snap, profile = ctx.snap, ctx.profile
    pod = a.pod
    ctx.work.spend()
    f = feasible(profile, pod, snap)
    nodes = f.indices()
    nodes = nodes[nodes != a.node]
    if len(nodes) == 0:
        return []
    total, _ = score_nodes(f.state, profile, pod, snap, nodes)
    rank = ctx.tiebreak if ctx.tiebreak is not None else np.arange(len(snap))
    order = np.lexsort((rank[nodes], -total))
    k = ctx.budget.exact_dests
    if len(order) > k:
        truncated[0] = True
    return [int(nodes[i]) for i in order[:k]]


def plan_for(
    profile: Profile,
    snap: ClusterState,
    pending: PodSpec | Sequence[PodSpec],
    rules: Rules | None = None,
    budget: WorkBudget | None = None,
    *,
    tiebreak: I64 | None = None,
) -> Plan:
    """The fewest moves of running pods (within ``rules``) after which ``pending`` — one pod, or a
    gang that must all fit — lands. ``snap`` is left as it was. See the module doc."""
    rules = rules or Rules()
    budget = budget or WorkBudget()
    pods = [pending] if isinstance(pending, PodSpec) else list(pending)
    if not pods:
        raise PlanError("plan_for: no pending pod given")
    keys = [p.key for p in pods]
    if len(set(keys)) != len(keys):
        raise PlanError(f"plan_for: pending pod {next(k for k in keys if keys.count(k) > 1)} given twice")
    for p in pods:
        if p.key in snap.allocations:
            raise PlanError(
                f"plan_for: pod {p.key} is already running on {snap.names[snap.allocations[p.key].node]}"
            )
    if tiebreak is not None and len(tiebreak) != len(snap):
        raise PlanError(f"plan_for: tiebreak has {len(tiebreak)} ranks for {len(snap)} nodes")
    ctx = _Ctx(profile, snap, rules, budget, _Work(budget), BudgetTally(rules), tiebreak)
    if len(pods) == 1:
        plan = _plan_one(ctx, pods[0], {pods[0].key})
        return replace(plan, budgets_used=ctx.tally.report() if plan.feasible else ())
    return _plan_gang(ctx, pods)


def _plan_gang(ctx: _Ctx, pods: list[PodSpec]) -> Plan:
    keys = tuple(p.key for p in pods)
    exclude = set(keys)
    moves: list[Move] = []
    placements: list[Placement] = []
    methods: list[Method] = []
    with Statement(ctx.snap) as st:
        for p in pods:
            sub = _plan_one(ctx, p, exclude)
            if not sub.feasible:
                return Plan(
                    keys, False, Method.NONE, reason=f"gang: {sub.reason}", work=ctx.work.used, kept=sub.kept
                )
            why = apply_plan(st, ctx.profile, sub, {p.key: p})
            if why is not None:
                return Plan(keys, False, Method.NONE, reason=f"gang: pod {p.key}: {why}", work=ctx.work.used)
            exclude |= {m.pod for m in sub.moves}
            moves += sub.moves
            placements += sub.placements
            methods.append(sub.method)
    if not moves:
        method = Method.FITS_NOW
    elif Method.GREEDY in methods:
        method = Method.GREEDY
    else:
        method = Method.MILP
    return Plan(
        keys,
        True,
        method,
        tuple(moves),
        tuple(placements),
        optimal=not moves,
        work=ctx.work.used,
        budgets_used=ctx.tally.report(),
    )
