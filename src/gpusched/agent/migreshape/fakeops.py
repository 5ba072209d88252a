"""Way (a) on the fake backend: the MIG reshaping calls on an ``Inventory`` in memory, checked by the profile
table as NVML would check them, and the failure injection the fake ``libnvidia-ml`` has too: the spec
``<NVML call>[:<n>[:<code>]]`` (``$GPUSCHED_FAKE_NVML_FAIL`` for both) makes the n-th call of that NVML
function fail. The Python calls stand for ``nvmlDeviceSetMigMode``,
``nvmlDeviceCreateGpuInstanceWithPlacement`` and ``nvmlGpuInstanceDestroy``.
"""

from __future__ import annotations

import dataclasses
import uuid as uuidlib
from dataclasses import dataclass

from gpusched.agent import migprofiles
from gpusched.agent.inventory import GpuDevice, Inventory
from gpusched.agent.migreshape.apply import MigOpError
from gpusched.core.errors import InvalidInput

FAIL_ENV = "GPUSCHED_FAKE_NVML_FAIL"
SET_MODE = "nvmlDeviceSetMigMode"
CREATE = "nvmlDeviceCreateGpuInstanceWithPlacement"
DESTROY = "nvmlGpuInstanceDestroy"


@dataclass
class FailSpec:
    call: str
    nth: int = 1
    code: int = 999  # NVML_ERROR_UNKNOWN
    seen: int = 0

    @staticmethod
    def parse(text: str | None) -> FailSpec | None:
        if not text:
            return None
        call, _, rest = text.partition(":")
        nth, _, code = rest.partition(":")
        try:
            return FailSpec(call, int(nth or 1), int(code or 999))
        except ValueError:
            raise InvalidInput(f"${FAIL_ENV}={text!r}: expected <NVML call>[:<n>[:<code>]]") from None

    def check(self, call: str, gpu: int) -> None:
        if call != self.call:
            return
        self.seen += 1
        if self.seen == self.nth:
            raise MigOpError(f"GPU {gpu}: {call}: injected failure (NVML error {self.code})")


def _replace(inv: Inventory, dev: GpuDevice) -> Inventory:
    return dataclasses.replace(inv, devices=tuple(dev if d.index == dev.index else d for d in inv.devices))


def _device(inv: Inventory, index: int) -> GpuDevice:
    dev = inv.by_index(index)
    if dev is None:
        raise MigOpError(f"no GPU index {index}")
    if not dev.mig_capable:
        raise MigOpError(f"GPU {index} ({dev.name}) has no MIG")
    return dev


def set_mig_mode(inv: Inventory, index: int, enabled: bool) -> Inventory:
    dev = _device(inv, index)
    if not enabled and dev.mig_instances:
        raise MigOpError(f"GPU {index}: {SET_MODE}: MIG instances are left (NVML: In use by another client)")
    return _replace(inv, dataclasses.replace(dev, mig_enabled=enabled))


def create(inv: Inventory, index: int, profile: str, start: int, seq: int) -> Inventory:
    dev = _device(inv, index)
    if not dev.mig_enabled:
        raise MigOpError(f"GPU {index}: {CREATE}: MIG mode is off")
    gi_id = min(set(range(1, 64)) - {m.gi_id for m in dev.mig_instances})
    uuid = f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'gpusched-fake/{dev.uuid}/{start}/{seq}')}"
    try:
        new = migprofiles.instance(dev.name, dev.memory_mib, profile, start, uuid, gi_id=gi_id)
        migprofiles.validate(dev.name, dev.memory_mib, (*dev.mig_instances, new))
    except migprofiles.MigError as e:
        raise MigOpError(f"GPU {index}: {CREATE} {profile} at {start}: {e}") from None
    return _replace(inv, dataclasses.replace(dev, mig_instances=(*dev.mig_instances, new)))


def destroy(inv: Inventory, index: int, profile: str, start: int) -> Inventory:
    dev = _device(inv, index)
    keep = tuple(m for m in dev.mig_instances if (m.profile, m.placement_start) != (profile, start))
    if len(keep) == len(dev.mig_instances):
        raise MigOpError(f"GPU {index} holds no MIG {profile} at slice {start}")
    return _replace(inv, dataclasses.replace(dev, mig_instances=keep))
