"""MIG on a real kubelet (issue 31): the agent serves a fake A100 in MIG mode beside the session's four GPUs;
the standalone scheduler books a 1g.10gb pod and a 3g.40gb pod on their slices from the agent's geometry, the
kubelet admits them through the agent's Allocate, and each container's environment names exactly the MIG
device its assignment names. A pod bound by hand whose assignment names an instance the GPU lacks is refused
at admission with the agent's event naming the pod and the field. A 4g.40gb pod that no instance fits gets
its GPU's free slices re-cut by the agent (way (a), the fake backend) and starts on the new instance.

The MIG GPU exists only during this test (the agent is restarted with it and without it): the other tests
count the session's four GPUs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubeletlib import STANDALONE, KubeletEnv, Ns
from test_real_node import _pod, agent_events, assignment, checkpoint_gpus, visible

from gpusched.agent.mig import ANN_MIG
from gpusched.core.names import ANN_MIG_RESHAPE, ANN_MIG_RESHAPE_STATUS
from gpusched.k8s.convert import ANN_ASSIGNMENT
from gpusched.testenv import wait_until

pytestmark = pytest.mark.kubelet

INSTANCES: list[dict[str, Any]] = [
    *(
        {"profile": "1g.10gb", "start": s, "uuid": f"MIG-7e57a100-0000-4000-8000-00000000010{s}"}
        for s in (0, 1, 2)
    ),
    {"profile": "3g.40gb", "start": 4, "uuid": "MIG-7e57a100-0000-4000-8000-000000000304"},
]
MIG_GPU = {
    "model": "NVIDIA A100-SXM4-80GB",
    "uuid": "GPU-7e57a100-0000-4000-8000-000000000004",
    "numaNode": 0,
    "migMode": True,
    "mig": INSTANCES,
}
UUID_AT = {(m["profile"], m["start"]): m["uuid"] for m in INSTANCES}
R1G, R3G, R4G = "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "nvidia.com/mig-4g.40gb"


@pytest.fixture
def mig_node(kubelet_env: KubeletEnv) -> Iterator[int]:
    """The agent restarted with a fifth GPU (NVML index 4) in MIG mode; afterwards as it was."""
    node = kubelet_env.node
    path = node.fake_gpus_path
    before = path.read_text()
    count = (node.node()["metadata"].get("labels") or {}).get("nvidia.com/gpu.count")
    doc = yaml.safe_load(before)
    doc["gpus"] = [*doc["gpus"], MIG_GPU]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    try:
        node.restart_agent()

        def served() -> bool:
            n = node.node()
            cap = n.get("status", {}).get("allocatable", {})
            ann = n["metadata"].get("annotations") or {}
            return cap.get(R1G) == "3" and cap.get(R3G) == "1" and ANN_MIG in ann

        wait_until(lambda: kubelet_env.check_alive() or served(), timeout=60, what="the MIG devices served")
        yield len(doc["gpus"]) - 1
    finally:
        path.write_text(before)
        node.restart_agent()  # it waits for nvidia.com/gpu, which never changed: wait for its labels too

        def relabelled() -> bool:
            return (node.node()["metadata"].get("labels") or {}).get("nvidia.com/gpu.count") == count

        wait_until(
            lambda: kubelet_env.check_alive() or relabelled(), timeout=60, what="the agent's labels back"
        )
        labels = node.node()["metadata"].get("labels") or {}
        stale = {k: None for k in labels if k.startswith("nvidia.com/mig-") or k == "nvidia.com/mig.strategy"}
        meta = {"annotations": {ANN_MIG_RESHAPE: None, ANN_MIG_RESHAPE_STATUS: None}, "labels": stale}
        kubelet_env.core.patch_node(node.name, {"metadata": meta})  # the agent adds, never removes


def mig_pod(name: str, image: str, resource: str, **kw: Any) -> dict[str, Any]:
    return _pod(name, image, {resource: "1"}, **kw)


def test_two_profiles_land_and_each_container_sees_its_mig_device(
    kubelet_env: KubeletEnv, ns: Ns, mig_node: int
) -> None:
    image = kubelet_env.node.busybox_image
    for name, res in (("small", R1G), ("big", R3G)):
        ns.create(mig_pod(name, image, res, scheduler=STANDALONE))
    for name, profile in (("small", "1g.10gb"), ("big", "3g.40gb")):
        pod = ns.running(name)
        a = assignment(pod)
        assert a["gpus"] == [] and len(a["mig"]) == 1, a
        sl = a["mig"][0]
        assert sl["gpu"] == mig_node and sl["profile"] == profile, a
        want = UUID_AT[(profile, sl["start"])]
        assert visible(ns.exec_env(name)) == [want], name
        assert visible(ns.logs_env(name)) == [want], name
        res = R1G if profile == "1g.10gb" else R3G
        assert checkpoint_gpus(res)[pod["metadata"]["uid"]] == [want]  # the kubelet's books agree
        allocated = json.loads(pod["metadata"]["annotations"]["gpusched.io/allocated"])
        assert allocated == {"main": {res: [want]}}


def test_a_hand_written_assignment_naming_a_missing_instance_is_refused_with_an_event(
    kubelet_env: KubeletEnv, ns: Ns, mig_node: int
) -> None:
    node = kubelet_env.node.name
    missing = [{"gpu": mig_node, "start": 5, "profile": "1g.10gb"}]
    bad = json.dumps({"node": node, "gpus": [], "milli": 0, "memoryMiB": 0, "mig": missing})
    image = kubelet_env.node.busybox_image
    name = ns.create(mig_pod("ghost", image, R1G, node=node, annotations={ANN_ASSIGNMENT: bad}))
    expect = f"field mig names MIG 1g.10gb at slice 5 of GPU {mig_node}, which node {node} does not have"

    def failed() -> dict[str, Any] | None:
        st = ns.pod(name)["status"]
        return st if st.get("phase") == "Failed" else None

    st = ns.wait(f"{name} refused at admission", failed, 60)
    assert st.get("reason") == "UnexpectedAdmissionError" and expect in st.get("message", ""), st
    msgs = ns.wait(f"the agent's event on {name}", lambda: agent_events(ns, name), 30)
    assert any(f"pod {ns.name}/{name}" in m and ANN_ASSIGNMENT in m and expect in m for m in msgs), msgs


def test_a_pod_no_instance_fits_gets_a_recut_and_lands_on_the_new_instance(
    kubelet_env: KubeletEnv, ns: Ns, mig_node: int
) -> None:
    """Way (a) of issue 31 item 3 on the fake backend: a 4g.40gb pod finds no 4g instance; the scheduler asks
    the agent to re-cut GPU 4's free slices (the three 1g, the 3g stays), the agent applies it, the kubelet
    gets the new device, and the pod starts on it."""
    name = ns.create(mig_pod("big4", kubelet_env.node.busybox_image, R4G, scheduler=STANDALONE))
    pod = ns.running(name, timeout=120)
    a = assignment(pod)
    assert a["mig"] == [{"gpu": mig_node, "start": 0, "profile": "4g.40gb"}], a
    geometry = json.loads(kubelet_env.node.node()["metadata"]["annotations"][ANN_MIG])
    gpu = next(g for g in geometry["gpus"] if g["index"] == mig_node)
    now = {(i["profile"], i["start"]): i["uuid"] for i in gpu["instances"]}
    assert set(now) == {("4g.40gb", 0), ("3g.40gb", 4)}, now  # the 1g destroyed, the 3g kept as it was
    assert now[("3g.40gb", 4)] == UUID_AT[("3g.40gb", 4)]
    assert visible(ns.exec_env(name)) == [now[("4g.40gb", 0)]]
    notes = [str(e.get("message", "")) for e in ns.events(name) if e.get("reason") == "FailedScheduling"]
    assert any(
        f"re-cutting GPU {mig_node} of node {kubelet_env.node.name} for it (4g.40gb at 0)" in m for m in notes
    )
