"""``gpusched agent run``: the device plugin, the labeller, health on the Node and the metrics exporter."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import CollectorRegistry, start_http_server

from gpusched.agent import coexist, health, labels, mig, migsingle
from gpusched.agent.allocation import ANN_ALLOCATED
from gpusched.agent.dra.heldtaints import HeldTaints, TaintRuleApi, held_gpus
from gpusched.agent.dra.node import DraConfig, DraNode, refuse_device_plugin_beside
from gpusched.agent.dra.publish import DraApi
from gpusched.agent.dra.slices import DraConfigError
from gpusched.agent.inventory import GpuBackend, XidEvent
from gpusched.agent.metrics import GpuCollector, Owners, owners_from_pods
from gpusched.agent.migrequest import MigReshapes
from gpusched.agent.migreshape import MigReshaper
from gpusched.agent.mps import DEFAULT_CONTROL, DEFAULT_ROOT, MpsDaemons
from gpusched.agent.plugin import DEFAULT_PLUGIN_DIR, DEFAULT_SLOTS, DevicePlugin, NodeDevices
from gpusched.agent.pods import NodeWriter, PodSource, PodWatch
from gpusched.agent.reshape.manager import ConfigMaps, ManagerSettings, MigManagerWay
from gpusched.agent.reshape.way import ReshapeWay
from gpusched.agent.sharing import (
    ANN_ISOLATION,
    DEFAULT_HAMI_LIB,
    DEFAULT_TOOLKIT_CONFIG,
    Sharing,
    SharingCollector,
    isolation_annotation,
    read_toolkit_visibility,
    warn_visibility,
)
from gpusched.k8s.convert import RES_GPU

log = logging.getLogger(__name__)


@dataclass
class AgentConfig:
    node: str
    plugin_dir: Path = DEFAULT_PLUGIN_DIR
    kubelet_socket: Path | None = None
    slots: int = DEFAULT_SLOTS
    nvidia_resources: bool = True
    cdi: bool = False
    mig_strategy: str | None = None
    write_gfd_labels: bool = True
    metrics_port: int = 9400  # dcgm-exporter's port
    metrics_addr: str = "0.0.0.0"
    resync_s: float = 30.0
    plugin_scan_s: float = 10.0
    """How often the device-plugin directory is searched for another plugin serving the same GPUs."""
    pod_resources_socket: Path = coexist.DEFAULT_POD_RESOURCES_SOCKET
    """Without ``nvidia_resources``: the kubelet's PodResources API, where the agent reads which GPUs NVIDIA's
    plugin gave each container, to record them as ``gpusched.io/allocated`` (doctor compares them with the
    assignment)."""
    kubelet_alloc_s: float = 2.0
    sharing: str = "none"  # mps | hami-core | none (gpusched.agent.sharing)
    mps_root: Path = DEFAULT_ROOT
    mps_control: str = DEFAULT_CONTROL
    hami_lib: Path = DEFAULT_HAMI_LIB
    toolkit_config: Path = DEFAULT_TOOLKIT_CONFIG
    sharing_sync_s: float = 5.0  # how often MPS daemons without shares are looked for (a pod list per look)
    held_taints_s: float = 10.0
    """How often the GPUs pods hold are tainted for other DRA drivers (a slice list per look; pods and rules
    are listed only where a slice on the node names a GPU)."""
    dra: DraConfig | None = None
    """The agent as a DRA driver (``--dra``): ResourceSlices and the kubelet's DRA service instead of the
    device plugin (``gpusched.agent.dra``)."""
    reshape_check_s: float = 2.0
    """Where the backend can re-cut MIG GPUs: how often the Node is read for a request (``agent.migrequest``;
    a node read per look)."""
    reshape_way: ReshapeWay = ReshapeWay.NVML
    """How this node pool's GPUs are re-cut unless the Node's label ``gpusched.io/mig-reshape-way`` says."""
    mig_manager: ManagerSettings = field(default_factory=ManagerSettings)
    """Way (b): mig-manager's ConfigMap and how long to wait for it (with ``Agent.configmaps``)."""


@dataclass
class Agent:
    config: AgentConfig
    backend: GpuBackend
    pods: PodSource
    nodes: NodeWriter
    dra_api: DraApi | None = None
    """Where the DRA driver publishes slices and reads claims (with ``config.dra``)."""
    configmaps: ConfigMaps | None = None
    """Where mig-manager's configuration is written (way (b) of MIG re-cuts); None: way (b) is refused."""
    taint_api: TaintRuleApi | None = None
    """Device-plugin mode: where the GPUs its pods hold are tainted for other DRA drivers
    (``agent.dra.heldtaints``); None: not done."""
    last_xid: dict[int, int] = field(default_factory=dict)
    _owners: Owners = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _stop_pod_watch: Callable[[], None] | None = None
    _health_dirty: threading.Event = field(default_factory=threading.Event)
    _kubelet_seen: coexist.Allocations = field(default_factory=dict)

    def __post_init__(self) -> None:
        inv = self.backend.inventory()
        # MIG strategy single: each MIG device is one nvidia.com/gpu; a node that breaks its rules is refused
        single = migsingle.single_profile(inv) if self.config.mig_strategy == "single" else ""
        self.devices = NodeDevices(
            self.config.node,
            inv,
            slots=self.config.slots,
            nvidia_resources=self.config.nvidia_resources,
            single=single,
        )
        c = self.config
        mps = MpsDaemons(c.mps_root, c.mps_control) if c.sharing == "mps" else None
        self.sharing = Sharing(c.sharing, mps, c.hami_lib)
        self.sharing.check()
        self.visibility = read_toolkit_visibility(c.toolkit_config)
        warn_visibility(self.visibility)
        self.plugin = DevicePlugin(
            self.devices,
            self.pods,
            plugin_dir=self.config.plugin_dir,
            kubelet_socket=self.config.kubelet_socket,
            cdi=self.config.cdi,
            on_health=self._health_dirty.set,
            sharing=self.sharing,
        )
        self.dra: DraNode | None = None
        if c.dra is not None:
            if self.dra_api is None:
                raise DraConfigError("the agent in DRA mode needs an API for its slices and claims")
            ops = self.backend if isinstance(self.backend, MigReshaper) else None
            self.dra = DraNode(c.node, inv, c.dra, self.dra_api, self.dra_api, ops, self.sharing)
        self.held_taints = (
            HeldTaints(self.taint_api, c.node) if self.taint_api is not None and self.dra is None else None
        )
        if self.held_taints is not None:  # the event: GPUs handed out are tainted before Allocate answers
            self.plugin.allocator.on_handed = self.held_taints.add
        reshaper = self.backend if isinstance(self.backend, MigReshaper) else None
        manager = MigManagerWay(self.nodes, self.configmaps, c.mig_manager) if self.configmaps else None
        self.reshapes = (
            MigReshapes(
                reshaper, self.plugin, self.pods, self.nodes, c.node, way=c.reshape_way, manager=manager
            )
            if reshaper
            else None
        )
        self.registry = CollectorRegistry()
        self.registry.register(GpuCollector(self.backend, lambda: self._owners, self.last_xid))
        self.registry.register(SharingCollector(self.sharing, self.visibility))

    def handle_xids(self, events: list[XidEvent]) -> None:
        for e in events:
            self.last_xid[e.gpu_index] = e.xid
            if e.critical:
                log.warning("XID %d on GPU %d: marking it Unhealthy", e.xid, e.gpu_index)
                self.plugin.mark(e.gpu_index, healthy=False)
                gpu = self.devices.inventory.by_index(e.gpu_index)
                if self.dra is not None and gpu is not None:
                    self.dra.mark(gpu.uuid, healthy=False, xid=e.xid)
            else:
                log.info("XID %d on GPU %d (not critical)", e.xid, e.gpu_index)

    def sync_node(self) -> None:
        """Labels, topology annotation, unhealthy GPUs and taint on the Node; errors logged, retried."""
        try:
            node = self.nodes.get_node(self.config.node)
            if self.reshapes is not None and self.reshapes.check(node):  # a MIG re-cut asked on the Node
                node = self.nodes.get_node(self.config.node)
            inv = self.devices.inventory
            want = labels.gfd_labels(inv, self.config.mig_strategy) if self.config.write_gfd_labels else {}
            ann = {ANN_ISOLATION: isolation_annotation(self.sharing, self.visibility)}
            if not self.devices.single:  # its GPUs are physical; under single the scheduler's are MIG devices
                ann[labels.ANN_TOPOLOGY] = labels.topology_annotation(inv)
            geometry = mig.mig_annotation(inv, self.config.mig_strategy or labels.default_strategy(inv))
            if geometry is not None:  # the scheduler books MIG slices on a GPU and start (issue 31)
                ann[mig.ANN_MIG] = geometry
            p = health.labels_patch(node, want, ann)
            if p:
                self.nodes.patch_node(self.config.node, p)
                node = self.nodes.get_node(self.config.node)
            hp = health.health_patch(
                node, self.devices.unhealthy_sched_indices(), len(self.devices.whole_gpus)
            )
            if hp:
                self.nodes.patch_node(self.config.node, hp)
        except Exception as e:  # the API may be unreachable: keep serving the kubelet, catch up later
            log.warning("could not update node %s: %s", self.config.node, e)
            self._health_dirty.set()

    def refresh_owners(self) -> None:
        try:
            pods = self.pods.pods_on_node(self.config.node)
        except Exception as e:
            log.warning("could not list pods on %s: %s", self.config.node, e)
            return
        self._owners = owners_from_pods(
            pods, self.config.node, [d.uuid for d in self.devices.whole_gpus], self.devices.inventory
        )

    def check_other_plugins(self) -> str | None:
        """Another device plugin in the kubelet's directory serving devices the agent serves (NVIDIA's plugin
        and the agent both serving ``nvidia.com/gpu``): published on the Node as ``coexist.ANN_CONFLICT``
        (removed when gone). Returns the annotation's value; errors logged, retried at the next scan."""
        own = [s.socket.name for s in self.plugin.servers]
        served = {r: [i for i, _ in self.devices.devices(r)] for r in self.devices.resources()}
        value = coexist.conflict_annotation(served, coexist.other_plugins(self.config.plugin_dir, own))
        try:
            node = self.nodes.get_node(self.config.node)
            have = ((node.get("metadata") or {}).get("annotations") or {}).get(coexist.ANN_CONFLICT)
            if have != value:
                if value:
                    log.warning(
                        "another device plugin serves this node's GPUs too (%s): the kubelet hands out the "
                        "devices of whichever registered last; run one of them (docs/gpu-operator.md)",
                        value,
                    )
                self.nodes.patch_node(
                    self.config.node, {"metadata": {"annotations": {coexist.ANN_CONFLICT: value}}}
                )
        except Exception as e:
            log.warning("could not update node %s: %s", self.config.node, e)
        return value

    def record_kubelet_allocations(self) -> int:
        """Beside NVIDIA's plugin (no ``nvidia_resources``): the GPUs the kubelet gave each container on this
        node (PodResources), written into the pod's ``gpusched.io/allocated`` where it does not say so yet.
        Returns how many pods were annotated; errors logged, retried at the next round."""
        try:
            got = coexist.kubelet_allocations(self.config.pod_resources_socket, [RES_GPU])
        except grpc.RpcError as e:
            log.warning("the kubelet's PodResources at %s: %s", self.config.pod_resources_socket, e)
            return 0
        if got == self._kubelet_seen:
            return 0
        done = 0
        try:
            for pod in self.pods.pods_on_node(self.config.node):
                meta = pod.get("metadata") or {}
                key = (str(meta.get("namespace")), str(meta.get("name")))
                if key not in got:
                    continue
                value = coexist.allocated_update((meta.get("annotations") or {}).get(ANN_ALLOCATED), got[key])
                if value is not None:
                    self.pods.annotate_pod(key[0], key[1], {ANN_ALLOCATED: value})
                    done += 1
        except Exception as e:
            log.warning("could not record the kubelet's allocations on %s: %s", self.config.node, e)
            return done
        self._kubelet_seen = got
        return done

    def reconcile_sharing(self, *, at_start: bool = False) -> None:
        """MPS: stop the daemons of GPUs whose last share is gone (errors logged, retried). The pods are
        listed only while a daemon runs (and once at start, for running shares whose daemon is gone)."""
        if self.sharing.mps is None or not (at_start or self.sharing.mps.shares):
            return
        try:
            pods = self.pods.pods_on_node(self.config.node)
        except Exception as e:
            log.warning("could not list pods on %s: %s", self.config.node, e)
            return
        self.sharing.reconcile(pods, self.config.node)

    def sync_held_taints(self) -> None:
        """Device-plugin mode: a DeviceTaintRule for each GPU a pod here holds, for other DRA drivers
        publishing the same GPUs (``agent.dra.heldtaints``); errors logged, retried."""
        if self.held_taints is None:
            return
        slices = self.held_taints.slices()
        if slices is None or not self.held_taints.needed(slices):
            return  # no DRA driver publishes this node's GPUs: no pod list, no rule list
        mark = self.held_taints.mark()  # rules the pod watch makes from here on are kept by this pass
        try:
            pods = self.pods.pods_on_node(self.config.node)
        except Exception as e:
            log.warning("could not list pods on %s: %s", self.config.node, e)
            return
        unwritten = {f"{ns}/{name}": v for (ns, name), v in self.plugin.allocator._unwritten.items()}
        self.held_taints.sync(
            held_gpus(pods, self.config.node, self.devices.inventory, unwritten), slices, mark
        )
        if (
            self._stop_pod_watch is None
            and isinstance(self.pods, PodWatch)
            and self.held_taints.published(slices)
        ):
            self._stop_pod_watch = self.pods.watch_pods(self.config.node, self._pod_seen)

    def _pod_seen(self, pod: Mapping[str, Any]) -> None:
        """The pod watch (held-GPU taints): a pod bound here with an assignment gets its GPUs' rules at
        once (``HeldTaints.add``), before the kubelet admits it."""
        if self.held_taints is not None:
            gpus = held_gpus([pod], self.config.node, self.devices.inventory, {})
            if gpus:
                self.held_taints.add(gpus)

    def refuse_dra_beside_a_device_plugin(self) -> None:
        """DRA mode: ``DraConfigError`` when a device plugin serves this node's GPUs too
        (``--no-nvidia-resources``, share slots, or a live plugin socket listing a GPU or MIG UUID of this
        node)."""
        inv = self.devices.inventory
        ids = {d.uuid for d in inv.devices} | {m.uuid for d in inv.devices for m in d.mig_instances}
        others = [o.socket for o in coexist.other_plugins(self.config.plugin_dir, ()) if o.device_ids & ids]
        refuse_device_plugin_beside(
            nvidia_resources=self.config.nvidia_resources, sharing=self.config.sharing, other_plugins=others
        )

    def start(self, *, serve_metrics: bool = True) -> None:
        if self.dra is not None:
            self.refuse_dra_beside_a_device_plugin()
        # MPS: the daemons an earlier agent started for running shares are kept, then those without shares go
        self.sharing.adopt([d.uuid for d in self.devices.whole_gpus])
        self.reconcile_sharing(at_start=True)
        if self.dra is not None:
            self.dra.start()
        else:
            self.plugin.start()
        if serve_metrics:
            start_http_server(self.config.metrics_port, self.config.metrics_addr, registry=self.registry)
        self.sync_node()
        self.refresh_owners()
        self.sync_held_taints()
        threading.Thread(target=self._xid_loop, daemon=True, name="gpusched-xids").start()
        threading.Thread(target=self._sync_loop, daemon=True, name="gpusched-sync").start()
        threading.Thread(target=self._plugins_loop, daemon=True, name="gpusched-other-plugins").start()
        if not self.config.nvidia_resources:
            threading.Thread(
                target=self._kubelet_alloc_loop, daemon=True, name="gpusched-kubelet-alloc"
            ).start()

    def _kubelet_alloc_loop(self) -> None:
        while not self._stop.wait(self.config.kubelet_alloc_s):
            self.record_kubelet_allocations()

    def _plugins_loop(self) -> None:
        while not self._stop.wait(self.config.plugin_scan_s):
            self.check_other_plugins()

    def _xid_loop(self) -> None:
        while not self._stop.is_set():
            self.handle_xids(self.backend.poll_xids(1.0))

    def check_reshape(self) -> None:
        """Apply a MIG re-cut asked on the Node (``agent.migrequest``), then publish the new geometry."""
        if self.reshapes is None:
            return
        try:
            asked = self.reshapes.check(self.nodes.get_node(self.config.node))
        except Exception as e:  # the API may be unreachable: asked again at the next look
            log.warning("could not read node %s for a MIG re-cut: %s", self.config.node, e)
            return
        if asked:
            self.sync_node()

    def _sync_loop(self) -> None:
        waited = since_sharing = since_reshape = since_held = 0.0
        while not self._stop.is_set():
            if self._health_dirty.wait(1.0):
                self._health_dirty.clear()
                self.sync_node()
            waited += 1.0
            since_reshape += 1.0
            if since_reshape >= self.config.reshape_check_s:
                since_reshape = 0.0
                self.check_reshape()
            since_sharing += 1.0
            if since_sharing >= self.config.sharing_sync_s:
                since_sharing = 0.0
                self.reconcile_sharing()
            since_held += 1.0
            if since_held >= self.config.held_taints_s:
                since_held = 0.0
                self.sync_held_taints()
            if self.plugin.allocator._unwritten:
                self.plugin.allocator.flush_annotations()
            if waited >= self.config.resync_s:
                waited = 0.0
                self.sync_node()
                self.refresh_owners()

    def stop(self) -> None:
        self._stop.set()
        if self._stop_pod_watch is not None:
            self._stop_pod_watch()
        if self.dra is not None:
            self.dra.stop()
        else:
            self.plugin.stop()
        self.backend.close()
