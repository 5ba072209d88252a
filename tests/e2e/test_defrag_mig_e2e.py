"""The defragmentation controller moves a MIG slice on the real control plane (issue 31 item 5).

Two kwok MIG nodes beside the defragmentation fixture's (``test_defrag_e2e.DefragEnv``), each an A100 80GB cut
in halves (4g.40gb at 0, 3g.40gb at 4), made as the MIG e2e makes its node (``test_mig_e2e.mig_node_body``).
Bare pods hold both 4g.40gb; a ReplicaSet-owned 3g.40gb pod (a Deployment's) runs on m1; a 3g.40gb pod pinned
to m1 waits: it fits nowhere. The controller moves the Deployment's pod to m2's free 3g.40gb through the
Eviction API; its replacement lands on that planned slice and the pending pod on the freed one, though an
older pod of equal priority that may go anywhere is tried while the planned slice is the only free one (held
for the replacement) and once the slice is freed (its room holds it).
An observer lists the pods all along: no slice is held by two pods at any moment it saw.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import test_defrag_e2e
from test_defrag_e2e import HOLD, PIN, DefragEnv
from test_mig_e2e import create_mig_node, mig_node_body

from gpusched.core.mig.geometry import Geometry
from gpusched.defrag.controller import DefragController
from gpusched.k8s.convert import ANN_ASSIGNMENT
from gpusched.k8s.reservation import ANN_ROOM
from gpusched.testenv import wait_until

HALVES = (("4g.40gb", 0, 4), ("3g.40gb", 4, 4))
R3, R4 = "nvidia.com/mig-3g.40gb", "nvidia.com/mig-4g.40gb"
A100 = Geometry.of("a100-80gb")

pytestmark = pytest.mark.e2e
denv = test_defrag_e2e.denv  # the defragmentation e2e's fixture: its nodes, scheduler and controller


def pinned(denv: DefragEnv, name: str, res: str, node: str) -> dict[str, Any]:
    body = denv.pod(name, {res: "1"})
    body["spec"]["nodeSelector"][PIN] = node
    return body


def slices(pods: list[dict[str, Any]]) -> Iterator[tuple[str, tuple[str, int, int]]]:
    """(pod, (node, GPU, memory slice)) for each memory slice a bound pod holds (being deleted, it still holds
    what it holds until it is gone)."""
    for p in pods:
        node = p["spec"].get("nodeName")
        ann = (p["metadata"].get("annotations") or {}).get(ANN_ASSIGNMENT)
        if not node or not ann or p["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        for x in json.loads(ann).get("mig") or ():
            for m in range(x["start"], x["start"] + A100.kind(x["profile"]).mem_slices):
                yield p["metadata"]["name"], (node, x["gpu"], m)


class Observer:
    """Lists the pods every 0.1 s until stopped; remembers each moment a slice was held by two pods."""

    def __init__(self, denv: DefragEnv) -> None:
        self.denv, self.seen = denv, 0
        self.twice: list[tuple[str, str, tuple[str, int, int]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            holder: dict[tuple[str, int, int], str] = {}
            for pod, where in slices(self.denv.list_pods()):
                if where in holder:
                    self.twice.append((holder[where], pod, where))
                holder[where] = pod
            self.seen += 1
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def assignment(denv: DefragEnv, name: str) -> dict[str, Any]:
    p = json.loads(denv.v1.read_namespaced_pod(name, denv.ns, _preload_content=False).data)
    return dict(json.loads(p["metadata"]["annotations"][ANN_ASSIGNMENT]))


def fragmented(denv: DefragEnv, kind: str) -> tuple[str, str, str, list[dict[str, Any]]]:
    """The two MIG nodes; a 3g.40gb pod of ``kind`` (``deployment``, ``statefulset``; with a finalizer:
    evicted, it stays until the test lets it go) on m1 and m2's 3g.40gb free; a pending 3g.40gb pod ``big``
    pinned to m1, and ``other``, gated, older, of equal priority, that may go anywhere. Returns m1, m2, the
    moved pod's name and the slice it holds."""
    m1, m2 = f"{denv.tag}-m1", f"{denv.tag}-m2"
    for m in (m1, m2):
        create_mig_node(denv.cp, denv.v1, mig_node_body(m, denv.tag, (HALVES,), {PIN: m}))
    denv.create_pods([pinned(denv, f"hold-{m}", R4, m) for m in (m1, m2)])  # bare: never moved
    denv.create_pods([pinned(denv, "fill", R3, m2)])  # m2's 3g.40gb taken while web lands
    wait_until(lambda: len(denv.running()) == 3, timeout=60, what="holders and filler bound")
    if kind == "deployment":
        denv.deployment("web", 1, finalizer=True, res={R3: "1"})
    else:
        statefulset(denv, "web")
    wait_until(lambda: list(denv.running("web").values()) == [m1], timeout=60, what="web bound on m1")
    (web,) = denv.running("web")
    freed = assignment(denv, web)["mig"]
    denv.v1.delete_namespaced_pod("fill", denv.ns, grace_period_seconds=0, _preload_content=False)
    wait_until(lambda: "fill" not in denv.running(), timeout=60, what="the filler gone")
    other = denv.pod("other", {R3: "1"}, labels={"app": "other"})
    other["spec"]["schedulingGates"] = [{"name": "gpusched.io/e2e-gate"}]
    denv.create_pods([other])
    denv.create_pods([pinned(denv, "big", R3, m1)])  # m1's only 3g.40gb is web's: it fits nowhere
    return m1, m2, web, freed


def statefulset(denv: DefragEnv, app: str) -> None:
    """A StatefulSet of one 3g.40gb pod with a finalizer: its pod is recreated (same name) once the old one
    is gone."""
    spec = denv.pod("x", {R3: "1"})["spec"]
    meta = {"labels": {"app": app}, "finalizers": [HOLD]}
    body = {
        "metadata": {"name": app, "namespace": denv.ns},
        "spec": {
            "replicas": 1, "serviceName": app, "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": meta, "spec": spec},
        },
    }  # fmt: skip
    denv.apps.create_namespaced_stateful_set(denv.ns, body, _preload_content=False)


@contextmanager
def carried_out(
    denv: DefragEnv, before_eviction: Callable[[], None] | None = None
) -> Iterator[DefragController]:
    """The controller runs in the block (the observer lists the pods meanwhile) and until its plan is carried
    out; then no slice was held by two pods at any moment the observer saw. ``before_eviction`` runs in the
    controller's thread before each eviction (its rooms written)."""
    seen = Observer(denv)
    ctl = denv.controller()
    if before_eviction is not None:
        evict = ctl.evictor.evict

        def hooked(*args: Any, **kw: Any) -> Any:
            before_eviction()
            return evict(*args, **kw)

        ctl.evictor.evict = hooked  # type: ignore[method-assign]
    ctl.start()
    try:
        yield ctl
        wait_until(lambda: bool(ctl.attempts), timeout=120, what="a plan carried out")
    finally:
        ctl.stop()
        seen.stop()
    assert seen.seen > 5 and not seen.twice, seen.twice


def tried(denv: DefragEnv, name: str) -> bool:
    return any(e["involvedObject"]["name"] == name for e in denv.events("FailedScheduling"))


def landed(
    denv: DefragEnv, ctl: DefragController, m1: str, m2: str, web: str, freed: list[dict[str, Any]]
) -> None:
    """The plan completed with one move, web's; big runs on the freed slice, the room named; web's
    replacement on m2 on the slice its steer names; ``other`` waits (every 3g.40gb is taken)."""
    (attempt,) = ctl.attempts
    assert attempt.result == "completed", attempt
    assert attempt.moves == (f"{denv.ns}/{web}",)
    big = assignment(denv, "big")
    assert big["node"] == m1 and big["mig"] == freed
    obj = json.loads(denv.v1.read_namespaced_pod("big", denv.ns, _preload_content=False).data)
    room = json.loads(obj["metadata"]["annotations"][ANN_ROOM])
    assert room["mig"] == freed
    (steer,) = room["steer"]
    wait_until(lambda: list(denv.running("web").values()) == [m2], timeout=60, what="web running on m2")
    ((again, node),) = denv.running("web").items()
    assert node == m2 == steer["node"]
    assert assignment(denv, again)["mig"] == steer["mig"] == [{"gpu": 0, "start": 4, "profile": "3g.40gb"}]
    assert "other" not in denv.running()
    (ev,) = denv.moved_events()
    assert ev["involvedObject"]["name"] == web and f"{denv.ns}/big" in ev["message"]


def test_a_replicaset_mig_pod_moves_to_a_free_instance_and_the_pending_pod_lands_on_the_freed_one(
    denv: DefragEnv,
) -> None:
    """The target slice is kept for web's replacement from the moment the rooms are written: the older pod
    that may go anywhere, let go just before web's eviction, is tried while m2's 3g.40gb (the steer's) is the
    only free one and kept off it, and the replacement takes it. The freed slice is the pending pod's room:
    once web has left, the older pod still waits."""
    m1, m2, web, freed = fragmented(denv, "deployment")

    def other_tried_first() -> None:  # the rooms are written, web not evicted yet
        denv.v1.patch_namespaced_pod("other", denv.ns, {"spec": {"schedulingGates": None}})
        wait_until(lambda: tried(denv, "other") or "other" in denv.running(), timeout=60, what="other tried")

    with carried_out(denv, other_tried_first) as ctl:
        wait_until(lambda: web not in denv.running("web"), timeout=120, what="web evicted")
        assert "other" not in denv.running(), "other took m2's 3g.40gb, the slice kept for web's replacement"
        assert tried(denv, "other")
        wait_until(lambda: list(denv.running("web").values()) == [m2], timeout=60, what="web recreated on m2")
        denv.unhold()  # web leaves
    landed(denv, ctl, m1, m2, web, freed)


def test_the_target_slice_waits_for_the_moved_pods_replacement(denv: DefragEnv) -> None:
    """A StatefulSet recreates its pod only once the old one is gone: until then the target slice on m2 is
    the only free 3g.40gb, and the pod that may go anywhere is tried there and kept off it."""
    m1, m2, web, freed = fragmented(denv, "statefulset")
    with carried_out(denv) as ctl:
        wait_until(lambda: web not in denv.running("web"), timeout=120, what="web evicted")
        denv.v1.patch_namespaced_pod("other", denv.ns, {"spec": {"schedulingGates": None}})
        wait_until(lambda: tried(denv, "other") or "other" in denv.running(), timeout=60, what="other tried")
        assert "other" not in denv.running()  # kept off the slice the plan keeps for web
        denv.unhold()  # web leaves; the StatefulSet recreates it
    landed(denv, ctl, m1, m2, web, freed)
