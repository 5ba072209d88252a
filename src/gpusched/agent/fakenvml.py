"""The fake GPUs of a fake-GPU file (:mod:`gpusched.agent.fake`) in the flat form that the fake
``libnvidia-ml.so.1`` (hack/fakenvml) reads from ``$GPUSCHED_FAKE_NVML_CONFIG``, so one description drives the
agent's fake backend, its real NVML backend and NVIDIA's own components.

Format (one record per line, fields separated by tabs; -1 means "not given")::

    gpusched-fake-nvml  1
    driver    550.107.02
    cuda      12040                          # NVML's CUDA driver version: major * 1000 + minor * 10
    xidfile   /run/fake-xids                 # optional
    gpu       <index> <uuid> <bus id> <PCI device id> <memory MiB> <cc major> <cc minor> <NUMA node> <mig>
              <name>
    minor     <minor number>                 # optional: nvmlDeviceGetMinorNumber (default: the index)
    peers     <GPU index>...                 # NVLink peers: link k goes to the k-th
    readings  <util %> <memory used MiB> <temperature C> <power mW>
    profile   <NVML index> <id> <SM slices> <max count> <memory MiB> <SMs> <copy> <dec> <enc> <jpeg> <ofa>
              <placement size> <allowed starts, bit mask> <name>
    mig       <GI id> <profile NVML index> <start> <CI slices> <MIG UUID> [<memory used MiB>]
    xid       <xid>                          # delivered once to each event set

``<mig>`` is 0 (no MIG), 2 (MIG-capable, off) or 3 (on). NVML reports integers for utilization, temperature
and power (mW): fractional values in the fake file are truncated here, as the driver would report them.
"""

from __future__ import annotations

from pathlib import Path

from gpusched.agent import migprofiles
from gpusched.agent.fake import FakeBackend

# migprofiles' kind -> (NVML GPU-instance profile index constant, profile id) per layout (mig.md §2a, §2c).
_EIGHT_SLICE_IDS = {
    "1g": (0, 19),
    "1g+me": (7, 20),
    "1g2": (9, 15),
    "2g": (1, 14),
    "3g": (2, 9),
    "4g": (3, 5),
    "7g": (4, 0),
}
_A30_IDS = {"1g": (0, 14), "1g+me": (7, 21), "2g": (1, 5), "4g": (3, 0)}

# NVML name -> PCI device id (device << 16 | vendor) where known (NVIDIA's mocks, pci.ids); else 0x000010DE.
_PCI_IDS = {
    "NVIDIA A100-SXM4-40GB": 0x20B010DE,
    "NVIDIA A100-SXM4-80GB": 0x20B210DE,
    "NVIDIA A100 80GB PCIe": 0x20B510DE,
    "NVIDIA A30": 0x20B710DE,
    "NVIDIA H100 80GB HBM3": 0x233010DE,
    "Tesla T4": 0x1EB810DE,
}


def _num(v: float | int | None) -> int:
    return -1 if v is None else int(v)


def flat_config(backend: FakeBackend) -> str:
    """The flat description of ``backend``'s GPUs, readings and pending XIDs."""
    inv = backend.inventory()
    major, minor = inv.cuda_driver_version
    lines = ["gpusched-fake-nvml\t1", f"driver\t{inv.driver_version}", f"cuda\t{major * 1000 + minor * 10}"]
    if backend.xid_file is not None:
        lines.append(f"xidfile\t{backend.xid_file}")
    xids: dict[int, list[int]] = {}
    for x in backend.pending_xids():
        xids.setdefault(x.gpu_index, []).append(x.xid)
    for d in inv.devices:
        mig = (3 if d.mig_enabled else 2) if d.mig_capable else 0
        numa = -1 if d.numa_node is None else d.numa_node
        pci_id = _PCI_IDS.get(d.name, 0x000010DE)
        lines.append(
            f"gpu\t{d.index}\t{d.uuid}\t{d.pci_bus_id}\t{pci_id:#x}\t{d.memory_mib}\t{d.compute_major}\t"
            f"{d.compute_minor}\t{numa}\t{mig}\t{d.name}"
        )
        if d.device_minor != d.index:
            lines.append(f"minor\t{d.device_minor}")
        if d.nvlink_peers:
            lines.append("peers\t" + "\t".join(str(p) for p in d.nvlink_peers))
        r = backend.sensors(d.index)  # the library refuses utilization itself while MIG mode is on
        power = None if r.power_w is None else round(r.power_w * 1000)
        lines.append(
            f"readings\t{_num(r.gpu_util_percent)}\t{_num(r.memory_used_mib)}\t{_num(r.temperature_c)}\t{_num(power)}"
        )
        table = migprofiles.profiles(d.name, d.memory_mib)
        ids = _A30_IDS if migprofiles.model_class(d.name, d.memory_mib) == "a30" else _EIGHT_SLICE_IDS
        index_of: dict[str, int] = {}
        for p in table.values():
            index, pid = ids[p.kind.key]
            index_of[p.name] = index
            starts = sum(1 << s for s in p.kind.starts)
            c, dec, enc, jpeg, ofa = p.engines
            lines.append(
                f"profile\t{index}\t{pid}\t{p.kind.sm_slices}\t{p.kind.max_count}\t{p.memory_mib}\t"
                f"{p.multiprocessors}\t{c}\t{dec}\t{enc}\t{jpeg}\t{ofa}\t{p.kind.mem_slices}\t{starts}\t{p.name}"
            )
        mig_mem = backend.mig_readings(d.index)
        for m in d.mig_instances:
            lines.append(
                f"mig\t{m.gi_id}\t{index_of[m.profile]}\t{m.placement_start}\t{m.slices_ci}\t{m.uuid}\t"
                f"{_num(mig_mem[m.uuid].memory_used_mib)}"
            )
        lines += [f"xid\t{x}" for x in xids.get(d.index, [])]
    return "\n".join(lines) + "\n"


def write_flat_config(fake_file: Path, out: Path) -> None:
    """Reads a fake-GPU file (errors name the file and field) and writes its flat form to ``out``."""
    out.write_text(flat_config(FakeBackend.from_file(fake_file)))
