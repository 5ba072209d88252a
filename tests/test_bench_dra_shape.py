"""What ``gpusched bench dra`` publishes: NVIDIA's dynamic-MIG slice shape read through gpusched's own
conversion and allocator (every MIG placement consumes exactly its memory slices, so a GPU holds what
NVIDIA's tables say and no more), seeded streams, and interleaved gangs."""

from __future__ import annotations

from collections import Counter
from typing import Any

from gpusched.bench.dra_shape import (
    A100,
    MIG_PAIR,
    WHOLE,
    Ask,
    Classes,
    gang_members,
    memory_slices_of,
    mig_pair_asks,
    node_slices,
    stream,
)
from gpusched.core.dra.allocator import Allocator, Fits
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.model import Node
from gpusched.k8s.dra.convert import claim_from_k8s, device_class_from_k8s, slice_from_k8s

NODE = "n0"


def _allocate(asks: list[Ask], gpus: int = 1) -> list[str] | None:
    """The devices gpusched's allocator gives ``asks`` together on one node of ``gpus`` GPUs."""
    classes = Classes.for_tag("t")
    cls = {c.name: c for c in (device_class_from_k8s(o) for o in classes.objects())}
    slices = [slice_from_k8s({**s, "metadata": {**s["metadata"], "uid": str(i)}}) for i, s in
              enumerate(node_slices(NODE, gpus))]  # fmt: skip
    claims = []
    for i, a in enumerate(asks):
        obj: dict[str, Any] = classes.claim(f"c{i}", a)
        obj["metadata"].update(namespace="ns", uid=f"u{i}")
        claims.append(claim_from_k8s(obj))
    out = Allocator(cls, slices, CelCompiler()).allocate(Node(NODE, {"kubernetes.io/hostname": NODE}), claims)
    if not isinstance(out, Fits):
        return None
    return [r.device for a in out.allocations for r in a.results]


def test_a_gpu_holds_seven_1g_slices_and_not_an_eighth() -> None:
    devices = _allocate([Ask("1g.5gb")] * 7)
    assert devices is not None and len(set(devices)) == 7
    assert _allocate([Ask("1g.5gb")] * 8) is None  # 7 compute slices (multiprocessors counter)


def test_mig_placements_share_no_memory_slice_and_exclude_the_whole_gpu() -> None:
    devices = _allocate([Ask("3g.20gb"), Ask("2g.10gb"), Ask("1g.5gb"), Ask("1g.5gb")])
    assert devices is not None
    taken = [memory_slices_of(d)[1] for d in devices]
    assert sum(len(s) for s in taken) == len(frozenset().union(*taken))  # no slice twice
    assert _allocate([Ask("3g.20gb"), Ask(WHOLE)]) is None  # the full GPU consumes every counter
    assert _allocate([Ask("4g.20gb"), Ask("4g.20gb")]) is None  # one 4g placement only (start 0)
    assert _allocate([Ask("3g.20gb"), Ask("3g.20gb")]) is not None  # starts 0 and 4


def test_every_device_name_maps_to_the_memory_slices_it_consumes() -> None:
    for s in node_slices(NODE, 2):
        for d in s["spec"].get("devices") or ():
            gpu, slices = memory_slices_of(d["name"])
            counters = d["consumesCounters"][0]
            assert counters["counterSet"] == f"gpu-{gpu}-counter-set"
            named = {
                int(k.removeprefix("memory-slice-"))
                for k in counters["counters"]
                if k.startswith("memory-slice-")
            }
            assert named == slices, d["name"]
    per_gpu = [d for s in node_slices(NODE, 1) for d in s["spec"].get("devices") or ()]
    assert len(per_gpu) == 1 + sum(len(p.kind.starts) for p in A100.values())


def test_streams_are_seeded_and_gangs_interleave_whole_gangs() -> None:
    assert stream("mixed", 16, 3) == stream("mixed", 16, 3) != stream("mixed", 16, 4)
    assert len(stream("mig-heavy", 16, 0)) == 5 * 16
    members = gang_members(10, 4, 0)
    assert Counter(members) == {g: 4 for g in range(10)}
    assert members != sorted(members)
    pairs = gang_members(20, 2, 0)
    asks = mig_pair_asks(pairs, 0)
    for g in range(20):  # each MIG gang: one 4g.20gb and one 3g.20gb, either arriving first
        assert sorted(a.profile for a, m in zip(asks, pairs, strict=True) if m == g) == ["3g.20gb", "4g.20gb"]
    assert len({next(a for a, m in zip(asks, pairs, strict=True) if m == g) for g in range(20)}) == 2
    assert _allocate(list(MIG_PAIR)) is not None  # a pair fills one GPU exactly ...
    assert _allocate([MIG_PAIR[1], MIG_PAIR[1], MIG_PAIR[0]]) is None  # ... and two 3g leave no 4g room
