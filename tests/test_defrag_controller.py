"""The defragmentation controller's choices that need no API: which pod gets a plan, and when
none is started (the moves, evictions and abandonment: tests/e2e/test_defrag_e2e.py)."""

from __future__ import annotations

import datetime as dt
from functools import partial
from typing import Any

from kubernetes import client

import builders
from builders import RS, node
from gpusched.core.cluster import ClusterState
from gpusched.defrag.controller import ControllerConfig, DefragController
from gpusched.doctor import Books, snapshot_of_state
from gpusched.metrics.defrag import ABANDON_REASONS, DefragMetrics

NOW = 1_800_000_000.0

# running pods that a ReplicaSet recreates: defragmentation may move them
share = partial(builders.share, controller=RS)
whole = partial(builders.whole, controller=RS)


def books(
    pending: list[Any], *, scheduler: str = "gpusched", age_s: float = 600.0, free: bool = False
) -> Books:
    st = ClusterState([node("n1", 2), node("n2", 2)])
    if not free:
        st.assume(share("a", 400), 0, [0])
        st.assume(share("b", 400), 1, [1])
    snap = snapshot_of_state(st, pending)
    created = dt.datetime.fromtimestamp(NOW - age_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for p in snap.pods:
        p["metadata"]["creationTimestamp"] = created
        if not p["spec"].get("nodeName"):
            p["spec"]["schedulerName"] = scheduler
    return Books.of(snap)


def controller(b: Books, **kw: Any) -> DefragController:
    cfg = ControllerConfig(wait_s=300.0, **kw)
    return DefragController(client.ApiClient(), lambda: b, cfg, wall=lambda: NOW)


def test_only_pods_of_its_scheduler_that_waited_long_enough_are_planned_for() -> None:
    assert controller(books([whole("p", 2)], age_s=10.0))._target(books([whole("p", 2)], age_s=10.0)) is None
    other = books([whole("p", 2)], scheduler="default-scheduler")
    assert controller(other)._target(other) is None
    b = books([whole("p", 2)])
    group = controller(b)._target(b)
    assert group is not None and [p.key for p in group] == ["default/p"]


def test_a_pod_that_fits_now_gets_no_plan_and_is_not_tried_again_at_once() -> None:
    b = books([whole("p", 2)], free=True)
    ctl = controller(b)
    a = ctl.run_once()
    assert a is not None and a.result == "fits-now" and a.moves == ()
    assert ctl.metrics.registry.get_sample_value("gpusched_defrag_no_plan_total", {"reason": "fits-now"}) == 1
    assert ctl.run_once() is None  # tried within wait_s: left to the scheduler


def test_no_plan_within_the_rules_is_counted_and_nothing_moves() -> None:
    b = books([whole("p", 4)])  # 4 GPUs on 2-GPU nodes: no move helps
    ctl = controller(b)
    a = ctl.run_once()
    assert a is not None and a.result == "infeasible"
    assert ctl.metrics.registry.get_sample_value("gpusched_defrag_moves_total") == 0


def test_every_abandon_reason_is_exported_from_the_start() -> None:
    m = DefragMetrics()
    text = m.exposition().decode()
    for reason in ABANDON_REASONS:
        assert f'gpusched_defrag_plans_abandoned_total{{reason="{reason}"}} 0.0' in text
    m.abandon("stale")
    assert m.registry.get_sample_value("gpusched_defrag_plans_total", {"result": "abandoned"}) == 1
