"""The Queue CRD's objects read into the core's queues, the tree of the valid ones (unknown parents
and cycles named by spec.parent), which queue a pod belongs to, and the status written back."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.core.model import PodSpec
from gpusched.core.queues.quota import QueueBook
from gpusched.core.queues.spec import InvalidQueue, Quota
from gpusched.core.queues.status import queue_statuses
from gpusched.core.queues.usage import charge_of
from gpusched.k8s.queues import Directory, queue_from_k8s, valid_tree
from gpusched.k8s.tenants import status_body


def queue(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def test_a_queue_object_reads_every_field() -> None:
    q = queue_from_k8s(
        queue(
            "a", parent="org", weight=3, nominalQuota={"gpus": 4, "gpuMilli": 4000, "gpuMemoryMiB": 65536},
            borrowingLimit={"gpus": 2}, lendingLimit={"gpus": 1},
            perModel=[{"model": "A100-SXM4-80GB", "nominalQuota": {"gpus": 2}}],
        )
    )  # fmt: skip
    assert (q.name, q.parent, q.weight) == ("a", "org", 3)
    assert q.nominal == Quota(4, 4000, 65536)
    assert q.borrowing_limit == Quota(gpus=2) and q.lending_limit == Quota(gpus=1)
    assert q.per_model == {"A100-SXM4-80GB": Quota(gpus=2)}
    assert queue_from_k8s(queue("b")).borrowing_limit is None  # absent: unlimited


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"nominalQuota": {"gpus": -1}}, "nominalQuota.gpus"),
        ({"borrowingLimit": {"gpuMilli": "x"}}, "borrowingLimit.gpu_milli"),
        ({"nominalQuota": {"cpu": 1}}, "nominalQuota: unknown field(s) cpu"),
        ({"perModel": [{"nominalQuota": {"gpus": 1}}]}, "perModel[0].model"),
        ({"weight": 0}, "weight"),
    ],
)
def test_bad_queues_are_refused_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidQueue, match=re.escape(field)):
        queue_from_k8s(queue("bad", **spec))


def test_unknown_parents_and_cycles_are_left_out_and_named() -> None:
    specs = {
        n: queue_from_k8s(queue(n, parent=p, nominalQuota={"gpus": 1}))
        for n, p in (("root", ""), ("a", "root"), ("x", "y"), ("y", "x"), ("under", "x"), ("lost", "nowhere"))
    }
    tree, bad = valid_tree(specs)
    assert sorted(tree.specs) == ["a", "root"]
    assert bad["x"] == "Queue x: spec.parent forms a cycle of parents (x -> y -> x)"
    assert "spec.parent" in bad["under"] and "cycle" in bad["under"]
    assert bad["lost"] == "Queue lost: spec.parent 'nowhere' is not a known Queue"


def test_a_pods_queue_annotation_wins_over_its_namespace() -> None:
    tree, bad = valid_tree({n: queue_from_k8s(queue(n)) for n in ("a", "b")})
    d = Directory(tree, bad, {"team-a": "a"})
    assert d.queue_of(PodSpec("p", namespace="team-a")) == ("a", "namespace team-a")
    assert d.queue_of(PodSpec("p", namespace="team-a", queue="b"))[0] == "b"
    assert d.queue_of(PodSpec("p", namespace="other")) == ("", "")
    assert d.problem("a", "x") == ""
    assert d.problem("nope", "annotation") == "queue 'nope' (annotation) is not a known Queue"


@given(used=st.lists(st.integers(0, 4), min_size=1, max_size=6))
def test_status_reports_usage_and_borrowing_as_the_book_has_it(used: list[int]) -> None:
    specs = {"org": queue_from_k8s(queue("org"))}
    specs |= {n: queue_from_k8s(queue(n, parent="org", nominalQuota={"gpus": 4})) for n in ("a", "b")}
    tree, _ = valid_tree(specs)
    book = QueueBook(tree)
    for i, n in enumerate(used):
        pod = PodSpec(f"p{i}", num_gpu=n, gpu_milli=1000) if n else PodSpec(f"p{i}")
        charge = charge_of(pod)
        if book.check("b", charge).ok:
            book.charge(pod.key, "b", charge)
    a, b, _org = queue_statuses(book, {"b": 1})  # by name
    body = status_body(b, 1, "")
    total = sum(usage.get("gpus") for _q, usage in book.charged.values())
    assert body["usage"].get("gpus", 0) == total <= 8
    assert body["borrowed"].get("gpus", 0) == max(0, total - 4)
    assert body["quota"] == {"gpus": 4} and body["pendingPods"] == 1
    assert body["conditions"][0]["status"] == "True"
    assert status_body(a, 1, "bad parent")["conditions"][0]["message"] == "bad parent"


class _Refusing:
    """A CustomObjectsApi whose Queue list answers with ``status`` (an ApiException-like error)."""

    def __init__(self, status: int) -> None:
        self.status = status

    def list_namespace(self, *args: Any, **kwargs: Any) -> Any:  # never reached: Queues answer first
        raise AssertionError("namespaces listed before Queues answered")

    def list_cluster_custom_object(self, *args: Any, **kwargs: Any) -> Any:
        err = RuntimeError(f"HTTP {self.status}")
        err.status = self.status  # type: ignore[attr-defined]
        raise err


@pytest.mark.parametrize(("status", "ready"), [(404, True), (403, True), (503, False)])
def test_the_scheduler_decides_only_once_the_queues_answered(status: int, ready: bool) -> None:
    """Not served (404) or not readable (403): pods are decided without queues. Any other answer
    (the apiserver busy): the scheduler waits, or a pod of a queue would be bound past its quota
    (the e2e's unknown-queue pod was bound when the first decision beat the first listing)."""
    import time

    from gpusched.k8s.queues import QueueDirectory

    d = QueueDirectory(_Refusing(status), _Refusing(status), probe_s=0.01)
    assert not d.ready()
    d.start()
    deadline = time.monotonic() + 2.0
    while not d.ready() and time.monotonic() < deadline:
        time.sleep(0.01)
    d.stop()
    assert d.ready() is ready
