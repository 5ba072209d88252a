"""The node agent's gpusched.io/gpu-topology annotation read into the core NodeSpec (issue 31 item 4)."""

from __future__ import annotations

import json
import logging

import pytest

from builders import k8s_node
from gpusched.agent import labels
from gpusched.agent.inventory import GpuDevice, Inventory
from gpusched.core.topology import UNKNOWN_NUMA
from gpusched.k8s import convert
from gpusched.k8s.convert import node_from_k8s


def two_islands(n: int = 8) -> Inventory:
    """``n`` GPUs, two NVLink islands (all pairs) of n/2, one per NUMA node; GPU 0's NUMA node unknown."""
    half = n // 2
    devs = tuple(
        GpuDevice(
            g,
            f"GPU-{g}",
            "NVIDIA A100-SXM4-80GB",
            81920,
            f"00000000:{g:02x}:00.0",
            8,
            0,
            nvlink_peers=tuple(p for p in range(half * (g // half), half * (g // half) + half) if p != g),
            numa_node=None if g == 0 else g // half,
        )
        for g in range(n)
    )
    return Inventory("h", "550.107.02", (12, 4), devs)


def annotated(value: str, gpus: int = 8) -> dict[str, object]:
    obj = k8s_node("n1", gpus)
    obj["metadata"]["annotations"] = {"gpusched.io/gpu-topology": value}  # type: ignore[index]
    return obj


def test_the_annotation_key_is_the_agents() -> None:
    assert convert.ANN_TOPOLOGY == labels.ANN_TOPOLOGY


def test_the_agents_annotation_becomes_the_nodes_topology() -> None:
    topo = node_from_k8s(annotated(labels.topology_annotation(two_islands()))).gpu_topology
    assert topo is not None
    assert topo.numa == (UNKNOWN_NUMA, 0, 0, 0, 1, 1, 1, 1)
    assert topo.peers[5] == (4, 6, 7)
    assert topo.islands() == (0, 0, 0, 0, 4, 4, 4, 4)


def test_a_node_without_the_annotation_has_no_topology() -> None:
    assert node_from_k8s(k8s_node("n1", 8)).gpu_topology is None


GOOD = json.loads(labels.topology_annotation(two_islands(2)))


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("{not json", "unexpected character"),
        (json.dumps({"nvlinkGroups": []}), "'gpus'"),
        (json.dumps({**GOOD, "gpus": GOOD["gpus"][:1]}), "lists GPUs [0], the node has GPUs 0..1"),
        (json.dumps({**GOOD, "gpus": [GOOD["gpus"][0], {**GOOD["gpus"][1], "numa": "x"}]}), "GPU 1 numa 'x'"),
        (
            json.dumps({**GOOD, "gpus": [GOOD["gpus"][0], {**GOOD["gpus"][1], "nvlink": [7]}]}),
            "peer 7 is not",
        ),
        (
            json.dumps({**GOOD, "gpus": [GOOD["gpus"][0], GOOD["gpus"][0]]}),
            "GPU index 0 is not an integer or is",
        ),
    ],
)
def test_a_malformed_annotation_leaves_the_node_usable_topology_blind_with_a_warning(
    value: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert node_from_k8s(annotated(labels.topology_annotation(two_islands(2)), 2)).gpu_topology is not None
    with caplog.at_level(logging.WARNING, logger="gpusched.k8s.convert"):
        spec = node_from_k8s(annotated(value, 2))
    assert spec.gpu_topology is None and spec.gpu_count == 2
    assert "node n1: annotation gpusched.io/gpu-topology is not used" in caplog.text
    assert why in caplog.text


def test_a_topology_that_arrives_later_reaches_the_books_and_the_bookings_stay() -> None:
    from builders import whole
    from gpusched.core.devices import pick_gpus
    from gpusched.k8s.state import LiveCluster

    lc = LiveCluster()
    lc.upsert_node(k8s_node("n1", 8))
    with lc.live_books() as st:
        assert st.nodes[0].gpu_topology is None
    lc.assume(whole("a"), 0, (0,))
    lc.upsert_node(annotated(labels.topology_annotation(two_islands())))  # the agent annotates it
    with lc.live_books() as st:
        assert st.nodes[0].gpu_topology is not None
        assert "default/a" in st.allocations
        assert pick_gpus(st, whole("p", 4), 0) == (4, 5, 6, 7)  # blind: 1, 2, 3, 4
