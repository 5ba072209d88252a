"""Way (b) of MIG reshaping (agent/reshape/manager.py) in memory: the mig-parted configuration it writes,
and the label / wait / rollback cycle against the stand-in mig-manager (tests/migmanager_standin.py); which
way a node takes (agent/reshape/way.py). The same cycle on a real kube-apiserver:
tests/e2e/test_mig_reshape_e2e.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from gpusched.agent.fake import FakeBackend
from gpusched.agent.pods import MemoryPods
from gpusched.agent.reshape.apply import layout_of, mig_gpu
from gpusched.agent.reshape.manager import (
    CONFIG_KEY,
    LABEL_CONFIG,
    LABEL_STATE,
    ManagerOutcome,
    ManagerSettings,
    MigManagerWay,
    check_mig_parted,
    entry_name,
    mig_parted_entry,
    node_configs,
)
from gpusched.agent.reshape.way import ReshapeWay, reshape_way
from gpusched.core.errors import InvalidInput
from gpusched.core.mig.geometry import Instance
from gpusched.core.mig.reshape import GpuNow, GpuReshape, ReshapeScope, plan_reshape
from gpusched.core.names import LABEL_MIG_RESHAPE_WAY
from migmanager_standin import StandInMigManager

NODE = "node-b"
BALANCED = [
    {"profile": "2g.20gb", "start": 0},
    {"profile": "1g.10gb", "start": 2},
    {"profile": "1g.10gb", "start": 3},
    {"profile": "3g.40gb", "start": 4},
]
DOC: dict[str, Any] = {
    "hostname": NODE,
    "gpus": [
        {"model": "NVIDIA A100-SXM4-80GB", "migMode": True, "mig": BALANCED},
        {"model": "NVIDIA A100-SXM4-80GB", "migMode": True, "mig": BALANCED},
        {"model": "NVIDIA A100-SXM4-80GB"},
        {"model": "Tesla T4"},
    ],
}
S = ManagerSettings(namespace="gpu-operator", configmap="mig-parted", timeout_s=30, poll_s=1)


class MemoryConfigMaps:
    def __init__(self) -> None:
        self.maps: dict[tuple[str, str], tuple[dict[str, str], int]] = {}

    def read(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        found = self.maps.get((namespace, name))
        return None if found is None else (dict(found[0]), str(found[1]))

    def write(self, namespace: str, name: str, data: Mapping[str, str], resource_version: str | None) -> bool:
        found = self.maps.get((namespace, name))
        if (found is None) != (resource_version is None) or (found and str(found[1]) != resource_version):
            return False
        self.maps[(namespace, name)] = (dict(data), (found[1] if found else 0) + 1)
        return True

    def configs(self) -> dict[str, Any]:
        data, _ = self.maps[(S.namespace, S.configmap)]
        return dict(yaml.safe_load(data[CONFIG_KEY])["mig-configs"])


def plan_for(
    gpus: FakeBackend, in_use: dict[int, set[Instance]], pending: list[str]
) -> tuple[GpuReshape, ...]:
    now = []
    for d in gpus.inventory().devices:
        g = mig_gpu(NODE, d)
        if g is not None:
            now.append(GpuNow(g, frozenset(in_use.get(d.index, set()))))
    return plan_reshape(now, pending, scope=ReshapeScope.WHOLE_GPU).steps


class Setup:
    def __init__(self, mode: str = "ok", labels: dict[str, str] | None = None) -> None:
        self.gpus = FakeBackend.from_dict(DOC, "doc")
        self.pods = MemoryPods(nodes={NODE: {"metadata": {"name": NODE, "labels": dict(labels or {})}}})
        self.cms = MemoryConfigMaps()
        self.now = 0.0
        self.standin = StandInMigManager(
            NODE,
            self.gpus,
            lambda: self.pods.get_node(NODE)["metadata"].get("labels") or {},
            lambda change: self.pods.patch_node(NODE, {"metadata": {"labels": dict(change)}}),
            lambda: (self.cms.read(S.namespace, S.configmap) or ({}, ""))[0].get(CONFIG_KEY),
            mode,
        )
        self.way = MigManagerWay(self.pods, self.cms, S, clock=lambda: self.now, sleep=self._sleep)

    def _sleep(self, s: float) -> None:  # time passes; mig-manager does its round
        self.now += s
        self.standin.step()

    def labels(self) -> dict[str, str]:
        return dict(self.pods.get_node(NODE)["metadata"].get("labels") or {})


# ------------------------------------------------------------------------------------------ the configuration
def test_the_entry_lists_every_mig_gpu_with_the_target_or_what_it_holds() -> None:
    gpus = FakeBackend.from_dict(DOC, "doc")
    steps = plan_for(gpus, {0: {Instance("3g.40gb", 4)}}, ["7g.80gb"])
    assert [s.gpu for s in steps] == [f"{NODE}/1"]
    entry = mig_parted_entry(node_configs(NODE, gpus.inventory(), steps))
    assert entry == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
        {"devices": [2], "mig-enabled": False},  # the T4 has no MIG: not listed
    ]
    assert check_mig_parted({"version": "v1", "mig-configs": {"x": entry}}, "doc") == {"x": entry}
    same = mig_parted_entry(node_configs(NODE, gpus.inventory(), ()))
    assert same[0] == {"devices": [0, 1], "mig-enabled": True, "mig-devices": entry[0]["mig-devices"]}
    assert entry_name(NODE, entry).startswith(f"gpusched-{NODE}-") and entry_name(NODE, entry) != entry_name(
        NODE, same
    )
    bogus = GpuReshape(f"{NODE}/3", False, (), (), (), (), ())
    with pytest.raises(InvalidInput, match=r"node-b/3: no such MIG GPU on node node-b"):
        node_configs(NODE, gpus.inventory(), (bogus,))


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        ({"mig-configs": {"a": [{"devices": "all", "mig-enabled": False}]}}, "version: v1"),
        ({"version": "v1", "mig-configs": {}}, "at least one entry in 'mig-configs'"),
        ({"version": "v1", "mig-configs": {"a": []}}, "at least one entry in 'a'"),
        ({"version": "v1", "mig-configs": {"a": [{"devices": "all"}]}}, "needs devices and mig-enabled"),
        (
            {"version": "v1", "mig-configs": {"a": [{"devices": "some", "mig-enabled": False}]}},
            "'all' or GPU",
        ),
        (
            {"version": "v1", "mig-configs": {"a": [{"devices": [0], "mig-enabled": True}]}},
            "mig-devices is req",
        ),
        (
            {
                "version": "v1",
                "mig-configs": {"a": [{"devices": [0], "mig-enabled": False, "mig-devices": {"x": 1}}]},
            },
            "included when mig-enabled is false",
        ),
        (
            {"version": "v1", "mig-configs": {"a": [{"devices": [0], "mig-enabled": False, "x": 1}]}},
            "unexpected",
        ),
    ],
)
def test_what_mig_parted_refuses_is_refused(doc: dict[str, Any], error: str) -> None:
    with pytest.raises(InvalidInput, match=error):
        check_mig_parted(doc, "doc")


# ------------------------------------------------------------------------------------------------ the cycle
def test_the_label_names_the_new_entry_and_mig_manager_recuts_only_that_gpu() -> None:
    s = Setup(labels={LABEL_CONFIG: "all-balanced", LABEL_STATE: "success"})
    kept = [m.uuid for m in s.gpus.inventory().devices[0].mig_instances]
    steps = plan_for(s.gpus, {0: {Instance("3g.40gb", 4)}}, ["7g.80gb"])
    res = s.way.apply(NODE, s.gpus.inventory(), steps)
    assert res.outcome is ManagerOutcome.APPLIED and (res.reason, res.event_type) == ("MigReshaped", "Normal")
    assert s.labels() == {LABEL_CONFIG: res.config, LABEL_STATE: "success"} and res.previous == "all-balanced"
    assert s.standin.applied == [res.config]
    assert layout_of(s.gpus.inventory().devices[1]) == (Instance("7g.80gb", 0),)
    assert [m.uuid for m in s.gpus.inventory().devices[0].mig_instances] == kept  # skipped by mig-parted
    assert list(s.cms.configs()) == [res.config]
    # the next reshape names a new entry and prunes the one the label no longer names
    steps = plan_for(s.gpus, {0: {Instance("3g.40gb", 4)}}, ["4g.40gb"])
    again = s.way.apply(NODE, s.gpus.inventory(), steps)
    assert again.ok and again.previous == res.config and list(s.cms.configs()) == [again.config]
    assert s.way.apply(NODE, s.gpus.inventory(), ()).waited_s >= 0  # nothing to change: the current counts


def test_a_failed_configuration_puts_the_label_back() -> None:
    s = Setup("fail", labels={LABEL_CONFIG: "all-balanced", LABEL_STATE: "success"})
    before = s.gpus.inventory()
    res = s.way.apply(NODE, before, plan_for(s.gpus, {}, ["7g.80gb"]))
    assert res.outcome is ManagerOutcome.FAILED and res.reason == "MigReshapeRolledBack"
    assert res.event_type == "Warning" and "back to all-balanced" in res.message
    assert s.labels()[LABEL_CONFIG] == "all-balanced" and res.state == "failed"
    assert s.gpus.inventory() == before
    assert res.config not in s.cms.configs()  # the failed entry is gone


def test_a_configuration_mig_manager_is_still_applying_is_waited_for_first() -> None:
    """mig-manager is applying all-balanced (state pending) when the agent comes: its result for that one
    (failed, here) must not be read as the new configuration's."""
    s = Setup(labels={LABEL_CONFIG: "all-balanced", LABEL_STATE: "pending"})
    s.standin.seen = "all-balanced"
    finish = s.standin.step

    def next_round() -> None:  # its next round ends all-balanced; then it goes on as usual
        s.pods.patch_node(NODE, {"metadata": {"labels": {LABEL_STATE: "failed"}}})
        s.standin.step = finish  # type: ignore[method-assign]

    s.standin.step = next_round  # type: ignore[method-assign]
    res = s.way.apply(NODE, s.gpus.inventory(), plan_for(s.gpus, {}, ["7g.80gb"]))
    assert res.outcome is ManagerOutcome.APPLIED and res.previous == "all-balanced", res.message
    assert s.standin.applied == [res.config] and s.labels()[LABEL_STATE] == "success"


def test_no_answer_in_time_puts_the_label_back() -> None:
    s = Setup("silent")
    res = s.way.apply(NODE, s.gpus.inventory(), plan_for(s.gpus, {}, ["7g.80gb"]))
    assert res.outcome is ManagerOutcome.TIMED_OUT and res.waited_s >= S.timeout_s
    assert LABEL_CONFIG not in s.labels() and "removed" in res.message and "after 30 s" in res.message


def test_an_entry_already_in_place_is_not_applied_again() -> None:
    s = Setup()
    first = s.way.apply(NODE, s.gpus.inventory(), plan_for(s.gpus, {}, ["7g.80gb"]))
    patches = len(s.pods.node_patches)
    again = s.way.apply(NODE, s.gpus.inventory(), ())
    assert again.ok and again.config == first.config and len(s.pods.node_patches) == patches


# --------------------------------------------------------------------------------------------------- the way
def test_the_node_label_chooses_the_way_else_the_agent_flag() -> None:
    assert reshape_way("n", {}, ReshapeWay.NVML) is ReshapeWay.NVML
    assert reshape_way("n", {LABEL_MIG_RESHAPE_WAY: "mig-manager"}, ReshapeWay.NVML) is ReshapeWay.MIG_MANAGER
    assert reshape_way("n", {LABEL_MIG_RESHAPE_WAY: "off"}, ReshapeWay.NVML).scope is None
    assert ReshapeWay.NVML.scope is ReshapeScope.FREE_SLICES
    assert ReshapeWay.MIG_MANAGER.scope is ReshapeScope.WHOLE_GPU
    with pytest.raises(
        InvalidInput, match=r"node n: label gpusched.io/mig-reshape-way: 'nvlm' is not a MIG reshape"
    ):
        reshape_way("n", {LABEL_MIG_RESHAPE_WAY: "nvlm"}, ReshapeWay.NVML)
