"""A re-cut request's apply (issue 31 item 3, way (a)): one GPU, the free instances to destroy and those to
create (profile, start), as the scheduler asks for them on the Node (``agent.migrequest``).

It is the one apply function of the agent, ``agent.reshape.apply.apply_reshape``, on the step the request
makes of the GPU's present layout: it refuses a GPU not in MIG mode, a plan made for another layout, an
instance to destroy that is not there or that a live pod holds (``held``: the MIG UUIDs its ``Allocate``
handed out, ``agent.mig.held_mig``), and rolls every call back on a failure (the re-created instances get
new UUIDs, as NVML gives). Anything but ``applied`` raises ``ReshapeError`` with what failed, the typed
result attached.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Protocol, runtime_checkable

from gpusched.agent.inventory import Inventory, MigInstance
from gpusched.agent.reshape.apply import ReshapeOutcome, ReshapeResult, apply_reshape, layout_of
from gpusched.core.errors import GpuschedError
from gpusched.core.mig.geometry import Instance
from gpusched.core.mig.reshape import GpuReshape


class ReshapeError(GpuschedError):
    """A re-cut that was not applied; the GPU was put back as it was unless the message says otherwise.
    ``result``: the typed result (None for a request that did not read)."""

    def __init__(self, message: str, result: ReshapeResult | None = None) -> None:
        super().__init__(message)
        self.result = result


@runtime_checkable
class MigReshaper(Protocol):
    """A backend that can change a GPU's MIG instances (``FakeBackend``, ``NvmlBackend``): the operations of
    ``agent.reshape.apply.MigOps``."""

    def inventory(self) -> Inventory: ...

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None: ...

    def create_mig_instance(self, gpu_index: int, profile: str, start: int) -> MigInstance: ...

    def destroy_mig_instance(self, gpu_index: int, uuid: str) -> MigInstance: ...


def request_step(
    inv: Inventory,
    gpu: int,
    destroy: Sequence[tuple[str, int]],
    create: Sequence[tuple[str, int]],
    name: str = "",
) -> GpuReshape:
    """The step a request makes of GPU ``gpu``'s present layout: destroy, then create (no mode switch);
    ``name``: the GPU's device name (default ``<hostname>/<gpu>``)."""
    d = inv.by_index(gpu)
    before = layout_of(d) if d is not None else ()
    gone = tuple(Instance(p, s) for p, s in destroy)
    made = tuple(Instance(p, s) for p, s in create)
    kept = tuple(i for i in before if i not in gone)  # a GPU holds an instance at a start once
    return GpuReshape(
        name or f"{inv.hostname}/{gpu}",
        False,
        gone,
        made,
        tuple(i.profile for i in made),
        before,
        (*kept, *made),
    )


def apply(
    backend: MigReshaper,
    gpu: int,
    destroy: Sequence[tuple[str, int]],
    create: Sequence[tuple[str, int]],
    held: Collection[str],
) -> list[MigInstance]:
    """Destroy the instances (profile, start) of ``destroy`` on GPU ``gpu``, then create those of ``create``;
    returns the instances created. Raises ReshapeError (everything rolled back) when it was not applied."""
    res = apply_reshape(backend, request_step(backend.inventory(), gpu, destroy, create), held)
    if res.outcome is ReshapeOutcome.STALE:
        raise ReshapeError(f"GPU {gpu}: {res.error}", res)
    if res.outcome is ReshapeOutcome.ROLLED_BACK:
        raise ReshapeError(f"GPU {gpu}: re-cut failed and was rolled back: {res.error}", res)
    if not res.ok:
        raise ReshapeError(f"GPU {gpu}: {res.message}", res)
    d = backend.inventory().by_index(gpu)
    now = {(m.profile.split("c.", 1)[-1], m.placement_start): m for m in (d.mig_instances if d else ())}
    return [now[(p, s)] for p, s in create]
