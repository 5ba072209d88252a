"""GPU metrics with dcgm-exporter's names and labels, so dashboards written for dcgm-exporter work unchanged.

Series: ``DCGM_FI_DEV_GPU_UTIL`` (%), ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` (MiB),
``DCGM_FI_DEV_GPU_TEMP`` (C), ``DCGM_FI_DEV_POWER_USAGE`` (W), ``DCGM_FI_DEV_XID_ERRORS`` (the last XID, 0 if
none), all gauges, with labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<N>``), ``modelName``,
``Hostname``; a GPU used by pods gets one series per (pod, container), with ``pod``, ``namespace`` and
``container``, as dcgm-exporter's Kubernetes mapping does. Values are read at scrape time.

A GPU in MIG mode with instances is shown as dcgm-exporter shows it by default (its ``-d f``: the GPU
instances of a GPU that has some): ``DCGM_FI_DEV_FB_USED`` / ``DCGM_FI_DEV_FB_FREE`` per GPU instance, with
the parent GPU's labels plus ``GPU_I_PROFILE`` (the GPU instance's profile, e.g. ``3g.40gb``) and
``GPU_I_ID`` (its NVML GPU-instance ID), and ``pod`` / ``namespace`` / ``container`` of the pods holding one
of its MIG devices. The values are NVML's for the MIG device's own handle (``GpuBackend.mig_readings``); a
field NVML refuses has no series. The GPU's own series then carry no framebuffer figures (NVML's figure for
the parent handle is the instances' total, which would count them twice); its temperature, power and XID
stay per GPU, and NVML gives no utilization for a GPU in MIG mode (docs/mig.md, "Seen everywhere").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from gpusched.agent import mig
from gpusched.agent.allocation import (
    RES_SHARE,
    AllocationError,
    allocated_of,
    container_gpus,
    parse_assignment,
)
from gpusched.agent.inventory import GpuBackend, GpuDevice, Inventory, MigInstance, Readings
from gpusched.k8s.convert import RES_GPU, RES_MEMORY, RES_MILLI

BASE_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
POD_LABELS = ("container", "namespace", "pod")
MIG_LABELS = ("GPU_I_PROFILE", "GPU_I_ID")
FB_FIELDS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
"""The fields NVML gives per MIG device (``nvmlDeviceGetMemoryInfo`` on its handle)."""

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
    pods: Sequence[Mapping[str, Any]],
    node: str,
    whole_gpu_uuids: Sequence[str],
    inventory: Inventory | None = None,
) -> dict[str, list[tuple[str, str, str]]]:
    """Which running containers hold which GPUs and MIG devices (by UUID): the ``gpusched.io/allocated``
    annotation where the agent wrote it, else the assignment's GPUs for each container that asks for a GPU
    resource, and the MIG devices of ``inventory`` its ``mig`` slices name for each container asking for
    ``nvidia.com/mig-<profile>`` (as ``Allocate`` hands them out, agent/mig.py)."""
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
        slices = _slices(pod, node) if inventory is not None else None
        for c in spec.get("containers") or []:
            res = c.get("resources") or {}
            lim = {**(res.get("requests") or {}), **(res.get("limits") or {})}
            cname = str(c.get("name", ""))
            if slices and inventory is not None:
                for u in _mig_uuids(pod, node, inventory, cname, lim, slices):
                    out.setdefault(u, []).append((ns, name, cname))
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


def _slices(pod: Mapping[str, Any], node: str) -> list[mig.MigSlice] | None:
    try:
        return mig.assigned_slices(pod, node)
    except AllocationError:
        return None  # a bad mig field: Allocate refuses the pod with an event; no owner here


def _mig_uuids(
    pod: Mapping[str, Any],
    node: str,
    inv: Inventory,
    container: str,
    limits: Mapping[str, Any],
    slices: Sequence[mig.MigSlice],
) -> list[str]:
    """The MIG devices the assignment's slices give ``container`` (none where they do not resolve)."""
    out = []
    for res in limits:
        if not res.startswith(mig.RES_MIG_PREFIX):
            continue
        try:
            mine = mig.container_slices(pod, container, res, slices, mig.profile_of(res))
            out += [m.uuid for _d, m in mig.resolve(pod, node, inv, mine)]
        except AllocationError:
            continue
    return out


def gpu_instances(d: GpuDevice) -> list[tuple[str, int, tuple[MigInstance, ...]]]:
    """(profile, NVML GPU-instance ID, its MIG devices) per GPU instance of ``d``, by start slice:
    dcgm-exporter reports per GPU instance, and the compute instances of one share its memory. The profile
    is the GPU instance's (``3g.40gb`` for a ``1c.3g.40gb`` compute instance)."""
    by_gi: dict[int, list[MigInstance]] = {}
    for m in sorted(d.mig_instances, key=lambda m: (m.placement_start, m.gi_id, m.ci_id)):
        by_gi.setdefault(m.gi_id, []).append(m)
    out = []
    for gi_id, ms in by_gi.items():
        first = ms[0]
        profile = first.profile if first.slices_ci == first.slices_gi else first.profile.split(".", 1)[1]
        out.append((profile, gi_id, tuple(ms)))
    return out


def _add(family: GaugeMetricFamily, labels: Mapping[str, str], value: float) -> None:
    """A sample with its own label names (dcgm-exporter adds ``GPU_I_*`` to MIG series only)."""
    family.samples.append(Sample(family.name, dict(labels), value))


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
            sliced = d.mig_enabled and bool(d.mig_instances)
            for ns, pod, container in who:
                labels = [*base, container, ns, pod]
                for name, _h, get in FIELDS:
                    v = get(r)
                    if v is not None and not (sliced and name in FB_FIELDS):
                        families[name].add_metric(labels, float(v))
                xid.add_metric(labels, float(self.last_xid.get(d.index, 0)))
            if sliced:
                self._instances(d, dict(zip(BASE_LABELS, base, strict=True)), owners, families)
        yield from families.values()
        yield xid

    def _instances(
        self,
        d: GpuDevice,
        base: Mapping[str, str],
        owners: Owners,
        families: Mapping[str, GaugeMetricFamily],
    ) -> None:
        """One series per GPU instance of ``d`` and pod holding one of its MIG devices (or none)."""
        readings = self.backend.mig_readings(d.index)
        for profile, gi_id, ms in gpu_instances(d):
            r = next((readings[m.uuid] for m in ms if m.uuid in readings), Readings())
            who = list(dict.fromkeys(o for m in ms for o in owners.get(m.uuid, ()))) or [("", "", "")]
            for ns, pod, container in who:
                labels = {
                    **base,
                    **dict(zip(MIG_LABELS, (profile, str(gi_id)), strict=True)),
                    **dict(zip(POD_LABELS, (container, ns, pod), strict=True)),
                }
                for name, _h, get in FIELDS:
                    v = get(r)
                    if name in FB_FIELDS and v is not None:
                        _add(families[name], labels, float(v))
