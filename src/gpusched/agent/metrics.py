"""GPU metrics with dcgm-exporter's names and labels, so dashboards written for dcgm-exporter work unchanged.

Series: ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (MiB),
``DCGM_FI_DEV_GPU_TEMP`` (C), ``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_XID_ERRORS`` (the last XID, 0 if
none), all gauges, with labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<N>``), ``modelName``,
``Hostname``; a GPU used by pods gets one series per (pod, container), with ``pod``, ``namespace`` and
``container``, as dcgm-exporter's Kubernetes mapping does. Values are read at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpusched.agent.allocation import (
    RES_SHARE,
    AllocationError,
    allocated_of,
    container_gpus,
    parse_assignment,
)
from gpusched.agent.inventory import GpuBackend, Readings
from gpusched.k8s.convert import RES_GPU, RES_MEMORY, RES_MILLI

BASE_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
POD_LABELS = ("container", "namespace", "pod")

FIELDS: tuple[tuple[str, str, Callable[[Readings], float | None]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda r: r.gpu_util_percent),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda r: r.memory_used_mib),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", lambda r: r.memory_free_mib),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda r: r.temperature_c),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda r: r.power_w),
)

Owners = Mapping[str, Sequence[tuple[str, str, str]]]
"""GPU UUID -> [(namespace, pod, container)]."""


def owners_from_pods(
    pods: Sequence[Mapping[str, Any]], node: str, whole_gpu_uuids: Sequence[str]
) -> dict[str, list[tuple[str, str, str]]]:
    """Which running containers hold which GPUs: the ``gpusched.io/allocated`` annotation where the agent
    wrote
    it, else the assignment's GPUs for each container that asks for a GPU resource."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    for pod in pods:
        spec = pod.get("spec") or {}
        if spec.get("nodeName") != node or (pod.get("status") or {}).get("phase") not in (
            "Running",
            "Pending",
        ):
            continue
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace", "default")), str(meta.get("name", ""))
        done = allocated_of(pod)
        if done:
            for container, by_res in done.items():
                for uuids in by_res.values():
                    for u in uuids:
                        out.setdefault(u, []).append((ns, name, container))
            continue
        try:
            a = parse_assignment(pod)
        except AllocationError:
            continue
        if a.node != node:
            continue
        for c in spec.get("containers") or []:
            res = c.get("resources") or {}
            lim = {**(res.get("requests") or {}), **(res.get("limits") or {})}
            cname = str(c.get("name", ""))
            if RES_GPU in lim:
                gpus = container_gpus(pod, cname, RES_GPU, a)  # each container its slice, as Allocate gives
            elif any(k in lim for k in (RES_SHARE, RES_MILLI, RES_MEMORY)):
                gpus = a.gpus
            else:
                continue
            for g in gpus:
                if 0 <= g < len(whole_gpu_uuids):
                    out.setdefault(whole_gpu_uuids[g], []).append((ns, name, cname))
    return out


class GpuCollector(Collector):
    def __init__(
        self, backend: GpuBackend, owners: Callable[[], Owners] = dict, xids: Mapping[int, int] | None = None
    ):
        self.backend = backend
        self.owners = owners
        self.last_xid: Mapping[int, int] = xids if xids is not None else {}

    def collect(self) -> Iterator[GaugeMetricFamily]:
        inv = self.backend.inventory()
        owners = self.owners()
        families = {
            name: GaugeMetricFamily(name, help_, labels=[*BASE_LABELS, *POD_LABELS])
            for name, help_, _ in FIELDS
        }
        xid = GaugeMetricFamily(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered.",
            labels=[*BASE_LABELS, *POD_LABELS],
        )
        for d in inv.devices:
            base = [str(d.index), d.uuid, d.pci_bus_id, f"nvidia{d.index}", d.name, inv.hostname]
            who = owners.get(d.uuid) or [("", "", "")]
            r = self.backend.readings(d.index)
            for ns, pod, container in who:
                labels = [*base, container, ns, pod]
                for name, _h, get in FIELDS:
                    v = get(r)
                    if v is not None:
                        families[name].add_metric(labels, float(v))
                xid.add_metric(labels, float(self.last_xid.get(d.index, 0)))
        yield from families.values()
        yield xid
