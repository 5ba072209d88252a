"""Chaos runs of the extender (``gpusched extender``) behind a real kube-scheduler configured from
deploy/extender/scheduler-config.yaml (urlPrefix on a loopback port), against the real control plane
(issue 9: "Never book a GPU twice"). One control plane for the module; each test its own namespace and
kwok node group, and its own extender process on the port kube-scheduler calls."""

from __future__ import annotations

import contextlib
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import scenarios
import yaml
from chaoslib import Extender, RunFactory
from faultproxy import Fault, FaultProxy, Rule

from gpusched.testenv import ControlPlane, free_port, wait_until
from gpusched.testenv.kwoknodes import kwok_gpu_node
from realparts import GONE, started
from realparts import node_of as bound_to

pytestmark = pytest.mark.chaos

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "extender" / "scheduler-config.yaml"


@pytest.fixture(scope="module")
def cp(control_plane_bin: Path) -> Iterator[tuple[ControlPlane, int]]:
    config = yaml.safe_load(CONFIG.read_text())
    port = free_port()
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{port}"
    with started(control_plane_bin, scheduler_config=config, controller_manager=True, kwok=True) as c:
        yield c, port


def front(cp: tuple[ControlPlane, int], tmp_path: Path, scenario: str, seed: int) -> Extender:
    control_plane, port = cp
    return Extender(control_plane.kubeconfig_path, tmp_path / f"extender-{scenario}-{seed}.log", port)


def test_apiserver_killed(
    cp: tuple[ControlPlane, int], chaos_run: RunFactory, tmp_path: Path, seed: int
) -> None:
    s = "apiserver-killed"
    scenarios.apiserver_killed(chaos_run(cp[0], s, seed, front(cp, tmp_path, s, seed)))


def test_extender_killed(
    cp: tuple[ControlPlane, int], chaos_run: RunFactory, tmp_path: Path, seed: int
) -> None:
    """Restarted 1–2 s after the SIGKILL, while kube-scheduler keeps calling it (two kills: a restart
    takes about 5 s here, and pods arrive for 12 s)."""
    s = "front-end-killed"
    scenarios.front_end_killed(
        chaos_run(cp[0], s, seed, front(cp, tmp_path, s, seed)),
        tmp_path,
        delay_s=(1.0, 2.0),
        kills=(0.15, 0.55),
    )


def test_pods_deleted(cp: tuple[ControlPlane, int], chaos_run: RunFactory, tmp_path: Path, seed: int) -> None:
    s = "pods-deleted"
    scenarios.pods_deleted(chaos_run(cp[0], s, seed, front(cp, tmp_path, s, seed)))


def test_ambiguous_binding(
    cp: tuple[ControlPlane, int], chaos_run: RunFactory, tmp_path: Path, seed: int
) -> None:
    s = "ambiguous-binding"
    scenarios.ambiguous_binding(chaos_run(cp[0], s, seed, front(cp, tmp_path, s, seed)), tmp_path)


LAG_S = 4.0
"""How late the extender's pod watch delivers each event (kube-scheduler's sees it at once)."""


def test_a_preemptor_is_placed_while_the_extenders_pod_watch_lags(
    cp: tuple[ControlPlane, int], tmp_path: Path
) -> None:
    """kube-scheduler deletes the victim and retries the preemptor as soon as its own informer shows
    the victim gone; the extender's pod watch, through ``FaultProxy``, shows it ``LAG_S`` seconds
    later. The preemptor is bound well before kube-scheduler's five-minute flush of unschedulable
    pods (which is where it waited when the extender answered its retry from the lagging books)."""
    from kubernetes import client

    control_plane, port = cp
    api = control_plane.api_client()
    v1, sched = client.CoreV1Api(api), client.SchedulingV1Api(api)
    tag = uuid.uuid4().hex[:6]
    ns, node, high = f"lag-{tag}", f"lag-{tag}-n0", f"lag-{tag}-high"
    lag = Rule(Fault.LAG, "GET", r"/api/v1/pods", watch=True, every=1, delay_s=LAG_S)
    proxy = FaultProxy.for_control_plane(control_plane, tmp_path, rules=[lag]).start()
    front = Extender(proxy.write_kubeconfig(tmp_path / "lag.kubeconfig"), tmp_path / "extender-lag.log", port)
    try:
        v1.create_namespace({"metadata": {"name": ns}})
        sched.create_priority_class({"metadata": {"name": high}, "value": 100000})
        v1.create_node(kwok_gpu_node(node, 1, model="NVIDIA-A100-SXM4-40GB", gpu_memory_mib=40960))
        front.start(wait_ready=60)

        def pod(name: str, priority_class: str = "") -> dict[str, Any]:
            res = {"cpu": "100m", "memory": "128Mi", "nvidia.com/gpu": "1"}
            spec: dict[str, Any] = {
                "schedulerName": front.scheduler_name, "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"requests": res, "limits": res}}],
            }  # fmt: skip
            if priority_class:
                spec["priorityClassName"] = priority_class
            return {"metadata": {"name": name}, "spec": spec}

        def node_of(name: str) -> str | None:
            return bound_to(v1, ns, name)

        v1.create_namespaced_pod(ns, pod("low"))
        assert (
            wait_until(lambda: node_of("low"), timeout=90, what="low bound", control_plane=control_plane)
            == node
        )
        time.sleep(LAG_S + 1)  # the extender's books have the binding from its watch
        v1.create_namespaced_pod(ns, pod("vip", high))
        assert wait_until(lambda: node_of("vip"), timeout=60, what="vip bound after preemption") == node
        assert node_of("low") == GONE
        assert proxy.faulted(Fault.LAG), "the extender's pod watch never lagged"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert 'gpusched_extender_node_rechecks_total{result="released"}' in metrics, front.log_tail()
    finally:
        front.stop()
        proxy.stop()
        with contextlib.suppress(Exception):
            v1.delete_namespace(ns)
        with contextlib.suppress(Exception):
            v1.delete_node(node)
        with contextlib.suppress(Exception):
            sched.delete_priority_class(high)
