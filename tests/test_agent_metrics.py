"""The exporter, scraped over HTTP: dcgm-exporter's names and labels, with pod, namespace and container."""

from __future__ import annotations

import dataclasses
import json
import urllib.request
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from gpusched.agent import migprofiles
from gpusched.agent.fake import FakeBackend, FakeConfigError
from gpusched.agent.inventory import Readings
from gpusched.agent.metrics import GpuCollector, gpu_instances, owners_from_pods
from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_GPU, RES_MILLI

DOC = {
    "hostname": "node-m",
    "gpus": [
        {
            "model": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-aaaa",
            "pciBusId": "00000000:18:00.0",
            "readings": {"utilization": 87, "memoryUsedMiB": 40000, "temperature": 55, "power": 612.5},
        },
        {
            "model": "NVIDIA H100 80GB HBM3",
            "uuid": "GPU-bbbb",
            "pciBusId": "00000000:2A:00.0",
            "readings": {"utilization": 10, "memoryUsedMiB": 100, "temperature": 35, "power": 90},
        },
        {"model": "NVIDIA H100 80GB HBM3", "uuid": "GPU-cccc", "pciBusId": "00000000:3A:00.0"},
        {"model": "NVIDIA H100 80GB HBM3", "uuid": "GPU-dddd", "readings": {"utilization": 5}},
        {"model": "NVIDIA H100 80GB HBM3", "uuid": "GPU-eeee", "readings": {"utilization": 6}},
    ],
}


def p(
    name: str, gpus: list[int], limits: dict[str, str], phase: str = "Running", allocated: str | None = None
):
    ann = {ANN_ASSIGNMENT: json.dumps({"node": "node-m", "gpus": gpus, "milli": 1000, "memoryMiB": 0})}
    if allocated:
        ann["gpusched.io/allocated"] = allocated
    return {
        "metadata": {"name": name, "namespace": "ml", "annotations": ann},
        "spec": {
            "nodeName": "node-m",
            "containers": [
                {"name": "side", "resources": {}},
                {"name": "train", "resources": {"limits": limits}},
            ],
        },
        "status": {"phase": phase},
    }


def scrape() -> dict[str, list[tuple[dict[str, str], float]]]:
    pair = p("pair", [4, 3], {RES_GPU: "1"})  # two containers of one GPU each: each gets its own
    pair["spec"]["containers"][0]["resources"] = {"limits": {RES_GPU: "1"}}
    backend = FakeBackend.from_dict(json.loads(json.dumps(DOC)), "m")
    pods = [
        p("trainer", [0], {RES_GPU: "1"}),
        p("share-a", [1], {RES_MILLI: "300"}),
        p(  # the annotation records what the container got; it wins over a stale assignment
            "share-b",
            [0],
            {RES_MILLI: "500"},
            allocated=json.dumps({"train": {"gpusched.io/gpu-share": ["GPU-bbbb"]}}),
        ),
        p("done", [2], {RES_GPU: "1"}, phase="Succeeded"),
        pair,
    ]
    owners = owners_from_pods(pods, "node-m", ["GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd", "GPU-eeee"])
    reg = CollectorRegistry()
    reg.register(GpuCollector(backend, lambda: owners, {1: 79}))
    server, _thread = start_http_server(0, "127.0.0.1", registry=reg)
    try:
        body = (
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10)
            .read()
            .decode()
        )
    finally:
        server.shutdown()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_series_have_dcgm_exporter_names_labels_and_pods() -> None:
    m = scrape()
    for name in (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
    ):
        assert name in m, sorted(m)
    util = {(s["gpu"], s["pod"], s["container"]): v for s, v in m["DCGM_FI_DEV_GPU_UTIL"]}
    assert util == {
        ("0", "trainer", "train"): 87.0,
        ("1", "share-a", "train"): 10.0,
        ("1", "share-b", "train"): 10.0,
        ("4", "pair", "side"): 6.0,
        ("3", "pair", "train"): 5.0,
    }
    labels0 = next(s for s, _ in m["DCGM_FI_DEV_GPU_UTIL"] if s["gpu"] == "0")
    assert labels0 == {
        "gpu": "0",
        "UUID": "GPU-aaaa",
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-m",
        "pod": "trainer",
        "namespace": "ml",
        "container": "train",
    }
    fb = {s["gpu"]: v for s, v in m["DCGM_FI_DEV_FB_USED"]}
    free = {s["gpu"]: v for s, v in m["DCGM_FI_DEV_FB_FREE"]}
    assert fb["0"] == 40000 and free["0"] == 81559 - 40000
    assert {s["gpu"]: v for s, v in m["DCGM_FI_DEV_POWER_USAGE"]}["0"] == 612.5
    xid = {(s["gpu"], s["pod"]): v for s, v in m["DCGM_FI_DEV_XID_ERRORS"]}
    assert xid[("1", "share-a")] == 79 and xid[("0", "trainer")] == 0
    # GPU 2 has no readings and no pod (the Succeeded pod is not attributed): only its XID series,
    # unattributed
    assert ("2", "") in xid and not [s for s, _ in m["DCGM_FI_DEV_GPU_UTIL"] if s["gpu"] == "2"]


# A GPU in MIG mode (three GPU instances: one held through gpusched.io/allocated, one through the assignment's
# mig field only, one free) beside a whole GPU. The GPU's own memory reading is what NVML gives for the parent
# handle in MIG mode: the instances' total.
MIG_DOC = {
    "hostname": "node-m",
    "gpus": [
        {
            "model": "NVIDIA A100-SXM4-80GB",
            "uuid": "GPU-mig0",
            "pciBusId": "00000000:07:00.0",
            "migMode": True,
            "mig": [
                {"profile": "3g.40gb", "start": 4, "uuid": "MIG-held", "memoryUsedMiB": 30000},
                {"profile": "2g.20gb", "start": 0, "uuid": "MIG-free"},
                {"profile": "1g.10gb", "start": 2, "uuid": "MIG-assigned", "memoryUsedMiB": 700},
            ],
            "readings": {"memoryUsedMiB": 30700, "temperature": 44, "power": 180},
        },
        {"model": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-whole", "readings": {"memoryUsedMiB": 5}},
    ],
}


def mig_pod(name: str, profile: str, ann: dict[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "inf", "annotations": ann},
        "spec": {
            "nodeName": "node-m",
            "containers": [{"name": "srv", "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}],
        },
        "status": {"phase": "Running"},
    }


def mig_samples(backend: Any, pods: list[dict[str, Any]]) -> dict[str, list[dict[str, str]]]:
    owners = owners_from_pods(pods, "node-m", ["GPU-whole"], backend.inventory())
    reg = CollectorRegistry()
    reg.register(GpuCollector(backend, lambda: owners))
    out: dict[str, list[dict[str, str]]] = {}  # through the text exposition, as Prometheus reads it
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append({**s.labels, "value": str(s.value)})
    return out


def mig_pods() -> list[dict[str, Any]]:
    held = {  # the agent handed it out: gpusched.io/allocated names the MIG device
        ANN_ASSIGNMENT: json.dumps(
            {"node": "node-m", "gpus": [], "mig": [{"gpu": 0, "start": 4, "profile": "3g.40gb"}]}
        ),
        "gpusched.io/allocated": json.dumps({"srv": {"nvidia.com/mig-3g.40gb": ["MIG-held"]}}),
    }
    assigned = {  # no allocated annotation (NVIDIA's device plugin served it): the assignment's slice
        ANN_ASSIGNMENT: json.dumps(
            {"node": "node-m", "gpus": [], "mig": [{"gpu": 0, "start": 2, "profile": "1g.10gb"}]}
        )
    }
    return [mig_pod("big", "3g.40gb", held), mig_pod("small", "1g.10gb", assigned)]


def test_each_mig_instance_has_its_framebuffer_with_gpu_i_labels_and_its_pod() -> None:
    m = mig_samples(FakeBackend.from_dict(json.loads(json.dumps(MIG_DOC)), "m"), mig_pods())
    used = {
        (s["gpu"], s.get("GPU_I_PROFILE"), s.get("GPU_I_ID"), s["pod"]): s["value"]
        for s in m["DCGM_FI_DEV_FB_USED"]
    }
    free = {
        (s["gpu"], s.get("GPU_I_PROFILE"), s.get("GPU_I_ID"), s["pod"]): s["value"]
        for s in m["DCGM_FI_DEV_FB_FREE"]
    }
    # GPU instance IDs as the fake numbers them (list order); the free instance has no pod
    assert used == {
        ("0", "3g.40gb", "1", "big"): "30000.0",
        ("0", "2g.20gb", "2", ""): "0.0",
        ("0", "1g.10gb", "3", "small"): "700.0",
        ("1", None, None, ""): "5.0",
    }
    assert free[("0", "3g.40gb", "1", "big")] == str(40960.0 - 30000)
    assert free[("0", "1g.10gb", "3", "small")] == str(10240.0 - 700)
    big = next(s for s in m["DCGM_FI_DEV_FB_USED"] if s["pod"] == "big")
    assert big == {
        "gpu": "0",
        "UUID": "GPU-mig0",  # the parent GPU's UUID, as dcgm-exporter labels MIG series
        "pci_bus_id": "00000000:07:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": "node-m",
        "GPU_I_PROFILE": "3g.40gb",
        "GPU_I_ID": "1",
        "container": "srv",
        "namespace": "inf",
        "pod": "big",
        "value": "30000.0",
    }
    # the whole GPU's series are as before: no GPU_I labels
    assert "GPU_I_PROFILE" not in next(s for s in m["DCGM_FI_DEV_FB_USED"] if s["gpu"] == "1")


def test_a_gpu_in_mig_mode_does_not_count_its_instances_memory_twice() -> None:
    m = mig_samples(FakeBackend.from_dict(json.loads(json.dumps(MIG_DOC)), "m"), mig_pods())
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
        gpu0 = [s for s in m[name] if s["gpu"] == "0"]
        assert gpu0 and all("GPU_I_ID" in s for s in gpu0), name  # no parent-level framebuffer series
    assert sum(float(s["value"]) for s in m["DCGM_FI_DEV_FB_USED"] if s["gpu"] == "0") == 30700
    # the GPU's own readings stay per GPU, once, without GPU_I labels
    temp = [s for s in m["DCGM_FI_DEV_GPU_TEMP"] if s["gpu"] == "0"]
    assert [(s["value"], "GPU_I_ID" in s) for s in temp] == [("44.0", False)]
    assert [s for s in m["DCGM_FI_DEV_XID_ERRORS"] if s["gpu"] == "0" and "GPU_I_ID" in s] == []


def test_a_gpu_in_mig_mode_without_instances_keeps_its_own_framebuffer_series() -> None:
    doc = json.loads(json.dumps(MIG_DOC))
    doc["gpus"][0]["mig"] = []
    doc["gpus"][0]["readings"]["memoryUsedMiB"] = 0
    m = mig_samples(FakeBackend.from_dict(doc, "m"), [])
    gpu0 = [s for s in m["DCGM_FI_DEV_FB_FREE"] if s["gpu"] == "0"]
    assert [(s["value"], "GPU_I_ID" in s) for s in gpu0] == [("81920.0", False)]


class RefusingMig:
    """The fake backend, with NVML refusing the memory query on one MIG device (NOT_SUPPORTED: None)."""

    def __init__(self, inner: FakeBackend, refused: str) -> None:
        self.inner, self.refused = inner, refused

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def mig_readings(self, index: int) -> dict[str, Readings]:
        return {u: Readings() if u == self.refused else r for u, r in self.inner.mig_readings(index).items()}


def test_a_mig_device_whose_memory_nvml_refuses_has_no_series() -> None:
    backend = RefusingMig(FakeBackend.from_dict(json.loads(json.dumps(MIG_DOC)), "m"), "MIG-held")
    m = mig_samples(backend, mig_pods())
    for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"):
        assert sorted(s.get("GPU_I_PROFILE", "-") for s in m[name] if s["gpu"] == "0") == [
            "1g.10gb",
            "2g.20gb",
        ]


def test_compute_instances_of_one_gpu_instance_are_one_series_under_the_gpu_instance_profile() -> None:
    inv = FakeBackend.from_dict(json.loads(json.dumps(MIG_DOC)), "m").inventory()
    three_g = inv.devices[0].mig_instances[0]
    cis = (  # two compute instances (1 and 2 of its 3 slices) of the 3g.40gb GPU instance
        dataclasses.replace(three_g, profile="1c.3g.40gb", slices_ci=1, ci_id=0, uuid="MIG-ci0"),
        dataclasses.replace(three_g, profile="2c.3g.40gb", slices_ci=2, ci_id=1, uuid="MIG-ci1"),
    )
    d = dataclasses.replace(inv.devices[0], mig_instances=(*cis, *inv.devices[0].mig_instances[1:]))
    got = [(p, gi, [m.uuid for m in ms]) for p, gi, ms in gpu_instances(d)]
    assert got == [
        ("2g.20gb", 2, ["MIG-free"]),
        ("1g.10gb", 3, ["MIG-assigned"]),
        ("3g.40gb", 1, ["MIG-ci0", "MIG-ci1"]),
    ]


def test_a_fake_instance_using_more_than_its_memory_is_refused_naming_the_field() -> None:
    doc = json.loads(json.dumps(MIG_DOC))
    doc["gpus"][0]["mig"][2]["memoryUsedMiB"] = 10241  # a 1g.10gb has 10240 MiB
    with pytest.raises(
        FakeConfigError, match=r"gpus\[0\] \(GPU index 0\): field mig\[2\]\.memoryUsedMiB .* 10240"
    ):
        FakeBackend.from_dict(doc, "m")


A100 = ("NVIDIA A100-SXM4-80GB", 81920)
LEGAL = [(p.name, s) for p in migprofiles.profiles(*A100).values() for s in p.kind.starts]


@settings(max_examples=60, deadline=None)
@given(
    tries=st.lists(st.sampled_from(LEGAL), max_size=12),
    used_frac=st.lists(st.integers(0, 100), min_size=12, max_size=12),
    holders=st.lists(st.integers(0, 3), min_size=12, max_size=12),
)
def test_property_each_gpu_instance_counted_once_with_its_holders(
    tries: list[tuple[str, int]], used_frac: list[int], holders: list[int]
) -> None:
    """Random legal layouts, memory in use and holders (0 to 3 pods per instance, through
    gpusched.io/allocated): each GPU instance's framebuffer appears once per holder (once if free), with the
    fake's value; the GPU's own framebuffer series are absent exactly when it has instances; the free memory
    of every instance adds up to what is not used."""
    kept: list[tuple[str, int]] = []
    for profile, start in tries:  # keep each candidate that fits beside those kept
        cand = [*kept, (profile, start)]
        insts = [migprofiles.instance(*A100, p, s, f"MIG-{i}", gi_id=i + 1) for i, (p, s) in enumerate(cand)]
        try:
            migprofiles.validate(*A100, insts)
        except migprofiles.MigError:
            continue
        kept = cand
    mem = {p.name: p.memory_mib for p in migprofiles.profiles(*A100).values()}
    mig_entries = [
        {"profile": p, "start": s, "uuid": f"MIG-{i}", "memoryUsedMiB": mem[p] * used_frac[i] // 100}
        for i, (p, s) in enumerate(kept)
    ]
    doc = {
        "hostname": "node-m",
        "gpus": [{"model": A100[0], "uuid": "GPU-p", "migMode": True, "mig": mig_entries}],
    }
    pods = []
    for i, (p, _s) in enumerate(kept):
        for k in range(holders[i]):
            ann = {"gpusched.io/allocated": json.dumps({"srv": {f"nvidia.com/mig-{p}": [f"MIG-{i}"]}})}
            pods.append(mig_pod(f"p{i}-{k}", p, ann))
    m = mig_samples(FakeBackend.from_dict(doc, "m"), pods)
    used = m.get("DCGM_FI_DEV_FB_USED", [])
    if not kept:
        assert [("GPU_I_ID" in s) for s in used] == [False]  # the GPU's own, once
        return
    by_gi: dict[str, list[dict[str, str]]] = {}
    for s in used:
        by_gi.setdefault(s["GPU_I_ID"], []).append(s)
    assert sorted(by_gi) == sorted(str(i + 1) for i in range(len(kept)))
    for i, e in enumerate(mig_entries):
        series = by_gi[str(i + 1)]
        assert {s["GPU_I_PROFILE"] for s in series} == {e["profile"]}
        assert {float(s["value"]) for s in series} == {float(e["memoryUsedMiB"])}
        assert sorted(s["pod"] for s in series) == sorted([f"p{i}-{k}" for k in range(holders[i])] or [""])
    free = {s["GPU_I_ID"]: float(s["value"]) for s in m["DCGM_FI_DEV_FB_FREE"]}
    assert sum(free.values()) == sum(mem[e["profile"]] - e["memoryUsedMiB"] for e in mig_entries)
