"""MIG in the metrics (issue 31 item 5): per node and profile the instances held, free and on a GPU being
re-cut (their sum is the instances present), and the MIG slices pending pods ask for, per profile."""

from __future__ import annotations

from dataclasses import replace

from gpusched.core.cluster import ClusterState
from gpusched.core.mig.books import NodeMig
from gpusched.core.model import PodSpec
from gpusched.doctor import Books
from gpusched.doctor.demo import mig_demo_snapshot
from gpusched.metrics.cluster import MigCount, cluster_stats
from gpusched.metrics.scheduling import SchedulerMetrics
from test_metrics_cluster import _samples


def _mig_pod(name: str, *profiles: str) -> PodSpec:
    ext: dict[str, int] = {}
    for p in profiles:
        ext["nvidia.com/mig-" + p] = ext.get("nvidia.com/mig-" + p, 0) + 1
    return PodSpec(name, cpu_milli=100, mig=tuple(sorted(profiles)), extended=ext)


def _state(reshaping: frozenset[int] = frozenset()) -> ClusterState:
    """The demo MIG node: GPU 0 all-balanced with its 3g held, GPU 1 4g + 3g both held."""
    books = Books.of(mig_demo_snapshot()).state
    if not reshaping:
        return books
    nd = books.nodes[0]
    assert nd.mig is not None
    out = ClusterState([replace(nd, mig=NodeMig(nd.mig.gpus, nd.mig.indices, reshaping))])
    for a in books.allocations.values():
        out.assume(a.pod, a.node, a.gpus, mig=a.mig)
    return out


def test_instances_per_node_and_profile_by_state_and_pending_slices() -> None:
    stats = cluster_stats(_state(), None, [_mig_pod("a", "4g.40gb"), _mig_pod("b", "1g.10gb", "1g.10gb")])
    row = {c.profile: (c.held, c.free, c.reshaping) for c in stats.mig}
    assert row == {"1g.10gb": (0, 2, 0), "2g.20gb": (0, 1, 0), "3g.40gb": (2, 0, 0), "4g.40gb": (1, 0, 0)}
    assert {c.node for c in stats.mig} == {"a100-mig-0"} and sum(c.present for c in stats.mig) == 6
    assert dict(stats.mig_pending) == {"1g.10gb": 2, "4g.40gb": 1}
    m = SchedulerMetrics(profile="gpusched")
    m.set_cluster(stats)
    got = _samples(m)
    lab = (("model", "a100-80gb"), ("node", "a100-mig-0"), ("pool", "default"))
    assert got[("gpusched_mig_instances", (*lab, ("profile", "3g.40gb"), ("state", "held")))] == 2
    assert got[("gpusched_mig_instances", (*lab, ("profile", "1g.10gb"), ("state", "free")))] == 2
    assert got[("gpusched_mig_instances", (*lab, ("profile", "1g.10gb"), ("state", "reshaping")))] == 0
    assert got[("gpusched_mig_pending_slices", (("profile", "1g.10gb"),))] == 2
    assert sum(v for (n, _l), v in got.items() if n == "gpusched_mig_instances") == 6


def test_free_instances_of_a_gpu_being_re_cut_count_as_reshaping() -> None:
    stats = cluster_stats(_state(frozenset({0})), None)
    row = {c.profile: c for c in stats.mig}
    assert row["1g.10gb"] == MigCount("a100-mig-0", "default", "a100-80gb", "1g.10gb", 0, 0, 2)
    assert (row["3g.40gb"].held, row["3g.40gb"].reshaping) == (2, 0)  # held stays held
    assert stats.mig_pending == {}


def test_a_cluster_without_mig_has_no_mig_series() -> None:
    m = SchedulerMetrics(profile="gpusched")
    m.set_cluster(cluster_stats(ClusterState([]), None))
    assert not any(n.startswith("gpusched_mig") for n, _l in _samples(m))
