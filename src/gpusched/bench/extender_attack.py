"""``gpusched bench extender-attack``: valid ``/filter`` latency alone and under adversarial load.

The extender app serves in a child process (``python -m gpusched.bench.extender_attack
serve``) on loopback, with informer-free books: ``nodes`` synthetic GPU nodes
(``bench.k8s_extender.node_dicts``) and GPU shares bound on about half of their GPUs. A client
sends valid ``/filter`` requests one after another, as kube-scheduler does (one scheduling
cycle after another): with ``nodeCacheCapable: false`` (the default here) each carries every
node as a v1.Node object of realistic size (about 12 KB: GPU feature discovery labels,
conditions, 50 container images), else only the node names. First alone, then while another
process runs one adversarial client per kind, each sending one request after another:

- ``gpu_claim`` — a filter whose only node claims 100 000 000 GPUs;
- ``max_body`` — a filter with as many node objects (unknown to the books, so evaluated from
  the objects) as fit in the extender's body limit;
- ``over_body`` — one byte over that limit;
- ``deep`` — a pod of 100 000 nested arrays (fewer if the body limit is under 200 KB);
- ``garbage`` — malformed raw HTTP on a fresh connection (random bytes, a bad request line, a
  bad header, an absurd Content-Length), noting whether a status line came back.

The report gives p50/p99/max of the valid filters in both phases, what each kind of attack got
back (HTTP status counts, ``closed`` when the connection closed without a status line,
``timeout``) and the extender's resident memory (``VmRSS`` of /proc/<pid>/status) before,
after each phase and after settling, with its peak (``VmHWM``). Everything is bounded: counts,
per-phase seconds, per-request timeouts, loopback only. On a shared machine the latencies grow
with the load; compare the two phases of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import subprocess
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import orjson

from gpusched.bench.k8s_extender import live_books, node_dicts, share_pod
from gpusched.core.errors import InvalidInput

ATTACKS = ("gpu_claim", "max_body", "over_body", "deep", "garbage")
GARBAGE = (
    b"\x00\xff\x13\x37 random bytes \r\n\r\n",
    b"POST /filter HTTP/9.9 extra\r\n\r\n",
    b"POST /filter HTTP/1.1\r\nHost: x\r\nBad Header Without Colon\r\n\r\n",
    b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX: " + b"a" * 20000 + b"\r\n\r\n",
)


def realistic_node(base: dict[str, Any], images: int = 50) -> dict[str, Any]:
    """``base`` (a ``node_dicts`` entry) dressed as the API serves a GPU node: GPU feature
    discovery labels, annotations, conditions, addresses, node info and ``images`` images."""
    name = base["metadata"]["name"]
    alloc = {
        **base["status"]["allocatable"],
        "ephemeral-storage": "1756698640Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
    }
    labels = {
        **base["metadata"]["labels"],
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "gpu-8x",
        "topology.kubernetes.io/region": "region-1",
        "topology.kubernetes.io/zone": f"region-1{'abc'[zlib.crc32(name.encode()) % 3]}",
        "feature.node.kubernetes.io/cpu-model.vendor_id": "Intel",
        "feature.node.kubernetes.io/kernel-version.full": "5.15.0-105-generic",
        "feature.node.kubernetes.io/pci-10de.present": "true",
        "nvidia.com/cuda.driver.major": "535",
        "nvidia.com/cuda.driver.minor": "161",
        "nvidia.com/cuda.driver.rev": "08",
        "nvidia.com/cuda.driver-version.major": "535",
        "nvidia.com/cuda.runtime.major": "12",
        "nvidia.com/cuda.runtime.minor": "2",
        "nvidia.com/gfd.timestamp": "1700000000",
        "nvidia.com/gpu.compute.major": "8",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/gpu.count": base["status"]["allocatable"]["nvidia.com/gpu"],
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
        "nvidia.com/gpu.family": "ampere",
        "nvidia.com/gpu.machine": "SYS-4029GP-TRT",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/mig.capable": "false",
        "nvidia.com/mps.capable": "false",
    }
    now = "2024-01-01T00:00:00Z"
    conditions = [
        {
            "type": t,
            "status": s,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
            "reason": r,
            "message": m,
        }
        for t, s, r, m in (
            (
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
            ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        )
    ]
    imgs = [
        {
            "names": [
                f"registry.example.com/team{i % 7}/image-{i}@sha256:{(i * 2654435761) % 2**64:064x}",
                f"registry.example.com/team{i % 7}/image-{i}:v1.{i}.0",
            ],
            "sizeBytes": 100_000_000 + i * 7_654_321,
        }
        for i in range(images)
    ]
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": f"00000000-0000-4000-8000-{zlib.crc32(name.encode()):012d}",
            "resourceVersion": "123456",
            "creationTimestamp": now,
            "labels": labels,
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "nfd.node.kubernetes.io/feature-labels": "cpu-model.vendor_id,kernel-version.full,"
                "pci-10de.present",
            },
        },
        "spec": {"podCIDR": "10.244.3.0/24", "podCIDRs": ["10.244.3.0/24"], "providerID": f"bare://{name}"},
        "status": {
            "capacity": alloc,
            "allocatable": alloc,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": "10.0.3.17"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "0" * 32,
                "systemUUID": "0" * 36,
                "bootID": "0" * 36,
                "kernelVersion": "5.15.0-105-generic",
                "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.12",
                "kubeletVersion": "v1.30.2",
                "kubeProxyVersion": "v1.30.2",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": imgs,
        },
    }


# --------------------------------------------------------------------------------------------- server
def _serve(argv: Sequence[str]) -> None:
    """The child: books of ``--nodes`` nodes, the extender app on 127.0.0.1, its port on stdout."""
    from aiohttp import web

    from gpusched.extender.app import limit_heap_growth, make_app
    from gpusched.extender.handlers import Extender
    from gpusched.extender.serve import build_profile

    p = argparse.ArgumentParser(prog="extender_attack serve")
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-body-bytes", type=int, default=None)
    a = p.parse_args(argv)
    live, _ = live_books(a.nodes, a.seed)
    kwargs: dict[str, Any] = {}
    if a.max_body_bytes is not None:
        kwargs["max_body_bytes"] = a.max_body_bytes
    limit_heap_growth()  # as gpusched extender does
    app = make_app(Extender(live, build_profile("default")), **kwargs)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None, handle_signals=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        sys.stdout.write(f"PORT {port}\n")
        sys.stdout.flush()
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    asyncio.run(main())


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` (KiB) of process ``pid``; empty where there is no /proc."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    out[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


def _rss_mb(pid: int, key: str = "VmRSS") -> float | None:
    kib = proc_status(pid).get(key)
    return round(kib / 1024, 1) if kib is not None else None


# --------------------------------------------------------------------------------------------- client
def _pct(xs: list[float]) -> dict[str, Any]:
    if not xs:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    ms = np.array(xs) * 1e3
    return {
        "count": len(xs),
        "p50_ms": round(float(np.percentile(ms, 50)), 2),
        "p99_ms": round(float(np.percentile(ms, 99)), 2),
        "max_ms": round(float(ms.max()), 2),
    }


async def _valid_filters(
    port: int, bodies: list[bytes], requests: int, seconds: float, stop: Callable[[], bool] = lambda: False
) -> tuple[list[float], Counter[str]]:
    """Valid filters one after another until ``requests`` were answered or ``seconds`` passed."""
    import aiohttp

    lat: list[float] = []
    statuses: Counter[str] = Counter()
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        for i in range(requests):
            if time.monotonic() > deadline or stop():
                break
            t0 = time.perf_counter()
            try:
                async with s.post(
                    f"http://127.0.0.1:{port}/filter",
                    data=bodies[i % len(bodies)],
                    headers={"Content-Type": "application/json"},
                ) as r:
                    answer = orjson.loads(await r.read())
                    ok = r.status == 200 and not answer.get("Error")
                    statuses[str(r.status) if ok else f"{r.status} error"] += 1
            except (TimeoutError, aiohttp.ClientError, orjson.JSONDecodeError) as e:
                statuses[type(e).__name__] += 1
                continue
            lat.append(time.perf_counter() - t0)
    return lat, statuses


async def _raw(port: int, data: bytes, timeout: float) -> str:
    """Send ``data`` on a fresh connection; the answer's status code, ``closed`` or ``timeout``."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except (TimeoutError, OSError):
        return "refused"
    try:
        writer.write(data)
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), timeout)
    except TimeoutError:
        return "timeout"
    except OSError:
        return "closed"
    finally:
        writer.close()
    parts = line.split()
    return parts[1].decode(errors="replace") if line.startswith(b"HTTP/") and len(parts) > 1 else "closed"


def _attack_bodies(nodes: list[dict[str, Any]], max_body: int, pod: dict[str, Any]) -> dict[str, bytes]:
    base = nodes[0]
    claim = orjson.loads(orjson.dumps(base))
    claim["metadata"]["name"] = "attack-claim"
    for k in ("allocatable", "capacity"):
        claim["status"][k]["nvidia.com/gpu"] = "100000000"
    gpu_claim = orjson.dumps({"Pod": pod, "Nodes": {"items": [claim]}, "NodeNames": None})
    # max_body: node objects unknown to the books (so evaluated from the objects) up to the limit
    one = realistic_node(base)
    head = b'{"Pod":' + orjson.dumps(pod) + b',"NodeNames":null,"Nodes":{"items":['
    items: list[bytes] = []
    total = len(head) + 3
    while True:
        one["metadata"]["name"] = one["metadata"]["labels"]["kubernetes.io/hostname"] = f"attack-{len(items)}"
        enc = orjson.dumps(one)
        if total + len(enc) + 1 > max_body:
            break
        items.append(enc)
        total += len(enc) + 1
    deep = min(100_000, (max_body - 64) // 2)  # within the body limit
    body = head + b",".join(items) + b"]}}"
    body += b" " * (max_body - len(body))  # exactly the limit
    return {
        "gpu_claim": gpu_claim,
        "max_body": body,
        "over_body": body + b" ",
        "deep": b'{"Pod":' + b"[" * deep + b"]" * deep + b',"NodeNames":["x"]}',
    }


def _attack_main(port: int, bodies: dict[str, bytes], stop: Any, out: Any, seconds: float) -> None:
    """The attacking process: one client per kind, one request after another, until ``stop``."""

    async def main() -> dict[str, Any]:
        import aiohttp

        stats: dict[str, Counter[str]] = {k: Counter() for k in ATTACKS}
        times: dict[str, list[float]] = {k: [] for k in ATTACKS}
        deadline = time.monotonic() + seconds
        rng = random.Random(0)

        def done() -> bool:
            return bool(stop.is_set()) or time.monotonic() > deadline

        async def http(kind: str) -> None:
            timeout = aiohttp.ClientTimeout(total=30)
            async with aiohttp.ClientSession(timeout=timeout) as s:
                while not done():
                    t0 = time.perf_counter()
                    try:
                        async with s.post(
                            f"http://127.0.0.1:{port}/filter",
                            data=bodies[kind],
                            headers={"Content-Type": "application/json"},
                        ) as r:
                            await r.read()
                            stats[kind][str(r.status)] += 1
                    except (TimeoutError, aiohttp.ClientError) as e:
                        stats[kind][type(e).__name__] += 1
                        await asyncio.sleep(0.05)
                    times[kind].append(time.perf_counter() - t0)

        async def garbage() -> None:
            while not done():
                data = rng.choice([*GARBAGE, bytes(rng.getrandbits(8) for _ in range(64))])
                t0 = time.perf_counter()
                stats["garbage"][await _raw(port, data, 5.0)] += 1
                times["garbage"].append(time.perf_counter() - t0)

        await asyncio.gather(*(http(k) for k in ATTACKS if k != "garbage"), garbage())
        return {k: {"answers": dict(stats[k]), **_pct(times[k])} for k in ATTACKS}

    out.put(asyncio.run(main()))


def _request_bodies(
    nodes: int, seed: int, names_only: bool
) -> tuple[list[dict[str, Any]], list[bytes], dict[str, Any]]:
    objs = [realistic_node(n) for n in node_dicts(nodes, seed)]
    rng = np.random.default_rng(seed + 1)
    pods = [
        share_pod(f"p{i}", int(rng.choice([100, 230, 320, 470, 650, 810])), int(rng.choice([0, 2048, 4096])))
        for i in range(16)
    ]
    names = [o["metadata"]["name"] for o in objs]
    if names_only:
        bodies = [orjson.dumps({"Pod": p, "Nodes": None, "NodeNames": names}) for p in pods]
    else:
        bodies = [orjson.dumps({"Pod": p, "Nodes": {"items": objs}, "NodeNames": None}) for p in pods]
    return objs, bodies, pods[0]


def _start_server(nodes: int, seed: int, max_body_bytes: int | None) -> tuple[subprocess.Popen[bytes], int]:
    cmd = [
        sys.executable,
        "-m",
        "gpusched.bench.extender_attack",
        "serve",
        "--nodes",
        str(nodes),
        "--seed",
        str(seed),
    ]
    if max_body_bytes is not None:
        cmd += ["--max-body-bytes", str(max_body_bytes)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    line = b""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(b"PORT ") or not line:
            break
    if not line.startswith(b"PORT "):
        proc.kill()
        proc.wait(10)
        raise RuntimeError(f"the extender did not start (exit status {proc.poll()})")
    return proc, int(line.split()[1])


def bench_extender_attack(
    nodes: int = 200,
    requests: int = 300,
    seconds: float = 30.0,
    names_only: bool = False,
    max_body_bytes: int | None = None,
    seed: int = 0,
    on_progress: Callable[[str], None] = lambda msg: None,
) -> dict[str, Any]:
    """Valid ``/filter`` latency alone and under attack, and the extender's memory (module doc).

    ``max_body_bytes``: the extender's body limit (default: its own default)."""
    if nodes <= 0 or requests <= 0 or seconds <= 0:
        raise InvalidInput("nodes, requests and seconds must be positive")
    from gpusched.extender.app import DEFAULT_MAX_BODY_BYTES

    limit = max_body_bytes if max_body_bytes is not None else DEFAULT_MAX_BODY_BYTES
    if limit < 4096:
        raise InvalidInput(f"max_body_bytes must be at least 4096, got {limit}")
    on_progress("building requests")
    objs, bodies, pod = _request_bodies(nodes, seed, names_only)
    attack = _attack_bodies(objs, limit, pod)
    on_progress("starting the extender")
    proc, port = _start_server(nodes, seed, max_body_bytes)
    try:
        asyncio.run(_valid_filters(port, bodies, 20, seconds))  # warm-up
        rss: dict[str, float | None] = {"start": _rss_mb(proc.pid)}
        on_progress(f"valid filters alone ({requests} at most, {seconds:g} s at most)")
        calm, calm_status = asyncio.run(_valid_filters(port, bodies, requests, seconds))
        rss["after_alone"] = _rss_mb(proc.pid)
        on_progress("valid filters under attack")
        ctx: Any = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        stop, out = ctx.Event(), ctx.Queue()
        attacker = ctx.Process(target=_attack_main, args=(port, attack, stop, out, seconds + 60), daemon=True)
        attacker.start()
        time.sleep(0.5)  # let every attacker start
        hot, hot_status = asyncio.run(_valid_filters(port, bodies, requests, seconds))
        stop.set()
        on_progress("waiting for the attackers' last requests")
        try:
            attacks = out.get(timeout=90)
        except Exception:
            attacks = {}
        attacker.join(10)
        if attacker.is_alive():
            attacker.kill()
        rss["after_attack"] = _rss_mb(proc.pid)
        time.sleep(2.0)
        rss["settled"] = _rss_mb(proc.pid)
        rss["peak"] = _rss_mb(proc.pid, "VmHWM")
        alive = proc.poll() is None
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return {
        "nodes": nodes,
        "node_cache_capable": names_only,
        "valid_body_bytes": len(bodies[0]),
        "max_body_bytes": limit,
        "alone": {**_pct(calm), "answers": dict(calm_status)},
        "under_attack": {**_pct(hot), "answers": dict(hot_status)},
        "attacks": attacks,
        "rss_mb": rss,
        "extender_alive": alive,
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        _serve(sys.argv[2:])
    else:
        os.write(2, b"usage: python -m gpusched.bench.extender_attack serve --nodes N [--max-body-bytes B]\n")
        sys.exit(2)
