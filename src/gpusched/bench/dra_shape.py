"""What ``gpusched bench dra`` publishes and submits, as API objects (plain dicts; no I/O).

**Nodes.** kwok nodes with no extended GPU resources: their GPUs exist only as ResourceSlices, shaped as
NVIDIA's DRA driver publishes an A100-SXM4-40GB in dynamic-MIG mode (``../shared/reference/dra.md`` §4):
driver ``gpu.nvidia.com``, one pool per node named after it, and per GPU

- a counter set ``gpu-<i>-counter-set``: ``multiprocessors``, ``copy-engines``, ``decoders``,
  ``encoders``, ``jpeg-engines``, ``ofa-engines``, ``memory`` and ``memory-slice-0..7`` (1 each);
- the full GPU ``gpu-<i>`` (``type=gpu``), consuming the whole set;
- every legal placement of every MIG profile, ``gpu-<i>-mig-<profile>-<start>`` (``type=mig``,
  ``profile``, ``parentUUID``), consuming its share and its memory slices (``core.mig.profiles``,
  the one MIG table of the project).

Each GPU's counter set and its devices are a slice of their own (``<node>-gpu-<i>-counters``,
``<node>-gpu-<i>-devices``), devices in name order (the order kube-scheduler's allocator visits).
NVIDIA's driver shares a whole GPU by one claim and time-slicing, not by consumable capacity, so the
slices have none and no stream asks for a share by capacity.

**Classes.** ``gpu.nvidia.com`` (``type == 'gpu'``) and ``mig.nvidia.com`` (``type == 'mig'``), as
the driver installs them, under a per-run suffix so that a shared control plane may hold others.

**Streams.** A stream is a seeded list of ``Ask`` (a MIG profile, or whole GPUs and how many); each
pod has one claim of its own (``resourceClaimName``), made before the pod.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpusched.core.errors import InvalidInput
from gpusched.core.mig.profiles import Profile, profiles
from gpusched.core.names import LABEL_BENCH

DRIVER = "gpu.nvidia.com"
PRODUCT = "NVIDIA A100-SXM4-40GB"
GPU_MEMORY_MIB = 40960
GPUS_PER_NODE = 8
MEMORY_SLICES = 8
LABEL = LABEL_BENCH
WHOLE = "gpu"
"""The ``profile`` of an ``Ask`` for whole GPUs."""

A100: dict[str, Profile] = {n: p for n, p in profiles(PRODUCT, GPU_MEMORY_MIB).items() if "+me" not in n}
"""The A100 40GB's GPU-instance profiles (the media-extension variant left out: no stream asks for it)."""

_FULL = {
    "multiprocessors": 98,
    "copy-engines": 7,
    "decoders": 5,
    "encoders": 0,
    "jpeg-engines": 1,
    "ofa-engines": 1,
}


@dataclass(frozen=True, slots=True)
class Ask:
    profile: str
    """A MIG profile of ``A100`` (``1g.5gb`` ...), or ``WHOLE``."""
    count: int = 1

    @property
    def label(self) -> str:
        return self.profile if self.profile != WHOLE else f"{self.count}x gpu"


# Stream mixes: (ask, weight). MIG-heavy: mostly slices, a few whole GPUs; mixed: whole GPUs beside slices.
MIXES: dict[str, tuple[tuple[Ask, float], ...]] = {
    "mig-heavy": (
        (Ask("1g.5gb"), 0.35),
        (Ask("1g.10gb"), 0.10),
        (Ask("2g.10gb"), 0.20),
        (Ask("3g.20gb"), 0.15),
        (Ask("4g.20gb"), 0.05),
        (Ask("7g.40gb"), 0.05),
        (Ask(WHOLE), 0.10),
    ),
    "mixed": (
        (Ask(WHOLE), 0.30),
        (Ask(WHOLE, 2), 0.10),
        (Ask("1g.5gb"), 0.20),
        (Ask("1g.10gb"), 0.05),
        (Ask("2g.10gb"), 0.15),
        (Ask("3g.20gb"), 0.15),
        (Ask("4g.20gb"), 0.05),
    ),
}
PODS_PER_GPU = {"mig-heavy": 5, "mixed": 3}
"""Stream length per GPU of the cluster: enough that every stream saturates it."""


def stream(mix: str, gpus: int, seed: int) -> list[Ask]:
    """The seeded stream ``mix`` for a cluster of ``gpus`` GPUs."""
    if mix not in MIXES:
        raise InvalidInput(f"unknown stream {mix!r}; choose from {', '.join(MIXES)}")
    rng = random.Random(f"dra-bench/{mix}/{seed}")
    asks, weights = zip(*MIXES[mix], strict=True)
    return list(rng.choices(asks, weights, k=PODS_PER_GPU[mix] * gpus))


def throughput_stream(gpus: int, per_gpu: int) -> list[Ask]:
    """``per_gpu`` 1g.5gb slices per GPU: fits whatever each scheduler chooses (7 fit on a GPU)."""
    if not 1 <= per_gpu <= 7:
        raise InvalidInput(
            f"throughput pods per GPU must be 1-7 (a GPU holds 7 1g.5gb slices), got {per_gpu}"
        )
    return [Ask("1g.5gb")] * (per_gpu * gpus)


def gang_members(gangs: int, size: int, seed: int) -> list[int]:
    """The gang of each pod of the gang stream, in creation order: members of ``gangs`` gangs of
    ``size`` interleaved at random (seeded), as the pods of jobs submitted together arrive."""
    order = [g for g in range(gangs) for _ in range(size)]
    random.Random(f"dra-bench/gangs/{seed}").shuffle(order)
    return order


def _q(v: int) -> dict[str, str]:
    return {"value": str(v)}


def _counters(counts: dict[str, int], memory_mib: int, start: int, slices: int) -> dict[str, Any]:
    out = {k: _q(v) for k, v in counts.items()}
    out["memory"] = {"value": f"{memory_mib}Mi"}
    out.update({f"memory-slice-{k}": _q(1) for k in range(start, start + slices)})
    return out


def _engines(p: Profile) -> dict[str, int]:
    copy, dec, enc, jpeg, ofa = p.engines
    return {
        "multiprocessors": p.multiprocessors,
        "copy-engines": copy,
        "decoders": dec,
        "encoders": enc,
        "jpeg-engines": jpeg,
        "ofa-engines": ofa,
    }


def gpu_uuid(node: str, i: int) -> str:
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{i}.{node}')}"


def _gpu_devices(node: str, i: int) -> list[dict[str, Any]]:
    cset, parent = f"gpu-{i}-counter-set", gpu_uuid(node, i)
    pci: dict[str, Any] = {
        "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{i // 4:02x}"},
        "resource.kubernetes.io/pciBusID": {"string": f"0000:{16 * i + 7:02x}:00.0"},
    }
    full = {
        "name": f"gpu-{i}",
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": parent},
            "productName": {"string": PRODUCT},
            "brand": {"string": "Nvidia"},
            "architecture": {"string": "Ampere"},
            "cudaComputeCapability": {"version": "8.0.0"},
            **pci,
        },
        "capacity": {"memory": {"value": f"{GPU_MEMORY_MIB}Mi"}},
        "consumesCounters": [
            {"counterSet": cset, "counters": _counters(_FULL, GPU_MEMORY_MIB, 0, MEMORY_SLICES)}
        ],
    }
    devices = [full]
    for name, p in A100.items():
        for start in p.kind.starts:
            engines = _engines(p)
            attributes: dict[str, Any] = {
                "type": {"string": "mig"},
                "profile": {"string": name},
                "parentUUID": {"string": parent},
                "productName": {"string": PRODUCT},
                **pci,
            }
            devices.append(
                {
                    "name": f"gpu-{i}-mig-{name.replace('.', '')}-{start}",
                    "attributes": attributes,
                    "capacity": {
                        "multiprocessors": _q(p.multiprocessors),
                        "copyEngines": _q(engines["copy-engines"]),
                        "decoders": _q(engines["decoders"]),
                        "memory": {"value": f"{p.memory_mib}Mi"},
                    },
                    "consumesCounters": [
                        {
                            "counterSet": cset,
                            "counters": _counters(engines, p.memory_mib, start, p.kind.mem_slices),
                        }
                    ],
                }
            )
    return sorted(devices, key=lambda d: str(d["name"]))


def node_slices(node: str, gpus: int = GPUS_PER_NODE) -> list[dict[str, Any]]:
    """The ResourceSlices of ``node``'s pool: per GPU, its counter set and its devices."""
    pool = {"name": node, "generation": 1, "resourceSliceCount": 2 * gpus}
    out = []
    for i in range(gpus):
        counters = _counters(_FULL, GPU_MEMORY_MIB, 0, MEMORY_SLICES)
        parts: list[tuple[str, dict[str, Any]]] = [
            ("counters", {"sharedCounters": [{"name": f"gpu-{i}-counter-set", "counters": counters}]}),
            ("devices", {"devices": _gpu_devices(node, i)}),
        ]
        for what, part in parts:
            out.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "ResourceSlice",
                    "metadata": {"name": f"{node}-gpu-{i}-{what}", "labels": {LABEL: node}},
                    "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, **part},
                }
            )
    return out


def kwok_node(name: str, tag: str) -> dict[str, Any]:
    """A kwok node without GPU extended resources: its GPUs are its ResourceSlices."""
    res = {"cpu": "128", "memory": "1024Gi", "pods": "250"}
    labels = {
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        LABEL: tag,
    }
    annotations = {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "status": {"capacity": res, "allocatable": res},
    }


@dataclass(frozen=True, slots=True)
class Classes:
    gpu: str
    mig: str

    @classmethod
    def for_tag(cls, tag: str) -> Classes:
        return cls(f"gpu-{tag}.nvidia.com", f"mig-{tag}.nvidia.com")

    def objects(self) -> list[dict[str, Any]]:
        def one(name: str, kind: str) -> dict[str, Any]:
            expr = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
            return {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": expr}}]},
            }

        return [one(self.gpu, "gpu"), one(self.mig, "mig")]

    def claim(self, name: str, ask: Ask) -> dict[str, Any]:
        exact: dict[str, Any]
        if ask.profile == WHOLE:
            exact = {"deviceClassName": self.gpu, "count": ask.count}
        else:
            expr = f"device.attributes['{DRIVER}'].profile == '{ask.profile}'"
            exact = {"deviceClassName": self.mig, "selectors": [{"cel": {"expression": expr}}]}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exact}]}},
        }


def claim_pod(name: str, claim: str, tag: str, scheduler: str, group: str = "") -> dict[str, Any]:
    """A pod of ``scheduler`` on the bench nodes ``tag`` holding ``claim``; with ``group``, a member of
    Kubernetes' own PodGroup ``group`` (``spec.schedulingGroup``)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "nodeSelector": {LABEL: tag},
        "tolerations": [{"operator": "Exists"}],
        "containers": [
            {
                "name": "main",
                "image": "pause",
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "claims": [{"name": "gpu"}]},
            }
        ],
        "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
    }
    if group:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL: tag}},
        "spec": spec,
    }


def pod_group(name: str, min_count: int) -> dict[str, Any]:
    """Kubernetes' own gang (``scheduling.k8s.io/v1beta1`` PodGroup): all ``min_count`` or none."""
    return {
        "apiVersion": "scheduling.k8s.io/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}},
    }


def slices_used(asks: Sequence[Ask]) -> int:
    """Compute slices (sevenths of a GPU) that ``asks`` take: a whole GPU 7, a profile its SM slices."""
    return sum(7 * a.count if a.profile == WHOLE else A100[a.profile].kind.sm_slices for a in asks)


def memory_slices_of(device: str) -> tuple[int, frozenset[int]]:
    """The GPU index and memory slices a device of ``node_slices`` takes (``gpu-3``: all 8 of GPU 3;
    ``gpu-3-mig-2g10gb-4``: slices 4 and 5), to check that no two allocations overlap."""
    head, _, rest = device.partition("-mig-")
    gpu = int(head.removeprefix("gpu-"))
    if not rest:
        return gpu, frozenset(range(MEMORY_SLICES))
    compact, start = rest.rsplit("-", 1)
    profile = next(n for n in A100 if n.replace(".", "") == compact)
    size = A100[profile].kind.mem_slices
    return gpu, frozenset(range(int(start), int(start) + size))


MIG_PAIR = (Ask("4g.20gb"), Ask("3g.20gb"))
"""The two members of a MIG gang: together they fill one A100 exactly (4g at start 0, 3g at start 4),
and only so; a 3g placed first-fit at start 0 leaves that GPU no room for any 4g."""


def mig_pair_asks(members: Sequence[int], seed: int) -> list[Ask]:
    """Each pod's ask in a stream of MIG-pair gangs (``gang_members(..., 2, ...)``): per gang, which
    member arrives first is drawn (seeded)."""
    rng = random.Random(f"dra-bench/mig-pairs/{seed}")
    first = {g: rng.randrange(2) for g in sorted(set(members))}
    seen: dict[int, int] = {}
    out = []
    for g in members:
        k = seen.get(g, 0)
        seen[g] = k + 1
        out.append(MIG_PAIR[(first[g] + k) % 2])
    return out
