"""The fault proxy itself: rules decide deterministically, and against a real kube-apiserver an AFTER fault
really drops the answer of a committed binding, a BEFORE fault commits nothing, and watches stream."""

from __future__ import annotations

import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultproxy import Fault, FaultProxy, Rule, binding_rule

from gpusched.testenv import ControlPlane
from realparts import started

pytestmark = pytest.mark.chaos


# ------------------------------------------------------------------------------------- rules alone
def _rolls(rule: Rule, n: int) -> list[int]:
    return [i + 1 for i in range(n) if rule.matches("POST", "/api/v1/namespaces/a/bindings") and rule.roll()]


def test_rules_pick_the_nth_every_kth_and_a_seeded_share() -> None:
    assert _rolls(binding_rule(Fault.AFTER, nth=frozenset({2, 5})), 10) == [2, 5]
    assert _rolls(binding_rule(Fault.AFTER, every=4), 12) == [4, 8, 12]
    a = _rolls(binding_rule(Fault.AFTER, probability=0.2, seed=7), 500)
    assert a == _rolls(binding_rule(Fault.AFTER, probability=0.2, seed=7), 500)  # seeded: reproducible
    assert 60 < len(a) < 140 and a != _rolls(binding_rule(Fault.AFTER, probability=0.2, seed=8), 500)
    r = binding_rule(Fault.BEFORE, every=1, limit=3)
    hits = []
    for i in range(6):
        if r.matches("POST", "/api/v1/namespaces/a/pods/p/binding") and r.roll():
            r.faulted += 1
            hits.append(i)
    assert hits == [0, 1, 2]
    assert not r.matches("GET", "/api/v1/namespaces/a/bindings")
    assert not r.matches("POST", "/api/v1/namespaces/a/pods")


# ----------------------------------------------------------------------- against the real apiserver
@pytest.fixture(scope="module")
def cp(control_plane_bin: Path) -> Iterator[ControlPlane]:
    with started(control_plane_bin, scheduler=False, controller_manager=False, kwok=False) as c:
        yield c


class Setup:
    def __init__(self, cp: ControlPlane, proxy: FaultProxy, tmp: Path) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self.direct: Any = client.CoreV1Api(cp.api_client())
        self.via: Any = client.CoreV1Api(api_client(str(proxy.write_kubeconfig(tmp / "proxy.kubeconfig"))))
        self.proxy = proxy
        self.ns = f"fp-{uuid.uuid4().hex[:6]}"
        namespace: Any = {"metadata": {"name": self.ns}}
        self.direct.create_namespace(namespace)

    def pod(self, name: str) -> None:
        body = {
            "metadata": {"name": name},
            "spec": {"schedulerName": "nobody", "containers": [{"name": "c", "image": "pause"}]},
        }
        self.direct.create_namespaced_pod(self.ns, body)

    def bind(self, name: str, node: str) -> None:
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
        self.via.create_namespaced_binding(self.ns, body, _preload_content=False)

    def node_of(self, name: str) -> str | None:
        node: str | None = self.direct.read_namespaced_pod(name, self.ns).spec.node_name
        return node


@pytest.fixture
def setup(cp: ControlPlane, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Setup]:
    rules: list[Rule] = getattr(request, "param", [])
    proxy = FaultProxy.for_control_plane(cp, tmp_path, rules=rules).start()
    try:
        s = Setup(cp, proxy, tmp_path)
        yield s
        s.direct.delete_namespace(s.ns)
    finally:
        proxy.stop()


@pytest.mark.parametrize("setup", [[binding_rule(Fault.AFTER, nth=frozenset({1}))]], indirect=True)
def test_after_fault_drops_the_answer_of_a_committed_binding(setup: Setup) -> None:
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import ProtocolError

    setup.pod("p")
    with pytest.raises(ProtocolError, match="Connection aborted"):  # what the scheduler saw in issue 9
        setup.bind("p", "node-a")
    assert setup.node_of("p") == "node-a"  # ... although the API committed the binding
    (fault,) = setup.proxy.faulted()
    assert (fault.mode, fault.status, fault.pod) == (Fault.AFTER, 201, f"{setup.ns}/p")
    with pytest.raises(ApiException) as err:  # a blind retry: the pod is already bound
        setup.bind("p", "node-b")
    assert err.value.status == 409
    assert setup.node_of("p") == "node-a"


@pytest.mark.parametrize("setup", [[binding_rule(Fault.BEFORE, nth=frozenset({1}))]], indirect=True)
def test_before_fault_commits_nothing(setup: Setup) -> None:
    from urllib3.exceptions import ProtocolError

    setup.pod("q")
    with pytest.raises(ProtocolError, match="Connection aborted"):
        setup.bind("q", "node-a")
    assert setup.node_of("q") is None
    (fault,) = setup.proxy.faulted()
    assert (fault.mode, fault.status, fault.pod) == (Fault.BEFORE, None, f"{setup.ns}/q")
    setup.bind("q", "node-b")  # the second binding is not faulted
    assert setup.node_of("q") == "node-b"
    setup.proxy.enabled = False
    assert setup.proxy.stats()["faults_before"] == 1


def test_watches_stream_through_the_proxy(setup: Setup) -> None:
    listed = json.loads(setup.via.list_namespaced_pod(setup.ns, _preload_content=False).data)
    resp = setup.via.list_namespaced_pod(
        setup.ns, watch=True, resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=30,
        _preload_content=False,
    )  # fmt: skip
    seen: list[tuple[float, dict[str, Any]]] = []

    def read() -> None:
        buf = b""
        for chunk in resp.stream(amt=65536):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                seen.append((time.monotonic(), json.loads(line)))
                return

    t = threading.Thread(target=read, daemon=True)
    t.start()
    time.sleep(0.5)
    created = time.monotonic()
    setup.pod("w")
    t.join(20)
    resp.release_conn()
    assert seen, "no watch event came through the proxy"
    at, ev = seen[0]
    assert ev["type"] == "ADDED" and ev["object"]["metadata"]["name"] == "w"
    assert at - created < 10  # streamed as it happened, not when the watch ended (30 s)


@pytest.mark.parametrize(
    "setup",
    [[binding_rule(Fault.BEFORE, nth=frozenset({1}), sever_watches=True),
      Rule(Fault.DELAY, "GET", r"/api/v1/namespaces/[^/]+/pods", watch=False, every=1, delay_s=1.5)]],
    indirect=True,
)  # fmt: skip
def test_a_fault_can_sever_watches_and_lists_can_be_held(setup: Setup) -> None:
    from urllib3.exceptions import ProtocolError

    t0 = time.monotonic()
    listed = json.loads(setup.via.list_namespaced_pod(setup.ns, _preload_content=False).data)
    assert time.monotonic() - t0 >= 1.5  # the list was held
    resp = setup.via.list_namespaced_pod(
        setup.ns, watch=True, resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=30,
        _preload_content=False,
    )  # fmt: skip
    t1 = time.monotonic()  # the watch was not held (watch=False in the rule)
    ended: list[float] = []

    def read() -> None:
        with contextlib.suppress(Exception):
            for _ in resp.stream(amt=65536):
                pass
        ended.append(time.monotonic())

    t = threading.Thread(target=read, daemon=True)
    t.start()
    time.sleep(0.5)
    assert not ended and time.monotonic() - t1 < 1.5
    setup.pod("s")
    with pytest.raises(ProtocolError):
        setup.bind("s", "node-a")
    t.join(10)
    assert ended, "the watch stream was not severed by the fault"
    assert setup.proxy.stats()["watches_severed"] == 1
