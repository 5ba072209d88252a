#!/usr/bin/env python3
"""The real kubelet's cost at N devices per node (docs/agent-design.md, "the kubelet's cost").

For each ``--slots`` value, a fresh control plane and real node (``gpusched.testenv.RealNode``: containerd,
the kubelet, gpusched's agent with ``--gpus`` fake GPUs, advertising ``gpus x slots`` ``gpusched.io/gpu-share``
devices plus ``gpus`` ``nvidia.com/gpu``), then:

- registration: from the agent's start until the Node's capacity shows every share device;
- idle: the kubelet's CPU (share of one core) over ``--idle-s`` seconds, and its RSS;
- admission: ``--pods`` share pods, one at a time, bound straight to the node with an assignment: time from
  create to Running, the kubelet's own ``Allocate`` latency (its ``kubelet_device_plugin_alloc_duration_seconds``
  histogram, read through the apiserver's node proxy), the kubelet's CPU seconds over the admissions, its RSS
  after, and the size of its device-manager checkpoint.

Needs root and what tests/kubelet needs (hack/build-control-plane.sh, hack/build-node-images.sh, containerd).
Prints one JSON line per configuration and a Markdown table at the end.

    hack/kubelet-device-cost.py --slots 16 125 1000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from gpusched.testenv import ControlPlane
from gpusched.testenv.node import DEVICE_PLUGIN_DIR, RealNode, process_usage


def alloc_histogram(cp: ControlPlane, node: str) -> tuple[float, int]:
    """(sum seconds, count) of the kubelet's Allocate calls for gpusched.io/gpu-share."""
    text = cp.kubectl("get", "--raw", f"/api/v1/nodes/{node}/proxy/metrics").stdout
    total, count = 0.0, 0
    for line in text.splitlines():
        if 'resource_name="gpusched.io/gpu-share"' not in line:
            continue
        if line.startswith("kubelet_device_plugin_alloc_duration_seconds_sum"):
            total = float(line.split()[-1])
        elif line.startswith("kubelet_device_plugin_alloc_duration_seconds_count"):
            count = int(float(line.split()[-1]))
    return total, count


def pod(name: str, node: str, image: str, gpu: int) -> dict[str, object]:
    res = {"cpu": "10m", "memory": "16Mi", "gpusched.io/gpu-share": "1"}
    assignment = json.dumps({"node": node, "gpus": [gpu], "milli": 100, "memoryMiB": 1024})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": {"gpusched.io/assignment": assignment}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                    "resources": {"requests": res, "limits": res},
                }
            ],
        },
    }


def measure(slots: int, gpus: int, pods: int, idle_s: float) -> dict[str, object]:
    with ControlPlane(scheduler=False, controller_manager=True, kwok=False) as cp:
        node = RealNode(cp, [{"model": "NVIDIA H100 80GB HBM3", "count": gpus}], slots=slots, agent=False)
        node.start()
        try:
            t0 = time.monotonic()
            node.start_agent(wait=False)
            want = gpus * slots
            while node.capacity("gpusched.io/gpu-share") != want:
                node.check_alive()
                if time.monotonic() - t0 > 300:
                    raise TimeoutError(f"{want} share devices not in the Node's capacity after 300 s")
                time.sleep(0.2)
            registration_s = time.monotonic() - t0
            time.sleep(10)  # settle
            kpid = node.pids["kubelet"]
            c0, _ = process_usage(kpid)
            time.sleep(idle_s)
            c1, idle_rss = process_usage(kpid)
            idle_cpu = (c1 - c0) / idle_s
            a_sum0, a_n0 = alloc_histogram(cp, node.name)
            lat = []
            for k in range(pods):
                name = f"cost-{k}"
                t = time.monotonic()
                cp.kubectl("create", "-f", "-", input=json.dumps(pod(name, node.name, node.busybox_image, k % gpus)))
                while True:
                    out = cp.kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}", check=False).stdout
                    if out == "Running":
                        break
                    if out == "Failed" or time.monotonic() - t > 120:
                        raise RuntimeError(f"pod {name} is {out!r}: {cp.kubectl('describe', 'pod', name).stdout}")
                    time.sleep(0.05)
                lat.append(time.monotonic() - t)
            c2, rss = process_usage(kpid)
            a_sum1, a_n1 = alloc_histogram(cp, node.name)
            ckpt = (DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint").stat().st_size
            cp.kubectl("delete", "pods", "--all", "--grace-period=1", "--wait=true", timeout=180)
            return {
                "devices": want + gpus,
                "share_devices": want,
                "registration_s": round(registration_s, 2),
                "idle_cpu_pct": round(100 * idle_cpu, 2),
                "idle_rss_mib": round(idle_rss / 2**20, 1),
                "admit_p50_s": round(statistics.median(lat), 2),
                "admit_max_s": round(max(lat), 2),
                "kubelet_allocate_mean_ms": round(1000 * (a_sum1 - a_sum0) / max(1, a_n1 - a_n0), 1),
                "kubelet_cpu_s_per_pod": round((c2 - c1) / pods, 3),
                "rss_after_mib": round(rss / 2**20, 1),
                "checkpoint_kib": round(ckpt / 1024, 1),
            }
        finally:
            node.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, nargs="+", default=[16, 125, 1000])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=10)
    ap.add_argument("--idle-s", type=float, default=30.0)
    args = ap.parse_args()
    rows = []
    for s in args.slots:
        row = {"slots_per_gpu": s, **measure(s, args.gpus, args.pods, args.idle_s)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
