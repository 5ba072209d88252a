"""Measurements: ``Allocate`` latency over gRPC, and the agent's idle CPU and memory with fake GPUs."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpusched.agent.allocation import ANN_ALLOCATED
from gpusched.agent.fake import FakeBackend
from gpusched.agent.plugin import DevicePlugin, NodeDevices
from gpusched.agent.pods import MemoryPods
from gpusched.agent.testing import FakeKubelet, Watcher
from gpusched.agent.v1beta1 import api_pb2 as pb
from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_GPU

NODE = "bench-node"


def fake_doc(gpus: int) -> dict[str, Any]:
    return {"hostname": NODE, "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "count": gpus}]}


def _pod(i: int, gpu: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"p{i}",
            "namespace": "bench",
            "uid": f"uid-{i}",
            "creationTimestamp": f"2026-01-01T00:{i // 60 % 60:02d}:{i % 60:02d}Z",
            "annotations": {
                ANN_ASSIGNMENT: json.dumps({"node": NODE, "gpus": [gpu], "milli": 1000, "memoryMiB": 0})
            },
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "c", "resources": {"limits": {RES_GPU: "1"}}}]},
        "status": {"phase": "Pending"},
    }


class _RollingPods(MemoryPods):
    """``pending`` Pending pods at all times: an allocated pod is replaced by a new one."""

    def __init__(self, pending: int, gpus: int) -> None:
        super().__init__([_pod(i, i % gpus) for i in range(pending)])
        self.n = pending
        self.gpus = gpus

    def annotate_pod(self, namespace: str, name: str, annotations: Any) -> None:
        if ANN_ALLOCATED in annotations:
            self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
            self.pods.append(_pod(self.n, self.n % self.gpus))
            self.n += 1


def bench_allocate(gpus: int = 8, calls: int = 2000, pending: int = 20) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        kubelet = FakeKubelet(Path(tmp)).start()
        backend = FakeBackend.from_dict(fake_doc(gpus), "bench")
        devices = NodeDevices(NODE, backend.inventory())
        plugin = DevicePlugin(devices, _RollingPods(pending, gpus), plugin_dir=Path(tmp))
        plugin.start()
        try:
            ch, stub = kubelet.plugin(plugin.servers[0].socket.name)
            uuids = [d.uuid for d in devices.whole_gpus]
            lat = []
            for i in range(calls):
                req = pb.AllocateRequest(
                    container_requests=[pb.ContainerAllocateRequest(devices_ids=[uuids[i % gpus]])]
                )
                t0 = time.perf_counter()
                stub.Allocate(req, timeout=10)
                lat.append((time.perf_counter() - t0) * 1000)
            ch.close()
        finally:
            plugin.stop()
            kubelet.stop()
    lat.sort()
    return {
        "what": f"Allocate of 1 nvidia.com/gpu over gRPC (unix socket), {gpus} fake GPUs, "
        f"{pending} Pending pods",
        "calls": calls,
        "p50_ms": round(statistics.median(lat), 3),
        "p99_ms": round(lat[int(0.99 * (len(lat) - 1))], 3),
        "max_ms": round(lat[-1], 3),
    }


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def bench_idle(gpus: int = 8, settle_s: float = 5.0, measure_s: float = 20.0) -> dict[str, Any]:
    """Starts ``gpusched agent run --no-api`` with ``gpus`` fake GPUs against a fake kubelet and measures its
    CPU
    use and RSS while nothing happens."""
    with tempfile.TemporaryDirectory() as tmp:
        fake = Path(tmp) / "gpus.json"
        fake.write_text(json.dumps(fake_doc(gpus)))
        kubelet = FakeKubelet(Path(tmp) / "dp").start()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpusched.cli",
                "agent",
                "run",
                "--fake",
                str(fake),
                "--no-api",
                "--node",
                NODE,
                "--plugin-dir",
                str(Path(tmp) / "dp"),
                "--metrics-port",
                "0",
                "--log-level",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            regs = kubelet.wait_registrations(2, timeout_s=60)
            watchers = [
                Watcher(kubelet, r.endpoint) for r in regs
            ]  # the kubelet keeps one stream per resource
            time.sleep(settle_s)
            c0, t0 = _cpu_s(proc.pid), time.monotonic()
            time.sleep(measure_s)
            c1, t1 = _cpu_s(proc.pid), time.monotonic()
            rss = _rss_mib(proc.pid)
            for w in watchers:
                w.close()
        finally:
            proc.terminate()
            proc.wait(timeout=20)
            kubelet.stop()
    return {
        "what": f"python -m gpusched.cli agent run --no-api, {gpus} fake GPUs, idle, 2 ListAndWatch streams"
        " open",
        "registrations": len(kubelet.registrations),
        "cpu_percent_of_one_core": round(100 * (c1 - c0) / (t1 - t0), 2),
        "rss_mib": round(rss, 1),
        "measured_s": measure_s,
    }
