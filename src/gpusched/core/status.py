"""Status codes of the plugin framework, after kube-scheduler's ``framework.Status``."""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass


class Code(enum.IntEnum):
    SUCCESS = 0
    ERROR = 1
    UNSCHEDULABLE = 2
    """The pod does not fit now; evicting pods (preemption) might make room."""
    UNSCHEDULABLE_AND_UNRESOLVABLE = 3
    """The pod cannot fit on this node whatever is evicted (wrong model, too few GPUs, taint)."""
    SKIP = 5


@dataclass(frozen=True, slots=True)
class Status:
    code: Code = Code.SUCCESS
    reasons: tuple[str, ...] = ()
    plugin: str = ""

    @property
    def ok(self) -> bool:
        return self.code == Code.SUCCESS

    @classmethod
    def success(cls) -> Status:
        return _SUCCESS

    @classmethod
    def unschedulable(cls, reason: str, plugin: str = "", resolvable: bool = True) -> Status:
        code = Code.UNSCHEDULABLE if resolvable else Code.UNSCHEDULABLE_AND_UNRESOLVABLE
        return cls(code, (reason,), plugin)

    def message(self) -> str:
        return "; ".join(self.reasons) if self.reasons else self.code.name


_SUCCESS = Status()


@dataclass(frozen=True, slots=True)
class NodeFailure:
    node: str
    reason: str
    code: Code
    plugin: str


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Why a pod fits nowhere: one reason per node, as kube-scheduler reports it."""

    num_nodes: int
    failures: tuple[NodeFailure, ...]
    pre_filter: Status | None = None

    def reason_counts(self) -> Mapping[str, int]:
        return Counter(f.reason for f in self.failures)

    def unresolvable_nodes(self) -> frozenset[str]:
        return frozenset(f.node for f in self.failures if f.code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE)

    def message(self) -> str:
        """``0/40 nodes are available: 12 Insufficient GPU memory, 28 Insufficient cpu.``

        As kube-scheduler's FitError: ``<count> <reason>`` strings sorted lexicographically."""
        if self.pre_filter is not None and not self.pre_filter.ok:
            return f"0/{self.num_nodes} nodes are available: {self.pre_filter.message()}."
        parts = ", ".join(sorted(f"{n} {r}" for r, n in self.reason_counts().items()))
        return f"0/{self.num_nodes} nodes are available: {parts}." if parts else f"0/{self.num_nodes} nodes."
