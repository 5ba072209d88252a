"""Shared fixtures: where the real Alibaba trace lives (skipping cleanly when it is absent), and the real
control plane's binaries (skipping without Go, failing under CI)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from realparts import unavailable

_DEFAULT_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


def trace_csv_dir() -> Path:
    """``$GPUSCHED_TRACES/alibaba-gpu-2023/csv``, else ``shared/traces/...`` beside the repository."""
    root = Path(os.environ.get("GPUSCHED_TRACES") or _DEFAULT_TRACES)
    return root / "alibaba-gpu-2023" / "csv"


@pytest.fixture(scope="session")
def trace_csv() -> Path:
    """The folder of the real trace CSVs; skips the test when the default trace is not there."""
    d = trace_csv_dir()
    needed = ("openb_node_list_gpu_node.csv", "openb_pod_list_default.csv")
    missing = [n for n in needed if not (d / n).is_file()]
    if missing:
        pytest.skip(
            f"Alibaba GPU trace not found ({', '.join(missing)} missing under {d}); "
            "set GPUSCHED_TRACES to the folder that holds alibaba-gpu-2023/"
        )
    return d


# ------------------------------------------------------------------ the real control plane (e2e, chaos)
@pytest.fixture(scope="session")
def control_plane_bin() -> Path:
    """The control plane binaries (``hack/build-control-plane.sh``); skips without Go, fails under CI."""
    from gpusched.testenv import BinariesUnavailableError, find_binaries

    try:
        return find_binaries()
    except BinariesUnavailableError as exc:
        if exc.go_missing:
            unavailable(f"the e2e control plane cannot be built: Go is not installed. {exc}")
        pytest.fail(f"the e2e control plane could not be built: {exc}", pytrace=False)


# ------------------------------------------------------------------ one xdist worker for the real node
REAL_NODE_GROUP = "real-node"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests run grouped by file on the xdist workers (``--dist loadgroup``, as ``loadfile`` would), but
    every test marked ``kubelet`` goes to one group: the machine has one real node at a time (its lock,
    ``testenv/node.py``), and the node ``tests/kubelet``'s session fixture starts is held until that
    worker's session ends, so a second worker wanting a node would wait for the whole run. Within the
    group, the tests that start a node of their own (the quickstart's) run before the session's node."""
    for item in items:
        group = REAL_NODE_GROUP if item.get_closest_marker("kubelet") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))
    own = [i for i in items if i.get_closest_marker("kubelet") and "kubelet_env" not in i.fixturenames]
    if own:
        mine = {id(i) for i in own}
        rest = [i for i in items if id(i) not in mine]
        first = next((k for k, i in enumerate(rest) if i.get_closest_marker("kubelet")), len(rest))
        items[:] = rest[:first] + own + rest[first:]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The numbers of every chaos run (tests/chaos), one line each, from the reports' user properties."""
    rows = []
    for reports in terminalreporter.stats.values():
        for rep in reports:
            for key, value in getattr(rep, "user_properties", ()) or ():
                if key == "chaos" and getattr(rep, "when", "") == "call":
                    rows.append(json.loads(value))
    if not rows:
        return
    cols = ("scenario", "front_end", "seed", "pods_created", "pods_bound", "pods_deleted", "pods_pending",
            "gpus_over_milli", "gpus_over_memory", "nodes_over_count", "bound_without_assignment",
            "pending_that_fit", "duration_s")  # fmt: skip
    terminalreporter.section("chaos runs")
    terminalreporter.write_line(" | ".join(cols))
    for r in sorted(rows, key=lambda r: (r["scenario"], r["front_end"], r["seed"])):
        terminalreporter.write_line(" | ".join(str(r.get(c, "")) for c in cols))
