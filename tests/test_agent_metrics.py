"""The exporter, scraped over HTTP: dcgm-exporter's names and labels, with pod, namespace and container."""

from __future__ import annotations

import json
import urllib.request

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from gpusched.agent.fake import FakeBackend
from gpusched.agent.metrics import GpuCollector, owners_from_pods
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
