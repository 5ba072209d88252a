"""Node labels with NVIDIA gpu-feature-discovery's names and values, and gpusched's topology annotation.

A pure function of the inventory. It follows GFD's labelers (NVIDIA/k8s-device-plugin ``internal/lm``:
``nvml.go`` version, MIG-capability, sharing and GPU-mode labels; ``resource.go`` product/count/replicas/
sharing-strategy/memory/family/compute labels; ``mig-strategy.go`` the none and mixed strategies, the
single one in ``migsingle``; ``machine-type.go``), as GFD runs with its default configuration (no sharing,
``--no-timestamp``):

- ``nvidia.com/gpu.product`` is NVML's name with characters outside ``[A-Za-z0-9-_. ]`` removed and runs of
  spaces turned into one ``-`` ("NVIDIA H100 80GB HBM3" -> "NVIDIA-H100-80GB-HBM3", "Tesla T4" -> "Tesla-T4").
- ``gpu.count`` counts the GPUs of that name, MIG-enabled or not; ``gpu.replicas`` is 1 for full GPUs and 0
  when the labelled GPUs are MIG-enabled; ``gpu.sharing-strategy`` is ``none``.
- ``gpu.memory`` is the total memory in MiB; ``gpu.family`` from the compute capability.
- mixed strategy: per MIG profile ``nvidia.com/mig-<profile>.{product,count,replicas,sharing-strategy,memory,
  multiprocessors,slices.gi,slices.ci,engines.copy,engines.decoder,engines.encoder,engines.jpeg,engines.ofa}``,
  with ``+`` in a profile written ``.``; product is ``<product>-MIG-<profile>``.
- ``nvidia.com/mig.strategy`` only when a MIG strategy other than none is in force.

The timestamp label ``nvidia.com/gfd.timestamp`` is left out: its value changes on every pass, and where GFD
also runs the two would rewrite it in turn. With every other value equal to GFD's, both writers agree.
"""

from __future__ import annotations

import json
import re

from gpusched.agent.inventory import GpuDevice, Inventory
from gpusched.agent.migsingle import single_labels
from gpusched.core.names import ANN_TOPOLOGY as ANN_TOPOLOGY

MIG_STRATEGIES = ("none", "single", "mixed")


def sanitise(text: str) -> str:
    """GFD's ``sanitise``: drop characters outside [A-Za-z0-9-_. ], then join the words with '-'."""
    return "-".join(re.sub(r"[^A-Za-z0-9\-_. ]", "", text).split())


def family(major: int, minor: int) -> str:
    """GFD's ``getArchFamily``."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {
        1: "tesla",
        2: "fermi",
        3: "kepler",
        5: "maxwell",
        6: "pascal",
        9: "hopper",
        10: "blackwell",
        12: "blackwell",
        13: "rubin",
    }.get(major, "undefined")


def default_strategy(inv: Inventory) -> str:
    """mixed when a GPU has MIG enabled, else none."""
    return "mixed" if any(d.mig_enabled for d in inv.devices) else "none"


def _gpu_labels(dev: GpuDevice, count: int, *, mig_enabled: bool) -> dict[str, str]:
    labels = {
        "nvidia.com/gpu.product": sanitise(dev.name),
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.replicas": "0" if mig_enabled else "1",
        "nvidia.com/gpu.sharing-strategy": "none",
    }
    if dev.memory_mib:
        labels["nvidia.com/gpu.memory"] = str(dev.memory_mib)
    if dev.compute_major:
        labels["nvidia.com/gpu.family"] = family(dev.compute_major, dev.compute_minor)
        labels["nvidia.com/gpu.compute.major"] = str(dev.compute_major)
        labels["nvidia.com/gpu.compute.minor"] = str(dev.compute_minor)
    return labels


def per_model_labels(dev: GpuDevice, count: int) -> dict[str, str]:
    """The product, count, replicas, memory and architecture labels GFD writes for ``count`` GPUs like ``dev``
    (on a node with several models GFD writes one model's, which one changing from run to run)."""
    return _gpu_labels(dev, count, mig_enabled=dev.mig_enabled)


def label_candidates(inv: Inventory) -> list[GpuDevice]:
    """One GPU per model whose per-model labels GFD may end up writing: the full GPUs' models if there are
    full GPUs (their labeler runs last), else the MIG-enabled GPUs' models."""
    full = [d for d in inv.devices if not d.mig_enabled]
    group = full or list(inv.devices)
    return list({d.name: d for d in group}.values())


def gfd_labels(inv: Inventory, mig_strategy: str | None = None) -> dict[str, str]:
    """The labels gpu-feature-discovery would put on this node (without its timestamp)."""
    strategy = mig_strategy or default_strategy(inv)
    if strategy not in MIG_STRATEGIES:
        raise ValueError(f"unknown MIG strategy {strategy!r} (one of {', '.join(MIG_STRATEGIES)})")
    if not inv.devices:
        return {}
    major, minor, *rest = [*inv.driver_version.split("."), ""][:3]
    cmaj, cmin = inv.cuda_driver_version
    labels: dict[str, str] = {
        "nvidia.com/cuda.driver.major": major,
        "nvidia.com/cuda.driver.minor": minor,
        "nvidia.com/cuda.driver.rev": rest[0],
        "nvidia.com/cuda.runtime.major": str(cmaj),
        "nvidia.com/cuda.runtime.minor": str(cmin),
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rest[0],
        "nvidia.com/cuda.driver-version.full": inv.driver_version,
        "nvidia.com/cuda.runtime-version.major": str(cmaj),
        "nvidia.com/cuda.runtime-version.minor": str(cmin),
        "nvidia.com/cuda.runtime-version.full": f"{cmaj}.{cmin}",
        "nvidia.com/gpu.machine": sanitise(inv.machine) or "unknown",
        "nvidia.com/mig.capable": str(any(d.mig_capable for d in inv.devices)).lower(),
        "nvidia.com/mps.capable": "false",
    }
    classes = {d.pci_class for d in inv.devices}
    labels["nvidia.com/gpu.mode"] = (
        {0x0300: "graphics", 0x0302: "compute"}.get(classes.pop(), "unknown")
        if len(classes) == 1
        else "unknown"
    )
    counts: dict[str, int] = {}
    for d in inv.devices:
        counts[d.name] = counts.get(d.name, 0) + 1
    # MIG-enabled GPUs first; full GPUs of the same name override them, as in GFD, whatever the strategy (GFD
    # run on hack/fakenvml labels a MIG-enabled GPU's gpu.replicas 0 under strategy none too).
    for d in [d for d in inv.devices if d.mig_enabled]:
        labels.update(_gpu_labels(d, counts[d.name], mig_enabled=True))
    for d in [d for d in inv.devices if not d.mig_enabled]:
        labels.update(_gpu_labels(d, counts[d.name], mig_enabled=False))
    if strategy == "mixed":
        labels["nvidia.com/mig.strategy"] = "mixed"
        labels.update(mig_labels(inv))
    if strategy == "single":  # every GPU's MIG devices are its nvidia.com/gpu (agent/migsingle.py)
        labels["nvidia.com/mig.strategy"] = "single"
        labels.update(single_labels(inv))
    return labels


def mig_labels(inv: Inventory) -> dict[str, str]:
    """The mixed strategy's ``nvidia.com/mig-<profile>.*`` labels."""
    out: dict[str, str] = {}
    count: dict[str, int] = {}
    for d in inv.devices:
        if not d.mig_enabled:
            continue
        for m in d.mig_instances:
            if m.slices_ci != m.slices_gi:
                continue  # only CIs spanning their GI become resources (mig.md §4)
            p = m.resource_profile
            count[p] = count.get(p, 0) + 1
            if count[p] > 1:
                continue
            key = f"nvidia.com/mig-{p}"
            out |= {
                f"{key}.product": f"{sanitise(d.name)}-MIG-{sanitise(p)}",
                f"{key}.replicas": "1",
                f"{key}.sharing-strategy": "none",
                f"{key}.memory": str(m.memory_mib),
                f"{key}.multiprocessors": str(m.multiprocessors),
                f"{key}.slices.gi": str(m.slices_gi),
                f"{key}.slices.ci": str(m.slices_ci),
                f"{key}.engines.copy": str(m.engines_copy),
                f"{key}.engines.decoder": str(m.engines_decoder),
                f"{key}.engines.encoder": str(m.engines_encoder),
                f"{key}.engines.jpeg": str(m.engines_jpeg),
                f"{key}.engines.ofa": str(m.engines_ofa),
            }
    for p, c in count.items():
        out[f"nvidia.com/mig-{p}.count"] = str(c)
    return out


def mig_resources(inv: Inventory) -> dict[str, list[str]]:
    """``nvidia.com/mig-<profile>`` -> the MIG UUIDs of that profile (mixed strategy)."""
    out: dict[str, list[str]] = {}
    for d in inv.devices:
        if d.mig_enabled:
            for m in d.mig_instances:
                if m.slices_ci == m.slices_gi:
                    out.setdefault(f"nvidia.com/mig-{m.resource_profile}", []).append(m.uuid)
    return out


def nvlink_groups(inv: Inventory) -> list[list[int]]:
    """GPUs connected over NVLink (connected components of the peer graph; a GPU alone is its own group)."""
    peers: dict[int, set[int]] = {d.index: set() for d in inv.devices}
    for d in inv.devices:
        for p in d.nvlink_peers:
            if p in peers:
                peers[d.index].add(p)
                peers[p].add(d.index)
    seen: set[int] = set()
    groups = []
    for i in sorted(peers):
        if i in seen:
            continue
        stack, group = [i], set()
        while stack:
            j = stack.pop()
            if j not in group:
                group.add(j)
                stack.extend(peers[j] - group)
        seen |= group
        groups.append(sorted(group))
    return groups


def topology_annotation(inv: Inventory) -> str:
    """gpusched's ``gpusched.io/gpu-topology``: NVLink groups and each GPU's NUMA node and NVLink peers."""
    doc = {
        "nvlinkGroups": nvlink_groups(inv),
        "gpus": [
            {"index": d.index, "uuid": d.uuid, "numa": d.numa_node, "nvlink": list(d.nvlink_peers)}
            for d in inv.devices
        ],
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)
