"""Way (b) of MIG reshaping on a real kube-apiserver (issue 31 item 3): the agent's mig-manager way writes the
mig-parted ConfigMap and the Node's ``nvidia.com/mig.config`` label through the API and waits for
``nvidia.com/mig.config.state``, which a stand-in mig-manager thread (tests/migmanager_standin.py) sets after
re-cutting a fake node's GPUs; a failed or unanswered configuration puts the label back."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import yaml

from gpusched.agent.fake import FakeBackend
from gpusched.agent.pods import KubePods
from gpusched.agent.reshape.apply import layout_of, mig_gpu
from gpusched.agent.reshape.manager import (
    CONFIG_KEY,
    LABEL_CONFIG,
    LABEL_STATE,
    KubeConfigMaps,
    ManagerOutcome,
    ManagerSettings,
    MigManagerWay,
)
from gpusched.core.mig.geometry import Instance
from gpusched.core.mig.reshape import GpuNow, ReshapeScope, plan_reshape
from gpusched.testenv import ControlPlane
from migmanager_standin import StandInMigManager

pytestmark = pytest.mark.e2e

BALANCED = [
    {"profile": "2g.20gb", "start": 0},
    {"profile": "1g.10gb", "start": 2},
    {"profile": "1g.10gb", "start": 3},
    {"profile": "3g.40gb", "start": 4},
]
IN_USE = Instance("3g.40gb", 4)  # GPU 0's 3g runs a pod


class Cluster:
    """A Node and an operator namespace on the apiserver, the stand-in mig-manager and the agent's way."""

    def __init__(self, cp: ControlPlane, core_v1: Any, node: str, mode: str, timeout_s: float) -> None:
        self.node, self.core = node, core_v1
        self.settings = ManagerSettings(
            namespace=f"{node}-op", configmap="mig-parted", timeout_s=timeout_s, poll_s=0.1
        )
        core_v1.create_namespace({"metadata": {"name": self.settings.namespace}})
        labels = {LABEL_CONFIG: "all-balanced", LABEL_STATE: "success"}
        core_v1.create_node({"metadata": {"name": node, "labels": labels}})
        doc = {
            "hostname": node,
            "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "migMode": True, "mig": BALANCED}] * 2,
        }
        self.gpus = FakeBackend.from_dict(doc, "fake GPUs")
        kube = KubePods(str(cp.kubeconfig_path))
        self.configmaps = KubeConfigMaps(cp.api_client())
        self.way = MigManagerWay(kube, self.configmaps, self.settings)
        self.standin = StandInMigManager(node, self.gpus, self.labels, self._set_labels, self._config, mode)
        self.stop = threading.Event()
        self.thread = self.standin.run(self.stop)

    def labels(self) -> Mapping[str, str]:
        return dict(self.core.read_node(self.node).metadata.labels or {})

    def _set_labels(self, change: Mapping[str, str | None]) -> None:
        self.core.patch_node(self.node, {"metadata": {"labels": dict(change)}})

    def _config(self) -> str | None:
        found = self.configmaps.read(self.settings.namespace, self.settings.configmap)
        return None if found is None else found[0].get(CONFIG_KEY)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.core.delete_node(self.node)
        self.core.delete_namespace(self.settings.namespace)


@pytest.fixture
def cluster(control_plane: ControlPlane, core_v1: Any, unique_name: Callable[[str], str]) -> Iterator[Any]:
    made: list[Cluster] = []

    def make(mode: str = "ok", timeout_s: float = 30.0) -> Cluster:
        c = Cluster(control_plane, core_v1, unique_name("mig"), mode, timeout_s)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def plan(c: Cluster) -> Any:
    gpus = [mig_gpu(c.node, d) for d in c.gpus.inventory().devices]
    now = [GpuNow(g, frozenset({IN_USE}) if g.name.endswith("/0") else frozenset()) for g in gpus if g]
    return plan_reshape(now, ["7g.80gb"], scope=ReshapeScope.WHOLE_GPU).steps


def test_mig_manager_recuts_the_idle_gpu_through_the_label_and_the_configmap(cluster: Any) -> None:
    c = cluster()
    kept = [m.uuid for m in c.gpus.inventory().devices[0].mig_instances]
    res = c.way.apply(c.node, c.gpus.inventory(), plan(c))
    assert res.outcome is ManagerOutcome.APPLIED, (res.message, c.standin.errors)
    assert c.labels()[LABEL_CONFIG] == res.config and c.labels()[LABEL_STATE] == "success"
    cm = c.core.read_namespaced_config_map("mig-parted", c.settings.namespace)
    configs = yaml.safe_load(cm.data[CONFIG_KEY])
    assert configs["version"] == "v1" and configs["mig-configs"][res.config] == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
    ]
    assert layout_of(c.gpus.inventory().devices[1]) == (Instance("7g.80gb", 0),)
    assert [m.uuid for m in c.gpus.inventory().devices[0].mig_instances] == kept  # GPU 0 was not touched


@pytest.mark.parametrize(
    ("mode", "outcome"), [("fail", ManagerOutcome.FAILED), ("silent", ManagerOutcome.TIMED_OUT)]
)
def test_a_failed_or_unanswered_configuration_puts_the_label_back(
    cluster: Any, mode: str, outcome: ManagerOutcome
) -> None:
    c = cluster(mode, timeout_s=2.0)
    before = c.gpus.inventory()
    res = c.way.apply(c.node, before, plan(c))
    assert res.outcome is outcome and res.reason == "MigReshapeRolledBack", res.message
    assert c.labels()[LABEL_CONFIG] == "all-balanced" and "back to all-balanced" in res.message
    assert res.config not in yaml.safe_load(c._config() or "")["mig-configs"]
    assert c.gpus.inventory() == before


def test_the_command_takes_the_nodes_label_over_its_flag_and_waits_for_mig_manager(
    cluster: Any, control_plane: ControlPlane, tmp_path: Any
) -> None:
    import json

    from typer.testing import CliRunner

    from gpusched.cli import app
    from gpusched.core.names import LABEL_MIG_RESHAPE_WAY

    c = cluster()
    c.core.patch_node(c.node, {"metadata": {"labels": {LABEL_MIG_RESHAPE_WAY: "mig-manager"}}})
    f = tmp_path / "gpus.yaml"
    doc = {
        "hostname": c.node,
        "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "migMode": True, "mig": BALANCED}] * 2,
    }
    f.write_text(yaml.safe_dump(doc))
    args = ["agent", "mig-reshape", "7g.80gb", "--fake", str(f), "--in-use", "0:3g.40gb@4", "--apply"]
    args += ["--way", "nvml", "--node", c.node, "--kubeconfig", str(control_plane.kubeconfig_path)]
    args += ["--namespace", c.settings.namespace, "--configmap", c.settings.configmap, "--timeout-s", "30"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["way"] == "mig-manager" and [x["outcome"] for x in out["results"]] == ["applied"]
    assert c.labels()[LABEL_CONFIG] == out["results"][0]["config"] and c.labels()[LABEL_STATE] == "success"
    assert c.standin.applied == [out["results"][0]["config"]]
    events = c.core.list_namespaced_event("default", field_selector=f"involvedObject.name={c.node}").items
    events = [e for e in events if e.source.component == "gpusched-agent"]  # not the node controller's
    assert [(e.type, e.reason) for e in events] == [("Normal", "MigReshaped")]
    assert out["results"][0]["config"] in events[0].message and events[0].involved_object.kind == "Node"


# ------------------------------------------------------------------ the scheduler asks, way (b) applies
GROUP = "gpusched.io/e2e-group"


class NodeAgent:
    """The node agent of a kwok node, as far as re-cuts go: its request handler (``agent.migrequest``) with
    the mig-manager way over the API, on the fake GPUs the stand-in mig-manager re-cuts; after an answer it
    publishes the new geometry and MIG resources, as ``Agent.sync_node`` and the kubelet would."""

    def __init__(self, cp: ControlPlane, core_v1: Any, c: Cluster) -> None:
        from types import SimpleNamespace

        from gpusched.agent.migrequest import MigReshapes

        self.c, self.core = c, core_v1
        self.kube = KubePods(str(cp.kubeconfig_path))
        plugin = SimpleNamespace(replace_inventory=lambda inv: None, allocator=SimpleNamespace(_unwritten={}))
        self.handler = MigReshapes(c.gpus, plugin, self.kube, self.kube, c.node, manager=c.way)
        self.errors: list[str] = []

    def publish(self) -> None:
        from gpusched.agent.mig import ANN_MIG, mig_annotation

        inv = self.c.gpus.inventory()
        self.core.patch_node(
            self.c.node, {"metadata": {"annotations": {ANN_MIG: mig_annotation(inv, "mixed")}}}
        )
        self.core.patch_node_status(
            self.c.node, {"status": {"capacity": capacity(inv), "allocatable": capacity(inv)}}
        )

    def run(self, stop: threading.Event) -> threading.Thread:
        def loop() -> None:
            while not stop.is_set():
                try:
                    if self.handler.check(self.kube.get_node(self.c.node)):
                        self.publish()
                except Exception as e:  # a transient API error: the next round retries
                    self.errors.append(str(e))
                stop.wait(0.2)

        t = threading.Thread(target=loop, name="node agent", daemon=True)
        t.start()
        return t


def capacity(inv: Any) -> dict[str, str]:
    cap = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    for d in inv.devices:
        for i in layout_of(d):
            res = f"nvidia.com/mig-{i.profile}"
            cap[res] = str(int(cap.get(res, "0")) + 1)
    return cap


@pytest.fixture
def way_b(control_plane: ControlPlane, core_v1: Any, cluster: Any) -> Iterator[Any]:
    """A kwok node of two idle all-balanced A100s whose pool re-cuts through mig-manager, its agent, the
    stand-in mig-manager and the standalone scheduler."""
    from gpusched.agent.mig import ANN_MIG, mig_annotation
    from gpusched.core.names import LABEL_MIG_RESHAPE_WAY
    from gpusched.k8s.client import api_client
    from gpusched.k8s.scheduler import SchedulerConfig, StandaloneScheduler
    from gpusched.testenv import wait_until

    made: list[tuple[Any, ...]] = []

    def make(mode: str = "ok") -> Any:
        c = cluster(mode, timeout_s=20.0)
        inv = c.gpus.inventory()
        labels = {"type": "kwok", GROUP: c.node, LABEL_MIG_RESHAPE_WAY: "mig-manager"}
        ann = {"node.alpha.kubernetes.io/ttl": "0", ANN_MIG: mig_annotation(inv, "mixed")}
        core_v1.patch_node(c.node, {"metadata": {"labels": labels, "annotations": ann}})
        core_v1.patch_node_status(
            c.node, {"status": {"capacity": capacity(inv), "allocatable": capacity(inv)}}
        )
        wait_until(
            lambda: any(
                x.type == "Ready" and x.status == "True"
                for x in core_v1.read_node(c.node).status.conditions or []
            ),
            timeout=120,
            what="kwok node Ready",
            control_plane=control_plane,
            interval=1,
        )
        core_v1.create_namespace({"metadata": {"name": f"{c.node}-pods"}})
        agent = NodeAgent(control_plane, core_v1, c)
        agent_thread = agent.run(c.stop)
        name = f"gpusched-{c.node}"
        sched = StandaloneScheduler(
            api_client(str(control_plane.kubeconfig_path)), SchedulerConfig(scheduler_name=name)
        ).start()
        made.append((sched, agent_thread, c))
        return c, agent, sched, name

    yield make
    for sched, _t, c in made:
        sched.stop()
        core_v1.delete_namespace(f"{c.node}-pods")


def mig_pod(c: Cluster, name: str, profile: str, scheduler: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": f"{c.node}-pods"},
        "spec": {
            "schedulerName": scheduler,
            "nodeSelector": {GROUP: c.node},
            "containers": [
                {"name": "c", "image": "pause", "resources": {"limits": {f"nvidia.com/mig-{profile}": "1"}}}
            ],
        },
    }


def test_a_pending_mig_pod_on_a_mig_manager_node_gets_a_recut_through_mig_manager_and_lands(
    way_b: Any,
) -> None:
    """A 7g pod fits nowhere (both GPUs all-balanced): the scheduler asks for a whole-GPU re-cut, the agent
    hands it to mig-manager (ConfigMap entry, label), the stand-in re-cuts and says success, and the pod is
    bound to the new 7g instance."""
    import json

    from gpusched.k8s.convert import ANN_ASSIGNMENT
    from gpusched.testenv import wait_until

    c, agent, _sched, name = way_b()
    c.core.create_namespaced_pod(f"{c.node}-pods", mig_pod(c, "big", "7g.80gb", name))

    def bound() -> dict[str, Any] | None:
        p = c.core.read_namespaced_pod("big", f"{c.node}-pods")
        ann = (p.metadata.annotations or {}).get(ANN_ASSIGNMENT)
        return json.loads(ann) if p.spec.node_name and ann else None

    try:
        a = wait_until(bound, timeout=90, what="the 7g pod bound after the re-cut", interval=0.5)
    except TimeoutError as e:
        raise AssertionError(
            f"{e}: stand-in {c.standin.errors}, agent {agent.errors}, labels {c.labels()}"
        ) from None
    assert a["node"] == c.node and a["mig"] == [{"gpu": a["mig"][0]["gpu"], "start": 0, "profile": "7g.80gb"}]
    assert (
        c.standin.applied
        and c.labels()[LABEL_STATE] == "success"
        and c.labels()[LABEL_CONFIG] == c.standin.applied[-1]
    )
    gpu = a["mig"][0]["gpu"]
    assert layout_of(c.gpus.inventory().devices[gpu]) == (Instance("7g.80gb", 0),)
    other = c.gpus.inventory().devices[1 - gpu]
    assert sorted(i.profile for i in layout_of(other)) == [
        "1g.10gb",
        "1g.10gb",
        "2g.20gb",
        "3g.40gb",
    ]  # untouched


def test_a_failing_mig_manager_gives_the_pod_an_event_and_frees_the_gpu(way_b: Any) -> None:
    """The stand-in fails every configuration: the agent puts the label back and answers failed; the pod gets
    MIGReshapeFailed naming mig-manager's failure, the GPUs are as they were, and once the pod is gone the
    scheduler's books hold no GPU of the node as being re-cut."""
    from gpusched.testenv import wait_until

    c, _agent, sched, name = way_b("fail")
    before = c.gpus.inventory()
    c.core.create_namespaced_pod(f"{c.node}-pods", mig_pod(c, "big", "7g.80gb", name))

    def failed() -> list[str] | None:
        evs = c.core.list_namespaced_event(f"{c.node}-pods", field_selector="involvedObject.name=big").items
        got = [e.message for e in evs if e.reason == "MIGReshapeFailed"]
        return got or None

    msgs = wait_until(failed, timeout=90, what="a MIGReshapeFailed event on the pod", interval=0.5)
    assert "failed and was rolled back" in msgs[0] and "mig.config.state=failed" in msgs[0], msgs
    assert c.labels()[LABEL_CONFIG] == "all-balanced" and c.gpus.inventory() == before
    assert not c.core.read_namespaced_pod("big", f"{c.node}-pods").spec.node_name
    c.core.delete_namespaced_pod("big", f"{c.node}-pods", grace_period_seconds=0)

    def freed() -> bool:
        sched.mig_reshapes.settle()
        with sched.cluster.live_books() as snap:
            nm = snap.nodes[snap.index[c.node]].mig
            return nm is not None and not nm.reshaping and not sched.mig_reshapes._asked

    wait_until(freed, timeout=60, what="the node's GPUs taking pods again", interval=0.5)
