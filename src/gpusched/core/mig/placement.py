"""Where a MIG request goes: a fleet of MIG GPUs in device-name order, and the policies that pick a GPU and a
start for one profile.

Policies (every one only ever returns a legal placement; they differ in which one):

- ``first-fit``: the first GPU in device-name order with room, at its lowest legal start. This is what
  kube-scheduler does with NVIDIA's DRA driver, which publishes every legal placement as a device.
- ``packing``: HAMi-like deterministic packing: the most-used node, then its most-used GPU (used memory
  slices), then name order, lowest start.
- ``best-fit``: the GPU left with the fewest free memory slices (then fewest free SM slices), name order,
  lowest start.
- ``gpusched``: the least growth of the MIG fragmentation measure (``measure``), weighted by the demand seen;
  ties go to best fit, then name order, then the lowest start.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpusched.core.mig.geometry import (
    SM_SHIFT,
    Geometry,
    MigGpu,
    MigPlacementError,
    MigProfileNotOnModel,
    span,
)
from gpusched.core.mig.measure import I64, DemandMix, frag_by_code
from gpusched.core.mig.profiles import ALL_PROFILE_NAMES


class MigPolicy(enum.Enum):
    FIRST_FIT = "first-fit"
    PACKING = "packing"
    BEST_FIT = "best-fit"
    GPUSCHED = "gpusched"


@dataclass(frozen=True, slots=True)
class Placement:
    gpu: int  # index in the fleet (device-name order)
    start: int


_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.int64)


class MigFleet:
    """MIG GPUs in device-name order (``node/index``), with their state codes kept in arrays so that a
    policy looks at every GPU and start at once. ``gpus[i]`` is the authoritative record of GPU i."""

    def __init__(self, gpus: Sequence[MigGpu], nodes: Sequence[str]) -> None:
        if len(gpus) != len(nodes):
            raise MigPlacementError(f"{len(gpus)} GPUs but {len(nodes)} node names")
        order = sorted(range(len(gpus)), key=lambda i: gpus[i].name)
        self.gpus = [gpus[i] for i in order]
        names = [g.name for g in self.gpus]
        if len(set(names)) != len(names):
            raise MigPlacementError("two GPUs share a device name")
        node_names = sorted(set(nodes))
        self.node_of: I64 = np.array([node_names.index(nodes[i]) for i in order], dtype=np.int64)
        self.codes: I64 = np.array([g.code for g in self.gpus], dtype=np.int64)
        self.enabled = np.array([g.mig_enabled for g in self.gpus], dtype=bool)
        self.models = sorted({g.geometry.model for g in self.gpus})
        self.model_of: I64 = np.array(
            [self.models.index(g.geometry.model) for g in self.gpus], dtype=np.int64
        )
        self._node_used: I64 = np.bincount(
            self.node_of, weights=self._used(), minlength=len(node_names)
        ).astype(np.int64)

    def __len__(self) -> int:
        return len(self.gpus)

    def _used(self) -> I64:
        out: I64 = _POPCOUNT[self.codes & 0xFF]
        return out

    @property
    def used_slices(self) -> int:
        return int(self._used().sum())

    @property
    def gpus_used(self) -> int:
        """GPUs holding at least one instance."""
        return int(np.count_nonzero(self.codes & 0xFF))

    def place(self, gpu: int, profile: str, start: int) -> None:
        g = self.gpus[gpu].place(profile, start)  # validates, raises MigError
        self.gpus[gpu] = g
        self._set(gpu, g)

    def remove(self, gpu: int, profile: str, start: int) -> None:
        g = self.gpus[gpu].remove(profile, start)
        self.gpus[gpu] = g
        self._set(gpu, g)

    def _set(self, gpu: int, g: MigGpu) -> None:
        old = int(_POPCOUNT[self.codes[gpu] & 0xFF])
        self.codes[gpu] = g.code
        self._node_used[self.node_of[gpu]] += g.used_slices - old

    def choose(self, profile: str, policy: MigPolicy, demand: DemandMix | None = None) -> Placement | None:
        """The placement ``policy`` picks for one ``profile`` instance, or None when no GPU has room.
        Raises MigError when no GPU model of the fleet has the profile at all."""
        found = [
            self._candidates(m, profile, policy, demand)
            for m in range(len(self.models))
            if profile in Geometry.of(self.models[m]).kinds
        ]
        if not found:
            if len(self.models) == 1 or profile not in ALL_PROFILE_NAMES:
                Geometry.of(self.models[0] if self.models else "a100-80gb").kind(profile)  # names the problem
            raise MigProfileNotOnModel(
                f"no GPU model of the fleet ({', '.join(self.models)}) has MIG {profile!r}"
            )
        keys = [np.concatenate(parts) for parts in zip(*found, strict=True)]
        if len(keys[0]) == 0:
            return None
        best = int(np.lexsort(tuple(reversed(keys[:-1])))[0])  # lexsort: last key is primary
        gpu, start = divmod(int(keys[-1][best]), 16)
        return Placement(gpu, start)

    def _candidates(
        self, m: int, profile: str, policy: MigPolicy, demand: DemandMix | None
    ) -> tuple[I64, ...]:
        """Sort keys (most significant first) of each legal (GPU, start) of model ``m``; last gpu*16+start."""
        geom = Geometry.of(self.models[m])
        kind = geom.kinds[profile]
        idx = np.flatnonzero((self.model_of == m) & self.enabled)
        codes = self.codes[idx]
        sm = (codes >> SM_SHIFT) & 0xF
        room = sm + kind.sm_slices <= geom.sm_slices
        if kind.key == "1g+me":
            room &= (codes & (1 << 12)) == 0
        gi, st = [], []
        for s in kind.starts:
            ok = room & ((codes & span(kind, s)) == 0)
            gi.append(idx[ok])
            st.append(np.full(int(ok.sum()), s, dtype=np.int64))
        gpu = np.concatenate(gi)
        start = np.concatenate(st)
        c = self.codes[gpu]
        free_after = geom.mem_slices - _POPCOUNT[c & 0xFF] - kind.mem_slices
        tag = gpu * 16 + start
        if policy is MigPolicy.FIRST_FIT:
            return gpu, start, tag
        if policy is MigPolicy.PACKING:
            return -self._node_used[self.node_of[gpu]], -_POPCOUNT[c & 0xFF], gpu, start, tag
        sm_free_after = geom.sm_slices - ((c >> SM_SHIFT) & 0xF) - kind.sm_slices
        if policy is MigPolicy.BEST_FIT:
            return free_after, sm_free_after, gpu, start, tag
        f = frag_by_code(geom, demand or DemandMix([profile]))
        after = c + (((1 << kind.mem_slices) - 1) << start) + (kind.sm_slices << SM_SHIFT)
        if kind.key == "1g+me":
            after += 1 << 12
        return f[after] - f[c], free_after, gpu, start, tag
