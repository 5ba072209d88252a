"""The suite's read-back checker on hand-made API objects: it must see every kind of double booking."""

from __future__ import annotations

import json
from typing import Any

import pytest
from chaoslib import GPU_MEMORY_MIB, Workload, parse_seeds, read_books

from gpusched.testenv.kwoknodes import kwok_gpu_node

pytestmark = pytest.mark.chaos


def node(name: str, gpus: int = 2) -> dict[str, Any]:
    n: dict[str, Any] = kwok_gpu_node(name, gpus, model="A100", gpu_memory_mib=GPU_MEMORY_MIB)
    return n


def pod(
    name: str, res: dict[str, str], node: str | None = None, gpus: list[int] | None = None, **extra: Any
) -> dict[str, Any]:
    ann = {}
    if gpus is not None:
        ann["gpusched.io/assignment"] = json.dumps({"node": extra.get("ann_node", node), "gpus": gpus})
    return {
        "metadata": {"name": name, "namespace": "ns", "annotations": ann},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": res}}]},
        "status": {"phase": extra.get("phase", "Running" if node else "Pending")},
    }


SHARE = {"gpusched.io/gpu-milli": "600"}


def test_clean_books() -> None:
    b = read_books(
        [node("a")],
        [pod("p1", SHARE, "a", [0]), pod("p2", SHARE, "a", [1]), pod("w", {"nvidia.com/gpu": "1"})],
    )
    assert not b.broken and (b.bound, b.pending, b.pending_fit) == (2, 1, [])  # the whole GPU fits nowhere


def test_sees_every_double_booking() -> None:
    mem = {"gpusched.io/gpu-milli": "100", "gpusched.io/gpu-memory": str(50 * 1024)}
    b = read_books(
        [node("a"), node("b", gpus=1)],
        [
            pod("p1", SHARE, "a", [0]),
            pod("p2", SHARE, "a", [0]),  # 1200 milli on a/0
            pod("m1", mem, "a", [1]),
            pod("m2", mem, "a", [1]),  # 100 GiB on an 80 GiB GPU
            pod("w", {"nvidia.com/gpu": "2"}, "b", [0, 1]),  # 2 GPUs on a node of 1
            pod("x", SHARE, "b"),  # bound without an assignment
            pod("y", SHARE, "b", [0], ann_node="a"),  # an assignment naming another node
            pod("done", SHARE, "a", [0], phase="Succeeded"),  # terminal: holds nothing
        ],
    )
    assert b.gpus_over_milli == {"a/0": 1200}
    assert b.gpus_over_memory == {"a/1": 100 * 1024}
    assert b.nodes_over_count == {"b": 2}
    assert set(b.unassigned) == {"ns/x", "ns/y"}
    assert b.terminal == 1 and b.broken


def test_pending_pods_that_fit_are_named() -> None:
    b = read_books([node("a")], [pod("p1", SHARE, "a", [0]), pod("q", {"gpusched.io/gpu-milli": "500"})])
    assert b.pending_fit == ["ns/q"] and not b.broken


def test_seeds_and_workload() -> None:
    assert parse_seeds(None) == [1] and parse_seeds("1-3,7") == [1, 2, 3, 7]
    wl = Workload()
    assert wl.nodes * wl.gpus_per_node >= 240 and wl.pods >= 200
