"""Pod count and extended resources (device plugins' rdma/hca, MIG slices, ...): accounting,
filtering with kube-scheduler's reasons, and conversion from Kubernetes objects."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

import builders
from gpusched.core.cluster import AccountingError, ClusterState
from gpusched.core.model import InvalidSpec, PodSpec
from gpusched.core.policies import make_profile
from gpusched.core.scheduler import schedule_one
from gpusched.core.status import Code
from gpusched.k8s.convert import InvalidRequest, node_from_k8s, pod_from_k8s

MIG = "nvidia.com/mig-1g.10gb"


node = partial(builders.node, cpu=16_000)


def test_accounting_books_pods_and_extended_resources() -> None:
    snap = ClusterState([node("a", max_pods=2, extended={"rdma/hca": 1, MIG: 7}), node("b")])
    assert snap.ext_names == (MIG, "rdma/hca")
    p = PodSpec(name="p", cpu_milli=100, extended={MIG: 3, "rdma/hca": 1})
    snap.assume(p, 0, ())
    assert snap.ext_free[0].tolist() == [4, 0] and snap.pod_free[0] == 1
    with pytest.raises(AccountingError, match="node a: rdma/hca 0 free < 1"):
        snap.assume(PodSpec(name="q", extended={"rdma/hca": 1}), 0, ())
    with pytest.raises(AccountingError, match="node b: nic 0 free < 1"):
        snap.assume(PodSpec(name="q", extended={"nic": 1}), 1, ())
    snap.assume(PodSpec(name="r"), 0, ())
    with pytest.raises(AccountingError, match=r"node a: too many pods \(it takes 2\)"):
        snap.assume(PodSpec(name="s"), 0, ())
    copy = snap.copy()
    snap.forget("default/p")
    assert snap.ext_free[0].tolist() == [7, 1] and snap.pod_free[0] == 1
    assert copy.ext_free[0].tolist() == [4, 0]  # a copy keeps its own books
    assert snap.verify() == [] and copy.verify() == []


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_pods": -1}, "max_pods must be a non-negative integer"),
        ({"extended": {"rdma/hca": -1}}, "extended resource rdma/hca must be a non-negative integer"),
        ({"extended": {"": 1}}, "extended resource name '' is not a non-empty string"),
    ],
)
def test_invalid_specs_name_the_field(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidSpec, match=match):
        node("n", **kw)


def test_invalid_pod_extended_request() -> None:
    with pytest.raises(
        InvalidSpec, match="pod default/p: extended resource nic must be a non-negative integer"
    ):
        PodSpec(name="p", extended={"nic": 1.5})  # type: ignore[dict-item]


def test_filter_reasons_are_kube_schedulers() -> None:
    snap = ClusterState(
        [
            node("full", max_pods=1, extended={"rdma/hca": 1}),
            node("no-rdma"),
            node("used", extended={"rdma/hca": 1}),
            node("ok", extended={"rdma/hca": 2}),
        ]
    )
    snap.assume(PodSpec(name="x"), 0, ())
    snap.assume(PodSpec(name="y", extended={"rdma/hca": 1}), 2, ())
    pod = PodSpec(name="p", cpu_milli=100, extended={"rdma/hca": 2})
    r = schedule_one(make_profile("bestfit"), pod, snap.copy())
    assert r.node_name == "ok"
    snap.assume(PodSpec(name="z", extended={"rdma/hca": 1}), 3, ())
    r = schedule_one(make_profile("bestfit"), pod, snap)
    assert not r.scheduled
    assert r.status.message() == ("0/4 nodes are available: 1 Too many pods, 3 Insufficient rdma/hca.")
    codes = {f.node: f.code for f in r.diagnosis.failures} if r.diagnosis else {}
    # "ok" could take it after an eviction; the others could not even when empty
    assert codes == {
        "full": Code.UNSCHEDULABLE,
        "no-rdma": Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        "used": Code.UNSCHEDULABLE_AND_UNRESOLVABLE,
        "ok": Code.UNSCHEDULABLE,
    }


def test_conversion_from_kubernetes() -> None:
    n = node_from_k8s(
        {
            "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "A100-SXM4-80GB"}},
            "status": {
                "allocatable": {
                    "cpu": "64",
                    "memory": "512Gi",
                    "pods": "110",
                    "nvidia.com/gpu": "4",
                    "gpusched.io/gpu-milli": "4000",  # ours: not an extended resource
                    "ephemeral-storage": "100Gi",
                    "hugepages-2Mi": "0",
                    "rdma/hca": "8",
                    MIG: "7",
                }
            },
        }
    )
    assert n.max_pods == 110
    assert dict(n.extended) == {"rdma/hca": 8, MIG: 7, "ephemeral-storage": 102_400, "hugepages-2Mi": 0}

    def pod(res: dict[str, str]) -> dict[str, Any]:
        return {
            "metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": res}}]},
        }

    p = pod_from_k8s(
        pod({"cpu": "1", MIG: "2", "rdma/hca": "1", "ephemeral-storage": "1Gi", "example.com/x": "0"})
    )
    assert dict(p.extended) == {MIG: 2, "rdma/hca": 1, "ephemeral-storage": 1024}
    # bytes are booked in MiB: a request rounds up, allocatable rounds down
    assert dict(pod_from_k8s(pod({"ephemeral-storage": "1M"})).extended) == {"ephemeral-storage": 1}
    assert p.num_gpu == 0  # a MIG slice is its own resource, not a whole GPU
    with pytest.raises(InvalidRequest, match=r"pod default/p rdma/hca: 0\.5 must be a whole number"):
        pod_from_k8s(pod({"rdma/hca": "500m"}))
    with pytest.raises(InvalidRequest, match="node n allocatable pods: 'many' is not a Kubernetes quantity"):
        node_from_k8s({"metadata": {"name": "n"}, "status": {"allocatable": {"pods": "many"}}})
