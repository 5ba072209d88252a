"""Placement policies, each a Score plugin, and the profiles that enable them by name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gpusched.core.disruption import DisruptionBudgets
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import (
    FilterPlugin,
    PreFilterPlugin,
    Profile,
    ReservePlugin,
    ScorePlugin,
    WeightedPreference,
    WeightedScore,
)
from gpusched.core.plugins.dynamicresources import DynamicResources
from gpusched.core.plugins.gpufit import GPUFit
from gpusched.core.plugins.gputopology import GpuTopologyPreference
from gpusched.core.plugins.interpodaffinity import InterPodAffinity
from gpusched.core.plugins.nodeaffinity import NodeAffinity
from gpusched.core.plugins.noderesources import NodeResourcesFit
from gpusched.core.plugins.podtopologyspread import PodTopologySpread
from gpusched.core.plugins.preemption import DefaultPreemption
from gpusched.core.plugins.tainttoleration import TaintToleration
from gpusched.core.policies.bestfit import BestFitScore
from gpusched.core.policies.clustering import GpuClusteringScore
from gpusched.core.policies.default import DefaultScore
from gpusched.core.policies.dotprod import DotProductScore
from gpusched.core.policies.fgd import FGDScore
from gpusched.core.policies.packing import GpuPackingScore
from gpusched.core.policies.random import RandomScore


@dataclass(frozen=True)
class PolicyContext:
    """What a policy may be built from: the target workload (for fragmentation-aware
    policies) and a seeded random generator (for the random policy)."""

    workload: TargetWorkload | None = None
    rng: np.random.Generator | None = None

    def need_workload(self, policy: str) -> TargetWorkload:
        if self.workload is None:
            raise ValueError(f"policy {policy!r} needs a target workload (a pod list to learn it from)")
        return self.workload


def _default(ctx: PolicyContext) -> ScorePlugin:
    return DefaultScore(ctx.need_workload("default"))


_FACTORIES: dict[str, Callable[[PolicyContext], ScorePlugin]] = {
    "random": lambda ctx: RandomScore(ctx.rng if ctx.rng is not None else np.random.default_rng(0)),
    "dotprod": lambda ctx: DotProductScore(),
    "packing": lambda ctx: GpuPackingScore(),
    "clustering": lambda ctx: GpuClusteringScore(),
    "bestfit": lambda ctx: BestFitScore(),
    "fgd": lambda ctx: FGDScore(ctx.need_workload("fgd")),
    "default": _default,
}

POLICIES: tuple[str, ...] = tuple(_FACTORIES)


def standard_filters() -> tuple[FilterPlugin, ...]:
    """kube-scheduler's filters that apply here, and the GPU fit; the pod-placement constraints
    (spread, pod affinity) last, as they cost a pass over the running pods."""
    return (
        NodeResourcesFit(),
        GPUFit(),
        NodeAffinity(),
        TaintToleration(),
        PodTopologySpread(),
        InterPodAffinity(),
        DynamicResources(),
    )


def standard_preferences() -> tuple[WeightedPreference, ...]:
    """The soft constraints, with kube-scheduler's default weights of the same plugins."""
    return (
        WeightedPreference(TaintToleration(), 3.0),
        WeightedPreference(NodeAffinity(), 2.0),
        WeightedPreference(PodTopologySpread(), 2.0),
        WeightedPreference(InterPodAffinity(), 2.0),
        WeightedPreference(GpuTopologyPreference(), 1.0),
        WeightedPreference(DynamicResources(), 1.0),  # DRA claims pack onto used nodes and GPUs
    )


def make_profile(
    policy: str,
    ctx: PolicyContext | None = None,
    *,
    preemption: bool = False,
    budgets: Callable[[], DisruptionBudgets] | None = None,
) -> Profile:
    """A profile with the standard filters and preferences and ``policy`` as its only score
    plugin; with ``preemption``, DefaultPreemption as its PostFilter (honouring the disruption
    budgets ``budgets()`` returns, when given)."""
    if policy not in _FACTORIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    plugin = _FACTORIES[policy](ctx or PolicyContext())
    workload = plugin.workload if isinstance(plugin, (DefaultScore, FGDScore)) else None
    return profile_of(policy, (WeightedScore(plugin, 1.0),), workload, preemption=preemption, budgets=budgets)


def profile_of(
    name: str,
    scores: tuple[WeightedScore, ...],
    workload: TargetWorkload | None = None,
    *,
    preemption: bool = False,
    budgets: Callable[[], DisruptionBudgets] | None = None,
) -> Profile:
    """A profile with the standard filters and preferences and the given score plugins (what
    ``make_profile`` builds for a named policy; ``sim.stacks`` builds other systems' scoring)."""
    filters = standard_filters()
    post = (DefaultPreemption(filters, budgets=budgets),) if preemption else ()
    return Profile(
        name=name,
        pre_filters=tuple(f for f in filters if isinstance(f, PreFilterPlugin)),
        filters=filters,
        post_filters=post,
        reserves=tuple(f for f in filters if isinstance(f, ReservePlugin)),
        preferences=standard_preferences(),
        scores=scores,
        workload=workload,
    )
