"""What the allocator keeps across nodes and pods (core/dra/memo.py, the inventory's ``AllocatorMemo``)
is never read for objects it was not computed from: a changed slice, class or node is seen by the
next allocation, while a claim's change keeps the inventory (and its memo) as it is."""

from __future__ import annotations

import pytest
from k8s_objects import claim, device_class, gpu_device, gpu_slice, pod

from gpusched.core.dra import memo as memo_module
from gpusched.core.dra.allocator import DoesNotFit, Fits
from gpusched.core.dra.celexpr import CelCompiler
from gpusched.core.dra.memo import AllocatorMemo
from gpusched.core.dra.model import Capacity, Device, Node, NodeScope, ResourceSlice
from gpusched.k8s.dra.books import DraBooks
from gpusched.k8s.dra.podclaims import Ready, resolve

NODE = "node-a"
H100 = "device.attributes['gpu.nvidia.com'].productName == 'H100'"


def _outcome(books: DraBooks, name: str, cls: str = "gpu") -> Fits | DoesNotFit:
    books.upsert_claim(
        claim(
            name,
            [
                {
                    "name": "gpu",
                    "exactly": {"deviceClassName": cls, "selectors": [{"cel": {"expression": H100}}]},
                }
            ],
        )
    )
    r = resolve(pod(f"p-{name}", [{"name": "gpu", "resourceClaimName": name}]), books)
    assert isinstance(r, Ready)
    return r.claims.allocate(Node(NODE), books.allocated())


def _h100(i: int) -> dict[str, object]:
    d = gpu_device(i)
    d["attributes"]["productName"] = {"string": "H100"}
    return d


def test_a_changed_slice_is_seen_by_the_next_pods_allocation() -> None:
    books = DraBooks(CelCompiler())
    books.upsert_class(device_class("gpu"))
    books.upsert_slice(gpu_slice(NODE, [gpu_device(0), gpu_device(1)]))  # A100s
    assert isinstance(_outcome(books, "c1"), DoesNotFit)
    kept = books.inventory()
    books.upsert_claim(claim("other", []))
    assert books.inventory() is kept  # a claim's change keeps the inventory and what it computed
    books.upsert_slice(gpu_slice(NODE, [gpu_device(0), _h100(1)]))  # the same slice, now an H100
    out = _outcome(books, "c2")
    assert isinstance(out, Fits) and out.allocations[0].results[0].device == "gpu-1"
    books.upsert_slice(gpu_slice(NODE, [gpu_device(0), gpu_device(1)]))  # and back
    assert isinstance(_outcome(books, "c3"), DoesNotFit)


def test_a_changed_class_is_seen_by_the_next_pods_allocation() -> None:
    books = DraBooks(CelCompiler())
    books.upsert_class(device_class("gpu"))
    books.upsert_slice(gpu_slice(NODE, [_h100(0)]))
    assert isinstance(_outcome(books, "c1"), Fits)
    books.upsert_class(device_class("gpu", "device.attributes['gpu.nvidia.com'].type == 'mig'"))
    out = _outcome(books, "c2")
    assert isinstance(out, DoesNotFit) and "no device on node node-a matches class gpu" in out.reason


def test_the_memo_answers_per_device_object_and_per_slice_tuple_not_by_name() -> None:
    memo, compiler = AllocatorMemo(), CelCompiler()
    sel = compiler.compile("device.attributes['gpu.nvidia.com'].model == 'x'")
    old = Device("gpu-0", {"model": "x"})
    new = Device("gpu-0", {"model": "y"})  # the same name, converted again from a changed slice
    assert memo.matches(sel, "gpu.nvidia.com", old)
    assert not memo.matches(sel, "gpu.nvidia.com", new)
    a = ResourceSlice("s", "gpu.nvidia.com", "p", NodeScope(node_name=NODE), devices=(old,))
    b = ResourceSlice("s", "gpu.nvidia.com", "p", NodeScope(node_name=NODE), devices=(new,))
    assert memo.pools((a,), Node(NODE))[0].devices[0].device is old
    assert memo.pools((b,), Node(NODE))[0].devices[0].device is new
    small = Device("gpu-0", capacity={"memory": Capacity(10)})
    large = Device("gpu-0", capacity={"memory": Capacity(20)})
    assert memo.consumption("gpu.nvidia.com", small, {}) == {"gpu.nvidia.com/memory": 10}
    assert memo.consumption("gpu.nvidia.com", large, {}) == {"gpu.nvidia.com/memory": 20}
    assert memo.limits("gpu.nvidia.com", large) == {"gpu.nvidia.com/memory": 20}


def test_selector_results_past_the_limit_are_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memo_module, "MATCHES_LIMIT", 2)
    memo, compiler = AllocatorMemo(), CelCompiler()
    devices = [Device(f"gpu-{i}", {"model": "x"}) for i in range(5)]
    for expression in ("device.attributes['gpu.nvidia.com'].model == 'x'", "true"):
        for d in devices:
            assert memo.matches(compiler.compile(expression), "gpu.nvidia.com", d)
            assert len(memo._matches) <= 2
