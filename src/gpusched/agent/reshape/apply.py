"""Way (a): the agent applies one GPU's reshape (``gpusched.core.mig.reshape.GpuReshape``) itself: switch MIG
mode on if the plan says so, destroy the instances it names, create the new ones at their starts. When a call
fails part-way, what was done is undone in reverse order, so the GPU is back at its previous layout (the
re-created instances have new MIG UUIDs: they were free, nobody held their UUID). The result says what
happened, typed, with the reason and message of the event the caller records on the Node.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from gpusched.agent import migprofiles
from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance
from gpusched.agent.reshape.events import OutcomeEvent
from gpusched.core.mig.geometry import Geometry, Instance, MigGpu
from gpusched.core.mig.profiles import MigError
from gpusched.core.mig.reshape import GpuReshape

log = logging.getLogger(__name__)


class MigOpError(MigError):
    """A MIG call the GPU refused (NVML's error, or the fake's); the message names the GPU, the call and the
    error. A ``MigError``, as the fake backend's own refusals are, so one ``except`` takes both."""


class MigOps(Protocol):
    """What a backend offers for reshaping: both ``NvmlBackend`` and ``FakeBackend`` implement it. Every
    failure is a ``MigError``."""

    def inventory(self) -> Inventory: ...

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None: ...

    def create_mig_instance(self, gpu_index: int, profile: str, start: int) -> MigInstance:
        """A GPU instance of ``profile`` at memory slice ``start`` and one compute instance spanning it."""
        ...

    def destroy_mig_instance(self, gpu_index: int, uuid: str) -> MigInstance:
        """The MIG device ``uuid``: its compute instances, then its GPU instance; returns what it was."""
        ...


class ReshapeOutcome(enum.Enum):
    APPLIED = "applied"  # the GPU holds the plan's target layout
    ROLLED_BACK = "rolled-back"  # a call failed; the previous layout is back
    ROLLBACK_FAILED = "rollback-failed"  # a call failed and undoing it failed too: the layout is neither
    STALE = "stale"  # the GPU does not hold what the plan was made from: nothing was done


@dataclass(frozen=True)
class ReshapeResult(OutcomeEvent):
    EVENTS: ClassVar[Mapping[Any, tuple[str, str]]] = {
        ReshapeOutcome.APPLIED: ("Normal", "MigReshaped"),
        ReshapeOutcome.ROLLED_BACK: ("Warning", "MigReshapeRolledBack"),
        ReshapeOutcome.ROLLBACK_FAILED: ("Warning", "MigReshapeFailed"),
        ReshapeOutcome.STALE: ("Warning", "MigReshapeStale"),
    }
    gpu: str  # device name, node/index
    outcome: ReshapeOutcome
    before: tuple[Instance, ...]
    after: tuple[Instance, ...]
    target: tuple[Instance, ...]
    done: tuple[str, ...]  # the calls that succeeded, in order (undo calls too)
    error: str = ""

    @property
    def message(self) -> str:
        lay = _names
        if self.ok:
            return f"MIG GPU {self.gpu} reshaped from [{lay(self.before)}] to [{lay(self.after)}]"
        if self.outcome is ReshapeOutcome.STALE:
            return f"MIG GPU {self.gpu}: reshape not applied: {self.error}"
        back = "rolled back to" if self.outcome is ReshapeOutcome.ROLLED_BACK else "left at"
        return (
            f"MIG GPU {self.gpu}: reshape to [{lay(self.target)}] failed ({self.error}); "
            f"{back} [{lay(self.after)}]"
        )


def _names(instances: tuple[Instance, ...]) -> str:
    return ", ".join(f"{i.profile} at {i.start}" for i in sorted(instances, key=lambda i: i.start))


def device_index(gpu: str) -> int:
    """The GPU index of a device name ``node/index``."""
    tail = gpu.rsplit("/", 1)[-1]
    if not tail.isdigit():
        raise MigOpError(f"{gpu!r} is not a GPU device name (node/index)")
    return int(tail)


def layout_of(device: GpuDevice) -> tuple[Instance, ...]:
    """The GPU instances of a device (one per GI, whatever its compute instances), in start order."""
    seen = {(m.profile.split("c.", 1)[-1], m.placement_start) for m in device.mig_instances}  # 1c.3g.40gb
    return tuple(Instance(p, s) for p, s in sorted(seen, key=lambda x: x[1]))


def mig_gpu(node: str, device: GpuDevice) -> MigGpu | None:
    """The core's view of one device (None for a GPU without MIG), named ``node/index``."""
    cls = migprofiles.model_class(device.name, device.memory_mib) if device.mig_capable else None
    if cls is None:
        return None
    return MigGpu(f"{node}/{device.index}", Geometry.of(cls), device.mig_enabled, layout_of(device))


def apply_reshape(ops: MigOps, step: GpuReshape, held: Collection[str] = ()) -> ReshapeResult:
    """Applies ``step`` to its GPU through ``ops``; never raises for a failed MIG call (see the result).
    ``held``: MIG UUIDs live pods hold (the agent's own record); a step that would destroy one is refused as
    stale, whatever the plan was made from."""
    index = device_index(step.gpu)
    dev = ops.inventory().by_index(index)
    if dev is None:
        return ReshapeResult(step.gpu, ReshapeOutcome.STALE, (), (), step.target, (), f"no GPU index {index}")
    before = layout_of(dev)
    uuids = _uuids(dev)
    why = why_stale(dev, step, held, ops.inventory().hostname)
    if why:
        return ReshapeResult(step.gpu, ReshapeOutcome.STALE, before, before, step.target, (), why)
    done: list[str] = []
    undo: list[tuple[str, str, int]] = []  # (call, profile or MIG UUID, start)
    try:
        if step.enable_mig and not dev.mig_enabled:
            ops.set_mig_mode(index, True)
            done.append("enable MIG")
            undo.append(("disable", "", 0))
        for i in step.destroy:
            ops.destroy_mig_instance(index, uuids[(i.profile, i.start)])
            done.append(f"destroy {i.profile} at {i.start}")
            undo.append(("create", i.profile, i.start))
        for i in step.create:
            made = ops.create_mig_instance(index, i.profile, i.start)
            done.append(f"create {i.profile} at {i.start}")
            undo.append(("destroy", made.uuid, i.start))
        after = _read(ops, index)
        if set(after) != set(step.target):
            raise MigOpError(f"the GPU holds [{_names(after)}] after the reshape, not the target")
    except MigError as e:
        return _roll_back(ops, step, before, done, undo, str(e))
    log.info("MIG GPU %s reshaped: %s", step.gpu, "; ".join(done))
    return ReshapeResult(step.gpu, ReshapeOutcome.APPLIED, before, after, step.target, tuple(done))


def _uuids(dev: GpuDevice) -> dict[tuple[str, int], str]:
    return {(m.profile.split("c.", 1)[-1], m.placement_start): m.uuid for m in dev.mig_instances}


def why_stale(dev: GpuDevice, step: GpuReshape, held: Collection[str], host: str) -> str:
    """Why ``step`` may not be applied to ``dev`` ("" when it may): not in MIG mode, not the layout the plan
    was made from, an instance to destroy that is not there or that a live pod holds (``held``: MIG UUIDs)."""
    before, uuids = layout_of(dev), _uuids(dev)
    if not (dev.mig_enabled or step.enable_mig):
        return f"not a GPU in MIG mode on {host}"
    if set(before) != set(step.before):
        return f"it holds [{_names(before)}], the plan was made for [{_names(step.before)}]"
    gone = [i for i in step.destroy if (i.profile, i.start) not in uuids]
    if gone:
        return "; ".join(
            f"no MIG {i.profile} at slice {i.start} to destroy (the plan is stale)" for i in gone
        )
    return "; ".join(
        f"MIG {i.profile} at slice {i.start} ({u}) is held by a live pod"
        for i in step.destroy
        if (u := uuids[(i.profile, i.start)]) in held
    )


def _read(ops: MigOps, index: int) -> tuple[Instance, ...]:
    dev = ops.inventory().by_index(index)
    return layout_of(dev) if dev is not None else ()


def _roll_back(
    ops: MigOps,
    step: GpuReshape,
    before: tuple[Instance, ...],
    done: list[str],
    undo: list[tuple[str, str, int]],
    error: str,
) -> ReshapeResult:
    index = device_index(step.gpu)
    failures = []
    for call, what, start in reversed(undo):
        try:
            if call == "disable":
                ops.set_mig_mode(index, False)
                done.append("undo: disable MIG")
            elif call == "create":
                ops.create_mig_instance(index, what, start)
                done.append(f"undo: create {what} at {start}")
            else:
                gone = ops.destroy_mig_instance(index, what)
                done.append(f"undo: destroy {gone.profile} at {start}")
        except MigError as e:
            failures.append(str(e))
    after = _read(ops, device_index(step.gpu))
    back = not failures and set(after) == set(before)
    if failures:
        error += "; undoing failed: " + "; ".join(failures)
    outcome = ReshapeOutcome.ROLLED_BACK if back else ReshapeOutcome.ROLLBACK_FAILED
    log.warning("MIG GPU %s: reshape failed (%s), %s", step.gpu, error, outcome.value)
    return ReshapeResult(step.gpu, outcome, before, after, step.target, tuple(done), error)
