"""The paper protocol's inputs, once: the pod stream of a seed, the nodes' tie-break ranks and the
seeded profile (Weng et al., ATC '23, as ``sim.paper`` runs it).

The simulator (``sim.paper``, ``sim.churn``'s one-shot consolidation, ``sim.replay``'s ranks) and
the doctor's simulated snapshot (``doctor.simsnap``) must see the same stream, ranks and profile for
one policy and seed, or a snapshot would not be the run it names. The doctor may import the core but
not the simulator, and all of this is pure (seeded generators, the core's specs and books; no clock,
no I/O), so it lives here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpusched.core.cluster import ClusterState
from gpusched.core.errors import InvalidInput
from gpusched.core.fragmentation import TargetWorkload
from gpusched.core.framework import Profile
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext, make_profile

PROFILE_SALT = 0xABC
"""Mixed into the seed of the profile's generator (``[seed, PROFILE_SALT]``): the paper protocol's
policies draw from their own stream, apart from the pod stream's and the ranks'."""
TIE_SALT = 0x7E1E
"""Mixed into the seed of the nodes' tie-break ranks (``[seed, TIE_SALT]``)."""


def build_sequence(pods: Sequence[PodSpec], total_gpu_milli: int, seed: int, tune: float) -> list[PodSpec]:
    """The pod stream of one seed: shuffled originals, then samples up to ``tune`` × capacity."""
    rng = np.random.default_rng(seed)
    pool = sorted(pods, key=lambda p: p.name)
    seq = [pool[i] for i in rng.permutation(len(pool))]
    target = tune * total_gpu_milli
    demand = sum(p.gpu_demand_milli for p in pool)
    if not any(p.num_gpu for p in pool):
        raise InvalidInput("the paper protocol inflates arrivals by GPU demand, but no pod asks for a GPU")
    if tune <= 0:
        raise InvalidInput(f"tune must be positive, got {tune}")
    if demand < target:
        i = 0
        while True:
            p = pool[int(rng.integers(len(pool)))]
            if demand + p.gpu_milli > target:  # the simulator's stop test reads per-GPU milli
                break
            demand += p.gpu_demand_milli
            seq.append(dataclasses.replace(p, name=f"{p.name}-tuned-{i}"))
            i += 1
    elif demand > target:
        while demand > target and seq:
            demand -= seq.pop(int(rng.integers(len(seq)))).gpu_demand_milli
    return seq


def tie_ranks(nodes: Sequence[NodeSpec], seed: int) -> np.ndarray:
    """A seeded rank per node (lower wins ties): a permutation over the name-sorted nodes."""
    rng = np.random.default_rng([seed, TIE_SALT])
    order = sorted(range(len(nodes)), key=lambda i: nodes[i].name)
    perm = rng.permutation(len(nodes))
    ranks = np.empty(len(nodes), dtype=np.int64)
    ranks[order] = perm
    return ranks


def paper_profile(policy: str, workload: TargetWorkload, seed: int) -> Profile:
    """``policy``'s profile for one seed of the paper protocol (its generator seeded
    ``[seed, PROFILE_SALT]``)."""
    return make_profile(
        policy, PolicyContext(workload=workload, rng=np.random.default_rng([seed, PROFILE_SALT]))
    )


@dataclass(frozen=True)
class PaperSetup:
    """One seed's run, before the first pod: empty books, the profile, the stream, the ranks."""

    snap: ClusterState
    workload: TargetWorkload
    profile: Profile
    sequence: list[PodSpec]
    ranks: np.ndarray


def paper_setup(
    nodes: Sequence[NodeSpec],
    pods: Sequence[PodSpec],
    policy: str,
    seed: int,
    *,
    tune: float = 1.3,
    workload: TargetWorkload | None = None,
    profile: Profile | None = None,
) -> PaperSetup:
    """The paper protocol for ``policy`` and ``seed`` on ``nodes``: the target workload is the pods'
    own unless given, the profile ``paper_profile``'s unless given."""
    snap = ClusterState(nodes)
    tw = workload or TargetWorkload.from_pods(pods)
    prof = profile if profile is not None else paper_profile(policy, tw, seed)
    seq = build_sequence(pods, snap.total_gpu_milli, seed, tune)
    return PaperSetup(snap, tw, prof, seq, tie_ranks(nodes, seed))
