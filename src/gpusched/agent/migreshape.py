"""Re-cutting a GPU's free MIG slices on the node (issue 31 item 3, way (a), first part): the agent destroys
and creates GPU/compute instances through its backend (NVML on a GPU node; the fake backend in tests), and a
failure rolls every step back.

The plan comes from ``core.mig.reshape`` (the instances to destroy and to create on one GPU). The agent
refuses a plan that would destroy an instance a live pod holds (``held``: the MIG UUIDs its ``Allocate``
handed out, ``agent.mig.held_mig``): the scheduler plans only free slices, and a plan that disagrees with
the node is stale. On any failure the instances created so far are destroyed and those destroyed are
created again at their profile and start (with new UUIDs, as NVML gives), and ``ReshapeError`` says what
failed and that it was rolled back. Not wired yet: nothing sends the agent a plan, and the device plugin
does not yet re-list its devices after a change.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable

from gpusched.agent.inventory import Inventory, MigInstance
from gpusched.agent.migprofiles import MigError
from gpusched.core.errors import GpuschedError


class ReshapeError(GpuschedError):
    """A re-cut that could not be applied; the GPU was put back as it was (the message says what failed)."""


@runtime_checkable
class MigReshaper(Protocol):
    """A backend that can change a GPU's MIG instances (``FakeBackend``; NVML's create/destroy calls)."""

    def inventory(self) -> Inventory: ...

    def create_mig_instance(self, gpu_index: int, profile: str, start: int) -> MigInstance: ...

    def destroy_mig_instance(self, gpu_index: int, uuid: str) -> MigInstance: ...


def apply(
    backend: MigReshaper,
    gpu: int,
    destroy: Sequence[tuple[str, int]],
    create: Sequence[tuple[str, int]],
    held: Collection[str],
) -> list[MigInstance]:
    """Destroy the instances (profile, start) of ``destroy`` on GPU ``gpu``, then create those of ``create``;
    returns the instances created. Raises ReshapeError, with everything rolled back, when a step fails or
    the plan would destroy an instance that is not there or that a live pod holds."""
    d = backend.inventory().by_index(gpu)
    if d is None or not d.mig_enabled:
        raise ReshapeError(f"GPU {gpu}: not a GPU in MIG mode on {backend.inventory().hostname}")
    by_place = {(m.profile, m.placement_start): m for m in d.mig_instances}
    for profile, start in destroy:
        m = by_place.get((profile, start))
        if m is None:
            raise ReshapeError(f"GPU {gpu}: no MIG {profile} at slice {start} to destroy (the plan is stale)")
        if m.uuid in held:
            raise ReshapeError(f"GPU {gpu}: MIG {profile} at slice {start} ({m.uuid}) is held by a live pod")
    destroyed: list[MigInstance] = []
    created: list[MigInstance] = []
    try:
        for profile, start in destroy:
            destroyed.append(backend.destroy_mig_instance(gpu, by_place[(profile, start)].uuid))
        for profile, start in create:
            created.append(backend.create_mig_instance(gpu, profile, start))
    except MigError as e:
        for m in reversed(created):
            backend.destroy_mig_instance(gpu, m.uuid)
        for m in reversed(destroyed):
            backend.create_mig_instance(gpu, m.profile, m.placement_start)
        raise ReshapeError(f"GPU {gpu}: re-cut failed and was rolled back: {e}") from None
    return created
