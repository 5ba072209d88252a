"""Preemption of pods that hold DRA devices, on the real control plane (issue 32 item 3).

kube-scheduler 1.37 cannot preempt a pod for its devices; gpusched's standalone scheduler does:
the what-if frees the victims' claims (core/plugins/preemption.py), the victims leave through the
Eviction API with their PodDisruptionBudgets (k8s/preemption.py, the same path as for GPUs),
kube-controller-manager's resourceclaim controller takes them out of ``reservedFor`` and deallocates
their claims, and the preemptor, whose room the DRA books hold meanwhile, gets the device.

The environment is test_dra_e2e.py's (``DraEnv``, its ``dra`` fixture: one scheduler for this module);
the PodDisruptionBudget and PriorityClass helpers are test_preemption_e2e.py's.
"""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import test_dra_e2e
from test_dra_e2e import A100, DraEnv, exactly, gpu
from test_preemption_e2e import budget_allows, classes, pdb

from gpusched.bench.reclaim import install_queue_crd, queue_body
from gpusched.k8s.convert import ANN_QUEUE
from gpusched.k8s.queues import GROUP, PLURAL, VERSION
from gpusched.testenv import ControlPlane, wait_until

pytestmark = pytest.mark.e2e

dra = test_dra_e2e.dra  # the shared fixture: one DraEnv (and scheduler) for this module

HOLD = "gpusched.io/e2e-hold"  # keeps a victim terminating until the test lets it go
HELD: list[str] = []  # pods given the finalizer: let go at the module's end, or the namespace stays


@pytest.fixture(scope="module", autouse=True)
def queue_crd(control_plane: ControlPlane) -> None:
    """The Queue CRD, served before the module's scheduler starts (it probes for it at start)."""
    install_queue_crd(control_plane)


@pytest.fixture(scope="module")
def prio(dra: DraEnv) -> Iterator[dict[str, str]]:
    tag = uuid.uuid4().hex[:6]
    names = {"low": f"low-{tag}", "mid": f"mid-{tag}", "high": f"high-{tag}"}
    api = classes(dra, {names["low"]: 0, names["mid"]: 5, names["high"]: 1000})
    try:
        yield names
    finally:
        for p in HELD:
            with contextlib.suppress(Exception):
                hold(dra, p, False)
        for n in names.values():
            api.delete_priority_class(n, _preload_content=False)


class NeverTwice:
    """Samples the namespace's claims every 50 ms while the test runs: no device is ever allocated to
    two claims at an observed moment."""

    def __init__(self, dra: DraEnv) -> None:
        self.dra = dra
        self.samples = 0
        self.twice: list[list[tuple[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            held = self.dra.devices_held()
            self.samples += 1
            if len(held) != len(set(held)):
                self.twice.append(held)

    def __enter__(self) -> NeverTwice:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        assert self.samples > 0
        assert not self.twice, f"a device allocated to two claims: {self.twice[0]}"


def hold(dra: DraEnv, name: str, on: bool) -> None:
    body = {"metadata": {"finalizers": [HOLD] if on else None}}
    dra.v1.patch_namespaced_pod(name, dra.ns, body, _preload_content=False)


def device_of(dra: DraEnv, claim: str) -> tuple[str, str]:
    (r,) = dra.read_claim(claim)["status"]["allocation"]["devices"]["results"]
    return r["pool"], r["device"]


def holder(dra: DraEnv, name: str, group: str, pclass: str, labels: dict[str, str] | None = None) -> str:
    """A pod of ``pclass`` holding one whole GPU through its own claim (bound by the scheduler), kept
    terminating when evicted until ``hold(..., False)``."""
    dra.claim(f"{name}-gpu", [{"name": "gpu", "exactly": exactly(dra.gpu_class)}])
    claims = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
    dra.pod(name, group, claims, priority_class=pclass, **(labels or {}))
    node = dra.bound(name)
    hold(dra, name, True)
    HELD.append(name)
    return node


def evicted(dra: DraEnv, name: str) -> dict[str, Any]:
    """``name`` terminating, evicted through the Eviction API (the apiserver's DisruptionTarget)."""

    def terminating() -> dict[str, Any] | None:
        p = dra.read_pod(name)
        return p if p["metadata"].get("deletionTimestamp") else None

    p = wait_until(terminating, timeout=60, what=f"{name} evicted", control_plane=dra.cp)
    conds = {c["type"]: c for c in (p.get("status") or {}).get("conditions") or []}
    assert conds["DisruptionTarget"]["reason"] == "EvictionByEvictionAPI"
    return dict(p)


def test_a_low_priority_claim_holder_is_preempted_and_its_device_goes_to_the_preemptor(
    dra: DraEnv, prio: dict[str, str]
) -> None:
    group = f"preempt-{dra.tag}"
    node = dra.node_with_gpus(group, "preempt", [gpu(0, A100)])
    with NeverTwice(dra):
        assert holder(dra, "lowly", group, prio["low"]) == node
        held = device_of(dra, "lowly-gpu")
        dra.claim("urgent-gpu", [{"name": "gpu", "exactly": exactly(dra.gpu_class)}])
        dra.pod(
            "urgent", group, [{"name": "gpu", "resourceClaimName": "urgent-gpu"}], priority_class=prio["high"]
        )
        evicted(dra, "lowly")
        nominated = lambda: (dra.read_pod("urgent").get("status") or {}).get("nominatedNodeName")  # noqa: E731
        assert wait_until(nominated, timeout=30, what="urgent nominated", control_plane=dra.cp) == node
        # while the victim terminates its claim stays allocated to it, and the preemptor waits
        assert device_of(dra, "lowly-gpu") == held
        assert not (dra.read_claim("urgent-gpu").get("status") or {}).get("allocation")
        hold(dra, "lowly", False)  # its grace period ends: gone
        assert dra.bound("urgent", timeout=90) == node
        assert device_of(dra, "urgent-gpu") == held  # the device the victim held
        claim = dra.read_claim("urgent-gpu")
        assert [r["name"] for r in claim["status"]["reservedFor"]] == ["urgent"]
        # the victim's claim (made by the test, not from a template) is released by the controller
        lowly = dra.read_claim("lowly-gpu").get("status") or {}
        assert not lowly.get("reservedFor") and not lowly.get("allocation")
    dra.sched.events.flush()
    msgs = dra.failure("lowly", reason="Preempted", contains="Preempted by")
    assert msgs == f"Preempted by {dra.ns}/urgent on node {node}"


def test_a_budget_that_forbids_evicting_a_claim_holder_is_honoured(dra: DraEnv, prio: dict[str, str]) -> None:
    """Two nodes of one GPU: a priority-0 holder its PodDisruptionBudget protects, and a priority-5
    holder. Without the budget the priority-0 one is the cheaper victim; with it, the other goes."""
    group = f"pdb-{dra.tag}"
    n0 = dra.node_with_gpus(group, "pdb-0", [gpu(0, A100)])
    n1 = dra.node_with_gpus(group, "pdb-1", [gpu(0, A100)])
    with NeverTwice(dra):
        pdb(dra, "db", "db", 1)
        a = holder(dra, "db", group, prio["low"], labels={"app": "db"})
        b = holder(dra, "batch", group, prio["mid"])
        assert {a, b} == {n0, n1}
        budget_allows(dra, "db", 0)
        held = device_of(dra, "batch-gpu")
        dra.claim("vip-gpu", [{"name": "gpu", "exactly": exactly(dra.gpu_class)}])
        dra.pod("vip", group, [{"name": "gpu", "resourceClaimName": "vip-gpu"}], priority_class=prio["high"])
        evicted(dra, "batch")
        assert not dra.read_pod("db")["metadata"].get("deletionTimestamp"), "the protected pod stays"
        hold(dra, "batch", False)
        assert dra.bound("vip", timeout=90) == b
        assert device_of(dra, "vip-gpu") == held
        assert not dra.read_pod("db")["metadata"].get("deletionTimestamp")
        assert device_of(dra, "db-gpu")[0] == a


def test_reclaim_by_device_class_evicts_the_borrower_of_the_class_needed(
    dra: DraEnv, prio: dict[str, str]
) -> None:
    """Queue ``a`` lends its quota of one GPU and one MIG device (``devices/<class>``) to ``b``,
    whose pods hold both (the MIG holder of the lowest priority). A pod of ``a`` asking for a GPU
    reclaims: the GPU's holder is evicted through the Eviction API, the MIG holder stays, and the
    pod gets the GPU its borrower held."""
    from kubernetes import client

    custom = client.CustomObjectsApi(dra.api)
    group = f"reclaim-{dra.tag}"
    mig = {
        "name": "mig-0",
        "attributes": {"type": {"string": "mig"}, "productName": {"string": A100[0]}, "index": {"int": 0}},
        "capacity": {"memory": {"value": "5Gi"}},
    }
    node = dra.node_with_gpus(group, "reclaim", [gpu(0, A100), mig])
    org, a, b = (f"{q}-{dra.tag}" for q in ("org", "a", "b"))
    quota = {"dra": {f"devices/{dra.gpu_class}": 1, f"devices/{dra.mig_class}": 1}}
    for body in (queue_body(org), queue_body(a, parent=org, nominalQuota=quota), queue_body(b, parent=org)):
        custom.create_cluster_custom_object(GROUP, VERSION, PLURAL, body, _preload_content=False)
    try:
        with NeverTwice(dra):
            for name, cls, pclass in (("b-mig", dra.mig_class, "low"), ("b-gpu", dra.gpu_class, "mid")):
                dra.claim(f"{name}-c", [{"name": "gpu", "exactly": exactly(cls)}])
                claims = [{"name": "gpu", "resourceClaimName": f"{name}-c"}]
                dra.pod(name, group, claims, priority_class=prio[pclass], annotations={ANN_QUEUE: b})
                assert dra.bound(name) == node  # b borrows a's idle quota
            held = device_of(dra, "b-gpu-c")
            dra.claim("a-gpu-c", [{"name": "gpu", "exactly": exactly(dra.gpu_class)}])
            claims = [{"name": "gpu", "resourceClaimName": "a-gpu-c"}]
            dra.pod("a-gpu", group, claims, annotations={ANN_QUEUE: a})
            assert dra.bound("a-gpu", timeout=90) == node
            assert device_of(dra, "a-gpu-c") == held  # the device its borrower held
            assert not dra.read_pod("b-mig")["metadata"].get("deletionTimestamp"), "the other class stays"
            gone = [
                p["metadata"]["name"]
                for p in json.loads(dra.v1.list_namespaced_pod(dra.ns, _preload_content=False).data)["items"]
            ]
            assert "b-gpu" not in gone or dra.read_pod("b-gpu")["metadata"].get("deletionTimestamp")

        def usage(q: str) -> object:  # the Queue's status, as the scheduler writes it every 2 s
            obj = custom.get_cluster_custom_object(GROUP, VERSION, PLURAL, q)
            return ((obj.get("status") or {}).get("usage") or {}).get("dra")

        gpus, migs = f"devices/{dra.gpu_class}", f"devices/{dra.mig_class}"
        want = {gpus: 1, migs: 0}
        wait_until(lambda: usage(a) == want, timeout=30, what=f"Queue {a} status.usage.dra {want}")
        assert usage(b) == {gpus: 0, migs: 1}
        msg = dra.failure("b-gpu", reason="Preempted", contains="reclaims its quota")
        assert f"queue {a} reclaims its quota" in msg
    finally:
        for q in (a, b, org):
            custom.delete_cluster_custom_object(GROUP, VERSION, PLURAL, q, _preload_content=False)
