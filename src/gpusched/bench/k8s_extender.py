"""Extender latency: filter + prioritize request pairs against the aiohttp app on loopback.

A ``LiveCluster`` is fed ``nodes`` synthetic GPU node dicts (the synthetic cluster's shapes,
with GPU-memory labels) and bound GPU-share pods on about half the GPUs; no control plane.
The extender app serves in a child process (as it would beside kube-scheduler: another
process), and ``concurrency`` aiohttp clients each send, one pair after another, a ``/filter``
with ``nodeCacheCapable: true`` (``NodeNames`` of all nodes) for a GPU-share pod, then a
``/prioritize`` of the nodes that passed, as kube-scheduler does. The latency of a pair runs
from sending the filter to reading the prioritize answer; ``server_ms_per_pair`` is the time
the server spent on a pair by its own histogram (the rest is the client, the loopback and
waiting for a CPU), and ``server_cpu_ms_per_pair`` and ``client_cpu_ms_per_pair`` the CPU
time each side used per pair: on a busy machine the latencies grow with the load, the CPU
times do not. kube-scheduler itself sends one pair at a time (one scheduling cycle after
another); ``concurrency > 1`` models several schedulers or profiles, and its latency includes
queueing behind the other clients (one event loop serves them all: about ``concurrency`` ×
the server's time per pair).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import socket
import time
from typing import Any

import numpy as np

from gpusched.core.errors import InvalidInput
from gpusched.sim.synthetic import SyntheticConfig, synthetic_cluster

_MEMORY_MIB = {"G2": 16384, "G3": 32768, "T4": 15360, "P100": 16384, "V100M16": 16384, "V100M32": 32768}


def node_dicts(nodes: int, seed: int = 0) -> list[dict[str, Any]]:
    """``nodes`` v1 Node dicts with GPUs (allocatable nvidia.com/gpu, GPU product and memory labels)."""
    specs = [n for n in synthetic_cluster(SyntheticConfig(nodes=nodes, seed=seed)) if n.gpu_count][:nodes]
    out = []
    for s in specs:
        alloc = {
            "cpu": str(s.cpu_milli // 1000),
            "memory": f"{s.memory_mib}Mi",
            "pods": "110",
            "nvidia.com/gpu": str(s.gpu_count),
        }
        labels = {
            "kubernetes.io/hostname": s.name,
            "nvidia.com/gpu.product": s.gpu_model,
            "nvidia.com/gpu.memory": str(_MEMORY_MIB.get(s.gpu_model, 24576)),
        }
        out.append({"metadata": {"name": s.name, "labels": labels}, "status": {"allocatable": alloc}})
    return out


def share_pod(name: str, milli: int, mem_mib: int, node: str = "", gpu: int = -1) -> dict[str, Any]:
    res = {"cpu": "2", "memory": "4Gi", "gpusched.io/gpu-milli": str(milli)}
    if mem_mib:
        res["gpusched.io/gpu-memory"] = str(mem_mib)
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": {"requests": res, "limits": res}}]}
    meta: dict[str, Any] = {"name": name, "namespace": "bench", "uid": f"uid-{name}", "resourceVersion": "1"}
    if node:
        spec["nodeName"] = node
        ann = f'{{"node":"{node}","gpus":[{gpu}],"milli":{milli},"memoryMiB":{mem_mib}}}'
        meta["annotations"] = {"gpusched.io/assignment": ann}
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running" if node else "Pending"}}


def _bound_pods(nodes: list[dict[str, Any]], rng: np.random.Generator) -> list[dict[str, Any]]:
    """Shares on about half of all GPUs (one share per chosen GPU)."""
    pods = []
    for n in nodes:
        name = n["metadata"]["name"]
        for g in range(int(n["status"]["allocatable"]["nvidia.com/gpu"])):
            if rng.random() < 0.5:
                milli = int(rng.choice([230, 320, 470, 650]))
                pods.append(share_pod(f"bound-{name}-{g}", milli, 2048, name, g))
    return pods


def live_books(nodes: int, seed: int = 0, rng: np.random.Generator | None = None) -> tuple[Any, list[str]]:
    """A ``LiveCluster`` of ``nodes`` synthetic GPU nodes with shares bound on about half their
    GPUs (``rng``, default seeded by ``seed``), its books built; and the node names."""
    from gpusched.k8s.state import LiveCluster

    live = LiveCluster()
    objs = node_dicts(nodes, seed)
    for o in objs:
        live.upsert_node(o)
    for p in _bound_pods(objs, rng if rng is not None else np.random.default_rng(seed)):
        live.upsert_pod(p)
    with live.live_books():
        pass  # build the books before serving
    return live, [o["metadata"]["name"] for o in objs]


def _serve(nodes: int, seed: int, port: int, ready: Any) -> None:
    from aiohttp import web

    from gpusched.extender.app import make_app
    from gpusched.extender.handlers import Extender
    from gpusched.extender.serve import build_profile

    live, _ = live_books(nodes, seed)
    app = make_app(Extender(live, build_profile("default")))  # filter/prioritize only: no binding
    ready.set()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, handle_signals=True)


async def _clients(
    port: int, names: list[str], requests: int, concurrency: int, seed: int
) -> tuple[list[float], int]:
    import aiohttp
    import orjson

    rng = np.random.default_rng(seed + 1)
    shapes = [
        (int(rng.choice([100, 230, 320, 470, 650, 810])), int(rng.choice([0, 2048, 4096]))) for _ in range(64)
    ]
    pods = [share_pod(f"p{i}", m, g) for i, (m, g) in enumerate(shapes)]
    bodies = [orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": names}) for p in pods]
    lat: list[float] = []
    feasible = 0
    url = f"http://127.0.0.1:{port}"
    headers = {"Content-Type": "application/json"}
    counter = iter(range(requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal feasible
        for i in counter:
            body = bodies[i % len(bodies)]
            t0 = time.perf_counter()
            async with session.post(f"{url}/filter", data=body, headers=headers) as r:
                res = orjson.loads(await r.read())
            # as kube-scheduler does: prioritize the nodes that passed the filter
            second = orjson.dumps({"Pod": pods[i % len(pods)], "Nodes": None, "NodeNames": res["NodeNames"]})
            async with session.post(f"{url}/prioritize", data=second, headers=headers) as r:
                await r.read()
            lat.append(time.perf_counter() - t0)
            feasible += len(res["NodeNames"] or [])

    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return lat, feasible


def _server_seconds(port: int) -> float:
    """Seconds the server spent in /filter and /prioritize so far (its request-latency histogram)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith("gpusched_extender_request_duration_seconds_sum") and (
            'verb="filter"' in line or 'verb="prioritize"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` from /proc; -1 where there is no /proc."""
    import os

    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return -1.0


def bench_extender(
    nodes: int = 1000, requests: int = 2000, concurrency: int = 8, seed: int = 0
) -> dict[str, Any]:
    """p50/p99 latency (ms) of a filter + prioritize pair at ``nodes`` nodes (see the module doc)."""
    if nodes <= 0 or requests <= 0 or concurrency <= 0:
        raise InvalidInput("nodes, requests and concurrency must be positive")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    ctx: Any = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_serve, args=(nodes, seed, port, ready), daemon=True)
    proc.start()
    try:
        if not ready.wait(120):
            raise RuntimeError("the extender did not start")
        names = [o["metadata"]["name"] for o in node_dicts(nodes, seed)]
        for _ in range(200):  # the port opens just after ready
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        asyncio.run(_clients(port, names, min(50, requests), concurrency, seed))  # warm-up
        before, cpu0, ccpu0 = _server_seconds(port), _cpu_seconds(proc.pid), time.process_time()
        t0 = time.perf_counter()
        lat, feasible = asyncio.run(_clients(port, names, requests, concurrency, seed))
        wall = time.perf_counter() - t0
        server = _server_seconds(port) - before
        cpu, ccpu = _cpu_seconds(proc.pid) - cpu0, time.process_time() - ccpu0
    finally:
        proc.terminate()
        proc.join(10)
    ms = np.array(lat) * 1e3
    return {
        "nodes": len(names),
        "requests": requests,
        "concurrency": concurrency,
        "extender_p50_ms": round(float(np.percentile(ms, 50)), 3),
        "extender_p90_ms": round(float(np.percentile(ms, 90)), 3),
        "extender_p99_ms": round(float(np.percentile(ms, 99)), 3),
        "server_ms_per_pair": round(server * 1e3 / requests, 3),
        "server_cpu_ms_per_pair": round(cpu * 1e3 / requests, 3) if cpu >= 0 else None,
        "client_cpu_ms_per_pair": round(ccpu * 1e3 / requests, 3),
        "pairs_per_s": round(requests / wall, 1),
        "mean_feasible_nodes": round(feasible / requests, 1),
    }
