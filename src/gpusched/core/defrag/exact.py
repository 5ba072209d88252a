"""The exact planner: fewest moves for one pending pod as a MILP (HiGHS via scipy.optimize.milp).

On a neighbourhood — target nodes ``T`` for the pending pod P, and for each pod that might move
its best destinations ``D_m`` — the model chooses one target, the units to evict there and a
destination (node and GPUs) for every evicted pod:

- ``t_n`` (n in T): P lands on n; ``sum t = 1``.
- ``x_u``: unit u (a pod, or a whole gang) moves; only when one of its nodes is the target.
- ``z_nj``: P takes GPU j of n. A share needs ``free_j + sum_{m on j} milli_m x_u(m) >= milli_P z``
  (and the same for GPU memory); a whole GPU needs every pod on j moved (``z <= x``).
- CPU, memory, pod slots and extended resources of n: what is free plus what the moved pods
  free covers P.
- ``y_mdg`` (a share m on GPU g of destination d), ``y_md`` with ``w_mdg`` (m's whole GPUs), or
  ``y_md`` (no GPU): every moved pod gets exactly one destination; destinations keep their
  free CPU, memory, pod slots, extended resources and per-GPU milli and memory; a destination
  is never the chosen target. Destinations are counted at what is free now (room freed by other
  moves is not reused), so the moves can be carried out one by one in any order.
- Disruption budgets and the move cap bound ``sum size_u x_u``.

Minimise the moves (``sum size_u x_u``), ties going to the plan that moves less GPU. Every node,
GPU and pod in the model is an integer; the objective's tie-break is the only fraction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from gpusched.core.cluster import ClusterState
from gpusched.core.defrag.types import Move, Placement, Rules, WorkBudget
from gpusched.core.defrag.units import BudgetTally, Eligibility
from gpusched.core.model import Allocation, PodSpec


@dataclass(frozen=True, slots=True)
class ExactAnswer:
    moves: tuple[Move, ...]
    placement: Placement
    solved_optimal: bool
    binaries: int


@dataclass(frozen=True, slots=True)
class ExactFailure:
    reason: str
    binaries: int = 0
    infeasible: bool = False
    """The model has no solution (proven): no plan within the neighbourhood."""


class _Model:
    def __init__(self) -> None:
        self.n = 0
        self.cost: list[float] = []
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def var(self, cost: float = 0.0) -> int:
        self.cost.append(cost)
        self.n += 1
        return self.n - 1

    def row(self, terms: Sequence[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(self.lb)
        for c, v in terms:
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(v)
        self.lb.append(lb)
        self.ub.append(ub)


INF = np.inf


def solve_exact(
    snap: ClusterState,
    pod: PodSpec,
    el: Eligibility,
    targets: Sequence[int],
    destinations: Callable[[Allocation], list[int]],
    rules: Rules,
    tally: BudgetTally,
    budget: WorkBudget,
) -> ExactAnswer | ExactFailure:
    """The fewest moves that let ``pod`` land on one of ``targets``, moved pods going to the nodes
    ``destinations(allocation)`` names (best first, the pod's own node excluded)."""
    m = _Model()
    t_var = {n: m.var() for n in targets}
    m.row([(v, 1.0) for v in t_var.values()], 1, 1)
    units = sorted({u for n in targets for u in el.on_node[n]})
    total_milli = sum(el.units[u].gpu_milli for u in units) + 1
    x_var = {u: m.var(el.units[u].size + 0.5 * el.units[u].gpu_milli / total_milli) for u in units}
    for u in units:
        m.row([(x_var[u], 1.0)] + [(t_var[n], -1.0) for n in el.units[u].nodes if n in t_var], -INF, 0)
    allocs = {k: snap.allocations[k] for u in units for k in el.units[u].members}
    # ------------------------------------------------------------------ destinations of moved pods
    dest_use: dict[int, list[tuple[int, Allocation, list[int]]]] = {}  # d -> (Y var or -1, alloc, gpu vars)
    share_gpu: dict[tuple[int, int], list[tuple[int, PodSpec]]] = {}  # (d, g) -> (var, pod) shares
    whole_gpu: dict[tuple[int, int], list[int]] = {}  # (d, g) -> w vars
    member_choice: dict[str, list[tuple[int, int, tuple[int, ...]]]] = {}  # key -> (var, d, gpus)
    whole_w: dict[int, list[tuple[int, int]]] = {}  # y var -> [(w var, g)]
    for key, a in allocs.items():
        p = a.pod
        ys: list[int] = []
        for d in destinations(a):
            if d == a.node:
                continue
            if p.num_gpu == 0:
                y = m.var()
                ys.append(y)
                member_choice.setdefault(key, []).append((y, d, ()))
                dest_use.setdefault(d, []).append((y, a, []))
            else:
                room = snap.gpu_room(p, slice(d, d + 1))[0] & snap.gpu_exists[d]
                gs = [int(g) for g in np.flatnonzero(room[: int(snap.gpu_count[d])])]
                if len(gs) < p.num_gpu:
                    continue
                if p.is_whole:
                    y = m.var()
                    ys.append(y)
                    ws = []
                    for g in gs:
                        w = m.var()
                        ws.append((w, g))
                        whole_gpu.setdefault((d, g), []).append(w)
                    whole_w[y] = ws
                    m.row([(w, 1.0) for w, _ in ws] + [(y, -float(p.num_gpu))], 0, 0)
                    member_choice.setdefault(key, []).append((y, d, ()))
                    dest_use.setdefault(d, []).append((y, a, []))
                else:
                    for g in gs:
                        y = m.var()
                        ys.append(y)
                        share_gpu.setdefault((d, g), []).append((y, p))
                        member_choice.setdefault(key, []).append((y, d, (g,)))
                        dest_use.setdefault(d, []).append((y, a, []))
            if d in t_var:  # a target node takes moved pods only when P does not land there
                here = [c[0] for c in member_choice.get(key, []) if c[1] == d]
                if here:
                    m.row([(v, 1.0) for v in here] + [(t_var[d], 1.0)], -INF, 1)
        m.row([(y, 1.0) for y in ys] + [(x_var[el.unit_of[key]], -1.0)], 0, 0)
        if m.n > budget.exact_max_binaries:
            return ExactFailure(f"model too large (over {budget.exact_max_binaries} binaries)", m.n)
    for d, uses in dest_use.items():
        cpu = [(y, float(a.pod.cpu_milli)) for y, a, _ in uses if a.pod.cpu_milli]
        if cpu:
            m.row(cpu, -INF, float(snap.cpu_free[d]))
        mem = [(y, float(a.pod.memory_mib)) for y, a, _ in uses if a.pod.memory_mib]
        if mem:
            m.row(mem, -INF, float(snap.mem_free[d]))
        m.row([(y, 1.0) for y, _, _ in uses], -INF, float(min(snap.pod_free[d], 1 << 30)))
        ext_names = {r for _, a, _ in uses for r in a.pod.extended}
        for r in sorted(ext_names):
            i = snap.ext_index.get(r)
            free = float(snap.ext_free[d, i]) if i is not None else 0.0
            m.row(
                [(y, float(a.pod.extended.get(r, 0))) for y, a, _ in uses if a.pod.extended.get(r)],
                -INF,
                free,
            )
    for dg in sorted(set(share_gpu) | set(whole_gpu)):
        d, g = dg
        cap_mem = float(snap.gpu_mem_cap[d, g])
        milli = [(y, float(p.gpu_milli)) for y, p in share_gpu.get(dg, []) if p.gpu_milli]
        milli += [(w, 1000.0) for w in whole_gpu.get(dg, [])]
        if milli:
            m.row(milli, -INF, float(snap.gpu_free[d, g]))
        gmem = [(y, float(p.gpu_memory_mib)) for y, p in share_gpu.get(dg, []) if p.gpu_memory_mib]
        gmem += [(w, cap_mem) for w in whole_gpu.get(dg, []) if cap_mem]
        if gmem:
            m.row(gmem, -INF, float(snap.gpu_mem_free[d, g]))
    # ------------------------------------------------------------------ the pending pod on its target
    z_var: dict[tuple[int, int], int] = {}
    for n, t in t_var.items():
        on_n = [allocs[k] for u in el.on_node[n] for k in el.units[u].members if allocs[k].node == n]
        movable_keys = {a.pod.key for a in on_n}
        x_of = {a.pod.key: x_var[el.unit_of[a.pod.key]] for a in on_n}
        for attr_free, attr_pod, need in (
            ("cpu_free", "cpu_milli", pod.cpu_milli),
            ("mem_free", "memory_mib", pod.memory_mib),
        ):
            free = float(getattr(snap, attr_free)[n])
            terms = [
                (x_of[a.pod.key], float(getattr(a.pod, attr_pod))) for a in on_n if getattr(a.pod, attr_pod)
            ]
            m.row([*terms, (t, -float(need))], -free, INF)
        m.row(
            [(x_of[a.pod.key], 1.0) for a in on_n] + [(t, -1.0)], -float(min(snap.pod_free[n], 1 << 30)), INF
        )
        for r, need in pod.extended.items():
            if not need:
                continue
            i = snap.ext_index.get(r)
            free = float(snap.ext_free[n, i]) if i is not None else 0.0
            terms = [
                (x_of[a.pod.key], float(a.pod.extended.get(r, 0))) for a in on_n if a.pod.extended.get(r)
            ]
            m.row([*terms, (t, -float(need))], -free, INF)
        if not pod.num_gpu:
            continue
        all_on_n = [snap.allocations[k] for k in snap.node_pods[n]]
        zs = []
        for j in range(int(snap.gpu_count[n])):
            if not snap.gpu_exists[n, j]:
                continue
            on_j = [a for a in all_on_n if j in a.gpus]
            if pod.is_whole:
                if snap.gpu_mem_cap[n, j] < pod.gpu_memory_mib:
                    continue
                if any(a.pod.key not in movable_keys for a in on_j):
                    continue
                z = m.var()
                for a in on_j:
                    m.row([(z, 1.0), (x_of[a.pod.key], -1.0)], -INF, 0)
            else:
                if snap.gpu_mem_cap[n, j] < pod.gpu_memory_mib:
                    continue
                z = m.var()
                mov = [a for a in on_j if a.pod.key in movable_keys]
                gm = int(snap.nodes[n].gpu_memory_mib)
                if pod.gpu_milli:
                    terms = [(x_of[a.pod.key], float(a.pod.gpu_milli)) for a in mov if a.pod.gpu_milli]
                    m.row([*terms, (z, -float(pod.gpu_milli))], -float(snap.gpu_free[n, j]), INF)
                if pod.gpu_memory_mib:
                    terms = [
                        (x_of[a.pod.key], float(a.pod.gpu_memory_booked(gm)))
                        for a in mov
                        if a.pod.gpu_memory_booked(gm)
                    ]
                    m.row([*terms, (z, -float(pod.gpu_memory_mib))], -float(snap.gpu_mem_free[n, j]), INF)
            z_var[(n, j)] = z
            zs.append(z)
        m.row([(z, 1.0) for z in zs] + [(t, -float(pod.num_gpu))], 0, 0)
    # ------------------------------------------------------------------ budgets and the move cap
    for bi, b in enumerate(rules.budgets):
        terms = [(x_var[u], float(n)) for u in units for i, n in el.units[u].budget_use if i == bi]
        if terms:
            m.row(terms, -INF, float(b.allowed - tally.used[bi]))
    m.row([(x_var[u], float(el.units[u].size)) for u in units], -INF, float(rules.max_moves - tally.moves))
    if m.n > budget.exact_max_binaries:
        return ExactFailure(f"model too large ({m.n} binaries > {budget.exact_max_binaries})", m.n)
    a_mat = sparse.csr_array((m.vals, (m.rows, m.cols)), shape=(len(m.lb), m.n))
    res = milp(
        np.asarray(m.cost),
        constraints=LinearConstraint(a_mat, np.asarray(m.lb), np.asarray(m.ub)),
        integrality=np.ones(m.n),
        bounds=Bounds(0, 1),
        options={"node_limit": budget.milp_node_limit, "presolve": True},
    )
    if res.x is None:
        infeasible = res.status == 2
        return ExactFailure(f"MILP: {res.message}", m.n, infeasible=infeasible)
    x = np.rint(res.x).astype(np.int64)
    chosen = next(n for n, v in t_var.items() if x[v])
    moves: list[Move] = []
    for key, choices in member_choice.items():
        if not x[x_var[el.unit_of[key]]]:
            continue
        a = allocs[key]
        pick = [c for c in choices if x[c[0]]]
        if len(pick) != 1:
            return ExactFailure(f"MILP answer gives pod {key} {len(pick)} destinations", m.n)
        v, d, to_gpus = pick[0]
        if a.pod.is_whole:
            to_gpus = tuple(sorted(g for w, g in whole_w[v] if x[w]))
        moves.append(Move(key, snap.names[a.node], a.gpus, snap.names[d], to_gpus, a.pod.gpu_demand_milli))
    p_gpus = tuple(sorted(j for (n, j), z in z_var.items() if n == chosen and x[z]))
    moves.sort(key=lambda mv: (-mv.gpu_milli, mv.pod))
    return ExactAnswer(
        tuple(moves), Placement(pod.key, snap.names[chosen], p_gpus), bool(res.status == 0), m.n
    )
