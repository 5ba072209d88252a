"""The real-kubelet tests' shared parts: the session's environment, a test's namespace, the fake GPUs."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpusched.testenv import ControlPlane, wait_until
from gpusched.testenv.node import RealNode

REPO = Path(__file__).resolve().parents[2]
EXTENDER_CONFIG = REPO / "deploy" / "extender" / "scheduler-config.yaml"

#: The fake GPUs of the real node: four A100 80 GB (NVML order = the scheduler's indices 0..3).
GPU_MODEL = "NVIDIA A100-SXM4-80GB"
GPU_UUIDS = tuple(f"GPU-7e57a100-0000-4000-8000-00000000000{i}" for i in range(4))
SLOTS = 8

#: The namespace label that keeps the webhook from routing GPU pods to gpusched (gpusched.webhook.route).
ROUTING_OPT_OUT = "gpusched.io/gpu-routing"

#: The two front ends: spec.schedulerName of the pods each one places.
STANDALONE = "gpusched-standalone"
EXTENDER = "gpusched"  # the profile of deploy/extender/scheduler-config.yaml
FRONT_ENDS = {"standalone": STANDALONE, "extender": EXTENDER}


@dataclass
class KubeletEnv:
    cp: ControlPlane
    node: RealNode
    core: Any  # kubernetes.client.CoreV1Api
    logs: dict[str, Path] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def check_alive(self) -> None:
        self.cp.check_alive()
        self.node.check_alive()
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise AssertionError(
                    f"{name} exited with {p.returncode}: {self.logs[name].read_text()[-3000:]}"
                )


class Ns:
    """One test's namespace on the shared real node, with helpers that read raw JSON."""

    def __init__(self, env: KubeletEnv) -> None:
        self.env = env
        self.cp, self.node, self.core = env.cp, env.node, env.core
        self.name = f"kt-{uuid.uuid4().hex[:8]}"
        # Opted out of the webhook's GPU routing: the tests name their front end, and some bind GPU pods past
        # the scheduler on purpose (spec.nodeName) to test the agent. tests/kubelet/test_mixed_schedulers.py
        # lifts the label where routing is what it tests.
        labels = {ROUTING_OPT_OUT: "disabled"}
        self.core.create_namespace({"metadata": {"name": self.name, "labels": labels}})

    # -- pods ------------------------------------------------------------------------------------------

    def create(self, body: Mapping[str, Any]) -> str:
        self.core.create_namespaced_pod(self.name, dict(body))
        return str(body["metadata"]["name"])

    def pod(self, name: str) -> dict[str, Any]:
        resp = self.core.read_namespaced_pod(name, self.name, _preload_content=False)
        return dict(json.loads(resp.data))

    def pods(self) -> list[dict[str, Any]]:
        resp = self.core.list_namespaced_pod(self.name, _preload_content=False)
        return list(json.loads(resp.data)["items"])

    def events(self, name: str) -> list[dict[str, Any]]:
        resp = self.core.list_namespaced_event(
            self.name, field_selector=f"involvedObject.name={name}", _preload_content=False
        )
        return list(json.loads(resp.data)["items"])

    def wait(self, what: str, probe: Callable[[], Any], timeout: float = 90) -> Any:
        return wait_until(
            lambda: self.env.check_alive() or probe(), timeout=timeout, what=what, control_plane=self.cp
        )

    def running(self, name: str, timeout: float = 90) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            p = self.pod(name)
            phase = p.get("status", {}).get("phase")
            if phase in ("Failed", "Succeeded"):
                raise AssertionError(
                    f"pod {self.name}/{name} is {phase}: {p.get('status')}\n{self.describe(name)}"
                )
            return p if phase == "Running" else None

        try:
            return dict(self.wait(f"pod {self.name}/{name} Running", probe, timeout))
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\n{self.describe(name)}") from None

    def describe(self, name: str) -> str:
        return self.cp.kubectl("describe", "pod", "-n", self.name, name, check=False).stdout[-4000:]

    def exec_env(self, name: str, container: str = "main", timeout: float = 30) -> dict[str, str]:
        """The container's environment, read by ``kubectl exec`` (through the kubelet). A kubelet
        that has just restarted answers "pod does not exist" until it has read its pods from the
        API again: asked again until then (``timeout``); any other failure fails at once."""

        def probe() -> tuple[str] | None:
            out = self.cp.kubectl("exec", "-n", self.name, name, "-c", container, "--", "env", check=False)
            if out.returncode == 0:
                return (out.stdout,)
            if "pod does not exist" in out.stderr:
                return None
            raise AssertionError(f"kubectl exec into {self.name}/{name} failed: {out.stderr.strip()}")

        (text,) = self.wait(f"the kubelet to know {self.name}/{name} for kubectl exec", probe, timeout)
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def logs_env(self, name: str, container: str = "main") -> dict[str, str]:
        """The environment the container printed at start (``kubectl logs``, through the kubelet)."""

        def probe() -> str | None:
            out = self.cp.kubectl("logs", "-n", self.name, name, "-c", container, check=False)
            return out.stdout if out.returncode == 0 and "PATH=" in out.stdout else None

        text = self.wait(f"the log of {self.name}/{name}", probe, 30)
        return dict(line.split("=", 1) for line in str(text).splitlines() if "=" in line)

    def delete_all(self) -> None:
        """Delete every pod of the namespace (gracefully: the kubelet stops the containers, then removes the
        pod) and wait until they are gone."""
        self.cp.kubectl("delete", "pods", "--all", "-n", self.name, "--grace-period=1", "--wait=false")
        self.wait(f"the pods of {self.name} gone", lambda: not self.pods(), 90)

    def cleanup(self) -> None:
        try:
            self.delete_all()
        finally:
            self.core.delete_namespace(self.name, _preload_content=False)
