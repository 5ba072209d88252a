"""The stacks a platform team would otherwise deploy, as adapters over the simulator: what the
scheduler books for a pod, which GPUs it sees on a node, and how it scores nodes.

- ``stock``: kube-scheduler's default scoring (NodeResourcesFit LeastAllocated + balanced
  allocation, weight 1 each; from 100 nodes on, only the feasible nodes its adaptive
  ``percentageOfNodesToScore`` finds are scored) and NVIDIA's device plugin: ``nvidia.com/gpu``
  is an integer, so a share takes a whole GPU; the plugin gives the first free GPUs.
- ``timeslice-R``: the same with NVIDIA time-slicing, ``replicas: R``: each GPU is advertised
  as R, a pod asks one replica per GPU (a share: one), nothing checks memory (``meter``
  counts the OOM risk that follows).
- ``kube-most``: kube-scheduler with NodeResourcesFit MostAllocated (the usual bin-packing
  tuning), whole GPUs.
- ``hami``: a HAMi-like stack (``core.policies.hami``): shares by memory and cores, node
  binpack, GPU spread.
- ``fgd``: the published FGD policy (``core.policies.fgd``).
- ``gpusched`` and ``gpusched+defrag``: the project's default policy, without and with the
  triggered defragmentation of ``bench defrag`` (``DefragConfig`` defaults: 2 % move budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpusched.core.errors import InvalidInput
from gpusched.core.framework import Profile, WeightedPreference, WeightedScore
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile, profile_of
from gpusched.core.policies.hami import HamiScore
from gpusched.core.policies.kube import BalancedAllocationScore, NodeResourcesFitScore, NodesToScore

SCORINGS = ("kube-least", "kube-most", "hami", "fgd", "default")
SCORE_WINDOW_WEIGHT = 1e6
"""kube-scheduler's node sampling (``NodesToScore``) outweighs every soft preference."""


@dataclass(frozen=True)
class Stack:
    name: str
    label: str
    scoring: str
    whole_gpus: bool = False
    """The scheduler counts GPUs as integers: a share takes a whole GPU (or, time-sliced, a replica)."""
    replicas: int = 1
    """NVIDIA time-slicing replicas per GPU (1: none)."""
    defrag: bool = False

    def __post_init__(self) -> None:
        if self.scoring not in SCORINGS:
            raise InvalidInput(
                f"stack {self.name}: scoring {self.scoring!r} is not one of {', '.join(SCORINGS)}"
            )
        if self.replicas < 1 or (self.replicas > 1 and not self.whole_gpus):
            raise InvalidInput(f"stack {self.name}: time-slicing replicas need whole-GPU counting")

    @property
    def memory_aware(self) -> bool:
        return self.replicas == 1

    def placement_nodes(self, nodes: Sequence[NodeSpec]) -> list[NodeSpec]:
        """The nodes as the scheduler sees them: with time-slicing, R GPUs per physical GPU."""
        if self.replicas == 1:
            return list(nodes)
        return [replace(n, gpu_count=n.gpu_count * self.replicas) for n in nodes]

    def placement_spec(self, spec: PodSpec) -> PodSpec:
        """What the scheduler books for ``spec``: with integer GPUs, whole (replicas of) GPUs."""
        if not self.whole_gpus or spec.num_gpu == 0:
            return spec
        return replace(spec, gpu_milli=GPU_MILLI, gpu_memory_mib=0)

    def profile(self, ctx: PolicyContext) -> Profile:
        if self.scoring in ("fgd", "default"):
            return make_profile(self.scoring, ctx)
        if self.scoring == "hami":
            return profile_of(self.name, (WeightedScore(HamiScore(), 1.0),))
        strategy = "most" if self.scoring == "kube-most" else "least"
        scores = (
            WeightedScore(NodeResourcesFitScore(strategy), 1.0),
            WeightedScore(BalancedAllocationScore(), 1.0),
        )
        prof = profile_of(self.name, scores)
        window = WeightedPreference(NodesToScore(), SCORE_WINDOW_WEIGHT)
        return replace(prof, preferences=(*prof.preferences, window))


STACKS: tuple[Stack, ...] = (
    Stack("stock", "stock k8s (whole GPUs)", "kube-least", whole_gpus=True),
    Stack("timeslice-2", "stock + time-slicing x2", "kube-least", whole_gpus=True, replicas=2),
    Stack("timeslice-4", "stock + time-slicing x4", "kube-least", whole_gpus=True, replicas=4),
    Stack("timeslice-8", "stock + time-slicing x8", "kube-least", whole_gpus=True, replicas=8),
    Stack("kube-most", "k8s MostAllocated (whole GPUs)", "kube-most", whole_gpus=True),
    Stack("hami", "HAMi-like (binpack/spread)", "hami"),
    Stack("fgd", "FGD", "fgd"),
    Stack("gpusched", "gpusched default", "default"),
    Stack("gpusched+defrag", "gpusched default + defrag", "default", defrag=True),
)
STACK_NAMES: tuple[str, ...] = tuple(s.name for s in STACKS)


def stacks_named(names: Sequence[str]) -> list[Stack]:
    by_name = {s.name: s for s in STACKS}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise InvalidInput(f"unknown stack {unknown[0]!r}; choose from {', '.join(STACK_NAMES)}")
    return [by_name[n] for n in names]
