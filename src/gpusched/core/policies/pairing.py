"""Which GPU shares should sit together: a pairing plan learnt from the target workload.

Best fit puts a share into the fullest GPU it fits. Online that pairs shares by arrival, not by
size: a 470 takes the 680 milli free beside a lone 320 (210 left, which few pods fit) although a
650 would have left 30 there and a second 470 beside it 60. Offline, a packing that sorts the
shares first pairs them far better; the gap on the Alibaba trace is about 0.4 % of the cluster.

The plan closes that gap without knowing the future (default trace, without CPU and node limits:
online best fit 95.92 %, the plan's rule 96.30 %, offline BFD 96.30 %; ``gpusched bench
packing``). It solves the cutting-stock linear
program of the workload's share sizes: cover every share, in proportion to how often it occurs,
with *patterns* (multisets of sizes that fit one GPU, at most ``max_items`` of them) at least
waste. The patterns with zero reduced cost are the ones some optimal packing uses; they are *on
plan*. A share of size ``s`` joining a GPU that already holds ``u`` milli is on plan when some
on-plan pattern holds ``s`` beside shares that sum to ``u``. An idle GPU is always on plan.

The scorer makes off-plan placements cost extra, so a share opens an idle GPU rather than spoil
a GPU that is waiting for its partner, and still goes off plan when that is all that fits. Only
a GPU's used milli is read, never which pods hold it, so the rule is the same in every front end.

Sizes beyond ``max_sizes`` (the rarest) are left out of the plan: for them every GPU is on plan.
The plan is solved once per target workload (a few milliseconds on the Alibaba traces).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import linprog

from gpusched.core.cluster import I64, BoolArr
from gpusched.core.fragmentation import TargetWorkload, TypeKey
from gpusched.core.model import GPU_MILLI

Pattern = tuple[int, ...]

_MAX_PATTERNS = 20_000
"""Above this many candidate patterns (dozens of sizes) the plan allows fewer shares per GPU:
the LP stays well under a second, and pairs and triples are where the gain is."""


def _fit_table(sizes: list[int], on_plan: tuple[Pattern, ...]) -> dict[int, BoolArr]:
    """Per size s: which used milli u a GPU may hold for s to join it on plan (u = 0 always)."""
    table = {s: np.zeros(GPU_MILLI + 1, dtype=bool) for s in sizes}
    for out in table.values():
        out[0] = True
    for p in on_plan:
        for i, s in enumerate(p):
            if i and p[i - 1] == s:
                continue  # one copy of s stands for all
            rest = p[:i] + p[i + 1 :]
            for k in range(1, len(rest) + 1):
                for sub in itertools.combinations(rest, k):
                    table[s][sum(sub)] = True
    return table


class _TooMany(Exception):
    pass


def patterns(sizes: list[int], max_items: int, limit: int | None = None) -> list[Pattern] | None:
    """Every multiset of ``sizes`` with 1..``max_items`` members that fits one GPU, ascending;
    None as soon as there are more than ``limit`` of them."""
    sizes = sorted(set(sizes))
    out: list[Pattern] = []

    def grow(start: int, cur: list[int], total: int) -> None:
        if cur:
            out.append(tuple(cur))
            if limit is not None and len(out) > limit:
                raise _TooMany
        if len(cur) == max_items:
            return
        for i in range(start, len(sizes)):
            if total + sizes[i] > GPU_MILLI:
                break
            cur.append(sizes[i])
            grow(i, cur, total + sizes[i])
            cur.pop()

    try:
        grow(0, [], 0)
    except _TooMany:
        return None
    return out


@dataclass(frozen=True)
class PairingPlan:
    counts: tuple[tuple[int, float], ...]
    """Share size (milli) and how often the workload asks for it, for the planned sizes."""
    on_plan_patterns: tuple[Pattern, ...]
    waste_milli: float
    """The LP's optimum: idle milli left beside the shares, packed in the best proportions."""
    gpus: float
    """GPUs that optimum fills (both in the units of ``counts``)."""
    _fits: dict[int, BoolArr] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def empty(cls) -> PairingPlan:
        return cls((), (), 0.0, 0.0)

    @classmethod
    def from_counts(
        cls,
        counts: Mapping[int, float],
        *,
        max_items: int = 4,
        max_sizes: int = 128,
        head_sizes: int = 32,
    ) -> PairingPlan:
        """Plan for shares of these sizes (milli, 0 < s < 1000) occurring this often (pod
        counts or shares of the workload: only the proportions matter). The ``head_sizes``
        most frequent sizes combine in patterns of up to ``max_items`` shares; the rarer ones,
        up to ``max_sizes`` in all, pair with one other share at most."""
        bad = [s for s in counts if not 0 < s < GPU_MILLI]
        if bad:
            raise ValueError(f"share sizes must be between 1 and {GPU_MILLI - 1} milli, got {sorted(bad)}")
        negative = sorted(s for s, c in counts.items() if c < 0)
        if negative:
            raise ValueError(f"share counts must not be negative; sizes {negative} have negative counts")
        kept = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:max_sizes]
        kept = [(s, c) for s, c in kept if c > 0]
        if not kept:
            return cls.empty()
        sizes = sorted(s for s, _ in kept)
        col = {s: i for i, s in enumerate(sizes)}
        head = sorted(s for s, _ in kept[:head_sizes])
        # many head sizes: fewer shares per pattern keep the LP small (pairs always fit the limit)
        pats = None
        while pats is None:
            pats = patterns(head, max_items, None if max_items <= 2 else _MAX_PATTERNS)
            max_items -= 1
        tail = [s for s, _ in kept[head_sizes:]]
        pats += [(t,) for t in tail]
        pats += sorted({tuple(sorted((t, s))) for t in tail for s in sizes if t + s <= GPU_MILLI})
        a = np.zeros((len(sizes), len(pats)))
        for j, p in enumerate(pats):
            for s in p:
                a[col[s], j] += 1
        weight = dict(kept)
        b = np.array([weight[s] for s in sizes], dtype=np.float64)
        cost = np.array([GPU_MILLI - sum(p) for p in pats], dtype=np.float64)
        res = linprog(cost, A_eq=a, b_eq=b, bounds=(0, None), method="highs")
        if res.status != 0:  # cannot happen (singletons make every cover feasible); stay neutral if it does
            return cls.empty()
        reduced = cost - a.T @ res.eqlin.marginals
        on = tuple(p for p, rc in zip(pats, reduced, strict=True) if rc <= 1e-6 * GPU_MILLI)
        return cls(tuple(sorted(kept)), on, float(res.fun), float(res.x.sum()), _fit_table(sizes, on))

    @classmethod
    def from_workload(cls, tw: TargetWorkload, **kw: int) -> PairingPlan:
        """Plan for the shares of every type of ``tw``, the rare ones too."""
        seen: list[tuple[TypeKey, float]] = list(tw.counts) or list(zip(tw.keys, tw.p.tolist(), strict=True))
        counts: dict[int, float] = {}
        for (_, milli, num, _), n in seen:
            if num == 1 and 0 < milli < GPU_MILLI:
                counts[milli] = counts.get(milli, 0.0) + n
        return cls.from_counts(counts, **kw)

    def fits(self, milli: int) -> BoolArr | None:
        """``out[u]``: a share of ``milli`` joining a GPU that holds ``u`` milli is on plan.
        None when the plan has no opinion on this size."""
        return self._fits.get(milli)

    def off_plan(self, milli: int, used: I64) -> BoolArr:
        """Vectorised: a share of ``milli`` joining GPUs that hold ``used`` milli goes off plan."""
        f = self.fits(milli)
        if f is None:
            return np.zeros(np.shape(used), dtype=bool)
        return ~f[np.minimum(np.maximum(used, 0), GPU_MILLI)]  # np.clip costs a few µs more
