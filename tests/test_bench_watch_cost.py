"""``bench watch-cost``: the report's medians and per-watcher slope, and its refusals (the toy run
on the real control plane: ``tests/e2e/test_bench_watch_cost_e2e.py``)."""

from __future__ import annotations

import re

import pytest

from gpusched.bench.watch_cost import WatchCostReport, WatchRound, bench_watch_cost
from gpusched.core.errors import GpuschedError


def _round(w: int, ms: float) -> WatchRound:
    return WatchRound(w, 100, 50.0, ms, 1.0)


def test_the_slope_is_the_extra_cpu_per_watcher_of_the_medians() -> None:
    r = WatchCostReport(
        100, [_round(0, 7.0), _round(1, 7.5), _round(2, 8.0), _round(0, 9.0), _round(1, 7.7), _round(2, 8.2)]
    )
    assert r.medians() == {0: 8.0, 1: 7.6, 2: 8.1}
    assert r.per_watcher_ms() == 0.05  # least squares through (0, 8.0), (1, 7.6), (2, 8.1)
    assert WatchCostReport(100, [_round(0, 7.0), _round(2, 8.0)]).per_watcher_ms() == 0.5
    assert WatchCostReport(100, [_round(1, 7.0)]).per_watcher_ms() is None
    d = r.as_dict()
    assert d["apiserver_ms_per_pod_by_watchers"] == {"0": 8.0, "1": 7.6, "2": 8.1} and len(d["rounds"]) == 6


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"pods": 0}, "got 0, 2 and 8"),
        ({"rounds": 0}, "got 1500, 0 and 8"),
        ({"watchers": ()}, "got []"),
        ({"watchers": (-1,)}, "got [-1]"),
        ({"watchers": (0, 17)}, "got [0, 17]"),
    ],
)
def test_bad_settings_are_refused_by_name(kw: dict[str, object], named: str) -> None:
    with pytest.raises(GpuschedError, match=re.escape(named)):
        bench_watch_cost(**kw)  # type: ignore[arg-type]
