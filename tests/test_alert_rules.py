"""The alert rules: generated from one source (src/gpusched/metrics/alerts.py) into the plain rules
file and the chart; valid for ``promtool check rules``; each alert fires in its scenario and not
just short of it (``promtool test rules``, deploy/prometheus/gpusched-rules.test.yaml)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpusched.metrics.alerts import alerts, rule_groups
from gpusched.metrics.generate import RULES_FILES, rules_yaml
from realparts import unavailable

ROOT = Path(__file__).resolve().parent.parent
PROM = ROOT / "deploy/prometheus"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        unavailable("promtool is not installed (Debian: apt-get install prometheus)")
    return path


def test_rules_files_are_the_generators_output() -> None:
    for p in RULES_FILES:
        assert (ROOT / p).read_text() == rules_yaml(), f"{p} is stale: run python3 hack/gen-dashboards.py"


def test_every_alert_has_a_unique_name_a_severity_and_text() -> None:
    names = [a.name for a in alerts()]
    assert len(names) == len(set(names)) == 12
    for r in rule_groups()["groups"][0]["rules"]:
        assert r["labels"]["severity"] in {"info", "warning", "critical"}
        assert r["annotations"]["summary"] and r["annotations"]["description"]


def test_promtool_check_rules() -> None:
    out = subprocess.run([_promtool(), "check", "rules", str(PROM / "gpusched-rules.yaml")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in out.stdout


def test_promtool_check_rules_rejects_a_broken_expression(tmp_path: Path) -> None:
    doc = rule_groups()
    doc["groups"][0]["rules"][0]["expr"] = "sum(gpusched_gpus"
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    out = subprocess.run([_promtool(), "check", "rules", str(tmp_path / "bad.yaml")],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode != 0 and "GPUSchedGPUsIdleWhilePodsPending" not in out.stdout


def test_promtool_unit_tests_cover_every_alert() -> None:
    tests = yaml.safe_load((PROM / "gpusched-rules.test.yaml").read_text())
    fired = {
        t["alertname"] for case in tests["tests"] for t in case["alert_rule_test"] if t.get("exp_alerts")
    }
    assert fired == {a.name for a in alerts()}
    out = subprocess.run([_promtool(), "test", "rules", "gpusched-rules.test.yaml"],
                         cwd=PROM, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("threshold", [0.9])
def test_promtool_unit_tests_fail_when_a_rule_changes(tmp_path: Path, threshold: float) -> None:
    """The unit tests can fail: with the stranded threshold at 90 % the A100 case (75 %) no longer fires."""
    from gpusched.metrics.alerts import Thresholds

    (tmp_path / "gpusched-rules.yaml").write_text(rules_yaml(Thresholds(stranded_ratio=threshold)))
    (tmp_path / "t.yaml").write_text((PROM / "gpusched-rules.test.yaml").read_text())
    out = subprocess.run([_promtool(), "test", "rules", "t.yaml"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert out.returncode != 0 and "GPUSchedStrandedCapacityHigh" in out.stdout + out.stderr
