"""Statement (commit/discard) and all-or-nothing group scheduling; the Bind extension point."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.framework import Profile, run_bind
from gpusched.core.model import GPU_MILLI, NodeSpec, PodSpec
from gpusched.core.statement import OpKind, Statement, StatementClosed, schedule_all
from gpusched.core.status import Code, Status
from test_core_properties import (
    Scenario,
    arrays,
    assert_arrays_equal,
    assert_invariants,
    bf_fits,
    play,
    pods,
    profile_for,
    scenarios,
)

BESTFIT = profile_for("bestfit", [PodSpec("w", 100, 100, 1, GPU_MILLI)])
PROPS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def books(snap: ClusterState) -> tuple[object, ...]:
    """Everything a statement may touch, except the generation counters (which only move forward)."""
    return (
        {k: (a.node, a.gpus, a.pod) for k, a in snap.allocations.items()},
        [frozenset(s) for s in snap.node_pods],
    )


def populate(sc: Scenario, policy: str = "bestfit") -> tuple[ClusterState, Profile]:
    profile = profile_for(policy, sc.pods)
    return play(profile, sc), profile


@PROPS
@given(
    sc=scenarios(max_events=20),
    extra=st.lists(pods(500), min_size=1, max_size=6),
    evict_picks=st.lists(st.integers(0, 999), max_size=4),
    interleave=st.booleans(),
)
def test_discard_restores_the_books_exactly(
    sc: Scenario, extra: list[PodSpec], evict_picks: list[int], interleave: bool
) -> None:
    snap, profile = populate(sc)
    before_arrays, before_books, before_gen = arrays(snap), books(snap), snap.gen.copy()
    extra = [replace(p, name=f"x{i}") for i, p in enumerate(extra)]
    with Statement(snap) as stmt:
        evicts = list(evict_picks)
        for p in extra:
            if interleave and evicts and snap.allocations:
                live = sorted(snap.allocations)
                stmt.evict(live[evicts.pop() % len(live)])
            stmt.schedule(profile, p)
            assert_invariants(snap)
        for x in evicts:
            if snap.allocations:
                live = sorted(snap.allocations)
                stmt.evict(live[x % len(live)])
        n_ops = len(stmt.operations)
        stmt.discard()
        assert not stmt.open
    assert_arrays_equal(snap, before_arrays, "after discard")
    assert books(snap) == before_books
    assert_invariants(snap)
    if n_ops:  # caches keyed by generation must see the change and its undoing
        assert (snap.gen >= before_gen).all() and (snap.gen > before_gen).any()


@PROPS
@given(sc=scenarios(max_events=20), extra=st.lists(pods(500), min_size=1, max_size=6))
def test_commit_keeps_exactly_what_the_operations_say(sc: Scenario, extra: list[PodSpec]) -> None:
    snap, profile = populate(sc)
    before = dict(snap.allocations)
    stmt = Statement(snap)
    for i, p in enumerate(extra):
        stmt.schedule(profile, replace(p, name=f"x{i}"))
    if snap.allocations:
        stmt.evict(sorted(snap.allocations)[0])
    ops = stmt.commit()
    want = dict(before)
    for op in ops:
        if op.kind is OpKind.ASSUME:
            want[op.allocation.pod.key] = op.allocation
        else:
            del want[op.allocation.pod.key]
    assert snap.allocations == want
    assert_invariants(snap)
    with pytest.raises(StatementClosed):
        stmt.discard()
    with pytest.raises(StatementClosed):
        stmt.assume(extra[0], 0, ())


@PROPS
@given(sc=scenarios(max_events=16, plain=True), group=st.lists(pods(700, plain=True), min_size=1, max_size=6))
def test_schedule_all_is_all_or_nothing(sc: Scenario, group: list[PodSpec]) -> None:
    snap, profile = populate(sc)
    group = [replace(p, name=f"g{i}") for i, p in enumerate(group)]
    before_arrays, before_books = arrays(snap), books(snap)
    probe = snap.copy()
    r = schedule_all(profile, group, snap)
    if r.scheduled:
        assert len(r.results) == len(group)
        assert all(p.key in snap.allocations for p in group)
        assert_invariants(snap)
    else:
        assert_arrays_equal(snap, before_arrays, "after a failed group")
        assert books(snap) == before_books
        failed = r.results[-1]
        assert not failed.scheduled
        assert failed.pod.key in r.status.message()
        # the pod that failed really fits nowhere once the ones before it are placed (brute force)
        for done in r.results[:-1]:
            probe.assume(done.pod, done.node, done.gpus)
        assert not any(bf_fits(probe, failed.pod, n) for n in range(len(probe)))


def test_group_that_needs_the_whole_cluster_lands_and_one_more_pod_undoes_it() -> None:
    nodes = [NodeSpec(f"n{i}", 64_000, 262_144, 4, "A", 0) for i in range(2)]
    snap = ClusterState(nodes)
    profile = BESTFIT
    whole = [PodSpec(f"w{i}", 8000, 1024, 4, GPU_MILLI) for i in range(2)]
    r = schedule_all(profile, whole, snap)
    assert r.scheduled and sorted(snap.allocations) == ["default/w0", "default/w1"]
    assert int(snap.gpu_free.sum()) == 0
    snap2 = ClusterState(nodes)
    r2 = schedule_all(profile, [*whole, PodSpec("w2", 1000, 1024, 1, GPU_MILLI)], snap2)
    assert not r2.scheduled
    assert r2.status.code == Code.UNSCHEDULABLE
    assert "default/w2 (3 of 3)" in r2.status.message()
    assert snap2.allocations == {} and int(snap2.gpu_free.sum()) == 8 * GPU_MILLI


def test_statement_discards_when_the_block_raises() -> None:
    snap = ClusterState([NodeSpec("n0", 8000, 8192, 2, "A", 0)])
    with pytest.raises(RuntimeError, match="boom"), Statement(snap) as stmt:
        stmt.assume(PodSpec("a", 1000, 100, 1, 500), 0, (0,))
        raise RuntimeError("boom")
    assert snap.allocations == {} and snap.node_gpu_free(0) == [GPU_MILLI, GPU_MILLI]


def test_statement_refuses_what_the_books_refuse() -> None:
    snap = ClusterState([NodeSpec("n0", 8000, 8192, 1, "A", 0)])
    with Statement(snap) as stmt:
        stmt.assume(PodSpec("a", 1000, 100, 1, 600), 0, (0,))
        with pytest.raises(AccountingError, match="400 milli free < 600"):
            stmt.assume(PodSpec("b", 1000, 100, 1, 600), 0, (0,))
        assert [op.allocation.pod.name for op in stmt.operations] == ["a"]  # the refused one is not recorded
        with pytest.raises(AccountingError, match="not assumed"):
            stmt.evict("default/nope")
        stmt.commit()
    assert list(snap.allocations) == ["default/a"]  # leaving the block after commit keeps it


def test_schedule_all_rejects_a_pod_twice_in_one_group() -> None:
    snap = ClusterState([NodeSpec("n0", 8000, 8192, 2, "A", 0)])
    p = PodSpec("a", 100, 100, 1, 100)
    with pytest.raises(AccountingError, match="default/a appears twice"):
        schedule_all(BESTFIT, [p, p], snap)
    assert snap.allocations == {}


# ------------------------------------------------------------------------------------ Bind
class RecordingBinder:
    def __init__(self, name: str, answer: Status) -> None:
        self.name, self.answer, self.calls = name, answer, []  # type: list[tuple[str, str, tuple[int, ...]]]

    def bind(self, pod: PodSpec, node_name: str, gpus: tuple[int, ...]) -> Status:
        self.calls.append((pod.key, node_name, gpus))
        return self.answer


def test_run_bind_asks_binders_in_order_until_one_does_not_skip() -> None:
    skip = RecordingBinder("skipper", Status(Code.SKIP))
    fail = RecordingBinder("failer", Status(Code.ERROR, ("api down",)))
    never = RecordingBinder("never", Status.success())
    base = BESTFIT
    pod = PodSpec("a", 100, 100, 1, 100)
    st = run_bind(replace(base, binds=(skip, fail, never)), pod, "n0", (1,))
    assert st.code == Code.ERROR and st.plugin == "failer" and st.reasons == ("api down",)
    assert skip.calls == fail.calls == [("default/a", "n0", (1,))] and never.calls == []
    ok = run_bind(replace(base, binds=(skip, never)), pod, "n0", (1,))
    assert ok.ok
    none = run_bind(replace(base, binds=(skip,)), pod, "n0", (1,))
    assert none.code == Code.ERROR and "no bind plugin" in none.message() and "default/a" in none.message()


def test_api_binder_maps_api_answers_to_status_codes() -> None:
    from kubernetes.client.exceptions import ApiException

    from gpusched.k8s.binder import APIBinder

    class Core:  # records the calls the binder makes; raises what the test sets
        def __init__(self, status: int | None) -> None:
            self.status, self.bodies = status, []  # type: list[dict[str, object]]

        def create_namespaced_binding(self, ns: str, body: dict[str, object], **kw: object) -> None:
            self.bodies.append(body)
            if self.status is not None:
                raise ApiException(status=self.status, reason="test")

    pod = PodSpec("a", 100, 100, 1, 300, namespace="ml", uid="u-1")
    results = {}
    for code in (None, 403, 404, 409, 422, 500, 429):
        core = Core(code)
        results[code] = APIBinder(core).bind(pod, "n3", (2,))  # type: ignore[arg-type]
        (body,) = core.bodies
        meta = body["metadata"]
        assert isinstance(meta, dict) and meta["uid"] == "u-1" and meta["namespace"] == "ml"
        assert "gpusched.io/assignment" in meta["annotations"]
    assert results[None].ok
    assert results[404].code == Code.UNSCHEDULABLE_AND_UNRESOLVABLE  # gone: release the booking
    assert results[403].code == results[422].code == Code.UNSCHEDULABLE  # refused, nothing written
    # the outcome is unknown: 409 may be an earlier attempt of ours that committed (k8s/binding.py)
    assert results[409].code == results[500].code == results[429].code == Code.ERROR
    assert results[500].message() == "500 test"  # the API's status and reason, for the caller's log line


def test_uid_is_not_part_of_the_shape() -> None:
    a = PodSpec("a", 100, 100, 1, 300, uid="u-1")
    assert a.shape() == replace(a, uid="u-2").shape()
