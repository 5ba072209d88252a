"""A doctor snapshot of a simulated cluster: the paper protocol's pod stream for one policy and
seed (``core.protocol``: the same sequence, profile and tie-break as ``sim.paper.run_paper``) run
through the core, then the books at the end and the pods that did not fit, written as ``snapshot``
does. This is what ``gpusched simulate --snapshot FILE`` saves. The doctor never imports the
simulator (an import-linter contract): the protocol's inputs are the core's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpusched.core.cluster import ClusterState
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.protocol import paper_setup
from gpusched.core.scheduler import schedule_one
from gpusched.doctor.snapshot import save_snapshot

MAX_PENDING = 500
"""Pods left pending written at most (the first to fail): the paper protocol overloads the
cluster on purpose, and doctor needs a few, not thousands."""


def paper_books(
    nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], policy: str, seed: int, *, tune: float = 1.3
) -> tuple[ClusterState, list[PodSpec]]:
    """The books after the paper protocol's stream, and the pods that did not fit (in order)."""
    setup = paper_setup(nodes, pods, policy, seed, tune=tune)
    snap = setup.snap
    failed: list[PodSpec] = []
    for pod in setup.sequence:
        r = schedule_one(setup.profile, pod, snap, tiebreak=setup.ranks, diagnose_failures=False)
        if not r.scheduled and pod.key not in snap.allocations:
            failed.append(pod)
    return snap, failed


def save_paper_snapshot(
    path: Path | str,
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    policy: str,
    seed: int,
    *,
    tune: float = 1.3,
    max_pending: int = MAX_PENDING,
) -> Path:
    snap, failed = paper_books(nodes, pods, policy, seed, tune=tune)
    seen: set[str] = set()
    pending: list[PodSpec] = []
    for p in failed:
        if p.key not in seen and len(pending) < max_pending:
            seen.add(p.key)
            pending.append(p)
    source = f"gpusched simulate ({policy}, seed {seed}, tune {tune})"
    return save_snapshot(path, snap, pending, source=source)
