"""The dashboards: the committed JSON in the chart is the generator's output; every panel has a
Prometheus query on the datasource variable; the chart ships them for Grafana's sidecar."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gpusched.metrics.generate import DASHBOARD_DIR, outputs, stale

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("grafana_foundation_sdk", reason="pip install -e .[dev] (grafana-foundation-sdk)")


def test_committed_files_equal_the_generators_output() -> None:
    assert stale(ROOT) == [], "stale generated files: run python3 hack/gen-dashboards.py"


def test_stale_names_a_changed_file(tmp_path: Path) -> None:
    for p, text in outputs().items():
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_text(text)
    assert stale(tmp_path) == []
    victim = tmp_path / DASHBOARD_DIR / "gpusched-overview.json"
    victim.write_text(victim.read_text().replace("gpusched_gpus_stranded", "gpusched_gpus_strandd"))
    (tmp_path / DASHBOARD_DIR / "gpusched-old.json").write_text("{}")
    assert stale(tmp_path) == [DASHBOARD_DIR / "gpusched-overview.json", DASHBOARD_DIR / "gpusched-old.json"]


def _dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted((ROOT / DASHBOARD_DIR).glob("*.json"))}


def test_five_dashboards_every_panel_queries_prometheus() -> None:
    ds = _dashboards()
    assert set(ds) == {
        f"gpusched-{n}.json" for n in ("overview", "gpu-map", "scheduling", "pending", "queues")
    }
    for name, d in ds.items():
        assert d["uid"].startswith("gpusched-") and d["title"].startswith("gpusched / ")
        assert [v["name"] for v in d["templating"]["list"]] == ["datasource"]
        for p in d["panels"]:
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, p["title"])
            assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), (name, p["title"])
            for t in p["targets"]:  # the only Grafana macro: $__rate_interval; no other variables
                assert set(re.findall(r"\$\{?\w+", t["expr"])) <= {"$__rate_interval"}, t["expr"]


def test_panels_do_not_overlap() -> None:
    for name, d in _dashboards().items():
        cells: set[tuple[int, int]] = set()
        for p in d["panels"]:
            g = p["gridPos"]
            mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
            assert not cells & mine and g["x"] + g["w"] <= 24, (name, p["title"])
            cells |= mine


def test_chart_templates_read_the_generated_files() -> None:
    chart = ROOT / "deploy/helm/gpusched"
    dash = (chart / "templates/dashboards.yaml").read_text()
    assert (
        '.Files.Glob "dashboards/*.json"' in dash
        and "grafana_dashboard" in (chart / "values.yaml").read_text()
    )
    assert '.Files.Get "rules/gpusched-rules.yaml"' in (chart / "templates/prometheusrule.yaml").read_text()
