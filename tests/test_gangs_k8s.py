"""The standalone scheduler's gang path (``k8s/gangs.py``) on live books with a fake API: the three
group APIs read into one view, all-or-nothing, no deadlock, timeout, bad input, DRA claims."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, cast
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes import client

from builders import k8s_node, k8s_pod
from gpusched.core.gang import GangSpec, partly_bound
from gpusched.k8s.convert import pod_from_k8s
from gpusched.k8s.events import EventRecorder
from gpusched.k8s.gangs import Gangs
from gpusched.k8s.groupref import ANN_VOLCANO, API, LABEL_COSCHEDULING, GroupRef, group_ref_of
from gpusched.k8s.groupstatus import GroupStatusWriter, status_body
from gpusched.k8s.podevents import Kind, PodFeed, parse_pod_event
from gpusched.k8s.podgroups import DEFAULT_TIMEOUT_S, PodGroups, group_from_k8s
from gpusched.k8s.queue import QueuedPod
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler


class FakeGroups:
    """``PodGroups`` without an API server: groups added by hand."""

    def __init__(self, on_change: Callable[[GroupRef], None]) -> None:
        self.on_change = on_change
        self.custom = mock.MagicMock()
        self.known: dict[GroupRef, Any] = {}
        self.served = True

    def get(self, ref: GroupRef) -> Any:
        return self.known.get(ref)

    def watching(self, api: API) -> bool:
        return self.served

    def stop(self) -> None: ...

    def add(self, api: API, name: str, spec: dict[str, Any], ns: str = "ns") -> None:
        g = group_from_k8s(
            api, {"metadata": {"name": name, "namespace": ns, "uid": f"g-{name}"}, "spec": spec}
        )
        self.known[g.ref] = g
        self.on_change(g.ref)

    def remove(self, api: API, name: str, ns: str = "ns") -> None:
        self.known.pop(GroupRef(api, ns, name))
        self.on_change(GroupRef(api, ns, name))


class SyncPool:
    """The bind pool, run on the calling thread (decisions, binds and evictions in order)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        f: Future[Any] = Future()
        f.set_result(fn(*args))
        return f

    def shutdown(self, **_: Any) -> None: ...


def wire(
    s: StandaloneScheduler, events: EventRecorder, groups: Callable[..., Any], clock: Callable[[], float]
) -> None:
    """Point every part of ``s`` at ``events`` and hand-made groups; the bind pool on the calling thread."""
    pool = cast(Executor, SyncPool())
    s.events.stop()  # its own recorder: replaced
    s._pool = pool  # type: ignore[assignment]
    s.events = s._preemptor.events = s.tenants.events = s.actuator.events = events
    s.tenants.pool = s.actuator.pool = pool
    s.gangs = s.actuator.gangs = Gangs(
        s.queue, s.cluster, events, cast(Callable[..., PodGroups], groups), clock=clock
    )
    s.pods = PodFeed([s.cluster, s.gangs, s.reservations, s])  # the same fan-out, with these gangs


class Harness:
    """The scheduler's gang path with a fake API: no preemption, binds recorded, groups by hand."""

    def __init__(self, nodes: int = 2, gpus: int = 4) -> None:
        self.now = 0.0
        self.s = StandaloneScheduler(client.ApiClient(), SchedulerConfig(policy="bestfit", preemption=False))
        self.cluster = self.s.cluster
        for i in range(nodes):
            self.cluster.upsert_node(k8s_node(f"n{i}", gpus))
        self.queue = self.s.queue
        self.queue._clock = lambda: self.now
        self.core = mock.MagicMock()
        self.events = EventRecorder(self.core, workers=1)
        self.bound: dict[str, str] = {}
        wire(self.s, self.events, FakeGroups, lambda: self.now)

        def bind(_p: Any, qp: QueuedPod, pod: Any, node: str, gpus: tuple[int, ...]) -> None:
            self.bound[pod.key] = node

        self.s.actuator.bind = bind  # type: ignore[method-assign]
        self.s.leading.set()
        self.gangs = self.s.gangs
        self.groups = cast(FakeGroups, self.gangs.groups)

    def pod(self, name: str, gpus: int, group: str = "", api: API = API.COSCHEDULING, **spec: Any) -> None:
        obj = k8s_pod(name, {"nvidia.com/gpu": str(gpus)}, limits=True, ns="ns", **spec)
        obj["metadata"]["creationTimestamp"] = f"2026-01-01T00:00:{len(self.queue):02d}Z"
        if group and api is API.COSCHEDULING:
            obj["metadata"]["labels"] = {LABEL_COSCHEDULING: group}
        elif group and api is API.VOLCANO:
            obj["metadata"]["annotations"][ANN_VOLCANO] = group
        elif group:
            obj["spec"]["schedulingGroup"] = {"podGroupName": group}
        ev = parse_pod_event(obj)
        self.gangs.on_pod_event(ev)
        self.queue.add_or_update(ev)

    def drain(self) -> int:
        """Pop every active pod once through the gang path; returns how many were popped."""
        n = 0
        while (qp := self.queue.pop(timeout=0.0)) is not None:
            n += 1
            assert self.gangs.group_of(qp) is not None, f"{qp.key} is not a gang member"
            self.s.schedule(qp)
        return n

    def events_of(self, reason: str) -> list[tuple[str, str]]:
        """(object name, message) of every event with ``reason``."""
        self.events.flush()
        out = []
        for c in self.core.create_namespaced_event.call_args_list:
            body = c.args[1]
            if body["reason"] == reason:
                out.append((body["involvedObject"]["name"], body["message"]))
        return out


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.s.stop()  # stops its events (``harness.events``)


# ------------------------------------------------------------------ reading the three APIs
def test_each_api_names_its_group_where_its_jobs_put_it() -> None:
    base = k8s_pod("p", ns="ns")
    assert group_ref_of(base) is None
    coscheduling = {**base, "metadata": {**base["metadata"], "labels": {LABEL_COSCHEDULING: "g"}}}
    volcano = {**base, "metadata": {**base["metadata"], "annotations": {ANN_VOLCANO: "g"}}}
    native = {**base, "spec": {**base["spec"], "schedulingGroup": {"podGroupName": "g"}}}
    assert group_ref_of(coscheduling) == GroupRef(API.COSCHEDULING, "ns", "g")
    assert group_ref_of(volcano) == GroupRef(API.VOLCANO, "ns", "g")
    assert group_ref_of(native) == GroupRef(API.WORKLOAD, "ns", "g")
    # the books know the gang too (gang-aware preemption evicts a victim's whole gang)
    assert [pod_from_k8s(p).gang for p in (base, coscheduling, volcano, native)] == ["", "g", "g", "g"]


def test_group_fields_and_malformed_groups_name_the_field() -> None:
    meta = {"name": "g", "namespace": "ns", "uid": "u"}
    co = group_from_k8s(
        API.COSCHEDULING, {"metadata": meta, "spec": {"minMember": 3, "scheduleTimeoutSeconds": 7}}
    )
    assert (co.min_member, co.timeout_s, co.problem) == (3, 7.0, "")
    vc = group_from_k8s(API.VOLCANO, {"metadata": meta, "spec": {"minMember": 2}})
    assert (vc.min_member, vc.timeout_s) == (2, DEFAULT_TIMEOUT_S)
    gang = group_from_k8s(
        API.WORKLOAD, {"metadata": meta, "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}}
    )
    assert gang.min_member == 4
    basic = group_from_k8s(API.WORKLOAD, {"metadata": meta, "spec": {"schedulingPolicy": {"basic": {}}}})
    assert basic.min_member == 0  # not a gang
    bad = group_from_k8s(API.VOLCANO, {"metadata": meta, "spec": {"minMember": 0}})
    assert "spec.minMember must be at least 1, got 0" in bad.problem
    bad = group_from_k8s(API.COSCHEDULING, {"metadata": meta, "spec": {"minMember": "x"}})
    assert "spec.minMember must be an integer" in bad.problem


def test_podgroups_discovery_skips_apis_that_are_not_served() -> None:
    """An absent CRD is no error: nothing is watched for it, and it is looked for again later."""
    from kubernetes.client.exceptions import ApiException

    now = [0.0]
    groups = PodGroups(mock.MagicMock(), lambda ref: None, clock=lambda: now[0])
    groups.custom = mock.MagicMock()
    groups.custom.get_api_resources.side_effect = ApiException(status=404)
    assert groups.discover() == []
    assert not groups.watching(API.VOLCANO)
    calls = groups.custom.get_api_resources.call_count
    assert not groups.watching(API.VOLCANO)  # within the rediscovery interval: not asked again
    assert groups.custom.get_api_resources.call_count == calls
    now[0] = 10.0
    assert not groups.watching(API.VOLCANO)
    assert groups.custom.get_api_resources.call_count > calls
    groups.stop()


# ------------------------------------------------------------------ all or nothing
@pytest.mark.parametrize("api", list(API))
def test_a_gang_lands_whole_or_not_at_all(h: Harness, api: API) -> None:
    spec = {"schedulingPolicy": {"gang": {"minCount": 2}}} if api is API.WORKLOAD else {"minMember": 2}
    big = {"schedulingPolicy": {"gang": {"minCount": 3}}} if api is API.WORKLOAD else {"minMember": 3}
    h.groups.add(api, "fits", spec)
    h.groups.add(api, "big", big)
    for i in range(2):
        h.pod(f"fits-{i}", 4, "fits", api)
    for i in range(3):
        h.pod(f"big-{i}", 4, "big", api)
    h.drain()
    assert sorted(h.bound) == ["ns/fits-0", "ns/fits-1"]
    waiting = [m for name, m in h.events_of("GangWaiting") if name == "big"]
    assert waiting and "waits as a unit (minMember 3)" in waiting[0]
    with h.cluster.live_books() as snap:
        assert set(snap.allocations) == {"ns/fits-0", "ns/fits-1"}  # nothing of 'big' held


def test_two_gangs_over_half_the_gpus_never_deadlock(h: Harness) -> None:
    for g in ("a", "b"):
        h.groups.add(API.COSCHEDULING, g, {"minMember": 3})
    for i in range(3):
        for g in ("a", "b"):
            h.pod(f"{g}-{i}", 2, g)
    h.drain()
    assert sorted(h.bound) == ["ns/a-0", "ns/a-1", "ns/a-2"]
    (msg,) = [m for name, m in h.events_of("GangWaiting") if name == "b"]
    prefix = "PodGroup ns/b (scheduling.x-k8s.io/v1alpha1): gang ns/b waits as a unit (minMember 3)"
    assert msg.startswith(prefix), msg


def test_members_beyond_the_minimum_follow_one_by_one(h: Harness) -> None:
    h.groups.add(API.VOLCANO, "g", {"minMember": 2})
    for i in range(3):
        h.pod(f"g-{i}", 3, "g", API.VOLCANO)
    h.drain()
    assert len(h.bound) == 2  # 8 GPUs: two of 3 GPUs fit with the minimum, the third is left out
    assert [k for k in ("ns/g-0", "ns/g-1", "ns/g-2") if k not in h.bound] != []


@settings(max_examples=40, deadline=None)
@given(
    gangs=st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 4)), min_size=1, max_size=5
    ),
)
def test_no_gang_is_ever_partly_bound(gangs: list[tuple[int, int, int]]) -> None:
    """Random gangs (pods, minMember, GPUs per pod) on 8 GPUs: after the drain, every gang has
    none or at least its minimum bound (core.gang.partly_bound)."""
    h = Harness()
    try:
        specs = {}
        for gi, (pods, min_member, gpus) in enumerate(gangs):
            h.groups.add(API.COSCHEDULING, f"g{gi}", {"minMember": min(min_member, pods)})
            specs[f"ns/g{gi}"] = GangSpec(f"g{gi}", "ns", min(min_member, pods))
            for i in range(pods):
                h.pod(f"g{gi}-{i}", gpus, f"g{gi}")
        h.drain()
        with h.cluster.live_books() as snap:
            pods_bound = [snap.allocations[k].pod for k in h.bound]
            assert all(k in snap.allocations for k in h.bound)
            assert int(snap.gpu_free.min()) >= 0
        assert partly_bound(pods_bound, specs) == []
    finally:
        h.s.stop()


# ------------------------------------------------------------------ waiting, timeout, bad input
def test_too_few_pods_then_timeout_then_the_gang_lands(h: Harness) -> None:
    h.groups.add(API.COSCHEDULING, "slow", {"minMember": 3, "scheduleTimeoutSeconds": 5})
    for i in range(2):
        h.pod(f"slow-{i}", 2, "slow")
    h.drain()
    assert not h.bound
    incomplete = [m for n, m in h.events_of("GangIncomplete") if n == "slow"]
    assert any("spec.minMember is 3 but only 2 pod(s) name the group" in m for m in incomplete)
    assert not h.events_of("GangTimeout")
    h.now = 6.0
    h.queue.move_all_to_active()
    h.drain()
    timeouts = h.events_of("GangTimeout")
    assert {n for n, _ in timeouts} == {"slow", "slow-0", "slow-1"}
    assert all("spec.scheduleTimeoutSeconds" in m for _, m in timeouts)
    h.pod("slow-2", 2, "slow")  # the third member: the others are woken, the gang lands
    h.drain()
    assert sorted(h.bound) == ["ns/slow-0", "ns/slow-1", "ns/slow-2"]


def test_unknown_group_and_unserved_api_are_named(h: Harness) -> None:
    h.pod("orphan", 1, "nosuch")
    h.drain()
    h.groups.served = False
    h.pod("stray", 1, "other", API.VOLCANO)
    h.drain()
    msgs = dict(h.events_of("FailedScheduling"))
    assert f"label {LABEL_COSCHEDULING} names PodGroup ns/nosuch" in msgs["orphan"]
    assert "does not exist" in msgs["orphan"]
    assert "does not serve scheduling.volcano.sh/v1beta1 podgroups" in msgs["stray"]
    assert not h.bound


def test_a_malformed_group_binds_nothing(h: Harness) -> None:
    h.groups.add(API.COSCHEDULING, "bad", {"minMember": -1})
    h.pod("bad-0", 1, "bad")
    h.drain()
    (msg,) = [m for n, m in h.events_of("InvalidPodGroup") if n == "bad"]
    assert "spec.minMember must be at least 1, got -1" in msg
    assert not h.bound


def test_a_member_whose_claims_are_not_ready_is_told_why_and_the_gang_waits_for_it(h: Harness) -> None:
    """Members with DRA claims are decided (jointly: tests/dra/test_gang_claims.py, e2e in
    tests/e2e/test_dra_gang_e2e.py); one whose claims cannot be resolved yet (here: the DRA informers
    have not listed) is told why and left out, and a gang short of its minimum binds nothing."""
    h.groups.add(API.COSCHEDULING, "g", {"minMember": 2})
    h.pod("plain", 1, "g")
    h.pod("claims", 1, "g", resourceClaims=[{"name": "gpu", "resourceClaimName": "c"}])
    h.drain()
    assert not h.bound
    msgs = [m for n, m in h.events_of("FailedScheduling") if n == "claims"]
    assert any("member ns/claims: waiting for the DRA informers" in m for m in msgs), msgs
    plain = [m for n, m in h.events_of("FailedScheduling") if n == "plain"]
    assert any("1 member(s) can be decided, 0 bound, minimum 2; nothing is bound" in m for m in plain), plain


@pytest.mark.parametrize("written", [True, False])
def test_a_gang_with_claims_binds_only_once_every_members_claims_are_written(
    h: Harness, written: bool
) -> None:
    """The actuator writes every member's claims (``DraClaims.write_all``) before it binds any; when
    a member's write fails no member is bound, their bookings are forgotten and each is told why."""
    import dataclasses

    from gpusched.core.dra.celexpr import CelCompiler
    from gpusched.core.dra.inventory import DraInventory, FixedLedger, PodClaims
    from gpusched.k8s.claims import GangWrite
    from gpusched.k8s.dra.writer import WriteOutcome, Written

    inv = DraInventory({}, (), FixedLedger(), CelCompiler())
    h.s.claims.prepare = lambda obj, pod: dataclasses.replace(pod, claims=PodClaims((), (), inv))  # type: ignore[method-assign]
    failed = GangWrite("ns/b", WriteOutcome(Written.REFUSED, "422 invalid"))
    h.s.claims.write_all = lambda members, keep_trying: GangWrite() if written else failed  # type: ignore[method-assign]
    bound: list[str] = []
    h.s.actuator._bind_written = lambda _p, qp, *rest: bound.append(qp.key)  # type: ignore[method-assign]
    h.groups.add(API.COSCHEDULING, "g", {"minMember": 2})
    h.pod("a", 1, "g")
    h.pod("b", 1, "g")
    h.drain()
    if written:
        assert sorted(bound) == ["ns/a", "ns/b"]
        return
    assert not bound
    assert not h.cluster.is_bound_or_assumed("ns/a") and not h.cluster.is_bound_or_assumed("ns/b")
    for name in ("a", "b"):
        (msg,) = [m for n, m in h.events_of("FailedScheduling") if n == name]
        assert (
            "writing the ResourceClaims of member ns/b failed (refused: 422 invalid); no member is bound"
            in msg
        )


def test_group_status_per_api() -> None:
    assert status_body(API.COSCHEDULING, True, 2, "")["status"] == {"phase": "Scheduled"}
    cond = status_body(API.WORKLOAD, False, 0, "why")["status"]["conditions"][0]
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "PodGroupInitiallyScheduled",
        "False",
        "Unschedulable",
    )
    vc = status_body(API.VOLCANO, False, 0, "why")["status"]
    assert vc["phase"] == "Pending" and vc["conditions"][0]["type"] == "Unschedulable"


class _QueuedWrites:
    """An ``EventRecorder`` stand-in that keeps the queued writes, to run them in any order."""

    def __init__(self) -> None:
        self.queued: list[Callable[[], object]] = []

    def write(self, fn: Callable[[], object]) -> None:
        self.queued.append(fn)


def _status_patch(custom: mock.MagicMock, api: API) -> mock.MagicMock:
    """The call that writes a group's status in ``api`` (Volcano's CRD has no status subresource)."""
    if api is API.VOLCANO:
        return cast(mock.MagicMock, custom.patch_namespaced_custom_object)
    return cast(mock.MagicMock, custom.patch_namespaced_custom_object_status)


def _last_status(custom: mock.MagicMock, api: API) -> dict[str, Any]:
    return cast(dict[str, Any], _status_patch(custom, api).call_args.args[5]["status"])


@settings(max_examples=60, deadline=None)
@given(
    api=st.sampled_from(list(API)),
    calls=st.lists(st.tuples(st.booleans(), st.integers(1, 4)), min_size=1, max_size=6),
    order=st.randoms(use_true_random=False),
)
def test_group_status_ends_at_the_latest_state_whatever_order_the_writers_run(
    api: API, calls: list[tuple[bool, int]], order: Any
) -> None:
    """The recorder's workers may run queued status writes out of order (CI saw a PodGroup stay
    ``PodGroupInitiallyScheduled=False`` after it was placed): the group must end at the latest state."""
    custom, writes = mock.MagicMock(), _QueuedWrites()
    writer = GroupStatusWriter(custom, cast(EventRecorder, writes))
    group = group_from_k8s(
        api, {"metadata": {"name": "g", "namespace": "ns", "uid": "u"}, "spec": {"minMember": 2}}
    )
    expected: tuple[bool, int] | None = None
    for placed, count in calls:
        if placed:
            writer.placed(group, count)
            expected = (True, count)
        else:
            writer.unschedulable(group, f"waits ({count})")
            if not (api is API.WORKLOAD and expected is not None):  # never back to False once True
                expected = (False, 0)
    order.shuffle(writes.queued)
    for fn in writes.queued:
        fn()
    status = _last_status(custom, api)
    assert expected is not None
    placed, count = expected
    if api is API.WORKLOAD:
        cond = status["conditions"][0]
        assert cond["status"] == ("True" if placed else "False")
        if placed:
            assert cond["message"].startswith(f"{count} pod(s) placed")
    elif api is API.COSCHEDULING:
        assert status["phase"] == ("Scheduled" if placed else "Pending")
    else:
        assert status["phase"] == ("Running" if placed else "Pending")


@pytest.mark.parametrize("api", list(API))
def test_a_group_deleted_and_created_again_under_its_name_gets_its_own_status(h: Harness, api: API) -> None:
    """A Job run again: its PodGroup is deleted and created under the same name, and lands the same
    way. The new object's status must be written, though the state is the same as the old one's."""
    spec = {"schedulingPolicy": {"gang": {"minCount": 2}}} if api is API.WORKLOAD else {"minMember": 2}
    patch = _status_patch(cast(mock.MagicMock, h.groups.custom), api)

    def run(job: str) -> int:
        h.groups.add(api, "train", spec)
        for i in range(2):
            h.pod(f"train-{job}-{i}", 1, "train", api)
        h.drain()
        h.events.flush()
        return len([c for c in patch.call_args_list if c.args[4] == "train"])

    first = run("a")
    assert first >= 1 and sorted(h.bound) == ["ns/train-a-0", "ns/train-a-1"]
    for key in list(h.bound):  # the Job is deleted: its pods, then its group
        h.gangs.on_pod_event(parse_pod_event(k8s_pod(key.split("/")[1], ns="ns"), Kind.DELETE))
        h.cluster.delete_pod(key)
    h.groups.remove(api, "train")
    assert run("b") == 2 * first
    assert sorted(h.bound) == ["ns/train-a-0", "ns/train-a-1", "ns/train-b-0", "ns/train-b-1"]


@pytest.mark.parametrize("api", [API.WORKLOAD, API.VOLCANO])
def test_the_transition_time_moves_only_when_the_group_goes_from_waiting_to_placed_or_back(
    api: API, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gpusched.k8s.groupstatus as groupstatus

    clock = iter(f"2026-12-06T00:00:{s:02d}Z" for s in range(60))
    monkeypatch.setattr(groupstatus, "_now", lambda: next(clock))
    custom, writes = mock.MagicMock(), _QueuedWrites()
    writer = GroupStatusWriter(custom, cast(EventRecorder, writes))
    group = group_from_k8s(
        api, {"metadata": {"name": "g", "namespace": "ns", "uid": "u"}, "spec": {"minMember": 2}}
    )
    times = []
    for step in (
        lambda: writer.unschedulable(group, "waits: 1 of 2"),
        lambda: writer.unschedulable(group, "waits: still 1 of 2"),  # the same state, a new message
        lambda: writer.placed(group, 2),  # a transition
        lambda: writer.placed(group, 3),  # one more member follows
    ):
        step()
        writes.queued.pop()()
        times.append(_last_status(custom, api)["conditions"][0]["lastTransitionTime"])
    assert times[0] == times[1] != times[2] == times[3]


def test_a_refused_status_write_counts_as_failed_and_the_next_state_is_sent() -> None:
    core = mock.MagicMock()
    custom = mock.MagicMock()
    custom.patch_namespaced_custom_object_status.side_effect = [RuntimeError("503"), None]
    rec = EventRecorder(core, workers=1)
    writer = GroupStatusWriter(custom, rec)
    group = group_from_k8s(
        API.COSCHEDULING, {"metadata": {"name": "g", "namespace": "ns", "uid": "u"}, "spec": {"minMember": 2}}
    )
    try:
        writer.unschedulable(group, "waits")
        rec.flush()
        writer.placed(group, 2)
        rec.flush()
    finally:
        rec.stop()
    assert rec.counts()["failed"] == 1 and rec.counts()["sent"] == 1
    assert _last_status(custom, API.COSCHEDULING) == {"phase": "Scheduled"}
