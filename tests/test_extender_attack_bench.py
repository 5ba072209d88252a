"""``gpusched bench extender-attack``: its requests are what they claim, and a tiny run works
end to end (an extender child process on loopback). Numbers are the benchmark's business."""

from __future__ import annotations

import orjson
from typer.testing import CliRunner

from gpusched.bench.extender_attack import (
    _attack_bodies,
    _request_bodies,
    bench_extender_attack,
    realistic_node,
)
from gpusched.bench.k8s_extender import node_dicts
from gpusched.cli import app
from gpusched.extender.protocol import MAX_DEPTH, json_depth
from gpusched.k8s.convert import node_from_k8s


def test_realistic_node_is_api_sized_and_converts() -> None:
    base = node_dicts(1)[0]
    n = realistic_node(base)
    assert 10_000 <= len(orjson.dumps(n)) <= 20_000  # a GPU node as the API serves it
    spec = node_from_k8s(n)
    assert spec.gpu_count == int(base["status"]["allocatable"]["nvidia.com/gpu"]) and spec.gpu_memory_mib > 0


def test_attack_bodies() -> None:
    objs, bodies, pod = _request_bodies(3, 0, names_only=False)
    assert len(orjson.loads(bodies[0])["Nodes"]["items"]) == len(objs)
    a = _attack_bodies(objs, 100_000, pod)
    assert len(a["max_body"]) == 100_000 and len(a["over_body"]) == 100_001
    assert len(orjson.loads(a["max_body"])["Nodes"]["items"]) >= 5
    (claim,) = orjson.loads(a["gpu_claim"])["Nodes"]["items"]
    assert claim["status"]["allocatable"]["nvidia.com/gpu"] == "100000000"
    assert json_depth(a["deep"]) > MAX_DEPTH


def test_tiny_run_reports_both_phases_and_memory() -> None:
    r = bench_extender_attack(nodes=3, requests=5, seconds=3, max_body_bytes=65_536)
    assert r["extender_alive"]
    assert r["alone"]["count"] == 5 and r["alone"]["answers"] == {"200": 5}
    assert r["under_attack"]["answers"] == {"200": r["under_attack"]["count"]}
    answers = {k: set(v["answers"]) for k, v in r["attacks"].items()}
    assert answers["over_body"] <= {"413"} and answers["deep"] <= {"400"}
    assert not any(s.startswith("5") for got in answers.values() for s in got), answers
    assert r["rss_mb"]["peak"] is None or r["rss_mb"]["peak"] >= r["rss_mb"]["start"]


def test_registered_on_the_command_line() -> None:
    res = CliRunner().invoke(app, ["bench", "extender-attack", "--help"])
    assert res.exit_code == 0 and "--max-body-bytes" in res.output and "--node-names" in res.output
