"""The node agent's view of MIG profiles: a MIG instance with its profile's attributes, and the check that a
GPU's instances are legal.

The table itself (names, slices, allowed placements per GPU model; ../shared/reference/mig.md §2) lives in the
core (``gpusched.core.mig.profiles``) so that the scheduler places slices by the same table; its names are
re-exported here. Real NVML reports each MIG device's attributes itself (``nvmlDeviceGetAttributes``); this
module fills them for the fake backend and checks that a fake (or any) instance names a profile the model has,
at a start it allows, without overlap.
"""

from __future__ import annotations

from gpusched.agent.inventory import MigInstance
from gpusched.core.mig.profiles import (
    A30_LAYOUT,
    EIGHT_SLICE,
    Kind,
    MigError,
    Profile,
    model_class,
    profiles,
)

__all__ = [
    "A30_LAYOUT",
    "EIGHT_SLICE",
    "Kind",
    "MigError",
    "Profile",
    "instance",
    "model_class",
    "profiles",
    "validate",
]


def instance(
    gpu_name: str, gpu_memory_mib: int, profile: str, start: int, uuid: str, gi_id: int = 0
) -> MigInstance:
    """A MIG instance with the attributes of its profile (raises MigError for an unknown profile)."""
    table = profiles(gpu_name, gpu_memory_mib)
    p = table.get(profile)
    if p is None:
        known = ", ".join(table) or "none: this GPU has no MIG"
        raise MigError(f"unknown MIG profile {profile!r} for {gpu_name} (known: {known})")
    c, d, e, j, o = p.engines
    return MigInstance(
        profile=profile,
        placement_start=start,
        placement_size=p.kind.mem_slices,
        uuid=uuid,
        gi_id=gi_id,
        memory_mib=p.memory_mib,
        multiprocessors=p.multiprocessors,
        slices_gi=p.kind.sm_slices,
        slices_ci=p.kind.sm_slices,
        engines_copy=c,
        engines_decoder=d,
        engines_encoder=e,
        engines_jpeg=j,
        engines_ofa=o,
    )


def validate(
    gpu_name: str, gpu_memory_mib: int, instances: tuple[MigInstance, ...] | list[MigInstance]
) -> None:
    """Raises MigError when an instance names an unknown profile, starts where its profile may not, overlaps
    another, or a profile appears more often than the GPU allows."""
    table = profiles(gpu_name, gpu_memory_mib)
    used: dict[int, str] = {}
    counts: dict[str, int] = {}
    for m in instances:
        p = table.get(m.profile)
        if p is None:
            known = ", ".join(table) or "none: this GPU has no MIG"
            raise MigError(f"unknown MIG profile {m.profile!r} for {gpu_name} (known: {known})")
        if m.placement_start not in p.kind.starts:
            raise MigError(
                f"MIG profile {m.profile} cannot start at slice {m.placement_start} "
                f"(allowed starts: {list(p.kind.starts)})"
            )
        for s in range(m.placement_start, m.placement_start + p.kind.mem_slices):
            if s in used:
                raise MigError(f"MIG {m.profile} at slice {m.placement_start} overlaps {used[s]} (slice {s})")
            used[s] = f"{m.profile} at slice {m.placement_start}"
        counts[m.profile] = counts.get(m.profile, 0) + 1
        if counts[m.profile] > p.kind.max_count:
            raise MigError(f"more than {p.kind.max_count} instance(s) of MIG profile {m.profile}")
    sm_used = sum(table[m.profile].kind.sm_slices for m in instances)
    sm_total = max((p.kind.sm_slices for p in table.values()), default=0)
    if sm_used > sm_total:
        raise MigError(f"MIG instances use {sm_used} SM slices; the GPU has {sm_total}")
