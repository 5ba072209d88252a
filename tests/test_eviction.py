"""The Eviction API client: each API answer becomes one outcome (the real API's answers are in
tests/e2e/test_preemption_e2e.py); and PodDisruptionBudget objects read into the core's data."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpusched.core.model import PodSpec
from gpusched.k8s.disruption import BudgetReader, budget_from_k8s
from gpusched.k8s.errors import InvalidRequest
from gpusched.k8s.eviction import Evictor, Outcome


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status, self.body, self.headers = status, json.dumps(body), headers or {}


PDB_429 = {
    "kind": "Status",
    "code": 429,
    "reason": "TooManyRequests",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "details": {
        "causes": [
            {
                "reason": "DisruptionBudget",
                "message": "The disruption budget web needs 2 healthy pods and has 2 currently",
            }
        ]
    },
}


class FakeCore:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[tuple[str, Any]] = []

    def create_namespaced_pod_eviction(self, name: str, ns: str, body: Any, **kw: Any) -> Any:
        self.calls.append(("evict", body))
        if self.error:
            raise self.error
        return type("R", (), {"status": 201})()

    def delete_namespaced_pod(self, name: str, ns: str, body: Any = None, **kw: Any) -> Any:
        self.calls.append(("delete", body))
        if self.error:
            raise self.error
        return type("R", (), {"status": 200})()


@pytest.mark.parametrize(
    ("error", "outcome", "budget"),
    [
        (None, Outcome.EVICTED, ""),
        (ApiError(429, PDB_429), Outcome.BLOCKED, "web"),
        (ApiError(404, {"message": 'pods "p" not found'}), Outcome.GONE, ""),
        (
            ApiError(409, {"message": "Precondition failed: UID in precondition: 1, UID in object meta: 2"}),
            Outcome.GONE,
            "",
        ),
        (ApiError(429, {"message": "too many requests, please try again later"}), Outcome.FAILED, ""),
        (ApiError(500, {"message": "This pod has more than one PodDisruptionBudget"}), Outcome.FAILED, ""),
        (ConnectionError("reset"), Outcome.FAILED, ""),
    ],
)
def test_each_answer_is_one_outcome(error: Exception | None, outcome: Outcome, budget: str) -> None:
    core = FakeCore(error)
    out = Evictor(core).evict("ns", "p", "uid-1", grace_period_s=5)
    assert out.outcome is outcome
    assert out.budget == budget
    assert out.done == (outcome in (Outcome.EVICTED, Outcome.GONE))
    ((kind, body),) = core.calls
    assert kind == "evict"
    assert body["deleteOptions"] == {"preconditions": {"uid": "uid-1"}, "gracePeriodSeconds": 5}
    if outcome is Outcome.BLOCKED:
        assert "needs 2 healthy pods" in out.message and out.retry_after_s > 0


def test_delete_never_reports_blocked_and_keeps_the_uid_precondition() -> None:
    core = FakeCore()
    assert Evictor(core).delete("ns", "p", "u").outcome is Outcome.EVICTED
    assert core.calls == [("delete", {"preconditions": {"uid": "u"}})]
    assert Evictor(FakeCore(ApiError(429, PDB_429))).delete("ns", "p").outcome is Outcome.FAILED


def pdb(status: dict[str, Any], selector: Any = None, generation: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"name": "web", "namespace": "ns", "generation": generation},
        "spec": {"selector": selector if selector is not None else {"matchLabels": {"app": "web"}}},
        "status": status,
    }


def test_budget_from_k8s_reads_status_and_refuses_what_is_malformed() -> None:
    b, disrupted = budget_from_k8s(
        pdb({"observedGeneration": 1, "disruptionsAllowed": 2, "disruptedPods": {"x": "t"}})
    )
    assert b is not None and (b.namespace, b.name, b.allowed, disrupted) == ("ns", "web", 2, frozenset({"x"}))
    assert b.selects("ns", {"app": "web"}) and not b.selects("other", {"app": "web"})
    # not yet processed by the disruption controller: allows nothing
    late, _ = budget_from_k8s(pdb({"observedGeneration": 1, "disruptionsAllowed": 2}, generation=2))
    assert late is not None and late.allowed == 0
    # an empty selector selects the whole namespace (policy/v1); a null one nothing
    every, _ = budget_from_k8s(pdb({"observedGeneration": 1}, selector={}))
    assert every is not None and every.selects("ns", {})
    null = pdb({"observedGeneration": 1})
    null["spec"]["selector"] = None
    assert budget_from_k8s(null)[0] is None
    with pytest.raises(InvalidRequest, match=r"PodDisruptionBudget ns/web: spec.selector.matchLabels"):
        budget_from_k8s(pdb({}, selector={"matchLabels": {"app": 3}}))


def test_reader_keeps_the_budgets_current() -> None:
    reader = BudgetReader(type("Policy", (), {"list_pod_disruption_budget_for_all_namespaces": None})())
    reader.upsert(pdb({"observedGeneration": 1, "disruptionsAllowed": 0}))
    first = reader.budgets()
    assert [b.name for b in first.budgets] == ["web"] and reader.budgets() is first
    web = PodSpec("a", namespace="ns", labels={"app": "web"})
    assert not reader.may_disrupt(web) and reader.may_disrupt(PodSpec("b", namespace="ns"))
    # a pod the budget counts as disrupted already may go
    reader.upsert(pdb({"observedGeneration": 1, "disruptionsAllowed": 0, "disruptedPods": {"a": "t"}}))
    assert reader.may_disrupt(web)
    reader.upsert(pdb({}, selector={"matchLabels": {"app": 3}}))
    assert not reader.budgets().budgets and "ns/web" in reader.invalid
    reader.upsert(pdb({"observedGeneration": 1, "disruptionsAllowed": 1}))
    assert reader.may_disrupt(web)
    reader.sync([])
    assert not reader.budgets().budgets
