"""The agent's DRA mode in one object: the slice kept published, the kubelet plugin, health as device taints.

``gpusched agent run --dra`` starts it instead of the device plugin (the two never serve the same GPUs: see
:func:`refuse_device_plugin_beside`). A critical XID marks the GPU unhealthy: the slice is published again
with the device taint (``slices.build_slice``); publishing errors are logged and retried every
``resync_s``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpusched.agent.dra.cdi import DEFAULT_CDI_DIR, CdiSpecs
from gpusched.agent.dra.claims import ClaimSource
from gpusched.agent.dra.driver import Preparer
from gpusched.agent.dra.kubeletplugin import DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, KubeletPlugin
from gpusched.agent.dra.migprepare import CHECKPOINT, MigClaims, MigInstances
from gpusched.agent.dra.publish import SliceApi, SlicePublisher
from gpusched.agent.dra.slices import DEFAULT_DRIVER, DraConfigError, NodeSlice, build_slice
from gpusched.agent.inventory import Inventory
from gpusched.agent.migreshape import MigReshaper
from gpusched.agent.sharing import Sharing

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DraConfig:
    driver: str = DEFAULT_DRIVER
    cdi_dir: Path = DEFAULT_CDI_DIR
    dev_root: Path = Path("/dev")
    proc_root: Path = Path("/")
    """Where the host's ``/proc`` is (``<proc_root>/proc/driver``): MIG devices' capability minors."""
    registry_dir: Path = DEFAULT_REGISTRY_DIR
    plugins_dir: Path = DEFAULT_PLUGINS_DIR
    unhealthy_effect: str = "NoSchedule"
    shares: bool = False
    """Whole GPUs as shared devices with consumable capacity ``milli`` and ``memory``."""
    mig: str = "static"
    """``static``: the MIG devices configured; ``dynamic``: every placement, created at Prepare."""
    resync_s: float = 30.0


def refuse_device_plugin_beside(
    *, nvidia_resources: bool, sharing: str, other_plugins: Iterable[str]
) -> None:
    """DRA and a device plugin never serve the same GPUs: ``--dra`` with ``--no-nvidia-resources`` (NVIDIA's
    device plugin serves ``nvidia.com/gpu`` here), with GPU shares (served as device-plugin slots), or while
    another device plugin in the kubelet's directory lists this node's GPUs is refused at start."""
    if not nvidia_resources:
        raise DraConfigError(
            "--dra with --no-nvidia-resources: NVIDIA's device plugin serves this node's GPUs, and a GPU is "
            "served by a device plugin or by DRA, never both; run the agent as the DRA driver or beside the "
            "plugin"
        )
    if sharing == "mps":
        raise DraConfigError(
            "--dra with --sharing mps: the MPS daemons are kept for device-plugin share pods, not for DRA "
            "shares; use --sharing hami-core (or none) with --dra"
        )
    found = sorted(other_plugins)
    if found:
        raise DraConfigError(
            "--dra: another device plugin serves this node's GPUs (" + ", ".join(found) + "); a GPU is "
            "served by a device plugin or by DRA, never both: remove that plugin (NVIDIA's device plugin "
            "DaemonSet) first"
        )


@dataclass
class DraNode:
    node: str
    inventory: Inventory
    config: DraConfig
    slices: SliceApi
    claims: ClaimSource
    mig_ops: MigReshaper | None = None
    """The backend that creates and destroys MIG instances (``config.mig == "dynamic"``)."""
    sharing: Sharing = field(default_factory=Sharing)
    """What enforces a share's consumed capacity (the agent's ``--sharing``)."""
    unhealthy: dict[str, int] = field(default_factory=dict)
    """GPU UUID -> the XID that made it unhealthy."""
    _dirty: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.publisher = SlicePublisher(self.slices)
        c = self.config
        cdi = CdiSpecs(c.cdi_dir, c.driver, c.dev_root, c.proc_root)
        self.mig: MigInstances | None = None
        if c.mig == "dynamic":
            if self.mig_ops is None:
                raise DraConfigError("--dra-mig dynamic: this GPU backend cannot create MIG instances")
            self.mig = MigInstances(self.mig_ops, MigClaims(c.plugins_dir / c.driver / CHECKPOINT))
        self.preparer = Preparer(self.claims, cdi, self.current_slice, self.mig, self.sharing)
        self.plugin = KubeletPlugin(
            self.config.driver,
            self.preparer,
            registry_dir=self.config.registry_dir,
            plugins_dir=self.config.plugins_dir,
        )
        self._thread: threading.Thread | None = None

    def current_slice(self) -> NodeSlice:
        with self._lock:
            bad: Mapping[str, int] = dict(self.unhealthy)
        c = self.config
        inv, ours = self.mig.snapshot() if self.mig is not None else (self.inventory, frozenset[str]())
        return build_slice(
            inv, self.node, c.driver, unhealthy=bad, effect=c.unhealthy_effect, shares=c.shares, mig=c.mig,
            ours=ours,
        )  # fmt: skip

    def mark(self, gpu_uuid: str, *, healthy: bool, xid: int = 0) -> bool:
        """A GPU's health changed; True when it did (the slice is published again soon)."""
        with self._lock:
            if healthy:
                if self.unhealthy.pop(gpu_uuid, None) is None:
                    return False
            elif self.unhealthy.get(gpu_uuid) == xid:
                return False
            else:
                self.unhealthy[gpu_uuid] = xid
        self._dirty.set()
        return True

    def publish(self) -> bool:
        """Publishes the slice now; False (logged) when the API refused or was unreachable."""
        try:
            self.publisher.sync(self.current_slice())
        except Exception as e:
            log.warning("could not publish the ResourceSlice of %s: %s", self.node, e)
            return False
        return True

    def start(self) -> None:
        self.plugin.start()
        self.publish()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="gpusched-dra-slices")
        self._thread.start()

    def _loop(self) -> None:
        waited = 0.0
        failed = False
        while not self._stop.is_set():
            if self._dirty.wait(1.0):
                self._dirty.clear()
                failed = not self.publish()
                waited = 0.0
                continue
            waited += 1.0
            if failed or waited >= self.config.resync_s:
                failed = not self.publish()
                waited = 0.0

    def stop(self, *, delete_slice: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.plugin.stop()
        if delete_slice:
            try:
                self.publisher.delete(self.current_slice())
            except Exception as e:
                log.warning("could not delete the ResourceSlice of %s: %s", self.node, e)
