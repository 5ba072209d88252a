"""A doctor snapshot of a simulated cluster: the paper protocol's pod stream for one policy and
seed (``sim.paper``: the same sequence, profile and tie-break as ``run_paper``) run through the
core, then the books at the end and the pods that did not fit, written as ``snapshot`` does.
This is what ``gpusched simulate --snapshot FILE`` saves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.doctor.snapshot import save_snapshot
from gpusched.sim.paper import build_sequence, tie_ranks
from gpusched.sim.traces import TracePod

MAX_PENDING = 500
"""Pods left pending written at most (the first to fail): the paper protocol overloads the
cluster on purpose, and doctor needs a few, not thousands."""


def paper_books(
    nodes: Sequence[NodeSpec], pods: Sequence[PodSpec], policy: str, seed: int, *, tune: float = 1.3
) -> tuple[ClusterState, list[PodSpec]]:
    """The books after the paper protocol's stream, and the pods that did not fit (in order)."""
    snap = ClusterState(nodes)
    tw = TargetWorkload.from_pods(pods)
    profile = make_profile(policy, PolicyContext(workload=tw, rng=np.random.default_rng([seed, 0xABC])))
    ranks = tie_ranks(nodes, seed)
    failed: list[PodSpec] = []
    for pod in build_sequence(pods, snap.total_gpu_milli, seed, tune):
        r = schedule_one(profile, pod, snap, tiebreak=ranks, diagnose_failures=False)
        if not r.scheduled and pod.key not in snap.allocations:
            failed.append(pod)
    return snap, failed


def save_paper_snapshot(
    path: Path | str,
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec | TracePod],
    policy: str,
    seed: int,
    *,
    tune: float = 1.3,
    max_pending: int = MAX_PENDING,
) -> Path:
    specs = [p.spec if isinstance(p, TracePod) else p for p in pods]
    snap, failed = paper_books(nodes, specs, policy, seed, tune=tune)
    seen: set[str] = set()
    pending: list[PodSpec] = []
    for p in failed:
        if p.key not in seen and len(pending) < max_pending:
            seen.add(p.key)
            pending.append(p)
    source = f"gpusched simulate ({policy}, seed {seed}, tune {tune})"
    return save_snapshot(path, snap, pending, source=source)
