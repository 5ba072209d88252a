"""The node agent run as the chart's DaemonSet, from the image ``hack/build-image.sh`` builds, on the
session's real node (instead of the host process ``RealNode`` starts).

The image archive is ``$GPUSCHED_IMAGE_ARCHIVE`` (an OCI archive with its ``image.env`` beside it), else what
``hack/build-image.sh`` prints (a no-op once built; ~3 min the first time). The chart is rendered by the helm
of the control-plane cache, with what this test cluster lacks given as values: the pod uses the host network
(the apiserver listens on 127.0.0.1 only) and a kubeconfig holding a token of the chart's ServiceAccount,
bound to the Node (the test apiserver mounts no service-account token into pods), and reads the fake GPUs of
the RealNode from its work directory.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpusched.testenv import free_port
from gpusched.testenv.node import RealNode

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "gpusched"
BUILD_IMAGE = REPO / "hack" / "build-image.sh"
NAMESPACE = "gpusched-node"
RELEASE = "gpusched"
SERVICE_ACCOUNT = f"{RELEASE}-agent"


class ImageUnavailable(Exception):
    """The image cannot be built here (the message says why)."""


def image_archive() -> tuple[Path, str]:
    """(the OCI archive, the image name it carries)."""
    env = os.environ.get("GPUSCHED_IMAGE_ARCHIVE")
    if env:
        archive = Path(env)
    else:
        cmd = ["bash", str(BUILD_IMAGE)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, check=False)
        if out.returncode == 2:
            raise ImageUnavailable(f"hack/build-image.sh: {out.stderr.strip().splitlines()[-1]}")
        if out.returncode != 0:
            raise AssertionError(f"hack/build-image.sh failed ({out.returncode}):\n{out.stderr[-3000:]}")
        archive = Path(out.stdout.strip().splitlines()[-1])
    meta = dict(
        line.split("=", 1) for line in (archive.parent / "image.env").read_text().splitlines() if "=" in line
    )
    return archive, meta["IMAGE"]


@dataclass
class AgentPod:
    """The chart's agent objects for ``node``, rendered and applied; ``delete`` removes them."""

    node: RealNode
    image: str
    manifest: str = ""
    metrics_port: int = 0

    def kubeconfig(self) -> Path:
        """A kubeconfig with a token of the agent's ServiceAccount, bound to the Node (so that the chart's
        ValidatingAdmissionPolicy sees the node name in it, as with a pod's own token)."""
        cp = self.node.cp
        token = cp.kubectl(
            "create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE, "--duration", "1h",
            "--bound-object-kind", "Node", "--bound-object-name", self.node.name,
        ).stdout.strip()  # fmt: skip
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {
                "server": cp.server,
                "certificate-authority-data": base64.b64encode(cp.ca_cert_path.read_bytes()).decode(),
            }}],
            "users": [{"name": "agent", "user": {"token": token}}],
            "contexts": [{"name": "agent", "context": {"cluster": "test", "user": "agent"}}],
            "current-context": "agent",
        }  # fmt: skip
        path = self.node.workdir / "agent-pod" / "kubeconfig"
        path.parent.mkdir(exist_ok=True)
        path.write_text(yaml.safe_dump(doc))
        path.chmod(0o600)
        return path

    def toolkit_config(self, accept_envvar: bool) -> Path:
        """A container toolkit config.toml as the NVIDIA toolkit ships it, in its own directory."""
        d = self.node.workdir / "agent-pod" / "nvidia-container-runtime"
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.toml").write_text(
            f"accept-nvidia-visible-devices-envvar-when-unprivileged = {str(accept_envvar).lower()}\n"
            '[nvidia-container-cli]\nldconfig = "@/sbin/ldconfig"\n'
        )
        return d

    def render(self, *, slots: int, accept_envvar: bool = True, extra: dict[str, Any] | None = None) -> str:
        repo, tag = self.image.rsplit(":", 1)
        work = str(self.node.workdir)
        self.metrics_port = free_port()
        values = {
            "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
            "agent": {
                "namespace": NAMESPACE,
                "hostNetwork": True,
                "metricsPort": self.metrics_port,
                "resources": {"shareSlots": slots},
                "toolkitConfigDir": str(self.toolkit_config(accept_envvar)),
                "nodeSelector": {"kubernetes.io/hostname": self.node.name},
                "extraArgs": ["--fake", str(self.node.fake_gpus_path), "--kubeconfig", "PLACEHOLDER"],
                "extraVolumes": [{"name": "node-work", "hostPath": {"path": work, "type": "Directory"}}],
                "extraVolumeMounts": [{"name": "node-work", "mountPath": work, "readOnly": True}],
                "podResources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "512Mi"}},
                **(extra or {}),
            },
        }
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            yaml.safe_dump(values, f)
        helm = self.node.cp.bin_dir / "helm"
        home = self.node.workdir / "agent-pod" / "helm"
        out = subprocess.run(
            [str(helm), "template", RELEASE, str(CHART), "-f", f.name,
             "--show-only", "templates/agent-rbac.yaml", "--show-only", "templates/agent.yaml"],
            capture_output=True, text=True, timeout=120, check=False,
            env={"HOME": str(home), "PATH": "/usr/bin:/bin", "HELM_CACHE_HOME": str(home),
                 "HELM_CONFIG_HOME": str(home), "HELM_DATA_HOME": str(home)},
        )  # fmt: skip
        Path(f.name).unlink()
        if out.returncode != 0:
            raise AssertionError(f"helm template failed: {out.stderr}")
        return out.stdout

    def apply(self, *, slots: int, scheduler: str, accept_envvar: bool = True) -> None:
        """Namespace, ServiceAccount and RBAC first (the token needs the ServiceAccount), then the
        DaemonSet."""
        manifest = self.render(slots=slots, accept_envvar=accept_envvar)
        docs = [d for d in yaml.safe_load_all(manifest) if d]
        first = sorted((d for d in docs if d["kind"] != "DaemonSet"), key=lambda d: d["kind"] != "Namespace")
        ds = [d for d in docs if d["kind"] == "DaemonSet"]
        assert len(ds) == 1, [d["kind"] for d in docs]
        cp = self.node.cp
        # the chart's agent runs on GPU nodes: GFD/the GPU Operator, node-feature-discovery or an admin say so
        cp.kubectl("label", "node", self.node.name, "gpusched.io/gpu-node=true", "--overwrite")
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(first))
        kubeconfig = str(self.kubeconfig())
        spec = ds[0]["spec"]["template"]["spec"]
        args = spec["containers"][0]["args"]
        args[args.index("PLACEHOLDER")] = kubeconfig
        # this cluster's kube-scheduler has only the extender's profile (no default-scheduler); a pod that
        # asks for no GPU resource is placed by kube-scheduler alone there, as a DaemonSet's pod is elsewhere
        spec["schedulerName"] = scheduler
        cp.kubectl("apply", "-f", "-", input=yaml.safe_dump(ds[0]))
        self.manifest = yaml.safe_dump_all([*first, *ds])

    def pods(self) -> list[dict[str, Any]]:
        out = self.node.cp.kubectl("get", "pods", "-n", NAMESPACE, "-o", "json", check=False)
        return list(json.loads(out.stdout)["items"]) if out.returncode == 0 else []

    def container_args(self) -> list[str]:
        docs = [d for d in yaml.safe_load_all(self.manifest) if d and d["kind"] == "DaemonSet"]
        return list(docs[0]["spec"]["template"]["spec"]["containers"][0]["args"])

    def describe(self) -> str:
        """The DaemonSet, its pods and the namespace's events, for a failure message."""
        cp = self.node.cp
        out = [cp.kubectl(*args, check=False).stdout for args in (
            ("get", "daemonset,pods", "-n", NAMESPACE, "-o", "wide"),
            ("describe", "pods", "-n", NAMESPACE),
            ("get", "events", "-n", NAMESPACE, "--sort-by=.lastTimestamp"),
        )]  # fmt: skip
        return "\n".join(out)[-6000:]

    def delete(self) -> None:
        self.node.cp.kubectl("label", "node", self.node.name, "gpusched.io/gpu-node-", check=False)
        if self.manifest:
            self.node.cp.kubectl(
                "delete", "-f", "-", "--ignore-not-found", "--wait=true", "--timeout=60s",
                input=self.manifest, check=False, timeout=90,
            )  # fmt: skip
