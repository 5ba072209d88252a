"""The FGD authors' published results (``fgd-expected-results/analysis_allo_discrete.csv``)
and a per-trace comparison of our policies against them."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from gpusched.core.errors import InvalidInput
from gpusched.sim.report import packing_experiment
from gpusched.sim.traces import read_nodes, read_pods
from gpusched.sim.workload import Workload

POLICY_NAMES = {
    "01-Random": "random",
    "02-DotProd": "dotprod",
    "03-GpuClustering": "clustering",
    "04-GpuPacking": "packing",
    "05-BestFit": "bestfit",
    "06-FGD": "fgd",
}


def read_published(path: Path) -> dict[tuple[str, str], dict[int, tuple[float, float]]]:
    """(trace, policy) -> seed -> (alloc at 100 %, alloc at 130 %)."""
    out: dict[tuple[str, str], dict[int, tuple[float, float]]] = defaultdict(dict)
    with path.open(newline="") as fh:
        for line, row in enumerate(csv.DictReader(fh), start=2):
            try:
                pol = POLICY_NAMES.get(row["sc_policy"], row["sc_policy"])
                out[(row["workload"], pol)][int(row["seed"])] = (float(row["100"]), float(row["130"]))
            except (KeyError, TypeError, ValueError) as e:
                raise InvalidInput(
                    f"{path}:{line}: not a published-results row (need workload, sc_policy, seed, "
                    f"100, 130): {type(e).__name__} {e}"
                ) from None
    return out


def bench_traces(
    trace_dir: Path,
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    baseline: str = "fgd",
    jobs: int = 1,
    on_done: Callable[[str], None] | None = None,
    all_traces: bool = False,
) -> dict[str, object]:
    """Every pod list in ``trace_dir/csv`` that has published results, against ``baseline``;
    with ``all_traces`` every pod list there (published columns None where there are none:
    run our ``fgd`` alongside to compare)."""
    results_csv = trace_dir / "fgd-expected-results" / "analysis_allo_discrete.csv"
    if results_csv.is_file():
        published = read_published(results_csv)
    elif all_traces:
        published = {}
    else:
        raise InvalidInput(
            f"no published results at {results_csv}: --traces must name the alibaba-gpu-2023 folder "
            "(csv/ and fgd-expected-results/); --all runs every pod list in csv/ without them"
        )
    nodes = read_nodes(trace_dir / "csv" / "openb_node_list_gpu_node.csv")
    if all_traces:
        traces = sorted(p.stem for p in (trace_dir / "csv").glob("openb_pod_list_*.csv"))
    else:
        traces = sorted({t for t, _ in published if (trace_dir / "csv" / f"{t}.csv").exists()})
    rows = []
    for trace in traces:
        workload = Workload(nodes, read_pods(trace_dir / "csv" / f"{trace}.csv"), trace)
        report = packing_experiment(workload, policies, seeds, jobs=jobs, with_bounds=False, on_done=on_done)
        pub = published.get((trace, baseline), {})
        pub100 = [pub[s][0] for s in seeds if s in pub]
        pub130 = [pub[s][1] for s in seeds if s in pub]
        row: dict[str, object] = {
            "trace": trace,
            f"published_{baseline}_at_100": round(float(np.mean(pub100)), 2) if pub100 else None,
            f"published_{baseline}_at_130": round(float(np.mean(pub130)), 2) if pub130 else None,
        }
        for r in report.results:
            row[f"{r.policy}_at_100"] = r.alloc_at_100
            row[f"{r.policy}_at_130"] = r.alloc_at_130
        rows.append(row)
    return {"baseline": baseline, "seeds": list(seeds), "traces": rows}
