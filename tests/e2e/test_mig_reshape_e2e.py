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
