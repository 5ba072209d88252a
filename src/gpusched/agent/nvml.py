"""The real backend: the NVIDIA driver through NVML (``nvidia-ml-py``, module ``pynvml``), imported lazily so
that
machines without a driver can import the agent and use the fake backend."""

from __future__ import annotations

import math
import socket
from pathlib import Path
from typing import Any

from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance, Readings, XidEvent
from gpusched.agent.reshape.apply import MigOpError
from gpusched.agent.reshape.nvmlops import NvmlMig
from gpusched.core.errors import GpuschedError

DMI_PRODUCT = Path("/sys/class/dmi/id/product_name")


ME_PROFILE_INDEX = 7  # NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1: the 1g profile with media engines


def mig_profile_name(gi_slices: int, ci_slices: int, mig_mib: int, total_bytes: int, suffix: str = "") -> str:
    """The MIG profile name as go-nvlib writes it (``MigProfileInfo.String``, ``getMigMemorySizeGB``): the
    memory share rounded up to eighths, times the GPU's memory in whole GiB rounded up; ``<c>c.`` only when
    the compute instance is smaller than its GPU instance."""
    frac = math.ceil(mig_mib * 1024 * 1024 / total_bytes * 8) / 8
    total_gb = -(-total_bytes // (1024**3))
    gb = math.floor(frac * total_gb + 0.5)
    name = f"{gi_slices}g.{gb}gb{suffix}"
    return name if ci_slices == gi_slices else f"{ci_slices}c.{name}"


class NvmlUnavailable(GpuschedError, RuntimeError):
    pass


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlBackend:
    def __init__(self, hostname: str | None = None) -> None:
        try:
            import pynvml
        except ImportError as e:  # pragma: no cover - the pin installs it
            raise NvmlUnavailable(f"nvidia-ml-py is not installed: {e}") from None
        self._n = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as e:
            raise NvmlUnavailable(f"NVML cannot start (no NVIDIA driver here?): {e}") from None
        self._hostname = hostname or socket.gethostname()
        self._events: Any = None
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def _try(self, fn: Any, *args: Any, default: Any = None) -> Any:
        try:
            return fn(*args)
        except self._n.NVMLError:
            return default

    def inventory(self) -> Inventory:
        n = self._n
        devices = []
        for i, h in enumerate(self._handles):
            mig_current = self._try(n.nvmlDeviceGetMigMode, h, default=None)
            capable = mig_current is not None
            enabled = bool(capable and mig_current[0])
            cc = self._try(n.nvmlDeviceGetCudaComputeCapability, h, default=(0, 0))
            pci = n.nvmlDeviceGetPciInfo(h)
            numa = self._try(getattr(n, "nvmlDeviceGetNumaNodeId", lambda _h: None), h)
            minor = self._try(n.nvmlDeviceGetMinorNumber, h)
            devices.append(
                GpuDevice(
                    index=i,
                    uuid=_str(n.nvmlDeviceGetUUID(h)),
                    name=_str(n.nvmlDeviceGetName(h)),
                    memory_mib=int(n.nvmlDeviceGetMemoryInfo(h).total // (1024 * 1024)),
                    pci_bus_id=_str(pci.busId),
                    compute_major=int(cc[0]),
                    compute_minor=int(cc[1]),
                    mig_capable=capable,
                    mig_enabled=enabled,
                    mig_instances=self._mig_instances(h) if enabled else (),
                    nvlink_peers=self._nvlink_peers(h),
                    numa_node=numa if isinstance(numa, int) else None,
                    minor=int(minor) if minor is not None else None,
                )
            )
        cuda = int(n.nvmlSystemGetCudaDriverVersion())
        try:
            machine = DMI_PRODUCT.read_text().strip() or "unknown"
        except OSError:
            machine = "unknown"
        return Inventory(
            hostname=self._hostname,
            driver_version=_str(n.nvmlSystemGetDriverVersion()),
            cuda_driver_version=(cuda // 1000, cuda % 1000 // 10),
            devices=tuple(devices),
            machine=machine,
        )

    def _mig_instances(self, h: Any) -> tuple[MigInstance, ...]:
        n = self._n
        out = []
        for k in range(self._try(n.nvmlDeviceGetMaxMigDeviceCount, h, default=0)):
            m = self._try(n.nvmlDeviceGetMigDeviceHandleByIndex, h, k)
            if m is None:
                continue  # an empty index: skip it, don't stop
            a = n.nvmlDeviceGetAttributes(m)
            gi_id = int(n.nvmlDeviceGetGpuInstanceId(m))
            start, size, suffix = 0, int(a.gpuInstanceSliceCount), ""
            gi = self._try(n.nvmlDeviceGetGpuInstanceById, h, gi_id)
            if gi is not None:
                info = n.nvmlGpuInstanceGetInfo(gi)
                start, size = int(info.placement.start), int(info.placement.size)
                if int(info.profileId) in self._me_profile_ids(h):
                    suffix = "+me"
            profile = mig_profile_name(
                int(a.gpuInstanceSliceCount),
                int(a.computeInstanceSliceCount),
                int(a.memorySizeMB),
                int(n.nvmlDeviceGetMemoryInfo(h).total),
                suffix,
            )
            out.append(
                MigInstance(
                    profile=profile,
                    placement_start=start,
                    placement_size=size,
                    uuid=_str(n.nvmlDeviceGetUUID(m)),
                    gi_id=gi_id,
                    ci_id=int(n.nvmlDeviceGetComputeInstanceId(m)),
                    memory_mib=int(a.memorySizeMB),
                    multiprocessors=int(a.multiprocessorCount),
                    slices_gi=int(a.gpuInstanceSliceCount),
                    slices_ci=int(a.computeInstanceSliceCount),
                    engines_copy=int(a.sharedCopyEngineCount),
                    engines_decoder=int(a.sharedDecoderCount),
                    engines_encoder=int(a.sharedEncoderCount),
                    engines_jpeg=int(a.sharedJpegCount),
                    engines_ofa=int(a.sharedOfaCount),
                )
            )
        return tuple(out)

    def _me_profile_ids(self, h: Any) -> set[int]:
        """GI profile IDs of the ``+me`` profile (NVML index constant 1_SLICE_REV1 = 7) on this GPU."""
        info = self._try(self._n.nvmlDeviceGetGpuInstanceProfileInfo, h, ME_PROFILE_INDEX)
        return {int(info.id)} if info is not None else set()

    def _nvlink_peers(self, h: Any) -> tuple[int, ...]:
        n = self._n
        peers: set[int] = set()
        for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
            if self._try(n.nvmlDeviceGetNvLinkState, h, link) != 1:
                continue
            remote = self._try(n.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
            if remote is None:
                continue
            for j, other in enumerate(self._handles):
                if _str(n.nvmlDeviceGetPciInfo(other).busId).lower() == _str(remote.busId).lower():
                    peers.add(j)
        return tuple(sorted(peers))

    def readings(self, index: int) -> Readings:
        n = self._n
        h = self._handles[index]
        util = self._try(n.nvmlDeviceGetUtilizationRates, h)
        mem = self._try(n.nvmlDeviceGetMemoryInfo, h)
        temp = self._try(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        power = self._try(n.nvmlDeviceGetPowerUsage, h)
        return Readings(
            gpu_util_percent=float(util.gpu) if util is not None else None,
            memory_used_mib=int(mem.used // (1024 * 1024)) if mem is not None else None,
            memory_free_mib=int(mem.free // (1024 * 1024)) if mem is not None else None,
            temperature_c=float(temp) if temp is not None else None,
            power_w=power / 1000.0 if power is not None else None,
        )

    def mig_readings(self, index: int) -> dict[str, Readings]:
        """Each MIG device's framebuffer, from ``nvmlDeviceGetMemoryInfo`` on its own handle (nvml.h:
        "per-instance information can be queried by using specific MIG device handles"); a refused query
        gives None."""
        n = self._n
        h = self._handles[index]
        mode = self._try(n.nvmlDeviceGetMigMode, h)
        if mode is None or not mode[0]:
            return {}
        out: dict[str, Readings] = {}
        for k in range(self._try(n.nvmlDeviceGetMaxMigDeviceCount, h, default=0)):
            m = self._try(n.nvmlDeviceGetMigDeviceHandleByIndex, h, k)
            if m is None:
                continue  # an empty index
            mem = self._try(n.nvmlDeviceGetMemoryInfo, m)
            out[_str(n.nvmlDeviceGetUUID(m))] = Readings(
                memory_used_mib=int(mem.used // (1024 * 1024)) if mem is not None else None,
                memory_free_mib=int(mem.free // (1024 * 1024)) if mem is not None else None,
            )
        return out

    def poll_xids(self, timeout_s: float) -> list[XidEvent]:
        n = self._n
        if self._events is None:
            self._events = n.nvmlEventSetCreate()
            for h in self._handles:
                self._try(n.nvmlDeviceRegisterEvents, h, n.nvmlEventTypeXidCriticalError, self._events)
        out: list[XidEvent] = []
        wait_ms = int(timeout_s * 1000)
        while True:  # every event already there, as the fake backend gives them: wait only for the first
            try:
                data = n.nvmlEventSetWait(self._events, wait_ms)
            except n.NVMLError:
                return out  # timeout
            wait_ms = 0
            uuid = _str(n.nvmlDeviceGetUUID(data.device))
            index = next(
                (i for i, h in enumerate(self._handles) if _str(n.nvmlDeviceGetUUID(h)) == uuid), None
            )
            if index is not None:
                out.append(XidEvent(index, int(data.eventData)))

    # MIG reshaping (agent/reshape/apply.py): GPU and compute instances created and destroyed through NVML
    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        NvmlMig(self._n, self._handles[gpu_index], gpu_index).set_mig_mode(enabled)

    def create_mig_instance(self, gpu_index: int, profile: str, start: int) -> MigInstance:
        h = self._handles[gpu_index]
        NvmlMig(self._n, h, gpu_index).create(profile, start)
        made = [m for m in self._mig_instances(h) if (m.placement_start, m.profile) == (start, profile)]
        if not made:
            raise MigOpError(f"GPU {gpu_index}: MIG {profile} at {start} was created but is not listed")
        return made[0]

    def destroy_mig_instance(self, gpu_index: int, uuid: str) -> MigInstance:
        h = self._handles[gpu_index]
        gone = next((m for m in self._mig_instances(h) if m.uuid == uuid), None)
        if gone is None:
            raise MigOpError(f"GPU {gpu_index} has no MIG device {uuid}")
        NvmlMig(self._n, h, gpu_index).destroy(gone.gi_id, f"{gone.profile} at {gone.placement_start}")
        return gone

    def close(self) -> None:
        if self._events is not None:
            self._try(self._n.nvmlEventSetFree, self._events)
        self._try(self._n.nvmlShutdown)
