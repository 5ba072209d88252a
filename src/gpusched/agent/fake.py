"""A fake GPU backend, configured from a YAML or JSON file (or the env var ``GPUSCHED_FAKE_GPUS``: a path, or
the
document itself). CI and the kubelet e2e use it. Format::

    hostname: gpu-node-1            # default: $NODE_NAME, else the host name
    driverVersion: "550.107.02"
    cudaVersion: "12.4"             # the CUDA version the driver supports
    machine: DGX-A100               # GFD's nvidia.com/gpu.machine (default "unknown")
    xidFile: /run/fake-xids         # optional: lines "<gpu index> <xid>" appended here are XID events
    gpus:
      - model: NVIDIA A100-SXM4-80GB  # NVML's name; memoryMiB and computeCapability default from a small
      table
        count: 4                      # optional: this entry stands for 4 GPUs (indices run on)
        memoryMiB: 81920
        uuid: GPU-...                 # default: derived from hostname and index
        pciBusId: "00000000:07:00.0"  # default: derived from the index
        minor: 3                      # NVML's minor number, /dev/nvidia<minor> (default: the index)
        computeCapability: "8.0"
        numaNode: 0
        nvlinkPeers: [1, 2, 3]
        migMode: true
        mig: [{profile: 3g.40gb, start: 4}, {profile: 1g.10gb, start: 0, uuid: MIG-..., memoryUsedMiB: 512}]
                                      # memoryUsedMiB: its GPU instance's framebuffer in use (default 0)
        xids: [79]                    # injected once, at start
        readings: {utilization: 35, memoryUsedMiB: 1024, temperature: 41, power: 250.5}  # memoryUsedMiB
                                      # defaults to 0 (NVML always reports memory use); the others to none;
                                      # no utilization is reported while migMode is on (NVML gives none)

Errors name the file, the GPU (list position and index) and the field.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid as uuidlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml

from gpusched.agent import migprofiles
from gpusched.agent.inventory import GpuDevice, Inventory, MigInstance, Readings, XidEvent
from gpusched.agent.reshape import fakeops
from gpusched.core.errors import InvalidInput

ENV_VAR = "GPUSCHED_FAKE_GPUS"

# NVML name -> (memory MiB, compute capability) as the driver reports them.
KNOWN_MODELS: dict[str, tuple[int, tuple[int, int]]] = {
    "NVIDIA A100-SXM4-80GB": (81920, (8, 0)),
    "NVIDIA A100-SXM4-40GB": (40960, (8, 0)),
    "NVIDIA A100 80GB PCIe": (81920, (8, 0)),
    "NVIDIA A100-PCIE-40GB": (40960, (8, 0)),
    "NVIDIA A30": (24576, (8, 0)),
    "NVIDIA A10": (23028, (8, 6)),
    "NVIDIA L4": (23034, (8, 9)),
    "NVIDIA H100 80GB HBM3": (81559, (9, 0)),
    "NVIDIA H100 PCIe": (81559, (9, 0)),
    "NVIDIA H100 NVL": (95830, (9, 0)),
    "NVIDIA H200": (143771, (9, 0)),
    "Tesla T4": (15360, (7, 5)),
    "Tesla V100-SXM2-32GB": (32768, (7, 0)),
}


class FakeConfigError(InvalidInput):
    pass


def _uuid(seed: str) -> str:
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpusched-fake/{seed}"))


def _version(text: object, where: str, parts: tuple[int, ...]) -> tuple[int, ...]:
    s = str(text)
    bits = s.split(".")
    if len(bits) not in parts or not all(b.isdigit() for b in bits):
        raise FakeConfigError(f"{where}: {text!r} is not a version like {'.'.join(['X'] * max(parts))}")
    return tuple(int(b) for b in bits)


class FakeBackend:
    def __init__(
        self,
        inventory: Inventory,
        readings: Mapping[int, Readings] | None = None,
        xids: list[XidEvent] | None = None,
        xid_file: Path | None = None,
        mig_used: Mapping[str, int] | None = None,
    ) -> None:
        self._inv = inventory
        self._readings = dict(readings or {})
        self._mig_used = dict(mig_used or {})  # MIG UUID -> framebuffer used (MiB); absent: 0
        self._pending: list[XidEvent] = list(xids or [])
        self._cond = threading.Condition()
        self._xid_file = xid_file
        self._xid_offset = 0
        self._created = 0  # MIG instances created at run time (seeds their UUIDs)

    # -------------------------------------------------------------------------------- construction
    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FakeBackend:
        env = os.environ if env is None else env
        raw = env.get(ENV_VAR)
        if not raw:
            raise FakeConfigError(f"{ENV_VAR} is not set (a path to a fake GPU file, or the document itself)")
        if raw.lstrip().startswith(("{", "gpus:", "hostname:", "driverVersion:")) or "\n" in raw:
            return cls.from_text(raw, f"${ENV_VAR}", env)
        return cls.from_file(Path(raw), env)

    @classmethod
    def from_file(cls, path: Path, env: Mapping[str, str] | None = None) -> FakeBackend:
        try:
            text = path.read_text()
        except OSError as e:
            raise FakeConfigError(f"{path}: cannot read: {e.strerror}") from None
        return cls.from_text(text, str(path), env)

    @classmethod
    def from_text(cls, text: str, source: str, env: Mapping[str, str] | None = None) -> FakeBackend:
        try:
            doc = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as e:
            raise FakeConfigError(f"{source}: not valid YAML or JSON: {e}") from None
        return cls.from_dict(doc, source, env)

    @classmethod
    def from_dict(cls, doc: Any, source: str, env: Mapping[str, str] | None = None) -> FakeBackend:
        env = os.environ if env is None else env
        if not isinstance(doc, dict):
            raise FakeConfigError(f"{source}: the document must be a mapping with a 'gpus' list")
        unknown = set(doc) - {"hostname", "driverVersion", "cudaVersion", "machine", "xidFile", "gpus"}
        if unknown:
            raise FakeConfigError(f"{source}: unknown field(s) {sorted(unknown)}")
        hostname = str(doc.get("hostname") or env.get("NODE_NAME") or socket.gethostname())
        driver = str(doc.get("driverVersion", "550.107.02"))
        _version(driver, f"{source}: field driverVersion", (2, 3))
        cuda = _version(doc.get("cudaVersion", "12.4"), f"{source}: field cudaVersion", (2,))
        gpus = doc.get("gpus")
        if not isinstance(gpus, list) or not gpus:
            raise FakeConfigError(f"{source}: field gpus must be a non-empty list")
        devices: list[GpuDevice] = []
        readings: dict[int, Readings] = {}
        xids: list[XidEvent] = []
        mig_used: dict[str, int] = {}
        for pos, entry in enumerate(gpus):
            if not isinstance(entry, dict):
                raise FakeConfigError(f"{source}: gpus[{pos}] must be a mapping")
            count = entry.get("count", 1)
            if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                raise FakeConfigError(
                    f"{source}: gpus[{pos}]: field count must be a positive integer, not {count!r}"
                )
            for k in range(count):
                index = len(devices)
                where = f"{source}: gpus[{pos}] (GPU index {index})"
                dev, rd, xs = _gpu(entry, index, hostname, where, single=count == 1, copy=k)
                mig_used.update(_mig_used(entry, dev, where))
                devices.append(dev)
                readings[index] = rd
                xids += xs
        _check_unique(devices, source)
        for d in devices:
            bad = [p for p in d.nvlink_peers if p == d.index or p >= len(devices)]
            if bad:
                raise FakeConfigError(
                    f"{source}: GPU index {d.index}: field nvlinkPeers names no other GPU: {bad}"
                )
        inv = Inventory(
            hostname=hostname,
            driver_version=driver,
            cuda_driver_version=(cuda[0], cuda[1]),
            devices=tuple(devices),
            machine=str(doc.get("machine", "unknown")),
        )
        xid_file = Path(doc["xidFile"]) if doc.get("xidFile") else None
        return cls(inv, readings, xids, xid_file, mig_used)

    # ------------------------------------------------------------------------------------- backend
    def inventory(self) -> Inventory:
        return self._inv

    def set_mig_mode(self, gpu_index: int, enabled: bool) -> None:
        """MIG mode on or off, as ``nvmlDeviceSetMigMode`` (off only with no instance left; agent/reshape)."""
        with self._cond:
            self._inv = fakeops.set_mig_mode(self._inv, gpu_index, enabled)

    def readings(self, index: int) -> Readings:
        """What NVML reports: the GPU's sensors, but no utilization while it is in MIG mode (nvml.h: "On
        MIG-enabled GPUs, querying device utilization rates is not currently supported")."""
        r = self.sensors(index)
        d = self._inv.by_index(index)
        if d is not None and d.mig_enabled and r.gpu_util_percent is not None:
            r = replace(r, gpu_util_percent=None)
        return r

    def sensors(self, index: int) -> Readings:
        """The file's readings whatever the MIG mode (utilization shows again when MIG mode goes off)."""
        r = self._readings.get(index, Readings())
        d = self._inv.by_index(index)
        if d is not None and r.memory_free_mib is None:
            # NVML always reports memory use (nvmlDeviceGetMemoryInfo): none configured means none used
            used = r.memory_used_mib or 0
            r = Readings(r.gpu_util_percent, used, d.memory_mib - used, r.temperature_c, r.power_w)
        return r

    def mig_readings(self, index: int) -> dict[str, Readings]:
        """Each MIG device's framebuffer: its instance's memory, ``memoryUsedMiB`` of it used (NVML's
        ``nvmlDeviceGetMemoryInfo`` on the MIG device handle); nothing else, as NVML gives nothing else."""
        d = self._inv.by_index(index)
        if d is None or not d.mig_enabled:
            return {}
        out = {}
        for m in d.mig_instances:
            used = self._mig_used.get(m.uuid, 0)
            out[m.uuid] = Readings(memory_used_mib=used, memory_free_mib=m.memory_mib - used)
        return out

    @property
    def xid_file(self) -> Path | None:
        return self._xid_file

    def pending_xids(self) -> list[XidEvent]:
        """The XIDs not yet polled (the file's ``xids`` until the first poll), without taking them."""
        with self._cond:
            return list(self._pending)

    def set_readings(self, index: int, readings: Readings) -> None:
        self._readings[index] = readings

    def inject_xid(self, index: int, xid: int) -> None:
        with self._cond:
            self._pending.append(XidEvent(index, xid))
            self._cond.notify_all()

    def poll_xids(self, timeout_s: float) -> list[XidEvent]:
        with self._cond:
            self._read_xid_file()
            if not self._pending and timeout_s > 0:
                self._cond.wait(timeout_s)
                self._read_xid_file()
            out, self._pending = self._pending, []
        return out

    def _read_xid_file(self) -> None:
        if self._xid_file is None or not self._xid_file.exists():
            return
        with self._xid_file.open() as f:
            f.seek(self._xid_offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        self._xid_offset += len(complete.encode())
        for line in complete.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                self._pending.append(XidEvent(int(parts[0]), int(parts[1])))

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------- MIG reconfiguration (way (a))
    def create_mig_instance(self, gpu_index: int, profile: str, start: int) -> MigInstance:
        """A GPU instance of ``profile`` at ``start`` and its full compute instance, as NVML's
        ``nvmlDeviceCreateGpuInstanceWithPlacement`` and ``nvmlGpuInstanceCreateComputeInstance`` make them;
        raises MigError (naming the GPU) for a GPU out of MIG mode or a placement it cannot take."""
        with self._cond:
            d = self._mig_gpu(gpu_index)
            self._created += 1
            seed = f"{self._inv.hostname}/{gpu_index}/{profile}/{start}/{self._created}"
            gi = max((m.gi_id for m in d.mig_instances), default=0) + 1
            m = migprofiles.instance(d.name, d.memory_mib, profile, start, f"MIG-{_uuid(seed)}", gi_id=gi)
            insts = (*d.mig_instances, m)
            try:
                migprofiles.validate(d.name, d.memory_mib, insts)
            except migprofiles.MigError as e:
                raise migprofiles.MigError(
                    f"GPU {gpu_index}: cannot create MIG {profile} at {start}: {e}"
                ) from None
            self._set_instances(d, insts)
            return m

    def destroy_mig_instance(self, gpu_index: int, uuid: str) -> MigInstance:
        """Destroy the MIG device ``uuid`` of GPU ``gpu_index`` (its compute and GPU instance); returns it."""
        with self._cond:
            d = self._mig_gpu(gpu_index)
            gone = next((m for m in d.mig_instances if m.uuid == uuid), None)
            if gone is None:
                raise migprofiles.MigError(f"GPU {gpu_index} has no MIG device {uuid}")
            self._set_instances(d, tuple(m for m in d.mig_instances if m.uuid != uuid))
            return gone

    def _mig_gpu(self, gpu_index: int) -> GpuDevice:
        d = self._inv.by_index(gpu_index)
        if d is None or not d.mig_enabled:
            raise migprofiles.MigError(f"GPU {gpu_index} is not a GPU in MIG mode on {self._inv.hostname}")
        return d

    def _set_instances(self, d: GpuDevice, insts: tuple[MigInstance, ...]) -> None:
        new = replace(d, mig_instances=insts)
        self._inv = replace(self._inv, devices=tuple(new if x is d else x for x in self._inv.devices))


_GPU_FIELDS = {
    "model",
    "count",
    "memoryMiB",
    "uuid",
    "pciBusId",
    "minor",
    "computeCapability",
    "numaNode",
    "nvlinkPeers",
    "migMode",
    "mig",
    "xids",
    "readings",
}


def _int(entry: Mapping[str, Any], name: str, where: str, default: int | None = None) -> int | None:
    v = entry.get(name, default)
    if v is None:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise FakeConfigError(f"{where}: field {name} must be a non-negative integer, not {v!r}")
    return v


def _gpu(
    entry: Mapping[str, Any], index: int, hostname: str, where: str, *, single: bool, copy: int
) -> tuple[GpuDevice, Readings, list[XidEvent]]:
    unknown = set(entry) - _GPU_FIELDS
    if unknown:
        raise FakeConfigError(f"{where}: unknown field(s) {sorted(unknown)}")
    model = entry.get("model")
    if not isinstance(model, str) or not model.strip():
        raise FakeConfigError(f"{where}: field model is required (NVML's name, e.g. 'NVIDIA A100-SXM4-80GB')")
    known = KNOWN_MODELS.get(model)
    mem = _int(entry, "memoryMiB", where, known[0] if known else None)
    if not mem:
        raise FakeConfigError(
            f"{where}: field memoryMiB is required for a model not in the built-in table ({model})"
        )
    cc_raw = entry.get("computeCapability", f"{known[1][0]}.{known[1][1]}" if known else None)
    if cc_raw is None:
        raise FakeConfigError(f"{where}: field computeCapability is required for {model}")
    cc = _version(cc_raw, f"{where}: field computeCapability", (2,))
    uuid = entry.get("uuid") if single else None
    uuid = str(uuid) if uuid else f"GPU-{_uuid(f'{hostname}/{index}')}"
    if not uuid.startswith("GPU-"):
        raise FakeConfigError(f"{where}: field uuid must start with 'GPU-', not {uuid!r}")
    pci = entry.get("pciBusId") if single else None
    pci = str(pci) if pci else f"00000000:{0x07 + index * 0x08 & 0xFF:02X}:00.0"
    numa = _int(entry, "numaNode", where)
    minor = _int(entry, "minor", where)
    if minor is not None and not single:
        raise FakeConfigError(f"{where}: field minor names one GPU's device node; it needs count 1")
    peers_raw = entry.get("nvlinkPeers", [])
    if not isinstance(peers_raw, list) or not all(isinstance(p, int) and p >= 0 for p in peers_raw):
        raise FakeConfigError(f"{where}: field nvlinkPeers must be a list of GPU indices, not {peers_raw!r}")
    mig_mode = entry.get("migMode", False)
    if not isinstance(mig_mode, bool):
        raise FakeConfigError(f"{where}: field migMode must be true or false, not {mig_mode!r}")
    capable = bool(migprofiles.profiles(model, mem))
    if mig_mode and not capable:
        raise FakeConfigError(f"{where}: field migMode: {model} has no MIG")
    mig_raw = entry.get("mig", [])
    if not isinstance(mig_raw, list):
        raise FakeConfigError(f"{where}: field mig must be a list of {{profile, start}}")
    if mig_raw and not mig_mode:
        raise FakeConfigError(f"{where}: field mig lists instances but migMode is false")
    instances: list[MigInstance] = []
    for j, m in enumerate(mig_raw):
        mw = f"{where}: field mig[{j}]"
        if not isinstance(m, dict) or "profile" not in m or "start" not in m:
            raise FakeConfigError(f"{mw}: each instance needs profile and start, got {m!r}")
        start = m["start"]
        if not isinstance(start, int) or isinstance(start, bool):
            raise FakeConfigError(f"{mw}: start must be an integer slice, not {start!r}")
        muuid = str(m.get("uuid") or f"MIG-{_uuid(f'{hostname}/{index}/{j}/{copy}')}")
        try:
            instances.append(migprofiles.instance(model, mem, str(m["profile"]), start, muuid, gi_id=j + 1))
        except migprofiles.MigError as e:
            raise FakeConfigError(f"{mw}: {e}") from None
    try:
        migprofiles.validate(model, mem, instances)
    except migprofiles.MigError as e:
        raise FakeConfigError(f"{where}: field mig: {e}") from None
    xids_raw = entry.get("xids", [])
    if not isinstance(xids_raw, list) or not all(isinstance(x, int) and x > 0 for x in xids_raw):
        raise FakeConfigError(f"{where}: field xids must be a list of positive integers, not {xids_raw!r}")
    rd = entry.get("readings", {}) or {}
    if not isinstance(rd, dict):
        raise FakeConfigError(f"{where}: field readings must be a mapping")
    bad = set(rd) - {"utilization", "memoryUsedMiB", "temperature", "power"}
    if bad:
        raise FakeConfigError(f"{where}: field readings: unknown {sorted(bad)}")
    for k, v in rd.items():
        if not isinstance(v, int | float) or isinstance(v, bool) or v < 0:
            raise FakeConfigError(f"{where}: field readings.{k} must be a non-negative number, not {v!r}")
    used = rd.get("memoryUsedMiB")
    if used is not None and used > mem:
        raise FakeConfigError(f"{where}: field readings.memoryUsedMiB {used} is more than memoryMiB {mem}")
    dev = GpuDevice(
        index=index,
        uuid=uuid,
        name=model,
        memory_mib=mem,
        pci_bus_id=pci,
        compute_major=cc[0],
        compute_minor=cc[1],
        mig_capable=capable,
        mig_enabled=mig_mode,
        mig_instances=tuple(instances),
        nvlink_peers=tuple(sorted(set(peers_raw))),  # as NVML's links give them: a set, in index order
        numa_node=numa,
        minor=index if minor is None else minor,
    )
    readings = Readings(
        gpu_util_percent=rd.get("utilization"),
        memory_used_mib=int(used) if used is not None else None,
        temperature_c=rd.get("temperature"),
        power_w=rd.get("power"),
    )
    return dev, readings, [XidEvent(index, x) for x in xids_raw]


def _mig_used(entry: Mapping[str, Any], dev: GpuDevice, where: str) -> dict[str, int]:
    """MIG UUID -> ``memoryUsedMiB`` of the entry's instances that give one (0 to its memory)."""
    out = {}
    for j, (m, inst) in enumerate(zip(entry.get("mig") or [], dev.mig_instances, strict=True)):
        used = m.get("memoryUsedMiB")
        if used is None:
            continue
        if not isinstance(used, int) or isinstance(used, bool) or not 0 <= used <= inst.memory_mib:
            raise FakeConfigError(
                f"{where}: field mig[{j}].memoryUsedMiB must be an integer from 0 to the instance's "
                f"{inst.memory_mib} MiB, not {used!r}"
            )
        out[inst.uuid] = used
    return out


def _check_unique(devices: list[GpuDevice], source: str) -> None:
    seen: dict[str, int] = {}
    for d in devices:
        for key in (d.uuid, d.pci_bus_id, f"/dev/{d.device_node}", *(m.uuid for m in d.mig_instances)):
            if key in seen and seen[key] != d.index:
                raise FakeConfigError(f"{source}: GPU index {d.index}: {key} is also GPU index {seen[key]}'s")
            seen[key] = d.index


def fake_node_labels(model: str, count: int, hostname: str = "fake-node") -> dict[str, str]:
    """The node labels the agent writes (GFD's names and values, ``gpusched.agent.labels.gfd_labels``) for a
    node of ``count`` fake GPUs of NVML name ``model`` (e.g. "NVIDIA A100-SXM4-80GB", "Tesla T4") with this
    format's defaults: what ``gpusched up`` and the tests put on kwok nodes, so they look like real ones."""
    from gpusched.agent.labels import gfd_labels

    doc = {"hostname": hostname, "gpus": [{"model": model, "count": count}]}
    return gfd_labels(FakeBackend.from_dict(doc, f"fake GPUs {model!r}").inventory())
