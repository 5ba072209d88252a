"""Shared fixtures: where the real Alibaba trace lives (skipping cleanly when it is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
