"""Fair sharing of the surplus by weight, with dominant resource fairness (DRF).

What a queue uses beyond its own quota is surplus borrowed from its cohort. Its *dominant share*
is the largest, over the limited keys of its tree (GPU count, GPU milli, GPU memory), of that
borrowed amount as a fraction of the root's quota, divided by the queue's weight (Kueue's
dominant resource share, Volcano's drf plugin, KAI's over-quota weight). A cycle offers the
surplus to the queue with the smallest dominant share first (``surplus_order``), so over time
each borrowing queue holds surplus in proportion to its weight, on its dominant resource.

``water_fill`` is the reference: the integer max-min fair division of a capacity by weight among
demands (each first gets up to its guarantee), against which the simulator measures GPU-hours.
Fractions are exact rationals (no floats in the core).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from gpusched.core.queues.quota import QueueBook
from gpusched.core.queues.usage import Usage


def dominant_share(book: QueueBook, queue: str, extra: Usage | None = None) -> Fraction:
    """The weighted dominant share of leaf ``queue`` (with ``extra`` charged): 0 within quota."""
    root = book.tree.root(queue)
    best = Fraction(0)
    for key in book.tree.keys(queue):
        total = book.cap[root][key].subtree
        if total <= 0:
            continue
        used = book.demand[queue][key] + (extra[key] if extra is not None else 0)
        over = used - book.cap[queue][key].subtree
        if over > 0:
            best = max(best, Fraction(over, total))
    return best / book.tree.specs[queue].weight


def surplus_order(book: QueueBook, queue: str, extra: Usage) -> tuple[int, Fraction]:
    """Sort key of a pending unit of ``queue`` charged ``extra``: units that stay within their
    queue's quota first (guaranteed), then by the dominant share the queue would have."""
    share = dominant_share(book, queue, extra)
    return (0 if share == 0 else 1, share)


def water_fill(
    capacity: int, demands: Mapping[str, int], guaranteed: Mapping[str, int], weights: Mapping[str, int]
) -> dict[str, int]:
    """Integer max-min fair shares of ``capacity``: each name first gets ``min(demand,
    guaranteed)``; what is left goes out by weight to names still short of their demand, one round
    at a time (a name's piece is capped at its demand; units left over by rounding go one each, to
    the heaviest first). Never more than a name demands; the sum never exceeds ``capacity``."""
    share = {n: min(d, guaranteed.get(n, 0)) for n, d in demands.items()}
    left = capacity - sum(share.values())
    if left < 0:  # guarantees over capacity: scale down by demand order (cannot happen in a valid tree)
        return {n: 0 for n in demands} if capacity <= 0 else _cap(share, capacity)
    while left > 0:
        hungry = [n for n in sorted(demands) if share[n] < demands[n]]
        if not hungry:
            break
        wsum = sum(weights.get(n, 1) for n in hungry)
        given = 0
        for n in hungry:
            piece = min(left * weights.get(n, 1) // wsum, demands[n] - share[n])
            share[n] += piece
            given += piece
        if given == 0:
            for n in sorted(hungry, key=lambda n: (-weights.get(n, 1), n)):
                if left - given == 0:
                    break
                share[n] += 1
                given += 1
        left -= given
    return share


def _cap(share: dict[str, int], capacity: int) -> dict[str, int]:
    out, left = {}, capacity
    for n in sorted(share):
        out[n] = min(share[n], left)
        left -= out[n]
    return out
