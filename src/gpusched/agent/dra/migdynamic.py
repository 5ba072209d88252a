"""Dynamic MIG as partitionable devices (``--dra-mig dynamic``), in NVIDIA's DRA driver's shape.

NVIDIA's driver (kubernetes-sigs/dra-driver-nvidia-gpu, ``cmd/gpu-kubelet-plugin/partitions.go`` and
``mig.go``) publishes, per MIG-capable GPU:

- one counter set ``gpu-<minor>-counter-set`` in a slice of its own (a slice holds counters or devices, never
  both): one counter per capacity of the largest profile, named as the capacity in DNS form
  (``multiprocessors``, ``copy-engines``, ``decoders``, ``encoders``, ``jpeg-engines``, ``ofa-engines``,
  ``memory``), and one counter ``memory-slice-<i>`` of value 1 per memory slice;
- one device per legal placement of every GPU-instance profile, named
  ``gpu-<minor>-mig-<profile without dots, '+' as '-'>-<GI profile ID>-<start>``, with the attributes
  ``type=mig``, ``parentUUID``, ``profile`` and the parent's product, versions and PCI bus ID, the capacities
  ``multiprocessors``, ``copyEngines``, ``decoders``, ``encoders``, ``jpegEngines``, ``ofaEngines``,
  ``memory`` of its profile, and ``consumesCounters`` of its capacities plus its memory slices
  ``memory-slice-<start>`` .. ``<start+size-1>``.

Two placements that share a memory slice can then never be allocated together (each slice counter is 1), and
the engine counters keep per-GPU limits (one ``+me`` profile per GPU: its OFA engine is the GPU's only one).
The instance does not exist yet: ``NodePrepareResources`` creates it at that placement
(:mod:`gpusched.agent.dra.migprepare`). The GI profile IDs in the names are nvidia-smi's
(``../shared/reference/mig.md`` §2a, §2c); they only name devices, the NVML calls read the IDs from the
driver.

gpusched publishes the placements *instead of* the whole GPU on a GPU in MIG mode (a whole-GPU context cannot
run there; the 7g placement is the whole GPU's equivalent); a MIG-capable GPU with MIG mode off stays one
whole GPU. A placement that overlaps a MIG instance no prepared claim made (configured by hand, or by
mig-parted) is not published: creating it would fail.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection
from dataclasses import dataclass

from gpusched.agent import migprofiles
from gpusched.agent.inventory import GpuDevice

#: nvidia-smi's GPU-instance profile IDs by kind: the 8-memory-slice layout (A100 ... B200) and A30's.
GI_PROFILE_IDS = {
    "eight": {"1g": 19, "1g+me": 20, "1g2": 15, "2g": 14, "3g": 9, "4g": 5, "7g": 0},
    "a30": {"1g": 14, "1g+me": 21, "2g": 5, "4g": 0},
}
#: A MIG device's capacities (NVIDIA's names), in the order of ``Profile.engines`` after the SMs.
CAPACITIES = ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines", "memory")


@functools.cache
def counter_name(capacity: str) -> str:
    """A capacity's counter: its name in DNS form (``copyEngines`` -> ``copy-engines``), as NVIDIA has it."""
    return re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", capacity).lower()


def slice_counter(i: int) -> str:
    return f"memory-slice-{i}"


def counter_set_name(gpu_index: int) -> str:
    return f"gpu-{gpu_index}-counter-set"


def device_name(gpu_index: int, profile: str, gi_profile_id: int, start: int) -> str:
    p = re.sub(r"[^a-z0-9-]", "-", profile.lower().replace(".", "")).strip("-")
    return f"gpu-{gpu_index}-mig-{p}-{gi_profile_id}-{start}"


@dataclass(frozen=True)
class Placement:
    """One MIG placement of a GPU: what Prepare creates for a device that names it."""

    gpu_index: int
    gpu_uuid: str
    profile: str
    start: int
    size: int

    def __str__(self) -> str:
        return f"MIG {self.profile} at memory slice {self.start} of GPU {self.gpu_index}"


@dataclass(frozen=True)
class MigPart:
    """One placement as a device: its name, capacities and the counters it consumes (all integers; memory
    in MiB)."""

    name: str
    placement: Placement
    capacity: dict[str, int]
    counters: dict[str, int]


@dataclass(frozen=True)
class GpuPartitions:
    """A MIG GPU's counter set and its placements."""

    counter_set: str
    counters: dict[str, int]
    parts: tuple[MigPart, ...]


def _capacity(p: migprofiles.Profile) -> dict[str, int]:
    copy, dec, enc, jpeg, ofa = p.engines
    values = (p.multiprocessors, copy, dec, enc, jpeg, ofa, p.memory_mib)
    return dict(zip(CAPACITIES, values, strict=True))


def _counters(capacity: dict[str, int]) -> dict[str, int]:
    return {counter_name(k): v for k, v in capacity.items()}


def partitions(dev: GpuDevice, foreign: Collection[tuple[int, int]] = ()) -> GpuPartitions | None:
    """The counter set and the placements of a MIG-capable GPU (None for a GPU without MIG). ``foreign``:
    memory-slice spans ``(start, size)`` of instances that no prepared claim made; placements overlapping
    them are left out."""
    table = migprofiles.profiles(dev.name, dev.memory_mib)
    if not table:
        return None
    cls = migprofiles.model_class(dev.name, dev.memory_mib)
    ids = GI_PROFILE_IDS["a30" if cls == "a30" else "eight"]
    n_slices = max(p.kind.mem_slices for p in table.values())
    # the largest profile's capacities: every legal layout fits them (tests/test_agent_dra.py checks it)
    total = {c: max(_capacity(p)[c] for p in table.values()) for c in CAPACITIES}
    counters = {**_counters(total), **{slice_counter(i): 1 for i in range(n_slices)}}
    taken = {s for start, size in foreign for s in range(start, start + size)}
    parts = []
    for p in table.values():
        for start in p.kind.starts:
            span = range(start, start + p.kind.mem_slices)
            if taken.intersection(span):
                continue
            cap = _capacity(p)
            parts.append(
                MigPart(
                    device_name(dev.index, p.name, ids[p.kind.key], start),
                    Placement(dev.index, dev.uuid, p.name, start, p.kind.mem_slices),
                    cap,
                    {**_counters(cap), **{slice_counter(i): 1 for i in span}},
                )
            )
    return GpuPartitions(counter_set_name(dev.index), counters, tuple(parts))
