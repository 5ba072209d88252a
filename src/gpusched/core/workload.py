"""Where the target workload of the fragmentation-aware policies (``default``, ``fgd``) comes
from, for every front end: ``WorkloadSource``.

- a fixed workload, when one is given (``--workload-trace``);
- else learnt from the pods seen (the standalone scheduler: bound and pending pods);
- else, before any pod is seen or for a front end that sees pods one at a time (the extender),
  the typical workload below.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpusched.core.fragmentation import TargetWorkload, TypeKey
from gpusched.core.model import PodSpec

TYPICAL: tuple[tuple[int, int, int, int], ...] = (
    (8000, 810, 1, 1078),
    (8000, 470, 1, 750),
    (8000, 320, 1, 328),
    (8000, 650, 1, 253),
    (8000, 230, 1, 140),
    (8000, 460, 1, 128),
    (8000, 1000, 1, 3911),
    (16000, 1000, 2, 16),
    (32000, 1000, 4, 15),
    (64000, 1000, 8, 44),
    (8000, 0, 0, 1088),
)
"""Typical pod types when nothing better is known: the published mix of the Alibaba GPU trace
2023 (share sizes and counts, whole-GPU pods by GPU count, CPU-only pods), at 8 cores per GPU.
Rows: (cpu milli, gpu milli, GPUs, count)."""


def typical_workload() -> TargetWorkload:
    """The fixed default target workload (``TYPICAL``)."""
    counts: Counter[TypeKey] = Counter({(cpu, milli, num, frozenset()): n for cpu, milli, num, n in TYPICAL})
    return TargetWorkload.from_counts(counts)


class WorkloadSource:
    """The target workload of one front end: ``fixed`` when given, else learnt from pods."""

    __slots__ = ("fixed",)

    def __init__(self, fixed: TargetWorkload | None = None) -> None:
        self.fixed = fixed

    @property
    def learns(self) -> bool:
        """Whether the workload follows the pods seen (no fixed one was given)."""
        return self.fixed is None

    def learnt(self, pods: Iterable[PodSpec]) -> TargetWorkload | None:
        """The fixed workload, else the one ``pods`` show; None when there is neither."""
        if self.fixed is not None:
            return self.fixed
        seen = list(pods)
        return TargetWorkload.from_pods(seen) if seen else None

    def current(self, pods: Iterable[PodSpec] = ()) -> TargetWorkload:
        """As ``learnt``, falling back on the typical workload."""
        return self.learnt(pods) or typical_workload()
