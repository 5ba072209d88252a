"""Way (b): NVIDIA's mig-manager reshapes the node. The agent writes a mig-parted configuration (the format of
mig-parted's ``config.yaml``: ``version: v1``, ``mig-configs``, per entry ``devices``, ``mig-enabled``,
``mig-devices``; NVIDIA/mig-parted api/spec/v1/spec.go) as one named entry into a ConfigMap that mig-manager
reads, points the node label ``nvidia.com/mig.config`` at it and waits for ``nvidia.com/mig.config.state`` to
say ``success`` or ``failed`` (../shared/reference/mig.md §4). Failed or timed out: the label goes back to
what it was (mig-manager then re-applies the previous configuration) and the result says so, typed.

The entry lists every MIG-capable GPU of the node: the GPUs the plan re-cuts with their target profile
counts, the others with the counts they hold, which mig-parted skips ("already set to desired value",
cmd/nvidia-mig-parted/apply/config.go), so they are not touched. mig-parted places instances itself: a
configuration has counts, not starts.
"""

from __future__ import annotations

import enum
import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import yaml

from gpusched.agent.inventory import Inventory
from gpusched.agent.pods import NodeWriter
from gpusched.agent.reshape.apply import layout_of
from gpusched.agent.reshape.events import OutcomeEvent
from gpusched.core.errors import InvalidInput
from gpusched.core.mig.reshape import GpuReshape

log = logging.getLogger(__name__)

LABEL_CONFIG = "nvidia.com/mig.config"
LABEL_STATE = "nvidia.com/mig.config.state"
CONFIG_KEY = "config.yaml"
ENTRY_PREFIX = "gpusched-"


# ------------------------------------------------------------------------------------------ the configuration
@dataclass(frozen=True)
class GpuConfig:
    """One GPU's part of a mig-parted configuration: MIG on or off and how many instances of each profile."""

    index: int
    mig_enabled: bool
    devices: tuple[tuple[str, int], ...]  # (profile, count), by profile name


def node_configs(node: str, inv: Inventory, steps: Sequence[GpuReshape]) -> tuple[GpuConfig, ...]:
    """Each MIG-capable GPU of ``inv``: its step's target when the plan re-cuts it, else what it holds."""
    by_gpu = {s.gpu: s for s in steps}
    out = []
    for d in inv.devices:
        if not d.mig_capable:
            continue
        step = by_gpu.pop(f"{node}/{d.index}", None)
        layout = step.target if step is not None else layout_of(d)
        enabled = d.mig_enabled or (step is not None and step.enable_mig)
        out.append(GpuConfig(d.index, enabled, tuple(sorted(Counter(i.profile for i in layout).items()))))
    if by_gpu:
        raise InvalidInput(f"a reshape of {', '.join(sorted(by_gpu))}: no such MIG GPU on node {node}")
    return tuple(out)


def mig_parted_entry(gpus: Sequence[GpuConfig]) -> list[dict[str, Any]]:
    """The entries of one named configuration: GPUs with the same configuration share an entry."""
    groups: dict[tuple[bool, tuple[tuple[str, int], ...]], list[int]] = {}
    for g in gpus:
        groups.setdefault((g.mig_enabled, g.devices), []).append(g.index)
    entries: list[dict[str, Any]] = []
    for (enabled, devices), indices in sorted(groups.items(), key=lambda kv: min(kv[1])):
        entry: dict[str, Any] = {"devices": sorted(indices), "mig-enabled": enabled}
        if enabled:
            entry["mig-devices"] = dict(devices)
        entries.append(entry)
    return entries


def entry_name(node: str, entry: list[dict[str, Any]]) -> str:
    """``gpusched-<node>-<hash of the entry>``: a new name for a new layout, so the label always changes."""
    digest = hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:10]
    return f"{ENTRY_PREFIX}{node}-{digest}"


def check_mig_parted(doc: Any, where: str) -> dict[str, list[dict[str, Any]]]:
    """The named configurations of a mig-parted document; InvalidInput for what mig-parted refuses
    (spec.go: version v1, at least one configuration and entry, required ``devices`` and ``mig-enabled``,
    ``mig-devices`` when enabled and only then, no other field)."""
    if not isinstance(doc, dict) or doc.get("version") != "v1":
        raise InvalidInput(f"{where}: a mig-parted configuration needs version: v1")
    if set(doc) - {"version", "mig-configs"}:
        raise InvalidInput(f"{where}: unexpected field(s) {sorted(set(doc) - {'version', 'mig-configs'})}")
    configs = doc.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise InvalidInput(f"{where}: at least one entry in 'mig-configs' is required")
    for name, entries in configs.items():
        if not isinstance(entries, list) or not entries:
            raise InvalidInput(f"{where}: at least one entry in {name!r} is required")
        for e in entries:
            if not isinstance(e, dict) or not {"devices", "mig-enabled"} <= set(e):
                raise InvalidInput(f"{where}: {name}: each entry needs devices and mig-enabled, got {e!r}")
            extra = set(e) - {"devices", "device-filter", "mig-enabled", "mig-devices"}
            if extra:
                raise InvalidInput(f"{where}: {name}: unexpected field(s) {sorted(extra)}")
            devices = e["devices"]
            if devices != "all" and not (
                isinstance(devices, list) and all(isinstance(i, int) for i in devices)
            ):
                raise InvalidInput(f"{where}: {name}: devices must be 'all' or GPU indices, not {devices!r}")
            if e["mig-enabled"] and not isinstance(e.get("mig-devices"), dict):
                raise InvalidInput(f"{where}: {name}: mig-devices is required when mig-enabled is true")
            if not e["mig-enabled"] and e.get("mig-devices"):
                raise InvalidInput(f"{where}: {name}: MIG devices included when mig-enabled is false")
    return configs


# ---------------------------------------------------------------------------------------------- the ConfigMap
class ConfigMaps(Protocol):
    def read(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        """The ConfigMap's data and resourceVersion, or None when it does not exist."""
        ...

    def write(self, namespace: str, name: str, data: Mapping[str, str], resource_version: str | None) -> bool:
        """Creates it (``resource_version`` None) or replaces that version of it; False on a conflict."""
        ...


class KubeConfigMaps:
    """ConfigMaps over the Kubernetes API (``kubernetes.client.ApiClient``)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._core = client.CoreV1Api(api_client)

    def read(self, namespace: str, name: str) -> tuple[dict[str, str], str] | None:
        from kubernetes.client.exceptions import ApiException

        try:
            cm = self._core.read_namespaced_config_map(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return dict(cm.data or {}), str(cm.metadata.resource_version if cm.metadata else "")

    def write(self, namespace: str, name: str, data: Mapping[str, str], resource_version: str | None) -> bool:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        meta = client.V1ObjectMeta(name=name, namespace=namespace, resource_version=resource_version)
        body = client.V1ConfigMap(metadata=meta, data=dict(data))
        try:
            if resource_version is None:
                self._core.create_namespaced_config_map(namespace, body)
            else:
                self._core.replace_namespaced_config_map(name, namespace, body)
        except ApiException as e:
            if e.status in (409,):
                return False
            raise
        return True


# ------------------------------------------------------------------------------------------------- the way
BUSY = ("pending", "rebooting")
"""``nvidia.com/mig.config.state`` while mig-manager applies the label's configuration."""


@dataclass(frozen=True)
class ManagerSettings:
    namespace: str = "gpu-operator"
    configmap: str = "gpusched-mig-parted-config"  # the ClusterPolicy's migManager.config.name
    timeout_s: float = 600.0  # a mode change on Ampere resets the GPU; mig-manager also pauses the operands
    poll_s: float = 2.0


class ManagerOutcome(enum.Enum):
    APPLIED = "applied"  # state success
    FAILED = "failed"  # state failed: the label is back
    TIMED_OUT = "timed-out"  # no success or failed in time: the label is back


@dataclass(frozen=True)
class ManagerResult(OutcomeEvent):
    EVENTS: ClassVar[Mapping[Any, tuple[str, str]]] = {
        ManagerOutcome.APPLIED: ("Normal", "MigReshaped"),
        ManagerOutcome.FAILED: ("Warning", "MigReshapeRolledBack"),
        ManagerOutcome.TIMED_OUT: ("Warning", "MigReshapeRolledBack"),
    }
    node: str
    outcome: ManagerOutcome
    config: str  # the entry the label named
    previous: str | None  # the label before (what a rollback restores; None: it had none)
    state: str | None  # the last nvidia.com/mig.config.state seen
    waited_s: float
    entry: tuple[dict[str, Any], ...] = ()

    @property
    def message(self) -> str:
        if self.ok:
            return f"mig-manager applied MIG configuration {self.config} on node {self.node}"
        why = (
            f"mig-manager reported {LABEL_STATE}=failed"
            if self.outcome is ManagerOutcome.FAILED
            else f"no {LABEL_STATE} success or failed after {self.waited_s:.0f} s (last: {self.state})"
        )
        back = f"back to {self.previous}" if self.previous else "removed"
        return f"MIG configuration {self.config} on node {self.node}: {why}; {LABEL_CONFIG} {back}"


class MigManagerWay:
    """Applies a node's reshape through mig-manager: ConfigMap entry, node label, wait, rollback."""

    def __init__(
        self,
        nodes: NodeWriter,
        configmaps: ConfigMaps,
        settings: ManagerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.nodes, self.configmaps = nodes, configmaps
        self.settings = settings or ManagerSettings()
        self._clock, self._sleep = clock, sleep

    def apply(self, node: str, inv: Inventory, steps: Sequence[GpuReshape]) -> ManagerResult:
        entry = mig_parted_entry(node_configs(node, inv, steps))
        name = entry_name(node, entry)
        labels = (self.nodes.get_node(node).get("metadata") or {}).get("labels") or {}
        previous, state = labels.get(LABEL_CONFIG), labels.get(LABEL_STATE)
        if state in BUSY:
            # mig-manager is still applying ``previous``: the state it writes for that one would be read
            # as this configuration's if the label changed now. Wait (up to the timeout) until it is done.
            log.info("node %s: mig-manager is applying %s (%s=%s); waiting before %s", node, previous,
                     LABEL_STATE, state, name)  # fmt: skip
            self._wait(node, self._clock())
            labels = (self.nodes.get_node(node).get("metadata") or {}).get("labels") or {}
            previous, state = labels.get(LABEL_CONFIG), labels.get(LABEL_STATE)
        if previous == name and state == "success":
            return ManagerResult(node, ManagerOutcome.APPLIED, name, previous, state, 0.0, tuple(entry))
        self._edit(lambda configs: {**configs, name: entry})
        self.nodes.patch_node(node, {"metadata": {"labels": {LABEL_CONFIG: name, LABEL_STATE: None}}})
        log.info("node %s: %s=%s (was %s), waiting for mig-manager", node, LABEL_CONFIG, name, previous)
        started = self._clock()
        state = self._wait(node, started)
        waited = self._clock() - started
        if state == "success":
            self._prune(node, keep={name})
            return ManagerResult(node, ManagerOutcome.APPLIED, name, previous, state, waited, tuple(entry))
        self.nodes.patch_node(node, {"metadata": {"labels": {LABEL_CONFIG: previous}}})
        self._prune(node, keep={previous} if previous else set())
        outcome = ManagerOutcome.FAILED if state == "failed" else ManagerOutcome.TIMED_OUT
        res = ManagerResult(node, outcome, name, previous, state, waited, tuple(entry))
        log.warning("%s", res.message)
        return res

    def _wait(self, node: str, started: float) -> str | None:
        while True:
            labels = (self.nodes.get_node(node).get("metadata") or {}).get("labels") or {}
            state = labels.get(LABEL_STATE)
            state = None if state is None else str(state)
            if state in ("success", "failed"):
                return state
            if self._clock() - started >= self.settings.timeout_s:
                return state
            self._sleep(self.settings.poll_s)

    def _edit(self, change: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
        """Read-modify-write of the ConfigMap's mig-configs (other entries kept), retried on a conflict."""
        s = self.settings
        where = f"ConfigMap {s.namespace}/{s.configmap} key {CONFIG_KEY}"
        for _ in range(10):
            found = self.configmaps.read(s.namespace, s.configmap)
            data, version = found if found is not None else ({}, None)
            text = data.get(CONFIG_KEY)
            doc = yaml.safe_load(text) if text else {"version": "v1", "mig-configs": {}}
            configs = check_mig_parted(doc, where) if text else {}
            new = change(dict(configs))
            if not new:
                new = {"all-disabled": [{"devices": "all", "mig-enabled": False}]}  # spec: at least one
            body = yaml.safe_dump({"version": "v1", "mig-configs": new}, sort_keys=False)
            if self.configmaps.write(s.namespace, s.configmap, {**data, CONFIG_KEY: body}, version):
                return
        raise InvalidInput(f"{where}: changed under us 10 times in a row")

    def _prune(self, node: str, keep: set[str]) -> None:
        """Drops this node's earlier gpusched entries that no label names any more."""
        mine = f"{ENTRY_PREFIX}{node}-"
        self._edit(lambda configs: {k: v for k, v in configs.items() if not k.startswith(mine) or k in keep})
