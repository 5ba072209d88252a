"""The defragmentation controller's record on its Lease (``defrag/ledger.py``): the window's moves
and the plan under way, written with the Lease's resourceVersion (the live Lease: the e2e tests)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from gpusched.defrag.ledger import LeaseLedger, LedgerError
from gpusched.k8s.reservation import ANN_MOVES, ANN_PLAN, PlanRecord, parse_plan_record


class FakeLeases:
    """One Lease as the API keeps it: a replace with a stale resourceVersion is a 409; the
    ``renewals`` next reads are each followed by an elector's renewal (the version moves on)."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.version = 0
        self.renewals = 0
        self.writes = 0

    def _resp(self) -> Any:
        return type("R", (), {"data": json.dumps(self.obj).encode()})()

    def read_namespaced_lease(self, name: str, namespace: str, **kw: Any) -> Any:
        if self.obj is None:
            raise ApiException(status=404, reason="Not Found")
        resp = self._resp()
        if self.renewals:
            self.renewals -= 1
            self.version += 1
            self.obj["metadata"]["resourceVersion"] = str(self.version)
        return resp

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any], **kw: Any) -> Any:
        self.version += 1
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = str(self.version)
        self.writes += 1

    def replace_namespaced_lease(self, name: str, namespace: str, body: dict[str, Any], **kw: Any) -> Any:
        assert self.obj is not None
        if body["metadata"].get("resourceVersion") != self.obj["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.version += 1
        self.obj = copy.deepcopy(body)
        self.obj["metadata"]["resourceVersion"] = str(self.version)
        self.writes += 1


def test_moves_are_kept_on_the_lease_within_the_window_and_survive_a_new_reader() -> None:
    leases = FakeLeases()
    ledger = LeaseLedger(leases, "ns", "gpusched-defrag", window_s=100.0)
    assert ledger.moves(1000.0) == []  # no Lease yet
    ledger.add_move(1000.0, "default/a")  # creates the Lease (no holder: the elector takes it)
    assert leases.obj is not None and leases.obj["spec"] == {}
    ledger.add_move(1050.0, "default/b")
    again = LeaseLedger(leases, "ns", "gpusched-defrag", window_s=100.0)  # a restarted process
    assert again.moves(1060.0) == [(1000.0, "default/a"), (1050.0, "default/b")]
    assert again.moves(1101.0) == [(1050.0, "default/b")]  # a's move left the window
    again.drop_move(1050.0, "default/b")  # its eviction was refused
    assert again.moves(1060.0) == [(1000.0, "default/a")]


def test_a_write_rereads_on_a_conflict_with_the_electors_renewal() -> None:
    leases = FakeLeases()
    ledger = LeaseLedger(leases, "ns", "l", window_s=100.0)
    ledger.add_move(1.0, "default/a")
    leases.renewals = 2  # the next two reads are each overtaken by a renewal
    ledger.add_move(2.0, "default/b")
    assert ledger.moves(3.0) == [(1.0, "default/a"), (2.0, "default/b")]
    leases.renewals = 99
    with pytest.raises(LedgerError, match="still conflicting"):
        ledger.add_move(4.0, "default/c")


def test_the_plan_record_is_written_and_cleared_only_by_its_own_id() -> None:
    leases = FakeLeases()
    ledger = LeaseLedger(leases, "ns", "l", window_s=100.0)
    rec = PlanRecord("abc", ("default/big",), "defrag-0", 2000.0)
    assert ledger.plan() is None
    ledger.set_plan(rec)
    assert ledger.plan() == rec
    assert leases.obj is not None
    raw = leases.obj["metadata"]["annotations"][ANN_PLAN]
    assert parse_plan_record(raw, "here") == rec
    ledger.clear_plan("other")
    assert ANN_PLAN in leases.obj["metadata"]["annotations"]
    ledger.clear_plan("abc")
    assert ANN_PLAN not in leases.obj["metadata"]["annotations"]


def test_an_unreadable_record_is_an_error_not_an_empty_window() -> None:
    leases = FakeLeases()
    leases.create_namespaced_lease("ns", {"metadata": {"name": "l", "annotations": {ANN_MOVES: "[[1"}}})
    with pytest.raises(LedgerError, match=f"annotation {ANN_MOVES} is not valid"):
        LeaseLedger(leases, "ns", "l", window_s=100.0).moves(5.0)
