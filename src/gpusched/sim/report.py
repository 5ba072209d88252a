"""Readable summaries of simulator and benchmark results (rich tables)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.table import Table

from gpusched.sim.replay import ReplayResult


def packing_table(report: Mapping[str, object], title: str) -> Table:
    t = Table(title=title)
    for col in ("policy", "alloc @100%", "alloc @130%", "min..max @100%", "gap to LP @100%", "s/run"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    results = report["results"]
    assert isinstance(results, list)
    for r in results:
        t.add_row(
            str(r["policy"]),
            f"{r['alloc_at_100']:.2f}",
            f"{r['alloc_at_130']:.2f}",
            f"{r['alloc_at_100_min']:.2f}..{r['alloc_at_100_max']:.2f}",
            f"{r['gap_to_bound_at_100']:.2f}" if "gap_to_bound_at_100" in r else "-",
            f"{r['seconds_per_run']:.2f}",
        )
    bound = report.get("bound")
    if isinstance(bound, dict):
        t.caption = (
            f"ceiling for any scheduler (LP): {bound['bound_at_100']:.2f} @100%, "
            f"{bound['bound_at_130']:.2f} @130%; "
            f"offline best-fit-decreasing: {bound['bfd_at_100']:.2f} @100%, {bound['bfd_at_130']:.2f} @130%; "
            f"online best fit without CPU/node limits: {bound['online_bf_at_100']:.2f} @100%, "
            f"{bound['online_bf_at_130']:.2f} @130%"
        )
    return t


def replay_table(results: Sequence[ReplayResult], title: str) -> Table:
    t = Table(title=title)
    for col in (
        "policy",
        "scheduled",
        "expired",
        "timed out",
        "pending p50 s",
        "p90 s",
        "p99 s",
        "max s",
        "alloc % while arriving",
        "peak alloc %",
        "mean alloc % (whole horizon)",
    ):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        t.add_row(
            r.policy,
            str(r.scheduled),
            str(r.expired),
            str(r.timed_out),
            f"{r.pending_p50_s:.0f}",
            f"{r.pending_p90_s:.0f}",
            f"{r.pending_p99_s:.0f}",
            f"{r.pending_max_s:.0f}",
            f"{r.busy_alloc_pct:.2f}",
            f"{r.peak_alloc_pct:.2f}",
            f"{r.mean_alloc_pct:.2f}",
        )
    return t


def latency_table(rows: Sequence[Mapping[str, object]]) -> Table:
    t = Table(title="schedule_one latency")
    cols = ("nodes", "gpus", "policy", "decisions", "p50_ms", "p90_ms", "p99_ms", "max_ms", "pods_per_s")
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*(str(r[c]) for c in cols))
    return t
