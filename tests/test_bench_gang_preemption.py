"""``bench gang-preemption``: the fewest victims on a full cluster, and bad sizes named."""

from __future__ import annotations

import pytest

from gpusched.bench.gang_preemption import bench_gang_preemption
from gpusched.core.errors import GpuschedError


def test_a_gang_on_a_full_cluster_evicts_exactly_its_nodes() -> None:
    r = bench_gang_preemption(nodes=12, size=3, repeats=1)
    assert r.victims == r.minimum_victims == 24 and r.placed == 3


def test_bad_sizes_are_named() -> None:
    with pytest.raises(GpuschedError, match="size at most nodes"):
        bench_gang_preemption(nodes=2, size=3)
