"""First-fit against scored DRA allocation on NVIDIA-shaped nodes (issue 32 item 2): a pure experiment.

Nodes of 8 A100 40GB GPUs published as NVIDIA's DRA driver does in dynamic-MIG mode: per GPU a counter
set ``gpu-<i>-counter-set`` (multiprocessors, the five engine kinds, memory and ``memory-slice-0..7``),
the full GPU ``gpu-<i>`` consuming all of it and every legal placement of every profile
``gpu-<i>-mig-<profile>-<start>`` consuming its share and its memory slices; GPUs carry
``resource.kubernetes.io/pcieRoot`` (two GPUs a root) and ``resource.kubernetes.io/numaNode`` (four a
node). A stream of claim pods (one claim each) is offered in order; pods never leave. Each pod goes to
a node where its claim fits:

- ``first-fit``: kube-scheduler's allocator (first solution in device order) on the first node in
  name order where the claim fits;
- ``scored``: the allocator with ``SCORED`` on every node, the node whose chosen solution scores best
  (then the most used, then name order), as the DynamicResources plugin's Prefer ranks them.

Reported: pods placed before the first refusal, pods placed once the whole stream was offered
(saturation: the stream is longer than the nodes can hold), and for the mixed stream how many
multi-GPU claims landed on one PCIe root. Deterministic for a seed; nothing reads a clock here (the
command times it).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpusched.core.dra.allocator import Allocator, Fits
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import (
    AllocatedState,
    AttrValue,
    Capacity,
    Claim,
    CounterConsumption,
    CounterSet,
    Device,
    DeviceClass,
    DeviceId,
    ExactRequest,
    Node,
    NodeScope,
    Request,
    ResourceSlice,
)
from gpusched.core.dra.score import FIRST_FIT, SCORED, Score, SearchBudget
from gpusched.core.dra.selector import SelectorCompiler
from gpusched.core.mig.profiles import Profile, profiles

DRIVER = "gpu.nvidia.com"
PRODUCT, MEMORY_MIB = "NVIDIA A100-SXM4-40GB", 40960
MIB = 2**20
GPU_CLASS = DeviceClass(
    "gpu.nvidia.com", (f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'gpu'",)
)
MIG_CLASS = DeviceClass(
    "mig.nvidia.com", (f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == 'mig'",)
)
CLASSES = {c.name: c for c in (GPU_CLASS, MIG_CLASS)}
ENGINES = ("copy-engines", "decoders", "encoders", "jpeg-engines", "ofa-engines")


def _counters(p: Profile, start: int) -> dict[str, int]:
    out = {"multiprocessors": p.multiprocessors, "memory": p.memory_mib * MIB}
    out.update({name: n for name, n in zip(ENGINES, p.engines, strict=True)})
    out.update({f"memory-slice-{k}": 1 for k in range(start, start + p.kind.mem_slices)})
    return out


def node_slices(node: str, gpus: int = 8) -> tuple[ResourceSlice, ...]:
    """One node's pool in NVIDIA's dynamic-MIG shape: a slice of counter sets and a slice of devices."""
    table = profiles(PRODUCT, MEMORY_MIB)
    full = max(table.values(), key=lambda p: p.kind.mem_slices)
    sets, devices = [], []
    for g in range(gpus):
        cset = f"gpu-{g}-counter-set"
        whole = _counters(full, 0) | {"memory": MEMORY_MIB * MIB}
        sets.append(CounterSet(cset, whole))
        common: dict[str, AttrValue] = {"productName": PRODUCT, "index": g}
        common["resource.kubernetes.io/pcieRoot"] = f"pci0000:{g // 2:02x}"
        common["resource.kubernetes.io/numaNode"] = g // 4
        devices.append(
            Device(
                f"gpu-{g}",
                {"type": "gpu", **common},
                {"memory": Capacity(MEMORY_MIB * MIB)},
                (CounterConsumption(cset, whole),),
            )
        )
        for p in table.values():
            for start in p.kind.starts:
                devices.append(
                    Device(
                        f"gpu-{g}-mig-{p.name.replace('.', '')}-{start}",
                        {"type": "mig", "profile": p.name, **common},
                        {"memory": Capacity(p.memory_mib * MIB)},
                        (CounterConsumption(cset, _counters(p, start)),),
                    )
                )
    scope = NodeScope(node_name=node)
    return (
        ResourceSlice(f"{node}-counters", DRIVER, node, scope, 1, 2, (), tuple(sets)),
        ResourceSlice(f"{node}-devices", DRIVER, node, scope, 1, 2, tuple(devices)),
    )


MIG_MIX = (("1g.5gb", 40), ("2g.10gb", 20), ("3g.20gb", 15), ("1g.10gb", 10), ("4g.20gb", 5), ("7g.40gb", 10))
"""The MIG-heavy stream's profiles and weights (percent)."""
MIXED = (("mig", 50), ("gpu1", 25), ("gpu2", 15), ("gpu4", 10))
"""The mixed stream: half MIG (as above), whole GPUs one, two or four to a claim."""


def _mig_claim(name: str, profile: str) -> Claim:
    sel = f"device.attributes['{DRIVER}'].profile == '{profile}'"
    return Claim(name, (Request("gpu", ExactRequest("gpu", MIG_CLASS.name, (sel,))),))


def _gpu_claim(name: str, count: int) -> Claim:
    return Claim(name, (Request("gpu", ExactRequest("gpu", GPU_CLASS.name, count=count)),))


def _pick(rng: random.Random, table: Sequence[tuple[str, int]]) -> str:
    return rng.choices([k for k, _ in table], [w for _, w in table])[0]


def stream(kind: str, n: int, seed: int) -> list[Claim]:
    """``n`` claims of the ``mig`` (MIG-heavy) or ``mixed`` stream, drawn from ``seed``."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        what = "mig" if kind == "mig" else _pick(rng, MIXED)
        if what == "mig":
            out.append(_mig_claim(f"c{i}", _pick(rng, MIG_MIX)))
        else:
            out.append(_gpu_claim(f"c{i}", int(what[3:])))
    return out


@dataclass(frozen=True)
class Outcome:
    policy: str
    before_refusal: int
    placed: int
    offered: int
    multi_gpu: int  # claims of several whole GPUs placed
    one_root: int  # of those, on one PCIe root
    allocations: int  # allocator calls (one per node tried per pod)


def run(
    claims: Sequence[Claim],
    nodes: int,
    budget: SearchBudget,
    compiler: SelectorCompiler | None = None,
) -> Outcome:
    """Offer ``claims`` in order to ``nodes`` NVIDIA-shaped nodes; ``FIRST_FIT`` takes the first node
    that fits, a scored budget ranks the nodes that fit by their solution's score."""
    compiler = compiler or CelCompiler()
    names = [f"node-{k:02d}" for k in range(nodes)]
    slices = {n: node_slices(n) for n in names}
    roots = {
        DeviceId(DRIVER, n, d.name): d.attributes.get("resource.kubernetes.io/pcieRoot")
        for n in names
        for s in slices[n]
        for d in s.devices
    }
    held: set[DeviceId] = set()
    placed = calls = multi = aligned = 0
    first_refusal: int | None = None
    for claim in claims:
        state = AllocatedState(frozenset(held))
        best: tuple[tuple[Score, int, int], Fits] | None = None
        for rank, n in enumerate(names):
            calls += 1
            out = Allocator(CLASSES, slices[n], compiler, state, budget).allocate(Node(n), (claim,))
            if not isinstance(out, Fits):
                continue
            if budget == FIRST_FIT:
                best = ((Score(), 0, rank), out)
                break
            used = -sum(1 for d in held if d.pool == n)
            key = (out.score or Score(), used, rank)
            if best is None or key < best[0]:
                best = (key, out)
        if best is None:
            if first_refusal is None:
                first_refusal = placed
            continue
        results = best[1].allocations[0].results
        held.update(r.device_id for r in results)
        placed += 1
        if len(results) > 1:
            multi += 1
            aligned += len({roots[r.device_id] for r in results}) == 1
    return Outcome(
        "first-fit" if budget == FIRST_FIT else "scored",
        placed if first_refusal is None else first_refusal,
        placed,
        len(claims),
        multi,
        aligned,
        calls,
    )


def compare(kind: str, nodes: int, pods: int, seed: int) -> tuple[Outcome, Outcome]:
    claims = stream(kind, pods, seed)
    compiler = CelCompiler()
    return run(claims, nodes, FIRST_FIT, compiler), run(claims, nodes, SCORED, compiler)
