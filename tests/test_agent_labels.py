"""Node labels against what NVIDIA's gpu-feature-discovery produces for the same GPUs.

Expected values are written out by hand from GFD's code (NVIDIA/k8s-device-plugin internal/lm: nvml.go,
resource.go, mig-strategy.go, machine-type.go; read at commit 1b826acc) with its default configuration
(sharing off, --no-timestamp), for inventories stated here as NVML reports them (names, memory, MIG device
attributes), not through the agent's own tables."""

from __future__ import annotations

import json

import pytest

from gpusched.agent import labels
from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance


def mig(
    profile: str, start: int, size: int, uuid: str, mem: int, sms: int, gi: int, engines: tuple[int, ...]
):
    c, d, e, j, o = engines
    return MigInstance(
        profile=profile,
        placement_start=start,
        placement_size=size,
        uuid=uuid,
        memory_mib=mem,
        multiprocessors=sms,
        slices_gi=gi,
        slices_ci=gi,
        engines_copy=c,
        engines_decoder=d,
        engines_encoder=e,
        engines_jpeg=j,
        engines_ofa=o,
    )


A100 = "NVIDIA A100-SXM4-80GB"


def a100_node() -> Inventory:
    # GPUs 0-2 MIG-enabled (0: 3g+2g+1g+1g, 1: 7g, 2: 1g+me and six 1g), 3 MIG-enabled but empty, 4-7 full
    # GPUs.
    # MIG attributes as NVML reports them on A100-80GB (nvidia-smi mig -lgip: 1g 9.50 GiB 14 SMs, ...).
    g1 = (1, 0, 0, 0, 0)
    insts = {
        0: (
            mig("3g.40gb", 4, 4, "MIG-a", 40192, 42, 3, (3, 2, 0, 0, 0)),
            mig("2g.20gb", 0, 2, "MIG-b", 19968, 28, 2, (2, 1, 0, 0, 0)),
            mig("1g.10gb", 2, 1, "MIG-c", 9728, 14, 1, g1),
            mig("1g.10gb", 3, 1, "MIG-d", 9728, 14, 1, g1),
        ),
        1: (mig("7g.80gb", 0, 8, "MIG-e", 81152, 98, 7, (7, 5, 0, 1, 1)),),
        2: (
            mig("1g.10gb+me", 0, 1, "MIG-f", 9728, 14, 1, (1, 1, 0, 1, 1)),
            *(mig("1g.10gb", s, 1, f"MIG-g{s}", 9728, 14, 1, g1) for s in range(1, 7)),
        ),
        3: (),
    }
    devs = tuple(
        GpuDevice(
            index=i,
            uuid=f"GPU-{i}",
            name=A100,
            memory_mib=81920,
            pci_bus_id=f"00000000:{i:02X}:00.0",
            compute_major=8,
            compute_minor=0,
            mig_capable=True,
            mig_enabled=i < 4,
            mig_instances=insts.get(i, ()),
            nvlink_peers=tuple(j for j in range(8) if j != i),
            numa_node=i // 4,
        )
        for i in range(8)
    )
    return Inventory(
        hostname="a100",
        driver_version="550.107.02",
        cuda_driver_version=(12, 4),
        devices=devs,
        machine="DGX A100",
    )


def a100_all_mig_node() -> Inventory:
    full = a100_node()
    devs = tuple(d for d in full.devices if d.index in (0, 1))
    return Inventory("a100m", "550.107.02", (12, 4), devs, machine="DGX A100")


def h100_node() -> Inventory:
    devs = tuple(
        GpuDevice(
            index=i,
            uuid=f"GPU-h{i}",
            name="NVIDIA H100 80GB HBM3",
            memory_mib=81559,
            pci_bus_id=f"00000000:{i:02X}:00.0",
            compute_major=9,
            compute_minor=0,
            mig_capable=True,
            numa_node=0,
        )
        for i in range(8)
    )
    return Inventory(
        hostname="h100",
        driver_version="535.104.05",
        cuda_driver_version=(12, 2),
        devices=devs,
        machine="PowerEdge XE9680",
    )


def t4_node() -> Inventory:
    devs = (
        GpuDevice(
            index=0,
            uuid="GPU-t4",
            name="Tesla T4",
            memory_mib=15360,
            pci_bus_id="00000000:00:1E.0",
            compute_major=7,
            compute_minor=5,
        ),
    )
    return Inventory(
        hostname="t4",
        driver_version="470.82.01",
        cuda_driver_version=(11, 4),
        devices=devs,
        machine="g4dn.xlarge",
    )


def versions(drv: str, rev: str, full: str, cmaj: str, cmin: str) -> dict[str, str]:
    major, minor = drv.split(".")[:2]
    return {
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rev,
        "nvidia.com/cuda.runtime.major": cmaj,
        "nvidia.com/cuda.runtime.minor": cmin,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev,
        "nvidia.com/cuda.driver-version.full": full,
        "nvidia.com/cuda.runtime-version.major": cmaj,
        "nvidia.com/cuda.runtime-version.minor": cmin,
        "nvidia.com/cuda.runtime-version.full": f"{cmaj}.{cmin}",
    }


def mig_set(
    p: str, product: str, count: int, mem: int, sms: int, gi: int, eng: tuple[int, ...]
) -> dict[str, str]:
    k = f"nvidia.com/mig-{p}"
    c, d, e, j, o = eng
    return {
        f"{k}.product": product,
        f"{k}.count": str(count),
        f"{k}.replicas": "1",
        f"{k}.sharing-strategy": "none",
        f"{k}.memory": str(mem),
        f"{k}.multiprocessors": str(sms),
        f"{k}.slices.gi": str(gi),
        f"{k}.slices.ci": str(gi),
        f"{k}.engines.copy": str(c),
        f"{k}.engines.decoder": str(d),
        f"{k}.engines.encoder": str(e),
        f"{k}.engines.jpeg": str(j),
        f"{k}.engines.ofa": str(o),
    }


EXPECTED = {
    "A100-80GB, MIG mixed": (
        a100_node,
        "mixed",
        {
            **versions("550.107", "02", "550.107.02", "12", "4"),
            "nvidia.com/gpu.machine": "DGX-A100",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": "8",  # MIG-enabled and full GPUs of one name are counted together
            # the full GPUs' labeler runs last and overrides the MIG-enabled one's 0
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/gpu.family": "ampere",
            "nvidia.com/gpu.compute.major": "8",
            "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/gpu.mode": "compute",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mps.capable": "false",
            "nvidia.com/mig.strategy": "mixed",
            **mig_set("1g.10gb", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", 8, 9728, 14, 1, (1, 0, 0, 0, 0)),
            **mig_set("1g.10gb.me", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb.me", 1, 9728, 14, 1, (1, 1, 0, 1, 1)),
            **mig_set("2g.20gb", "NVIDIA-A100-SXM4-80GB-MIG-2g.20gb", 1, 19968, 28, 2, (2, 1, 0, 0, 0)),
            **mig_set("3g.40gb", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", 1, 40192, 42, 3, (3, 2, 0, 0, 0)),
            **mig_set("7g.80gb", "NVIDIA-A100-SXM4-80GB-MIG-7g.80gb", 1, 81152, 98, 7, (7, 5, 0, 1, 1)),
        },
    ),
    "A100-80GB, every GPU MIG-enabled": (
        a100_all_mig_node,
        "mixed",
        {
            **versions("550.107", "02", "550.107.02", "12", "4"),
            "nvidia.com/gpu.machine": "DGX-A100",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": "2",
            "nvidia.com/gpu.replicas": "0",  # MIG-enabled GPUs are labelled without sharing: replicas 0
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/gpu.family": "ampere",
            "nvidia.com/gpu.compute.major": "8",
            "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/gpu.mode": "compute",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mps.capable": "false",
            "nvidia.com/mig.strategy": "mixed",
            **mig_set("1g.10gb", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", 2, 9728, 14, 1, (1, 0, 0, 0, 0)),
            **mig_set("2g.20gb", "NVIDIA-A100-SXM4-80GB-MIG-2g.20gb", 1, 19968, 28, 2, (2, 1, 0, 0, 0)),
            **mig_set("3g.40gb", "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb", 1, 40192, 42, 3, (3, 2, 0, 0, 0)),
            **mig_set("7g.80gb", "NVIDIA-A100-SXM4-80GB-MIG-7g.80gb", 1, 81152, 98, 7, (7, 5, 0, 1, 1)),
        },
    ),
    "H100 80GB HBM3": (
        h100_node,
        None,
        {
            **versions("535.104", "05", "535.104.05", "12", "2"),
            "nvidia.com/gpu.machine": "PowerEdge-XE9680",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.family": "hopper",
            "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/gpu.mode": "compute",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mps.capable": "false",
        },
    ),
    "T4": (
        t4_node,
        None,
        {
            **versions("470.82", "01", "470.82.01", "11", "4"),
            "nvidia.com/gpu.machine": "g4dn.xlarge",
            "nvidia.com/gpu.product": "Tesla-T4",
            "nvidia.com/gpu.count": "1",
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.sharing-strategy": "none",
            "nvidia.com/gpu.memory": "15360",
            "nvidia.com/gpu.family": "turing",
            "nvidia.com/gpu.compute.major": "7",
            "nvidia.com/gpu.compute.minor": "5",
            "nvidia.com/gpu.mode": "compute",
            "nvidia.com/mig.capable": "false",
            "nvidia.com/mps.capable": "false",
        },
    ),
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_labels_match_gfd(case: str) -> None:
    make, strategy, expected = EXPECTED[case]
    got = labels.gfd_labels(make(), strategy)
    missing = {k: v for k, v in expected.items() if k not in got}
    extra = {k: v for k, v in got.items() if k not in expected}
    wrong = {k: (got[k], v) for k, v in expected.items() if k in got and got[k] != v}
    assert not missing and not extra and not wrong, (
        f"missing {missing}\nextra {extra}\nwrong (got, want) {wrong}"
    )


def test_mixed_strategy_default_only_when_mig_is_on() -> None:
    assert labels.default_strategy(a100_node()) == "mixed"
    assert labels.default_strategy(h100_node()) == "none"
    assert "nvidia.com/mig.strategy" not in labels.gfd_labels(h100_node())


def test_strategy_none_labels_mig_enabled_gpus_as_full_gpus_without_mig_labels() -> None:
    got = labels.gfd_labels(a100_node(), "none")
    assert got["nvidia.com/gpu.count"] == "8" and got["nvidia.com/gpu.replicas"] == "1"
    assert not [k for k in got if k.startswith("nvidia.com/mig-") or k == "nvidia.com/mig.strategy"]


def test_unknown_strategy_is_refused_and_a_node_breaking_the_single_rules_is_labelled_invalid() -> None:
    with pytest.raises(ValueError, match="unknown MIG strategy"):
        labels.gfd_labels(a100_node(), "both")
    got = labels.gfd_labels(a100_node(), "single")  # full GPUs, an empty one and several profiles
    assert got["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB-MIG-INVALID"
    assert (got["nvidia.com/gpu.count"], got["nvidia.com/mig.strategy"]) == ("0", "single")
    assert not [k for k in got if k.startswith("nvidia.com/mig-")]


def test_single_strategy_labels_describe_one_mig_device_and_count_them() -> None:
    """GFD's single strategy (tests/expected-output-mig-single.txt): every GPU in MIG mode, one profile."""
    g1 = (1, 0, 0, 0, 0)
    devs = tuple(
        GpuDevice(
            index=i, uuid=f"GPU-{i}", name=A100, memory_mib=81920, pci_bus_id=f"00000000:{i:02X}:00.0",
            compute_major=8, compute_minor=0, mig_capable=True, mig_enabled=True,
            mig_instances=tuple(mig("1g.10gb", s, 1, f"MIG-{i}{s}", 9728, 14, 1, g1) for s in range(7)),
        )
        for i in range(2)
    )  # fmt: skip
    got = labels.gfd_labels(Inventory("n", "550.107.02", (12, 4), devs), "single")
    want = {
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
        "nvidia.com/gpu.count": "14",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.memory": "9728",
        "nvidia.com/gpu.multiprocessors": "14",
        "nvidia.com/gpu.slices.gi": "1",
        "nvidia.com/gpu.slices.ci": "1",
        "nvidia.com/gpu.engines.copy": "1",
        "nvidia.com/gpu.engines.decoder": "0",
    }
    assert {k: got[k] for k in want} == want
    assert got["nvidia.com/gpu.family"] == "ampere"  # the GPU's own labels stay


def test_sanitise_and_family_follow_gfd() -> None:
    assert labels.sanitise("NVIDIA  H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert labels.sanitise("NVIDIA GeForce RTX 4090 (x)") == "NVIDIA-GeForce-RTX-4090-x"
    assert [
        labels.family(*cc) for cc in [(7, 0), (7, 5), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0), (4, 0)]
    ] == ["volta", "turing", "ampere", "ada-lovelace", "hopper", "blackwell", "blackwell", "undefined"]


def test_topology_annotation_has_nvlink_groups_and_numa() -> None:
    inv = a100_node()
    doc = json.loads(labels.topology_annotation(inv))
    assert doc["nvlinkGroups"] == [list(range(8))]
    assert [g["numa"] for g in doc["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    t4 = json.loads(labels.topology_annotation(t4_node()))
    assert t4["nvlinkGroups"] == [[0]] and t4["gpus"][0]["numa"] is None
    # two islands of NVLink
    devs = tuple(
        GpuDevice(
            index=i,
            uuid=f"GPU-{i}",
            name=A100,
            memory_mib=81920,
            pci_bus_id=str(i),
            compute_major=8,
            compute_minor=0,
            nvlink_peers=(i ^ 1,),
        )
        for i in range(4)
    )
    inv2 = Inventory("n", "550.1", (12, 4), devs)
    assert labels.nvlink_groups(inv2) == [[0, 1], [2, 3]]


def test_mig_resources_name_each_profile_with_plus_as_dot() -> None:
    res = labels.mig_resources(a100_node())
    assert sorted(res) == [
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-1g.10gb.me",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
        "nvidia.com/mig-7g.80gb",
    ]
    assert len(res["nvidia.com/mig-1g.10gb"]) == 8 and res["nvidia.com/mig-7g.80gb"] == ["MIG-e"]
