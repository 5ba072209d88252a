"""Output of ``gpusched bench mig``: a rich table, or one JSON object."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich import box
from rich.table import Table

from gpusched.cli.render import emit_json, out_console


def mig_bench(
    report: Mapping[str, object],
    rows: Sequence[Mapping[str, object]],
    churn: Sequence[Mapping[str, object]],
    json_out: bool,
) -> None:
    if json_out:
        emit_json({**report, "results": list(rows), "churn": list(churn)})
        return
    t = Table(title=str(report["title"]), box=box.SIMPLE_HEAVY)
    t.add_column("workload", no_wrap=True)
    t.add_column("policy", no_wrap=True)
    for col in ("accepted slices %", "per seed", "accepted requests %", "GPUs used at 50 % arrived",
                "GPUs used at end", "requests", "s/run"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        per_seed = " ".join(f"{v:.2f}" for v in r["accepted_slices_pct_per_seed"])  # type: ignore[attr-defined]
        t.add_row(
            str(r["workload"]), str(r["policy"]), f"{r['accepted_slices_pct']:.2f}", per_seed,
            f"{r['accepted_requests_pct']:.2f}", f"{r['gpus_used_at_half_pct']:.2f} %",
            f"{r['gpus_used_pct']:.2f} %", str(r["requests"]), f"{r['seconds']:.2f}",
        )  # fmt: skip
    t.caption = "\n".join(str(n) for n in report["notes"])  # type: ignore[attr-defined]
    out_console.print(t)
    if churn:
        out_console.print(churn_table(churn))


def churn_table(rows: Sequence[Mapping[str, object]]) -> Table:
    t = Table(title="MIG placement under churn (pending time)", box=box.SIMPLE_HEAVY)
    t.add_column("workload", no_wrap=True)
    t.add_column("policy", no_wrap=True)
    for col in ("load", "placed on arrival %", "pending mean s", "pending p99 s", "p99 per seed",
                "still pending", "slices used %", "GPUs used %"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        per_seed = " ".join(f"{v:g}" for v in r["pending_p99_s_per_seed"])  # type: ignore[attr-defined]
        t.add_row(
            str(r["workload"]), str(r["policy"]), f"{r['load']:g}", f"{r['placed_on_arrival_pct']:.2f}",
            f"{r['pending_mean_s']:.1f}", f"{r['pending_p99_s']:.1f}", per_seed, str(r["still_pending"]),
            f"{r['used_slices_pct']:.2f}", f"{r['gpus_used_pct']:.2f}",
        )  # fmt: skip
    return t
