"""Way (a) on the real backend: the NVML calls that create and destroy one MIG instance (a GPU instance with
one compute instance spanning it) and switch MIG mode (../shared/reference/mig.md §3 and §5).

Profiles are named by the core's table and found through NVML's *index* constants (the same on every model);
the profile IDs every other call takes are read from the driver, never hard-coded (they differ per family).
Every NVML error becomes a ``MigOpError`` naming the GPU, the call and NVML's error.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from gpusched.agent import migprofiles
from gpusched.agent.reshape.apply import MigOpError
from gpusched.core.mig.profiles import Kind

# NVML_GPU_INSTANCE_PROFILE_* index constants per kind of the core's table (mig.md §2a).
GI_INDEX = {"1g": 0, "1g+me": 7, "1g2": 9, "2g": 1, "3g": 2, "4g": 3, "7g": 4}
# NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE index constants by SM slices: the CI that spans a GI of n slices.
CI_INDEX = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4, 8: 5, 6: 6}
MIB = 1024 * 1024


def _str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlMig:
    """The MIG reshaping calls on one NVML device handle ``h`` (``n`` is the pynvml module)."""

    def __init__(self, n: Any, h: Any, index: int) -> None:
        self.n, self.h, self.index = n, h, index

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.n.NVMLError as e:
            raise MigOpError(f"GPU {self.index}: {what}: NVML: {e}") from None

    def kind(self, profile: str) -> Kind:
        name = _str(self.n.nvmlDeviceGetName(self.h))
        table = migprofiles.profiles(name, int(self.n.nvmlDeviceGetMemoryInfo(self.h).total // MIB))
        p = table.get(profile)
        if p is None:
            raise MigOpError(f"GPU {self.index} ({name}) has no MIG profile {profile!r}")
        return p.kind

    def gi_profile_id(self, kind: Kind) -> int:
        info = self.call(
            "GPU instance profile", self.n.nvmlDeviceGetGpuInstanceProfileInfo, self.h, GI_INDEX[kind.key]
        )
        return int(info.id)

    def set_mig_mode(self, enabled: bool) -> None:
        n = self.n
        self.call("nvmlDeviceSetMigMode", n.nvmlDeviceSetMigMode, self.h, 1 if enabled else 0)
        current, pending = self.call("nvmlDeviceGetMigMode", n.nvmlDeviceGetMigMode, self.h)
        if current != pending:  # Ampere: the driver resets the GPU; every client must let go first
            raise MigOpError(f"GPU {self.index}: MIG mode {pending} waits for a GPU reset (now {current})")

    def create(self, profile: str, start: int) -> None:
        n = self.n
        kind = self.kind(profile)
        where = n.c_nvmlGpuInstancePlacement_t(start, kind.mem_slices)
        gi = self.call(
            f"create GPU instance {profile} at {start}",
            n.nvmlDeviceCreateGpuInstanceWithPlacement,
            self.h,
            self.gi_profile_id(kind),
            ctypes.byref(where),
        )
        try:
            ci = self.call(
                "compute instance profile",
                n.nvmlGpuInstanceGetComputeInstanceProfileInfo,
                gi,
                CI_INDEX[kind.sm_slices],
                n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
            )
            self.call(
                f"create compute instance in {profile} at {start}",
                n.nvmlGpuInstanceCreateComputeInstance,
                gi,
                ci.id,
            )
        except MigOpError:
            # no half instance: the GPU instance goes again
            self.call(f"destroy GPU instance {profile} at {start}", n.nvmlGpuInstanceDestroy, gi)
            raise

    def destroy(self, gi_id: int, what: str) -> None:
        """The GPU instance ``gi_id`` (``what`` names it in errors): its compute instances, then itself."""
        n = self.n
        gi = self.call(f"find GPU instance of {what}", n.nvmlDeviceGetGpuInstanceById, self.h, gi_id)
        full = None
        for ci_index in sorted(set(CI_INDEX.values())):
            try:
                info = n.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, ci_index, n.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except n.NVMLError:
                continue  # a CI profile this GI does not have
            full = info  # the largest CI profile the GI has: the one spanning it
            cis = (n.c_nvmlComputeInstance_t * max(int(info.instanceCount), 1))()
            count = ctypes.c_uint(len(cis))
            self.call(
                "list compute instances",
                n.nvmlGpuInstanceGetComputeInstances,
                gi,
                info.id,
                cis,
                ctypes.byref(count),
            )
            for k in range(count.value):
                self.call(f"destroy compute instance of {what}", n.nvmlComputeInstanceDestroy, cis[k])
        try:
            self.call(f"destroy GPU instance of {what}", n.nvmlGpuInstanceDestroy, gi)
        except MigOpError:  # give the GI a compute instance back: the instance stays usable
            if full is not None:
                self.call("re-create compute instance", n.nvmlGpuInstanceCreateComputeInstance, gi, full.id)
            raise
