"""A queue's status, typed, for the front ends to publish (the Queue object's status, metrics)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpusched.core.queues.quota import QueueBook
from gpusched.core.queues.spec import ANY_MODEL, ResourceKey
from gpusched.core.queues.usage import Usage


@dataclass(frozen=True, slots=True)
class QueueStatus:
    """``usage``: what its pods (and its children's) are charged; ``borrowed``: per limited key,
    how far it is over its own quota; ``quota``: its subtree quota per limited key; ``pending``:
    pods waiting in it; ``admitted``: pods charged to it (leaves only)."""

    name: str
    usage: Usage
    borrowed: Mapping[ResourceKey, int]
    quota: Mapping[ResourceKey, int]
    pending: int
    admitted: int

    def gpus_used(self) -> int:
        """Whole GPUs in use plus shares rounded down (milli // 1000), for the gpus gauges."""
        return max(self.usage.get("gpus"), self.usage.get("gpu_milli") // 1000)

    def gpus_quota(self) -> int:
        """The GPU quota (whole GPUs, else milli // 1000); 0 when GPUs are not limited."""
        q = self.quota.get(ResourceKey(ANY_MODEL, "gpus"))
        if q is None:
            q = self.quota.get(ResourceKey(ANY_MODEL, "gpu_milli"), 0) // 1000
        return q


def queue_statuses(book: QueueBook, pending: Mapping[str, int]) -> list[QueueStatus]:
    """The status of every queue, by name; ``pending`` counts waiting pods per leaf queue
    (an inner queue counts its leaves')."""
    tree = book.tree
    counts: dict[str, int] = {}
    for _pod, (q, _u) in book.charged.items():
        counts[q] = counts.get(q, 0) + 1
    out = []
    for name in sorted(tree.specs):
        under = [q for q in tree.specs if name in tree.paths[q]]
        out.append(
            QueueStatus(
                name,
                book.usage(name),
                {k: v for k, v in book.borrowed(name).items() if v},
                {k: c.subtree for k, c in book.cap[name].items()},
                sum(pending.get(q, 0) for q in under),
                sum(counts.get(q, 0) for q in under),
            )
        )
    return out
