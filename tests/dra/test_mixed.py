"""Mixed nodes (k8s/dra/mixed.py): GPUs a DRA driver publishes and gpusched's agent also serves through
its device plugin. GPUs that claims hold there are booked as taken in the device-plugin GPU books
(``NodeSpec.claimed_gpus``), each once, and a device-plugin pod never gets one."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from k8s_objects import DRIVER, claim, device_class, gpu_device, gpu_slice, whole

from builders import k8s_node, k8s_pod
from gpusched.core.devices import pick_gpus
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.model import PodSpec
from gpusched.doctor import Books, doctor_cluster, doctor_pod
from gpusched.doctor.snapshot import Snapshot, parse_snapshot
from gpusched.k8s.convert import pod_from_k8s
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.dra.mixed import (
    MixedNodes,
    SliceIndex,
    claimed_gpus,
    describe,
    held_devices,
    shared_gpus,
)
from gpusched.k8s.state import LiveCluster

NODE = "node-a"


def uuid(i: int) -> str:
    return f"GPU-{i:08d}-0000-0000-0000-000000000000"


def agent_node(n: int, name: str = NODE) -> dict[str, Any]:
    """A node served by gpusched's agent: nvidia.com/gpu and the topology annotation with UUIDs."""
    obj = k8s_node(name, n)
    topo = {"gpus": [{"index": i, "uuid": uuid(i), "numa": None, "nvlink": []} for i in range(n)]}
    obj["metadata"]["annotations"] = {"gpusched.io/gpu-topology": json.dumps(topo)}
    return obj


def dra_gpu(i: int) -> dict[str, Any]:
    d = gpu_device(i)
    d["attributes"]["uuid"] = {"string": uuid(i)}
    return d


def held(name: str, *devices: str, shared: bool = False) -> dict[str, Any]:
    """A claim allocated (by someone else: kube-scheduler) to ``devices`` of NODE's pool."""
    results = []
    for d in devices:
        r: dict[str, Any] = {"request": "gpu", "driver": DRIVER, "pool": NODE, "device": d}
        if shared:
            r |= {"shareID": f"{name}-{d}", "consumedCapacity": {"memory": "10Gi"}}
        results.append(r)
    return claim(name, [whole()], allocation={"devices": {"results": results}})


def setup(n: int, published: range | list[int] | None = None) -> tuple[DraBooks, LiveCluster, MixedNodes]:
    books = DraBooks(CelCompiler())
    books.upsert_class(device_class("gpu"))
    books.upsert_slice(gpu_slice(NODE, [dra_gpu(i) for i in (range(n) if published is None else published)]))
    lc = LiveCluster()
    mixed = MixedNodes(books, lc)
    lc.upsert_node(agent_node(n))
    return books, lc, mixed


def one_gpu_pod(name: str) -> PodSpec:
    return pod_from_k8s(k8s_pod(name, {"nvidia.com/gpu": "1"}))


def place_all(lc: LiveCluster, n: int) -> list[int]:
    """Place one-GPU pods on NODE until none fits; the GPUs they got."""
    got = []
    with lc.live_books() as live:
        snap = live.copy()  # the live books stay as they are
        for k in range(n + 1):
            p = one_gpu_pod(f"p{k}")
            try:
                gpus = pick_gpus(snap, p, 0)
            except ValueError:
                break
            snap.assume(p, 0, gpus)
            got.extend(gpus)
    return got


def test_a_gpu_a_claim_holds_is_never_given_to_a_device_plugin_pod() -> None:
    books, lc, mixed = setup(4)
    books.upsert_claim(held("c1", "gpu-1"))
    mixed.refresh()
    with lc.live_books() as snap:
        assert snap.nodes[0].claimed_gpus == frozenset({1})
    assert sorted(place_all(lc, 4)) == [0, 2, 3]
    books.delete_claim(held("c1", "gpu-1"))  # deallocated: the GPU takes pods again
    mixed.refresh()
    assert sorted(place_all(lc, 4)) == [0, 1, 2, 3]


def test_a_node_seen_after_the_claims_gets_them_at_once() -> None:
    books = DraBooks(CelCompiler())
    books.upsert_slice(gpu_slice(NODE, [dra_gpu(i) for i in range(2)]))
    books.upsert_claim(held("c1", "gpu-0"))
    lc = LiveCluster()
    MixedNodes(books, lc)
    lc.upsert_node(agent_node(2))  # no DRA event after it
    assert place_all(lc, 2) == [1]


def test_describe_names_the_node_the_gpus_and_what_gpusched_does() -> None:
    books, _, mixed = setup(3)
    books.upsert_claim(held("c1", "gpu-2"))
    (line,) = describe(mixed.shared())
    assert line.startswith(f"node {NODE}: GPU(s) 0, 1, 2 are served both by gpusched's agent")
    assert f"DRA driver {DRIVER}" in line and "GPU(s) 2 held by ResourceClaims are booked as taken" in line


def test_a_node_without_the_agents_uuids_or_a_slice_is_not_mixed() -> None:
    books, lc, mixed = setup(2, published=[])
    books.upsert_slice(
        {**gpu_slice("other", [gpu_device(0)]), "metadata": {"name": "other-gpu"}}
    )  # no uuid attribute
    mixed.refresh()
    assert mixed.shared() == {}
    assert place_all(lc, 2) == [0, 1]


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 8),
    data=st.data(),
)
def test_claimed_gpus_are_subtracted_exactly_once(n: int, data: st.DataObject) -> None:
    """Whatever claims hold (one GPU by several shares, several GPUs by one claim, GPUs the slice does
    not publish), the GPUs withheld are exactly the published ones some claim holds, each once, and
    the device-plugin pods get every other GPU and none of those."""
    published = data.draw(st.lists(st.integers(0, n - 1), unique=True), label="published")
    books, lc, mixed = setup(n, published)
    claims = data.draw(
        st.lists(
            st.tuples(st.lists(st.integers(0, n - 1), min_size=1, max_size=3, unique=True), st.booleans()),
            max_size=6,
        ),
        label="claims",
    )
    taken: set[int] = set()
    for k, (gpus, shared) in enumerate(claims):
        gpus = [g for g in gpus if g in published] or [g for g in gpus if not shared and g not in taken]
        if not shared and any(g in taken for g in gpus):
            continue  # an exclusive device is held by one claim only (the API's allocator sees to it)
        books.upsert_claim(held(f"c{k}", *(f"gpu-{g}" for g in gpus), shared=shared))
        taken |= {g for g in gpus if g in published}
    mixed.refresh()
    with lc.live_books() as snap:
        assert snap.nodes[0].claimed_gpus == frozenset(taken)
        assert snap.verify() == []
    got = place_all(lc, n)
    assert sorted(got) == [g for g in range(n) if g not in taken]


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["claim", "share", "delete", "slice"]),
            st.integers(0, 5),  # which claim
            st.integers(0, 1),  # which node
            st.lists(st.integers(0, 3), min_size=1, max_size=2, unique=True),
        ),
        max_size=12,
    )
)
def test_refreshing_after_each_change_books_what_a_fresh_pass_finds(
    ops: list[tuple[str, int, int, list[int]]],
) -> None:
    """Claims allocated, shared, deallocated and slices republished on two mixed nodes, a refresh
    after each change (the incremental path while only claims change): the claimed GPUs in the
    books are always what a pass from scratch over the same objects finds."""
    books = DraBooks(CelCompiler())
    lc = LiveCluster()
    mixed = MixedNodes(books, lc)
    nodes = ["node-a", "node-b"]
    for j, name in enumerate(nodes):
        obj = agent_node(4, name)
        topo = {
            "gpus": [{"index": i, "uuid": f"{uuid(i)}-{j}", "numa": None, "nvlink": []} for i in range(4)]
        }
        obj["metadata"]["annotations"]["gpusched.io/gpu-topology"] = json.dumps(topo)
        lc.upsert_node(obj)

    def publish(j: int, generation: int) -> None:
        devs = [dra_gpu(i) for i in range(4)]
        for i, d in enumerate(devs):
            d["attributes"]["uuid"] = {"string": f"{uuid(i)}-{j}"}
        sl = gpu_slice(nodes[j], devs)
        sl["spec"]["pool"]["generation"] = generation
        books.upsert_slice(sl)

    for j in range(2):
        publish(j, 1)
    mixed.refresh()
    holder: dict[int, dict[str, Any]] = {}
    for step, (op, k, j, gpus) in enumerate(ops):
        if op == "delete":
            if k in holder:
                books.delete_claim(holder.pop(k))
        elif op == "slice":
            publish(j, step + 2)
        else:
            results = [
                {"request": "gpu", "driver": DRIVER, "pool": nodes[j], "device": f"gpu-{g}"}
                | (
                    {"shareID": f"s{step}-{g}", "consumedCapacity": {"memory": "1Gi"}}
                    if op == "share"
                    else {}
                )
                for g in gpus
            ]
            holder[k] = claim(f"c{k}", [whole()], allocation={"devices": {"results": results}})
            books.upsert_claim(holder[k])
        mixed.refresh()
        want = claimed_gpus(
            shared_gpus(SliceIndex.of(books.slices()), held_devices(books.allocated()), lc.gpu_uuids())
        )
        with lc.live_books() as snap:
            got = {nd.name: nd.claimed_gpus for nd in snap.nodes if nd.claimed_gpus}
        assert got == want


# ------------------------------------------------------------------ doctor
def mixed_snapshot(pods: list[dict[str, Any]]) -> Snapshot:
    return Snapshot(
        [agent_node(2)],
        pods,
        "test",
        dra={
            "deviceClasses": [device_class("gpu")],
            "resourceSlices": [gpu_slice(NODE, [dra_gpu(i) for i in range(2)])],
            "resourceClaims": [held("c1", "gpu-0")],
        },
    )


def test_doctor_names_the_mixed_node_and_explains_a_pod_waiting_for_a_claimed_gpu() -> None:
    two = k8s_pod("two", {"nvidia.com/gpu": "2"})
    b = Books.of(parse_snapshot(json.loads(json.dumps(mixed_snapshot([two]).to_json()))))  # a saved one
    (f,) = [f for f in doctor_cluster(b).findings if f.code == "dra-mixed-node"]
    assert f.subject == NODE and f.evidence["claimed"] == [0] and f.evidence["gpus"] == [0, 1]
    assert "GPU(s) 0 held by ResourceClaims are booked as taken" in f.message
    r = doctor_pod(b, "default/two")
    cf = r.counterfactuals[0]
    assert cf.kind == "claimed-gpu" and cf.node == NODE and cf.change["claimed"] == [0]


def test_doctor_diagnoses_a_claim_pod_with_the_schedulers_plugin() -> None:
    """A pending claim pod: its claims resolved against the snapshot's DRA objects, as the scheduler
    resolves them, and diagnosed with its DynamicResources plugin: no GPU claim on the mixed node
    (its event's reason), a claim for two GPUs nowhere, a claim not created yet named. The counter-
    factuals are the other pods': a DRA-only node with a free GPU and a taint gives the toleration."""
    snap = mixed_snapshot([])
    claims = [
        claim("want-two", [whole(count=2)], ns="default"),
        claim("want-one", [whole(count=1)], ns="default"),
    ]
    pods = []
    for name in ("want-two", "want-one", "missing"):
        p = k8s_pod(name, {"cpu": "1"})
        p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": name}]
        pods.append(p)
    dra_only = k8s_node(
        "node-b", 0, spec={"taints": [{"key": "dra", "value": "only", "effect": "NoSchedule"}]}
    )
    other = {**gpu_slice("node-b", [gpu_device(0)]), "metadata": {"name": "node-b-gpu"}}
    snap = type(snap)(
        [*snap.nodes, dra_only],
        pods,
        "test",
        dra={
            **snap.dra,
            "resourceSlices": [*snap.dra["resourceSlices"], other],
            "resourceClaims": [*snap.dra["resourceClaims"], *claims],
        },
    )
    b = Books.of(snap)
    r = doctor_pod(b, "default/want-two")
    assert "cannot allocate all claims" in r.summary and "not together" in r.summary
    r = doctor_pod(b, "default/want-one")
    assert "also serves GPUs through the device plugin" in r.summary
    cf = r.counterfactuals[0]
    assert cf.kind == "toleration" and cf.node == "node-b"
    r = doctor_pod(b, "default/missing")
    assert {f.code for f in r.findings} == {"claims-waiting"} and "missing" in r.summary


def test_a_node_without_the_agents_uuids_beside_a_gpu_driver_is_refused_in_the_books_and_doctor(
    caplog: Any,
) -> None:
    """nvidia.com/gpu from a device plugin that does not publish UUIDs (NVIDIA's) and a GPU DRA driver's
    slice on the same node: the claimed GPUs cannot be matched, so gpusched withholds every GPU there,
    says so once (an error at start), and doctor names it; a node without a slice is untouched."""
    books = DraBooks(CelCompiler())
    books.upsert_slice(gpu_slice(NODE, [gpu_device(i) for i in range(2)]))  # no uuid attribute
    lc = LiveCluster()
    mixed = MixedNodes(books, lc)
    lc.upsert_node(k8s_node(NODE, 2))  # no gpusched.io/gpu-topology
    lc.upsert_node(k8s_node("plain", 2))
    assert place_all(lc, 2) == []
    with lc.live_books() as snap:
        assert snap.nodes[snap.index["plain"]].claimed_gpus == frozenset()
    mixed.refresh()
    mixed.refresh()
    (line,) = [r.message for r in caplog.records if r.levelname == "ERROR"]
    assert line.startswith(f"node {NODE}: serves 2 nvidia.com/gpu without gpusched's agent's GPU UUIDs")
    assert "refuses the combination" in line
    b = Books.of(
        Snapshot(
            [k8s_node(NODE, 2), k8s_node("plain", 2)],
            [],
            "test",
            dra={"resourceSlices": [gpu_slice(NODE, [gpu_device(0)])]},
        )
    )
    refused = [f for f in doctor_cluster(b).findings if f.code == "dra-mixed-refused"]
    assert [(f.subject, f.severity) for f in refused] == [(NODE, "error")]
