"""What the agent knows about a node's GPUs: a typed inventory, the readings, and the backend protocol.

Two backends implement :class:`GpuBackend`: :mod:`gpusched.agent.nvml` (the NVIDIA driver through
``nvidia-ml-py``, imported lazily) and :mod:`gpusched.agent.fake` (a file or env var, for CI and the kubelet
e2e).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

# XIDs after which NVIDIA says the GPU needs a reset or has failed (the device plugin's default set marks a
# device unhealthy on any XID except the application errors 13, 31, 43, 45, 68, 109; we list the critical ones
# named in NVIDIA's XID catalogue as "reset GPU" / "contact support").
CRITICAL_XIDS = frozenset({48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def is_critical_xid(xid: int) -> bool:
    return xid in CRITICAL_XIDS


@dataclass(frozen=True)
class MigInstance:
    """One MIG device (a compute instance spanning its GPU instance), as the mixed strategy exposes it."""

    profile: str  # e.g. "1g.10gb", "1g.10gb+me"
    placement_start: int
    placement_size: int
    uuid: str  # MIG-<uuid>
    gi_id: int = 0
    ci_id: int = 0
    memory_mib: int = 0
    multiprocessors: int = 0
    slices_gi: int = 0
    slices_ci: int = 0
    engines_copy: int = 0
    engines_decoder: int = 0
    engines_encoder: int = 0
    engines_jpeg: int = 0
    engines_ofa: int = 0

    @property
    def resource_profile(self) -> str:
        """The profile as a resource-name suffix: '+' becomes '.' (``nvidia.com/mig-1g.10gb.me``)."""
        return self.profile.replace("+", ".")


@dataclass(frozen=True)
class GpuDevice:
    index: int
    uuid: str
    name: str  # NVML's name, e.g. "NVIDIA A100-SXM4-80GB", "Tesla T4"
    memory_mib: int
    pci_bus_id: str  # e.g. "00000000:07:00.0"
    compute_major: int
    compute_minor: int
    mig_capable: bool = False
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    nvlink_peers: tuple[int, ...] = ()  # indices of GPUs reachable over NVLink
    numa_node: int | None = None
    pci_class: int = 0x0302  # 3D controller ("compute"); 0x0300 is VGA ("graphics")
    minor: int | None = None
    """NVML's minor number (``nvmlDeviceGetMinorNumber``): the GPU's device node is ``/dev/nvidia<minor>``.
    It need not equal the index (NVML orders by PCI bus, the driver numbers in probe order); None: unknown,
    taken to be the index."""

    @property
    def device_minor(self) -> int:
        """The minor of the GPU's device node (and of ``gpu<minor>`` in the driver's capability paths)."""
        return self.index if self.minor is None else self.minor

    @property
    def device_node(self) -> str:
        """The GPU's device node under ``/dev``: ``nvidia<minor>``."""
        return f"nvidia{self.device_minor}"


@dataclass(frozen=True)
class Inventory:
    hostname: str
    driver_version: str  # "550.107.02"
    cuda_driver_version: tuple[int, int]  # (12, 4)
    devices: tuple[GpuDevice, ...]
    machine: str = "unknown"

    def by_index(self, index: int) -> GpuDevice | None:
        return next((d for d in self.devices if d.index == index), None)

    def by_uuid(self, uuid: str) -> GpuDevice | None:
        return next((d for d in self.devices if d.uuid == uuid), None)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["cuda_driver_version"] = f"{self.cuda_driver_version[0]}.{self.cuda_driver_version[1]}"
        return d


@dataclass(frozen=True)
class Readings:
    """One sample of a GPU's state. Fields the driver cannot give are None."""

    gpu_util_percent: float | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None


@dataclass(frozen=True)
class XidEvent:
    gpu_index: int
    xid: int

    @property
    def critical(self) -> bool:
        return is_critical_xid(self.xid)


@dataclass
class XidHistory:
    """The last XID seen per GPU (dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` is the last XID's value)."""

    last: dict[int, int] = field(default_factory=dict)


class GpuBackend(Protocol):
    """Where the agent reads GPUs from."""

    def inventory(self) -> Inventory: ...

    def readings(self, index: int) -> Readings: ...

    def mig_readings(self, index: int) -> Mapping[str, Readings]:
        """Per MIG device (UUID) of GPU ``index`` in MIG mode, what NVML gives for its handle: its GPU
        instance's framebuffer (``nvmlDeviceGetMemoryInfo``), None where NVML refuses; the other fields are
        always None (NVML attributes no utilization, temperature or power to a MIG device). Empty for a GPU
        out of MIG mode."""
        ...

    def poll_xids(self, timeout_s: float) -> list[XidEvent]:
        """XID events since the last call; waits at most ``timeout_s`` for one."""
        ...

    def close(self) -> None: ...
