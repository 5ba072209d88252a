"""The agent's real NVML backend (nvidia-ml-py over a C ``libnvidia-ml.so.1``) on hack/fakenvml's fake
library, driven by the same fake-GPU files as the fake backend: both backends must give the same inventory,
readings, labels, metrics and XIDs. Then the library's own NVML behaviour: MIG create/destroy, error codes,
topology.

The library is built by hack/build-fake-nvml.sh (gcc; cached) or taken from $GPUSCHED_FAKE_NVML_LIB. It is
loaded into this process once (RTLD_GLOBAL, so pynvml's dlopen of ``libnvidia-ml.so.1`` finds it by its
soname); each nvmlInit after the last nvmlShutdown re-reads $GPUSCHED_FAKE_NVML_CONFIG.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpusched.agent import labels
from gpusched.agent.fake import FakeBackend
from gpusched.agent.fakenvml import flat_config
from gpusched.agent.inventory import GpuBackend, Inventory
from gpusched.agent.metrics import GpuCollector
from gpusched.agent.nvml import NvmlBackend, NvmlUnavailable
from realparts import unavailable

ROOT = Path(__file__).resolve().parents[1]
CONFIG_ENV = "GPUSCHED_FAKE_NVML_CONFIG"

# Fake node shapes: whole GPUs (NVLink, NUMA, readings, XIDs), MIG mixed with +me and a free slice, A30
# quarters, one MIG type per GPU (the single strategy), several models.
SHAPES: dict[str, dict[str, Any]] = {
    "whole-gpus": {
        "hostname": "node-w",
        "driverVersion": "550.107.02",
        "cudaVersion": "12.4",
        "gpus": [
            {
                "model": "NVIDIA H100 80GB HBM3",
                "count": 2,
                "numaNode": 0,
                "readings": {"utilization": 87, "memoryUsedMiB": 40000, "temperature": 51, "power": 612.5},
            },
            {"model": "NVIDIA A100-SXM4-40GB", "nvlinkPeers": [3, 0], "numaNode": 1, "xids": [79, 13]},
            {"model": "NVIDIA A100-SXM4-40GB", "nvlinkPeers": [2], "numaNode": 1},
            {"model": "Tesla T4"},
            {"model": "NVIDIA L4", "readings": {"temperature": 38}},
        ],
    },
    "mig-mixed": {
        "hostname": "node-m",
        "driverVersion": "535.161.08",
        "cudaVersion": "12.2",
        "gpus": [
            {
                "model": "NVIDIA A100-SXM4-80GB",
                "migMode": True,
                "mig": [
                    {"profile": "3g.40gb", "start": 4, "memoryUsedMiB": 12000},
                    {"profile": "1g.10gb+me", "start": 0},
                    {"profile": "2g.20gb", "start": 2},
                ],
            },
            {"model": "NVIDIA A100-SXM4-80GB", "migMode": True},
            {"model": "NVIDIA A100-SXM4-80GB"},
            {
                "model": "NVIDIA A30",
                "migMode": True,
                "mig": [{"profile": "2g.12gb", "start": 2, "memoryUsedMiB": 512}],
            },
        ],
    },
    "mig-single": {
        "hostname": "node-s",
        "gpus": [
            {
                "model": "NVIDIA H100 NVL",
                "count": 2,
                "migMode": True,
                "mig": [{"profile": "1g.12gb", "start": s} for s in range(7)],
            },
        ],
    },
    "mig-a100-40gb-b200": {
        "hostname": "node-b",
        "driverVersion": "570.86.15",
        "cudaVersion": "12.8",
        "gpus": [
            {
                "model": "NVIDIA A100-SXM4-40GB",
                "migMode": True,
                "mig": [
                    {"profile": "1g.10gb", "start": 6},
                    {"profile": "1g.5gb+me", "start": 0},
                    {"profile": "1g.5gb", "start": 1},
                    {"profile": "2g.10gb", "start": 2},
                ],
            },
            {
                "model": "NVIDIA B200",
                "memoryMiB": 183359,
                "computeCapability": "10.0",
                "migMode": True,
                "mig": [{"profile": "7g.180gb", "start": 0}],
            },
        ],
    },
    "mig-h200": {
        "hostname": "node-h",
        "gpus": [
            {
                "model": "NVIDIA H200",
                "migMode": True,
                "mig": [{"profile": "4g.71gb", "start": 0}, {"profile": "1g.35gb", "start": 4}],
            },
        ],
    },
    "minors-differ": {  # NVML's order (PCI bus) is not the driver's device-node order
        "hostname": "node-n",
        "gpus": [
            {"model": "NVIDIA A100-SXM4-80GB", "minor": 2},
            {"model": "NVIDIA A100-SXM4-80GB", "minor": 0},
            {
                "model": "NVIDIA A100-SXM4-80GB",
                "minor": 1,
                "migMode": True,
                "mig": [{"profile": "3g.40gb", "start": 4}],
            },
        ],
    },
}


@pytest.fixture(scope="session")
def fake_nvml_lib() -> Path:
    """The fake library's directory; loads it into this process."""
    lib_dir = os.environ.get("GPUSCHED_FAKE_NVML_LIB")
    if not lib_dir:
        if not shutil.which(os.environ.get("CC", "gcc")):
            unavailable("the fake libnvidia-ml cannot be built: gcc is not installed")
        out = subprocess.run(
            [str(ROOT / "hack" / "build-fake-nvml.sh")], capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            pytest.fail(f"hack/build-fake-nvml.sh failed:\n{out.stderr}", pytrace=False)
        lib_dir = out.stdout.strip().splitlines()[-1]
    lib = Path(lib_dir) / "libnvidia-ml.so.1"
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    return Path(lib_dir)


@pytest.fixture
def nvml_env(fake_nvml_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeFiles]:
    yield FakeFiles(tmp_path, monkeypatch)


class FakeFiles:
    """Writes one fake-GPU document as both the fake backend's YAML and the library's flat file."""

    def __init__(self, tmp: Path, mp: pytest.MonkeyPatch) -> None:
        self.tmp = tmp
        self.mp = mp

    def use(self, doc: dict[str, Any]) -> FakeBackend:
        path = self.tmp / "gpus.yaml"
        path.write_text(yaml.safe_dump(doc))
        fake = FakeBackend.from_file(path)
        flat = self.tmp / "gpus.flat"
        flat.write_text(flat_config(FakeBackend.from_file(path)))
        self.mp.setenv(CONFIG_ENV, str(flat))
        return fake


def _same_machine(inv: Inventory, like: Inventory) -> Inventory:
    """NVML has no machine type (the agent reads DMI, GFD a file): compare the rest."""
    return dataclasses.replace(inv, machine=like.machine)


def _samples(backend: GpuBackend, xids: dict[int, int]) -> list[tuple[str, str, float]]:
    col = GpuCollector(backend, xids=xids)
    return sorted(
        (s.name, repr(sorted(s.labels.items())), s.value) for fam in col.collect() for s in fam.samples
    )


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_backends_agree(nvml_env: FakeFiles, shape: str) -> None:
    doc = SHAPES[shape]
    fake = nvml_env.use(doc)
    real = NvmlBackend(doc["hostname"])
    try:
        want, got = fake.inventory(), _same_machine(real.inventory(), fake.inventory())
        for a, b in zip(got.devices, want.devices, strict=True):
            assert a == b, f"GPU {a.index}"
        assert got == want
        for d in want.devices:
            assert real.readings(d.index) == fake.readings(d.index), f"GPU {d.index}"
            assert real.mig_readings(d.index) == fake.mig_readings(d.index), f"GPU {d.index}"
        for strategy in ("none", "mixed"):  # the agent labels no 'single' strategy
            assert labels.gfd_labels(got, strategy) == labels.gfd_labels(want, strategy), strategy
        assert labels.topology_annotation(got) == labels.topology_annotation(want)
        assert _samples(real, {0: 79}) == _samples(fake, {0: 79})
        assert real.poll_xids(0.2) == fake.poll_xids(0.2)
        assert real.poll_xids(0.05) == fake.poll_xids(0.05) == []
    finally:
        real.close()


def test_xids_written_to_the_file_arrive_on_both(nvml_env: FakeFiles, tmp_path: Path) -> None:
    xid_file = tmp_path / "xids"
    xid_file.write_text("")
    doc = {**SHAPES["whole-gpus"], "xidFile": str(xid_file)}
    fake = nvml_env.use(doc)
    real = NvmlBackend("node-w")
    try:
        assert real.poll_xids(0.2) == fake.poll_xids(0.2)  # the file's injected 79 and 13 on GPU 2
        with xid_file.open("a") as f:
            f.write("1 48\n4 94\n3 6")  # the last line is not complete yet
        got, want = real.poll_xids(0.5), fake.poll_xids(0.5)
        assert got == want and [(e.gpu_index, e.xid) for e in got] == [(1, 48), (4, 94)]
        with xid_file.open("a") as f:
            f.write("3\n")
        assert real.poll_xids(0.5) == fake.poll_xids(0.5)
    finally:
        real.close()


@pytest.fixture
def nvml(nvml_env: FakeFiles) -> Iterator[Any]:
    import pynvml

    nvml_env.use(SHAPES["mig-mixed"])
    pynvml.nvmlInit()
    yield pynvml
    pynvml.nvmlShutdown()


def test_mig_instances_are_created_and_destroyed_as_nvml_does(nvml: Any) -> None:
    n = nvml
    h = n.nvmlDeviceGetHandleByIndex(1)
    three_g = n.nvmlDeviceGetGpuInstanceProfileInfo(h, n.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert (three_g.id, three_g.sliceCount, three_g.memorySizeMB) == (9, 3, 40960)
    assert three_g.name in ("MIG 3g.40gb", b"MIG 3g.40gb")
    placements = (n.c_nvmlGpuInstancePlacement_t * 4)()
    count = ctypes.c_uint(4)
    n.nvmlDeviceGetGpuInstancePossiblePlacements(h, three_g.id, placements, ctypes.byref(count))
    assert [(placements[i].start, placements[i].size) for i in range(count.value)] == [(0, 4), (4, 4)]
    where = n.c_nvmlGpuInstancePlacement_t(4, 4)
    gi = n.nvmlDeviceCreateGpuInstanceWithPlacement(h, three_g.id, ctypes.byref(where))
    with pytest.raises(n.NVMLError_InsufficientResources):
        n.nvmlDeviceCreateGpuInstanceWithPlacement(h, three_g.id, ctypes.byref(where))
    assert n.nvmlDeviceGetGpuInstanceRemainingCapacity(h, three_g.id) == 1
    ci = n.nvmlGpuInstanceCreateComputeInstance(gi, n.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    mig = n.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    assert n.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert n.nvmlDeviceGetAttributes(mig).memorySizeMB == 40960
    with pytest.raises(n.NVMLError_InUse):
        n.nvmlGpuInstanceDestroy(gi)
    n.nvmlComputeInstanceDestroy(ci)
    n.nvmlGpuInstanceDestroy(gi)
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)


def test_what_it_does_not_have_is_an_nvml_error_not_a_crash(nvml: Any) -> None:
    n = nvml
    t = n.nvmlDeviceGetHandleByIndex(2)  # a whole A100, MIG off
    assert n.nvmlDeviceGetMigMode(t) == [0, 0]
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetSerial(t)  # a stub
    with pytest.raises(n.NVMLError_NotSupported):
        n.nvmlDeviceGetUtilizationRates(t)  # no reading in the file
    with pytest.raises(n.NVMLError_InvalidArgument):
        n.nvmlDeviceGetHandleByIndex(9)
    with pytest.raises(n.NVMLError_NotFound):
        n.nvmlDeviceGetHandleByUUID(b"GPU-nope")
    es = n.nvmlEventSetCreate()
    with pytest.raises(n.NVMLError_Timeout):
        n.nvmlEventSetWait(es, 10)
    n.nvmlEventSetFree(es)
    mem = n.nvmlDeviceGetMemoryInfo(t, version=n.nvmlMemory_v2)
    assert (mem.total, mem.reserved, mem.used) == (81920 * 1024**2, 0, 0)
    bus = n.nvmlDeviceGetPciInfo(t).busId
    assert n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByPciBusId(bus)) == 2


def test_a_mig_device_handle_gives_its_gpu_instance_memory(nvml: Any) -> None:
    n = nvml
    h = n.nvmlDeviceGetHandleByIndex(0)
    by_slices = {}
    for k in range(n.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
        except n.NVMLError_NotFound:
            continue
        mem = n.nvmlDeviceGetMemoryInfo(m)
        by_slices[n.nvmlDeviceGetAttributes(m).gpuInstanceSliceCount] = (mem.total, mem.used, mem.free)
    mib = 1024**2
    assert by_slices == {  # by GPU-instance slices: 3g.40gb with 12000 MiB in use, 1g.10gb+me, 2g.20gb
        3: (40960 * mib, 12000 * mib, (40960 - 12000) * mib),
        1: (10240 * mib, 0, 10240 * mib),
        2: (20480 * mib, 0, 20480 * mib),
    }


def test_a_mig_memory_query_nvml_refuses_gives_no_series(
    nvml_env: FakeFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pynvml

    doc = SHAPES["mig-mixed"]
    nvml_env.use(doc)
    real = NvmlBackend(doc["hostname"])
    plain = pynvml.nvmlDeviceGetMemoryInfo

    def refuse_mig(h: Any, *args: Any, **kw: Any) -> Any:
        if pynvml.nvmlDeviceIsMigDeviceHandle(h):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return plain(h, *args, **kw)

    try:
        monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", refuse_mig)
        got = real.mig_readings(0)
        assert len(got) == 3 and all(
            r.memory_used_mib is None and r.memory_free_mib is None for r in got.values()
        )
        samples = _samples(real, {})
        assert [s for s in samples if "GPU_I_ID" in s[1]] == []  # no made-up values
        # nor do the GPUs in MIG mode with instances fall back to the parent's total
        assert [s for s in samples if s[0] == "DCGM_FI_DEV_FB_USED" and "'gpu', '0'" in s[1]] == []
    finally:
        real.close()


def test_no_utilization_while_mig_mode_is_on_on_both_backends(nvml_env: FakeFiles) -> None:
    doc = copy.deepcopy(SHAPES["mig-mixed"])
    doc["gpus"][1]["readings"] = {"utilization": 42}  # GPU 1: MIG mode on, no instance
    fake = nvml_env.use(doc)
    real = NvmlBackend(doc["hostname"])
    try:
        assert real.readings(1).gpu_util_percent is None and fake.readings(1).gpu_util_percent is None
        assert [s for s in _samples(real, {}) if s[0] == "DCGM_FI_DEV_GPU_UTIL"] == []
        real.set_mig_mode(1, False)
        fake.set_mig_mode(1, False)
        assert real.readings(1).gpu_util_percent == fake.readings(1).gpu_util_percent == 42
    finally:
        real.close()


def test_topology_follows_numa_nodes(nvml_env: FakeFiles) -> None:
    import pynvml as n

    nvml_env.use(SHAPES["whole-gpus"])
    n.nvmlInit()
    try:
        h = [n.nvmlDeviceGetHandleByIndex(i) for i in range(6)]
        assert n.nvmlDeviceGetTopologyCommonAncestor(h[0], h[1]) == n.NVML_TOPOLOGY_NODE
        assert n.nvmlDeviceGetTopologyCommonAncestor(h[0], h[2]) == n.NVML_TOPOLOGY_SYSTEM
        assert n.nvmlDeviceGetNumaNodeId(h[2]) == 1
        with pytest.raises(n.NVMLError_NotSupported):
            n.nvmlDeviceGetNumaNodeId(h[4])
        assert n.nvmlDeviceGetNvLinkState(h[2], 0) == 1 and n.nvmlDeviceGetNvLinkState(h[2], 2) == 0
    finally:
        n.nvmlShutdown()


def _device_nodes(inv: Inventory, root: Path) -> dict[str, list[str]]:
    """Device name -> the device nodes of its CDI spec, for every device the DRA driver publishes, on a host
    under ``root`` with a node for every ``/dev/nvidia<n>`` and capability minors for GPUs 0-2's first GPU
    instance (``gpu<n>/gi1``: 10n + 1, its compute instance 10n + 2)."""
    from gpusched.agent.dra.cdi import CdiSpecs, PreparedDevice
    from gpusched.agent.dra.slices import build_slice

    dev = root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True, exist_ok=True)
    table = root / "proc/driver/nvidia-caps/mig-minors"
    table.parent.mkdir(parents=True, exist_ok=True)
    table.write_text(
        "".join(f"gpu{n}/gi1/access {10 * n + 1}\ngpu{n}/gi1/ci0/access {10 * n + 2}\n" for n in range(3))
    )
    for n in range(3):
        (dev / f"nvidia{n}").touch()
        for m in (10 * n + 1, 10 * n + 2):
            (dev / "nvidia-caps" / f"nvidia-cap{m}").touch()
    cdi = CdiSpecs(root / "cdi", "gpu.nvidia.com", dev_root=dev, proc_root=root)
    devices = [
        PreparedDevice("r", "p", d.name, d.visible_id, d.gpu_index, d.gpu_minor, mig=d.mig)
        for d in build_slice(inv, "node-n", "gpu.nvidia.com").devices
    ]
    spec = cdi.spec("uid", "ns/c", devices)
    return {
        d.device: [n["path"] for n in c["containerEdits"]["deviceNodes"]]
        for d, c in zip(devices, spec["devices"], strict=True)
    }


def test_device_nodes_follow_nvmls_minor_number_on_both_backends(nvml_env: FakeFiles, tmp_path: Path) -> None:
    doc = SHAPES["minors-differ"]
    fake = nvml_env.use(doc)
    real = NvmlBackend(doc["hostname"])
    try:
        got = real.inventory()
    finally:
        real.close()
    assert [d.minor for d in got.devices] == [2, 0, 1]  # nvmlDeviceGetMinorNumber, not the index
    want = {
        "gpu-0": ["/dev/nvidia2"],
        "gpu-1": ["/dev/nvidia0"],
        "gpu-2-mig-3g40gb-4": [
            "/dev/nvidia1",
            "/dev/nvidia-caps/nvidia-cap11",
            "/dev/nvidia-caps/nvidia-cap12",
        ],
    }
    assert _device_nodes(fake.inventory(), tmp_path / "fake") == want
    assert _device_nodes(got, tmp_path / "real") == want


def test_a_broken_or_missing_file_is_a_clear_nvml_error(nvml_env: FakeFiles, tmp_path: Path) -> None:
    bad = tmp_path / "bad.flat"
    bad.write_text("gpusched-fake-nvml\t1\ngpu\t0\tGPU-x\n")
    nvml_env.mp.setenv(CONFIG_ENV, str(bad))
    with pytest.raises(NvmlUnavailable, match="NVML cannot start"):
        NvmlBackend("h")
    nvml_env.mp.delenv(CONFIG_ENV)
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        NvmlBackend("h")


def test_fake_nvml_config_writes_the_flat_form_and_names_a_bad_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from gpusched.cli import app

    spec, flat = tmp_path / "gpus.yaml", tmp_path / "gpus.flat"
    spec.write_text(yaml.safe_dump(SHAPES["mig-mixed"]))
    r = CliRunner().invoke(app, ["agent", "fake-nvml-config", str(spec), str(flat)])
    assert r.exit_code == 0, r.output
    lines = [line.split("\t") for line in flat.read_text().splitlines()]
    assert lines[0] == ["gpusched-fake-nvml", "1"] and ["cuda", "12020"] in lines
    gpus = [x for x in lines if x[0] == "gpu"]
    assert [(x[1], x[9], x[10]) for x in gpus] == [
        ("0", "3", "NVIDIA A100-SXM4-80GB"),
        ("1", "3", "NVIDIA A100-SXM4-80GB"),
        ("2", "2", "NVIDIA A100-SXM4-80GB"),
        ("3", "3", "NVIDIA A30"),
    ]
    # 3g.40gb: NVML index 2, profile id 9, 3 SM slices, at most 2, 4 memory slices from slice 0 or 4
    assert [
        "profile",
        "2",
        "9",
        "3",
        "2",
        "40960",
        "42",
        "3",
        "2",
        "0",
        "0",
        "0",
        "4",
        "17",
        "3g.40gb",
    ] in lines
    assert [x[:5] for x in lines if x[0] == "mig"][:3] == [
        ["mig", "1", "2", "4", "3"],
        ["mig", "2", "7", "0", "1"],
        ["mig", "3", "1", "2", "2"],
    ]
    spec.write_text("gpus: []\n")
    r = CliRunner().invoke(app, ["agent", "fake-nvml-config", str(spec), str(flat)])
    assert r.exit_code == 2 and f"{spec}: field gpus must be a non-empty list" in r.output
