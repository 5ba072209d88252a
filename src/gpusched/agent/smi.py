"""Compare ``gpusched agent discover --json`` with ``nvidia-smi -q -x`` (hack/gpu-check.sh, GPU machines)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any


def _text(el: ET.Element | None, path: str) -> str:
    if el is None:
        return ""
    x = el.find(path)
    return (x.text or "").strip() if x is not None else ""


def _mib(text: str) -> int | None:
    m = re.match(r"(\d+)\s*MiB", text)
    return int(m.group(1)) if m else None


def compare(agent: dict[str, Any], smi_xml: str) -> list[str]:
    """The differences, one line each (empty when both agree)."""
    root = ET.fromstring(smi_xml)
    diffs: list[str] = []
    if _text(root, "driver_version") != agent.get("driver_version"):
        diffs.append(
            f"driver version: agent {agent.get('driver_version')!r}, "
            f"nvidia-smi {_text(root, 'driver_version')!r}"
        )
    cuda = _text(root, "cuda_version")
    if cuda and cuda != agent.get("cuda_driver_version"):
        diffs.append(f"CUDA version: agent {agent.get('cuda_driver_version')!r}, nvidia-smi {cuda!r}")
    gpus = root.findall("gpu")
    devices = agent.get("devices") or []
    if len(gpus) != len(devices):
        diffs.append(f"GPU count: agent {len(devices)}, nvidia-smi {len(gpus)}")
    for i, (g, d) in enumerate(zip(gpus, devices, strict=False)):
        checks = {
            "uuid": (d.get("uuid"), _text(g, "uuid")),
            "name": (d.get("name"), _text(g, "product_name")),
            "memory MiB": (d.get("memory_mib"), _mib(_text(g, "fb_memory_usage/total"))),
            "PCI bus id": (
                str(d.get("pci_bus_id", "")).upper(),
                _text(g, "pci/pci_bus_id").upper() or g.get("id", "").upper(),
            ),
        }
        mig = _text(g, "mig_mode/current_mig")
        if mig:
            checks["MIG enabled"] = (bool(d.get("mig_enabled")), mig.lower() == "enabled")
            n_mig = len(g.findall("mig_devices/mig_device"))
            checks["MIG devices"] = (len(d.get("mig_instances") or []), n_mig)
        for what, (a, s) in checks.items():
            if a != s:
                diffs.append(f"GPU {i} {what}: agent {a!r}, nvidia-smi {s!r}")
    return diffs
