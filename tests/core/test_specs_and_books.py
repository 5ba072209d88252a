"""Specs (validation names the field) and the books (assume/forget, generations)."""

from __future__ import annotations

import numpy as np
import pytest

from builders import node, share, whole
from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.model import InvalidSpec, NodeSpec, PodSpec

# ------------------------------------------------------------------------------------------ specs


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "p", "cpu_milli": -1}, "cpu_milli"),
        ({"name": "p", "memory_mib": -5}, "memory_mib"),
        ({"name": "p", "cpu_milli": True}, "cpu_milli"),  # a bool is not an integer amount
        ({"name": "p", "memory_mib": 1.5}, "memory_mib"),
        ({"name": "p", "num_gpu": 1, "gpu_milli": 1200}, "gpu_milli"),
        ({"name": "p", "num_gpu": 1, "gpu_memory_mib": -1}, "gpu_memory_mib"),
        ({"name": "p", "num_gpu": 2, "gpu_milli": 500}, "num_gpu"),  # a share needs num_gpu 1
        ({"name": "p", "num_gpu": 1}, "num_gpu"),  # neither milli nor memory
        ({"name": "p", "gpu_milli": 500}, "num_gpu"),  # milli without GPUs
        ({"name": "p", "num_gpu": 1, "gpu_milli": 500, "gpu_models": frozenset({"A|B"})}, "gpu_models"),
        ({"name": "p", "num_gpu": 1, "gpu_milli": 500, "gpu_models": frozenset({""})}, "gpu_models"),
        ({"name": ""}, "name"),
    ],
)
def test_podspec_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSpec, match=rf"\b{field}\b"):
        PodSpec(**kwargs)  # type: ignore[arg-type]


def test_podspec_accepts_the_valid_shapes() -> None:
    assert share("s", 10).is_share and share("s", 990).gpu_demand_milli == 990
    assert not whole("w", 1).is_share and whole("w", 8).gpu_demand_milli == 8000
    mem_only = PodSpec("m", num_gpu=2, gpu_memory_mib=4096)
    assert mem_only.gpu_demand_milli == 0 and not mem_only.is_share
    assert PodSpec("c", cpu_milli=0).key == "default/c"
    assert PodSpec("c", namespace="ns").key == "ns/c"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": "", "cpu_milli": 1, "memory_mib": 1}, "name"),
        ({"name": "n", "cpu_milli": -1, "memory_mib": 1}, "cpu_milli"),
        ({"name": "n", "cpu_milli": 1, "memory_mib": -1}, "memory_mib"),
        ({"name": "n", "cpu_milli": 1, "memory_mib": 1, "gpu_count": -2, "gpu_model": "A"}, "gpu_count"),
        (
            {
                "name": "n",
                "cpu_milli": 1,
                "memory_mib": 1,
                "gpu_count": 1,
                "gpu_model": "A",
                "gpu_memory_mib": -1,
            },
            "gpu_memory_mib",
        ),
        ({"name": "n", "cpu_milli": 1, "memory_mib": 1, "gpu_count": 2}, "gpu_model"),
    ],
)
def test_nodespec_validation_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidSpec, match=rf"\b{field}\b"):
        NodeSpec(**kwargs)  # type: ignore[arg-type]


def test_duplicate_node_names_are_refused_by_name() -> None:
    with pytest.raises(InvalidSpec, match=r"duplicate node name 'n1'"):
        ClusterState([node("n0"), node("n1"), node("n2"), node("n1")])


# ------------------------------------------------------------------------------------------ books


def test_accounting_errors_leave_the_books_untouched() -> None:
    snap = ClusterState([node("a", gpus=2, cpu=4000), node("b", gpus=1, model="B")])
    p = share("p", 600, cpu=1000)
    snap.assume(p, 0, [1])
    before = [a.copy() for a in (snap.cpu_free, snap.mem_free, snap.gpu_free, snap.gpu_mem_free)]
    with pytest.raises(AccountingError, match="already assumed on a"):
        snap.assume(p, 1, [0])
    with pytest.raises(AccountingError, match="not assumed"):
        snap.forget("default/nobody")
    with pytest.raises(AccountingError, match="milli free"):
        snap.assume(share("q", 500), 0, [1])  # GPU 1 has 400 left
    with pytest.raises(AccountingError, match="cpu"):
        snap.assume(PodSpec("r", cpu_milli=3001), 0, [])
    with pytest.raises(AccountingError, match="GPU model B"):
        snap.assume(share("s", 100, gpu_models=frozenset({"A"})), 1, [0])
    with pytest.raises(AccountingError, match="has no GPU 1"):
        snap.assume(share("t", 100), 1, [1])  # node b has one GPU; slot 1 is padding
    with pytest.raises(AccountingError, match="repeat"):
        snap.assume(whole("u", 2), 0, [0, 0])
    with pytest.raises(AccountingError, match="asks for 2 GPUs"):
        snap.assume(whole("v", 2), 0, [0])
    for arr, want in zip(
        (snap.cpu_free, snap.mem_free, snap.gpu_free, snap.gpu_mem_free), before, strict=True
    ):
        assert np.array_equal(arr, want)
    assert snap.verify() == [] and list(snap.allocations) == ["default/p"]


def test_gen_moves_on_every_change_of_a_node_only() -> None:
    snap = ClusterState([node("a", gpus=1), node("b", gpus=1)])
    snap.assume(share("p", 100), 1, [0])
    snap.forget("default/p")
    assert snap.gen.tolist() == [0, 2]
