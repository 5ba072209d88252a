"""The node's GPUs as DRA devices: the ResourceSlice the agent publishes (``resource.k8s.io/v1``).

The shape is NVIDIA's DRA driver's (``../shared/reference/dra.md`` §4), so that DeviceClasses and claims
written for it select gpusched's devices unchanged:

- a whole GPU (not in MIG mode) is device ``gpu-<index>``: attributes ``type=gpu``, ``uuid``, ``index``,
  ``minor``, ``productName``, ``architecture``, ``cudaComputeCapability``, ``driverVersion``,
  ``cudaDriverVersion`` and the standard ``resource.kubernetes.io/pciBusID``; capacity ``memory``;
- a MIG device already configured on a GPU in MIG mode is ``gpu-<index>-mig-<profile>-<start>`` (NVIDIA's
  name carries the GI profile ID before the start; the inventory has none): attributes ``type=mig``,
  ``uuid``, ``parentUUID``, ``parentIndex``, ``profile``, ``productName``; capacity ``multiprocessors``,
  ``copyEngines``, ``decoders``, ``encoders``, ``jpegEngines``, ``ofaEngines``, ``memory``.

With shares (``--dra-shares``), each whole GPU is a device that may be allocated many times
(``allowMultipleAllocations``) with consumable capacity ``milli`` (1000 = the GPU's compute) and ``memory``;
a request names how much it takes (``capacity.requests``), and one that names neither takes the whole GPU (the
request policies' defaults are the full values: HAMi's shape, in gpusched's units).

Devices are named in index order (kube-scheduler's allocator tries them in that order). One pool per node,
named after the node, in one slice; the slice's name is ``<node>-<driver>``. A GPU the agent found unhealthy
(a critical XID) carries the device taint ``<driver>/xid`` (value: the XID, effect NoSchedule by default;
NVIDIA's driver uses the same key), on the GPU and on its MIG devices.

Nothing here does I/O: :mod:`gpusched.agent.dra.publish` writes the slice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance
from gpusched.agent.labels import family
from gpusched.core.errors import InvalidInput

#: NVIDIA's driver name: DeviceClasses ``gpu.nvidia.com`` / ``mig.nvidia.com`` select by it.
DEFAULT_DRIVER = "gpu.nvidia.com"
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
MAX_NAME = 253
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


class DraConfigError(InvalidInput):
    """A DRA setting the agent cannot publish (a driver name that is no DNS subdomain, an unknown effect)."""


def check_driver_name(driver: str) -> str:
    """A driver name is a DNS subdomain of at most 63 characters (the apiserver's validation)."""
    if len(driver) > 63 or not _DNS_SUBDOMAIN.match(driver):
        raise DraConfigError(
            f"--dra-driver {driver!r}: a DRA driver name is a lower-case DNS subdomain of at most 63 "
            "characters"
        )
    return driver


def check_effect(effect: str) -> str:
    if effect not in TAINT_EFFECTS:
        raise DraConfigError(f"--dra-unhealthy-effect {effect!r}: one of {', '.join(TAINT_EFFECTS)}")
    return effect


@dataclass(frozen=True)
class Attribute:
    """One device attribute: ``kind`` is the v1 field (``string``, ``int``, ``bool``, ``version``)."""

    kind: str
    value: str | int | bool


@dataclass(frozen=True)
class Capacity:
    """A device capacity; with ``default``, a consumable one (the request policy: default and valid range)."""

    value: str
    default: str | None = None
    min: str = "0"
    max: str | None = None
    step: str | None = None

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value}
        if self.default is not None:
            rng: dict[str, str] = {"min": self.min}
            if self.max is not None:
                rng["max"] = self.max
            if self.step is not None:
                rng["step"] = self.step
            out["requestPolicy"] = {"default": self.default, "validRange": rng}
        return out


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class DraDevice:
    """One published device and what Prepare needs of it."""

    name: str
    gpu_uuid: str
    """The physical GPU it lives on (health is per GPU)."""
    visible_id: str
    """What the container's ``NVIDIA_VISIBLE_DEVICES`` names: the GPU's or the MIG device's UUID."""
    gpu_index: int
    attributes: Mapping[str, Attribute]
    capacity: Mapping[str, Capacity]
    taints: tuple[Taint, ...] = ()
    shared: bool = False
    """``allowMultipleAllocations``: GPU shares take parts of its consumable capacity."""

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: {a.kind: a.value} for k, a in sorted(self.attributes.items())},
            "capacity": {k: c.to_api() for k, c in sorted(self.capacity.items())},
        }
        if self.shared:
            out["allowMultipleAllocations"] = True
        if self.taints:
            out["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect} for t in self.taints]
        return out


@dataclass(frozen=True)
class NodeSlice:
    """The pool of one node: its devices, for one driver."""

    driver: str
    node: str
    devices: tuple[DraDevice, ...]
    by_name: Mapping[str, DraDevice] = field(default_factory=dict)

    @property
    def pool(self) -> str:
        return self.node

    @property
    def name(self) -> str:
        return f"{self.node}-{self.driver}"[:MAX_NAME].rstrip(".-")

    def spec(self, generation: int) -> dict[str, Any]:
        return {
            "driver": self.driver,
            "nodeName": self.node,
            "pool": {"name": self.pool, "generation": generation, "resourceSliceCount": 1},
            "devices": [d.to_api() for d in self.devices],
        }


def semver(text: str) -> str:
    """NVML's versions as semantic versions: ``550.107.02`` -> ``550.107.2``, ``12.4`` -> ``12.4.0``."""
    parts = [str(int(p)) for p in re.findall(r"\d+", text)[:3]]
    return ".".join(parts + ["0"] * (3 - len(parts)))


def architecture(dev: GpuDevice) -> str:
    """NVIDIA's architecture names (``Ampere``, ``Ada Lovelace``, ``Hopper``...)."""
    return family(dev.compute_major, dev.compute_minor).replace("-", " ").title()


def pci_bus_id(nvml_id: str) -> str:
    """NVML's ``00000000:07:00.0`` as the standard attribute's ``0000:07:00.0`` (lower case)."""
    m = re.fullmatch(r"([0-9A-Fa-f]+):([0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])", nvml_id)
    if not m:
        return nvml_id.lower()
    return f"{int(m.group(1), 16):04x}:{m.group(2).lower()}"


def _common(dev: GpuDevice, inv: Inventory) -> dict[str, Attribute]:
    return {
        "productName": Attribute("string", dev.name),
        "architecture": Attribute("string", architecture(dev)),
        "cudaComputeCapability": Attribute("version", f"{dev.compute_major}.{dev.compute_minor}.0"),
        "driverVersion": Attribute("version", semver(inv.driver_version)),
        "cudaDriverVersion": Attribute("version", semver("{}.{}".format(*inv.cuda_driver_version))),
        PCI_BUS_ID: Attribute("string", pci_bus_id(dev.pci_bus_id)),
    }


def gpu_device(
    dev: GpuDevice, inv: Inventory, taints: tuple[Taint, ...], *, shares: bool = False
) -> DraDevice:
    attrs = {
        "type": Attribute("string", "gpu"),
        "uuid": Attribute("string", dev.uuid),
        "index": Attribute("int", dev.index),
        "minor": Attribute("int", dev.index),
        **_common(dev, inv),
    }
    return DraDevice(
        name=f"gpu-{dev.index}",
        gpu_uuid=dev.uuid,
        visible_id=dev.uuid,
        gpu_index=dev.index,
        attributes=attrs,
        capacity=_share_capacity(dev.memory_mib) if shares else {"memory": Capacity(f"{dev.memory_mib}Mi")},
        taints=taints,
        shared=shares,
    )


def _share_capacity(memory_mib: int) -> dict[str, Capacity]:
    """A shared GPU's consumable capacity: by default a request takes all of it (a whole GPU)."""
    mem = f"{memory_mib}Mi"
    return {
        "memory": Capacity(mem, default=mem, min="1Mi", step="1Mi"),
        "milli": Capacity("1000", default="1000", min="1", max="1000", step="1"),
    }


def mig_device(dev: GpuDevice, mig: MigInstance, inv: Inventory, taints: tuple[Taint, ...]) -> DraDevice:
    profile = re.sub(r"[^a-z0-9]", "", mig.profile.lower())
    attrs = {
        "type": Attribute("string", "mig"),
        "uuid": Attribute("string", mig.uuid),
        "parentUUID": Attribute("string", dev.uuid),
        "parentIndex": Attribute("int", dev.index),
        "profile": Attribute("string", mig.profile),
        **_common(dev, inv),
    }
    return DraDevice(
        name=f"gpu-{dev.index}-mig-{profile}-{mig.placement_start}",
        gpu_uuid=dev.uuid,
        visible_id=mig.uuid,
        gpu_index=dev.index,
        attributes=attrs,
        capacity={
            "multiprocessors": Capacity(str(mig.multiprocessors)),
            "copyEngines": Capacity(str(mig.engines_copy)),
            "decoders": Capacity(str(mig.engines_decoder)),
            "encoders": Capacity(str(mig.engines_encoder)),
            "jpegEngines": Capacity(str(mig.engines_jpeg)),
            "ofaEngines": Capacity(str(mig.engines_ofa)),
            "memory": Capacity(f"{mig.memory_mib}Mi"),
        },
        taints=taints,
    )


def build_slice(
    inv: Inventory,
    node: str,
    driver: str = DEFAULT_DRIVER,
    *,
    unhealthy: Mapping[str, int] | None = None,
    effect: str = "NoSchedule",
    shares: bool = False,
) -> NodeSlice:
    """The node's pool. ``unhealthy``: GPU UUID -> the XID that made it so (0 when unknown); ``shares``: whole
    GPUs with consumable capacity."""
    bad = unhealthy or {}
    devices: list[DraDevice] = []
    for dev in sorted(inv.devices, key=lambda d: d.index):
        taints: tuple[Taint, ...] = ()
        if dev.uuid in bad and effect != "None":
            taints = (Taint(f"{driver}/xid", str(bad[dev.uuid]), effect),)
        if not dev.mig_enabled:
            devices.append(gpu_device(dev, inv, taints, shares=shares))
            continue
        for mig in sorted(dev.mig_instances, key=lambda m: (m.placement_start, m.profile)):
            if mig.slices_ci == mig.slices_gi:  # a CI spanning its GI: a device (as the device plugin)
                devices.append(mig_device(dev, mig, inv, taints))
    return NodeSlice(driver, node, tuple(devices), {d.name: d for d in devices})
