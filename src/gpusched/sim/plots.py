"""PNG plots of simulator results (matplotlib, headless)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from gpusched.sim.experiment import RunSummary, SeedBound
from gpusched.sim.replay import ReplayResult
from gpusched.sim.report import PackingReport, PolicyResult


def _by_policy(runs: Sequence[RunSummary]) -> dict[str, list[RunSummary]]:
    out: dict[str, list[RunSummary]] = {}
    for r in runs:
        out.setdefault(r.policy, []).append(r)
    return out


def _curve_plot(
    runs: Sequence[RunSummary],
    attr: str,
    ylabel: str,
    title: str,
    path: Path,
    bounds: Sequence[SeedBound] = (),
) -> Path:
    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    x = np.arange(len(runs[0].alloc))
    for policy, rs in _by_policy(runs).items():
        ys = np.array([getattr(r, attr) for r in rs], dtype=float)
        mean = np.nanmean(ys, axis=0)
        ax.plot(x, mean, label=f"{policy} ({mean[100]:.2f} at 100%)" if attr == "alloc" else policy)
        if len(rs) > 1:
            ax.fill_between(x, np.nanmin(ys, axis=0), np.nanmax(ys, axis=0), alpha=0.15)
    if bounds and attr == "alloc":
        lp = float(np.mean([b.lp_at_100 for b in bounds]))
        ax.axhline(lp, color="grey", ls="--", lw=1, label=f"LP ceiling at 100% arrived ({lp:.2f})")
    ax.set_xlabel("arrived GPU demand (% of cluster GPUs)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    if attr == "alloc":
        axin = ax.inset_axes((0.55, 0.08, 0.4, 0.35))
        for _policy, rs in _by_policy(runs).items():
            ys = np.nanmean(np.array([r.alloc for r in rs], dtype=float), axis=0)
            axin.plot(x[80:], ys[80:])
        axin.set_title("80-130 %", fontsize=7)
        axin.tick_params(labelsize=6)
        axin.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def allocation_plot(runs: Sequence[RunSummary], path: Path, bounds: Sequence[SeedBound] = ()) -> Path:
    return _curve_plot(
        runs, "alloc", "GPU allocation (%)", "GPU allocation vs arrived workload", path, bounds
    )


def fragmentation_plot(runs: Sequence[RunSummary], path: Path) -> Path:
    return _curve_plot(runs, "frag_ratio", "fragmentation / idle GPU (%)", "Fragmentation ratio", path)


def model_plot(runs: Sequence[RunSummary], path: Path) -> Path:
    """Per-GPU-model occupancy at the end of the runs, one bar group per model."""
    groups = _by_policy(runs)
    models = sorted({m for r in runs for m in r.model_used})
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    width = 0.8 / max(len(groups), 1)
    for i, (policy, rs) in enumerate(groups.items()):
        occ = [np.mean([100 * r.model_used[m][0] / max(r.model_used[m][1], 1) for r in rs]) for m in models]
        ax.bar(np.arange(len(models)) + i * width, occ, width, label=policy)
    ax.set_xticks(np.arange(len(models)) + width * (len(groups) - 1) / 2, models)
    ax.set_ylabel("GPU occupancy at end of run (%)")
    ax.set_ylim(0, 105)
    ax.set_title("Occupancy by GPU model")
    ax.legend(fontsize=8, loc="lower right", framealpha=0.9)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def free_plot(results: Sequence[PolicyResult], path: Path) -> Path:
    """One stacked bar per policy: the free GPU capacity at the end of the run (% of the cluster),
    split by what holds the GPU (``free_at_end`` of a packing report), "other" last in grey."""
    holders: list[str] = []
    for r in results:
        for x in r.free_at_end:
            if x.holder not in holders and x.holder != "other":
                holders.append(x.holder)
    holders.append("other")
    cmap = plt.get_cmap("tab20")
    colours: dict[str, object] = {h: cmap(i % 20) for i, h in enumerate(holders[:-1])}
    colours["other"] = (0.7, 0.7, 0.7)
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.55 * len(results)), dpi=110)
    names = [r.policy for r in results]
    for h in holders:
        left = []
        widths = []
        for r in results:
            pct = {x.holder: x.pct for x in r.free_at_end}
            done = sum(pct.get(k, 0.0) for k in holders[: holders.index(h)])
            left.append(done)
            widths.append(pct.get(h, 0.0))
        if any(widths):
            ax.barh(names, widths, left=left, color=colours.get(h, (0.5, 0.5, 0.5)), label=h)
    ax.invert_yaxis()
    ax.set_xlabel("free GPU capacity at the end of the run (% of cluster)")
    ax.set_title("Where the free GPU capacity sits, by what holds the GPU (470+470: two 470-milli shares)")
    ax.legend(fontsize=7, ncol=min(len(holders), 6), loc="upper center", bbox_to_anchor=(0.5, -0.35))
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path


def replay_plot(results: Sequence[ReplayResult], path: Path) -> Path:
    """GPU allocation and pending pods over time, one line per policy."""
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(9, 6), dpi=110, sharex=True)
    for r in results:
        if not r.samples:
            continue
        t = np.array([s[0] for s in r.samples]) / 86400
        a1.plot(t, [s[1] for s in r.samples], label=r.policy, lw=0.8)
        a2.plot(t, [s[2] for s in r.samples], label=r.policy, lw=0.8)
    a1.set_ylabel("GPU allocation (%)")
    a2.set_ylabel("pending pods")
    a2.set_xlabel("time (days)")
    a1.set_title("Replay: utilisation and queue over time")
    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def paper_plots(report: PackingReport, out: Path) -> list[str]:
    """The paper protocol's plots in ``out``: allocation (with the LP ceiling), fragmentation,
    occupancy by GPU model, where the free capacity sits. Returns their paths."""
    return [
        str(allocation_plot(report.runs, out / "allocation.png", report.bounds)),
        str(fragmentation_plot(report.runs, out / "fragmentation.png")),
        str(model_plot(report.runs, out / "gpu_models.png")),
        str(free_plot(report.results, out / "free_capacity.png")),
    ]


def replay_plots(results: Sequence[ReplayResult], out: Path) -> list[str]:
    """The replay protocol's plot in ``out``; returns its path."""
    return [str(replay_plot(results, out / "replay.png"))]
