"""``gpusched bench gang-topology``: gangs within one clique/rack/block, topology-aware against
topology-blind (issue 31 item 4)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from gpusched.cli import app
from gpusched.core.errors import InvalidInput
from gpusched.sim.gang_topology_bench import (
    BLIND,
    PREFERRED,
    REQUIRED,
    Shape,
    gang_topology_report,
    ideal_level,
)


def test_topology_aware_gangs_land_within_one_domain_more_often_than_blind_ones() -> None:
    _, rows = gang_topology_report([42], shape=Shape(), arrivals=500, load=0.85, policy="default")
    by = {r["choice"]: r for r in rows}
    blind, pref, req = by[BLIND], by[PREFERRED], by[REQUIRED]
    assert blind["gangs_placed"] > 100  # type: ignore[operator]
    assert pref["within_clique_pct"] > blind["within_clique_pct"] + 30  # type: ignore[operator]
    assert pref["ideal_pct"] > blind["ideal_pct"] + 30  # type: ignore[operator]
    assert req["ideal_pct"] == 100.0  # required: never split beyond its level
    assert req["within_block_pct"] == 100.0


def test_the_ideal_level_is_the_narrowest_that_holds_the_gang() -> None:
    s = Shape()  # clique 16, rack 32, block 64 GPUs
    assert [ideal_level(s, g) for g in (2, 16, 17, 32, 64, 65)] == [0, 0, 1, 1, 2, 3]


def test_bad_input_is_refused() -> None:
    with pytest.raises(InvalidInput, match="load must be above 0"):
        gang_topology_report([1], shape=Shape(), arrivals=10, load=0, policy="default")
    with pytest.raises(InvalidInput, match="at least 1"):
        gang_topology_report([1], shape=Shape(racks=0), arrivals=10, load=0.5, policy="default")


def test_the_command_prints_one_row_per_choice_as_json() -> None:
    res = CliRunner().invoke(
        app, ["bench", "gang-topology", "--seeds", "7", "--blocks", "1", "--arrivals", "150", "--json"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [r["choice"] for r in doc["results"]] == [BLIND, PREFERRED, REQUIRED]
    assert "seeds 7" in doc["title"] and "1 blocks" in doc["title"]
