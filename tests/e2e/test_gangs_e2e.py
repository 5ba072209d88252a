"""Gangs through the standalone scheduler on the real control plane, in the three APIs jobs carry:
Kubernetes' own ``scheduling.k8s.io/v1beta1`` PodGroup, coscheduling's and Volcano's (their CRDs from
their Go modules, ``hack/build-gang-crds.sh``). Each test has its own namespace, nodes and scheduler
(``test_standalone.Env``)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_standalone import Env

from gpusched.k8s.groupref import ANN_VOLCANO, API, LABEL_COSCHEDULING
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.testenv import ControlPlane, wait_until
from gpusched.testenv.binaries import BinariesUnavailableError
from gpusched.testenv.gangcrds import find_gang_crds, install_gang_crds
from realparts import unavailable

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def gang_apis(control_plane: ControlPlane) -> None:
    try:
        directory = find_gang_crds()
    except BinariesUnavailableError as exc:
        if exc.go_missing:
            unavailable(f"the gang CRDs cannot be fetched: Go is not installed. {exc}")
        pytest.fail(f"the gang CRDs could not be fetched: {exc}", pytrace=False)
    install_gang_crds(control_plane, directory)


@pytest.fixture
def env(control_plane: ControlPlane, gang_apis: None) -> Iterator[Env]:
    e = Env(control_plane)
    try:
        yield e
    finally:
        e.cleanup()


class Gangs:
    """Groups and their pods in one API, and a running scheduler."""

    def __init__(self, env: Env, api: API, flush_s: float = 30.0) -> None:
        from kubernetes import client

        self.env, self.api = env, api
        self.custom = client.CustomObjectsApi(env.api)
        self.sched = StandaloneScheduler(
            env.api, SchedulerConfig(scheduler_name=env.scheduler, flush_s=flush_s)
        ).start()

    def group(
        self, name: str, min_member: int, timeout_s: int | None = None, ann: dict[str, str] | None = None
    ) -> None:
        a = self.api.value
        if self.api is API.WORKLOAD:
            spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_member}}}
        else:
            spec = {"minMember": min_member}
            if timeout_s is not None:
                spec["scheduleTimeoutSeconds"] = timeout_s
        meta = {"name": name, "annotations": ann or {}}
        body = {"apiVersion": a.api_version, "kind": a.kind, "metadata": meta, "spec": spec}
        self.custom.create_namespaced_custom_object(a.group, a.version, self.env.ns, a.plural, body)

    def member(self, name: str, group: str, gpus: int, ann: dict[str, str] | None = None) -> dict[str, Any]:
        pod = self.env.pod(name, {"cpu": "100m", "nvidia.com/gpu": str(gpus)}, dict(ann or {}))
        if self.api is API.WORKLOAD:
            pod["spec"]["schedulingGroup"] = {"podGroupName": group}
        elif self.api is API.COSCHEDULING:
            pod["metadata"]["labels"][LABEL_COSCHEDULING] = group
        else:
            pod["metadata"]["annotations"][ANN_VOLCANO] = group
        return pod

    def read(self, name: str) -> dict[str, Any]:
        a = self.api.value
        obj = self.custom.get_namespaced_custom_object(a.group, a.version, self.env.ns, a.plural, name)
        return dict(obj)

    def nodes_of(self) -> dict[str, str | None]:
        return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in self.env.list_pods()}

    def group_events(self, reason: str, group: str) -> list[str]:
        return [
            str(e["message"])
            for e in self.env.events(reason)
            if e["involvedObject"].get("kind") == "PodGroup" and e["involvedObject"]["name"] == group
        ]

    def pod_messages(self, name: str, reason: str = "FailedScheduling") -> list[str]:
        return [str(e["message"]) for e in self.env.events(reason) if e["involvedObject"]["name"] == name]

    def stop(self) -> None:
        self.sched.stop()


@pytest.fixture
def gangs(env: Env, request: pytest.FixtureRequest) -> Iterator[Gangs]:
    g = Gangs(env, getattr(request, "param", API.COSCHEDULING))
    try:
        yield g
    finally:
        g.stop()


def _settle(seconds: float = 3.0) -> None:
    time.sleep(seconds)  # give a wrong binding the time to happen


@pytest.mark.parametrize("gangs", list(API), ids=[a.name.lower() for a in API], indirect=True)
def test_each_api_lands_a_gang_all_or_nothing(env: Env, gangs: Gangs) -> None:
    """8 GPUs: a gang of 2 x 4 GPUs lands whole; a gang of 3 x 4 GPUs (12) binds nothing, its
    pods and group say why; the group's status shows it where the API has one."""
    env.nodes([(f"n{i}-{env.tag}", 8000, 32768, 4, "A100") for i in range(2)])
    gangs.group("fits", 2)
    gangs.group("big", 3)
    env.create_pods([gangs.member(f"fits-{i}", "fits", 4) for i in range(2)])
    env.create_pods([gangs.member(f"big-{i}", "big", 4) for i in range(3)])
    wait_until(
        lambda: all(gangs.nodes_of()[f"fits-{i}"] for i in range(2)), timeout=60, what="gang 'fits' bound"
    )
    wait_until(
        lambda: bool(gangs.group_events("GangWaiting", "big")), timeout=30, what="GangWaiting on 'big'"
    )
    _settle()
    where = gangs.nodes_of()
    assert [where[f"big-{i}"] for i in range(3)] == [None, None, None]
    assert len({where["fits-0"], where["fits-1"]}) == 2
    msgs = gangs.group_events("GangWaiting", "big")
    assert any("waits as a unit (minMember 3)" in m for m in msgs), msgs
    assert any("waits as a unit" in m for m in gangs.pod_messages("big-0"))
    assert gangs.group_events("GangScheduled", "fits")
    if gangs.api is API.WORKLOAD:
        wait_until(
            lambda: _condition(gangs.read("fits"), "PodGroupInitiallyScheduled") == "True",
            timeout=20,
            what="the condition",
        )
        assert _condition(gangs.read("big"), "PodGroupInitiallyScheduled") == "False"
    elif gangs.api is API.COSCHEDULING:
        wait_until(
            lambda: (gangs.read("fits").get("status") or {}).get("phase") == "Scheduled",
            timeout=20,
            what="phase",
        )
        assert (gangs.read("big").get("status") or {}).get("phase") == "Pending"
    else:
        wait_until(
            lambda: (gangs.read("big").get("status") or {}).get("phase") == "Pending",
            timeout=20,
            what="phase",
        )
        assert (gangs.read("fits").get("status") or {}).get("phase") == "Running"


def _condition(obj: dict[str, Any], type_: str) -> str | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return str(c.get("status"))
    return None


def test_two_gangs_over_half_the_gpus_never_deadlock(env: Env, gangs: Gangs) -> None:
    """Two gangs of 3 x 2 GPUs on 8 GPUs, their pods created interleaved: one gang runs whole,
    the other binds nothing and waits as a unit with an event saying why."""
    env.nodes([(f"n{i}-{env.tag}", 8000, 32768, 4, "A100") for i in range(2)])
    gangs.group("a", 3)
    gangs.group("b", 3)
    env.create_pods([gangs.member(f"{g}-{i}", g, 2) for i in range(3) for g in ("a", "b")], threads=6)

    def one_whole() -> bool:
        where = gangs.nodes_of()
        return any(all(where.get(f"{g}-{i}") for i in range(3)) for g in ("a", "b"))

    wait_until(one_whole, timeout=60, what="one gang bound whole")
    _settle()
    where = gangs.nodes_of()
    bound = {g: sum(1 for i in range(3) if where[f"{g}-{i}"]) for g in ("a", "b")}
    assert sorted(bound.values()) == [0, 3], bound
    loser = "a" if bound["a"] == 0 else "b"
    wait_until(
        lambda: bool(gangs.group_events("GangWaiting", loser)), timeout=20, what="the waiting gang's event"
    )
    msgs = gangs.group_events("GangWaiting", loser)
    assert any(f"gang {env.ns}/{loser} waits as a unit (minMember 3)" in m for m in msgs), msgs


def test_a_gang_past_its_timeout_is_released_and_holds_nothing(env: Env) -> None:
    """coscheduling, scheduleTimeoutSeconds 2, 2 of its 3 pods: GangIncomplete naming spec.minMember,
    then GangTimeout; a pod that needs every GPU binds meanwhile (the gang holds nothing); once it is
    gone and the third member comes, the gang lands."""
    env.nodes([(f"n{i}-{env.tag}", 8000, 32768, 4, "A100") for i in range(2)])
    g = Gangs(env, API.COSCHEDULING, flush_s=2.0)
    try:
        g.group("slow", 3, timeout_s=2)
        env.create_pods([g.member(f"slow-{i}", "slow", 2) for i in range(2)])
        wait_until(lambda: bool(g.group_events("GangIncomplete", "slow")), timeout=30, what="GangIncomplete")
        wait_until(
            lambda: any(
                "minMember is 3 but only 2 pod(s)" in m for m in g.group_events("GangIncomplete", "slow")
            ),
            timeout=30,
            what="GangIncomplete naming spec.minMember",
        )
        wait_until(lambda: bool(g.group_events("GangTimeout", "slow")), timeout=30, what="GangTimeout")
        assert "spec.scheduleTimeoutSeconds" in g.group_events("GangTimeout", "slow")[0]
        assert g.pod_messages("slow-0", "GangTimeout")
        hog = [env.pod(f"hog-{i}", {"cpu": "100m", "nvidia.com/gpu": "4"}) for i in range(2)]
        env.create_pods(hog)
        wait_until(
            lambda: all(g.nodes_of()[f"hog-{i}"] for i in range(2)), timeout=30, what="every GPU taken"
        )
        assert not any(g.nodes_of()[f"slow-{i}"] for i in range(2))
        for i in range(2):
            env.v1.delete_namespaced_pod(f"hog-{i}", env.ns, grace_period_seconds=0)
        env.create_pods([g.member("slow-2", "slow", 2)])
        wait_until(
            lambda: all(g.nodes_of().get(f"slow-{i}") for i in range(3)), timeout=60, what="gang bound"
        )
    finally:
        g.stop()


def test_a_pod_with_dra_claims_waits_with_an_event(env: Env, gangs: Gangs) -> None:
    env.nodes([(f"n0-{env.tag}", 8000, 32768, 4, "A100")])
    pod = env.pod("dra", {"cpu": "100m"})
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "some-claim"}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    env.create_pods([pod, env.pod("plain", {"cpu": "100m", "nvidia.com/gpu": "1"})])
    wait_until(lambda: bool(gangs.pod_messages("dra")), timeout=30, what="the DRA pod's event")
    wait_until(lambda: bool(gangs.nodes_of()["plain"]), timeout=30, what="the plain pod bound")
    _settle()
    assert gangs.nodes_of()["dra"] is None
    (msg,) = gangs.pod_messages("dra")
    # its claim does not exist: it waits for it, named (DRA claims are allocated since issue 32, docs/dra.md)
    assert "spec.resourceClaims[0] (gpu): waiting for ResourceClaim" in msg and "some-claim" in msg


def test_bad_groups_get_events_naming_the_field_and_bind_nothing(env: Env, gangs: Gangs) -> None:
    """A group whose minMember exceeds its pods; a pod naming a group that does not exist."""
    env.nodes([(f"n0-{env.tag}", 8000, 32768, 4, "A100")])
    gangs.group("short", 5)
    env.create_pods([gangs.member(f"short-{i}", "short", 1) for i in range(2)])
    env.create_pods([gangs.member("orphan", "nosuchgroup", 1)])

    def named() -> bool:
        return any(
            "spec.minMember is 5 but only 2 pod(s)" in m
            for m in gangs.group_events("GangIncomplete", "short")
        )

    wait_until(named, timeout=30, what="GangIncomplete naming spec.minMember")
    wait_until(lambda: bool(gangs.pod_messages("orphan")), timeout=30, what="the orphan's event")
    _settle()
    assert not any(gangs.nodes_of().values())
    assert any("spec.minMember is 5" in m for m in gangs.pod_messages("short-0"))
    (orphan,) = gangs.pod_messages("orphan")
    assert f"label {LABEL_COSCHEDULING} names PodGroup {env.ns}/nosuchgroup" in orphan
    assert "does not exist" in orphan
    assert json.dumps(gangs.read("short").get("status") or {}).count("Pending") == 1


def test_a_gang_over_its_queues_quota_waits_as_a_unit_naming_the_queue(
    control_plane: ControlPlane, env: Env, gangs: Gangs
) -> None:
    """A Queue of 2 GPUs for the namespace (no parent, so no borrowing): a gang of 3 x 1 GPU binds
    nothing though 8 GPUs are free, its group's event names the queue; a gang of 2 lands whole."""
    from kubernetes import client

    from gpusched.bench.reclaim import install_queue_crd, queue_body
    from gpusched.k8s.queues import GROUP, PLURAL, VERSION

    install_queue_crd(control_plane)
    queue = f"q-{env.tag}"
    custom = client.CustomObjectsApi(env.api)
    custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, queue_body(queue, 2, namespaces=[env.ns]))
    try:
        env.nodes([(f"n{i}-{env.tag}", 8000, 32768, 4, "A100") for i in range(2)])
        wait_until(
            lambda: queue in gangs.sched.tenants.directory.current().tree, timeout=30, what="the Queue"
        )
        gangs.group("over", 3)
        env.create_pods([gangs.member(f"over-{i}", "over", 1) for i in range(3)])
        wait_until(
            lambda: any(f"queue {queue}" in m for m in gangs.group_events("GangWaiting", "over")),
            timeout=30,
            what="GangWaiting naming the queue",
        )
        gangs.group("fits", 2)
        env.create_pods([gangs.member(f"fits-{i}", "fits", 1) for i in range(2)])
        wait_until(
            lambda: all(gangs.nodes_of()[f"fits-{i}"] for i in range(2)), timeout=60, what="'fits' bound"
        )
        _settle()
        assert not any(gangs.nodes_of()[f"over-{i}"] for i in range(3))
        # the first refusal, before 'fits' took 2 GPUs (later ones say "5 of 2"; events list in name order)
        msgs = [m for m in gangs.group_events("GangWaiting", "over") if f"queue {queue}" in m]
        assert any("would be 3 of 2" in m for m in msgs), msgs
    finally:
        custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, queue)


def test_a_high_priority_gang_evicts_lower_priority_pods_and_lands_whole(env: Env, gangs: Gangs) -> None:
    """Two nodes of 2 GPUs, all taken by priority-0 pods: on n0 two database replicas a budget
    protects (disruptionsAllowed 0), on n1 two batch pods. A priority-1000 gang of 2 x 1 GPU evicts
    the batch pods through the Eviction API (not the protected ones), is nominated to n1 while they
    terminate, and lands whole there."""
    from test_preemption_e2e import budget_allows, classes, pdb, pod, running, unhold

    low, high = f"low-{env.tag}", f"high-{env.tag}"
    api = classes(env, {low: 0, high: 1000})
    n0, n1 = f"{env.tag}-n0", f"{env.tag}-n1"
    try:
        env.nodes([(n0, 16000, 65536, 2, "T4"), (n1, 16000, 65536, 2, "T4")])
        env.create_pods([
            *(running(env, f"db-{i}", n0, {"app": "db"}, low) for i in range(2)),
            *(running(env, f"batch-{i}", n1, {"app": "batch"}, low, hold=True) for i in range(2)),
        ])  # fmt: skip
        pdb(env, "db", "db", 2)
        budget_allows(env, "db", 0)
        assert gangs.sched.budgets.wait_synced(30)
        gangs.group("urgent", 2)
        members = [gangs.member(f"urgent-{i}", "urgent", 1) for i in range(2)]
        for m in members:
            m["spec"]["priorityClassName"] = high
        env.create_pods(members)

        def nominated() -> bool:  # nominated first, then the victims evicted
            return all(
                (pod(env, f"urgent-{i}").get("status") or {}).get("nominatedNodeName") == n1
                and pod(env, f"batch-{i}")["metadata"].get("deletionTimestamp")
                for i in range(2)
            )

        wait_until(nominated, timeout=60, what="both members nominated to n1, the victims terminating")
        for i in range(2):
            batch = pod(env, f"batch-{i}")
            assert batch["metadata"].get("deletionTimestamp"), "the victim is terminating"
            conds = {c["type"]: c for c in batch["status"].get("conditions", [])}
            assert conds["DisruptionTarget"]["reason"] == "EvictionByEvictionAPI"
            assert not pod(env, f"db-{i}")["metadata"].get("deletionTimestamp"), "the protected pods stay"
        assert not any(gangs.nodes_of()[f"urgent-{i}"] for i in range(2))
        for i in range(2):
            unhold(env, f"batch-{i}")
        wait_until(
            lambda: all(gangs.nodes_of().get(f"urgent-{i}") == n1 for i in range(2)),
            timeout=60,
            what="the gang bound whole on n1",
        )
        gangs.sched.events.flush()
        evs = env.events("Preempted")
        assert sorted(e["involvedObject"]["name"] for e in evs) == ["batch-0", "batch-1"]
        for e in evs:
            assert e["message"].startswith(f"Preempted by gang PodGroup {env.ns}/urgent "), e["message"]
            assert e["message"].endswith(f"on node {n1}"), e["message"]
    finally:
        for p in env.list_pods():
            if p["metadata"].get("finalizers"):
                unhold(env, p["metadata"]["name"])
        for name in (low, high):
            api.delete_priority_class(name, _preload_content=False)


def test_a_gang_reclaims_its_lent_quota_as_a_unit(
    control_plane: ControlPlane, env: Env, gangs: Gangs
) -> None:
    """Queues a and b of 2 GPUs each under one parent, one node of 4 GPUs: b borrows a's idle
    quota (4 one-GPU pods); a's gang of 2 x 1 GPU, within a's own quota, reclaims it as a unit:
    two of b's pods leave through the Eviction API and the gang lands whole."""
    from kubernetes import client

    from gpusched.bench.reclaim import install_queue_crd, queue_body
    from gpusched.k8s.convert import ANN_QUEUE
    from gpusched.k8s.queues import GROUP, PLURAL, VERSION

    install_queue_crd(control_plane)
    custom = client.CustomObjectsApi(env.api)
    org, qa, qb = (f"{q}-{env.tag}" for q in ("org", "a", "b"))
    for body in (queue_body(org), queue_body(qa, 2, parent=org), queue_body(qb, 2, parent=org)):
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    try:
        env.nodes([(f"n0-{env.tag}", 8000, 32768, 4, "A100")])
        wait_until(lambda: qb in gangs.sched.tenants.directory.current().tree, timeout=30, what="the Queues")
        env.create_pods([
            env.pod(f"b-{i}", {"cpu": "100m", "nvidia.com/gpu": "1"}, ann={ANN_QUEUE: qb}) for i in range(4)
        ])  # fmt: skip
        wait_until(lambda: all(gangs.nodes_of()[f"b-{i}"] for i in range(4)), timeout=60, what="b borrows")
        gangs.group("train", 2)
        members = [gangs.member(f"train-{i}", "train", 1) for i in range(2)]
        for m in members:
            m["metadata"]["annotations"][ANN_QUEUE] = qa
        env.create_pods(members)
        wait_until(
            lambda: all(gangs.nodes_of().get(f"train-{i}") for i in range(2)),
            timeout=90,
            what="the gang landed",
        )
        live = [
            p["metadata"]["name"]
            for p in env.list_pods()
            if p["metadata"]["name"].startswith("b-") and not p["metadata"].get("deletionTimestamp")
        ]
        assert len(live) == 2, live  # exactly the borrowed two were reclaimed
        gangs.sched.events.flush()
        evs = [e for e in env.events("Preempted") if e["involvedObject"]["name"].startswith("b-")]
        assert len(evs) == 2 and all("reclaims its quota" in e["message"] for e in evs), evs
    finally:
        for q in (qa, qb, org):
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, q)


def test_gangs_kept_in_one_topology_domain(env: Env, gangs: Gangs) -> None:
    """8 kwok nodes of 4 GPUs, labelled as GFD labels NVLink cliques (2 nodes each) and racks (r0: c0,
    c1; r1: c2, c3). A gang required in one clique (2 x 4 GPUs) lands in one; one required in a clique
    but too big for any (3 x 4) binds nothing and waits, naming the level; one preferring a clique
    (on its group), too big for one, lands in one rack; an unknown key is refused with an event."""
    from gpusched.core.names import ANN_TOPOLOGY_PREFERRED, ANN_TOPOLOGY_REQUIRED, LABEL_CLIQUE, LABEL_RACK

    names = [f"n{i}-{env.tag}" for i in range(8)]
    labels = {
        n: {LABEL_CLIQUE: f"c{i // 2}-{env.tag}", LABEL_RACK: f"r{i // 4}"} for i, n in enumerate(names)
    }
    env.nodes([(n, 8000, 32768, 4, "A100") for n in names], labels=labels)
    req = {ANN_TOPOLOGY_REQUIRED: LABEL_CLIQUE}
    gangs.group("req", 2)
    env.create_pods([gangs.member(f"req-{i}", "req", 4, req) for i in range(2)])
    wait_until(lambda: all(gangs.nodes_of()[f"req-{i}"] for i in range(2)), timeout=60, what="gang 'req'")
    gangs.group("big", 3)
    gangs.group("pref", 3, ann={ANN_TOPOLOGY_PREFERRED: LABEL_CLIQUE})
    gangs.group("bad", 1)
    env.create_pods([gangs.member(f"big-{i}", "big", 4, req) for i in range(3)])
    env.create_pods([gangs.member(f"pref-{i}", "pref", 4) for i in range(3)])
    env.create_pods([gangs.member("bad-0", "bad", 1, {ANN_TOPOLOGY_REQUIRED: "zone"})])
    wait_until(lambda: all(gangs.nodes_of()[f"pref-{i}"] for i in range(3)), timeout=60, what="gang 'pref'")
    wait_until(lambda: bool(gangs.group_events("GangWaiting", "big")), timeout=30, what="'big' waits")
    wait_until(
        lambda: bool(gangs.group_events("InvalidGangTopology", "bad")), timeout=30, what="'bad' refused"
    )
    _settle()
    where = gangs.nodes_of()
    assert len({labels[str(where[f"req-{i}"])][LABEL_CLIQUE] for i in range(2)}) == 1, where
    assert {labels[str(where[f"pref-{i}"])][LABEL_RACK] for i in range(3)} == {"r1"}, where  # r0 has 8 left
    assert [where[f"big-{i}"] for i in range(3)] == [None, None, None] and where["bad-0"] is None
    msgs = gangs.group_events("GangWaiting", "big")
    assert any(
        "topology-required nvidia.com/gpu.clique: no nvidia.com/gpu.clique domain takes 3" in m for m in msgs
    )
    assert any("topology-required nvidia.com/gpu.clique" in m for m in gangs.pod_messages("big-0"))
    (bad,) = gangs.group_events("InvalidGangTopology", "bad")[:1]
    assert "gpusched.io/topology-required: 'zone' is not one of the topology levels" in bad, bad
    assert any("'zone'" in m for m in gangs.pod_messages("bad-0")), gangs.pod_messages("bad-0")
