"""``bench stacks`` against the real kube-scheduler: the stock whole-GPU stack and the time-slicing
stack (replicas 4) of ``sim.stacks`` must place the first K pods of a churn stream as kube-scheduler
does. kwok nodes advertise ``nvidia.com/gpu`` as NVIDIA's device plugin would (x replicas when
time-sliced); each pod asks ``nvidia.com/gpu`` (a share: 1) with its CPU and memory. Pods go one at
a time; after each, the real outcome must be the simulated one: unschedulable in both, or bound to
a node among those the simulated stack scores best (kube-scheduler breaks ties at random). The
simulation then books the pod where kube-scheduler put it, so both see the same cluster next."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from gpusched.core.cluster import ClusterState
from gpusched.core.model import NodeSpec, PodSpec
from gpusched.core.policies import PolicyContext
from gpusched.core.scheduler import feasible, most_preferred, score_nodes
from gpusched.sim.churn import ChurnConfig, draw_pods
from gpusched.sim.stacks.catalog import Stack, stacks_named
from gpusched.sim.synthetic import SyntheticConfig, synthetic_workload
from gpusched.testenv import wait_until

pytestmark = pytest.mark.e2e

K = 36
GROUP = "gpusched.io/stacks-e2e"
NS = "default"


def best_nodes(stack: Stack, snap: ClusterState, pod: PodSpec) -> set[str]:
    """The nodes the simulated stack rates best for ``pod`` (empty: it fits nowhere)."""
    profile = stack.profile(PolicyContext())
    f = feasible(profile, pod, snap)
    fits = f.indices()
    if not len(fits):
        return set()
    cand = most_preferred(f.state, profile, pod, snap, fits)
    total, _ = score_nodes(f.state, profile, pod, snap, cand)
    return {snap.names[int(n)] for n in cand[total >= total.max() - 1e-9]}


def _node(n: NodeSpec, tag: str, replicas: int) -> dict[str, Any]:
    res = {"cpu": f"{n.cpu_milli}m", "memory": f"{n.memory_mib}Mi", "pods": "110"}
    res["nvidia.com/gpu"] = str(n.gpu_count * replicas)
    return {
        "metadata": {
            "name": f"{tag}-{n.name}",
            "labels": {
                "type": "kwok",
                GROUP: tag,
                "kubernetes.io/hostname": f"{tag}-{n.name}",
                "nvidia.com/gpu.product": n.gpu_model,
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": [{"key": GROUP, "value": tag, "effect": "NoSchedule"}]},
        "status": {"capacity": res, "allocatable": res},
    }


def _pod(p: PodSpec, tag: str) -> dict[str, Any]:
    req = {"cpu": f"{p.cpu_milli}m", "memory": f"{p.memory_mib}Mi"}
    lim: dict[str, str] = {}
    if p.num_gpu:
        req["nvidia.com/gpu"] = lim["nvidia.com/gpu"] = str(p.num_gpu)
    spec: dict[str, Any] = {
        "nodeSelector": {GROUP: tag},
        "tolerations": [{"key": GROUP, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"name": "c", "image": "busybox", "resources": {"requests": req, "limits": lim}}],
    }
    if p.gpu_models:
        term = {"key": "nvidia.com/gpu.product", "operator": "In", "values": sorted(p.gpu_models)}
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [term]}]
                }
            }
        }
    return {"metadata": {"name": f"{tag}-{p.name}", "labels": {GROUP: tag}}, "spec": spec}


def _outcome(core_v1: Any, name: str) -> str | None:
    """The node the pod was bound to, "" when kube-scheduler found it unschedulable, None meanwhile."""
    pod = core_v1.read_namespaced_pod(name, NS)
    if pod.spec.node_name:
        return str(pod.spec.node_name)
    for c in pod.status.conditions or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return ""
    return None


@pytest.mark.parametrize("stack_name", ["stock", "timeslice-4"])
def test_kube_scheduler_places_the_stream_as_the_simulated_stack(
    control_plane: Any, core_v1: Any, stack_name: str
) -> None:
    stack = stacks_named([stack_name])[0]
    nodes, pool = synthetic_workload(SyntheticConfig(nodes=4, seed=0))
    specs, _, _ = draw_pods(pool, nodes, ChurnConfig(seed=0))
    tag = f"stk-{uuid.uuid4().hex[:6]}"
    for n in nodes:
        core_v1.create_node(_node(n, tag, stack.replicas), _preload_content=False)

    def ready() -> bool:
        items = core_v1.list_node(label_selector=f"{GROUP}={tag}").items
        return len(items) == len(nodes) and all(
            any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or []) for n in items
        )

    wait_until(ready, timeout=120, what="kwok nodes Ready", control_plane=control_plane, interval=0.5)
    # kube-scheduler's cache must hold every node before the stream starts: one tiny pod bound to each
    # (they stay, and the simulation books them too)
    probes = [PodSpec(f"probe-{k}", cpu_milli=1, memory_mib=1) for k in range(len(nodes))]
    for pr, n in zip(probes, nodes, strict=True):
        body = _pod(pr, tag)
        body["spec"]["nodeSelector"]["kubernetes.io/hostname"] = f"{tag}-{n.name}"
        core_v1.create_namespaced_pod(NS, body, _preload_content=False)
    for pr in probes:
        name = f"{tag}-{pr.name}"
        wait_until(lambda name=name: _outcome(core_v1, name) or None, timeout=60, what=f"{name} bound")
    sim_nodes = [replace(n, name=f"{tag}-{n.name}") for n in stack.placement_nodes(nodes)]
    snap = ClusterState(sim_nodes)
    for k, pr in enumerate(probes):
        snap.assume(pr, k, ())
    agree = placed = refused = 0
    disagreements: list[str] = []
    trace: list[str] = []
    try:
        for p in specs[:K]:
            booked = stack.placement_spec(p)
            want = best_nodes(stack, snap, booked)
            name = f"{tag}-{p.name}"
            core_v1.create_namespaced_pod(NS, _pod(booked, tag), _preload_content=False)
            got = wait_until(
                lambda name=name: _outcome(core_v1, name),
                timeout=60,
                what=f"{name} bound or unschedulable",
                control_plane=control_plane,
            )
            if got == "":
                refused += 1
                core_v1.delete_namespaced_pod(name, NS, grace_period_seconds=0)
            else:
                placed += 1
                node = snap.index[got]
                free = np.flatnonzero(snap.gpu_free[node] == 1000)[: booked.num_gpu]
                snap.assume(booked, node, tuple(int(g) for g in free))
            trace.append(
                f"{p.name} cpu {p.cpu_milli} mem {p.memory_mib} gpu {p.num_gpu}: {got or '-'} {sorted(want)}"
            )
            if (got == "" and not want) or got in want:
                agree += 1
            else:
                disagreements.append(f"{p.name}: kube-scheduler {got or 'unschedulable'}, sim {sorted(want)}")
    finally:
        core_v1.delete_collection_namespaced_pod(NS, label_selector=f"{GROUP}={tag}", grace_period_seconds=0)
        for n in sim_nodes:
            core_v1.delete_node(n.name)
    print(f"\n{stack_name}: K={K} agree {agree} placed {placed} unschedulable {refused}")
    assert not disagreements, (disagreements, trace)
    assert agree == K and placed >= 8 and refused >= 1, (placed, refused)
