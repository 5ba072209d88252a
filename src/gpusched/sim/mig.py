"""MIG workloads for the simulator (no public MIG trace exists, so both are built; docs/mig.md says how).

- ``openb``: openb's GPU shares (num_gpu 1, gpu_milli < 1000) mapped to the smallest profile that covers
  their milli in both compute (SM slices / 7) and memory (memory slices / 8), the openb convention being that
  a 0.6 share means 60 % of the GPU's memory and compute. Whole-GPU, multi-GPU and CPU-only pods are left out
  (a MIG slice never spans GPUs; they would run on GPUs outside MIG). The cluster is openb's A100/H100-class
  nodes: G2 (undisclosed model) as A100 80GB and G3 as H100 80GB, 8 GPUs each, all in MIG mode and empty.
- ``inference``: a synthetic inference-heavy mix (``INFERENCE_MIX``), drawn on the same cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpusched.core.errors import InvalidInput
from gpusched.core.mig.geometry import Geometry, MigGpu
from gpusched.core.mig.placement import MigFleet
from gpusched.core.model import GPU_MILLI, NodeSpec
from gpusched.sim.traces import TracePod

# openb's undisclosed A100/H100-class models, as the MIG model class we give them (an assumption: the trace
# names them G2 and G3 only).
OPENB_MIG_MODELS = {"G2": "a100-80gb", "G3": "h100-80gb"}

# Share of requests per profile (A100/H100 80GB names), inference-heavy: mostly small slices for model
# serving, a few large ones. Our own mix, not taken from a trace; docs/mig.md says why.
INFERENCE_MIX: tuple[tuple[str, float], ...] = (
    ("1g.10gb", 0.40),
    ("1g.20gb", 0.10),
    ("2g.20gb", 0.20),
    ("3g.40gb", 0.15),
    ("4g.40gb", 0.05),
    ("7g.80gb", 0.10),
)


STATIC = "static-balanced"
BALANCED_KEYS = {"1g": 2, "2g": 1, "3g": 1}  # mig-manager's all-balanced on 7-slice GPUs (mig.md §4)


@dataclass(frozen=True)
class MigCluster:
    """GPUs (device name ``node/index``), their node names, and where they came from."""

    gpus: tuple[MigGpu, ...]
    nodes: tuple[str, ...]
    label: str

    def fleet(self) -> MigFleet:
        return MigFleet(self.gpus, self.nodes)

    @property
    def slices(self) -> int:
        return sum(g.geometry.mem_slices for g in self.gpus)


def openb_mig_cluster(nodes: Sequence[NodeSpec]) -> MigCluster:
    """openb's A100/H100-class nodes (``OPENB_MIG_MODELS``) as MIG GPUs, all in MIG mode and empty."""
    gpus: list[MigGpu] = []
    owners: list[str] = []
    for n in nodes:
        model = OPENB_MIG_MODELS.get(n.gpu_model)
        if model is None:
            continue
        geom = Geometry.of(model)
        for i in range(n.gpu_count):
            gpus.append(MigGpu(f"{n.name}/{i}", geom))
            owners.append(n.name)
    if not gpus:
        raise InvalidInput(f"no node of model {' or '.join(OPENB_MIG_MODELS)} in the node list: no MIG GPUs")
    counts = Counter(g.geometry.model for g in gpus)
    label = ", ".join(f"{c} x {m}" for m, c in sorted(counts.items()))
    return MigCluster(tuple(gpus), tuple(owners), f"openb G2/G3 nodes ({label})")


def smallest_profile(milli: int, geom: Geometry) -> str:
    """The profile with the fewest memory slices (then SM slices) whose memory and SM fractions both cover
    ``milli`` (``+me`` profiles are never chosen: they are for media work)."""
    if not 0 < milli <= GPU_MILLI:
        raise InvalidInput(f"a GPU share must be in 1..{GPU_MILLI} milli, got {milli}")
    need_mem = -(-milli * geom.mem_slices // GPU_MILLI)
    need_sm = -(-milli * geom.sm_slices // GPU_MILLI)
    fits = [
        (k.mem_slices, k.sm_slices, name)
        for name, k in geom.kinds.items()
        if not k.key.endswith("+me") and k.mem_slices >= need_mem and k.sm_slices >= need_sm
    ]
    return min(fits)[2]


@dataclass(frozen=True)
class MigWorkload:
    """Profiles requested (the pool sampled from), and what was left out of the source."""

    name: str
    pool: tuple[str, ...]
    weights: tuple[float, ...] | None  # None: uniform over the pool
    note: str


def openb_workload(pods: Sequence[TracePod], geom: Geometry) -> MigWorkload:
    shares = [tp.spec.gpu_milli for tp in pods if tp.spec.num_gpu == 1 and tp.spec.gpu_milli < GPU_MILLI]
    if not shares:
        raise InvalidInput(
            "the pod list has no GPU shares (num_gpu 1, gpu_milli < 1000) to map to MIG profiles"
        )
    pool = tuple(smallest_profile(m, geom) for m in shares)
    left = len(pods) - len(shares)
    mix = ", ".join(f"{p} {c / len(pool):.0%}" for p, c in Counter(pool).most_common())
    return MigWorkload("openb", pool, None, f"{len(shares)} shares ({mix}); {left} other pods left out")


def inference_workload() -> MigWorkload:
    pool = tuple(p for p, _ in INFERENCE_MIX)
    mix = ", ".join(f"{p} {w:.0%}" for p, w in INFERENCE_MIX)
    return MigWorkload("inference", pool, tuple(w for _, w in INFERENCE_MIX), f"synthetic ({mix})")


class StaticBalanced:
    """Pre-cut ``all-balanced`` GPUs (name order): free instances per GPU and profile."""

    def __init__(self, cluster: MigCluster) -> None:
        geoms = [g.geometry for g in sorted(cluster.gpus, key=lambda g: g.name)]
        self.profiles = sorted({n for g in geoms for n, k in g.kinds.items() if k.key in BALANCED_KEYS})
        self.size = {n: k.mem_slices for g in geoms for n, k in g.kinds.items()}
        self.free = np.zeros((len(geoms), len(self.profiles)), dtype=np.int64)
        for gi, g in enumerate(geoms):
            for n, k in g.kinds.items():
                if k.key in BALANCED_KEYS:
                    self.free[gi, self.profiles.index(n)] = BALANCED_KEYS[k.key]
        self.full = self.free.copy()
        self.used_slices = 0

    def take(self, profile: str) -> int:
        """The GPU whose free ``profile`` instance is taken, or -1."""
        if profile not in self.profiles:
            return -1
        col = self.free[:, self.profiles.index(profile)]
        hit = np.flatnonzero(col)
        if len(hit) == 0:
            return -1
        col[hit[0]] -= 1
        self.used_slices += self.size[profile]
        return int(hit[0])

    def release(self, gpu: int, profile: str) -> None:
        j = self.profiles.index(profile)
        if self.free[gpu, j] >= self.full[gpu, j]:
            raise InvalidInput(f"GPU {gpu} holds no {profile} to release")
        self.free[gpu, j] += 1
        self.used_slices -= self.size[profile]

    @property
    def gpus_used(self) -> int:
        return int(np.count_nonzero((self.free != self.full).any(axis=1)))
