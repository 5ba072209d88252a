"""The defragmentation controller's choices that need no API: which pod gets a plan, and when
none is started (the moves, evictions and abandonment: tests/e2e/test_defrag_e2e.py)."""

from __future__ import annotations

import copy
import datetime as dt
from functools import partial
from typing import Any

import pytest
from kubernetes import client
from typer.testing import CliRunner

import builders
from builders import RS, node
from gpusched.cli.commands import app
from gpusched.core.cluster import ClusterState
from gpusched.core.defrag import RECREATING_KINDS
from gpusched.core.model import Controller
from gpusched.defrag.controller import ControllerConfig, DefragController, _Abandon
from gpusched.defrag.ledger import LedgerError
from gpusched.doctor import Books, snapshot_of_state
from gpusched.k8s.reservation import PlanRecord
from gpusched.metrics.defrag import ABANDON_REASONS, DefragMetrics

NOW = 1_800_000_000.0

# running pods that a ReplicaSet recreates: defragmentation may move them
share = partial(builders.share, controller=RS)
whole = partial(builders.whole, controller=RS)


def books(
    pending: list[Any],
    *,
    scheduler: str = "gpusched",
    age_s: float = 600.0,
    free: bool = False,
    owner: Controller = RS,
) -> Books:
    st = ClusterState([node("n1", 2), node("n2", 2)])
    if not free:
        st.assume(builders.share("a", 400, controller=owner), 0, [0])
        st.assume(builders.share("b", 400, controller=owner), 1, [1])
    snap = snapshot_of_state(st, pending)
    created = dt.datetime.fromtimestamp(NOW - age_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for p in snap.pods:
        p["metadata"]["creationTimestamp"] = created
        if not p["spec"].get("nodeName"):
            p["spec"]["schedulerName"] = scheduler
    return Books.of(snap)


class MemoryLedger:
    """The Lease's record of moves and plans (``defrag/ledger.py``) in memory: one instance shared
    by two controllers stands for one Lease across a restart."""

    def __init__(self, moves: list[tuple[float, str]] | None = None, window_s: float = 3600.0) -> None:
        self.recorded = list(moves or [])
        self.window_s = window_s
        self.record: Any = None
        self.unreadable = False

    def moves(self, now: float) -> list[tuple[float, str]]:
        if self.unreadable:
            raise LedgerError("Lease ns/gpusched-defrag: cannot be read: 503")
        return sorted(m for m in self.recorded if m[0] >= now - self.window_s)

    def add_move(self, now: float, key: str) -> None:
        self.recorded.append((now, key))

    def drop_move(self, now: float, key: str) -> None:
        self.recorded.remove((now, key))

    def set_plan(self, record: Any) -> None:
        self.record = record

    def plan(self) -> Any:
        return self.record

    def clear_plan(self, plan_id: str) -> None:
        self.record = None


def controller(b: Books, ledger: MemoryLedger | None = None, **kw: Any) -> DefragController:
    cfg = ControllerConfig(wait_s=300.0, **kw)
    return DefragController(
        client.ApiClient(), lambda: b, cfg, wall=lambda: NOW, ledger=ledger or MemoryLedger()
    )


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


def test_a_mig_pod_that_lands_without_moving_a_slice_is_counted_as_fits_now() -> None:
    from migbuilders import BALANCED, mig_node, mig_pod

    st = ClusterState([mig_node("m", BALANCED)])  # a free 1g.10gb on the balanced GPU
    snap = snapshot_of_state(st, [mig_pod("w", "1g.10gb")])
    created = dt.datetime.fromtimestamp(NOW - 600.0, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    for p in snap.pods:
        p["metadata"]["creationTimestamp"] = created
        p["spec"]["schedulerName"] = "gpusched"
    b = Books.of(snap)
    ctl = controller(b)
    a = ctl.run_once()
    assert a is not None and a.result == "fits-now" and a.moves == ()
    get = ctl.metrics.registry.get_sample_value
    assert get("gpusched_defrag_no_plan_total", {"reason": "fits-now"}) == 1
    assert not get("gpusched_defrag_no_plan_total", {"reason": "infeasible"})


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


def test_defrag_run_recreating_adds_custom_controllers_whose_pods_then_move(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``defrag run --recreating KIND.GROUP`` (repeatable): the pods of a custom controller that
    recreates them (a TFJob) stay put by default, and move once its kind is named."""
    started: list[ControllerConfig] = []
    monkeypatch.setattr("gpusched.defrag.serve.serve_defrag", lambda config, **_: started.append(config))
    extra = ["--recreating", "TFJob.kubeflow.org", "--recreating", "PyTorchJob.kubeflow.org"]
    res = CliRunner().invoke(app, ["defrag", "run", *extra])
    assert res.exit_code == 0, res.output
    (cfg,) = started
    assert cfg.recreating == RECREATING_KINDS | {"TFJob.kubeflow.org", "PyTorchJob.kubeflow.org"}
    b = books([whole("p", 2)], owner=Controller("TFJob", "train", "kubeflow.org"))
    group = [b.pending["default/p"]]
    assert not controller(b)._plan(b, group).feasible  # by default a TFJob's pods are not moved
    plan = controller(b, recreating=cfg.recreating)._plan(b, group)
    assert plan.feasible and plan.move_count == 1


@pytest.mark.parametrize("kind", ["tfjobs.kubeflow.org", "kubeflow.org/TFJob", "TFJob.", ""])
def test_defrag_run_refuses_a_recreating_kind_that_is_no_kind(
    monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    monkeypatch.setattr("gpusched.defrag.serve.serve_defrag", lambda config, **_: pytest.fail("started"))
    res = CliRunner().invoke(app, ["defrag", "run", "--recreating", kind])
    assert res.exit_code == 2
    assert f"recreating kind {kind!r} is not KIND.GROUP" in res.output


# ------------------------------------------------- the move budget lives on the Lease (F2b)
def test_a_restarted_controller_counts_the_moves_its_predecessor_recorded() -> None:
    """Issue 28 F2b: one move per window; the move made before a restart is read back from the
    Lease, so the new process plans no second move until the window has passed."""
    b = books([whole("p", 2)])
    group = [b.pending["default/p"]]
    fresh = controller(b, max_moves_per_window=1)._plan(b, group)
    assert fresh.feasible and fresh.move_count == 1  # one move would do it
    lease = MemoryLedger([(NOW - 60, "default/x")])  # what the killed predecessor recorded
    after = controller(b, lease, max_moves_per_window=1)
    plan = after._plan(b, group)
    assert not plan.feasible and plan.moves == ()
    a = after.run_once()
    assert a is not None and a.result == "infeasible"
    assert after.metrics.registry.get_sample_value("gpusched_defrag_moves_total") == 0
    passed = MemoryLedger([(NOW - 3601, "default/x")])  # out of the window: counts no more
    assert controller(b, passed, max_moves_per_window=1)._plan(b, group).feasible


def test_the_per_pod_cap_is_read_back_too() -> None:
    b = books([whole("p", 2)])
    group = [b.pending["default/p"]]
    first = controller(b)._plan(b, group)
    (mv,) = first.moves
    again = controller(b, MemoryLedger([(NOW - 60, mv.pod)]))._plan(b, group)
    assert again.feasible and [m.pod for m in again.moves] != [mv.pod]


def test_an_unreadable_record_plans_no_move() -> None:
    lease = MemoryLedger()
    lease.unreadable = True
    b = books([whole("p", 2)])
    ctl = controller(b, lease)
    a = ctl.run_once()
    assert a is not None and a.result == "infeasible" and "cannot be read" in a.reason
    assert (
        ctl.metrics.registry.get_sample_value(
            "gpusched_defrag_no_plan_total", {"reason": "record-unreadable"}
        )
        == 1
    )


# ----------------------------------------------- the owner is checked again before eviction (F2)
def test_a_pod_orphaned_since_the_plan_was_made_is_not_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    b = books([whole("p", 2)])
    ctl = controller(b)
    planned = b.pod_objs["default/a"]
    assert planned["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"
    orphan = copy.deepcopy(planned)
    orphan["metadata"]["ownerReferences"] = []  # kubectl delete rs --cascade=orphan
    monkeypatch.setattr(ctl, "_read_pod", lambda ns, name: orphan)
    with pytest.raises(_Abandon) as e:
        ctl._still_recreated(planned, "default/a")
    assert e.value.reason == "no-controller" and "no controller owns it" in e.value.detail
    ds = copy.deepcopy(planned)
    ds["metadata"]["ownerReferences"][0].update(kind="DaemonSet")
    monkeypatch.setattr(ctl, "_read_pod", lambda ns, name: ds)
    with pytest.raises(_Abandon, match="no-controller"):
        ctl._still_recreated(planned, "default/a")
    replaced = copy.deepcopy(planned)
    replaced["metadata"]["uid"] = "another"
    monkeypatch.setattr(ctl, "_read_pod", lambda ns, name: replaced)
    with pytest.raises(_Abandon, match="stale"):
        ctl._still_recreated(planned, "default/a")
    monkeypatch.setattr(ctl, "_read_pod", lambda ns, name: copy.deepcopy(planned))
    assert ctl._still_recreated(planned, "default/a") == planned


def test_a_plan_left_by_another_controller_is_released_when_this_one_starts_leading(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    b = books([whole("p", 2)])
    lease = MemoryLedger()
    lease.record = PlanRecord("old", ("default/p",), "defrag-killed", NOW + 100)
    ctl = controller(b, lease, identity="defrag-new")
    released: list[tuple[tuple[str, ...], str]] = []
    monkeypatch.setattr(ctl, "_release", lambda keys, why: released.append((tuple(keys), why)))
    monkeypatch.setattr(ctl.budgets, "wait_synced", lambda timeout: True)
    ctl.start_leading()
    assert lease.record is None and released == [
        (("default/p",), "the controller that made plan old stopped")
    ]
    mine = PlanRecord("mine", ("default/p",), "defrag-new", NOW + 100)
    lease.record = mine
    ctl.start_leading()
    assert lease.record == mine and len(released) == 1  # its own plan: left alone
