"""The report and plan of ``bench k8s --compare`` (no control plane)."""

from __future__ import annotations

import pytest

from gpusched.bench.k8s_compare import (
    CASES,
    EXTENDER,
    KUBE,
    KUBE_DEFAULT,
    STANDALONE,
    CaseResult,
    CompareConfig,
    CompareReport,
    _overbooked,
    plan,
    slug,
)
from gpusched.bench.k8s_standalone import settled
from gpusched.core.errors import GpuschedError


def test_variant_cases_get_dns_label_names() -> None:
    assert slug("standalone@base") == "standalone-at-base"
    assert plan((STANDALONE,), ["base"]) == [(STANDALONE, 1), ("standalone@base", 1)]


def test_a_variant_runs_each_varied_front_end_that_runs_right_after_it() -> None:
    assert plan((KUBE, EXTENDER), ["base"]) == [(KUBE, 1), (EXTENDER, 1), ("extender@base", 1), (KUBE, 2)]
    assert plan((STANDALONE, EXTENDER), ["a", "b"]) == [
        (STANDALONE, 1), ("standalone@a", 1), ("standalone@b", 1),
        (EXTENDER, 1), ("extender@a", 1), ("extender@b", 1),
    ]  # fmt: skip
    assert plan((KUBE,), ["base"]) == [(KUBE, 1), (KUBE, 2)]


def test_kube_scheduler_runs_first_and_last() -> None:
    assert plan(CASES) == [(KUBE, 1), *((c, 1) for c in CASES[1:]), (KUBE, 2)]
    assert plan((EXTENDER,)) == [(EXTENDER, 1)]
    assert plan((EXTENDER, KUBE)) == [(KUBE, 1), (EXTENDER, 1), (KUBE, 2)]


def test_rounds_repeat_every_case_with_kube_scheduler_between_them() -> None:
    assert plan((KUBE, EXTENDER), rounds=2) == [(KUBE, 1), (EXTENDER, 1), (KUBE, 2), (EXTENDER, 2), (KUBE, 3)]
    two = [(EXTENDER, 1), ("extender@a", 1), (EXTENDER, 2), ("extender@a", 2)]
    assert plan((EXTENDER,), ["a"], rounds=2) == two
    runs = plan(CASES, rounds=3)
    assert [r for c, r in runs if c == KUBE] == [1, 2, 3, 4]
    assert [r for c, r in runs if c == EXTENDER] == [1, 2, 3]
    assert [r for c, r in runs if c == KUBE_DEFAULT] == [1]  # a reference that takes a minute: once
    assert plan(CASES, rounds=1) == plan(CASES)


def test_with_rounds_each_case_is_reported_by_its_best_run() -> None:
    r = CompareReport(CompareConfig(only=(KUBE, EXTENDER), rounds=2))
    r.cases = [
        CaseResult(KUBE, 1, 100, 100, 100.0, 1.0, latency_p99_ms=200.0),
        CaseResult(EXTENDER, 1, 100, 100, 60.0, 1.0, latency_p99_ms=150.0),
        CaseResult(KUBE, 2, 100, 100, 90.0, 1.0, latency_p99_ms=100.0),
        CaseResult(EXTENDER, 2, 100, 100, 85.0, 1.0, latency_p99_ms=250.0),
        CaseResult(KUBE, 3, 100, 100, 80.0, 1.0, latency_p99_ms=300.0),
    ]
    d = r.to_dict()
    assert d["rounds"] == 2
    assert d["runs_pods_per_s"][EXTENDER] == [60.0, 85.0]
    assert d["runs_pods_per_s"][KUBE] == [100.0, 90.0, 80.0]
    assert d["extender_pods_per_s"] == 85.0 and d["extender_ratio"] == 0.85  # best against best
    assert d["kube_scheduler_p99_ms"] == 100.0  # the lowest of each case's runs
    assert d["latency_p99_ms"][EXTENDER] == 150.0
    assert d["extender_p99_latency_ratio"] == 1.5


def test_ratios_are_against_kube_schedulers_best_run() -> None:
    r = CompareReport(CompareConfig(only=(KUBE, STANDALONE, EXTENDER)))
    r.cases = [
        CaseResult(KUBE, 1, 100, 100, 50.0, 2.0, latency_p99_ms=300.0),
        CaseResult(STANDALONE, 1, 100, 100, 120.0, 1.0, latency_p99_ms=150.0),
        CaseResult(EXTENDER, 1, 100, 100, 80.0, 1.0, latency_p99_ms=600.0),
        CaseResult(KUBE, 2, 100, 100, 100.0, 1.0, latency_p99_ms=200.0),
    ]
    d = r.to_dict()
    assert d["kube_scheduler_pods_per_s"] == 100.0
    assert d["kube_scheduler_runs_pods_per_s"] == [50.0, 100.0]
    assert d["standalone_ratio"] == 1.2
    assert d["extender_ratio"] == 0.8
    assert d["standalone_shares_ratio"] is None and d["standalone_shares_pods_per_s"] is None
    assert d["kube_scheduler_p99_ms"] == 200.0
    assert d["standalone_p99_latency_ratio"] == 0.75
    assert d["extender_p99_latency_ratio"] == 3.0


def test_no_ratio_without_kube_scheduler() -> None:
    r = CompareReport(CompareConfig(only=(EXTENDER,)))
    r.cases = [CaseResult(EXTENDER, 1, 10, 10, 80.0, 1.0)]
    assert r.to_dict()["extender_ratio"] is None


@pytest.mark.parametrize(
    "cfg",
    [
        CompareConfig(only=("kube",)),
        CompareConfig(only=()),
        CompareConfig(pods=1),
        CompareConfig(arrival_rate=0),
        CompareConfig(rounds=0),
    ],
)
def test_bad_configs_are_refused_by_name(cfg: CompareConfig) -> None:
    with pytest.raises(GpuschedError):
        cfg.check()


def _bound(node: str, gpus: list[int], milli: int) -> dict[str, object]:
    ann = f'{{"node":"{node}","gpus":{gpus},"milli":{milli},"memoryMiB":0}}'
    return {"metadata": {"annotations": {"gpusched.io/assignment": ann}}, "spec": {"nodeName": node}}


def test_overbooked_counts_gpus_beyond_their_milli() -> None:
    ok = [_bound("a", [0], 500), _bound("a", [0], 500), _bound("a", [1, 2], 1000)]
    assert _overbooked(ok) == 0
    assert _overbooked([*ok, _bound("a", [2], 100), _bound("b", [0], 300)]) == 1
    assert _overbooked([{"metadata": {}, "spec": {}}]) == 0


def test_extender_prioritize_runs_only_when_named() -> None:
    from gpusched.bench.k8s_compare import EXTENDER_PRIORITIZE

    assert EXTENDER_PRIORITIZE not in dict(plan(CASES))
    assert plan((KUBE, EXTENDER, EXTENDER_PRIORITIZE)) == [
        (KUBE, 1), (EXTENDER, 1), (EXTENDER_PRIORITIZE, 1), (KUBE, 2),
    ]  # fmt: skip
    CompareConfig(only=(EXTENDER_PRIORITIZE,)).check()
    r = CompareReport(CompareConfig(only=(KUBE, EXTENDER_PRIORITIZE)))
    r.cases = [
        CaseResult(KUBE, 1, 100, 100, 100.0, 1.0),
        CaseResult(EXTENDER_PRIORITIZE, 1, 100, 100, 40.0, 2.5),
    ]
    d = r.to_dict()
    assert d["extender_prioritize_pods_per_s"] == 40.0 and d["extender_prioritize_ratio"] == 0.4


def test_request_counts_reads_the_extenders_served_requests_by_verb() -> None:
    """The count of each verb's request-duration histogram, as the extender exports it (and not
    the other histograms' counts)."""
    from gpusched.bench.k8s_procs import request_counts
    from gpusched.metrics.scheduling import SchedulerMetrics

    m = SchedulerMetrics()
    for verb, n in (("filter", 5), ("bind", 3)):
        for _ in range(n):
            m.extender_duration.labels(verb).observe(0.002)
    m.binding_duration.labels("bound").observe(0.01)
    assert request_counts(m.exposition().decode()) == {"filter": 5, "bind": 3}
    assert request_counts("") == {}


def test_own_cpu_ratios_read_the_best_runs() -> None:
    r = CompareReport(CompareConfig(only=(KUBE, EXTENDER)))
    r.cases = [
        CaseResult(KUBE, 1, 100, 100, 50.0, 2.0, cpu_ms_per_pod={"kube-scheduler": 4.0}),
        CaseResult(KUBE, 2, 100, 100, 100.0, 1.0, cpu_ms_per_pod={"kube-scheduler": 2.0}),
        CaseResult(EXTENDER, 1, 100, 100, 80.0, 1.0, cpu_ms_per_pod={"kube-scheduler": 2.2, "gpusched": 1.0}),
    ]
    d = r.to_dict()
    assert d["extender_own_cpu_ratio"] == 0.5
    assert d["extender_scheduler_cpu_ratio"] == 1.6
    assert d["cpu_ms_per_pod"][EXTENDER] == {"kube-scheduler": 2.2, "gpusched": 1.0}
    r.cases[1].cpu_ms_per_pod = None
    assert r.to_dict()["extender_own_cpu_ratio"] is None


def test_extender_variants_are_reported_by_case() -> None:
    r = CompareReport(CompareConfig(only=(KUBE, EXTENDER)))
    r.cases = [
        CaseResult(KUBE, 1, 100, 100, 100.0, 1.0),
        CaseResult(EXTENDER, 1, 100, 100, 80.0, 1.0),
        CaseResult("extender@base", 1, 100, 100, 60.0, 1.0, cpu_ms_per_pod={"gpusched": 3.0}),
    ]
    d = r.to_dict()
    assert d["variants_pods_per_s"] == {"extender@base": 60.0}
    assert d["variants_ratio"] == {"extender@base": 0.6}
    assert d["variants_cpu_ms_per_pod"] == {"extender@base": {"gpusched": 3.0}}
    assert d["extender_ratio"] == 0.8


def _node(ready: bool = True, taints: tuple[str, ...] = (), beta: bool = True) -> dict[str, object]:
    labels = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    if beta:
        labels |= {"beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}
    return {
        "metadata": {"name": "n", "labels": labels},
        "spec": {"taints": [{"key": k, "effect": "NoSchedule"} for k in taints]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_a_node_is_settled_once_ready_untainted_and_its_legacy_labels_are_added() -> None:
    assert settled(_node())
    assert not settled(_node(ready=False))
    assert not settled(_node(taints=("node.kubernetes.io/not-ready",)))  # Ready, the taint not lifted yet
    assert not settled(_node(beta=False))  # the lifecycle controller has still to label it
    bare = _node(beta=False)
    bare["metadata"] = {"name": "n", "labels": {}}  # no stable os/arch label: no legacy one expected
    assert settled(bare)
    assert not settled({"metadata": {}, "spec": {}, "status": {}})


def test_the_settle_wait_is_reported() -> None:
    r = CompareReport(CompareConfig(only=(KUBE,)), nodes_settle_s=12.5, nodes_unsettled=3)
    d = r.to_dict()
    assert d["nodes_settle_s"] == 12.5 and d["nodes_unsettled"] == 3


class _FakeCoreV1:
    """Pods gone at once; the namespace answers ``reads_left`` reads before it 404s, after a 503."""

    def __init__(self, reads_left: int) -> None:
        self.reads_left = reads_left
        self.calls: list[str] = []

    def delete_collection_namespaced_pod(self, ns: str, **kw: object) -> None:
        self.calls.append("delete pods")

    def list_namespaced_pod(self, ns: str, **kw: object) -> object:
        return type("R", (), {"data": b'{"items": []}'})()

    def delete_namespace(self, ns: str, **kw: object) -> None:
        self.calls.append("delete namespace")

    def read_namespace(self, ns: str, **kw: object) -> object:
        from kubernetes.client.exceptions import ApiException

        self.calls.append("read namespace")
        if self.reads_left == 2:
            self.reads_left -= 1
            raise ApiException(status=503, reason="Service Unavailable")  # retried, as every call is
        if self.reads_left <= 0:
            raise ApiException(status=404, reason="Not Found")
        self.reads_left -= 1
        return object()


def test_a_case_ends_when_its_namespace_is_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The namespace controller deletes a case's Events (one per binding) for seconds after the
    pods are gone: the next case must not start, and be measured, while it does."""
    from gpusched.bench import k8s_compare

    monkeypatch.setattr(k8s_compare.time, "sleep", lambda s: None)  # the retry's back-off
    b = object.__new__(k8s_compare._Bench)
    notes: list[str] = []
    b.v1, b.cfg, b.note = _FakeCoreV1(reads_left=3), CompareConfig(timeout_s=30.0), notes.append
    b._clear("bench-x-extender-1")
    assert b.v1.calls == ["delete pods", "delete namespace", *["read namespace"] * 4]
    assert len(notes) == 1 and notes[0].startswith("namespace bench-x-extender-1 deleted in")


def test_a_namespace_read_that_fails_otherwise_is_raised() -> None:
    from kubernetes.client.exceptions import ApiException

    from gpusched.bench import k8s_compare

    class Forbidden(_FakeCoreV1):
        def read_namespace(self, ns: str, **kw: object) -> object:
            raise ApiException(status=403, reason="Forbidden")

    b = object.__new__(k8s_compare._Bench)
    b.v1 = Forbidden(0)
    with pytest.raises(ApiException):
        b._gone("bench-x")
