"""The real NVML backend against a stand-in ``pynvml`` module (no GPU here): calls, units and MIG."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace as NS
from typing import Any

import pytest

from gpusched.agent.nvml import NvmlBackend, NvmlUnavailable, mig_profile_name

GIB = 1024**3
MIB = 1024**2


class NVMLError(Exception):
    pass


def fake_pynvml(*, init_fails: bool = False) -> types.ModuleType:
    """Two A100-80GB (GPU 1 with MIG: 3g.40gb at 4, 1g.10gb+me at 0), NVLinked to each other."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    m.NVML_NVLINK_MAX_LINKS = 4  # type: ignore[attr-defined]
    m.nvmlEventTypeXidCriticalError = 8  # type: ignore[attr-defined]
    total = 81920 * MIB
    gpus = [("GPU-0", "00000000:07:00.0", [0, 0], 0), ("GPU-1", "00000000:0F:00.0", [1, 1], 1)]
    migs = {  # (gpu, k) -> (uuid, gi id, attributes, placement, GI profile id)
        (1, 0): (
            "MIG-3g",
            2,
            NS(
                gpuInstanceSliceCount=3,
                computeInstanceSliceCount=3,
                memorySizeMB=40192,
                multiprocessorCount=42,
                sharedCopyEngineCount=3,
                sharedDecoderCount=2,
                sharedEncoderCount=0,
                sharedJpegCount=0,
                sharedOfaCount=0,
            ),
            (4, 4),
            9,
        ),
        (1, 2): (
            "MIG-me",
            7,
            NS(
                gpuInstanceSliceCount=1,
                computeInstanceSliceCount=1,
                memorySizeMB=9728,
                multiprocessorCount=14,
                sharedCopyEngineCount=1,
                sharedDecoderCount=1,
                sharedEncoderCount=0,
                sharedJpegCount=1,
                sharedOfaCount=1,
            ),
            (0, 1),
            20,
        ),
    }

    def fail(*_a: Any) -> Any:
        raise NVMLError("not supported")

    def init() -> None:
        if init_fails:
            raise NVMLError("Driver Not Loaded")

    def mig_handle(h: int, k: int) -> Any:
        if (h, k) not in migs:
            raise NVMLError("not found")
        return ("mig", h, k)

    def gi_by_id(h: int, gi: int) -> Any:
        return next(("gi", key) for key, v in migs.items() if key[0] == h and v[1] == gi)

    def gi_info(gi: Any) -> Any:
        v = migs[gi[1]]
        return NS(placement=NS(start=v[3][0], size=v[3][1]), profileId=v[4])

    def uuid(h: Any) -> str:
        return migs[(h[1], h[2])][0] if isinstance(h, tuple) else gpus[h][0]

    def nvlink_state(h: int, link: int) -> int:
        return 1 if link == 0 else 0

    events: list[Any] = [NS(device=1, eventData=79)]

    def wait(es: Any, ms: int) -> Any:
        if not events:
            raise NVMLError("Timeout")
        return events.pop(0)

    m.__dict__.update(
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUUID=uuid,
        nvmlDeviceGetName=lambda h: b"NVIDIA A100-SXM4-80GB",  # older bindings return bytes
        nvmlDeviceGetMemoryInfo=lambda h: NS(total=total, used=2 * GIB, free=total - 2 * GIB),
        nvmlDeviceGetPciInfo=lambda h: NS(busId=gpus[h][1]),
        nvmlDeviceGetMigMode=lambda h: gpus[h][2],
        nvmlDeviceGetCudaComputeCapability=lambda h: (8, 0),
        nvmlDeviceGetNumaNodeId=lambda h: gpus[h][3],
        nvmlDeviceGetMinorNumber=lambda h: (3, 1)[h],  # /dev/nvidia3 and /dev/nvidia1: not the indices
        nvmlSystemGetDriverVersion=lambda: "550.107.02",
        nvmlSystemGetCudaDriverVersion=lambda: 12040,
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
        nvmlDeviceGetAttributes=lambda mh: migs[(mh[1], mh[2])][2],
        nvmlDeviceGetGpuInstanceId=lambda mh: migs[(mh[1], mh[2])][1],
        nvmlDeviceGetComputeInstanceId=lambda mh: 0,
        nvmlDeviceGetGpuInstanceById=gi_by_id,
        nvmlGpuInstanceGetInfo=gi_info,
        nvmlDeviceGetGpuInstanceProfileInfo=lambda h, idx: NS(id=20) if idx == 7 else fail(),
        nvmlDeviceGetNvLinkState=nvlink_state,
        nvmlDeviceGetNvLinkRemotePciInfo=lambda h, link: NS(busId=gpus[1 - h][1].lower()),
        nvmlDeviceGetUtilizationRates=lambda h: NS(gpu=42, memory=10),
        nvmlDeviceGetTemperature=lambda h, s: 51,
        nvmlDeviceGetPowerUsage=lambda h: 312500 if h == 0 else fail(),
        nvmlEventSetCreate=lambda: "es",
        nvmlDeviceRegisterEvents=lambda h, t, es: None,
        nvmlEventSetWait=wait,
        nvmlEventSetFree=lambda es: None,
    )
    return m


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> NvmlBackend:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    return NvmlBackend("host-1")


def test_inventory_from_nvml(backend: NvmlBackend) -> None:
    inv = backend.inventory()
    assert (inv.hostname, inv.driver_version, inv.cuda_driver_version) == ("host-1", "550.107.02", (12, 4))
    g0, g1 = inv.devices
    assert (g0.uuid, g0.name, g0.memory_mib, g0.pci_bus_id, g0.compute_major, g0.numa_node) == (
        "GPU-0",
        "NVIDIA A100-SXM4-80GB",
        81920,
        "00000000:07:00.0",
        8,
        0,
    )
    assert g0.mig_capable and not g0.mig_enabled and g0.mig_instances == ()
    assert (g0.device_node, g1.device_node) == ("nvidia3", "nvidia1")
    assert g0.nvlink_peers == (1,) and g1.nvlink_peers == (0,)
    assert g1.mig_enabled
    got = [
        (
            m.profile,
            m.placement_start,
            m.placement_size,
            m.uuid,
            m.memory_mib,
            m.multiprocessors,
            m.engines_ofa,
        )
        for m in g1.mig_instances
    ]
    assert got == [("3g.40gb", 4, 4, "MIG-3g", 40192, 42, 0), ("1g.10gb+me", 0, 1, "MIG-me", 9728, 14, 1)]
    assert g1.mig_instances[1].resource_profile == "1g.10gb.me"


def test_readings_in_dcgm_units_and_missing_fields(backend: NvmlBackend) -> None:
    r = backend.readings(0)
    assert (r.gpu_util_percent, r.memory_used_mib, r.memory_free_mib, r.temperature_c, r.power_w) == (
        42.0,
        2048,
        81920 - 2048,
        51.0,
        312.5,
    )
    assert backend.readings(1).power_w is None  # the driver said NOT_SUPPORTED


def test_xid_events_and_timeouts(backend: NvmlBackend) -> None:
    assert [(e.gpu_index, e.xid, e.critical) for e in backend.poll_xids(0.01)] == [(1, 79, True)]
    assert backend.poll_xids(0.01) == []
    backend.close()


def test_no_driver_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(init_fails=True))
    with pytest.raises(NvmlUnavailable, match=r"NVML cannot start .*Driver Not Loaded"):
        NvmlBackend()


def test_the_real_binding_imports_and_fails_cleanly_without_a_driver() -> None:
    pytest.importorskip("pynvml")
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        with pytest.raises(NvmlUnavailable):
            NvmlBackend()
    else:  # pragma: no cover - a GPU machine
        pynvml.nvmlShutdown()
        assert NvmlBackend().inventory().devices


@pytest.mark.parametrize(
    ("gi", "ci", "mib", "total_mib", "suffix", "name"),
    [
        (1, 1, 4864, 40960, "", "1g.5gb"),
        (3, 3, 19968, 40960, "", "3g.20gb"),
        (7, 7, 40192, 40960, "", "7g.40gb"),
        (1, 1, 9728, 81920, "", "1g.10gb"),
        (1, 1, 19968, 81920, "", "1g.20gb"),
        (3, 3, 40192, 81920, "", "3g.40gb"),
        (4, 4, 40192, 81920, "", "4g.40gb"),
        (1, 1, 9728, 81920, "+me", "1g.10gb+me"),
        (3, 1, 40192, 81920, "", "1c.3g.40gb"),
        (7, 7, 140032, 143771, "", "7g.141gb"),
    ],
)
def test_mig_profile_names_follow_go_nvlib(
    gi: int, ci: int, mib: int, total_mib: int, suffix: str, name: str
) -> None:
    assert mig_profile_name(gi, ci, mib, total_mib * MIB, suffix) == name
