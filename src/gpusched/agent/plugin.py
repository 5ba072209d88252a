"""The kubelet device plugin (API v1beta1 over gRPC): one server per resource, registration, health.

Resources (see ``docs/agent-design.md``):

- ``nvidia.com/gpu``: one device per non-MIG GPU, ID = its UUID.
- ``gpusched.io/gpu-share``: ``slots`` virtual devices per non-MIG GPU, ID = ``<UUID>::<k>``. A share pod
  (``gpusched.io/gpu-milli`` and/or ``gpusched.io/gpu-memory``) carries ``gpusched.io/gpu-share: 1`` in its
  limits (added by gpusched's mutating webhook, or written by the user) so that the kubelet calls
  ``Allocate``.
- ``nvidia.com/mig-<profile>``: one device per MIG device (mixed strategy), ID = its MIG UUID.

``Allocate`` and ``GetPreferredAllocation`` follow the scheduler's ``gpusched.io/assignment`` (see
:mod:`gpusched.agent.allocation` for how a call is matched to its pod). A critical XID marks the GPU (and its
share slots and MIG devices) Unhealthy, and every ``ListAndWatch`` stream sends the new list.

Registration: each server listens on ``<plugin dir>/gpusched-<resource>.sock`` and calls
``Registration.Register`` on ``<plugin dir>/kubelet.sock``. The kubelet empties the directory when it
restarts;
a watcher notices the socket gone (or the kubelet socket replaced), serves again and registers again.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc

from gpusched.agent import mig
from gpusched.agent.allocation import (
    ANN_ALLOCATED,
    RES_SHARE,
    AllocationError,
    Assignment,
    allocated_of,
    container_gpus,
    container_requests,
    holdings,
    match_pod,
    overlap,
    parse_assignment,
    pod_key,
)
from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance
from gpusched.agent.mps import MpsError
from gpusched.agent.pods import PodSource
from gpusched.agent.sharing import ContainerShare, Sharing
from gpusched.agent.v1beta1 import api_pb2 as pb
from gpusched.agent.v1beta1 import api_pb2_grpc as pbg
from gpusched.k8s.convert import RES_GPU

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
DEFAULT_SLOTS = 16


def socket_name(resource: str) -> str:
    return "gpusched-" + re.sub(r"[^A-Za-z0-9.-]", "-", resource.split("/", 1)[-1]) + ".sock"


@dataclass
class NodeDevices:
    """The node's GPUs as the plugin serves them, with health; shared by every resource server."""

    node: str
    inventory: Inventory
    slots: int = DEFAULT_SLOTS
    # False beside NVIDIA's device plugin (GPU Operator): it serves nvidia.com/gpu and the MIG resources, and
    # the agent only gpusched.io/gpu-share (the kubelet keeps one plugin per resource: the last registered).
    nvidia_resources: bool = True
    single: str = ""
    """MIG strategy single: the one profile whose MIG devices are served as ``nvidia.com/gpu``
    (``migsingle``); "" otherwise."""
    unhealthy: set[str] = field(default_factory=set)  # GPU UUIDs
    version: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)

    @property
    def whole_gpus(self) -> list[GpuDevice]:
        """The GPUs advertised as ``nvidia.com/gpu``, in the scheduler's index order. Under the single MIG
        strategy each is one MIG device (its UUID and memory, its GPU's index, name and NUMA node): the
        scheduler books them as GPUs, as the kubelet counts them."""
        if self.single:
            devs = self.inventory.devices
            return [
                replace(devs[k], uuid=m.uuid, memory_mib=m.memory_mib, mig_enabled=False, mig_instances=())
                for k, m in self._single_devices()
            ]
        return [d for d in self.inventory.devices if not d.mig_enabled]

    def _single_devices(self) -> list[tuple[int, MigInstance]]:
        """(position of its GPU in the inventory, MIG device) of every MIG device, in NVML order."""
        return [
            (k, m)
            for k, d in enumerate(self.inventory.devices)
            for m in d.mig_instances
            if d.mig_enabled and m.slices_ci == m.slices_gi
        ]

    def failed(self, d: GpuDevice) -> bool:
        """Whether ``d`` (a GPU; under the single strategy a MIG device) or the GPU it is on is unhealthy."""
        gpu = self.inventory.by_index(d.index)
        with self.cond:
            return d.uuid in self.unhealthy or (gpu is not None and gpu.uuid in self.unhealthy)

    def gpu_by_sched_index(self, i: int) -> GpuDevice | None:
        g = self.whole_gpus
        return g[i] if 0 <= i < len(g) else None

    def sched_index(self, uuid: str) -> int | None:
        return next((i for i, d in enumerate(self.whole_gpus) if d.uuid == uuid), None)

    def resources(self) -> list[str]:
        from gpusched.agent.labels import mig_resources

        if not self.nvidia_resources:
            return [RES_SHARE] if self.whole_gpus else []
        if self.single:
            return [RES_GPU]
        out = [RES_GPU, RES_SHARE] if self.whole_gpus else []
        return out + sorted(mig_resources(self.inventory))

    def devices(self, resource: str) -> list[tuple[str, GpuDevice]]:
        """(device ID, the physical GPU it lives on) of ``resource``."""
        if resource == RES_GPU and self.single:  # each MIG device is one nvidia.com/gpu, on its GPU
            return [(m.uuid, self.inventory.devices[k]) for k, m in self._single_devices()]
        if resource == RES_GPU:
            return [(d.uuid, d) for d in self.whole_gpus]
        if resource == RES_SHARE:
            return [(f"{d.uuid}::{k}", d) for d in self.whole_gpus for k in range(self.slots)]
        if resource.startswith("nvidia.com/mig-"):
            profile = resource.removeprefix("nvidia.com/mig-")
            return [
                (m.uuid, d)
                for d in self.inventory.devices
                if d.mig_enabled
                for m in d.mig_instances
                if m.resource_profile == profile and m.slices_ci == m.slices_gi
            ]
        return []

    def list_response(self, resource: str) -> pb.ListAndWatchResponse:
        with self.cond:
            bad = set(self.unhealthy)
        out = []
        for dev_id, d in self.devices(resource):
            topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=d.numa_node)]) if d.numa_node is not None else None
            out.append(pb.Device(ID=dev_id, health=UNHEALTHY if d.uuid in bad else HEALTHY, topology=topo))
        return pb.ListAndWatchResponse(devices=out)

    def set_health(self, uuid: str, healthy: bool) -> bool:
        """Changes a GPU's health; True (and wakes every ListAndWatch) when it changed."""
        with self.cond:
            changed = (uuid in self.unhealthy) == healthy
            if changed:
                (self.unhealthy.discard if healthy else self.unhealthy.add)(uuid)
                self.version += 1
                self.cond.notify_all()
            return changed

    def unhealthy_sched_indices(self) -> list[int]:
        return [i for i, d in enumerate(self.whole_gpus) if self.failed(d)]


class Allocator:
    """Allocate and GetPreferredAllocation logic, independent of gRPC."""

    def __init__(
        self, devices: NodeDevices, pods: PodSource, *, cdi: bool = False, sharing: Sharing | None = None
    ) -> None:
        self.devices = devices
        self.pods = pods
        self.cdi = cdi
        self.sharing = sharing or Sharing()
        self._allocated: dict[str, set[tuple[str, str]]] = {}
        self._lock = threading.Lock()
        self._unwritten: dict[tuple[str, str], str] = {}  # (namespace, pod) -> gpusched.io/allocated
        self.on_handed: Callable[[Sequence[str]], object] | None = None
        """Called with the GPU UUIDs a container is handed, before Allocate answers (the held-GPU taint
        rules for other DRA drivers, ``agent.dra.heldtaints``: written before the container starts)."""

    def flush_annotations(self) -> bool:
        """Writes the ``gpusched.io/allocated`` annotations not yet written (the API may have been down:
        memory remembered them and the kubelet was served meanwhile). True when none is left."""
        for (ns, name), value in list(self._unwritten.items()):
            try:
                self.pods.annotate_pod(ns, name, {ANN_ALLOCATED: value})
            except Exception as e:
                log.warning("could not annotate %s/%s as allocated (will retry): %s", ns, name, e)
                return False
            if self._unwritten.get((ns, name)) == value:
                del self._unwritten[(ns, name)]
        return True

    def _find(self, resource: str, n: int) -> tuple[Mapping[str, Any], str]:
        pods = self.pods.pods_on_node(self.devices.node)
        m = match_pod(pods, self.devices.node, resource, n, self._allocated)
        if m is None:
            raise AllocationError(
                f"no Pending pod on node {self.devices.node} has a container asking for {n} {resource} "
                "that is not yet allocated"
            )
        return m

    def _gpus_for(
        self, pod: Mapping[str, Any], container: str, resource: str
    ) -> tuple[Assignment, list[GpuDevice]]:
        a = parse_assignment(pod)
        key = pod_key(pod)
        if a.node != self.devices.node:
            raise AllocationError(
                f"pod {key}: annotation gpusched.io/assignment field node is {a.node!r}, "
                f"but this is node {self.devices.node!r}"
            )
        gpus = container_gpus(pod, container, resource, a)
        out = []
        for i in gpus:
            d = self.devices.gpu_by_sched_index(i)
            if d is None:
                raise AllocationError(
                    f"pod {key}: annotation gpusched.io/assignment field gpus names GPU {i}, which is not on "
                    f"node {self.devices.node} (it has {len(self.devices.whole_gpus)} GPUs: 0.."
                    f"{len(self.devices.whole_gpus) - 1})"
                )
            if self.devices.failed(d):
                # placed before the GPU failed (or by books that missed it): never hand out a failed GPU
                raise AllocationError(
                    f"pod {key}: annotation gpusched.io/assignment field gpus names GPU {i} ({d.uuid}), "
                    f"which is unhealthy on node {self.devices.node}"
                )
            out.append(d)
        if resource == RES_SHARE and len(out) != 1:
            raise AllocationError(
                f"pod {key}: annotation gpusched.io/assignment field gpus must name one GPU "
                f"for a share, not {list(gpus)}"
            )
        if resource == RES_GPU:
            need = dict(container_requests(pod, resource))[container]
            if len(out) != need:
                raise AllocationError(
                    f"pod {key}: annotation gpusched.io/assignment field gpus has "
                    f"{len(a.gpus)} GPU(s) for containers asking for more"
                )
        return a, out

    def _refuse_overlap(
        self, pod: Mapping[str, Any], resource: str, a: Assignment, gpus: list[GpuDevice]
    ) -> None:
        """OverlapError when the assignment names a GPU a live pod on this node holds (allocation.overlap)."""
        uid = str((pod.get("metadata") or {}).get("uid", pod_key(pod)))
        unwritten = {f"{ns}/{name}": v for (ns, name), v in self._unwritten.items()}
        held = holdings(self.pods.pods_on_node(self.devices.node), self.devices.node, uid, unwritten)
        index = self.devices.sched_index
        overlap(pod, resource, a, [(index(d.uuid) or 0, d.uuid, d.memory_mib) for d in gpus], held)

    def allocate_container(self, resource: str, device_ids: list[str]) -> pb.ContainerAllocateResponse:
        known = {dev_id for dev_id, _ in self.devices.devices(resource)}
        unknown = [d for d in device_ids if d not in known]
        if unknown:
            raise AllocationError(f"{resource}: device(s) {unknown} are not on node {self.devices.node}")
        if resource.startswith("nvidia.com/mig-"):
            return self._allocate_mig(resource, device_ids)
        with self._lock:
            pod, container = self._find(resource, len(device_ids))
            try:
                a, gpus = self._gpus_for(pod, container, resource)
                self._refuse_overlap(pod, resource, a, gpus)
            except AllocationError as e:
                self.pods.warn(pod, e.reason, str(e))
                raise
            uuids = [d.uuid for d in gpus]
            uid = str((pod.get("metadata") or {}).get("uid", pod_key(pod)))
            share = ContainerShare({})
            if resource == RES_SHARE:
                try:  # MPS: the GPU's daemon runs before the container starts
                    share = self.sharing.container(uuids[0], a, (uid, container))
                except MpsError as e:
                    msg = f"pod {pod_key(pod)} container {container}: {e}"
                    self.pods.warn(pod, "GPUAllocationFailed", msg)
                    raise AllocationError(msg) from None
            resp = self._response(uuids, share)
            self._record(pod, uid, container, resource, device_ids, uuids)
        if self.on_handed is not None:
            self.on_handed(uuids)
        return resp

    def _record(
        self,
        pod: Mapping[str, Any],
        uid: str,
        container: str,
        resource: str,
        device_ids: list[str],
        uuids: list[str],
    ) -> None:
        """What ``container`` was handed: kept for the pod's ``gpusched.io/allocated`` (written in the
        background), and logged."""
        self._allocated.setdefault(uid, set()).add((container, resource))
        done = allocated_of(pod)
        done.setdefault(container, {})[resource] = uuids
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace", "default")), str(meta.get("name"))
        self._unwritten[(ns, name)] = json.dumps(done, separators=(",", ":"), sort_keys=True)
        self.flush_annotations()
        log.info(
            "Allocate %s %s -> pod %s container %s: %s", resource, device_ids, pod_key(pod), container, uuids
        )

    def _mig_for(self, pod: Mapping[str, Any], container: str, resource: str) -> list[str] | None:
        """The MIG UUIDs the pod's assignment gives ``container`` (``agent.mig``); None without a ``mig``
        field."""
        node = self.devices.node
        slices = mig.assigned_slices(pod, node)
        if slices is None:
            return None
        mine = mig.container_slices(pod, container, resource, slices, mig.profile_of(resource))
        got = mig.resolve(pod, node, self.devices.inventory, mine)
        with self.devices.cond:
            bad = [d for d, _m in got if d.uuid in self.devices.unhealthy]
        if bad:
            raise AllocationError(
                f"pod {pod_key(pod)}: annotation gpusched.io/assignment field mig names a slice of GPU "
                f"{bad[0].index} ({bad[0].uuid}), which is unhealthy on node {node}"
            )
        uid = str((pod.get("metadata") or {}).get("uid", pod_key(pod)))
        unwritten = {f"{ns}/{name}": v for (ns, name), v in self._unwritten.items()}
        mig.refuse_held(pod, got, mig.held_mig(self.pods.pods_on_node(node), node, uid, unwritten))
        return [m.uuid for _d, m in got]

    def _allocate_mig(self, resource: str, device_ids: list[str]) -> pb.ContainerAllocateResponse:
        """The exact MIG devices of the pod's assignment (the kubelet's choice where it names none)."""
        with self._lock:
            try:
                pod, container = self._find(resource, len(device_ids))
            except AllocationError as e:
                log.info("Allocate %s %s: the kubelet's choice stands (%s)", resource, device_ids, e)
                return self._response(device_ids)
            try:
                uuids = self._mig_for(pod, container, resource)
            except AllocationError as e:
                self.pods.warn(pod, e.reason, str(e))
                raise
            if uuids is None:
                log.info("Allocate %s -> pod %s: its assignment names no MIG slice, kubelet's choice %s",
                         resource, pod_key(pod), device_ids)  # fmt: skip
                uuids = list(device_ids)
            uid = str((pod.get("metadata") or {}).get("uid", pod_key(pod)))
            self._record(pod, uid, container, resource, device_ids, uuids)
            return self._response(uuids)

    def _response(
        self, uuids: list[str], share: ContainerShare | None = None
    ) -> pb.ContainerAllocateResponse:
        share = share or ContainerShare({})
        ids = ",".join(uuids)
        envs = {"NVIDIA_VISIBLE_DEVICES": ids, "GPUSCHED_GPU_UUIDS": ids, **share.envs}
        cdi = [pb.CDIDevice(name=f"nvidia.com/gpu={u}") for u in uuids] if self.cdi else []
        mounts = [
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in share.mounts
        ]
        return pb.ContainerAllocateResponse(envs=envs, mounts=mounts, cdi_devices=cdi)

    def preferred(self, resource: str, available: list[str], must: list[str], size: int) -> list[str]:
        """The assigned GPUs' device IDs when the pod is found; else the kubelet's own order."""
        chosen = list(must)
        want: set[str] = set()
        try:
            if resource.startswith("nvidia.com/mig-"):
                pod, container = self._find(resource, size)  # the assigned MIG devices (agent.mig)
                want = set(self._mig_for(pod, container, resource) or ())
            elif resource in (RES_GPU, RES_SHARE):
                pod, container = self._find(resource, size)
                _a, gpus = self._gpus_for(pod, container, resource)
                want = {d.uuid for d in gpus}
        except AllocationError:
            pass
        for dev_id in available:
            if len(chosen) >= size:
                break
            if dev_id.split("::")[0] in want and dev_id not in chosen:
                chosen.append(dev_id)
                if resource == RES_SHARE:
                    break  # one slot of the assigned GPU
        for dev_id in available:
            if len(chosen) >= size:
                break
            if dev_id not in chosen:
                chosen.append(dev_id)
        return chosen[:size]


class DevicePluginServicer(pbg.DevicePluginServicer):
    def __init__(
        self, resource: str, devices: NodeDevices, allocator: Allocator, stop: threading.Event
    ) -> None:
        self.resource = resource
        self.devices = devices
        self.allocator = allocator
        self.stop = stop

    def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> pb.DevicePluginOptions:
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: pb.Empty, context: Any) -> Iterator[pb.ListAndWatchResponse]:
        seen = -1
        while not self.stop.is_set() and context.is_active():
            with self.devices.cond:
                if self.devices.version == seen:
                    self.devices.cond.wait(0.5)
                    if self.devices.version == seen:
                        continue
                seen = self.devices.version
            yield self.devices.list_response(self.resource)

    def GetPreferredAllocation(
        self, request: pb.PreferredAllocationRequest, context: Any
    ) -> pb.PreferredAllocationResponse:
        out = []
        for r in request.container_requests:
            ids = self.allocator.preferred(
                self.resource, list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size
            )
            out.append(pb.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return pb.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request: pb.AllocateRequest, context: Any) -> pb.AllocateResponse:
        out = []
        for r in request.container_requests:
            try:
                out.append(self.allocator.allocate_container(self.resource, list(r.devices_ids)))
            except AllocationError as e:
                log.warning("Allocate %s failed: %s", self.resource, e)
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        return pb.AllocateResponse(container_responses=out)

    def PreStartContainer(
        self, request: pb.PreStartContainerRequest, context: Any
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()


class ResourceServer:
    """One resource's gRPC server on its socket, registered with the kubelet."""

    def __init__(
        self,
        resource: str,
        devices: NodeDevices,
        allocator: Allocator,
        plugin_dir: Path,
        kubelet_socket: Path,
    ) -> None:
        self.resource = resource
        self.socket = plugin_dir / socket_name(resource)
        self.kubelet_socket = kubelet_socket
        self._devices = devices
        self._allocator = allocator
        self._server: grpc.Server | None = None
        self._stop = threading.Event()
        self.registrations = 0

    def serve(self) -> None:
        self.stop_serving()
        self._stop = threading.Event()
        self.socket.parent.mkdir(parents=True, exist_ok=True)
        if self.socket.exists():
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pbg.add_DevicePluginServicer_to_server(  # type: ignore[no-untyped-call]
            DevicePluginServicer(self.resource, self._devices, self._allocator, self._stop), server
        )
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server

    def register(self, timeout_s: float = 5.0) -> None:
        with grpc.insecure_channel(f"unix://{self.kubelet_socket}") as ch:
            pbg.RegistrationStub(ch).Register(  # type: ignore[no-untyped-call]
                pb.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.socket.name,
                    resource_name=self.resource,
                    options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=timeout_s,
            )
        self.registrations += 1
        log.info("registered %s with the kubelet (%s)", self.resource, self.socket)

    def stop_serving(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None


def _inode(p: Path) -> int | None:
    try:
        return os.stat(p).st_ino
    except OSError:
        return None


class DevicePlugin:
    """All resource servers of a node, kept registered across kubelet restarts."""

    def __init__(
        self,
        devices: NodeDevices,
        pods: PodSource,
        *,
        plugin_dir: Path = DEFAULT_PLUGIN_DIR,
        kubelet_socket: Path | None = None,
        cdi: bool = False,
        on_health: Callable[[], None] | None = None,
        sharing: Sharing | None = None,
    ) -> None:
        self.devices = devices
        self.allocator = Allocator(devices, pods, cdi=cdi, sharing=sharing)
        self.plugin_dir = plugin_dir
        self.kubelet_socket = kubelet_socket or plugin_dir / "kubelet.sock"
        self.servers = [
            ResourceServer(r, devices, self.allocator, plugin_dir, self.kubelet_socket)
            for r in devices.resources()
        ]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._kubelet_inode: int | None = None
        self.on_health = on_health

    def start(self, *, watch_interval_s: float = 1.0) -> None:
        for s in self.servers:
            s.serve()
        self._register_all()
        self._thread = threading.Thread(
            target=self._watch, args=(watch_interval_s,), daemon=True, name="gpusched-plugin-watch"
        )
        self._thread.start()

    def _register_all(self) -> bool:
        self._kubelet_inode = _inode(self.kubelet_socket)
        ok = True
        for s in self.servers:
            try:
                s.register()
            except grpc.RpcError as e:
                ok = False
                log.warning(
                    "registering %s with the kubelet at %s failed: %s",
                    s.resource,
                    self.kubelet_socket,
                    e.details() if hasattr(e, "details") else e,
                )
        return ok

    def _watch(self, interval_s: float) -> None:
        pending = False
        while not self._stop.wait(interval_s):
            gone = [s for s in self.servers if not s.socket.exists()]
            kubelet_changed = _inode(self.kubelet_socket) not in (None, self._kubelet_inode)
            if gone or kubelet_changed or (pending and self.kubelet_socket.exists()):
                log.info(
                    "kubelet restarted (sockets gone: %s): serving and registering again",
                    [s.socket.name for s in gone],
                )
                for s in gone:
                    s.serve()
                if not self.kubelet_socket.exists():
                    pending = True
                    continue
                pending = not self._register_all()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for s in self.servers:
            s.stop_serving()
            with contextlib.suppress(OSError):
                s.socket.unlink()

    def replace_inventory(self, inventory: Inventory) -> list[str]:
        """The GPUs changed (a MIG re-cut, ``agent.migrequest``): every ListAndWatch sends its new list, and a
        resource that appeared (a new MIG profile) gets its server, served and registered. Returns the new
        resources. A resource whose devices are gone keeps its server, with an empty list."""
        with self.devices.cond:
            self.devices.inventory = inventory
            self.devices.version += 1
            self.devices.cond.notify_all()
        have = {s.resource for s in self.servers}
        new = [r for r in self.devices.resources() if r not in have]
        for r in new:
            s = ResourceServer(r, self.devices, self.allocator, self.plugin_dir, self.kubelet_socket)
            self.servers.append(s)
            s.serve()
            try:
                s.register()
            except grpc.RpcError as e:  # the watcher registers it again with the others
                log.warning("registering %s with the kubelet failed: %s", r, e)
        return new

    def mark(self, gpu_index: int, healthy: bool) -> bool:
        d = self.devices.inventory.by_index(gpu_index)
        if d is None:
            return False
        changed = self.devices.set_health(d.uuid, healthy)
        if changed and self.on_health is not None:
            self.on_health()
        return changed


def wait_until(pred: Callable[[], bool], timeout_s: float = 10.0, step_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step_s)
    return pred()
