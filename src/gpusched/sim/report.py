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
            f"ceiling when each pod that fits is placed on arrival: "
            f"{bound['arrival_bound_at_100']:.2f} @100%, {bound['arrival_bound_at_130']:.2f} @130%; "
            f"offline best-fit-decreasing: {bound['bfd_at_100']:.2f} @100%, {bound['bfd_at_130']:.2f} @130%; "
            f"online without CPU/node limits, best fit: {bound['online_bf_at_100']:.2f} @100%, "
            f"{bound['online_bf_at_130']:.2f} @130%; pairing plan: {bound['online_plan_at_100']:.2f} @100%, "
            f"{bound['online_plan_at_130']:.2f} @130%"
        )
    return t


def free_table(report: Mapping[str, object], largest: int = 4) -> Table:
    """Per policy: the free GPU capacity at the end of the runs and the GPU contents that hold
    most of it ("810 2.85" = GPUs holding one 810-milli share alone leave 2.85 % of the cluster)."""
    t = Table(title="Free GPU capacity at the end of the run, % of the cluster, by what holds the GPU")
    t.add_column("policy")
    t.add_column("free", justify="right")
    t.add_column("largest: GPU holding → free %")
    results = report["results"]
    assert isinstance(results, list)
    for r in results:
        rows = r.get("free_at_end") or []
        total = sum(float(x["pct"]) for x in rows)
        top = [x for x in rows if x["holder"] != "other"][:largest]
        largest_text = " · ".join(f"{x['holder']} → {x['pct']:.2f}" for x in top)
        t.add_row(str(r["policy"]), f"{total:.2f}", largest_text)
    return t


def replay_table(results: Sequence[ReplayResult], title: str) -> Table:
    """One row per policy. Allocation is time-weighted over the arrival window ("arriving")
    and at its peak; the whole-horizon mean (long-lived pods stretch it) is in the JSON."""
    t = Table(title=title)
    cols: list[str] = ["policy", "scheduled", "expired", "timed out", "pending s p50/p90/p99/max"]
    cols += ["alloc % arriving", "peak %"]
    for col in cols:
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in results:
        waits = (r.pending_p50_s, r.pending_p90_s, r.pending_p99_s, r.pending_max_s)
        pend = "/".join(f"{v:.0f}" for v in waits)
        t.add_row(
            r.policy,
            str(r.scheduled),
            str(r.expired),
            str(r.timed_out),
            pend,
            f"{r.busy_alloc_pct:.2f}",
            f"{r.peak_alloc_pct:.2f}",
        )
    return t


def replay_class_table(results: Sequence[ReplayResult]) -> Table:
    """Pending time by request size: whether big pods wait while small ones flow."""
    t = Table(title="Pending time by request size (scheduled pods; s)")
    for col in ("policy", "request", "pods", "scheduled", "not scheduled", "p50", "p99", "max"):
        t.add_column(col, justify="left" if col in ("policy", "request") else "right")
    for r in results:
        for cls, row in r.by_class.items():
            lost = int(row["expired"] + row["timed_out"] + row["never_scheduled"])
            t.add_row(
                r.policy,
                cls,
                str(int(row["pods"])),
                str(int(row["scheduled"])),
                str(lost),
                f"{row['pending_p50_s']:.0f}",
                f"{row['pending_p99_s']:.0f}",
                f"{row['pending_max_s']:.0f}",
            )
        t.add_section()
    return t


def latency_table(rows: Sequence[Mapping[str, object]]) -> Table:
    t = Table(title="schedule_one latency")
    cols = ("nodes", "gpus", "policy", "decisions", "p50_ms", "p90_ms", "p99_ms", "max_ms", "pods_per_s")
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows:
        t.add_row(*(str(r[c]) for c in cols))
    return t


def preemption_table(rows: Sequence[Mapping[str, object]]) -> Table:
    t = Table(title="scheduling cycles that preempt")
    cols = ("nodes", "alloc_pct", "preempting", "victims_per_preemption", "p50_ms", "p90_ms", "max_ms")
    heads = ("nodes", "GPU alloc %", "preempting", "victims each", "p50 ms", "p90 ms", "max ms")
    for h in heads:
        t.add_column(h, justify="right")
    for r in rows:
        t.add_row(*(str(r[c]) for c in cols))
    return t
