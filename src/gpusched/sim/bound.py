"""A ceiling on the GPU allocation any scheduler could reach, and an offline packing to compare.

Relax CPU, memory and node boundaries: the cluster becomes ``num_gpus`` bins of 1000 milli.
Whole-GPU pods give 1000 per GPU, the most a bin can hold, so they take as many bins as they fit
(the share LP gains at most 1000 per extra bin, so this is optimal for the bound). The remaining
bins hold shares: a share above 500 milli opens its own bin, leaving 1000 − b for smaller shares
beside it. A linear program over share sizes (solved with HiGHS) gives an upper bound on the share
milli; ``lp_milli`` is whole-GPU milli plus its floor. ``bfd_milli`` is an actual packing of the
same pods: whole-GPU pods first, then shares biggest first, each into the fullest bin it fits.

The LP may leave out any pod, so at 130 % arrived it reaches 100 % by dropping awkward shares that
arrived early. ``arrival_bound`` adds what arrival order forces on every scheduler that places each
pod which fits: until the pods before it could have touched every GPU (a share touches one, a
whole-GPU pod its ``num_gpu``), some GPU is idle, so an arriving share that may use any GPU fits
and must be placed. With
those shares as minimum counts the same LP is a ceiling for any such scheduler on the relaxed
cluster; CPU and memory stay relaxed, as for the LP.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from gpusched.core.errors import InvalidInput
from gpusched.core.model import GPU_MILLI, PodSpec
from gpusched.core.policies.pairing import PairingPlan

HALF = GPU_MILLI // 2


@dataclass(frozen=True)
class Bound:
    lp_milli: int  # LP ceiling: the most GPU milli an ideal scheduler could allocate
    bfd_milli: int  # offline best-fit-decreasing packing of the same pods
    total_milli: int  # cluster GPU milli (num_gpus * 1000)

    @property
    def lp_pct(self) -> float:
        return 100 * self.lp_milli / self.total_milli

    @property
    def bfd_pct(self) -> float:
        return 100 * self.bfd_milli / self.total_milli


def _split(pods: Sequence[PodSpec]) -> tuple[list[int], Counter[int]]:
    """GPU counts of whole-GPU pods, and counts of share pods by size. Pods without GPU milli drop out."""
    whole: list[int] = []
    shares: Counter[int] = Counter()
    for p in pods:
        if p.num_gpu <= 0 or p.gpu_milli <= 0:
            continue
        if p.gpu_milli >= GPU_MILLI:
            whole.append(p.num_gpu)
        else:
            shares[p.gpu_milli] += p.num_gpu  # num_gpu is 1 for a share (PodSpec enforces it)
    return whole, shares


def _share_lp(
    shares: Counter[int], bins: int, *, whole: int = 0, forced: Mapping[int, int] | None = None
) -> float:
    """Optimum of the relaxed packing LP on ``bins`` free GPUs (see the module docstring): up to
    ``whole`` of them may go to whole-GPU pods (1000 milli each); at least ``forced[s]`` shares of
    each size ``s`` must be placed."""
    if bins <= 0 or (not shares and whole <= 0):
        return 0.0
    forced = forced or {}
    big = sorted(s for s in shares if s > HALF)
    small = sorted(s for s in shares if s <= HALF)
    nb, nc = len(big), len(small)
    # Variables: w (GPUs for whole-GPU pods), y_b (nb), x_{b,c} for c <= 1000 - b, x_{E,c} (nc).
    pairs = [(i, j) for i, b in enumerate(big) for j, c in enumerate(small) if c <= GPU_MILLI - b]
    nx = len(pairs)
    nvar = 1 + nb + nx + nc
    ox, oe = 1 + nb, 1 + nb + nx  # first x_{b,c}, first x_{E,c}
    # Rows: 0 = GPUs for whole pods and big shares; 1..nb = residual beside each big size;
    # nb+1 = empty-GPU capacity; then the count of each small size, then its forced minimum.
    r_empty = nb + 1
    r_count, r_forced = r_empty + 1, r_empty + 1 + nc
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []

    def put(r: int, c: int, v: float) -> None:
        rows.append(r)
        cols.append(c)
        vals.append(v)

    put(0, 0, 1.0)
    put(r_empty, 0, float(GPU_MILLI))
    for i, b in enumerate(big):
        put(0, 1 + i, 1.0)
        put(1 + i, 1 + i, -float(GPU_MILLI - b))
        put(r_empty, 1 + i, float(GPU_MILLI))
    for k, (i, j) in enumerate(pairs):
        put(1 + i, ox + k, float(small[j]))
        put(r_count + j, ox + k, 1.0)
        put(r_forced + j, ox + k, -1.0)
    for j, c in enumerate(small):
        put(r_empty, oe + j, float(c))
        put(r_count + j, oe + j, 1.0)
        put(r_forced + j, oe + j, -1.0)
    nrow = r_forced + nc
    a_ub = sparse.csr_array((vals, (rows, cols)), shape=(nrow, nvar))
    b_ub = np.zeros(nrow)
    b_ub[0] = bins
    b_ub[r_empty] = float(GPU_MILLI) * bins
    b_ub[r_count:r_forced] = [shares[c] for c in small]
    b_ub[r_forced:] = [-forced.get(c, 0) for c in small]
    gain = np.array([GPU_MILLI] + big + [small[j] for _, j in pairs] + small, dtype=np.float64)
    lower = [0] + [forced.get(b, 0) for b in big] + [0] * (nx + nc)
    upper = (
        [whole] + [shares[b] for b in big] + [shares[small[j]] for _, j in pairs] + [shares[c] for c in small]
    )
    bounds = np.column_stack([np.array(lower, dtype=np.float64), np.array(upper, dtype=np.float64)])
    res = linprog(-gain, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if res.status != 0:
        raise RuntimeError(f"share LP did not solve: {res.message}")
    return float(-res.fun)


def _bfd(whole: list[int], shares: Counter[int], num_gpus: int) -> int:
    """Best-fit-decreasing: whole-GPU pods (most GPUs first), then shares biggest first."""
    free = num_gpus
    placed = 0
    for n in sorted(whole, reverse=True):
        if n <= free:
            free -= n
            placed += n * GPU_MILLI
    # cnt[r] = bins with r milli left; empty bins sit at r = 1000.
    cnt = np.zeros(GPU_MILLI + 1, dtype=np.int64)
    cnt[GPU_MILLI] = free
    for s in sorted(shares, reverse=True):
        for _ in range(shares[s]):
            open_ = np.flatnonzero(cnt[s:])
            if open_.size == 0:
                break  # no bin takes this size; smaller ones may still fit
            r = s + int(open_[0])
            cnt[r] -= 1
            cnt[r - s] += 1
            placed += s
    return placed


def online_best_fit(seq: Sequence[PodSpec], num_gpus: int, plan: PairingPlan | None = None) -> int:
    """Milli placed by an *online* best fit that ignores CPU, memory and node boundaries:
    pods in arrival order, whole-GPU pods on empty GPUs, each share on the fullest GPU it fits.
    Not a bound, but a yardstick for online placement: it sees exactly what a scheduler sees.

    With a pairing ``plan`` (see ``core.policies.pairing``) a share takes the fullest used GPU
    where it is on plan, else an idle GPU, else the fullest GPU it fits: the plan's rule alone,
    the yardstick for what pairing can do online without CPU and node limits."""
    cnt = np.zeros(GPU_MILLI + 1, dtype=np.int64)
    cnt[GPU_MILLI] = num_gpus
    used_of_free = GPU_MILLI - np.arange(GPU_MILLI + 1)
    placed = 0
    for p in seq:
        if p.num_gpu == 0 or p.gpu_milli == 0:
            continue
        if p.gpu_milli == GPU_MILLI:
            if cnt[GPU_MILLI] >= p.num_gpu:
                cnt[GPU_MILLI] -= p.num_gpu
                cnt[0] += p.num_gpu
                placed += p.gpu_demand_milli
            continue
        s = p.gpu_milli
        has = cnt[s:] > 0  # by free milli f = s + index
        fits = plan.fits(s) if plan is not None else None
        if fits is not None:
            on = has & fits[used_of_free[s:]]
            on[-1] = False  # the idle GPU comes second, not by fullness
            if on.any():
                has = on
            elif has[-1]:
                has = np.zeros_like(has)
                has[-1] = True
        open_ = np.flatnonzero(has)
        if open_.size:
            r = s + int(open_[0])
            cnt[r] -= 1
            cnt[r - s] += 1
            placed += s
    return placed


def packing_bound(pods: Sequence[PodSpec], num_gpus: int) -> Bound:
    """The LP ceiling and the BFD packing for ``pods`` on ``num_gpus`` GPUs."""
    if num_gpus <= 0:
        raise InvalidInput(f"packing_bound: num_gpus must be positive, got {num_gpus}")
    whole, shares = _split(pods)
    lp_milli = _lp_milli(whole, shares, num_gpus)
    return Bound(lp_milli=lp_milli, bfd_milli=_bfd(whole, shares, num_gpus), total_milli=num_gpus * GPU_MILLI)


def _lp_milli(whole: list[int], shares: Counter[int], num_gpus: int) -> int:
    """The LP ceiling in milli: whole-GPU pods on as many GPUs as they fill, the share LP's floor
    on the rest, capped by the two trivial ceilings, cluster capacity and total demand."""
    whole_gpus = min(sum(whole), num_gpus)
    lp = _share_lp(shares, num_gpus - whole_gpus)
    demand = sum(whole) * GPU_MILLI + sum(s * n for s, n in shares.items())
    return min(whole_gpus * GPU_MILLI + _floor(lp), num_gpus * GPU_MILLI, demand)


def forced_shares(seq: Sequence[PodSpec], num_gpus: int) -> Counter[int]:
    """Shares of ``seq`` (in arrival order) that arrive while some GPU must still be idle: the
    pods before them touch fewer than ``num_gpus`` GPUs, whatever the scheduler did with them.
    Only shares free to use any GPU count (no GPU-model, GPU-memory or node-selector constraint;
    the relaxed cluster has no taints)."""
    forced: Counter[int] = Counter()
    touched = 0
    for p in seq:
        if p.num_gpu <= 0 or p.gpu_milli <= 0:
            continue
        if touched >= num_gpus:
            break
        if p.gpu_milli < GPU_MILLI and not (
            p.gpu_models or p.gpu_memory_mib or p.node_selector or p.node_affinity
        ):
            forced[p.gpu_milli] += 1  # a constrained share might not fit the idle GPU
        touched += p.num_gpu
    return forced


def arrival_bound(seq: Sequence[PodSpec], num_gpus: int) -> int:
    """Ceiling (milli) for any scheduler that places each pod of ``seq`` which fits when it
    arrives, on the relaxed cluster (see the module docstring); at most ``packing_bound``'s."""
    if num_gpus <= 0:
        raise InvalidInput(f"arrival_bound: num_gpus must be positive, got {num_gpus}")
    whole, shares = _split(seq)
    lp = _share_lp(shares, num_gpus, whole=min(sum(whole), num_gpus), forced=forced_shares(seq, num_gpus))
    return min(_floor(lp), _lp_milli(whole, shares, num_gpus))  # the LP without the BFD packing


def _floor(lp: float) -> int:
    """Floor an LP optimum with a little slack for solver tolerance (a ceiling may err up, not down)."""
    return math.floor(lp + 1e-7 * max(1.0, lp) + 1e-6)


def arrived_prefix(seq: Sequence[PodSpec], num_gpus: int, pct: float) -> int:
    """Length of the prefix of ``seq`` up to and including the first pod at which cumulative
    arrived GPU milli reaches ``pct`` % of the cluster (all of ``seq`` if it never does)."""
    if num_gpus <= 0:
        raise InvalidInput(f"bound_at: num_gpus must be positive, got {num_gpus}")
    arrived = np.cumsum(np.fromiter((p.gpu_demand_milli for p in seq), dtype=np.int64, count=len(seq)))
    threshold = pct * num_gpus * GPU_MILLI / 100
    i = int(np.searchsorted(arrived, threshold, side="left"))
    return min(i + 1, len(seq))


def bound_at(seq: Sequence[PodSpec], num_gpus: int, pct: float) -> Bound:
    """``packing_bound`` of the pods of a paper-protocol stream that have arrived by ``pct`` %."""
    return packing_bound(seq[: arrived_prefix(seq, num_gpus, pct)], num_gpus)
