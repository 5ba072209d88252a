"""``gpusched bench topology``: the measure, topology-aware against topology-blind (issue 31 item 4)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpusched.cli import app
from gpusched.core.errors import InvalidInput
from gpusched.sim.topology_bench import SHAPES, topology_report


def test_topology_aware_places_more_multi_gpu_pods_on_complete_single_numa_sets() -> None:
    _, rows = topology_report(list(SHAPES), [42], nodes=4, arrivals=600, load=0.9, policy="default")
    by = {(r["shape"], r["choice"]): r for r in rows}
    assert len(by) == 6
    for shape in SHAPES:
        blind, aware = by[(shape, "topology-blind best fit")], by[(shape, "topology-aware")]
        set_only = by[(shape, "GPU set aware, node blind")]
        assert aware["multi_placed"] > 50
        assert set_only["complete_pct"] > blind["complete_pct"], (shape, set_only, blind)  # type: ignore[operator]
        assert aware["complete_pct"] > set_only["complete_pct"], (shape, aware, set_only)  # type: ignore[operator]
        assert aware["one_numa_pct"] >= blind["one_numa_pct"]  # type: ignore[operator]
    # 4 NVLink pairs: no 4-GPU set is NVLink-complete, whatever the choice
    assert by[("pcie-4x2-nvlink", "topology-aware")]["complete_pct_by_size"]["4"] == 0.0  # type: ignore[index]


def test_an_unknown_shape_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(InvalidInput, match=r"unknown node shape.*'dgx'.*2-socket-2x4-nvlink"):
        topology_report(["dgx"], [42], nodes=2, arrivals=10, load=0.5, policy="default")


def test_the_command_prints_one_row_per_shape_and_choice_as_json() -> None:
    res = CliRunner().invoke(
        app, ["bench", "topology", "--shape", "2-socket-2x4-nvlink", "--seeds", "7", "--nodes", "2",
              "--arrivals", "200", "--json"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [r["choice"] for r in doc["results"]] == [
        "topology-blind best fit",
        "GPU set aware, node blind",
        "topology-aware",
    ]
    assert "seeds 7" in doc["title"]
