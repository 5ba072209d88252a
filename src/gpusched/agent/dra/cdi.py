"""CDI specs for prepared claims (the Container Device Interface, ``cdiVersion`` 0.5.0).

One spec file per prepared claim, as upstream's drivers write them (a "transient" spec, named after the
claim): ``<cdi dir>/<vendor>-claim_<claim UID>.json`` with kind ``<vendor>/claim``, where vendor is
``k8s.<driver>`` (``k8s.gpu.nvidia.com``, as NVIDIA's driver), and one CDI device per allocated device, named
``<claim UID>-<device>``. The kubelet hands the fully qualified IDs
(``k8s.gpu.nvidia.com/claim=<uid>-gpu-1``) to the runtime, which applies each device's container edits:

- ``NVIDIA_VISIBLE_DEVICES``: the UUIDs (GPU or MIG) of the devices allocated for the same request of the
  claim, comma separated (a container asks for whole requests, so it sees exactly its devices; a container
  given two claims sees the last one's, as with NVIDIA's runtime hook);
- ``GPUSCHED_DRA_CLAIM``: ``<namespace>/<name>`` of the claim;
- a share of a GPU (a device allocated with a share ID): the environment and mounts the agent's sharing mode
  gives a share container of the device plugin (``agent/sharing.py``: ``GPUSCHED_GPU_MILLI`` and
  ``GPUSCHED_GPU_MEMORY_MIB`` from its consumed capacity; with ``--sharing hami-core`` HAMi-core's
  ``LD_PRELOAD``, ``CUDA_DEVICE_MEMORY_LIMIT_0``, ``CUDA_DEVICE_SM_LIMIT`` and the library's read-only
  mount); its CDI device is named ``<claim UID>-<device>-<share ID>``;
- device nodes ``/dev/nvidia<minor>`` (NVML's minor number of the GPU, which need not be its index) and
  ``nvidiactl``, ``nvidia-uvm``, ``nvidia-uvm-tools``, from the device-node root (``/dev`` on a GPU node),
  only those that exist there: on a machine without GPUs (the fake backend) the spec carries the env alone,
  unless the root holds stand-ins;
- a MIG device (static or made by dynamic MIG's Prepare): also its GPU instance's and compute instance's
  access capability nodes ``/dev/nvidia-caps/nvidia-cap<N>``, their minors read from the host's procfs under
  ``proc_root`` (``migcaps.py``; none on a node without NVIDIA's driver, said once in the log).

Writes are atomic (a temporary file renamed), so a runtime never reads half a spec.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpusched.agent.dra.migcaps import MigCaps
from gpusched.agent.sharing import Mount

CDI_VERSION = "0.5.0"
DEFAULT_CDI_DIR = Path("/var/run/cdi")
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")


@dataclass(frozen=True)
class PreparedDevice:
    """One allocated device as the CDI spec and the kubelet's answer need it."""

    request: str
    pool: str
    device: str
    visible_id: str
    gpu_index: int
    gpu_minor: int
    """The GPU's device minor: its node is ``/dev/nvidia<minor>``, its MIG capabilities ``gpu<minor>/...``."""
    share_id: str = ""
    milli: int | None = None
    memory_mib: int | None = None
    share_env: tuple[tuple[str, str], ...] = ()
    """A share's limits as its container's environment (the sharing mode's), in order."""
    share_mounts: tuple[Mount, ...] = ()
    mig: tuple[int, int] | None = None
    """A MIG device: its GPU instance and compute instance IDs (for the capability nodes)."""

    @property
    def cdi_name(self) -> str:
        return f"{self.device}-{self.share_id}" if self.share_id else self.device


@dataclass(frozen=True)
class CdiSpecs:
    """The CDI spec files of one driver in ``directory``."""

    directory: Path
    driver: str
    dev_root: Path = Path("/dev")
    proc_root: Path = Path("/")
    """Where the host's ``/proc`` is found (``proc_root/proc/driver/...``): MIG capability minors."""

    @functools.cached_property
    def mig_caps(self) -> MigCaps:
        return MigCaps(self.proc_root, self.dev_root)

    @property
    def vendor(self) -> str:
        return f"k8s.{self.driver}"

    @property
    def kind(self) -> str:
        return f"{self.vendor}/claim"

    def path(self, claim_uid: str) -> Path:
        return self.directory / f"{self.vendor}-claim_{claim_uid}.json"

    def device_id(self, claim_uid: str, device: str) -> str:
        return f"{self.kind}={claim_uid}-{device}"

    def spec(self, claim_uid: str, claim: str, devices: Sequence[PreparedDevice]) -> dict[str, Any]:
        visible: dict[str, list[str]] = {}
        for d in devices:
            visible.setdefault(d.request, []).append(d.visible_id)
        cdi_devices = []
        for d in devices:
            edits: dict[str, Any] = {
                "env": [
                    f"NVIDIA_VISIBLE_DEVICES={','.join(visible[d.request])}",
                    f"GPUSCHED_DRA_CLAIM={claim}",
                ]
            }
            if d.share_id:
                edits["env"] += [f"{k}={v}" for k, v in d.share_env]
                if d.share_mounts:
                    edits["mounts"] = [
                        {"hostPath": m.host_path, "containerPath": m.container_path,
                         "options": ["ro", "nosuid", "nodev", "bind"] if m.read_only else ["rbind"]}
                        for m in d.share_mounts
                    ]  # fmt: skip
            nodes: list[dict[str, Any]] = [*self._nodes([f"nvidia{d.gpu_minor}"])]
            if d.mig is not None:
                nodes += self.mig_caps.device_nodes(d.gpu_minor, *d.mig)
            if nodes:
                edits["deviceNodes"] = nodes
            cdi_devices.append({"name": f"{claim_uid}-{d.cdi_name}", "containerEdits": edits})
        out: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": self.kind, "devices": cdi_devices}
        control = self._nodes(CONTROL_NODES)
        if control:
            out["containerEdits"] = {"deviceNodes": control}
        return out

    def _nodes(self, names: Sequence[str]) -> list[dict[str, str]]:
        out = []
        for n in names:
            host = self.dev_root / n
            if host.exists():
                out.append({"path": f"/dev/{n}", "hostPath": str(host)})
        return out

    def write(self, claim_uid: str, claim: str, devices: Sequence[PreparedDevice]) -> list[str]:
        """Writes the claim's spec; returns the CDI device IDs in ``devices``' order."""
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.path(claim_uid)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(self.spec(claim_uid, claim, devices), indent=2) + "\n")
        os.replace(tmp, path)
        return [self.device_id(claim_uid, d.cdi_name) for d in devices]

    def read(self, claim_uid: str) -> dict[str, Any] | None:
        """The claim's spec, None when there is none (or it cannot be read as JSON)."""
        try:
            return dict(json.loads(self.path(claim_uid).read_text()))
        except (OSError, ValueError):
            return None

    def remove(self, claim_uid: str) -> bool:
        """Deletes the claim's spec; False when there was none."""
        try:
            self.path(claim_uid).unlink()
        except FileNotFoundError:
            return False
        return True
