"""The simulator's reports, typed: what ``gpusched simulate`` and ``gpusched bench`` print and write.

``PackingReport`` is the paper protocol's report, shared by ``simulate`` (protocol paper) and
``bench packing``: for each policy, the mean GPU allocation at 100 % and 130 % arrived over the
seeds, per seed, and seconds per run; per seed, the LP ceiling and the offline
best-fit-decreasing packing of the same arrived pods (``bound_at_100``/``bound_at_130``), so every
run shows its distance to optimal; ``arrival_bound_at_*``, the ceiling for a scheduler that places
each pod which fits when it arrives; and two online yardsticks without CPU or node limits
(``online_bf_at_*``, ``online_plan_at_*``). Per policy, ``free_at_end`` tells where the free GPU
capacity sits when the runs end, by what holds the GPU ("810" = one 810-milli share alone).

``ReplayReport`` is the replay protocol's. ``to_dict`` gives the JSON objects (plain values, in
the order the keys have always had); ``write_results`` writes ``results.json``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from gpusched.core.errors import ResourceError
from gpusched.sim.experiment import RunSummary, SeedBound, run_many
from gpusched.sim.replay import ReplayResult
from gpusched.sim.workload import Workload

TOP_HOLDERS = 8


def _r2(x: float | np.floating) -> float:
    return round(float(x), 2)


@dataclass(frozen=True)
class BoundFigures:
    """The yardsticks of one seed, or their means over the seeds (% of the cluster's GPU milli)."""

    bound_at_100: float
    bound_at_130: float
    bfd_at_100: float
    bfd_at_130: float
    arrival_bound_at_100: float
    arrival_bound_at_130: float
    online_bf_at_100: float
    online_bf_at_130: float
    online_plan_at_100: float
    online_plan_at_130: float

    @classmethod
    def of(cls, bounds: Sequence[SeedBound]) -> BoundFigures:
        """Of one seed's bound, or the mean of several."""

        def mean(attr: str) -> float:
            return _r2(np.mean([getattr(b, attr) for b in bounds]))

        return cls(
            bound_at_100=mean("lp_at_100"),
            bound_at_130=mean("lp_at_130"),
            bfd_at_100=mean("bfd_at_100"),
            bfd_at_130=mean("bfd_at_130"),
            arrival_bound_at_100=mean("arrival_at_100"),
            arrival_bound_at_130=mean("arrival_at_130"),
            online_bf_at_100=mean("online_at_100"),
            online_bf_at_130=mean("online_at_130"),
            online_plan_at_100=mean("planned_at_100"),
            online_plan_at_130=mean("planned_at_130"),
        )

    def to_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SeedResult:
    seed: int
    alloc_at_100: float
    alloc_at_130: float
    failed_pods: int
    bounds: BoundFigures | None = None

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "seed": self.seed,
            "alloc_at_100": self.alloc_at_100,
            "alloc_at_130": self.alloc_at_130,
            "failed_pods": self.failed_pods,
        }
        if self.bounds is not None:
            d.update(self.bounds.to_dict())
        return d


@dataclass(frozen=True)
class HolderShare:
    """Free GPU capacity (% of the cluster) on GPUs holding ``holder`` ("idle", "810", "470+470", "other")."""

    holder: str
    pct: float

    def to_dict(self) -> dict[str, object]:
        return {"holder": self.holder, "pct": self.pct}


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    alloc_at_100: float
    alloc_at_130: float
    alloc_at_100_min: float
    alloc_at_100_max: float
    per_seed: list[SeedResult]
    seconds_per_run: float
    free_at_end: list[HolderShare]
    gap_to_bound_at_100: float | None = None

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {
            "policy": self.policy,
            "alloc_at_100": self.alloc_at_100,
            "alloc_at_130": self.alloc_at_130,
            "alloc_at_100_min": self.alloc_at_100_min,
            "alloc_at_100_max": self.alloc_at_100_max,
            "per_seed": [s.to_dict() for s in self.per_seed],
            "seconds_per_run": self.seconds_per_run,
            "free_at_end": [h.to_dict() for h in self.free_at_end],
        }
        if self.gap_to_bound_at_100 is not None:
            d["gap_to_bound_at_100"] = self.gap_to_bound_at_100
        return d


def free_at_end(runs: Sequence[RunSummary], top: int = TOP_HOLDERS) -> list[HolderShare]:
    """Free GPU capacity at the end of the runs by what holds the GPU (``sim.stranded``), as a
    mean % of the cluster over the runs: the ``top`` largest, then the rest as "other"."""
    sums: dict[str, float] = {}
    for r in runs:
        for k, milli in r.free_by_holder.items():
            sums[k] = sums.get(k, 0.0) + 100 * milli / max(r.total_gpu_milli, 1)
    ranked = sorted(sums.items(), key=lambda kv: (-kv[1], kv[0]))
    n = max(len(runs), 1)
    out = [HolderShare(k, _r2(v / n)) for k, v in ranked[:top]]
    rest = sum(v for _, v in ranked[top:])
    if rest:
        out.append(HolderShare("other", _r2(rest / n)))
    return out


def policy_result(policy: str, runs: Sequence[RunSummary], bounds: Sequence[SeedBound]) -> PolicyResult:
    """One policy's figures over its runs (any order), against the seeds' ``bounds`` if any."""
    rs = sorted((r for r in runs if r.policy == policy), key=lambda r: r.seed)
    by_seed = {b.seed: b for b in bounds}
    per_seed = [
        SeedResult(
            r.seed,
            _r2(r.at(100)),
            _r2(r.at(130)),
            r.failed,
            BoundFigures.of([by_seed[r.seed]]) if r.seed in by_seed else None,
        )
        for r in rs
    ]
    a100 = np.array([r.at(100) for r in rs], dtype=float)
    a130 = np.array([r.at(130) for r in rs], dtype=float)
    gap = None
    if bounds:
        gap = _r2(float(np.mean([b.lp_at_100 for b in bounds])) - float(np.nanmean(a100)))
    return PolicyResult(
        policy=policy,
        alloc_at_100=_r2(np.nanmean(a100)),
        alloc_at_130=_r2(np.nanmean(a130)),
        alloc_at_100_min=_r2(np.nanmin(a100)),
        alloc_at_100_max=_r2(np.nanmax(a100)),
        per_seed=per_seed,
        seconds_per_run=round(float(np.mean([r.seconds for r in rs])), 3),
        free_at_end=free_at_end(rs),
        gap_to_bound_at_100=gap,
    )


@dataclass
class PackingReport:
    """The paper protocol's report. ``runs`` and ``bounds`` (the raw runs, for plots) are not
    part of the JSON; ``protocol`` and ``plots`` are, when set (``simulate`` sets them)."""

    workload: str
    tune: float
    seeds: list[int]
    results: list[PolicyResult]
    bound: BoundFigures | None = None
    protocol: str | None = None
    plots: list[str] | None = None
    runs: list[RunSummary] = field(default_factory=list, repr=False)
    bounds: list[SeedBound] = field(default_factory=list, repr=False)

    @classmethod
    def of(
        cls,
        workload: str,
        tune: float,
        runs: Sequence[RunSummary],
        bounds: Sequence[SeedBound],
        policies: Sequence[str],
        seeds: Sequence[int],
    ) -> PackingReport:
        return cls(
            workload=workload,
            tune=tune,
            seeds=list(seeds),
            results=[policy_result(p, runs, bounds) for p in policies],
            bound=BoundFigures.of(bounds) if bounds else None,
            runs=list(runs),
            bounds=list(bounds),
        )

    def result(self, policy: str) -> PolicyResult:
        (r,) = (r for r in self.results if r.policy == policy)
        return r

    def to_dict(self) -> dict[str, object]:
        d: dict[str, object] = {"workload": self.workload}
        if self.protocol is not None:
            d["protocol"] = self.protocol
        d["tune"] = self.tune
        d["seeds"] = list(self.seeds)
        d["results"] = [r.to_dict() for r in self.results]
        if self.bound is not None:
            d["bound"] = self.bound.to_dict()
        if self.plots is not None:
            d["plots"] = list(self.plots)
        return d


def packing_experiment(
    workload: Workload,
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    tune: float = 1.3,
    jobs: int = 1,
    with_bounds: bool = True,
    on_done: Callable[[str], None] | None = None,
) -> PackingReport:
    """The paper protocol for every policy and seed on ``workload`` (``run_many``), as a report."""
    specs = [tp.spec for tp in workload.pods]
    runs, bounds = run_many(
        workload.nodes, specs, policies, seeds, tune=tune, jobs=jobs, with_bounds=with_bounds, on_done=on_done
    )
    return PackingReport.of(workload.label, tune, runs, bounds, policies, seeds)


@dataclass
class ReplayReport:
    """The replay protocol's report: one ``ReplayResult`` per policy."""

    workload: str
    load_factor: float
    results: list[ReplayResult]
    plots: list[str] = field(default_factory=list)

    def to_dict(self, samples: bool = True) -> dict[str, object]:
        """With ``samples`` False the time series are left out (they stay in ``results.json``)."""
        rows = [r.to_dict() for r in self.results]
        if not samples:
            rows = [{k: v for k, v in row.items() if k != "samples"} for row in rows]
        return {
            "workload": self.workload,
            "protocol": "replay",
            "load_factor": self.load_factor,
            "results": rows,
            "plots": list(self.plots),
        }


def output_folder(out: Path) -> Path:
    """``out``, created if need be, for plots and ``results.json``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ResourceError(f"{out}: cannot create the output folder: {e.strerror or e}") from None
    return out


def write_results(report: PackingReport | ReplayReport, out: Path) -> Path:
    """``out/results.json``: the whole report (with the replay's time series)."""
    path = out / "results.json"
    try:
        path.write_bytes(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2))
    except OSError as e:
        raise ResourceError(f"{path}: cannot write: {e.strerror or e}") from None
    return path
