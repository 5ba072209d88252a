"""PNG plots of the churn protocol (matplotlib, headless): the gain against the move budget, and
allocation over time with and without defragmentation."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from gpusched.sim.churn import ChurnReport


def budget_curve_plot(report: ChurnReport, path: Path) -> Path:
    """Per defragmentation mode, against the move budget (% of pods): the mean allocation gain in
    points (left) and the p99 pending time of 4- and 8-GPU pods as a fraction of the run without
    defragmentation (right); the mean over seeds, the bars spanning min to max."""
    gains = report.gains()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), dpi=110)
    for mode in sorted({str(g["mode"]) for g in gains}):
        rows = [g for g in gains if g["mode"] == mode]
        budgets = sorted({float(str(g["move_budget"])) for g in rows})
        x = [100 * b for b in budgets]

        def series(
            key: str, rows: list[dict[str, object]] = rows, budgets: list[float] = budgets
        ) -> np.ndarray:
            out = np.full((len(budgets), 3), np.nan)
            for k, b in enumerate(budgets):
                vals = [float(str(g[key])) for g in rows if g["move_budget"] == b and g.get(key) is not None]
                if vals:
                    out[k] = (np.mean(vals), np.min(vals), np.max(vals))
            return out

        a = series("alloc_gain_pts")
        ax1.errorbar(
            x, a[:, 0], yerr=[a[:, 0] - a[:, 1], a[:, 2] - a[:, 0]], marker="o", capsize=3, label=mode
        )
        for key, style in (("p99_4gpu_ratio", "--"), ("p99_8gpu_ratio", "-")):
            s = series(key)
            ax2.errorbar(
                x,
                s[:, 0],
                yerr=[s[:, 0] - s[:, 1], s[:, 2] - s[:, 0]],
                marker="o",
                ls=style,
                capsize=3,
                label=f"{mode}, {key.split('_')[1].replace('gpu', '-GPU')} pods",
            )
    ax1.axhline(0, color="grey", lw=1)
    ax1.set_xlabel("move budget (% of pods)")
    ax1.set_ylabel("mean allocation gain (points)")
    ax1.set_title("Allocation gain vs move budget")
    ax2.axhline(1, color="grey", lw=1)
    ax2.axhline(0.5, color="grey", lw=1, ls=":")
    ax2.set_xlabel("move budget (% of pods)")
    ax2.set_ylabel("p99 pending, with / without defrag")
    ax2.set_title("Big pods' p99 pending time vs move budget")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(report.workload, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def allocation_over_time_plot(report: ChurnReport, seed: int, path: Path) -> Path:
    """Allocation (%) over time for one seed, one line per run, the warm-up shaded."""
    fig, ax = plt.subplots(figsize=(9, 4.5), dpi=110)
    warmup = report.config.get("warmup_s")
    for r in report.results:
        if r.seed != seed or not r.samples:
            continue
        t = np.array([s[0] for s in r.samples]) / 3600
        ax.plot(t, [s[1] for s in r.samples], lw=1, label=f"{r.label} (mean {r.mean_alloc_pct:.2f} %)")
    if isinstance(warmup, int) and warmup:
        ax.axvspan(0, warmup / 3600, color="grey", alpha=0.15, label="warm-up")
    ax.set_xlabel("time (h)")
    ax.set_ylabel("GPU allocation (%)")
    ax.set_title(f"Allocation over time, seed {seed}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
