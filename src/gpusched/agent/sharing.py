"""What enforces a GPU share's limits on the GPU: ``gpusched agent run --sharing mps|hami-core|none``.

- ``mps``: NVIDIA MPS, one control daemon per shared GPU (:mod:`gpusched.agent.mps`). A share container gets
  its GPU's pipe directory mounted and ``CUDA_MPS_PIPE_DIRECTORY``, the daemon's shared memory at
  ``/dev/shm``, ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=<UUID>=<MiB>M`` (its ``memoryMiB``) and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (its milli-GPU / 10, rounded up). MPS caps each client's device memory
  and SMs.
- ``hami-core``: HAMi-core's ``libvgpu.so``, supplied by the user on every GPU node (``--hami-lib``): mounted
  read-only into the container at the same path, ``LD_PRELOAD`` of it, ``CUDA_DEVICE_MEMORY_LIMIT_0=<MiB>m``
  and ``CUDA_DEVICE_SM_LIMIT=<percent>``; the library intercepts the CUDA driver calls and refuses
  allocations past the limit.
- ``none``: the limits are scheduled, not enforced: the container gets them only as information (the variables
  of both, as before) and can use the whole GPU. The agent logs a warning at start and writes the mode on its
  Node, where ``gpusched doctor`` shows it as a finding.

Every mode sets ``GPUSCHED_GPU_MILLI`` and ``GPUSCHED_GPU_MEMORY_MIB``. Both MPS and HAMi-core read limits
from the container's environment: they bound what a workload takes by mistake; a process that changes its own
environment before CUDA starts can lift them.

**Visibility.** Which GPUs a container sees is ``NVIDIA_VISIBLE_DEVICES`` (or CDI). The NVIDIA container
toolkit honours that variable from any unprivileged pod when its ``config.toml`` has
``accept-nvidia-visible-devices-envvar-when-unprivileged = true`` (its default): such a pod can name GPUs it
was never given. :func:`read_toolkit_visibility` reads the setting; the agent warns, exports
``gpusched_agent_visible_devices_envvar_accepted`` and writes it on its Node for doctor.
"""

from __future__ import annotations

import json
import logging
import math
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpusched.agent.allocation import RES_SHARE, Assignment, allocated_of, share_env
from gpusched.agent.mps import MpsDaemons, ShareKey
from gpusched.core.errors import InvalidInput
from gpusched.core.names import ANN_ISOLATION as ANN_ISOLATION

log = logging.getLogger(__name__)

MODES = ("mps", "hami-core", "none")
DEFAULT_TOOLKIT_CONFIG = Path("/etc/nvidia-container-runtime/config.toml")
TOOLKIT_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"
MPS_PIPE_IN_CONTAINER = "/run/nvidia-mps"
DEFAULT_HAMI_LIB = Path("/usr/local/vgpu/libvgpu.so")


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerShare:
    """What one share container gets besides ``NVIDIA_VISIBLE_DEVICES``."""

    envs: Mapping[str, str]
    mounts: tuple[Mount, ...] = ()


def _percent(milli: int) -> str | None:
    return str(max(1, math.ceil(milli / 10))) if 0 < milli < 1000 else None


def _base(a: Assignment) -> dict[str, str]:
    return {"GPUSCHED_GPU_MILLI": str(a.milli), "GPUSCHED_GPU_MEMORY_MIB": str(a.memory_mib)}


@dataclass
class Sharing:
    """The sharing mode of this node's agent and what it needs (MPS daemons, HAMi-core's library)."""

    mode: str = "none"
    mps: MpsDaemons | None = None
    hami_lib: Path = DEFAULT_HAMI_LIB
    adopted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidInput(f"--sharing {self.mode!r}: must be one of {', '.join(MODES)}")
        if self.mode == "mps" and self.mps is None:
            self.mps = MpsDaemons()

    def check(self) -> None:
        """At start: what the mode needs is there (raises ``InvalidInput`` naming it); warns for ``none``."""
        if self.mode == "hami-core" and not self.hami_lib.is_file():
            raise InvalidInput(
                f"--sharing hami-core: HAMi-core's library {self.hami_lib} is not on this node (build it "
                "from github.com/Project-HAMi/HAMi-core and install it there, or pass --hami-lib PATH)"
            )
        if self.mode == "none":
            log.warning(
                "--sharing none: GPU shares are scheduled but not enforced on the GPU: a share can take the "
                "whole GPU's memory and compute from its neighbours (use --sharing mps or hami-core)"
            )

    def adopt(self, gpu_uuids: Sequence[str]) -> None:
        if self.mps is not None:
            self.adopted = self.mps.adopt(set(gpu_uuids))

    def container(self, uuid: str, a: Assignment, key: ShareKey) -> ContainerShare:
        """The environment and mounts of one share container on GPU ``uuid`` (MPS: its daemon runs when this
        returns; raises ``MpsError`` when it cannot)."""
        if self.mode == "none":
            return ContainerShare(share_env(a))
        env = _base(a)
        pct = _percent(a.milli)
        if self.mode == "hami-core":
            lib = str(self.hami_lib)
            env["LD_PRELOAD"] = lib
            if a.memory_mib:
                env["CUDA_DEVICE_MEMORY_LIMIT_0"] = f"{a.memory_mib}m"
            if pct:
                env["CUDA_DEVICE_SM_LIMIT"] = pct
            return ContainerShare(env, (Mount(lib, lib, read_only=True),))
        assert self.mps is not None
        self.mps.acquire(uuid, key)
        env["CUDA_MPS_PIPE_DIRECTORY"] = MPS_PIPE_IN_CONTAINER
        if a.memory_mib:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"{uuid}={a.memory_mib}M"
        if pct:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = pct
        mounts = [Mount(MPS_PIPE_IN_CONTAINER, str(self.mps.pipe_dir(uuid)))]
        if self.mps.isolate_shm:
            mounts.append(Mount("/dev/shm", str(self.mps.shm_dir(uuid))))
        return ContainerShare(env, tuple(mounts))

    def reconcile(self, pods: Sequence[Mapping[str, Any]], node: str) -> list[str]:
        """MPS: stop the daemons whose GPU has no running share left (``live_shares``)."""
        if self.mps is None:
            return []
        return self.mps.reconcile(live_shares(pods, node))


def live_shares(pods: Sequence[Mapping[str, Any]], node: str) -> dict[str, set[ShareKey]]:
    """GPU UUID -> the share containers that pods bound to ``node`` and not yet finished hold, from their
    ``gpusched.io/allocated`` annotation."""
    out: dict[str, set[ShareKey]] = {}
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") != node:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        uid = str((pod.get("metadata") or {}).get("uid", ""))
        for container, resources in allocated_of(pod).items():
            if not isinstance(resources, dict):
                continue
            for uuid in resources.get(RES_SHARE) or []:
                out.setdefault(str(uuid), set()).add((uid, str(container)))
    return out


@dataclass(frozen=True)
class ToolkitVisibility:
    """The NVIDIA container toolkit's ``accept-nvidia-visible-devices-envvar-when-unprivileged`` on this node:
    ``accepted`` is None when its config file is absent or unreadable (``problem`` says which)."""

    path: Path
    accepted: bool | None
    problem: str = ""


def read_toolkit_visibility(path: Path = DEFAULT_TOOLKIT_CONFIG) -> ToolkitVisibility:
    try:
        text = path.read_text()
    except FileNotFoundError:
        why = f"{path} not found (no NVIDIA container toolkit, or not mounted)"
        return ToolkitVisibility(path, None, why)
    except OSError as e:
        return ToolkitVisibility(path, None, f"{path}: {e}")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return ToolkitVisibility(path, None, f"{path} is not valid TOML: {e}")
    value = data.get(TOOLKIT_KEY, True)  # the toolkit's default
    if not isinstance(value, bool):
        return ToolkitVisibility(path, None, f"{path}: {TOOLKIT_KEY} is not a boolean: {value!r}")
    return ToolkitVisibility(path, value)


def warn_visibility(v: ToolkitVisibility) -> None:
    if v.accepted:
        log.warning(
            "%s: %s = true (the toolkit's default): an unprivileged pod can set NVIDIA_VISIBLE_DEVICES "
            "itself and use GPUs it was not given; set it to false and use volume-mounts or CDI "
            "(see docs/gpu-sharing.md)",
            v.path,
            TOOLKIT_KEY,
        )
    elif v.accepted is None:
        log.info("GPU visibility: %s", v.problem)


def isolation_annotation(sharing: Sharing, v: ToolkitVisibility) -> str:
    return json.dumps(
        {"sharing": sharing.mode, "visibleDevicesEnvvar": v.accepted, "toolkitConfig": str(v.path)},
        sort_keys=True,
        separators=(",", ":"),
    )


class SharingCollector(Collector):
    """``gpusched_agent_sharing_mode{mode}``, ``gpusched_agent_mps_daemons``,
    ``gpusched_agent_visible_devices_envvar_accepted{config}`` (1: unprivileged pods can pick GPUs by env)."""

    def __init__(self, sharing: Sharing, visibility: ToolkitVisibility) -> None:
        self.sharing = sharing
        self.visibility = visibility

    def collect(self) -> Iterator[GaugeMetricFamily]:
        mode = GaugeMetricFamily(
            "gpusched_agent_sharing_mode", "What enforces GPU shares on this node (1 for the mode in use).",
            labels=["mode"],
        )  # fmt: skip
        for m in MODES:
            mode.add_metric([m], 1.0 if m == self.sharing.mode else 0.0)
        yield mode
        if self.sharing.mps is not None:
            yield GaugeMetricFamily(
                "gpusched_agent_mps_daemons", "MPS control daemons running (one per shared GPU).",
                value=float(len(self.sharing.mps.shares)),
            )  # fmt: skip
        if self.visibility.accepted is not None:
            g = GaugeMetricFamily(
                "gpusched_agent_visible_devices_envvar_accepted",
                "1: the NVIDIA container toolkit lets an unprivileged pod choose its GPUs with "
                "NVIDIA_VISIBLE_DEVICES (accept-nvidia-visible-devices-envvar-when-unprivileged).",
                labels=["config"],
            )
            g.add_metric([str(self.visibility.path)], 1.0 if self.visibility.accepted else 0.0)
            yield g
