"""Way (a) on the fake backend, and failure injection for tests.

The fake backend creates and destroys instances itself (``FakeBackend.create_mig_instance``,
``destroy_mig_instance``, checked by the profile table as NVML would check them); its MIG mode switch is here.
``Failing`` wraps any backend so that the n-th call of one operation fails, with the spec the fake
``libnvidia-ml`` reads from ``$GPUSCHED_FAKE_NVML_FAIL``: ``<NVML call>[:<n>[:<code>]]``, where the Python
operations stand for ``nvmlDeviceSetMigMode``, ``nvmlDeviceCreateGpuInstanceWithPlacement`` and
``nvmlGpuInstanceDestroy``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpusched.agent.inventory import Inventory, MigInstance
from gpusched.agent.reshape.apply import MigOpError, MigOps
from gpusched.core.errors import InvalidInput

FAIL_ENV = "GPUSCHED_FAKE_NVML_FAIL"
SET_MODE = "nvmlDeviceSetMigMode"
CREATE = "nvmlDeviceCreateGpuInstanceWithPlacement"
DESTROY = "nvmlGpuInstanceDestroy"


def set_mig_mode(inv: Inventory, index: int, enabled: bool) -> Inventory:
    """``inv`` with GPU ``index`` in MIG mode or out of it (out only with no instance left)."""
    dev = inv.by_index(index)
    if dev is None or not dev.mig_capable:
        raise MigOpError(f"GPU {index}: {SET_MODE}: not a MIG-capable GPU on {inv.hostname}")
    if not enabled and dev.mig_instances:
        raise MigOpError(f"GPU {index}: {SET_MODE}: MIG instances are left (NVML: In use by another client)")
    new = dataclasses.replace(dev, mig_enabled=enabled)
    return dataclasses.replace(inv, devices=tuple(new if d.index == index else d for d in inv.devices))


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


class Failing:
    """A backend whose MIG operations fail as ``spec`` says (test infrastructure)."""

    def __init__(self, backend: MigOps, spec: FailSpec) -> None:
        self.backend, self.spec = backend, spec

    def inventory(self) -> Inventory:
        return self.backend.inventory()

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        self.spec.check(SET_MODE, gpu_index)
        self.backend.set_mig_mode(gpu_index, enabled)

    def create_mig_instance(self, gpu_index: int, profile: str, start: int) -> MigInstance:
        self.spec.check(CREATE, gpu_index)
        return self.backend.create_mig_instance(gpu_index, profile, start)

    def destroy_mig_instance(self, gpu_index: int, uuid: str) -> MigInstance:
        self.spec.check(DESTROY, gpu_index)
        return self.backend.destroy_mig_instance(gpu_index, uuid)
