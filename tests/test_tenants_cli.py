"""``gpusched bench tenants`` and ``gpusched bench gangs`` through typer's CliRunner."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from gpusched.cli.commands import app


def test_bench_tenants_json_has_both_modes_and_every_tenant() -> None:
    args = ["bench", "tenants", "--synthetic-nodes", "16", "--synthetic-pods", "150", "--json"]
    res = CliRunner().invoke(app, [*args, "--tenants", "a:40,b:40,c:20:2"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [r["mode"] for r in out["results"]] == ["queues", "plain"]
    assert out["scenario"]["weights"] == [1, 1, 2]
    queues = out["results"][0]["tenants"]
    assert [t["tenant"] for t in queues] == ["a", "b", "c"]
    assert all(t["quota_violations"] == 0 and t["partial_gang_idle_gpu_hours"] == 0 for t in queues)


def test_bench_tenants_bad_tenants_is_one_error_line() -> None:
    res = CliRunner().invoke(app, ["bench", "tenants", "--tenants", "a:50,b:x,c:10"])
    assert res.exit_code == 2
    assert "tenants: 'b:x' is not name:quota%[:weight] with integers" in res.output


def test_bench_gangs_json() -> None:
    args = ["bench", "gangs", "--nodes", "60", "--size", "8", "--decisions", "3", "--json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(res.stdout)["results"]
    assert row["gang"] == "8x1" and row["gang_ms"]["p50_ms"] > 0 and row["refused_ms"]["pods_tried"] >= 1
