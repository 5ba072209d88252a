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
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpusched.agent.dra.migdynamic import GpuPartitions, MigPart, Placement, partitions
from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance
from gpusched.agent.labels import family
from gpusched.core.errors import InvalidInput

#: NVIDIA's driver name: DeviceClasses ``gpu.nvidia.com`` / ``mig.nvidia.com`` select by it.
DEFAULT_DRIVER = "gpu.nvidia.com"
TAINT_EFFECTS = ("NoSchedule", "NoExecute", "None")
MIG_MODES = ("static", "dynamic")
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


def check_mig_mode(mode: str) -> str:
    if mode not in MIG_MODES:
        raise DraConfigError(f"--dra-mig {mode!r}: one of {', '.join(MIG_MODES)}")
    return mode


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
    gpu_minor: int
    """The GPU's device minor (``/dev/nvidia<minor>``; NVML's minor number, not necessarily its index)."""
    attributes: Mapping[str, Attribute]
    capacity: Mapping[str, Capacity]
    taints: tuple[Taint, ...] = ()
    shared: bool = False
    """``allowMultipleAllocations``: GPU shares take parts of its consumable capacity."""
    counter_set: str = ""
    counters: Mapping[str, str] = field(default_factory=dict)
    """What the device consumes of ``counter_set`` (dynamic MIG: its GPU's counters)."""
    placement: Placement | None = None
    """Dynamic MIG: the placement Prepare creates (``visible_id`` is then the new instance's UUID)."""
    mig: tuple[int, int] | None = None
    """A configured MIG device: its GPU instance and compute instance IDs (its CDI capability nodes)."""

    def to_api(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "attributes": {k: {a.kind: a.value} for k, a in sorted(self.attributes.items())},
            "capacity": {k: c.to_api() for k, c in sorted(self.capacity.items())},
        }
        if self.counters:
            out["consumesCounters"] = [{"counterSet": self.counter_set, "counters": _values(self.counters)}]
        if self.shared:
            out["allowMultipleAllocations"] = True
        if self.taints:
            out["taints"] = [{"key": t.key, "value": t.value, "effect": t.effect} for t in self.taints]
        return out


def _values(counters: Mapping[str, str]) -> dict[str, dict[str, str]]:
    return {k: {"value": v} for k, v in sorted(counters.items())}


@dataclass(frozen=True)
class CounterSet:
    name: str
    counters: Mapping[str, str]


#: The apiserver's limits: devices per slice (64 once a device has taints or consumes counters), counter sets
#: per slice (a slice holds devices or counter sets, never both).
MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS_OR_TAINTS = 64
MAX_COUNTER_SETS = 8


def _chunks(items: tuple[Any, ...], n: int) -> list[tuple[Any, ...]]:
    return [items[i : i + n] for i in range(0, len(items), n)]


@dataclass(frozen=True)
class NodeSlice:
    """The pool of one node: its devices (and dynamic MIG's counter sets), for one driver."""

    driver: str
    node: str
    devices: tuple[DraDevice, ...]
    by_name: Mapping[str, DraDevice] = field(default_factory=dict)
    counter_sets: tuple[CounterSet, ...] = ()

    @property
    def pool(self) -> str:
        return self.node

    @property
    def name(self) -> str:
        """The first (usually the only) slice's name."""
        return f"{self.node}-{self.driver}"[:MAX_NAME].rstrip(".-")

    def _name(self, suffix: str) -> str:
        return f"{self.name[: MAX_NAME - len(suffix) - 1]}-{suffix}"

    def specs(self, generation: int) -> list[tuple[str, dict[str, Any]]]:
        """The pool's slices: ``(name, spec)``. The devices in slices of at most the apiserver's limit (the
        first named ``name``, the next ``<name>-1``...), the counter sets in their own
        (``<name>-counters``, ``<name>-counters-1``...); all with the pool's generation and slice count."""
        limit = MAX_DEVICES
        if any(d.counters or d.taints for d in self.devices):
            limit = MAX_DEVICES_WITH_COUNTERS_OR_TAINTS
        parts: list[tuple[str, dict[str, Any]]] = []
        for k, chunk in enumerate(_chunks(self.devices, limit) or [()]):
            parts.append((self._name(str(k)) if k else self.name, {"devices": [d.to_api() for d in chunk]}))
        for k, sets in enumerate(_chunks(self.counter_sets, MAX_COUNTER_SETS)):
            counters = [{"name": c.name, "counters": _values(c.counters)} for c in sets]
            parts.append((self._name(f"counters-{k}" if k else "counters"), {"sharedCounters": counters}))
        pool = {"name": self.pool, "generation": generation, "resourceSliceCount": len(parts)}
        return [
            (name, {"driver": self.driver, "nodeName": self.node, "pool": pool, **body})
            for name, body in parts
        ]

    def spec(self, generation: int) -> dict[str, Any]:
        """The first slice's spec (the devices, when they fit one slice)."""
        return self.specs(generation)[0][1]


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
        "minor": Attribute("int", dev.device_minor),
        **_common(dev, inv),
    }
    return DraDevice(
        name=f"gpu-{dev.index}",
        gpu_uuid=dev.uuid,
        visible_id=dev.uuid,
        gpu_index=dev.index,
        gpu_minor=dev.device_minor,
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
        gpu_minor=dev.device_minor,
        mig=(mig.gi_id, mig.ci_id),
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


def dynamic_mig_device(
    dev: GpuDevice, part: MigPart, common: Mapping[str, Attribute], taints: tuple[Taint, ...], cset: str
) -> DraDevice:
    """A placement not yet created (``migdynamic``): no ``uuid`` until Prepare makes the instance."""
    attrs = {
        "type": Attribute("string", "mig"),
        "parentUUID": Attribute("string", dev.uuid),
        "parentIndex": Attribute("int", dev.index),
        "profile": Attribute("string", part.placement.profile),
        **common,
    }
    cap = {k: Capacity(_quantity(k, v)) for k, v in part.capacity.items()}
    counters = {k: _quantity(k, v) for k, v in part.counters.items()}
    return DraDevice(
        name=part.name, gpu_uuid=dev.uuid, visible_id="", gpu_index=dev.index,
        gpu_minor=dev.device_minor, attributes=attrs,
        capacity=cap, taints=taints, counter_set=cset, counters=counters, placement=part.placement,
    )  # fmt: skip


def _quantity(name: str, value: int) -> str:
    return f"{value}Mi" if name == "memory" else str(value)


def _counter_set(parts: GpuPartitions) -> CounterSet:
    return CounterSet(parts.counter_set, {k: _quantity(k, v) for k, v in parts.counters.items()})


def build_slice(
    inv: Inventory,
    node: str,
    driver: str = DEFAULT_DRIVER,
    *,
    unhealthy: Mapping[str, int] | None = None,
    effect: str = "NoSchedule",
    shares: bool = False,
    mig: str = "static",
    ours: Collection[str] = (),
) -> NodeSlice:
    """The node's pool. ``unhealthy``: GPU UUID -> the XID that made it so (0 when unknown); ``shares``: whole
    GPUs with consumable capacity; ``mig``: ``static`` publishes the MIG devices configured on GPUs in MIG
    mode, ``dynamic`` every placement of their profiles (``migdynamic``), where ``ours`` are the MIG UUIDs
    prepared claims made (their placements stay published; other instances block theirs)."""
    bad = unhealthy or {}
    devices: list[DraDevice] = []
    counter_sets: list[CounterSet] = []
    for dev in sorted(inv.devices, key=lambda d: d.index):
        taints: tuple[Taint, ...] = ()
        if dev.uuid in bad and effect != "None":
            taints = (Taint(f"{driver}/xid", str(bad[dev.uuid]), effect),)
        if not dev.mig_enabled:
            devices.append(gpu_device(dev, inv, taints, shares=shares))
            continue
        foreign = [(m.placement_start, m.placement_size) for m in dev.mig_instances if m.uuid not in ours]
        parts = partitions(dev, foreign) if mig == "dynamic" else None
        if parts is not None:
            counter_sets.append(_counter_set(parts))
            common = _common(dev, inv)  # the parent's attributes, once per GPU
            devices += [dynamic_mig_device(dev, p, common, taints, parts.counter_set) for p in parts.parts]
            continue
        for m in sorted(dev.mig_instances, key=lambda m: (m.placement_start, m.profile)):
            if m.slices_ci == m.slices_gi:  # a CI spanning its GI: a device (as the device plugin)
                devices.append(mig_device(dev, m, inv, taints))
    return NodeSlice(driver, node, tuple(devices), {d.name: d for d in devices}, tuple(counter_sets))
