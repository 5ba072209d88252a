"""The capability device nodes a container needs for a MIG device (``/dev/nvidia-caps/nvidia-cap<N>``).

On a GPU in MIG mode, the parent's ``/dev/nvidia<minor>`` is not enough: the driver lets a process use a GPU
instance and a compute instance only when it can open their *access capabilities*. NVIDIA's driver exposes
them as character devices under ``/dev/nvidia-caps`` (the ``nvidia-caps`` major), one minor per capability,
and names each capability by a procfs path:

- ``/proc/driver/nvidia/capabilities/gpu<G>/mig/gi<I>/access`` (the GPU instance ``I`` of the GPU whose
  device minor is ``G``) and ``.../gi<I>/ci<C>/access`` (its compute instance ``C``); each file says
  ``DeviceFileMinor: <N>``;
- ``/proc/driver/nvidia-caps/mig-minors``, the whole table, one ``gpu<G>/gi<I>/access <N>`` or
  ``gpu<G>/gi<I>/ci<C>/access <N>`` per line (the minors are fixed by the driver for every possible
  instance, so the table holds them before the instance exists).

NVIDIA's container toolkit and its DRA driver put both nodes into a MIG device's container edits; so does
the agent's CDI spec (``cdi.py``). The minor comes from ``mig-minors`` (read once: the table does not
change while the driver is loaded); where the table lacks the line, from the capability file itself. All is
read under an injectable root (``/`` on a node; the fake backend's tests give a fake tree). Where neither
file is there (a node without NVIDIA's driver: the fake GPUs), the agent says so once in its log and the spec
carries no capability node. A capability whose ``/dev/nvidia-caps`` node exists on the host is given by its
host path; one whose node was never made (``nvidia-modprobe -f <path>`` makes it) by type ``c``, the
``nvidia-caps`` major from ``/proc/devices``, its minor and its ``DeviceFileMode``, so the runtime creates it
in the container (NVIDIA's DRA driver does the same); without the major it is left out with a warning.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MIG_MINORS = "proc/driver/nvidia-caps/mig-minors"
CAPABILITIES = "proc/driver/nvidia/capabilities"
_LINE = re.compile(r"^(gpu\d+/gi\d+(?:/ci\d+)?/access)\s+(\d+)\s*$")
_MINOR = re.compile(r"^DeviceFileMinor:\s*(\d+)\s*$", re.MULTILINE)
_MODE = re.compile(r"^DeviceFileMode:\s*(\d+)\s*$", re.MULTILINE)
DEVICES = "proc/devices"
_MAJOR = re.compile(r"^\s*(\d+)\s+nvidia-caps\s*$", re.MULTILINE)


def capability_paths(gpu_minor: int, gi: int, ci: int) -> tuple[str, str]:
    """The procfs paths (under ``/proc/driver/nvidia/capabilities``) of the GPU instance's and the compute
    instance's access capabilities."""
    base = f"gpu{gpu_minor}/mig/gi{gi}"
    return f"{base}/access", f"{base}/ci{ci}/access"


@dataclass
class MigCaps:
    """Reads the capability minors under ``root`` and gives the CDI device nodes of a MIG device."""

    root: Path = Path("/")
    dev_root: Path = Path("/dev")
    _table: dict[str, int] | None = None
    _said: set[str] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _say_once(self, what: str, message: str, *args: object) -> None:
        with self._lock:
            if what in self._said:
                return
            self._said.add(what)
        log.warning(message, *args)

    def _minors(self) -> dict[str, int]:
        with self._lock:
            if self._table is not None:
                return self._table
        path = self.root / MIG_MINORS
        table: dict[str, int] = {}
        try:
            text = path.read_text()
        except OSError:
            return table  # not cached: the driver may not be loaded yet
        for line in text.splitlines():
            m = _LINE.match(line.strip())
            if m:
                table[m.group(1)] = int(m.group(2))
        with self._lock:
            self._table = table
        return table

    def minor(self, capability: str) -> int | None:
        """The device minor of ``capability`` (``gpu0/mig/gi1/access``), None when the host tells none."""
        key = capability.replace("/mig/", "/", 1)  # the table's names drop the "mig" directory
        found = self._minors().get(key)
        if found is not None:
            return found
        try:
            m = _MINOR.search((self.root / CAPABILITIES / capability).read_text())
        except OSError:
            return None
        return int(m.group(1)) if m else None

    def device_nodes(self, gpu_minor: int, gi: int, ci: int) -> list[dict[str, Any]]:
        """The CDI ``deviceNodes`` of the GPU instance's and compute instance's access capabilities: none when
        the host tells no minor for one of them; a node that exists under ``dev_root`` by its host path, else
        by type, major (``nvidia-caps`` in ``/proc/devices``), minor and mode (the runtime creates it)."""
        caps = capability_paths(gpu_minor, gi, ci)
        minors = [self.minor(c) for c in caps]
        if any(n is None for n in minors):
            if not (self.root / MIG_MINORS).exists() and not (self.root / CAPABILITIES).exists():
                self._say_once(
                    "no-driver",
                    "MIG devices get no /dev/nvidia-caps nodes in their CDI specs: neither %s nor %s exists "
                    "(no NVIDIA driver on this node: fake GPUs)",
                    self.root / MIG_MINORS, self.root / CAPABILITIES,
                )  # fmt: skip
            else:
                self._say_once(
                    f"{gpu_minor}/{gi}/{ci}",
                    "MIG GPU instance %d / compute instance %d of GPU %d: no capability minor for %s "
                    "under %s; its CDI spec gets no /dev/nvidia-caps nodes",
                    gi, ci, gpu_minor, " or ".join(caps), self.root,
                )  # fmt: skip
            return []
        out: list[dict[str, Any]] = []
        for cap, n in zip(caps, minors, strict=True):
            path = f"/dev/nvidia-caps/nvidia-cap{n}"
            host = self.dev_root / "nvidia-caps" / f"nvidia-cap{n}"
            if host.exists():
                out.append({"path": path, "hostPath": str(host)})
                continue
            major = self._major()
            if major is None:
                self._say_once(
                    str(host),
                    "%s (capability %s) does not exist and %s names no nvidia-caps major: the MIG device's "
                    "container cannot use it (nvidia-modprobe -f /%s/%s creates the node)",
                    host, cap, self.root / DEVICES, CAPABILITIES, cap,
                )  # fmt: skip
                continue
            # not made on the host (nvidia-modprobe was not run): the runtime creates the node in the
            # container from its type and numbers, and lets the container open it, as NVIDIA's driver has it
            out.append({"path": path, "type": "c", "major": major, "minor": n, "fileMode": self._mode(cap)})
        return out

    def _major(self) -> int | None:
        """The ``nvidia-caps`` character device major, from ``/proc/devices``."""
        try:
            text = (self.root / DEVICES).read_text()
        except OSError:
            return None
        m = _MAJOR.search(text)
        return int(m.group(1)) if m else None

    def _mode(self, capability: str) -> int:
        """The capability's ``DeviceFileMode`` (0o444 when its file does not say)."""
        try:
            m = _MODE.search((self.root / CAPABILITIES / capability).read_text())
        except OSError:
            return 0o444
        return int(m.group(1)) if m else 0o444
