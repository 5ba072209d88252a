"""The extender's CPU per pod with ``/filter`` picking the node, against ``/filter`` +
``/prioritize`` (``--no-pick-in-filter``), in process, alternating on the same books.

The books are ``bench.k8s_extender``'s: synthetic GPU nodes with shares bound on about half of
their GPUs. Each pod is sent as kube-scheduler sends it at this size: the names of a window of
``percentageOfNodesToScore``'s adaptive share of the nodes (50 − nodes/125 %, at least 5 %), the
window moving on pod after pod. Each mode parses the request body, answers ``/filter`` and (without
pick) parses and answers ``/prioritize`` for the nodes that passed; the order of the two modes
alternates pod by pod, so that a busy machine slows both alike. Both modes book nothing.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import orjson

from gpusched.bench.k8s_extender import live_books, share_pod
from gpusched.core.errors import InvalidInput


@dataclass(frozen=True)
class PickReport:
    nodes: int
    window: int
    pods: int
    pick_cpu_ms_per_pod: float
    filter_prioritize_cpu_ms_per_pod: float
    ratio: float
    """pick / (filter + prioritize)."""
    same_best: float
    """Share of pods whose picked node is a node ``/prioritize`` scores best (10)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def window_size(nodes: int) -> int:
    """kube-scheduler's ``numFeasibleNodesToFind`` with the adaptive percentage."""
    if nodes < 100:
        return nodes
    pct = max(5, 50 - nodes // 125)
    return max(100, nodes * pct // 100)


def bench_extender_pick(nodes: int = 1000, pods: int = 400, seed: int = 0) -> PickReport:
    from gpusched.extender.handlers import Extender
    from gpusched.extender.serve import build_profile

    if nodes < 1 or pods < 2:
        raise InvalidInput("nodes must be positive and pods at least 2")
    rng = np.random.default_rng(seed)
    live, names = live_books(nodes, seed, rng)
    profile = build_profile("default")
    modes = {True: Extender(live, profile, pick=True), False: Extender(live, profile, pick=False)}
    cpu = {True: 0.0, False: 0.0}
    win, start, same = window_size(len(names)), 0, 0
    for i in range(pods):
        milli, mem = int(rng.choice([100, 230, 320, 470, 650, 810])), int(rng.choice([0, 2048, 4096]))
        pod = share_pod(f"p{i}", milli, mem)
        window = [names[(start + k) % len(names)] for k in range(win)]
        start = (start + win) % len(names)
        body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": window})
        picked: list[str] = []
        best: set[str] = set()
        for pick in (True, False) if i % 2 else (False, True):
            ext = modes[pick]
            t0 = time.process_time()
            answer = ext.filter(orjson.loads(body))
            if not pick:
                second = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": answer["NodeNames"]})
                scores = orjson.loads(ext.prioritize_json(orjson.loads(second)))
            cpu[pick] += time.process_time() - t0
            if pick:
                picked = answer["NodeNames"] or []
            else:
                best = {s["Host"] for s in scores if s["Score"] == 10}
        same += bool(picked) and picked[0] in best
    return PickReport(
        nodes=len(names),
        window=win,
        pods=pods,
        pick_cpu_ms_per_pod=round(cpu[True] / pods * 1e3, 3),
        filter_prioritize_cpu_ms_per_pod=round(cpu[False] / pods * 1e3, 3),
        ratio=round(cpu[True] / cpu[False], 3) if cpu[False] else 0.0,
        same_best=round(same / pods, 3),
    )
