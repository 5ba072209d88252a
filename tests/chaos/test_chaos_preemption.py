"""Preemption under chaos (issue 28): victims owned by Deployments (each one evicted is recreated at
once, at the victims' priority), preemptors that need several victims each, one PodDisruptionBudget
at its limit, and the standalone scheduler SIGKILLed mid-preemption and started again.

Three kwok nodes of 8 GPUs; on each a priority-5000 pod holds 2 GPUs and a Deployment of six
priority-10 one-GPU pods holds the other 6 (node 0's Deployment has a budget that allows no
disruption). Three priority-100 pods of 4 GPUs arrive: each needs 4 victims, one room per node,
so two preempt where no budget is broken and the third has no budget-safe choice left.

Invariants, read back from the API (a pod watch sees every pod that ever existed; ``Preempted``
events say for whom each victim went):
- every preemptor binds, and no more pods leave than the preemptors need (3 × 4);
- no preemptor has more than 4 victims;
- the budget is broken for one room only (the protected Deployment loses at most 4 pods, all
  for one preemptor), and only because no budget-safe choice was left (the other two rooms
  went to the other two preemptors).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from chaoslib import GROUP, RES_GPU, Run, Standalone, Workload

from gpusched.testenv import ControlPlane, wait_until
from realparts import started

pytestmark = pytest.mark.chaos

NODES, VICTIMS_NEEDED = 3, 4


@pytest.fixture(scope="module")
def cp(control_plane_bin: Path) -> Iterator[ControlPlane]:
    with started(control_plane_bin, scheduler=False, controller_manager=True, kwok=True) as c:
        yield c


class PodWatch:
    """Every pod of the namespace that ever existed (uid -> name, labels), from a watch; and each
    one's ``DisruptionTarget`` conditions (status, reason) as they appeared in any of its versions,
    with whether that version was already being deleted: a watch sees every write, so a
    condition set just before a pod was deleted is seen even when the pod is gone a moment later."""

    def __init__(self, run: Run) -> None:
        from kubernetes import watch

        self.seen: dict[str, tuple[str, dict[str, str]]] = {}
        self.targets: dict[str, set[tuple[str, str, bool]]] = defaultdict(set)
        self._w = watch.Watch()
        self._run = run
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        rv = ""
        while True:
            try:
                for ev in self._w.stream(
                    self._run.v1.list_namespaced_pod, self._run.ns, resource_version=rv, timeout_seconds=30
                ):
                    meta = ev["object"].metadata
                    rv = meta.resource_version
                    self.seen[meta.uid] = (meta.name, dict(meta.labels or {}))
                    for c in (ev["object"].status and ev["object"].status.conditions) or []:
                        if c.type == "DisruptionTarget":
                            self.targets[meta.uid].add((c.status, c.reason, bool(meta.deletion_timestamp)))
            except Exception:
                if self._stopped:
                    return
                rv = ""
                time.sleep(0.2)
            if self._stopped:
                return

    _stopped = False

    def stop(self) -> None:
        self._stopped = True
        self._w.stop()


def test_preemption_with_the_scheduler_killed_mid_way(cp: ControlPlane, tmp_path: Path, seed: int) -> None:
    from kubernetes import client

    front = Standalone(
        cp.kubeconfig_path, tmp_path / f"preemption-{seed}.log", f"gpusched-{uuid.uuid4().hex[:6]}"
    )
    run = Run(cp, "preemption", seed, front, Workload(nodes=NODES, pods=0))
    sched = client.SchedulingV1Api(run.api)
    classes = {f"{k}-{run.tag}": v for k, v in (("hi", 5000), ("low", 10), ("mid", 100))}
    hi, low, mid = classes
    watch: PodWatch | None = None
    try:
        run.setup()
        watch = PodWatch(run)
        for name, value in classes.items():
            sched.create_priority_class({"metadata": {"name": name}, "value": value}, _preload_content=False)
        nodes = sorted(n["metadata"]["name"] for n in run.list_nodes())

        def spec(gpus: int, pclass: str, node: str = "") -> dict[str, Any]:
            sel = {GROUP: run.tag, **({"kubernetes.io/hostname": node} if node else {})}
            res = {"cpu": "100m", RES_GPU: str(gpus)}
            container = {"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}
            return {
                "schedulerName": front.scheduler_name, "priorityClassName": pclass, "nodeSelector": sel,
                "terminationGracePeriodSeconds": 1,
                "containers": [container],
            }  # fmt: skip

        front.start(wait_ready=60)
        for i, node in enumerate(nodes):
            body = {"metadata": {"name": f"hi-{i}"}, "spec": spec(2, hi, node)}
            run.v1.create_namespaced_pod(run.ns, body, _preload_content=False)
            app = f"low-{i}"
            dep = {
                "metadata": {"name": app},
                "spec": {
                    "replicas": 6, "selector": {"matchLabels": {"app": app}},
                    "template": {"metadata": {"labels": {"app": app}}, "spec": spec(1, low, node)},
                },
            }  # fmt: skip
            client.AppsV1Api(run.api).create_namespaced_deployment(run.ns, dep, _preload_content=False)
        pdb = {
            "metadata": {"name": "low-0"},
            "spec": {"minAvailable": 6, "selector": {"matchLabels": {"app": "low-0"}}},
        }
        client.PolicyV1Api(run.api).create_namespaced_pod_disruption_budget(
            run.ns, pdb, _preload_content=False
        )
        wait_until(
            lambda: run.bound() == NODES * 7, timeout=90, what="the high and low pods bound", interval=0.5
        )
        run.note("filled")
        for i in range(NODES):
            body = {"metadata": {"name": f"big-{i}"}, "spec": spec(VICTIMS_NEEDED, mid)}
            run.v1.create_namespaced_pod(run.ns, body, _preload_content=False)
        for k in range(2):  # SIGKILLed mid-preemption, started again a moment later
            time.sleep(run.rng.uniform(0.05, 1.0))
            front.kill()
            run.note(f"SIGKILL #{k + 1}")
            time.sleep(run.rng.uniform(0.0, 0.5))
            front.start()

        def bigs_bound() -> bool:
            return (
                sum(
                    1
                    for p in run.list_pods()
                    if p["metadata"]["name"].startswith("big-") and p["spec"].get("nodeName")
                )
                == NODES
            )

        wait_until(bigs_bound, timeout=120, what="every preemptor bound", interval=0.5)
        time.sleep(3.0)  # nothing more may go once they are bound
        pods = run.list_pods()
        events = json.loads(
            run.v1.list_namespaced_event(
                run.ns, field_selector="reason=Preempted", _preload_content=False
            ).data
        )["items"]
    finally:
        front.stop()
        if watch is not None:
            watch.stop()
        run.cleanup()
        for name in classes:
            with contextlib.suppress(Exception):
                sched.delete_priority_class(name, _preload_content=False)

    live = {p["metadata"]["uid"] for p in pods}
    gone = {uid: v for uid, v in watch.seen.items() if uid not in live}
    gone_by_app: dict[str, int] = defaultdict(int)
    for _name, labels in gone.values():
        gone_by_app[labels.get("app", "")] += 1
    by_preemptor: dict[str, set[str]] = defaultdict(set)
    forced: dict[str, set[str]] = defaultdict(set)
    for e in events:
        m = re.match(r"Preempted by \S+/(big-\d)\b", e["message"])
        if m:
            by_preemptor[m.group(1)].add(e["involvedObject"]["uid"])
            if "PodDisruptionBudget" in e["message"]:
                forced[m.group(1)].add(e["involvedObject"]["uid"])
    counts = {k: len(v) for k, v in by_preemptor.items()}
    broke = {k: len(v) for k, v in forced.items()}
    summary = f"gone by app {dict(gone_by_app)}; victims by preemptor {counts}; forced {broke}; {run.events}"
    print(summary)
    assert set(gone_by_app) <= {f"low-{i}" for i in range(NODES)}, summary  # only victims left
    assert sum(gone_by_app.values()) <= NODES * VICTIMS_NEEDED, summary
    assert all(len(v) <= VICTIMS_NEEDED for v in by_preemptor.values()), summary
    assert gone_by_app.get("low-0", 0) <= VICTIMS_NEEDED and len(forced) <= 1, summary
    # low-0's budget allows no disruption: each of its pods that went was deleted past it, and carried
    # kube-scheduler's condition, set by the real apiserver (a status patch before the deletion, while the
    # pod was not yet terminating); the other victims went through the Eviction API, which sets its own
    forced_target = ("True", "PreemptionByScheduler", False)
    evicted_target = {("True", "EvictionByEvictionAPI")}
    for uid, (name, labels) in gone.items():
        seen = watch.targets.get(uid, set())
        if labels.get("app") == "low-0":
            assert forced_target in seen, (name, seen, summary)
        else:
            assert {(st, why) for st, why, _ in seen} == evicted_target, (name, seen, summary)
    assert all(gone_by_app.get(f"low-{i}", 0) == VICTIMS_NEEDED for i in range(1, NODES)), summary
