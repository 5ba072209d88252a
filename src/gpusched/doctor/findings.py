"""Doctor's answers, typed: findings with their evidence, counterfactuals, and the reports."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

LEVELS = ("node", "device", "scheduling", "counterfactual")
"""The three levels of the diagnosis (node; device plugin / container; scheduling), then what
would make the pod fit."""
SEVERITIES = ("ok", "info", "warn", "error")


@dataclass(frozen=True)
class Finding:
    """One thing doctor found: its ``level``, how bad (``severity``), a stable ``code`` (for
    scripts and tests), one line of ``message`` and the ``evidence`` it was read from."""

    level: str
    severity: str
    code: str
    message: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    subject: str = ""  # the node or pod it is about

    def __post_init__(self) -> None:
        assert self.level in LEVELS, self.level
        assert self.severity in SEVERITIES, self.severity

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Counterfactual:
    """A change after which the pod fits, checked on a copy of the books (``verified``): for
    ``quota``, the core's queue admission on a book with the raised quota.

    ``kind``: fits-now, quota, queue (its queue is unknown or invalid: not checked), toleration,
    gpu-model, gpu-memory, gpu-count, moves, kept (no move plan: the pods that may not move),
    healthy-gpu, claimed-gpu, mig-recut (a GPU's free MIG slices re-cut), none. ``cost`` orders them:
    the smallest change first (a move counts one per pod
    moved)."""

    kind: str
    message: str
    cost: int
    verified: bool
    node: str = ""
    change: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PodReport:
    pod: str
    phase: str
    node: str
    findings: tuple[Finding, ...]
    counterfactuals: tuple[Counterfactual, ...] = ()
    summary: str = ""
    reasons: Mapping[str, int] = field(default_factory=dict)
    """Per-node reasons grouped as kube-scheduler groups them (reason -> nodes)."""

    @property
    def cause(self) -> str:
        """The codes of the errors found (the causes named), most important first."""
        return ",".join(f.code for f in self.findings if f.severity == "error")

    def to_dict(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "phase": self.phase,
            "node": self.node,
            "summary": self.summary,
            "reasons": dict(self.reasons),
            "findings": [f.to_dict() for f in self.findings],
            "counterfactuals": [c.to_dict() for c in self.counterfactuals],
        }


@dataclass(frozen=True)
class NodeReport:
    node: str
    findings: tuple[Finding, ...]
    gpus: tuple[Mapping[str, Any], ...] = ()
    mig: tuple[Mapping[str, Any], ...] = ()
    """Per MIG GPU: its slices (profile, start, size) and the pod holding each or None (``doctor.mig``)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "findings": [f.to_dict() for f in self.findings],
            "gpus": list(self.gpus),
            "mig": list(self.mig),
        }


@dataclass(frozen=True)
class ClusterReport:
    nodes: int
    gpus: int
    pending: int
    top_reasons: tuple[tuple[str, int], ...]
    """The reasons pending pods wait, by how many pods they stop (a pod counts each of its
    grouped reasons once)."""
    stranded_by_model: Mapping[str, Mapping[str, float]]
    """Per GPU model: free milli-GPU, and the part of it the workload cannot use (stranded)."""
    findings: tuple[Finding, ...]
    pending_pods: tuple[Mapping[str, Any], ...] = ()
    queues: tuple[Mapping[str, Any], ...] = ()
    """Per tenant queue: usage, quota and borrowed per key, admitted and pending pods (invalid
    ones with why); empty when the cluster has no Queues."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus": self.gpus,
            "pending": self.pending,
            "top_reasons": [{"reason": r, "pods": n} for r, n in self.top_reasons],
            "stranded_by_model": {m: dict(v) for m, v in self.stranded_by_model.items()},
            "findings": [f.to_dict() for f in self.findings],
            "pending_pods": list(self.pending_pods),
            "queues": list(self.queues),
        }
