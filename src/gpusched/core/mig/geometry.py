"""One MIG-capable GPU: its geometry (memory and SM slices, the placements each profile allows), whether it is
in MIG mode, and the GPU instances present. Integers only; every change returns a new value.

A GPU's occupancy is summed up in a *state code* (an int): bit s of the low byte is memory slice s in use,
bits 8-11 the SM slices in use, bit 12 whether the one ``+me`` instance exists. Two GPUs of one geometry
with the same code accept exactly the same placements, which is what lets the placement policies and the
fragmentation measure work per code instead of per GPU.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

from gpusched.core.mig.profiles import ALL_PROFILE_NAMES, MODEL_CLASSES, Kind, MigError, kinds_by_name, layout


class UnknownMigProfile(MigError):
    """A profile name that no MIG GPU model has (e.g. a typo: ``3g.41gb``)."""


class MigProfileNotOnModel(MigError):
    """A real profile name that this GPU model does not have (e.g. ``1g.5gb`` on an A100 80GB)."""


class MigPlacementError(MigError):
    """A placement the GPU cannot take: a start the profile does not allow, an overlap, too many
    instances of the profile, no SM slices left, or a GPU not in MIG mode."""


SM_SHIFT = 8
ME_BIT = 1 << 12
CODES = 1 << 13  # every state code is below this


@dataclass(frozen=True)
class Geometry:
    """The slices and profiles of one MIG model class (``profiles.model_class``)."""

    model: str
    mem_slices: int
    sm_slices: int
    kinds: Mapping[str, Kind]  # profile name -> kind

    @staticmethod
    @functools.cache
    def of(model: str) -> Geometry:
        if model not in MODEL_CLASSES:
            raise MigError(f"unknown MIG GPU model {model!r} (known: {', '.join(MODEL_CLASSES)})")
        kinds = layout(model)
        mem = max(k.mem_slices for k in kinds)
        sm = max(k.sm_slices for k in kinds)
        return Geometry(model, mem, sm, kinds_by_name(model))

    def kind(self, profile: str) -> Kind:
        """The kind of ``profile`` on this model; a clear error for an unknown name or one the model lacks."""
        k = self.kinds.get(profile)
        if k is not None:
            return k
        known = ", ".join(self.kinds)
        if profile not in ALL_PROFILE_NAMES:
            raise UnknownMigProfile(f"unknown MIG profile {profile!r} (profiles of {self.model}: {known})")
        raise MigProfileNotOnModel(
            f"MIG profile {profile!r} does not exist on {self.model} (it has: {known})"
        )

    def profile_index(self, profile: str) -> int:
        """Position of ``profile``'s kind in ``layout`` order (the column of the measure's tables)."""
        key = self.kind(profile).key
        return next(i for i, k in enumerate(layout(self.model)) if k.key == key)


def span(kind: Kind, start: int) -> int:
    """Bit mask of the memory slices a ``kind`` instance at ``start`` covers."""
    return ((1 << kind.mem_slices) - 1) << start


def code_fits(geom: Geometry, code: int, kind: Kind, start: int) -> bool:
    """Whether a GPU in state ``code`` can take ``kind`` at ``start`` (a legal start, no overlap, SM left, and
    at most one ``+me``)."""
    if start not in kind.starts:
        return False
    if code & span(kind, start):
        return False
    if ((code >> SM_SHIFT) & 0xF) + kind.sm_slices > geom.sm_slices:
        return False
    return not (kind.key == "1g+me" and code & ME_BIT)


def code_after(code: int, kind: Kind, start: int) -> int:
    """State code after ``kind`` at ``start`` is added (the caller checked ``code_fits``)."""
    return code + span(kind, start) + (kind.sm_slices << SM_SHIFT) + (ME_BIT if kind.key == "1g+me" else 0)


def free_slices(geom: Geometry, code: int) -> int:
    return geom.mem_slices - bin(code & 0xFF).count("1")


@dataclass(frozen=True, slots=True)
class Instance:
    profile: str
    start: int


@dataclass(frozen=True)
class MigGpu:
    """A GPU, by device name (``node/index``), with its geometry, MIG mode and instances."""

    name: str
    geometry: Geometry
    mig_enabled: bool = True
    instances: tuple[Instance, ...] = ()

    @property
    def code(self) -> int:
        c = 0
        for i in self.instances:
            c = code_after(c, self.geometry.kind(i.profile), i.start)
        return c

    @property
    def used_slices(self) -> int:
        return sum(self.geometry.kind(i.profile).mem_slices for i in self.instances)

    def free_starts(self, profile: str) -> tuple[int, ...]:
        """The starts where ``profile`` could be placed now (empty when not in MIG mode)."""
        kind = self.geometry.kind(profile)
        if not self.mig_enabled:
            return ()
        code = self.code
        return tuple(s for s in kind.starts if code_fits(self.geometry, code, kind, s))

    def place(self, profile: str, start: int) -> MigGpu:
        kind = self.geometry.kind(profile)
        if not self.mig_enabled:
            raise MigPlacementError(f"GPU {self.name} is not in MIG mode: cannot place {profile}")
        if start not in kind.starts:
            raise MigPlacementError(
                f"MIG profile {profile} cannot start at slice {start} on {self.name} "
                f"(allowed starts: {list(kind.starts)})"
            )
        if not code_fits(self.geometry, self.code, kind, start):
            taken = ", ".join(f"{i.profile} at {i.start}" for i in self.instances)
            raise MigPlacementError(
                f"MIG {profile} at slice {start} does not fit on {self.name} (holds: {taken})"
            )
        return MigGpu(self.name, self.geometry, True, (*self.instances, Instance(profile, start)))

    def remove(self, profile: str, start: int) -> MigGpu:
        gone = Instance(profile, start)
        if gone not in self.instances:
            raise MigPlacementError(f"GPU {self.name} holds no MIG {profile} at slice {start}")
        rest = list(self.instances)
        rest.remove(gone)
        return MigGpu(self.name, self.geometry, self.mig_enabled, tuple(rest))
