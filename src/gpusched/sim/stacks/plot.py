"""The plot a person would rather look at than the table: work carried against offered load,
one line per stack (the mean over seeds, bars from min to max)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from gpusched.sim.stacks.report import StacksReport


def work_vs_load_plot(report: StacksReport, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    loads = report.loads
    top = 100 * max(loads) * 1.05
    ax.plot([0, top], [0, top], color="0.5", lw=1, ls=":", label="offered")
    for stack in dict.fromkeys(r.stack for r in report.results):
        vals = [[r.work_pct for r in report.results if r.stack == stack and r.load == ld] for ld in loads]
        mean = np.array([np.mean(v) for v in vals])
        lo = np.array([np.min(v) for v in vals])
        hi = np.array([np.max(v) for v in vals])
        style = "-" if stack.startswith("gpusched") else "--" if stack.startswith("timeslice") else "-."
        ax.errorbar(
            [100 * ld for ld in loads],
            mean,
            yerr=[mean - lo, hi - mean],
            ls=style,
            marker="o",
            capsize=3,
            lw=2.2 if stack.startswith("gpusched") else 1.3,
            label=report.labels.get(stack, stack),
        )
    ax.set_xlabel("offered load (% of the cluster's GPUs)")
    ax.set_ylabel("work carried (% of GPU-hours)")
    ax.set_xlim(100 * min(loads) - 5, 100 * max(loads) + 5)
    ax.set_ylim(40, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    seeds = len({r.seed for r in report.results})
    ax.set_title(
        f"Work carried vs offered load: {report.results[0].gpus} GPUs, {seeds} seeds (bars: min-max)"
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
