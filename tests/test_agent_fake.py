"""The fake GPU backend: configuration, clear errors (file, GPU index, field), MIG validation, XIDs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpusched.agent import migprofiles
from gpusched.agent.fake import FakeBackend, FakeConfigError

GOOD = """
hostname: node-a
driverVersion: "550.107.02"
cudaVersion: "12.4"
machine: DGX A100
gpus:
  - model: NVIDIA A100-SXM4-80GB
    uuid: GPU-11111111-2222-3333-4444-555555555555
    pciBusId: "00000000:07:00.0"
    numaNode: 0
    nvlinkPeers: [1]
    migMode: true
    mig:
      - {profile: 3g.40gb, start: 4, uuid: MIG-aaaa}
      - {profile: 2g.20gb, start: 0}
      - {profile: 1g.10gb, start: 2}
    readings: {utilization: 35, memoryUsedMiB: 1024, temperature: 41, power: 250.5}
  - model: NVIDIA A100-SXM4-80GB
    numaNode: 0
    nvlinkPeers: [0]
    xids: [79]
  - model: Tesla T4
    count: 2
"""


def write(tmp_path: Path, text: str, name: str = "gpus.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_good_file_gives_the_inventory_readings_and_xids(tmp_path: Path) -> None:
    b = FakeBackend.from_file(write(tmp_path, GOOD))
    inv = b.inventory()
    assert (
        inv.hostname == "node-a" and inv.driver_version == "550.107.02" and inv.cuda_driver_version == (12, 4)
    )
    assert [d.index for d in inv.devices] == [0, 1, 2, 3]
    a, _a2, t1, _t2 = inv.devices
    assert a.uuid == "GPU-11111111-2222-3333-4444-555555555555" and a.pci_bus_id == "00000000:07:00.0"
    assert (a.memory_mib, a.compute_major, a.compute_minor) == (81920, 8, 0)
    assert a.mig_enabled and [(m.profile, m.placement_start, m.placement_size) for m in a.mig_instances] == [
        ("3g.40gb", 4, 4),
        ("2g.20gb", 0, 2),
        ("1g.10gb", 2, 1),
    ]
    assert a.mig_instances[0].uuid == "MIG-aaaa" and a.mig_instances[1].uuid.startswith("MIG-")
    assert a.nvlink_peers == (1,) and a.numa_node == 0
    assert (t1.name, t1.memory_mib, t1.compute_major, t1.compute_minor, t1.mig_capable) == (
        "Tesla T4",
        15360,
        7,
        5,
        False,
    )
    assert len({d.uuid for d in inv.devices}) == 4 and len({d.pci_bus_id for d in inv.devices}) == 4
    r = b.readings(0)  # in MIG mode: NVML gives no utilization for it, the file's 35 stays a sensor value
    assert (r.gpu_util_percent, r.memory_used_mib, r.memory_free_mib, r.temperature_c, r.power_w) == (
        None,
        1024,
        81920 - 1024,
        41,
        250.5,
    )
    assert b.readings(2).gpu_util_percent is None
    ev = b.poll_xids(0)
    assert [(e.gpu_index, e.xid, e.critical) for e in ev] == [(1, 79, True)]
    assert b.poll_xids(0) == []
    b.inject_xid(3, 13)
    assert [(e.gpu_index, e.xid, e.critical) for e in b.poll_xids(0)] == [(3, 13, False)]


def test_uuids_are_stable_for_a_host(tmp_path: Path) -> None:
    doc = {"hostname": "h", "gpus": [{"model": "Tesla T4", "count": 2}]}
    a = FakeBackend.from_dict(doc, "x").inventory()
    b = FakeBackend.from_dict(doc, "x").inventory()
    assert [d.uuid for d in a.devices] == [d.uuid for d in b.devices]


def test_env_var_takes_a_path_or_the_document(tmp_path: Path) -> None:
    p = write(tmp_path, GOOD)
    assert len(FakeBackend.from_env({"GPUSCHED_FAKE_GPUS": str(p)}).inventory().devices) == 4
    inline = json.dumps({"hostname": "h", "gpus": [{"model": "Tesla T4"}]})
    assert FakeBackend.from_env({"GPUSCHED_FAKE_GPUS": inline}).inventory().devices[0].name == "Tesla T4"
    with pytest.raises(FakeConfigError, match="GPUSCHED_FAKE_GPUS is not set"):
        FakeBackend.from_env({})


def test_xid_file_lines_become_events(tmp_path: Path) -> None:
    xf = tmp_path / "xids"
    b = FakeBackend.from_dict({"xidFile": str(xf), "gpus": [{"model": "Tesla T4", "count": 2}]}, "x")
    assert b.poll_xids(0) == []
    xf.write_text("1 48\n")
    assert [(e.gpu_index, e.xid) for e in b.poll_xids(0)] == [(1, 48)]
    with xf.open("a") as f:
        f.write("0 63\n0 9")  # the last line is not finished yet
    assert [(e.gpu_index, e.xid) for e in b.poll_xids(0)] == [(0, 63)]


BAD = [
    ("gpus: []", "field gpus must be a non-empty list"),
    ("gpus:\n  - {memoryMiB: 100}", r"gpus\[0\] \(GPU index 0\): field model is required"),
    (
        "gpus:\n  - {model: Tesla T4}\n  - {model: Foo X1}",
        r"gpus\[1\] \(GPU index 1\): field memoryMiB is required",
    ),
    ("gpus:\n  - {model: Foo X1, memoryMiB: 100}", r"GPU index 0\): field computeCapability is required"),
    ("gpus:\n  - {model: Tesla T4, memoryMiB: -1}", r"field memoryMiB must be a non-negative integer"),
    ("gpus:\n  - {model: Tesla T4, computeCapability: 'seven'}", r"field computeCapability: 'seven'"),
    ("gpus:\n  - {model: Tesla T4, uuid: 1234}", r"field uuid must start with 'GPU-'"),
    ("gpus:\n  - {model: Tesla T4, migMode: true}", r"field migMode: Tesla T4 has no MIG"),
    ("gpus:\n  - {model: Tesla T4, colour: red}", r"unknown field\(s\) \['colour'\]"),
    ("gpus:\n  - {model: Tesla T4, count: 0}", r"gpus\[0\]: field count must be a positive integer"),
    ("gpus:\n  - {model: Tesla T4, nvlinkPeers: [0]}", r"GPU index 0: field nvlinkPeers names no other GPU"),
    ("gpus:\n  - {model: Tesla T4, xids: [x]}", r"field xids must be a list of positive integers"),
    ("gpus:\n  - {model: Tesla T4, readings: {utilization: -3}}", r"field readings.utilization must be"),
    ("gpus:\n  - {model: Tesla T4, readings: {memoryUsedMiB: 99999}}", r"memoryUsedMiB 99999 is more than"),
    ("gpus:\n  - {model: Tesla T4}\n  - {model: Tesla T4, uuid: X}", r"GPU index 1\): field uuid"),
    (
        "gpus:\n  - {model: Tesla T4, uuid: GPU-1}\n  - {model: Tesla T4, uuid: GPU-1}",
        r"GPU index 1: GPU-1 is also GPU index 0's",
    ),
    ("driverVersion: abc\ngpus:\n  - {model: Tesla T4}", r"field driverVersion: 'abc' is not a version"),
    ("gpus: [", r"not valid YAML or JSON"),
    ("- a", r"the document must be a mapping"),
    (
        "gpus:\n  - {model: NVIDIA A100-SXM4-80GB, mig: [{profile: 1g.10gb, start: 0}]}",
        r"field mig lists instances but migMode is false",
    ),
    (
        "gpus:\n  - {model: NVIDIA A100-SXM4-80GB, migMode: true, mig: [{profile: 1g.5gb, start: 0}]}",
        r"gpus\[0\] \(GPU index 0\): field mig\[0\]: unknown MIG profile '1g.5gb' for NVIDIA A100-SXM4-80GB",
    ),
    (
        "gpus:\n  - {model: NVIDIA A100-SXM4-80GB, migMode: true, mig: [{profile: 3g.40gb, start: 2}]}",
        r"GPU index 0\): field mig: MIG profile 3g.40gb cannot start at slice 2 \(allowed starts: \[0, 4\]\)",
    ),
    (
        "gpus:\n  - {model: NVIDIA A100-SXM4-80GB, migMode: true, mig: [{profile: 4g.40gb, start: 0},"
        " {profile: 2g.20gb, start: 2}]}",
        r"field mig: MIG 2g.20gb at slice 2 overlaps 4g.40gb at slice 0",
    ),
    (
        "gpus:\n  - {model: NVIDIA A100-SXM4-80GB, migMode: true, mig: [{profile: 1g.10gb}]}",
        r"field mig\[0\]: each instance needs profile and start",
    ),
]


@pytest.mark.parametrize(("text", "message"), BAD, ids=[m[:40] for _t, m in BAD])
def test_a_file_with_errors_names_file_gpu_and_field(tmp_path: Path, text: str, message: str) -> None:
    p = write(tmp_path, text, "bad-gpus.yaml")
    with pytest.raises(FakeConfigError, match=message) as e:
        FakeBackend.from_file(p)
    assert str(e.value).startswith(f"{p}:"), str(e.value)


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FakeConfigError, match=r"missing.yaml: cannot read"):
        FakeBackend.from_file(tmp_path / "missing.yaml")


def test_mig_profiles_follow_each_model() -> None:
    a100_40 = migprofiles.profiles("NVIDIA A100-SXM4-40GB", 40960)
    assert sorted(a100_40) == sorted(
        ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    )
    assert sorted(migprofiles.profiles("NVIDIA H100 80GB HBM3", 81559)) == sorted(
        ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    )
    assert "7g.141gb" in migprofiles.profiles("NVIDIA H200", 143771)
    assert sorted(migprofiles.profiles("NVIDIA A30", 24576)) == ["1g.6gb", "1g.6gb+me", "2g.12gb", "4g.24gb"]
    assert migprofiles.profiles("Tesla T4", 15360) == {}
    # 4g + 3g fits (4g at 0, 3g at 4); 7 x 1g fits; an eighth 1g does not (no start at 7)
    inst = migprofiles.instance
    ok = [
        inst("NVIDIA A100-SXM4-80GB", 81920, "4g.40gb", 0, "a"),
        inst("NVIDIA A100-SXM4-80GB", 81920, "3g.40gb", 4, "b"),
    ]
    migprofiles.validate("NVIDIA A100-SXM4-80GB", 81920, ok)
    seven = [inst("NVIDIA A100-SXM4-80GB", 81920, "1g.10gb", s, str(s)) for s in range(7)]
    migprofiles.validate("NVIDIA A100-SXM4-80GB", 81920, seven)
    with pytest.raises(migprofiles.MigError, match="cannot start at slice 7"):
        migprofiles.validate(
            "NVIDIA A100-SXM4-80GB", 81920, [*seven, inst("NVIDIA A100-SXM4-80GB", 81920, "1g.10gb", 7, "x")]
        )
    with pytest.raises(migprofiles.MigError, match="more than 1 instance"):
        migprofiles.validate(
            "NVIDIA A100-SXM4-80GB",
            81920,
            [inst("NVIDIA A100-SXM4-80GB", 81920, "1g.10gb+me", s, str(s)) for s in (0, 1)],
        )
