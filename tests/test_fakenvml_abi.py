"""hack/fakenvml's struct layouts and error codes against NVIDIA's own nvml.h: one C program prints every
size, field offset and constant the fake defines, compiled once against fakenvml.h and once against nvml.h
(from the go-nvml module in the Go module cache, which hack/build-nvidia-device-plugin.sh downloads; or
$GPUSCHED_NVML_HEADER). The outputs must be identical."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

from realparts import unavailable

ROOT = Path(__file__).resolve().parents[1]

STRUCTS: dict[str, tuple[str, ...]] = {
    "nvmlPciInfo_t": ("busIdLegacy", "domain", "bus", "device", "pciDeviceId", "pciSubSystemId", "busId"),
    "nvmlMemory_t": ("total", "free", "used"),
    "nvmlMemory_v2_t": ("version", "total", "reserved", "free", "used"),
    "nvmlUtilization_t": ("gpu", "memory"),
    "nvmlEventData_t": ("device", "eventType", "eventData", "gpuInstanceId", "computeInstanceId"),
    "nvmlDeviceAttributes_t": (
        "multiprocessorCount",
        "sharedCopyEngineCount",
        "sharedDecoderCount",
        "sharedEncoderCount",
        "sharedJpegCount",
        "sharedOfaCount",
        "gpuInstanceSliceCount",
        "computeInstanceSliceCount",
        "memorySizeMB",
    ),
    "nvmlGpuInstancePlacement_t": ("start", "size"),
    "nvmlGpuInstanceProfileInfo_t": ("id", "isP2pSupported", "sliceCount", "instanceCount", "memorySizeMB"),
    "nvmlGpuInstanceProfileInfo_v2_t": ("version", "id", "sliceCount", "ofaCount", "memorySizeMB", "name"),
    "nvmlGpuInstanceProfileInfo_v3_t": (
        "version",
        "id",
        "sliceCount",
        "memorySizeMB",
        "name",
        "capabilities",
    ),
    "nvmlGpuInstanceInfo_t": ("device", "id", "profileId", "placement"),
    "nvmlComputeInstancePlacement_t": ("start", "size"),
    "nvmlComputeInstanceProfileInfo_t": ("id", "sliceCount", "instanceCount", "sharedOfaCount"),
    "nvmlComputeInstanceProfileInfo_v2_t": ("version", "id", "sharedOfaCount", "name"),
    "nvmlComputeInstanceProfileInfo_v3_t": ("version", "id", "sharedOfaCount", "name", "capabilities"),
    "nvmlComputeInstanceInfo_t": ("device", "gpuInstance", "id", "profileId", "placement"),
    "nvmlProcessInfo_t": ("pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId"),
}
CONSTANTS = (
    "NVML_SUCCESS",
    "NVML_ERROR_UNINITIALIZED",
    "NVML_ERROR_INVALID_ARGUMENT",
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_NOT_FOUND",
    "NVML_ERROR_INSUFFICIENT_SIZE",
    "NVML_ERROR_DRIVER_NOT_LOADED",
    "NVML_ERROR_TIMEOUT",
    "NVML_ERROR_FUNCTION_NOT_FOUND",
    "NVML_ERROR_IN_USE",
    "NVML_ERROR_MEMORY",
    "NVML_ERROR_INSUFFICIENT_RESOURCES",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    "NVML_ERROR_UNKNOWN",
)
VERSIONED = (  # (struct, version): the version words callers put in the struct's first field
    ("nvmlMemory_v2_t", 2),
    ("nvmlGpuInstanceProfileInfo_v2_t", 2),
    ("nvmlGpuInstanceProfileInfo_v3_t", 3),
    ("nvmlComputeInstanceProfileInfo_v2_t", 2),
    ("nvmlComputeInstanceProfileInfo_v3_t", 3),
)


def _program() -> str:
    lines = [
        "#include <stdio.h>",
        "#include <stddef.h>",
        "#ifdef USE_NVIDIA",
        '#include "nvml.h"',
        "#else",
        '#include "fakenvml.h"',
        "#endif",
        "int main(void) {",
    ]
    for s, fields in STRUCTS.items():
        lines.append(f'  printf("{s} size %zu\\n", sizeof({s}));')
        lines += [f'  printf("{s}.{f} %zu\\n", offsetof({s}, {f}));' for f in fields]
    lines += [f'  printf("{c} %d\\n", (int){c});' for c in CONSTANTS]
    lines += [f'  printf("{s} version %u\\n", (unsigned)(sizeof({s}) | ({v}u << 24)));' for s, v in VERSIONED]
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def _nvml_header() -> Path:
    if os.environ.get("GPUSCHED_NVML_HEADER"):
        return Path(os.environ["GPUSCHED_NVML_HEADER"])
    cache = os.environ.get("GOMODCACHE") or str(Path.home() / "go" / "pkg" / "mod")
    found = sorted(glob.glob(f"{cache}/github.com/!n!v!i!d!i!a/go-nvml@*/pkg/nvml/nvml.h"))
    if not found:
        unavailable(
            "NVIDIA's nvml.h is not here (hack/build-nvidia-device-plugin.sh fetches the go-nvml module)"
        )
    return Path(found[-1])


def _run(src: Path, include: Path, tmp: Path, *defines: str) -> str:
    exe = tmp / ("abi-" + ("nvidia" if defines else "fake"))
    subprocess.run(["gcc", *defines, f"-I{include}", "-o", str(exe), str(src)], check=True)
    return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout


def test_struct_layouts_and_codes_match_nvidias_header(tmp_path: Path) -> None:
    if not shutil.which("gcc"):
        unavailable("gcc is not installed")
    header = _nvml_header()
    src = tmp_path / "abi.c"
    src.write_text(_program())
    fake = _run(src, ROOT / "hack" / "fakenvml", tmp_path)
    nvidia = _run(src, header.parent, tmp_path, "-DUSE_NVIDIA")
    assert fake.splitlines() == nvidia.splitlines()
    assert len(fake.splitlines()) > 90
