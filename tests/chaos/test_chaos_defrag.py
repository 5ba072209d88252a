"""Chaos run of the defragmentation controller (``gpusched defrag run``, a process) against the real
control plane, SIGKILLed mid-plan and restarted (issue 28: "no pod without an owner ever moved; the
move budget held across restarts").

One kwok node of 8 GPUs, each GPU holding one 400-milli share: six of a Deployment, two bare pods
(no ownerReferences). Four 1-GPU pods wait; each lands after one move within the node (a share
joins another share's GPU). The controller may move 2 pods per window. It is killed at random
moments after it starts a plan (a DefragPlanned event), ``KILLS`` times, and restarted each time;
then it runs until quiet. Invariants:

- the bare pods run where they ran, with the same UIDs, and no event says they were moved;
- at most 2 pods were evicted in all (the window's budget, across every restart);
- no GPU is booked past 1000 milli by the pods' assignments.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpusched.k8s.convert import ANN_ASSIGNMENT, RES_GPU, RES_MILLI
from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
from gpusched.testenv import ControlPlane, free_port, wait_until
from realparts import started

pytestmark = pytest.mark.chaos

KILLS = 3
BUDGET = 2
LEASE = "gpusched-defrag"
GROUP = "gpusched.io/chaos-defrag"


@pytest.fixture(scope="module")
def cp(control_plane_bin: Path) -> Iterator[ControlPlane]:
    with started(control_plane_bin, scheduler=False, controller_manager=True, kwok=True) as c:
        yield c


class Cluster:
    def __init__(self, cp: ControlPlane) -> None:
        from kubernetes import client

        from gpusched.k8s.client import api_client

        self.cp = cp
        self.tag = uuid.uuid4().hex[:6]
        self.ns, self.node, self.scheduler = f"cd-{self.tag}", f"cd-{self.tag}-n1", f"gpusched-{self.tag}"
        self.api = api_client(str(cp.kubeconfig_path))
        self.v1 = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.v1.create_namespace({"metadata": {"name": self.ns}})
        res = {"cpu": "64", "memory": "256Gi", "pods": "110", RES_GPU: "8"}
        labels = {"type": "kwok", GROUP: self.tag, "nvidia.com/gpu.product": "A100"}
        body = {
            "metadata": {
                "name": self.node,
                "labels": labels,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
            "status": {"capacity": res, "allocatable": res},
        }
        self.v1.create_node(body, _preload_content=False)
        wait_until(self._ready, timeout=180, what="the kwok node Ready", control_plane=cp, interval=1)
        cfg = SchedulerConfig(scheduler_name=self.scheduler, defrag_lease=f"{self.ns}/{LEASE}")
        self.sched = StandaloneScheduler(self.api, cfg).start()

    def _ready(self) -> bool:
        node = json.loads(self.v1.read_node(self.node, _preload_content=False).data)
        conds = node["status"].get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds) and not node["spec"].get(
            "taints"
        )

    def spec(self, res: dict[str, str]) -> dict[str, Any]:
        return {
            "schedulerName": self.scheduler,
            "nodeSelector": {GROUP: self.tag},
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "pause", "resources": {"requests": res, "limits": res}}],
        }

    def pod(self, name: str, res: dict[str, str]) -> None:
        body = {"metadata": {"name": name, "namespace": self.ns}, "spec": self.spec(res)}
        self.v1.create_namespaced_pod(self.ns, body, _preload_content=False)

    def deployment(self, name: str, replicas: int, milli: int) -> None:
        body = {
            "metadata": {"name": name, "namespace": self.ns},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": self.spec({RES_MILLI: str(milli)}),
                },
            },
        }
        self.apps.create_namespaced_deployment(self.ns, body, _preload_content=False)

    def pods(self) -> list[dict[str, Any]]:
        return list(json.loads(self.v1.list_namespaced_pod(self.ns, _preload_content=False).data)["items"])

    def running(self) -> dict[str, dict[str, Any]]:
        return {
            p["metadata"]["name"]: p
            for p in self.pods()
            if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
        }

    def events(self, reason: str) -> list[dict[str, Any]]:
        resp = self.v1.list_namespaced_event(
            self.ns, field_selector=f"reason={reason}", _preload_content=False
        )
        return list(json.loads(resp.data)["items"])

    def delete(self, name: str) -> None:
        self.v1.delete_namespaced_pod(name, self.ns, grace_period_seconds=0, _preload_content=False)

    def cleanup(self) -> None:
        self.sched.stop()
        self.v1.delete_namespace(self.ns, _preload_content=False)
        self.v1.delete_node(self.node, _preload_content=False)


def controller(c: Cluster, log: Path) -> subprocess.Popen[bytes]:
    cmd = [
        *(sys.executable, "-m", "gpusched.cli", "defrag", "run", "--kubeconfig", str(c.cp.kubeconfig_path)),
        *("--scheduler-name", c.scheduler, "--namespace", c.ns, "--lease-name", LEASE),
        *("--wait", "1", "--interval", "0.5", "--max-moves-per-window", str(BUDGET)),
        *("--no-leader-elect", "--port", str(free_port()), "--grace-period", "0"),
    ]
    with log.open("ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def test_defrag_controller_killed_mid_plan(cp: ControlPlane, tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)  # when each kill lands ($GPUSCHED_CHAOS_SEEDS)
    c = Cluster(cp)
    try:
        # one 400 share per GPU: spacers of 600 first (one per GPU), the shares beside them, spacers gone
        for i in range(8):
            c.pod(f"spacer-{i}", {RES_MILLI: "600"})
        wait_until(lambda: len(c.running()) == 8, timeout=60, what="spacers bound")
        # the bare shares first: they take the GPUs a plan would otherwise empty first (the lowest)
        for i in range(2):
            c.pod(f"bare-{i}", {RES_MILLI: "400"})
        wait_until(lambda: len(c.running()) == 10, timeout=60, what="the bare shares bound")
        c.deployment("web", 6, 400)
        wait_until(lambda: len(c.running()) == 16, timeout=60, what="the Deployment's shares bound")
        for i in range(8):
            c.delete(f"spacer-{i}")
        wait_until(lambda: len(c.running()) == 8, timeout=60, what="spacers gone")
        bare = {
            n: (p["metadata"]["uid"], p["spec"]["nodeName"])
            for n, p in c.running().items()
            if n.startswith("bare")
        }
        assert len(bare) == 2
        for i in range(4):
            c.pod(f"wait-{i}", {RES_GPU: "1"})
        log = tmp_path / "defrag.log"
        proc = controller(c, log)
        kills = 0
        try:
            while kills < KILLS:
                seen = len(c.events("DefragPlanned"))
                try:
                    wait_until(
                        lambda s=seen: len(c.events("DefragPlanned")) > s, timeout=20, what="a plan started"
                    )
                except Exception:
                    break  # no more plans (the budget is spent): the rest of the run settles
                time.sleep(
                    rng.uniform(0.0, 1.5)
                )  # somewhere in the plan: before, during or after its eviction
                proc.send_signal(signal.SIGKILL)
                proc.wait(10)
                kills += 1
                proc = controller(c, log)
            time.sleep(15)  # the last process runs on: any further plan within the budget
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        running = c.running()
        # no pod without an owner ever moved
        assert {
            n: (p["metadata"]["uid"], p["spec"]["nodeName"])
            for n, p in running.items()
            if n.startswith("bare")
        } == bare
        moved = {e["involvedObject"]["name"] for e in c.events("Defragmented")}
        assert not any(n.startswith("bare") for n in moved)
        # the move budget held across the restarts
        assert 1 <= len(moved) <= BUDGET, (moved, log.read_text()[-3000:])
        landed = [n for n in running if n.startswith("wait")]
        # no GPU booked twice
        per_gpu: dict[int, int] = {}
        for p in running.values():
            a = json.loads((p["metadata"].get("annotations") or {}).get(ANN_ASSIGNMENT, "null") or "null")
            if a:
                for g in a["gpus"]:
                    per_gpu[g] = per_gpu.get(g, 0) + int(a.get("milli", 1000))
        assert all(v <= 1000 for v in per_gpu.values()), per_gpu
        print(f"chaos-defrag: {kills} kills, {len(moved)} moves {sorted(moved)}, {len(landed)} pods landed")
    finally:
        c.cleanup()
