"""Stacks × loads × measures: the means over seeds, the largest load each stack sustains, the
ranking by work carried, and the headline against stock Kubernetes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from gpusched.core.errors import InvalidInput
from gpusched.sim.stacks.run import ALL_GPU, StackResult

SIZE_CLASSES = ("share", "1 GPU", "2 GPUs", "4 GPUs", "8 GPUs")
RESOLUTION_S = 60
"""Waits shorter than the queue's retry interval count as this in the headline's ratio: a p99 of
1 s against 10 min is "under a minute", not 600x."""


@dataclass
class StackRow:
    """One stack at one load: means over seeds (``stable``: every seed's queue was stable)."""

    stack: str
    label: str
    load: float
    seeds: int
    work_pct: float
    booked_pct: float
    completed_per_h: float
    never_ran: float
    never_ran_pct: float
    oom_risk_pod_h: float
    oom_risk_pods_pct: float
    backlog_growth: float
    stable: bool
    pending: dict[str, dict[str, float]]
    """Class -> p50_s, p99_s (means over seeds)."""


def _mean(vals: Sequence[float]) -> float:
    return float(np.mean(vals)) if vals else 0.0


def summarise(results: Sequence[StackResult], labels: dict[str, str]) -> list[StackRow]:
    rows: list[StackRow] = []
    keys = list(dict.fromkeys((r.stack, r.load) for r in results))
    for stack, load in keys:
        rs = [r for r in results if r.stack == stack and r.load == load]
        pending: dict[str, dict[str, float]] = {}
        for cls in (*SIZE_CLASSES, ALL_GPU):
            have = [r.pending[cls] for r in rs if cls in r.pending]
            if have:
                pending[cls] = {q: _mean([h[q] for h in have]) for q in ("p50_s", "p99_s")}
        rows.append(
            StackRow(
                stack=stack,
                label=labels.get(stack, stack),
                load=load,
                seeds=len(rs),
                work_pct=_mean([r.work_pct for r in rs]),
                booked_pct=_mean([r.booked_pct for r in rs]),
                completed_per_h=_mean([r.completed_per_h for r in rs]),
                never_ran=_mean([r.never_ran for r in rs]),
                never_ran_pct=_mean([r.never_ran_pct for r in rs]),
                oom_risk_pod_h=_mean([r.oom_risk_pod_h for r in rs]),
                oom_risk_pods_pct=_mean([r.oom_risk_pods_pct for r in rs]),
                backlog_growth=_mean([r.backlog_growth for r in rs]),
                stable=all(r.stable for r in rs),
                pending=pending,
            )
        )
    return rows


def sustained_load(rows: Sequence[StackRow], stack: str) -> float | None:
    """The largest load of the grid up to which every load's queue was stable in every seed
    (None: not even the smallest)."""
    best = None
    for r in sorted((r for r in rows if r.stack == stack), key=lambda r: r.load):
        if not r.stable:
            break
        best = r.load
    return best


def ranking(results: Sequence[StackResult], load: float) -> list[str]:
    """Stacks by work carried at ``load`` (mean over the seeds there), most first."""
    by: dict[str, list[float]] = {}
    for r in results:
        if r.load == load:
            by.setdefault(r.stack, []).append(r.work_pct)
    return sorted(by, key=lambda s: -_mean(by[s]))


@dataclass
class Headline:
    work_load: float
    """The load the work is compared at: the grid's highest, where each stack carries its most."""
    wait_load: float
    """The load the waits are compared at (a busy cluster, not an overloaded one)."""
    gpus: int
    stack: str
    baseline: str
    work_pct: float
    baseline_work_pct: float
    work_gain_pct: float
    p99_ratio: float
    """Baseline's p99 pending time of GPU pods over the stack's (how many times less it waits),
    each at least ``RESOLUTION_S``."""
    sentence: str


def headline(
    rows: Sequence[StackRow],
    gpus: int,
    work_load: float,
    wait_load: float,
    stack: str = "gpusched",
    baseline: str = "stock",
) -> Headline:
    def row(name: str, load: float) -> StackRow:
        for r in rows:
            if r.stack == name and r.load == load:
                return r
        raise InvalidInput(f"headline: no run of stack {name!r} at load {load}")

    a, b = row(stack, work_load), row(baseline, work_load)
    gain = 100.0 * (a.work_pct / b.work_pct - 1) if b.work_pct else float("nan")
    wa, wb = row(stack, wait_load), row(baseline, wait_load)
    pa, pb = wa.pending.get(ALL_GPU, {}).get("p99_s", 0.0), wb.pending.get(ALL_GPU, {}).get("p99_s", 0.0)
    ratio = max(pb, RESOLUTION_S) / max(pa, RESOLUTION_S)

    def wait(s: float) -> str:
        return f"under {RESOLUTION_S // 60} min" if s < RESOLUTION_S else f"{s / 60:.0f} min"

    sentence = (
        f"On the same {gpus} GPUs, {a.label} carries {gain:.0f} % more work than {b.label} at offered "
        f"load {work_load:g} ({a.work_pct:.1f} % vs {b.work_pct:.1f} % of the GPU-hours), and at load "
        f"{wait_load:g} GPU pods wait {ratio:.1f}x less at p99 ({wait(pa)} vs {wait(pb)})."
    )
    return Headline(
        work_load, wait_load, gpus, stack, baseline, a.work_pct, b.work_pct, gain, ratio, sentence
    )


@dataclass
class StacksReport:
    workload: str
    config: dict[str, object]
    results: list[StackResult]
    labels: dict[str, str]
    plots: list[str] = field(default_factory=list)

    def rows(self) -> list[StackRow]:
        return summarise(self.results, self.labels)

    @property
    def loads(self) -> list[float]:
        return sorted({r.load for r in self.results})

    def to_dict(self, headline_load: float) -> dict[str, object]:
        rows = self.rows()
        stacks = list(dict.fromkeys(r.stack for r in self.results))
        gpus = self.results[0].gpus if self.results else 0
        out: dict[str, object] = {
            "workload": self.workload,
            "protocol": "churn (bench stacks)",
            "config": self.config,
            "summary": [asdict(r) for r in rows],
            "sustained_load": {s: sustained_load(rows, s) for s in stacks},
            "ranking_by_work": {str(ld): ranking(self.results, ld) for ld in self.loads},
            "results": [r.to_dict() for r in self.results],
            "plots": list(self.plots),
        }
        names = {r.stack for r in rows}
        if {"gpusched", "stock"} <= names and headline_load in self.loads:
            out["headline"] = asdict(headline(rows, gpus, max(self.loads), headline_load))
            if "gpusched+defrag" in names:
                defrag = headline(rows, gpus, max(self.loads), headline_load, stack="gpusched+defrag")
                out["headline_defrag"] = asdict(defrag)
        return out
