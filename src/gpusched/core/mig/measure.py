"""MIG fragmentation: the free memory slices a GPU cannot give to the demand it is likely to see.

In the spirit of FGD (Weng et al., ATC '23; ../shared/reference/fragmentation-gradient-descent.md): for one
GPU state and one profile p, the *lost* slices are the free memory slices that instances of p cannot cover::

    lost_p(state) = free(state) - size_p * fit_p(state)

where ``fit_p`` is how many more instances of p the GPU can take (free legal starts, SM slices left, at most
one ``+me``; one profile's own placements never overlap, so these bounds are exact). A GPU's fragmentation is
the expectation over the demand mix seen so far, kept as integer request counts ``w_p``::

    F(state) = sum_p w_p * lost_p(state)

(an integer: the expectation times the number of requests seen). Placement picks the GPU and start with the
least growth of F. A profile the model lacks adds nothing: no placement on that GPU changes what it loses.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from gpusched.core.mig.geometry import CODES, ME_BIT, SM_SHIFT, Geometry, free_slices
from gpusched.core.mig.profiles import Kind, layout

I64 = npt.NDArray[np.int64]


def fit_count(geom: Geometry, code: int, kind: Kind) -> int:
    """How many more ``kind`` instances a GPU in state ``code`` can take."""
    starts = sum(1 for s in kind.starts if not code & (((1 << kind.mem_slices) - 1) << s))
    sm_left = geom.sm_slices - ((code >> SM_SHIFT) & 0xF)
    n = min(starts, max(sm_left, 0) // kind.sm_slices, kind.max_count)
    if kind.key == "1g+me" and code & ME_BIT:
        n = 0
    return n


def lost_slices(geom: Geometry, code: int, kind: Kind) -> int:
    return free_slices(geom, code) - kind.mem_slices * fit_count(geom, code, kind)


@functools.cache
def lost_table(model: str) -> I64:
    """``table[code, j]``: lost slices of state ``code`` for the j-th kind of ``layout(model)``."""
    geom = Geometry.of(model)
    kinds = layout(model)
    t = np.zeros((CODES, len(kinds)), dtype=np.int64)
    for code in range(CODES):
        if (code >> SM_SHIFT) & 0xF > geom.sm_slices or (code & 0xFF) >> geom.mem_slices:
            continue  # no GPU is ever in this state
        for j, k in enumerate(kinds):
            t[code, j] = lost_slices(geom, code, k)
    t.setflags(write=False)
    return t


class DemandMix:
    """Requests seen so far, counted per profile name (the measure's weights)."""

    def __init__(self, profiles: Iterable[str] = ()) -> None:
        self._counts: Counter[str] = Counter(profiles)

    def add(self, profile: str, n: int = 1) -> None:
        if n < 0:
            raise ValueError(f"a demand count cannot be negative: {n}")
        self._counts[profile] += n

    def count(self, profile: str) -> int:
        return self._counts[profile]

    @property
    def total(self) -> int:
        return sum(self._counts.values())

    def weights(self, geom: Geometry) -> I64:
        """Integer weight per kind of ``geom``'s layout; names the model lacks weigh nothing here."""
        w = np.zeros(len(layout(geom.model)), dtype=np.int64)
        for name, c in self._counts.items():
            if name in geom.kinds:
                w[geom.profile_index(name)] += c
        return w


def fragmentation(geom: Geometry, code: int, demand: DemandMix) -> int:
    """F(state): the weighted lost slices of one GPU."""
    return int(lost_table(geom.model)[code] @ demand.weights(geom))


def frag_by_code(geom: Geometry, demand: DemandMix) -> I64:
    """F for every state code of ``geom`` under ``demand`` (one matrix-vector product)."""
    out: I64 = lost_table(geom.model) @ demand.weights(geom)
    return out
