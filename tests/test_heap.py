"""``k8s.heap``: the serving processes freeze their long-lived objects out of the cycle collector's
passes, which is safe only while those objects leave no cyclic garbage behind."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from gpusched.k8s.convert import ANN_ASSIGNMENT
from gpusched.k8s.heap import freeze_heap, freeze_when
from gpusched.k8s.podevents import Kind, parse_pod_event
from test_extender_handlers import make, node, pod


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Every test starts and ends with nothing frozen (the test process's objects must stay collectable)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


def test_freeze_heap_moves_the_live_objects_out_of_the_passes(unfrozen: None) -> None:
    kept = [[i] for i in range(1000)]  # tracked containers, alive
    assert gc.get_freeze_count() == 0
    frozen = freeze_heap("test")
    assert frozen == gc.get_freeze_count() >= len(kept)
    assert all(gc.is_tracked(x) for x in kept)


def test_freeze_when_waits_for_ready_and_stop_ends_it_unfrozen(unfrozen: None) -> None:
    ready = threading.Event()
    t = freeze_when(ready.is_set, "informers synced", poll_s=0.01)
    t.join(0.1)
    assert t.is_alive() and gc.get_freeze_count() == 0  # not ready: nothing frozen yet
    ready.set()
    t.join(5)
    assert not t.is_alive() and gc.get_freeze_count() > 0

    gc.unfreeze()
    stop = threading.Event()
    t = freeze_when(lambda: False, "never", stop=stop, poll_s=0.01)
    stop.set()
    t.join(5)
    assert not t.is_alive() and gc.get_freeze_count() == 0


def _assignment(node_name: str, gpu: int, milli: int) -> dict[str, str]:
    return {ANN_ASSIGNMENT: json.dumps({"node": node_name, "gpus": [gpu], "milli": milli, "memoryMiB": 0})}


def _cyclic_gpusched_garbage(churn: Any) -> list[str]:
    """Types of the gpusched objects that only the cycle collector would free after ``churn()``."""
    gc.collect()
    flags = gc.get_debug()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a pass finds unreachable is kept in gc.garbage, not freed
    try:
        gc.garbage.clear()
        churn()
        gc.collect()
        return sorted({
            f"{type(o).__module__}.{type(o).__qualname__}"
            for o in gc.garbage
            if type(o).__module__.startswith("gpusched")
        })  # fmt: skip
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()


def test_the_books_leave_no_cyclic_garbage_behind() -> None:
    """What ``freeze_when`` freezes after the informers' first sync (the live books: node and pod
    specs, bookings, the snapshot, the extender's caches) is freed by reference counting alone
    when pods are bound and deleted, nodes relabelled, resized and removed, and snapshots rebuilt:
    a reference cycle there would leak for good once frozen."""

    names = [f"n{i}" for i in range(6)]
    busy = [pod(f"b-{n}", milli=500, node_name=n, annotations=_assignment(n, 0, 500)) for n in names]
    ext = make([node(n, gpus=4) for n in names], busy, policy="default", pick=True)

    def churn() -> None:  # the extender itself lives on (a process's lifetime): only what it drops counts
        for i in range(8):  # filtered (picked), bound, seen bound; every other one deleted
            request = pod(f"p{i}", milli=250, uid=f"u-{i}")
            request["metadata"]["resourceVersion"] = "1"
            chosen = ext.filter({"Pod": request, "NodeNames": names})["NodeNames"][0]
            bind = {"PodName": f"p{i}", "PodNamespace": "default", "PodUID": f"u-{i}", "Node": chosen}
            assert ext.bind(bind) == {"Error": ""}
            with ext.cluster.live_books() as snap:
                gpu = snap.allocations[f"default/p{i}"].gpus[0]
            ann = _assignment(chosen, gpu, 250)
            seen = pod(f"p{i}", milli=250, uid=f"u-{i}", node_name=chosen, annotations=ann)
            ext.cluster.upsert_pod(seen)
            ext.on_pod_event(parse_pod_event(seen))
            if i % 2:
                ext.cluster.delete_pod(f"default/p{i}")
                ext.on_pod_event(parse_pod_event(seen, Kind.DELETE))
        ext.cluster.upsert_node(node("n0", gpus=4, taints=[{"key": "k", "effect": "NoSchedule"}]))  # relabel
        ext.cluster.upsert_node(node("n1", gpus=2))  # another capacity: the books rebuilt
        ext.cluster.delete_node("n2")
        ext.filter({"Pod": pod("late", milli=100, uid="u-late"), "NodeNames": names})

    assert _cyclic_gpusched_garbage(churn) == []
