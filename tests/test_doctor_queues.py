"""``gpusched doctor`` and tenant queues: the ``queue`` finding (usage against quota, borrowing,
admission as the core's ``QueueBook.check`` answers it), the ``quota`` counterfactual (the least
raise of the queue's quota, applied here to the Queue object and checked again), unknown and
invalid queues, the cluster's per-queue lines, and snapshots with and without Queues."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from builders import node, whole
from gpusched.bench.reclaim import queue_body
from gpusched.core.cluster import ClusterState
from gpusched.core.model import PodSpec
from gpusched.core.queues import QueueBook, QueueSpec, QueueTree, Quota, ResourceKey, Usage
from gpusched.doctor import Books, doctor_cluster, doctor_pod, snapshot_of_state
from gpusched.doctor.errors import SnapshotError
from gpusched.doctor.queues import finishing, headroom, quota_change
from gpusched.doctor.snapshot import Snapshot, load_snapshot, write_snapshot

GPUS = ResourceKey("", "gpus")


def snap_with(
    st: ClusterState,
    pending: list[PodSpec],
    queues: list[dict[str, Any]] | None,
    namespaces: list[dict[str, Any]] = (),  # type: ignore[assignment]
) -> Snapshot:
    return replace(snapshot_of_state(st, pending), queues=queues, namespaces=list(namespaces))


def one_running(queue: str = "a", gpus: int = 4) -> ClusterState:
    st = ClusterState([node("n", gpus)])
    st.assume(whole("w", queue=queue), 0, [0])
    return st


def finding(report: Any, code: str) -> Any:
    (f,) = [f for f in report.findings if f.code == code]
    return f


def apply_patch(queues: list[dict[str, Any]], name: str, patch: dict[str, Any]) -> list[dict[str, Any]]:
    """The merge patch of a Queue's spec, as ``kubectl patch --type merge`` applies it."""
    out = []
    for q in queues:
        if q["metadata"]["name"] == name:
            q = {**q, "spec": {**q["spec"], **patch["spec"]}}
        out.append(q)
    return out


def test_queue_at_quota_is_named_and_the_raise_it_names_admits_the_pod() -> None:
    queues = [queue_body("a", 1)]
    b = Books.of(snap_with(one_running(), [whole("p", queue="a")], queues))
    r = doctor_pod(b, "default/p")
    f = finding(r, "queue")
    assert f.severity == "error" and not f.evidence["admits"]
    assert "queue a (root): gpus would be 2 of 1" in f.message and r.summary == f.message
    assert f.evidence["keys"] == [
        {"key": "gpus", "used": 1, "quota": 1, "borrowed": 0, "borrowing_limit": 0, "own_left": 0,
         "cohort_idle": 0}
    ]  # fmt: skip
    cf = r.counterfactuals[0]
    assert cf.kind == "quota" and cf.verified and cf.node == "n" and len(r.counterfactuals) == 1
    assert cf.message.startswith("waits for quota in queue a: needs 1 more GPU(s) (used 1 of quota 1")
    assert cf.change["raises"] == [{"key": "gpus", "by": 1, "field": "spec.nominalQuota.gpus", "to": 2}]
    assert (
        cf.change["or_finish"] == ["default/w"]
        and "(or once 1 pod(s) of the queue finish: default/w)" in cf.message
    )
    # applied to the Queue object: the queue admits it and it fits now
    after = Books.of(
        snap_with(one_running(), [whole("p", queue="a")], apply_patch(queues, "a", cf.change["patch"]))
    )
    r2 = doctor_pod(after, "default/p")
    assert finding(r2, "queue").evidence["admits"] and r2.counterfactuals[0].kind == "fits-now"


def test_borrowing_from_the_cohort_admits_and_names_no_quota_cause() -> None:
    queues = [queue_body("org", 0), queue_body("a", 1, parent="org"), queue_body("b", 2, parent="org")]
    b = Books.of(snap_with(one_running(), [whole("p", queue="a")], queues))
    r = doctor_pod(b, "default/p")
    f = finding(r, "queue")
    assert f.severity == "ok" and f.evidence["admits"] and "admits the pod now" in f.message
    (k,) = f.evidence["keys"]
    assert (k["used"], k["quota"], k["own_left"], k["cohort_idle"], k["borrowing_limit"]) == (
        1,
        1,
        0,
        2,
        None,
    )
    assert "error" not in {x.severity for x in r.findings}
    assert [c.kind for c in r.counterfactuals] == ["fits-now"]


def test_a_borrowing_limit_refuses_and_the_least_raise_is_named() -> None:
    queues = [
        queue_body("org", 0),
        queue_body("a", 1, parent="org", borrowingLimit={"gpus": 0}),
        queue_body("b", 2, parent="org"),
    ]
    b = Books.of(snap_with(one_running(), [whole("p", 2, queue="a")], queues))
    r = doctor_pod(b, "default/p")
    assert "over its borrowingLimit 0" in finding(r, "queue").message
    cf = r.counterfactuals[0]
    assert cf.kind == "quota" and cf.verified and cf.change["raises"][0]["by"] == 2
    assert "borrowing limit 0, cohort idle 0" in cf.message


def test_a_queue_within_its_quota_is_told_the_scheduler_reclaims_from_borrowers() -> None:
    st = ClusterState([node("n", 4)])
    for i in range(4):  # b holds all four GPUs: two of them borrowed from a
        st.assume(whole(f"b{i}", queue="b", priority=i), 0, [i])
    queues = [queue_body("org", 0), queue_body("a", 2, parent="org"), queue_body("b", 2, parent="org")]
    r = doctor_pod(Books.of(snap_with(st, [whole("p", queue="a")], queues)), "default/p")
    f = finding(r, "queue")
    assert not f.evidence["admits"] and f.evidence["reclaim"] == ["default/b0"]  # the lowest priority
    assert "so the scheduler reclaims it: evicts 1 pod(s) of borrowing queues (default/b0)" in f.message


def test_unknown_and_invalid_queues_are_named_and_make_the_pod_wait() -> None:
    queues = [queue_body("x", 1, parent="y"), queue_body("y", 1, parent="x")]
    b = Books.of(snap_with(one_running("z"), [whole("p", queue="nope"), whole("q", queue="x")], queues))
    r = doctor_pod(b, "default/p")
    f = finding(r, "queue-unknown")
    assert "queue 'nope' (annotation gpusched.io/queue of pod default/p) is not a known Queue" in f.message
    assert "the scheduler makes the pod wait" in f.message
    assert r.counterfactuals[0].kind == "queue" and not r.counterfactuals[0].verified
    r = doctor_pod(b, "default/q")
    assert "spec.parent forms a cycle of parents" in finding(r, "queue-invalid").message


def test_quota_and_placement_both_named_quota_first() -> None:
    st = ClusterState([node("n", 2)])
    st.assume(whole("w", queue="a"), 0, [0])
    b = Books.of(snap_with(st, [whole("p", 2, queue="a")], [queue_body("a", 1)]))
    r = doctor_pod(b, "default/p")
    errors = [f.code for f in r.findings if f.severity == "error"]
    assert errors[0] == "queue" and "unschedulable" in errors
    kinds = [c.kind for c in r.counterfactuals]
    assert (
        kinds[0] == "quota"
        and len(kinds) > 1
        and "does not fit on any node now" in r.counterfactuals[0].message
    )


def test_per_model_quota_refuses_on_the_model_the_pod_would_land_on() -> None:
    st = ClusterState([node("n", 4, model="A100")])
    st.assume(whole("w", queue="a"), 0, [0])
    queues = [queue_body("a", 8, perModel=[{"model": "A100", "nominalQuota": {"gpus": 1}}])]
    r = doctor_pod(Books.of(snap_with(st, [whole("p", queue="a")], queues)), "default/p")
    f = finding(r, "queue")
    assert (
        not f.evidence["admits"]
        and f.evidence["model"] == "A100"
        and "gpus[A100] would be 2 of 1" in f.message
    )
    cf = r.counterfactuals[0]
    assert cf.change["raises"] == [
        {"key": "gpus[A100]", "by": 1, "field": "spec.perModel[A100].nominalQuota.gpus", "to": 2}
    ]
    fixed = apply_patch(queues, "a", cf.change["patch"])
    assert finding(
        doctor_pod(Books.of(snap_with(st, [whole("p", queue="a")], fixed)), "default/p"), "queue"
    ).evidence["admits"]


def test_a_gang_member_is_told_its_gang_is_admitted_as_a_unit() -> None:
    b = Books.of(snap_with(one_running(), [whole("p", queue="a", gang="g")], [queue_body("a", 1)]))
    assert (
        "member of gang g: the scheduler admits the gang's members as one unit"
        in finding(doctor_pod(b, "default/p"), "queue").message
    )


def test_namespace_label_puts_pods_in_a_queue() -> None:
    ns = [{"metadata": {"name": "team", "labels": {"gpusched.io/queue": "a"}}}]
    st = ClusterState([node("n", 4)])
    st.assume(whole("w", namespace="team"), 0, [0])
    b = Books.of(snap_with(st, [whole("p", namespace="team")], [queue_body("a", 1)], ns))
    f = finding(doctor_pod(b, "team/p"), "queue")
    assert f.evidence["source"] == "namespace team" and not f.evidence["admits"]


def test_cluster_report_names_pods_waiting_for_quota_and_a_line_per_queue() -> None:
    queues = [queue_body("a", 1), queue_body("x", 1, parent="gone")]
    b = Books.of(snap_with(one_running(), [whole("p", queue="a"), whole("p2", queue="a")], queues))
    c = doctor_cluster(b)
    assert dict(c.top_reasons)["waits for quota in queue a"] == 2
    rows = {q["queue"]: q for q in c.queues}
    assert (
        rows["a"]["usage"] == {"gpus": 1} and rows["a"]["quota"] == {"gpus": 1} and rows["a"]["pending"] == 2
    )
    assert "spec.parent 'gone' is not a known Queue" in rows["x"]["invalid"]
    assert [f.subject for f in c.findings if f.code == "queue-invalid"] == ["x"]
    assert c.to_dict()["queues"] == list(c.queues)


def test_snapshot_round_trip_keeps_queues_and_namespaces(tmp_path: Any) -> None:
    ns = [{"metadata": {"name": "team", "labels": {"gpusched.io/queue": "a"}, "uid": "u"}}]
    snap = snap_with(one_running(), [whole("p", queue="a")], [queue_body("a", 1)], ns)
    path = write_snapshot(tmp_path / "s.json", snap)
    back = load_snapshot(path)
    assert back.queues == [queue_body("a", 1)]
    assert back.namespaces == [{"metadata": {"name": "team", "labels": {"gpusched.io/queue": "a"}}}]
    assert finding(doctor_pod(Books.of(back), "default/p"), "queue").severity == "error"


def test_old_snapshot_without_queues_loads_and_ignores_queues(tmp_path: Any) -> None:
    data = snapshot_of_state(one_running(), [whole("p", queue="a")]).to_json()
    assert "queues" not in data
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    b = Books.of(load_snapshot(path))
    assert b.queues is None
    r = doctor_pod(b, "default/p")
    assert "does not serve Queues" in finding(r, "queue").message
    assert [c.kind for c in r.counterfactuals] == ["fits-now"]


@pytest.mark.parametrize(
    ("queues", "match"),
    [({}, "'queues' must be a list of queue objects"), ([{"spec": {}}], r"queues\[0\] has no metadata.name"),
     ([{"metadata": {"name": "a"}, "spec": 3}], r"queues\[0\] \(a\): spec must be an object")],
)  # fmt: skip
def test_malformed_queue_entry_is_a_snapshot_error(tmp_path: Any, queues: Any, match: str) -> None:
    data = snapshot_of_state(one_running(), []).to_json()
    p = tmp_path / "s.json"
    p.write_text(json.dumps({**data, "queues": queues}))
    with pytest.raises(SnapshotError, match=match):
        load_snapshot(p)


def test_command_line_quota_text_and_a_malformed_queue_exits_2(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from gpusched.cli.doctor import kubectl_app

    snap = snap_with(one_running(), [whole("p", queue="a")], [queue_body("a", 1)])
    good = write_snapshot(tmp_path / "good.json", snap)
    r = CliRunner().invoke(kubectl_app(), ["doctor", "pod", "default/p", "--snapshot", str(good)])
    assert r.exit_code == 0 and "waits for quota in queue a: needs 1 more GPU(s)" in r.stdout
    r = CliRunner().invoke(kubectl_app(), ["doctor", "cluster", "--snapshot", str(good)])
    assert r.exit_code == 0 and "Tenant queues" in r.stdout and "gpus 1/1" in r.stdout
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**snap.to_json(), "queues": [{"metadata": {}}]}))
    r = CliRunner().invoke(kubectl_app(), ["doctor", "pod", "default/p", "--snapshot", str(bad)])
    assert r.exit_code == 2 and "queues[0] has no metadata.name" in r.stderr


# ----------------------------------------------------------------------- properties
@st.composite
def books(draw: st.DrawFn) -> tuple[QueueBook, str]:
    """A root with 1..3 leaves (quotas, borrowing and lending limits), some pods charged."""
    n = draw(st.integers(1, 3))
    lim = st.none() | st.integers(0, 4)
    specs = [QueueSpec("root", nominal=Quota(gpus=draw(st.integers(0, 4))))]
    for i in range(n):
        bl, ll = draw(lim), draw(lim)
        specs.append(
            QueueSpec(
                f"q{i}",
                parent="root",
                nominal=Quota(gpus=draw(st.integers(0, 6))),
                borrowing_limit=None if bl is None else Quota(gpus=bl),
                lending_limit=None if ll is None else Quota(gpus=ll),
            )
        )
    book = QueueBook(QueueTree(specs))
    for j in range(draw(st.integers(0, 8))):
        q = f"q{draw(st.integers(0, n - 1))}"
        u = Usage({GPUS: draw(st.integers(1, 3))})
        if book.check(q, u).ok:
            book.charge(f"p{j}", q, u)
    return book, f"q{draw(st.integers(0, n - 1))}"


@settings(max_examples=200, deadline=None)
@given(books(), st.integers(1, 6))
def test_headroom_and_the_least_raise_agree_with_the_core(drawn: tuple[QueueBook, str], want: int) -> None:
    book, q = drawn
    room = headroom(book, q, GPUS)
    assert book.check(q, Usage({GPUS: room})).ok or room == 0
    assert not book.check(q, Usage({GPUS: room + 1})).ok
    charge = Usage({GPUS: want})
    change = quota_change(book, q, charge)
    assert change.verified
    by = change.raises.get(GPUS, 0)
    assert (by == 0) == book.check(q, charge).ok
    gone = finishing(book, q, charge)
    if gone:  # they finishing admits it; any one of them spared does not
        trial = book.copy()
        for k in gone:
            trial.release(k)
        assert trial.check(q, charge).ok
        for k in gone:
            trial.charge(k, *book.charged[k])
            assert not trial.check(q, charge).ok
            trial.release(k)
    if by > 1:  # the least: one less is refused
        from gpusched.doctor.queues import _raised, rebooked

        less = rebooked(book, {**book.tree.specs, q: _raised(book.tree.specs[q], GPUS, by - 1)})
        assert not less.check(q, charge).ok


def test_queue_bench_runs_both_sides_and_the_pod_waits_for_quota() -> None:
    from gpusched.doctor.bench import bench_doctor_queues

    r = bench_doctor_queues(20, repeat=1)
    assert set(r["cpu_seconds"]) == {"none", "queues"} and set(r["ratio"]) == {"books", "doctor pod"}
    assert r["counterfactual"].startswith("waits for quota in queue a: needs 1000 more milli-GPU")


@pytest.mark.parametrize(("status", "served"), [(404, False), (403, False), (500, True)])
def test_queues_from_the_api_absent_forbidden_or_failing(monkeypatch: Any, status: int, served: bool) -> None:
    """404: the CRD is not served (no queues); 403: named as unreadable; anything else propagates."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from gpusched.doctor.source import _queues

    class Refusing:
        def __init__(self, api: Any) -> None:
            pass

        def list_cluster_custom_object(self, *a: Any, **kw: Any) -> Any:
            raise ApiException(status=status, reason="Nope")

    monkeypatch.setattr(client, "CustomObjectsApi", Refusing)
    if served:
        with pytest.raises(ApiException):
            _queues(None, 1.0)
        return
    queues, namespaces, why = _queues(None, 1.0)
    assert queues is None and namespaces == []
    assert why == ("" if status == 404 else "listing Queues or Namespaces: 403 Nope")


def test_unreadable_queues_are_named_not_taken_for_absent(tmp_path: Any) -> None:
    snap = replace(snap_with(one_running(), [whole("p", queue="a")], None), queues_unreadable="403 Forbidden")
    back = load_snapshot(write_snapshot(tmp_path / "s.json", snap))
    b = Books.of(back)
    f = finding(doctor_pod(b, "default/p"), "queue")
    assert f.severity == "warn" and "refused doctor the Queues (403 Forbidden)" in f.message
    assert "queues-unreadable" in {x.code for x in doctor_cluster(b).findings}
